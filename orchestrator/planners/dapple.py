"""``dapple``: the DAPPLE planner (Fan et al., PPoPP'21), early-backward (1F1B) schedule.

Pipeline latency (the paper's eq. 1–2). Write the pipeline as alternating compute and transfer
"pseudo-stages" x = 0..2S−2 with per-micro-batch forward/backward times ``F_x``/``B_x`` (a stage on
``r`` replicas runs ``1/r`` of the rows; a transfer costs the same both ways). With ``M`` micro-batches:

    L   = T_w + T_s + T_e
    T_w = Σ_{x ≤ Q} F_x                                   (warm-up: first micro-batch reaches the pivot)
    T_s = (M − 1) · (F_Q + B_Q)                           (steady phase, paced by the pivot)
    T_e = Σ_{x > Q} F_x + max_s ( Σ_{x ≥ x(s)} B_x + AR_s ) (ending: last micro-batch drains; each
                                                           stage all-reduces after its last backward)

Pivot (eq. 3): ``Q = argmax_x (F_x + B_x)``, the latest such x on ties — the pseudo-stage whose
steady phase cannot be hidden. (The paper words Q as the stage that dominates the steady phase; for
the early-backward schedule that is the slowest pseudo-stage, which is what we use. For a balanced
pipeline L reduces to the familiar (M + S − 1)(F + B).)

Dynamic program (the paper's T_PL over "layers planned, GPUs used, device set"): a state is the
set of occupied devices (per-server counts, lowest free ids first inside a server) plus the last
stage's devices (the next transfer's cost depends on them). A transition appends a stage of blocks
``(j', j]`` on ``m'`` new devices chosen by one of the three placement policies:

* **Fresh First** — take whole unused servers first (keeps a stage's all-reduce inside a server);
* **Append First** — keep filling the server the previous stage is on, then fresh servers
  (keeps the activation transfer inside a server);
* **Scatter First** — one device per server, round robin (spreads a stage over servers).

and the value is the pivot time ``max_x (F_x + B_x)`` of the partial pipeline, which composes by
``max`` — so the DP is exact for it (tested against brute force over the same placements). Every
final state is then scored by the latency ``L`` above and the smallest ``L`` that fits memory wins,
which is how DAPPLE compares hybrid configurations (different replication/stage counts).

The placement policies, the server symmetry and the DP's tables are in
:mod:`orchestrator.planners.dapple_placement`; every cost is a term of :mod:`orchestrator.costmodel.terms`.

Deviation / choices left open: memory inside the DP only rejects stages that cannot fit even one
micro-batch's stash; exact 1F1B in-flight memory is checked on the finished plans.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.planners.options import PlannerOptions, PlannerSpec
from orchestrator.costmodel.terms import all_reduce_time, compute_time, fits_memory, stage_memory, transfer_time
from orchestrator.costmodel.terms import boundary_time, group_all_reduce, seconds_per_byte
from orchestrator.planners.dapple_placement import POLICIES, DappleDP, StateKey, Occ, Allocator, Replay, Rows, server_types
from orchestrator.planners.scoring import fewest_devices, plan_fits_memory
from orchestrator.core.profile import Profile

INF = np.inf
DEFAULT_BEAM = 16
SMALL_CLUSTER = 16


def _stage_costs(profile: Profile, cluster: Cluster) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    L = profile.num_blocks
    fb = profile.prefix("forward_s") + profile.prefix("backward_s")
    i = np.arange(L + 1)[:, None]
    j = np.arange(L + 1)[None, :]
    comp = np.where(j > i, fb[j] - fb[i], INF)  # [j', j]
    pp = profile.prefix("param_bytes")
    st = profile.prefix("stash_bytes")
    par = np.where(j > i, pp[j] - pp[i], 0.0)
    sta = np.where(j > i, st[j] - st[i], 0.0)
    return comp, par, sta


def replica_counts(cluster: Cluster, options: PlannerOptions) -> list[int]:
    """Replica counts tried per stage: all of them on small clusters; on large ones (more than
    SMALL_CLUSTER devices) the counts a server layout makes natural — up to one server, then
    whole servers — which keeps planning interactive."""
    max_rep = 1 if options.straight else cluster.size
    per_server = max(len(g) for g in cluster.nodes().values())
    return [m for m in range(1, max_rep + 1) if cluster.size <= SMALL_CLUSTER or m <= per_server or m % per_server == 0]


def solve(profile: Profile, cluster: Cluster, options: PlannerOptions) -> DappleDP:
    L = profile.num_blocks
    servers = list(cluster.nodes().values())
    speeds = cluster.speeds
    mems = cluster.memories
    comp, par, sta = _stage_costs(profile, cluster)
    acts = np.array([profile.boundary_bytes(k) for k in range(L + 1)])
    M = options.num_microbatches
    cap = options.max_stages
    sizes = replica_counts(cluster, options)
    keys: list[StateKey] = []
    real: list[tuple[Occ, tuple[int, ...]]] = []
    index: dict[StateKey, int] = {}
    by_level: dict[int, list[int]] = {}
    rows = Rows(L + 1)
    types = server_types(cluster, servers)
    server_of = {d: k for k, g in enumerate(servers) for d in g}
    bt_cache: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
    group_cost: dict[tuple[object, ...], np.ndarray] = {}
    group_matrix: dict[tuple[int, ...], np.ndarray] = {}
    canon_cache: dict[tuple[Occ, tuple[int, ...]], tuple[object, ...]] = {}
    cand_cache: dict[tuple[Occ, tuple[int, ...]], list[tuple[Occ, tuple[int, ...], int]]] = {}

    def stage_matrix(group: tuple[int, ...]) -> np.ndarray:
        got = group_matrix.get(group)
        if got is not None:
            return got
        g = list(group)
        sig = (len(g), float(min(speeds[g])), float(min(mems[g])), cluster.ring_bandwidth(g))
        cost = group_cost.get(sig)
        if cost is None:
            cost = compute_time(comp, float(min(speeds[g])), len(g)) + group_all_reduce(cluster, group, 1.0) * par / M
            if options.check_memory:
                fits = fits_memory(stage_memory(par, sta, 1.0, len(g), options.state_factor), float(min(mems[g])))
                cost = np.where(fits, cost, INF)
            group_cost[sig] = cost
        group_matrix[group] = cost
        return cost

    def canonical(occ: Occ, group: tuple[int, ...]) -> tuple[object, ...]:
        if types is None:
            return (occ, group)
        got = canon_cache.get((occ, group))
        if got is not None:
            return got
        last = [0] * len(servers)
        for d in group:
            last[server_of[d]] += 1
        per_type: dict[int, list[tuple[int, int]]] = {}
        for k, t in enumerate(types):
            per_type.setdefault(t, []).append((occ[k], last[k]))
        got = canon_cache[(occ, group)] = tuple(tuple(sorted(v)) for _, v in sorted(per_type.items()))
        return got

    def key_of(occ: Occ, group: tuple[int, ...], depth: int) -> int:
        k = (canonical(occ, group), depth if cap else 0)
        idx = index.get(k)
        if idx is None:
            idx = rows.add()
            index[k] = idx
            keys.append(k)
            real.append((occ, group))
            by_level.setdefault(sum(occ), []).append(idx)
        return idx

    def candidates(occ: Occ, last: tuple[int, ...]) -> list[tuple[Occ, tuple[int, ...], int]]:
        cached = cand_cache.get((occ, last))
        if cached is not None:
            return cached
        out: dict[tuple[int, ...], tuple[Occ, int]] = {}
        alloc = Allocator(servers, occ, last, types)
        for m in sizes:
            if m > alloc.total_free:
                break
            for p, policy in enumerate(POLICIES):
                got = alloc.take(m, policy)
                if got is not None and got[1] not in out:
                    out[got[1]] = (got[0], m * 3 + p)
        cached = cand_cache[(occ, last)] = [(o, g, mv) for g, (o, mv) in out.items()]
        return cached

    empty: Occ = tuple(0 for _ in servers)
    # First stages: blocks [0, j) on a freshly allocated group.
    for occ, group, mv in candidates(empty, ()):
        idx = key_of(occ, group, 1)
        one = np.array([idx])
        rows.relax(one, stage_matrix(group)[0][None, :], np.full((1, L + 1), -1), np.zeros((1, L + 1), dtype=np.int64), np.full((1, L + 1), mv))
    # Expand states level by level in devices used: a transition always adds devices, so every
    # state is final when its level is reached. Beyond ``beam`` states per level only the most
    # promising are expanded (optimistic bound: the rest of the model spread over the free devices).
    beam = DEFAULT_BEAM if options.dapple_beam is None else options.dapple_beam
    fb = profile.prefix("forward_s") + profile.prefix("backward_s")
    fastest = float(speeds.max())
    for level in range(1, cluster.size):
        at_level = by_level.get(level, [])
        if beam and len(at_level) > beam:
            rest = compute_time(fb[-1] - fb, fastest, cluster.size - level)
            score = np.min(np.maximum(rows.best[at_level], rest[None, :]), axis=1)
            at_level = [at_level[i] for i in np.argsort(score, kind="stable")[:beam]]
        for idx in at_level:
            occ, last = real[idx]
            depth = keys[idx][1]
            vals = rows.best[idx]
            if not np.isfinite(vals[:L]).any() or (cap and depth >= cap):
                continue
            cands = candidates(occ, last)
            units = np.array([_unit_transfer(bt_cache, cluster, last, g) for _, g, _ in cands])
            lat = cluster.latency_s if last else 0.0
            head = np.maximum(vals[None, :], 2.0 * transfer_time(acts[None, :], units[:, None], lat))  # [C, j'], there and back
            cand = np.maximum(head[:, :, None], np.stack([stage_matrix(g) for _, g, _ in cands]))  # [C, j', j]
            jp_all = np.argmin(cand, axis=1)  # [C, j]
            v_all = np.take_along_axis(cand, jp_all[:, None, :], axis=1)[:, 0]  # [C, j]
            targets = np.array([key_of(nocc, group, depth + 1) for nocc, group, _ in cands])
            moves = np.array([mv for _, _, mv in cands])[:, None]
            rows.relax(targets, v_all, np.full_like(jp_all, idx), jp_all, np.broadcast_to(moves, jp_all.shape))
    n = rows.n
    return DappleDP(keys, real, rows.best[:n], rows.parent[:n], rows.parent_j[:n], rows.move[:n], servers, types, bt_cache)


def _unit_transfer(cache: dict[tuple[tuple[int, ...], tuple[int, ...]], float], cluster: Cluster, src: tuple[int, ...], dst: tuple[int, ...]) -> float:
    """Seconds per byte of a boundary between two groups (the slowest replica pair decides)."""
    got = cache.get((src, dst))
    if got is None:
        got = cache[(src, dst)] = seconds_per_byte(cluster, src, dst) if src else 0.0
    return got


class _CostCache:
    """Per-group and per-boundary cost lookups shared by many latency evaluations (same arithmetic
    as :func:`group_sim.group_all_reduce` / :func:`group_sim.boundary_time`, so values are bit-identical)."""

    def __init__(self, profile: Profile, cluster: Cluster, spb: dict[tuple[tuple[int, ...], tuple[int, ...]], float] | None = None) -> None:
        self.profile, self.cluster = profile, cluster
        self.speeds = cluster.speeds
        self.slow: dict[tuple[int, ...], float] = {}
        self.ring: dict[tuple[int, ...], float] = {}
        self.spb = {} if spb is None else spb

    def pseudo(self, stages: Sequence[tuple[int, int, tuple[int, ...]]]) -> tuple[list[float], list[float], list[int], list[float]]:
        prof, cluster = self.profile, self.cluster
        F: list[float] = []
        B: list[float] = []
        pos: list[int] = []
        ar: list[float] = []
        for j, (first, last, devs) in enumerate(stages):
            slow = self.slow.get(devs)
            if slow is None:
                slow = self.slow[devs] = float(min(self.speeds[list(devs)]))
            pos.append(len(F))
            F.append(compute_time(prof.forward_time(first, last), slow, len(devs)))
            B.append(compute_time(prof.backward_time(first, last), slow, len(devs)))
            k = len(devs)
            if k < 2:
                ar.append(0.0)
            else:
                ring = self.ring.get(devs)
                if ring is None:
                    ring = self.ring[devs] = cluster.ring_bandwidth(devs)
                ar.append(all_reduce_time(k, prof.param_bytes(first, last), ring))
            if j + 1 < len(stages):
                nxt = stages[j + 1][2]
                spb = self.spb.get((devs, nxt))
                if spb is None:
                    spb = self.spb[(devs, nxt)] = seconds_per_byte(cluster, devs, nxt)
                e = transfer_time(prof.boundary_bytes(last), spb, cluster.latency_s)
                F.append(e)
                B.append(e)
        return F, B, pos, ar


def pseudo_stages(plan: Plan, profile: Profile, cluster: Cluster) -> tuple[list[float], list[float], list[int], list[float]]:
    """F_x, B_x of the alternating compute/transfer pseudo-stages, x(s) and AR_s."""
    return _CostCache(profile, cluster).pseudo([(s.first, s.last, s.devices) for s in plan.stages])


def pivot(F: list[float], B: list[float]) -> int:
    """Eq. (3): the latest pseudo-stage with the largest F + B."""
    tot = [f + b for f, b in zip(F, B)]
    top = max(tot)
    return max(x for x, t in enumerate(tot) if t >= top * (1 - 1e-12))


def latency(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions | None = None) -> float:
    """DAPPLE's L = T_w + T_s + T_e of a straight plan."""
    F, B, pos, ar = pseudo_stages(plan, profile, cluster)
    return _latency(F, B, pos, ar, plan.num_microbatches)


def _latency(F: list[float], B: list[float], pos: list[int], ar: list[float], M: int) -> float:
    Q = pivot(F, B)
    t_w = sum(F[: Q + 1])
    t_s = (M - 1) * (F[Q] + B[Q])
    suffix_b = np.cumsum(B[::-1])[::-1]
    t_e = sum(F[Q + 1 :]) + max(float(suffix_b[x]) + a for x, a in zip(pos, ar))
    return t_w + t_s + t_e


def pivot_time(plan: Plan, profile: Profile, cluster: Cluster) -> float:
    """The DP's objective: max_x (F_x + B_x)."""
    F, B, _, _ = pseudo_stages(plan, profile, cluster)
    return max(f + b for f, b in zip(F, B))


def plan_dapple(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    """DAPPLE's plan; when no final state of the beam-limited DP fits memory (the beam ranks
    states by time alone), the DP runs again with an 8× wider beam and then none, so "no
    pipeline fits" means none of DAPPLE's placements fits, not that the beam dropped them —
    unless no straight pipeline on this many devices can fit at all (:func:`fewest_devices`): the
    wider passes cost 5× and 25× the first (issue 42: 15 s of a 32-GPU plan where every layer's
    stash binds). ``options.dapple_widen`` caps the wider passes."""
    beam = DEFAULT_BEAM if options.dapple_beam is None else options.dapple_beam
    widths = ([beam, beam * 8, 0] if beam else [0])[: 1 + options.dapple_widen]
    for k, width in enumerate(widths):
        try:
            return _plan_dapple(profile, cluster, replace(options, dapple_beam=width))
        except UserError:
            if k == len(widths) - 1 or not options.check_memory:
                raise
            if k == 0 and fewest_devices(profile, cluster, options, options.kind, replica_counts(cluster, options)) > cluster.size:
                raise  # no width can find what does not exist
    raise AssertionError("unreachable")


def _plan_dapple(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    dp = solve(profile, cluster, options)
    L = profile.num_blocks
    M = options.num_microbatches
    best: tuple[float, Plan] | None = None
    # Every final state is a candidate; the smallest latency that fits memory wins (the lowest
    # state index on ties). L >= M·v for a plan of DP value v (T_s ≥ (M−1)(F_x+B_x) and
    # T_w + T_e ≥ F_x + B_x + AR_s for every pseudo-stage x), so visiting states by increasing v
    # lets us stop as soon as M·v exceeds the best latency found: same winner, a few unwinds.
    final = dp.best[:, L]
    order = [int(i) for i in np.lexsort((np.arange(len(final)), final)) if np.isfinite(final[i])]
    best_idx = -1
    replay = Replay(dp)
    costs = _CostCache(profile, cluster, dp.spb)
    for idx in order:
        if best is not None and M * float(final[idx]) > best[0] * (1 + 1e-9):
            break
        stages = replay.stages(idx, L)
        lat = _latency(*costs.pseudo(stages), M)
        if best is not None and (lat > best[0] or (lat == best[0] and idx > best_idx)):
            continue
        plan = Plan(tuple(Stage(a, b, g) for a, b, g in stages), M, options.kind, algorithm="dapple")
        if not plan_fits_memory(plan, profile, cluster, options):
            continue
        best, best_idx = (lat, plan), idx
    if best is None:
        raise UserError("dapple: no pipeline fits device memory (try more devices or fewer micro-batches)")
    out = Plan(best[1].stages, M, options.kind, algorithm="dapple", objective_s=best[0])

    return out


def _latency_objective(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions) -> float:
    return latency(plan, profile, cluster)


SPEC = PlannerSpec("dapple", plan_dapple, "DAPPLE (PPoPP'21): latency model with pivot stage, DP over device sets, 1F1B", _latency_objective)


def dp_objective(plan: Plan, profile: Profile, cluster: Cluster, M: int) -> float:
    """The DP's value of a finished plan: max over pseudo-stages of F + B, the stages' all-reduce
    amortized over the M micro-batches (used by the brute-force test)."""
    worst = 0.0
    for j, s in enumerate(plan.stages):
        g = list(s.devices)
        stage = compute_time(profile.compute_time(s.first, s.last), float(min(cluster.speeds[g])), len(g))
        stage += group_all_reduce(cluster, s.devices, profile.param_bytes(s.first, s.last)) / M
        worst = max(worst, stage)
        if j + 1 < len(plan.stages):
            worst = max(worst, 2.0 * boundary_time(cluster, s.devices, plan.stages[j + 1].devices, profile.boundary_bytes(s.last)))
    return worst
