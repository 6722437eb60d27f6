"""PipeDream's dynamic program over one level of the cluster's hierarchy, as numpy tables.

The tables and their recurrences (see :mod:`orchestrator.planners.pipedream` for the objective and how the levels
nest): :func:`solve_level` fills ``A(i→j, m)`` for every range (or every prefix) and worker count, one
diagonal j − i at a time over strided views;
:func:`solve_level_capped` adds the "flat stages used" dimension when a stage cap can bind; the ``unwind``
functions read a solution back. Nothing here knows a profile or a plan — only compute, parameter and cut arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from orchestrator.core.cluster import Cluster
from orchestrator.costmodel.terms import all_reduce_time, compute_time

INF = np.inf
NO_PAIR = np.iinfo(np.intp).max
BATCH_ALL_UNITS = 1024  # diagonal size (starts × cuts) up to which every m is relaxed in one batch


@dataclass(frozen=True)
class Level:
    units: int  # how many lower-level units this level combines (GPUs per server, servers)
    bandwidth: float  # bytes/s between those units
    within: int  # workers inside one unit (divides the weight-sync term, as PipeDream does)


@dataclass
class LevelTable:
    """best[m-1, r, j] = best bottleneck of blocks i..j (inclusive) on m units, r = i when every start
    is solved, else 0 (only i = 0); plus back-pointers. Unit count first: a level above reads one
    contiguous [i, j] slab (its compute term), and nothing is transposed after the fill."""

    best: np.ndarray  # [n, I, L]
    split: np.ndarray  # [n, I, L] k of the last cut, -1 = single stage
    last_m: np.ndarray  # [n, I, L] units of the last stage
    used_m: np.ndarray  # [n, I, L] units actually used (<= m when fewer is better)


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


def stage_time(compute: np.ndarray, params: np.ndarray, m: np.ndarray | float, level: Level) -> np.ndarray:
    # PipeDream's gradient exchange, 4(m−1)/m · |w| / B: twice the ring term, per lower-level worker
    sync = 2.0 * all_reduce_time(m, params, level.bandwidth) / level.within
    return compute_time(compute + sync, 1.0, m)


def solve_level(compute: np.ndarray, params: np.ndarray, cut: np.ndarray, level: Level, straight: bool, all_starts: bool) -> LevelTable:
    """The DP of one level. ``compute``/``params`` are [L, L] range tables (inf where impossible);
    ``cut[k]`` is the activation bytes crossing a cut after block k.

    The tables are filled one diagonal d = j − i at a time: ranges of one length depend only on
    shorter ones, so a diagonal is one batch over every start i (or only i = 0 without
    ``all_starts``) and every offset t = k − i of the last cut — no k < i half wasted as in a
    per-end-block sweep. The head A(i→i+t), the cut and the tail T(i+t+1→i+d) are strided views of
    [m, L, L] tables, so nothing is gathered per diagonal except, for small diagonals, the head
    slab of each (m, m') pair.

    Without ``all_starts`` the tables hold the one row i = 0, and the single stage's times are
    written one unit count at a time into the tables that keep them: in a fresh process (every
    ``orchestrator plan``) each megabyte of [m, L, L] temporaries is a megabyte of page faults
    (resnet101's 411 down-sets on 16 GPUs: 0.17 s on a first call, 0.06 s warm).
    """
    L, n = compute.shape[0], level.units
    rows = L if all_starts else 1
    n_mp = 1 if straight else n  # units of the last stage, m' = 1..n_mp
    best, best_diag = _diagonal_table(L, rows, n, INF)
    split, split_diag = _diagonal_table(L, rows, n, -1)
    last_m, last_diag = _diagonal_table(L, rows, n, 0)
    tail = _tail_buffer(L, n_mp)  # T(s→e, m') as [m', e, s], the layout _fill reads it in
    for m in range(1, n + 1):  # one stage over i..j on m units: the single-stage option and every tail's time
        single = stage_time(compute, params, float(m), level)
        if m <= n_mp:
            tail[: n_mp * L * L].reshape(n_mp, L, L)[m - 1] = single.T
        if m == 1 or not straight:
            best[m - 1] = single[:rows]
        last_m[m - 1] = m
    if L > 1 and n > 1:
        _fill(best_diag, split_diag, last_diag, tail, n_mp, 2.0 * cut / level.bandwidth, all_starts)
    # "Use fewer units" when that is faster (PipeDream's use_fewer_machines).
    used = np.empty(best.shape, dtype=np.int32)
    used[:] = np.arange(1, n + 1, dtype=np.int32)[:, None, None]
    for m in range(1, n):
        worse = best[m - 1] <= best[m]
        np.copyto(best[m], best[m - 1], where=worse)
        np.copyto(used[m], used[m - 1], where=worse)
    return LevelTable(best, split, last_m, used)


def _tail_buffer(L: int, n_mp: int) -> np.ndarray:
    """Room for T(s→e, m') as [m', e, s] and two slabs of INF after it: :func:`_fill`'s strided tail
    view reaches into them for the offsets no range has."""
    buf = np.empty((n_mp + 2) * L * L)
    buf[n_mp * L * L :] = INF
    return buf


def _fill(diag: np.ndarray, split_diag: np.ndarray, last_diag: np.ndarray, tail: np.ndarray, n_mp: int, cut_cost: np.ndarray, all_starts: bool) -> None:
    """The recurrence A(i→j, m) = min over cuts k and last-stage units m' of
    max(A(i→k, m − m'), 2a_k/(B·m'), T(k+1→j, m'), 2a_j/(B·m')), the last term only when j is not the
    model's last block, written into the diagonal views ``diag[m−1, i, d]``
    (and its back-pointers) where it beats the single stage already there. ``tail`` is
    :func:`_tail_buffer`: T(s→e, m') as [m', e, s] for m' = 1..``n_mp``, then INF."""
    n, L = diag.shape[0] - 1, len(cut_cost)
    f8, LL = tail.itemsize, L * L
    # T(i+t+1 → i+d, m') at tail_view[m'−1, d, i, t], from the transposed table [m', end, start];
    # the INF padding covers the view's unused corner.
    tail_view = as_strided(tail[1:], shape=(n_mp, L, L, L), strides=(LL * f8, L * f8, (L + 1) * f8, f8))
    cuts = np.concatenate([cut_cost, np.full(L, INF)])
    cut_view = as_strided(cuts, shape=(L, L), strides=(f8, f8))  # cut after i + t
    mp_div = np.arange(1, n_mp + 1, dtype=np.float64)[:, None, None]  # the cut is shared by the tail's m' replicas
    out_cost = _output_cost(cut_cost)
    # Pair (m, m') reads head units m − m' (slab m − m' − 1); impossible pairs read the INF slab n.
    m_col = np.arange(2, n + 1)[:, None]
    mp_row = np.arange(1, n_mp + 1)[None, :]
    pair_slab = np.where(mp_row <= m_col - 1, m_col - mp_row - 1, n)  # [m−2, m'−1]
    rows = np.arange(n * n_mp * L)
    arg_buf, val_buf = np.zeros((n - 1, n_mp, L), dtype=np.intp), np.empty((n - 1, n_mp, L))
    # scratch for the large diagonals, allocated once: a fresh array per diagonal is a fresh mapping of
    # pages over numpy's small-array cache (a third of resnet101's DP on 4 × 4 GPUs was page faults)
    area = max(((L - d if all_starts else 1) * d for d in range(1, L)), default=0)
    used = min(n_mp, n - 1)  # tail unit counts m' that some m <= n can pair with a head
    ct_buf, cand_buf, head_buf = np.empty(used * area), np.empty(used * area), np.empty(area)
    for d in range(1, L):
        I = L - d if all_starts else 1
        # the cut into the tail, and what the tail sends on after block i + d (published: output_transfer_time)
        if I * d <= BATCH_ALL_UNITS:  # few elements: one batch over every m (fewer numpy calls)
            ct = np.maximum(tail_view[:, d, :I, :d], np.maximum(cut_view[:I, :d], out_cost[d : d + I, None])[None] / mp_div)  # [m', i, t]
            cand = np.maximum(diag[pair_slab, :I, :d], ct)  # [m, m', i, t]
            arg = cand.argmin(axis=3)
            _relax(arg, _at(cand, arg, rows), diag[1:n, :I, d], split_diag[1:n, :I, d], last_diag[1:n, :I, d], rows)
        else:  # many: one m at a time, over its possible m' only (less work), then one relaxation
            head = head_buf[: I * d].reshape(I, d)
            np.maximum(cut_view[:I, :d], out_cost[d : d + I, None], out=head)
            ct = ct_buf[: used * I * d].reshape(used, I, d)  # m' = n never has a head (m − m' >= 1)
            np.divide(head[None], mp_div[:used], out=ct)
            np.maximum(tail_view[:used, d, :I, :d], ct, out=ct)  # [m', i, t]
            arg, val = arg_buf[:, :, :I], val_buf[:, :, :I]
            val.fill(INF)  # pairs m' > m − 1 stay impossible
            for m in range(2, n + 1):
                k = min(m - 1, n_mp)
                cand = cand_buf[: k * I * d].reshape(k, I, d)
                np.maximum(diag[m - 2 :: -1, :I, :d][:k], ct[:k], out=cand)  # [m', i, t]
                arg[m - 2, :k] = at = cand.argmin(axis=2)
                val[m - 2, :k] = _at(cand, at, rows)
            _relax(arg, val, diag[1:n, :I, d], split_diag[1:n, :I, d], last_diag[1:n, :I, d], rows)


def _output_cost(cut_cost: np.ndarray) -> np.ndarray:
    """What the last stage of a split candidate ending at j pays to send its output on, 2a_j/B (to be
    divided by its replicas): nothing at the model's end. PipeDream's DP charges it only to split
    candidates (a single stage from the start never pays it), and so do we: the same objective."""
    out = cut_cost.astype(np.float64, copy=True)
    out[-1] = 0.0
    return out


def _at(cand: np.ndarray, arg: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``cand[..., arg[...]]``: the values at the argmins, gathered (a second reduction would read it all again)."""
    return cand.reshape(-1, cand.shape[-1])[rows[: arg.size], arg.ravel()].reshape(arg.shape)


def _relax(arg: np.ndarray, val: np.ndarray, best: np.ndarray, split: np.ndarray, last_m: np.ndarray, rows: np.ndarray) -> None:
    """``val[m, m', i]``, ``arg[m, m', i]``: one diagonal's best candidate per pair and start (INF where the pair
    is impossible) and its cut offset t, the first among equals; improve ``best``/``split``/``last_m`` [m, i]
    where it beats them. Among equal minima the first (t, m') in t-major order wins, the per-end-block sweep's
    tie-break. (``np.minimum.reduce`` rather than ``.min``: this runs thousands of times on small arrays.)"""
    _, n_mp, I = val.shape
    vmin = np.minimum.reduce(val, axis=1)
    better = vmin < best
    if not better.any():
        return
    flat = np.minimum.reduce(np.where(val == vmin[:, None], arg * n_mp + rows[:n_mp, None], NO_PAIR), axis=1)
    np.copyto(best, vmin, where=better)
    np.copyto(split, rows[:I] + flat // n_mp, where=better, casting="unsafe")
    np.copyto(last_m, flat % n_mp + 1, where=better, casting="unsafe")


def _diagonal_table(L: int, rows: int, n: int, fill: float) -> tuple[np.ndarray, np.ndarray]:
    """A [m, i, j] table of ``rows`` starts and its diagonal view D[m, i, d] = table[m, i, i + d], with
    one more slab m = n holding ``fill`` ("no such pair"). The buffer is L longer: the view's unused
    corner reaches past the table's end."""
    dtype = np.float64 if isinstance(fill, float) else np.int32
    buf = np.full((n + 1) * rows * L + L, fill, dtype=dtype)
    b = buf.itemsize
    return buf[: n * rows * L].reshape(n, rows, L), as_strided(buf, shape=(n + 1, rows, L), strides=(rows * L * b, (L + 1) * b, b))


def unwind(table: LevelTable, i: int, j: int, m: int) -> list[tuple[int, int, int]]:
    """Stages (first, last_inclusive, units) of range i..j on m units, in order."""
    out: list[tuple[int, int, int]] = []
    if table.best.shape[1] == 1 and i:
        raise ValueError(f"range {i}..{j}: this table was solved from block 0 only")
    r = i if table.best.shape[1] > 1 else 0
    while True:
        m = int(table.used_m[m - 1, r, j])
        k = int(table.split[m - 1, r, j])
        mp = int(table.last_m[m - 1, r, j])
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

        A(i→j, m, s) = min( T_{s}(i→j, m), min_{k, m', s'} max(A(i→k, m−m', s−s'), 2a_k/(B·m'), T_{s'}(k+1→j, m'), 2a_j/(B·m')) )
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
    out_cost = _output_cost(cut_cost)
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
        cuts = np.maximum(cut_cost[ks], out_cost[j])[:, None] / mprime[None, :]  # [K, m']: max(2a_k, 2a_j)/(B·m')
        cand = np.maximum(np.maximum(h, cuts[None, :, None, :, None, None]), tail[None, :, None, :, None, :])
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
