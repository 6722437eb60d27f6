"""The short soak: benchmarks/soak.py for 60 steps on a 3-node ``ray.cluster_utils`` cluster, a seeded fault every
10 steps, each of the six kinds once (unnoticed death, node removal, notice for a device, notice for a node, node
join, slowdown). Marked ``soak`` (a few minutes on a loaded machine): ``pytest -m 'not soak'`` leaves it out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def loop_recovers_in_place() -> bool:
    """Whether the job loop calls the runtime's recovery in place: without it a node removal cannot be survived
    (a full restart needs a worker on every slot, the removed node's too), so the soak cannot pass yet."""
    return any("recover_in_place" in p.read_text() for p in (ROOT / "orchestrator" / "elastic").glob("*.py"))


@pytest.mark.soak
@pytest.mark.ray
@pytest.mark.skipif(not loop_recovers_in_place(), reason="the job loop does not call PipelineTrainer.recover_in_place yet")
@pytest.mark.timeout(600)
def test_a_short_soak_survives_every_kind_of_fault_exactly_and_leaks_nothing() -> None:
    pytest.importorskip("ray.cluster_utils")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([sys.executable, "benchmarks/soak.py", "--steps", "70", "--seed", "7"], capture_output=True, text=True,
                         timeout=560, cwd=ROOT, env=env)
    lines = run.stdout.strip().splitlines()
    assert lines, run.stderr[-4000:]
    found = json.loads(lines[-1])
    assert found["error"] is None, found["error"]
    assert found["max_abs_diff"] is not None and found["max_abs_diff"] <= 1e-5, found
    assert found["leaked"] == [], found["leaked"]
    assert all(n >= 1 for n in found["faults"].values()), found["faults"]  # every kind drawn once early
    assert all(h.get("completed") for h in found["handled"]), found["handled"]  # training went on after every fault
    deaths = [h for h in found["handled"] if h["fault"].startswith(("death", "node_removal"))]
    assert all("in_place" in h["modes"] for h in deaths), deaths  # survivors kept their processes
    assert run.returncode == 0, found
