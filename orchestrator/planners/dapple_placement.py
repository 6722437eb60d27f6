"""DAPPLE's device placement (Fan et al., PPoPP'21): the three placement policies, the server
symmetry that keeps the DP small, the DP's tables, and the replay of a solution's placements.

The DP itself and the latency model are in :mod:`orchestrator.planners.dapple`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import Stage

INF = np.inf
POLICIES = ("fresh_first", "append_first", "scatter_first")

Occ = tuple[int, ...]
StateKey = tuple[tuple[object, ...], int]  # canonical (occupancy, last group), stage count (0 unless capped)


def allocate(
    servers: list[list[int]], occ: Occ, last: tuple[int, ...], m: int, policy: str, types: list[int] | None = None
) -> tuple[Occ, tuple[int, ...]] | None:
    """The ``m`` devices a policy picks next, and the new occupancy (None if too few are free).

    Ties are broken by (server type, state, index) so that interchangeable servers are treated
    alike, which keeps the DP's symmetry reduction exact."""
    return Allocator(servers, occ, last, types).take(m, policy)


class Allocator:
    """:func:`allocate` for one (occupancy, last group) and many (m, policy): the server orders
    each policy walks are computed once."""

    def __init__(self, servers: list[list[int]], occ: Occ, last: tuple[int, ...], types: list[int] | None) -> None:
        n = len(servers)
        self.servers, self.occ = servers, occ
        self.free = free = [len(g) - u for g, u in zip(servers, occ)]
        self.total_free = sum(free)
        ty = types or [0] * n
        if last:
            last_set = set(last)
            in_last = [sum(1 for d in g if d in last_set) for g in servers]
        else:
            in_last = [0] * n
        self.ring = sorted(range(n), key=lambda k: (ty[k], occ[k], in_last[k], k))
        fresh = sorted((k for k in range(n) if occ[k] == 0), key=lambda k: (ty[k], k))
        partial = sorted(
            (k for k in range(n) if 0 < occ[k] < len(servers[k])), key=lambda k: (in_last[k] == 0, -free[k], ty[k], occ[k], -in_last[k], k)
        )
        self.orders = {"fresh_first": fresh + partial, "append_first": partial + fresh}

    def take(self, m: int, policy: str) -> tuple[Occ, tuple[int, ...]] | None:
        if self.total_free < m:
            return None
        free, occ = self.free, self.occ
        take = [0] * len(free)
        need = m
        if policy == "scatter_first":
            ring = self.ring
            while need:
                for k in ring:
                    if need and free[k] - take[k] > 0:
                        take[k] += 1
                        need -= 1
        else:
            for k in self.orders[policy]:
                if not need:
                    break
                t = min(need, free[k])
                take[k] += t
                need -= t
        group = tuple(d for k, g in enumerate(self.servers) if take[k] for d in g[occ[k] : occ[k] + take[k]])
        return tuple(u + t for u, t in zip(occ, take)), group


def server_types(cluster: Cluster, servers: list[list[int]]) -> list[int] | None:
    """A type per server such that servers of one type are interchangeable (same size, speeds,
    memories and internal links, and one inter-server bandwidth everywhere); None if no symmetry."""
    eff = cluster.effective
    if len(servers) < 2:
        return None
    cross = [float(eff[a, b]) for i, g in enumerate(servers) for h in servers[i + 1 :] for a in g for b in h]
    cross += [float(eff[b, a]) for i, g in enumerate(servers) for h in servers[i + 1 :] for a in g for b in h]
    if max(cross) != min(cross):
        return None
    sigs: dict[tuple[object, ...], int] = {}
    types = []
    for g in servers:
        sig = (
            len(g),
            tuple(float(cluster.speeds[d]) for d in g),
            tuple(float(cluster.memories[d]) for d in g),
            tuple(float(x) for x in eff[np.ix_(g, g)].ravel()),
        )
        types.append(sigs.setdefault(sig, len(sigs)))
    return types


@dataclass
class DappleDP:
    keys: list[StateKey]
    real: list[tuple[Occ, tuple[int, ...]]]  # a representative (occupancy, last group) per key
    best: np.ndarray  # [keys, L+1]: pivot value after planning blocks [0, j), j = 0..L
    parent: np.ndarray  # [keys, L+1]: parent key index (-1 = first stage)
    parent_j: np.ndarray
    move: np.ndarray  # [keys, L+1]: replicas*3 + policy index of the stage ending there
    servers: list[list[int]]
    types: list[int] | None
    spb: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = field(default_factory=dict)  # seconds per boundary byte


class Rows:
    """Growable [n, L+1] tables (value, parent, parent_j, move), one row per DP key."""

    def __init__(self, width: int) -> None:
        self.n = 0
        self.best = np.full((64, width), INF)
        self.parent = np.full((64, width), -2, dtype=np.int64)
        self.parent_j = np.full((64, width), -1, dtype=np.int64)
        self.move = np.full((64, width), -1, dtype=np.int64)

    def add(self) -> int:
        if self.n == len(self.best):
            extra = len(self.best)
            self.best = np.concatenate([self.best, np.full_like(self.best[:extra], INF)])
            self.parent = np.concatenate([self.parent, np.full_like(self.parent[:extra], -2)])
            self.parent_j = np.concatenate([self.parent_j, np.full_like(self.parent_j[:extra], -1)])
            self.move = np.concatenate([self.move, np.full_like(self.move[:extra], -1)])
        self.n += 1
        return self.n - 1

    def relax(self, targets: np.ndarray, vals: np.ndarray, parents: np.ndarray, pjs: np.ndarray, moves: np.ndarray) -> None:
        """Sequential strict-``<`` updates of rows ``targets`` (in order), batched when distinct."""
        if len(np.unique(targets)) != len(targets):
            for c in range(len(targets)):
                self.relax(targets[c : c + 1], vals[c : c + 1], parents[c : c + 1], pjs[c : c + 1], moves[c : c + 1])
            return
        cur = self.best[targets]
        better = vals < cur
        if not better.any():
            return
        self.best[targets] = np.where(better, vals, cur)
        self.parent[targets] = np.where(better, parents, self.parent[targets])
        self.parent_j[targets] = np.where(better, pjs, self.parent_j[targets])
        self.move[targets] = np.where(better, moves, self.move[targets])


def unwind(dp: DappleDP, idx: int, L: int) -> list[Stage]:
    """Follow the back-pointers, then replay the placement moves from an empty cluster so the
    device ids are consistent along the path (keys are only defined up to server symmetry)."""
    steps = []
    j = L
    while idx >= 0:
        pj = int(dp.parent_j[idx][j])
        steps.append((pj, j, int(dp.move[idx][j])))
        idx, j = int(dp.parent[idx][j]), pj
    occ: Occ = tuple(0 for _ in dp.servers)
    last: tuple[int, ...] = ()
    stages = []
    for first, end, mv in reversed(steps):
        got = allocate(dp.servers, occ, last, mv // 3, POLICIES[mv % 3], dp.types)
        assert got is not None
        occ, last = got
        stages.append(Stage(first, end, last))
    return stages


class Replay:
    """:func:`unwind` for many final states at once: the replayed placement of every DP node
    (key, j) is memoized, so paths that share a prefix replay it once."""

    def __init__(self, dp: DappleDP) -> None:
        self.dp = dp
        empty: Occ = tuple(0 for _ in dp.servers)
        self.memo: dict[tuple[int, int], tuple[Occ, tuple[int, ...], tuple[tuple[int, int, tuple[int, ...]], ...]]] = {(-1, 0): (empty, (), ())}

    def stages(self, idx: int, j: int) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
        dp, memo = self.dp, self.memo
        chain: list[tuple[int, int]] = []
        node = (idx, j)
        while node not in memo:
            chain.append(node)
            k, e = node
            node = (int(dp.parent[k][e]), int(dp.parent_j[k][e]))
        occ, last, stages = memo[node]
        for k, e in reversed(chain):
            first = int(dp.parent_j[k][e])
            mv = int(dp.move[k][e])
            got = allocate(dp.servers, occ, last, mv // 3, POLICIES[mv % 3], dp.types)
            assert got is not None
            occ, last = got
            stages = (*stages, (first, e, last))
            memo[(k, e)] = (occ, last, stages)
        return stages
