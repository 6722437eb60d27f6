"""``pipedream``: PipeDream's hierarchical dynamic program (thesis ch. 2 §2.4.1), vectorized.

Objective (per profiled micro-batch, as in PipeDream's ``optimizer_graph_hierarchical.py``):
a stage over blocks i..j replicated on m workers of a level with bandwidth B takes

    T(i→j, m) = (C(i→j) + W(i→j, m)) / m,   W = 4(m−1)·|w(i→j)| / (m·B) / (workers per lower-level unit)

and a cut after block k costs 2·a_k / B (activation forward + gradient backward). The pipeline's
time is its slowest stage or cut:

    A(j, m) = min( T(0→j, m), A(j, m−1), min_{k<j, 1≤m'≤m} max(A(k, m−m'), 2·a_k/B, T(k+1→j, m')) )

Levels follow the cluster's hierarchy (GPUs in a server, servers in the cluster): level ℓ uses the
best time of running i..j on one level-(ℓ−1) unit as its compute term C, so every level needs the
table for every sub-range — the reason the published pure-Python optimizer takes tens of seconds
and gigabytes. Here each (i, j) row is one numpy broadcast over (k, m, m'), which is 100-1000×
faster with the same optimum.

The result maps back to a flat plan: a top-level stage on m' units, each of which pipelines its
range internally, becomes one flat stage per inner stage, replicated across the m' units.
``straight`` (PipeDream's ``--straight_pipeline``) forbids replication.

``max_stages`` caps the number of *flat* stages inside the DP (:func:`solve_level_capped`: one
more table dimension, "flat stages used", only when a cap is given and can bind — the default path
is unchanged). On one level a stage is one flat stage and the DP is exact for "at most s stages".
On two levels a top-level stage whose servers pipeline their range as s' inner stages counts s'
flat stages; the inner table is solved per s', the top level sums them, and the DP is exact for the
hierarchical objective restricted to at most s flat stages (tested against brute force).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.planners.options import PlannerOptions, PlannerSpec
from orchestrator.costmodel.terms import all_reduce_time, compute_time, fits_memory, stage_memory
from orchestrator.planners.scoring import plan_fits_memory
from orchestrator.core.profile import Profile

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


def _stage_time(compute: np.ndarray, params: np.ndarray, m: np.ndarray, level: Level) -> np.ndarray:
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
    single = _stage_time(compute[:, :, None], params[:, :, None], ms[None, None, :], level)
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
        tail = _stage_time(compute[ks + 1, j][:, None], params[ks + 1, j][:, None], mprime[None, :], level)  # [K, m']
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


def _ranges(profile: Profile, memory: tuple[float, float, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute, parameter bytes of every range i..j, and cut bytes. ``memory`` = (device bytes,
    bytes per parameter byte, micro-batches in flight): ranges that could not hold their state
    and that many stashes on one device are excluded."""
    L = profile.num_blocks
    f = profile.prefix("forward_s") + profile.prefix("backward_s")
    p = profile.prefix("param_bytes")
    i = np.arange(L)[:, None]
    j = np.arange(L)[None, :]
    ok = j >= i
    if memory is not None:
        cap, state, in_flight = memory
        st = profile.prefix("stash_bytes")
        end = np.minimum(j + 1, L)
        ok = ok & fits_memory(stage_memory(p[end] - p[i], st[end] - st[i], in_flight, 1.0, state), cap)
    compute = np.where(ok, f[np.minimum(j + 1, L)] - f[i], INF)
    params = np.where(ok, p[np.minimum(j + 1, L)] - p[i], 0.0)
    cut = profile.activations.astype(np.float64)
    return compute, params, cut


@dataclass
class Solution:
    bottleneck_s: float
    # Flat stages: (first, last_exclusive, replicas per top unit list)
    stages: list[tuple[int, int, list[int]]]


def _unwind(table: LevelTable, i: int, j: int, m: int) -> list[tuple[int, int, int]]:
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


def plan_pipedream(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    """PipeDream's plan. Its objective has no memory term, so when that plan does not fit, the DP
    runs again without the ranges one device could not hold with the micro-batches a stage can keep
    in flight — all M under GPipe; under 1F1B at most the depth, so for depth caps k = 1, 2, 4, …
    with k in flight — conservative (replicas would share the stash), and the fitting plan with the
    best PipeDream objective is returned."""
    plan = _plan(profile, cluster, options, None)
    if not options.check_memory or plan_fits_memory(plan, profile, cluster, options, options.kind):
        return plan
    M = options.num_microbatches
    cap = float(cluster.memories.min())
    tries: list[tuple[float, int | None]] = []  # (micro-batches in flight, stage cap that guarantees it)
    if options.kind is ScheduleKind.GPIPE:
        tries.append((float(M), options.max_stages))
    else:  # 1F1B keeps at most min(M, depth) in flight: cap the depth at k, assume k in flight
        k = 1
        while k < min(M, cluster.size):
            tries.append((float(k), min(k, options.max_stages or k)))
            k *= 2
        tries.append((float(min(M, cluster.size)), options.max_stages))
    best: Plan | None = None
    for in_flight, stages_cap in tries:
        try:
            cand = _plan(profile, cluster, replace(options, max_stages=stages_cap), (cap, options.state_factor, in_flight))
        except (UserError, IndexError, ValueError):
            continue
        obj = cand.objective_s if cand.objective_s is not None else INF
        if np.isfinite(obj) and plan_fits_memory(cand, profile, cluster, options, options.kind) and (best is None or obj < (best.objective_s or INF)):
            best = cand
    if best is None:
        raise UserError("pipedream: no pipeline fits device memory: even its best plan does not fit (try more devices, fewer micro-batches or another planner)")
    return best


def _plan(profile: Profile, cluster: Cluster, options: PlannerOptions, memory: tuple[float, float, float] | None) -> Plan:
    L = profile.num_blocks
    if options.max_stages is not None and options.max_stages < min(cluster.size, L):
        # Every flat stage takes a block and a device, so only a smaller cap can bind.
        return _plan_capped(profile, cluster, options, options.max_stages, memory)
    levels = hierarchy(cluster)
    compute, params, cut = _ranges(profile, memory)
    straight = options.straight
    node_groups = list(cluster.nodes().values())
    if len(levels) == 1:
        table = solve_level(compute, params, cut, levels[0], straight, all_starts=False)
        stages = _unwind(table, 0, L - 1, levels[0].units)
        order = [d for g in node_groups for d in g]
        flat: list[Stage] = []
        pos = 0
        for first, last, m in stages:
            flat.append(Stage(first, last + 1, tuple(order[pos : pos + m])))
            pos += m
        return _finish(flat, options, float(table.best[0, L - 1, levels[0].units - 1]))
    inner, outer = levels
    t1 = solve_level(compute, params, cut, inner, straight, all_starts=True)
    unit_best = t1.best[:, :, inner.units - 1]
    t2 = solve_level(unit_best, params, cut, outer, straight, all_starts=False)
    top = _unwind(t2, 0, L - 1, outer.units)
    flat = []
    server = 0
    for first, last, servers in top:
        sub = _unwind(t1, first, last, inner.units)
        gpu = 0
        for sfirst, slast, gpus in sub:
            devs = tuple(node_groups[server + s][gpu + g] for s in range(servers) for g in range(gpus))
            flat.append(Stage(sfirst, slast + 1, devs))
            gpu += gpus
        server += servers
    return _finish(flat, options, float(t2.best[0, L - 1, outer.units - 1]))


# ----------------------------------------------------------------------------------------------
# A cap on the pipeline depth (``options.max_stages``)
# ----------------------------------------------------------------------------------------------
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
    single = _stage_time(compute[:, starts, :, None], params[starts][None, :, :, None], ms[None, None, None, :], level)  # [S', I, L, n]
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
        tail = _stage_time(compute[:, ks + 1, j].T[:, None, :], params[ks + 1, j][:, None, None], mprime[None, :, None], level)  # [K, m', s']
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


def _unwind_capped(table: CappedTable, i: int, j: int, m: int, s: int) -> list[tuple[int, int, int, int]]:
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


def _plan_capped(profile: Profile, cluster: Cluster, options: PlannerOptions, cap: int, memory: tuple[float, float, float] | None = None) -> Plan:
    """PipeDream's DP with at most ``cap`` flat stages, exact in both the flat and the two-level case
    (a top-level stage run as s' inner stages on each of its servers counts s' flat stages)."""
    levels = hierarchy(cluster)
    compute, params, cut = _ranges(profile, memory)
    L = profile.num_blocks
    node_groups = list(cluster.nodes().values())
    if len(levels) == 1:
        table = solve_level_capped(compute[None], params, cut, levels[0], options.straight, False, cap)
        final = table.best[0, L - 1, levels[0].units - 1]
        s = int(np.argmin(final)) + 1
        order = [d for g in node_groups for d in g]
        flat: list[Stage] = []
        pos = 0
        for first, last, m, _ in _unwind_capped(table, 0, L - 1, levels[0].units, s):
            flat.append(Stage(first, last + 1, tuple(order[pos : pos + m])))
            pos += m
        return _finish(flat, options, float(final[s - 1]))
    inner, outer = levels
    s_in = min(cap, inner.units)
    t1 = solve_level_capped(compute[None], params, cut, inner, options.straight, True, s_in)
    unit_best = t1.best[:, :, inner.units - 1, :].transpose(2, 0, 1)  # [s', i, j]
    t2 = solve_level_capped(unit_best, params, cut, outer, options.straight, False, cap)
    final = t2.best[0, L - 1, outer.units - 1]
    s = int(np.argmin(final)) + 1
    flat = []
    server = 0
    for first, last, servers, sp in _unwind_capped(t2, 0, L - 1, outer.units, s):
        gpu = 0
        for sfirst, slast, gpus, _ in _unwind_capped(t1, first, last, inner.units, sp):
            devs = tuple(node_groups[server + k][gpu + g] for k in range(servers) for g in range(gpus))
            flat.append(Stage(sfirst, slast + 1, devs))
            gpu += gpus
        server += servers
    return _finish(flat, options, float(final[s - 1]))

def _finish(stages: list[Stage], options: PlannerOptions, objective: float) -> Plan:
    if options.max_stages is not None and len(stages) > options.max_stages:
        raise UserError(f"pipedream chose {len(stages)} stages, more than --max-stages {options.max_stages}")
    return Plan(tuple(stages), options.num_microbatches, options.kind, algorithm="pipedream", objective_s=objective)


def bottleneck(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions) -> float:
    """PipeDream's objective evaluated on any plan: slowest stage (compute + sync)/replicas or cut 2a/B."""
    worst = 0.0
    for idx, s in enumerate(plan.stages):
        m = s.replicas
        ring = cluster.ring_bandwidth(s.devices)
        sync = 2.0 * all_reduce_time(m, profile.param_bytes(s.first, s.last), ring)  # as in _stage_time
        worst = max(worst, compute_time(profile.compute_time(s.first, s.last) + sync, 1.0, m))
        if idx + 1 < len(plan.stages):
            nxt = plan.stages[idx + 1]
            bw = min(cluster.link(a, b) for a in s.devices for b in nxt.devices)
            worst = max(worst, 2.0 * profile.boundary_bytes(s.last) / bw)
    return worst


SPEC = PlannerSpec("pipedream", plan_pipedream, "PipeDream hierarchical DP with replication", bottleneck, ("pd",))
