"""``pipedream`` with replication against PipeDream's published optimizer (its DP transcribed in
``benchmarks/pipedream_reference.py``) on the real graph.txt profiles, in the published cost model.

The fast subset of ``benchmarks/pipedream_reference.py --compare``: the small graphs, flat and
two-level, each also against the published DP run on the chain we plan on. Where the published plan
ends a stage at a down-set the loader's order has no prefix for (resnet18 on two levels), ``pipedream``
plans on the order its DP over down-sets chose (:mod:`orchestrator.planners.pipedream_graph`), as
``orchestrator plan`` does. Before the cut term was divided by the receiving stage's replicas
(PipeDream's ``input_transfer_time``), replicated plans were worse than the published ones (resnet50,
4 GPUs: +8.2%; vgg16, 16 GPUs: +2.0%)."""

from __future__ import annotations

import pytest

from benchmarks import pipedream_reference as ref
from orchestrator.core.cluster import GBPS, flat, two_level
from orchestrator.core.profile_loader import load_source
from orchestrator.planners.base import PlannerOptions, run_planner
from orchestrator.planners.pipedream import bottleneck
from orchestrator.planners.pipedream_graph import pipedream_chain
from tests.helpers import SHARED

GRAPHS = SHARED / "profiles" / "pipedream" / "profiler"
CASES = [  # (model, flat GPUs at 10 Gb/s, or (servers, GPUs per server) at 100/10 Gb/s)
    ("vgg16", 4), ("vgg16", 16), ("resnet50", 4), ("alexnet", 8), ("squeezenet1_0", 16),
    ("vgg16", (4, 4)), ("alexnet", (2, 4)), ("squeezenet1_0", (2, 4)), ("resnet18", (2, 4)),
]


def _graph(name: str):  # type: ignore[no-untyped-def]
    found = sorted(GRAPHS.rglob(f"{name}/graph.txt"))
    if not found:
        pytest.skip("../shared PipeDream profiles not available")
    return found[0]


@pytest.mark.parametrize("name,shape", CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_replicated_pipedream_equals_or_beats_published_optimizer(name: str, shape: int | tuple[int, int]) -> None:
    path = _graph(name)
    if isinstance(shape, int):
        cluster, levels = flat(shape, 10), [(shape, 10 * GBPS)]
    else:
        cluster, levels = two_level(shape[0], shape[1], 100, 10), [(shape[1], 100 * GBPS), (shape[0], 10 * GBPS)]
    published, _, ends = ref.solve_graph_stages(path, levels, straight=False)
    opts = PlannerOptions(num_microbatches=1, check_memory=False)
    base, graph = load_source(path)
    assert graph is not None
    profile, chain = pipedream_chain(graph, base, cluster, opts)
    assert (chain is not None) == (name == "resnet18")  # the one case here the loader's order lacks a cut of
    if chain is not None:
        assert ref.outside_chain(base, ends) and not ref.outside_chain(profile, ends)
    res = run_planner("pipedream", profile, cluster, opts)
    assert res.objective_s is not None
    # on our own chain the published DP finds nothing better (flat: the same value)
    on_chain = ref.solve(profile, levels)
    assert res.objective_s <= on_chain * (1 + 1e-9)
    if isinstance(shape, int):
        assert res.objective_s == pytest.approx(on_chain, rel=1e-9)
    assert res.objective_s <= published * (1 + 1e-9)
    if isinstance(shape, int):  # the flat plan realizes the value the DP reports
        assert bottleneck(res.plan, profile, cluster, PlannerOptions(num_microbatches=1)) == pytest.approx(res.objective_s, rel=1e-9)
    if name == "resnet50":
        assert any(s.replicas > 1 for s in res.plan.stages)  # the row that needs replication
