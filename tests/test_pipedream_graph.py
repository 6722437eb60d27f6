"""``pipedream`` on a graph.txt profile: its DP over the graph's down-sets picks the chain it cuts.

The exact claim: over down-sets the DP finds what the chain DP would find on the best of *every*
topological order (checked by listing them on small graphs where every node has training work, so
each order's prefixes are exactly its down-sets), and ``orchestrator plan`` writes the order it chose
so that ``orchestrator simulate`` times the same plan.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import networkx as nx
import pytest

from orchestrator.cli.commands import main
from orchestrator.core.cluster import flat, two_level
from orchestrator.core.errors import UserError
from orchestrator.core.profile_loader import block_nodes, chain_profile, load_profile, read_graph
from orchestrator.planners.base import PlannerOptions
from orchestrator.planners.pipedream import plan_pipedream
from orchestrator.planners.pipedream_graph import downset_order, downsets, pipedream_chain
from tests.test_graph_loader import graph, node

OPTS = PlannerOptions(num_microbatches=1, check_memory=False)

# A downsampling block: n1, then the main branch n2 → n3 beside the shortcut n4, joined by n5. The
# balanced cut (5 ms | 5 ms) is {n1, n2, n4}: the shortcut done, the main branch part-way, which no
# prefix of program order (n1 n2 n3 n4 n5) is; heavy weights rule out replication.
FORK = graph(
    [node("n1", "Conv", f=0.5, b=0.5, a=8.0, p=1e9), node("n2", "Conv", f=1.0, b=1.0, a=8.0, p=1e9),
     node("n3", "Conv", f=2.0, b=2.0, a=8.0, p=1e9), node("n4", "Conv", f=1.0, b=1.0, a=8.0, p=1e9),
     node("n5", "Add", f=0.5, b=0.5, a=8.0, p=1e9)],
    [("n1", "n2"), ("n2", "n3"), ("n1", "n4"), ("n3", "n5"), ("n4", "n5")],
)


def _random_dag(seed: int, n: int) -> str:
    rng = random.Random(seed)
    nodes = [node(f"v{i}", "Op", f=rng.uniform(0.2, 3), b=rng.uniform(0.2, 3), a=rng.uniform(1e5, 4e6), p=rng.choice([0.0, 1e6, 2e7]))
             for i in range(n)]
    edges = [(f"v{i}", f"v{j}") for j in range(1, n) for i in rng.sample(range(j), k=min(j, rng.choice([1, 1, 2])))]
    return graph(nodes, edges)


def test_downsets_are_every_downward_closed_set_smaller_first() -> None:
    g = read_graph(FORK, "fork")
    sets = downsets(g)
    assert sets is not None
    n = len(g.ids)
    brute = [m for m in range(1, 1 << n)
             if all(not (m >> v) & 1 or (m >> u) & 1 for u, v in g.graph.edges())]
    assert sorted(sets) == sorted(brute)
    for a, b in itertools.combinations(range(len(sets)), 2):  # a strict subset never comes later
        assert not (sets[b] & ~sets[a] == 0 and sets[b] != sets[a])
    assert downsets(g, limit=len(sets) - 1) is None


@pytest.mark.parametrize("cluster", [flat(2, 10), flat(2, 0.01)], ids=["10Gbps", "10Mbps"])
def test_fork_is_cut_at_the_downset_program_order_lacks(cluster) -> None:  # type: ignore[no-untyped-def]
    g = read_graph(FORK, "fork")
    base = plan_pipedream(chain_profile(g, "fork"), cluster, OPTS)
    profile, chain = pipedream_chain(g, chain_profile(g, "fork"), cluster, OPTS)
    assert chain is not None and chain.index("n4") < chain.index("n3")
    plan = plan_pipedream(profile, cluster, OPTS)
    assert plan.objective_s is not None and base.objective_s is not None
    assert plan.objective_s == pytest.approx(0.005) and base.objective_s == pytest.approx(0.007)


@pytest.mark.parametrize("seed", range(6))
def test_downset_dp_equals_the_best_chain_over_every_topological_order(seed: int) -> None:
    text = _random_dag(seed, 7)
    g = read_graph(text, "dag")
    for cluster in (flat(3, 10), two_level(2, 2, 100, 10)):
        best = min(plan_pipedream(chain_profile(g, "dag", chain=[g.ids[v] for v in order]), cluster, OPTS).objective_s or 0.0
                   for order in nx.all_topological_sorts(g.graph))
        order = downset_order(g, cluster, straight=False)
        assert order is not None
        on_it = plan_pipedream(chain_profile(g, "dag", chain=[g.ids[v] for v in order]), cluster, OPTS).objective_s
        assert on_it == pytest.approx(best, rel=1e-12)
        profile, _ = pipedream_chain(g, chain_profile(g, "dag"), cluster, OPTS)
        assert plan_pipedream(profile, cluster, OPTS).objective_s == pytest.approx(best, rel=1e-12)


def test_a_chain_that_is_not_a_topological_order_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "graph.txt"
    path.write_text(FORK)
    assert [b[0] for b in block_nodes(FORK, chain=["n1", "n2", "n4", "n3", "n5"])] == ["n1", "n2", "n4", "n3", "n5"]
    for chain, message in [(["n1", "n3", "n2", "n4", "n5"], "puts node 'n3' before 'n2', which it reads"),
                           (["n1", "n2", "n3", "n4"], "each of the graph's 5 nodes once"),
                           (["n1", "n2", "n3", "n4", "n4"], "each of the graph's 5 nodes once"),
                           (["n1", "n2", "n3", "n4", "x"], "node 'x'")]:
        with pytest.raises(UserError, match=message):
            load_profile(path, chain=chain)
    (tmp_path / "p.json").write_text(json.dumps(chain_profile(read_graph(FORK, "f"), "f").to_dict()))
    with pytest.raises(UserError, match="only a graph.txt profile"):
        load_profile(tmp_path / "p.json", chain=["n1"])


def test_plan_writes_its_chain_and_simulate_times_the_same_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "graph.txt"
    path.write_text(FORK)
    out = tmp_path / "plan.json"
    assert main(["plan", "--profile", str(path), "--gpus", "2", "--inter-gbps", "10", "--microbatches", "4",
                 "--algorithm", "pipedream", "--ignore-memory", "--json", "--out", str(out)]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["profile_chain"] == ["n1", "n2", "n4", "n3", "n5"]
    assert planned["bottleneck_s"] == pytest.approx(0.005)
    assert main(["simulate", "--profile", str(path), "--plan", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_s"] == pytest.approx(planned["iteration_time_s"], rel=1e-12)
    # other planners cut the loader's chain; their plans name none
    assert main(["plan", "--profile", str(path), "--gpus", "2", "--inter-gbps", "10", "--microbatches", "4",
                 "--algorithm", "even", "--ignore-memory", "--json"]) == 0
    assert "profile_chain" not in json.loads(capsys.readouterr().out)
