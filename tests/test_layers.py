"""The packages follow the layers: every import points downwards, no two modules import each other (not even
behind a lazy or type-only import), and the cheap layers stay free of torch and Ray.

The graph is read from the source (every ``import`` statement, wherever it stands), so an import hidden inside a
function or under ``TYPE_CHECKING`` counts like any other.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]

# bottom (0) to top; a module may import its own package and any package of a lower rank. ``cloud`` stands
# alone (tests/cloud/test_layering.py); ``actors`` is the runtime, which knows the core data and the schedule IR
# but never planners, the controller, the job or the CLI.
RANK = {
    "orchestrator.core": 0,
    "orchestrator.schedule": 1,
    "orchestrator.costmodel": 2,
    "orchestrator.planners": 3,
    "actors": 3,
    "orchestrator.profiling": 4,
    "orchestrator.train": 5,
    "orchestrator.data": 5,  # the user's data sources (orchestrator.data.TokenFile, from_dataset): core only
    "orchestrator.adapt": 6,
    "orchestrator.elastic": 7,
    "orchestrator.supervise": 8,  # outside the training cluster: provisions, submits, migrates, relaunches jobs
    "orchestrator.sinks": 8,  # trackers as callbacks (orchestrator.sinks.TensorBoard); the driver flags (cli) make them
    "orchestrator.cli": 9,
    "orchestrator": 10,  # the package's own __init__: the public API, loaded lazily
}
PACKAGES = ("orchestrator", "actors", "cloud")


def _modules() -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _graph() -> nx.DiGraph:
    mods = _modules()
    graph = nx.DiGraph()
    for name, path in mods.items():
        graph.add_node(name)
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph.add_edges_from((name, t) for t in targets if t in mods and t != name)
    return graph


def _layer(module: str) -> str | None:
    owners = [k for k in RANK if module == k or module.startswith(k + ".")]
    return max(owners, key=len) if owners else None


def test_every_module_belongs_to_a_layer():
    strays = [m for m in _modules() if not m.startswith("cloud") and _layer(m) is None]
    assert strays == []
    flat = sorted(p.name for p in (ROOT / "orchestrator").glob("*.py"))
    assert flat == ["__init__.py", "__main__.py", "data.py", "sinks.py"], \
        "orchestrator/ holds packages, and the two modules a user imports by name (orchestrator.data, orchestrator.sinks)"


def test_imports_point_downwards():
    upward = []
    for a, b in _graph().edges:
        la, lb = _layer(a), _layer(b)
        if a.startswith("cloud"):
            upward += [(a, b)] if not b.startswith("cloud") else []
        elif la != lb and lb is not None and la is not None and RANK[lb] >= RANK[la]:
            upward.append((a, b))
    assert sorted(upward) == []


def test_no_import_cycles():
    cycles = sorted(sorted(c) for c in nx.strongly_connected_components(_graph()) if len(c) > 1)
    assert cycles == []


@pytest.mark.parametrize("code", [
    "import orchestrator",
    "import orchestrator.core.profile_loader, orchestrator.planners.base as b; b.available()",
    "import orchestrator.costmodel.simulator, orchestrator.adapt.controller",
    "import orchestrator as o; [getattr(o, n) for n in ('load_profile', 'flat', 'PlannerOptions', 'run_planner', 'simulate', 'Plan')]",
])
def test_planning_and_simulating_import_neither_torch_nor_ray(code):
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in ('torch', 'ray') if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_every_public_name_resolves():
    import orchestrator

    assert orchestrator.__all__ == sorted(orchestrator.__all__) and "ElasticJob" in orchestrator.__all__
    for name in orchestrator.__all__:
        assert getattr(orchestrator, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'JobManager'"):
        getattr(orchestrator, "JobManager")
