"""PipeDream's DP over a graph's down-sets, to choose the linear order of a graph.txt profile.

A graph.txt profile is a DAG; the loader (:mod:`orchestrator.core.profile_loader`) chains it in one
topological order and every planner cuts ranges of that chain. PipeDream's published optimizer
instead cuts at any *down-set* of the graph (its antichain DAG), and no single order has every
down-set as a prefix: on resnet18's downsampling blocks the best two-server plan ends a stage with
the shortcut finished and the main branch part-way, while program order runs the main branch first,
and resnext50's best 16-GPU plan needs the opposite at the same kind of point.

So for ``pipedream`` the order is part of the plan. :func:`downsets` lists the graph's down-sets
(while there are at most :data:`MAX_DOWNSETS`: ResNets and DenseNets have about one per node plus
the branch states, Inception/NASNet cells explode); :func:`downset_order` runs the same DP as the
chain (:func:`~orchestrator.planners.pipedream.solve_tables`) with the down-sets as its positions,
a range S → S' allowed only where S ⊂ S' and S' adds a node with training work; the optimal
stages, concatenated, are a topological order whose prefixes include every cut of that optimum.
:func:`pipedream_chain` re-chains the profile in that order when PipeDream's DP is lower there than
on the loader's order, and names the order, so a plan written with it can be simulated again
(``orchestrator simulate`` reads ``profile_chain`` from the plan file).
"""

from __future__ import annotations

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.profile import Profile
from orchestrator.core.profile_loader import Graph, chain_profile, default_order
from orchestrator.planners.options import PlannerOptions
from orchestrator.planners.pipedream import SPEC, plan_pipedream, solve_tables
from orchestrator.planners.pipedream_dp import INF

MAX_DOWNSETS = 1024
"""Down-sets beyond which the DP over them is not run (its tables are [devices, N, N]); the
loader's order is planned alone. ResNet-152-sized chains stay below; an Inception cell does not."""


def downsets(g: Graph, limit: int = MAX_DOWNSETS) -> list[int] | None:
    """Every non-empty down-set of the graph as a bit mask over node indices, smaller sets first
    (a strict subset always comes earlier), or None when there are more than ``limit``."""
    n = len(g.ids)
    preds = [0] * n
    for u, v in g.graph.edges():
        preds[v] |= 1 << u
    seen = {0}
    level = [0]
    out: list[int] = []
    while level:
        nxt: set[int] = set()
        for s in level:
            for v in range(n):
                if not (s >> v) & 1 and preds[v] & ~s == 0:
                    t = s | (1 << v)
                    if t not in seen:
                        seen.add(t)
                        nxt.add(t)
                        if len(seen) > limit + 1:
                            return None
        level = sorted(nxt)
        out.extend(level)
    return out


def _tables(g: Graph, sets: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PipeDream's range tables over down-sets: entry [a, b] is the stage from S_{a−1} (nothing for
    a = 0) to S_b, as the chain's entry is blocks a..b; the cut after S_k is every tensor of S_k read
    outside it (the data loader's inputs never count)."""
    n, N = len(g.ids), len(sets)
    width = (n + 7) // 8  # each mask's bits as little-endian bytes, unpacked at once (a Python loop per bit: 11 ms on resnet101)
    raw = np.frombuffer(b"".join(s.to_bytes(width, "little") for s in sets), dtype=np.uint8).reshape(N, width)
    member = np.unpackbits(raw, axis=1, count=n, bitorder="little").astype(bool)
    work = (g.data[:, 0] + g.data[:, 1]) / 1000.0
    useful = (g.data[:, 1] > 0) | (g.data[:, 3] > 0)
    m = member.astype(np.float64)
    C, P, U = m @ work, m @ g.data[:, 3], m @ useful.astype(np.float64)
    has_succ_outside = np.zeros((N, n), dtype=bool)
    for u, v in g.graph.edges():
        has_succ_outside[:, u] |= ~member[:, v]
    cut = (member & has_succ_outside & ~g.is_input[None, :]).astype(np.float64) @ g.data[:, 2]
    # before[a] = S_{a−1} (the empty set for a = 0); a range a..b needs before ⊂ S_b and more work.
    before = np.vstack([np.zeros((1, n)), m[:-1]])
    subset = (before @ (1.0 - m).T) == 0  # [a, b]: S_{a−1} ⊆ S_b
    prev_U, prev_C, prev_P = np.concatenate([[0.0], U[:-1]]), np.concatenate([[0.0], C[:-1]]), np.concatenate([[0.0], P[:-1]])
    ok = subset & (U[None, :] > prev_U[:, None])
    compute = np.where(ok, C[None, :] - prev_C[:, None], INF)
    params = np.where(ok, P[None, :] - prev_P[:, None], 0.0)
    return compute, params, cut


def downset_order(g: Graph, cluster: Cluster, straight: bool) -> list[int] | None:
    """A topological order whose prefixes hold every cut of PipeDream's optimum over down-sets (no
    memory term, as the published DP), or None when the graph has too many down-sets."""
    sets = downsets(g)
    if sets is None or len(sets) < 2:
        return None
    compute, params, cut = _tables(g, sets)
    stages, _ = solve_tables(compute, params, cut, cluster, straight)
    rank = {v: i for i, v in enumerate(default_order(g))}
    order: list[int] = []
    done = 0
    for _, last, _ in stages:
        new = sets[last] & ~done
        order.extend(sorted((v for v in range(len(g.ids)) if (new >> v) & 1), key=rank.__getitem__))
        done = sets[last]
    return order


def pipedream_chain(g: Graph, base: Profile, cluster: Cluster, options: PlannerOptions) -> tuple[Profile, tuple[str, ...] | None]:
    """The chain profile ``pipedream`` should plan on, and its node order when it is not the loader's
    (``base``: ``g`` chained in the loader's order).

    The order from :func:`downset_order` is taken only when PipeDream's objective (with the memory
    fallback of :func:`~orchestrator.planners.pipedream.plan_pipedream`) is lower on it; a depth cap
    keeps the loader's order (the down-set DP has no stage count)."""
    if options.max_stages is not None or base.num_blocks > SPEC.max_blocks:
        return base, None
    order = downset_order(g, cluster, options.straight)
    if order is None:
        return base, None
    chain = tuple(g.ids[v] for v in order)
    other = chain_profile(g, base.name, base.source, chain=chain)
    if other == base:
        return base, None
    objective = []
    for profile in (base, other):
        try:
            objective.append(plan_pipedream(profile, cluster, options).objective_s or INF)
        except UserError:
            objective.append(INF)
    return (other, chain) if objective[1] < objective[0] else (base, None)
