"""PipeDream's dynamic program over one level of the cluster's hierarchy, as numpy tables.

The tables and their recurrences (see :mod:`orchestrator.planners.pipedream` for the objective and how the levels
nest): :func:`solve_level` fills ``A(j, m)`` for every prefix and worker count with one broadcast per row;
:func:`solve_level_capped` adds the "flat stages used" dimension when a stage cap can bind; the ``unwind``
functions read a solution back. Nothing here knows a profile or a plan — only compute, parameter and cut arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.costmodel.terms import all_reduce_time, compute_time

INF = np.inf


@dataclass(frozen=True)
class Level:
    units: int  # how many lower-level units this level combines (GPUs per server, servers)
    bandwidth: float  # bytes/s between those units
    within: int  # workers inside one unit (divides the weight-sync term, as PipeDream does)


@dataclass
class LevelTable:
    """A[i, j, m-1] = best bottleneck of blocks i..j (inclusive) on m units; plus back-pointers."""

    best: np.ndarray  # [L, L, n]
    split: np.ndarray  # [L, L, n] k of the last cut, -1 = single stage
    last_m: np.ndarray  # [L, L, n] units of the last stage
    used_m: np.ndarray  # [L, L, n] units actually used (<= m when fewer is better)


def hierarchy(cluster: Cluster) -> list[Level]:
    """Levels from the cluster: (GPUs per node, slowest intra-node link), (nodes, slowest inter-node link)."""
    nodes = list(cluster.nodes().values())
    sizes = {len(g) for g in nodes}
    eff = cluster.effective
    if len(nodes) > 1 and len(sizes) == 1 and len(nodes[0]) > 1:
        per = len(nodes[0])
        intra = min(float(eff[np.ix_(g, g)][~np.eye(per, dtype=bool)].min()) for g in nodes)
        node_of = np.repeat(np.arange(len(nodes)), per)
        order = [d for g in nodes for d in g]
        sub = eff[np.ix_(order, order)]
        inter = float(sub[node_of[:, None] != node_of[None, :]].min())
        return [Level(per, intra, 1), Level(len(nodes), inter, per)]
    n = cluster.size
    bw = float(eff[~np.eye(n, dtype=bool)].min()) if n > 1 else INF
    return [Level(n, bw, 1)]


def stage_time(compute: np.ndarray, params: np.ndarray, m: np.ndarray, level: Level) -> np.ndarray:
    # PipeDream's gradient exchange, 4(m−1)/m · |w| / B: twice the ring term, per lower-level worker
    sync = 2.0 * all_reduce_time(m, params, level.bandwidth) / level.within
    return compute_time(compute + sync, 1.0, m)


def solve_level(compute: np.ndarray, params: np.ndarray, cut: np.ndarray, level: Level, straight: bool, all_starts: bool) -> LevelTable:
    """The DP of one level. ``compute``/``params`` are [L, L] range tables (inf where impossible);
    ``cut[k]`` is the activation bytes crossing a cut after block k."""
    L = compute.shape[0]
    n = level.units
    ms = np.arange(1, n + 1, dtype=np.float64)
    best = np.full((L, L, n), INF)
    split = np.full((L, L, n), -1, dtype=np.int32)
    last_m = np.zeros((L, L, n), dtype=np.int32)
    # Single-stage option for every range and every m.
    single = stage_time(compute[:, :, None], params[:, :, None], ms[None, None, :], level)
    if straight:
        single[:, :, 1:] = INF
    best[:] = single
    last_m[:] = np.arange(1, n + 1)[None, None, :]
    cut_cost = 2.0 * cut / level.bandwidth  # [L]
    # T(k+1 -> j, m') for the last stage, m' = 1..n.
    mprime = ms if not straight else ms[:1]
    n_mp = len(mprime)
    starts = np.arange(L) if all_starts else np.arange(1)
    m_idx = np.arange(n)[:, None]  # m-1
    mp_idx = np.arange(n_mp)[None, :]  # m'-1
    prev_idx = m_idx - (mp_idx + 1)  # (m - m') - 1, valid when >= 0
    valid = prev_idx >= 0
    prev_clip = np.where(valid, prev_idx, 0)
    rows = np.arange(len(starts))[:, None]
    # One vectorized step per end block j, over every start i, last cut k, units m and m'.
    for j in range(1, L):
        ks = np.arange(j)
        tail = stage_time(compute[ks + 1, j][:, None], params[ks + 1, j][:, None], mprime[None, :], level)  # [K, m']
        head = best[starts][:, ks, :]  # [I, K, n]
        cand = np.maximum(np.maximum(head[:, :, prev_clip], cut_cost[ks][None, :, None, None]), tail[None, :, None, :])
        ok = valid[None, None, :, :] & (ks[None, :] >= starts[:, None])[:, :, None, None]
        cand = np.where(ok, cand, INF)  # [I, K, n, m']
        flat = cand.transpose(0, 2, 1, 3).reshape(len(starts), n, j * n_mp)
        arg = np.argmin(flat, axis=2)  # [I, n]
        val = np.take_along_axis(flat, arg[:, :, None], axis=2)[:, :, 0]
        cur = best[starts, j, :]
        better = val < cur
        if better.any():
            k_best = ks[arg // n_mp]
            mp_best = arg % n_mp + 1
            best[starts, j, :] = np.where(better, val, cur)
            split[starts, j, :] = np.where(better, k_best, split[starts, j, :])
            last_m[starts, j, :] = np.where(better, mp_best, last_m[starts, j, :])
    del rows
    # "Use fewer units" when that is faster (PipeDream's use_fewer_machines).
    used = np.broadcast_to(np.arange(1, n + 1), best.shape).astype(np.int32).copy()
    for m in range(1, n):
        worse = best[:, :, m - 1] <= best[:, :, m]
        best[:, :, m] = np.where(worse, best[:, :, m - 1], best[:, :, m])
        used[:, :, m] = np.where(worse, used[:, :, m - 1], used[:, :, m])
    return LevelTable(best, split, last_m, used)


def unwind(table: LevelTable, i: int, j: int, m: int) -> list[tuple[int, int, int]]:
    """Stages (first, last_inclusive, units) of range i..j on m units, in order."""
    out: list[tuple[int, int, int]] = []
    while True:
        m = int(table.used_m[i, j, m - 1])
        k = int(table.split[i, j, m - 1])
        mp = int(table.last_m[i, j, m - 1])
        if k < 0:
            out.append((i, j, m))
            break
        out.append((k + 1, j, mp))
        j, m = k, m - mp
    return out[::-1]


@dataclass
class CappedTable:
    """``best[r, j, m-1, s-1]``: best bottleneck of blocks i..j on m units using exactly s *flat*
    stages (r = i when every start is solved, else 0); back-pointers as in :class:`LevelTable`
    plus the flat stage count of the last stage."""

    best: np.ndarray  # [I, L, n, S]
    split: np.ndarray
    last_m: np.ndarray
    last_s: np.ndarray
    used_m: np.ndarray
    all_starts: bool


def solve_level_capped(
    compute: np.ndarray, params: np.ndarray, cut: np.ndarray, level: Level, straight: bool, all_starts: bool, max_stages: int
) -> CappedTable:
    """:func:`solve_level` with an extra dimension: the number of flat stages used.

    ``compute`` is [S', L, L]: the compute term of a stage over i..j when the unit runs it as s'
    flat stages (S' = 1 on the lowest level, where a stage is one flat stage; on an upper level
    entry s'−1 is the lower level's best time of i..j with exactly s' stages). The recurrence is
    the same min-max, with the stage count adding up:

        A(i→j, m, s) = min( T_{s}(i→j, m), min_{k, m', s'} max(A(i→k, m−m', s−s'), 2a_k/B, T_{s'}(k+1→j, m')) )
    """
    Sp, L, _ = compute.shape
    n = level.units
    S = max_stages
    Sp = min(Sp, S)
    compute = compute[:Sp]
    ms = np.arange(1, n + 1, dtype=np.float64)
    starts = np.arange(L) if all_starts else np.arange(1)
    I = len(starts)
    best = np.full((I, L, n, S), INF)
    split = np.full((I, L, n, S), -1, dtype=np.int32)
    last_m = np.zeros((I, L, n, S), dtype=np.int32)
    last_s = np.zeros((I, L, n, S), dtype=np.int32)
    # Single stage over i..j run as s' flat stages on m units.
    single = stage_time(compute[:, starts, :, None], params[starts][None, :, :, None], ms[None, None, None, :], level)  # [S', I, L, n]
    if straight:
        single[..., 1:] = INF
    best[:, :, :, :Sp] = single.transpose(1, 2, 3, 0)
    last_m[:] = np.arange(1, n + 1)[None, None, :, None]
    last_s[:] = np.arange(1, S + 1)[None, None, None, :]
    cut_cost = 2.0 * cut / level.bandwidth
    mprime = ms if not straight else ms[:1]
    n_mp = len(mprime)
    pm = np.arange(n)[:, None] - (np.arange(n_mp)[None, :] + 1)  # [n, m'] (m − m') − 1
    ps = np.arange(S)[:, None] - (np.arange(Sp)[None, :] + 1)  # [S, s'] (s − s') − 1
    ok_ms = (pm >= 0)[:, :, None, None] & (ps >= 0)[None, None, :, :]  # [n, m', S, s']
    pm_c, ps_c = np.maximum(pm, 0), np.maximum(ps, 0)
    for j in range(1, L):
        ks = np.arange(j)
        tail = stage_time(compute[:, ks + 1, j].T[:, None, :], params[ks + 1, j][:, None, None], mprime[None, :, None], level)  # [K, m', s']
        head = best[:, :j]  # [I, K, n, S]
        h = head[:, :, pm_c, :][:, :, :, :, ps_c]  # [I, K, n, m', S, s']
        cand = np.maximum(np.maximum(h, cut_cost[ks][None, :, None, None, None, None]), tail[None, :, None, :, None, :])
        ok = ok_ms[None, None] & (ks[None, :] >= starts[:, None])[:, :, None, None, None, None]
        cand = np.where(ok, cand, INF)
        flat = cand.transpose(0, 2, 4, 1, 3, 5).reshape(I, n, S, j * n_mp * Sp)
        arg = np.argmin(flat, axis=3)  # [I, n, S]
        val = np.take_along_axis(flat, arg[..., None], axis=3)[..., 0]
        cur = best[:, j]
        better = val < cur
        if better.any():
            k_best = arg // (n_mp * Sp)
            rest = arg % (n_mp * Sp)
            best[:, j] = np.where(better, val, cur)
            split[:, j] = np.where(better, k_best, split[:, j])
            last_m[:, j] = np.where(better, rest // Sp + 1, last_m[:, j])
            last_s[:, j] = np.where(better, rest % Sp + 1, last_s[:, j])
    used = np.broadcast_to(np.arange(1, n + 1)[None, None, :, None], best.shape).astype(np.int32).copy()
    for m in range(1, n):
        worse = best[:, :, m - 1] <= best[:, :, m]
        best[:, :, m] = np.where(worse, best[:, :, m - 1], best[:, :, m])
        used[:, :, m] = np.where(worse, used[:, :, m - 1], used[:, :, m])
    return CappedTable(best, split, last_m, last_s, used, all_starts)


def unwind_capped(table: CappedTable, i: int, j: int, m: int, s: int) -> list[tuple[int, int, int, int]]:
    """Stages (first, last_inclusive, units, flat stages) of range i..j on m units with s flat stages."""
    r = i if table.all_starts else 0
    out: list[tuple[int, int, int, int]] = []
    while True:
        m = int(table.used_m[r, j, m - 1, s - 1])
        k = int(table.split[r, j, m - 1, s - 1])
        if k < 0:
            out.append((i, j, m, s))
            break
        mp = int(table.last_m[r, j, m - 1, s - 1])
        sp = int(table.last_s[r, j, m - 1, s - 1])
        out.append((k + 1, j, mp, sp))
        j, m, s = k, m - mp, s - sp
    return out[::-1]
