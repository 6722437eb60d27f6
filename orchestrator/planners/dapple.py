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

Deviation / choices left open: memory inside the DP only rejects stages that cannot fit even one
micro-batch's stash; exact 1F1B in-flight memory is checked on the finished plans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.cluster import Cluster
from orchestrator.errors import UserError
from orchestrator.plan import Plan, ScheduleKind, Stage
from orchestrator.planners.base import PlannerOptions, PlannerSpec, register
from orchestrator.planners.spp import all_reduce_time, boundary_time, fits_memory
from orchestrator.profile import Profile

INF = np.inf
POLICIES = ("fresh_first", "append_first", "scatter_first")

Occ = tuple[int, ...]
Key = tuple[Occ, tuple[int, ...], int]  # occupancy, last group, stage count (0 unless capped)


def allocate(servers: list[list[int]], occ: Occ, last: tuple[int, ...], m: int, policy: str) -> tuple[Occ, tuple[int, ...]] | None:
    """The ``m`` devices a policy picks next, and the new occupancy (None if too few are free)."""
    free = [len(g) - u for g, u in zip(servers, occ)]
    if sum(free) < m:
        return None
    take = [0] * len(servers)
    need = m
    if policy == "scatter_first":
        while need:
            for k in range(len(servers)):
                if need and free[k] - take[k] > 0:
                    take[k] += 1
                    need -= 1
    else:
        last_servers = {k for k, g in enumerate(servers) for d in last if d in g}
        fresh = [k for k in range(len(servers)) if occ[k] == 0]
        partial = sorted((k for k in range(len(servers)) if 0 < occ[k] < len(servers[k])), key=lambda k: (k not in last_servers, -free[k], k))
        ordered = fresh + partial if policy == "fresh_first" else partial + fresh
        for k in ordered:
            if not need:
                break
            t = min(need, free[k])
            take[k] += t
            need -= t
    group = tuple(d for k, g in enumerate(servers) for d in g[occ[k] : occ[k] + take[k]])
    return tuple(u + t for u, t in zip(occ, take)), group


@dataclass
class DappleDP:
    keys: list[Key]
    best: list[np.ndarray]  # per key: pivot value after planning blocks [0, j), j = 0..L
    parent: list[np.ndarray]  # per key, per j: parent key index (-1 = first stage)
    parent_j: list[np.ndarray]


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


def solve(profile: Profile, cluster: Cluster, options: PlannerOptions) -> DappleDP:
    L = profile.num_blocks
    servers = list(cluster.nodes().values())
    speeds = cluster.speeds
    mems = cluster.memories
    comp, par, sta = _stage_costs(profile, cluster)
    acts = np.array([profile.boundary_bytes(k) for k in range(L + 1)])
    cap = options.max_stages
    max_rep = 1 if options.straight else cluster.size
    keys: list[Key] = []
    index: dict[Key, int] = {}
    best: list[np.ndarray] = []
    parent: list[np.ndarray] = []
    parent_j: list[np.ndarray] = []
    group_cost: dict[tuple[int, ...], np.ndarray] = {}

    def stage_matrix(group: tuple[int, ...]) -> np.ndarray:
        cost = group_cost.get(group)
        if cost is None:
            g = list(group)
            cost = comp / (len(g) * float(min(speeds[g])))
            if options.check_memory:
                fits = par * options.state_factor + sta / len(g) <= float(min(mems[g]))
                cost = np.where(fits, cost, INF)
            group_cost[group] = cost
        return cost

    def key_of(occ: Occ, group: tuple[int, ...], depth: int) -> int:
        k = (occ, group, depth if cap else 0)
        idx = index.get(k)
        if idx is None:
            idx = len(keys)
            index[k] = idx
            keys.append(k)
            best.append(np.full(L + 1, INF))
            parent.append(np.full(L + 1, -2, dtype=np.int64))
            parent_j.append(np.full(L + 1, -1, dtype=np.int64))
        return idx

    def candidates(occ: Occ, last: tuple[int, ...]) -> list[tuple[Occ, tuple[int, ...]]]:
        out: dict[tuple[int, ...], Occ] = {}
        for m in range(1, max_rep + 1):
            for policy in POLICIES:
                got = allocate(servers, occ, last, m, policy)
                if got is not None and got[1] not in out:
                    out[got[1]] = got[0]
        return [(o, g) for g, o in out.items()]

    empty: Occ = tuple(0 for _ in servers)
    # First stages: blocks [0, j) on a freshly allocated group.
    for occ, group in candidates(empty, ()):
        idx = key_of(occ, group, 1)
        row = stage_matrix(group)[0]
        better = row < best[idx]
        best[idx] = np.where(better, row, best[idx])
        parent[idx] = np.where(better, -1, parent[idx])
        parent_j[idx] = np.where(better, 0, parent_j[idx])
    # Expand states level by level in devices used: a transition always adds devices, so every
    # state is final when its level is reached.
    for level in range(1, cluster.size):
        for idx in [k for k in range(len(keys)) if sum(keys[k][0]) == level]:
            occ, last, depth = keys[idx]
            vals = best[idx]
            if not np.isfinite(vals[:L]).any() or (cap and depth >= cap):
                continue
            for nocc, group in candidates(occ, last):
                tr = 2.0 * _transfer(cluster, last, group, acts)
                head = np.maximum(vals, tr)[:, None]  # [j']
                cand = np.maximum(head, stage_matrix(group))  # [j', j]
                jp = np.argmin(cand, axis=0)
                v = cand[jp, np.arange(L + 1)]
                if not np.isfinite(v).any():
                    continue
                nidx = key_of(nocc, group, depth + 1)
                better = v < best[nidx]
                if better.any():
                    best[nidx] = np.where(better, v, best[nidx])
                    parent[nidx] = np.where(better, idx, parent[nidx])
                    parent_j[nidx] = np.where(better, jp, parent_j[nidx])
    return DappleDP(keys, best, parent, parent_j)


def _transfer(cluster: Cluster, src: tuple[int, ...], dst: tuple[int, ...], acts: np.ndarray) -> np.ndarray:
    """Per-unit transfer time for every cut (bytes differ, the slowest replica pair does not)."""
    return acts * boundary_time(cluster, src, dst, 1.0)


def unwind(dp: DappleDP, idx: int, L: int) -> list[Stage]:
    stages = []
    j = L
    while idx >= 0:
        pj = int(dp.parent_j[idx][j])
        stages.append(Stage(pj, j, dp.keys[idx][1]))
        idx, j = int(dp.parent[idx][j]), pj
    return stages[::-1]


def pseudo_stages(plan: Plan, profile: Profile, cluster: Cluster) -> tuple[list[float], list[float], list[int], list[float]]:
    """F_x, B_x of the alternating compute/transfer pseudo-stages, x(s) and AR_s."""
    F: list[float] = []
    B: list[float] = []
    pos: list[int] = []
    ar: list[float] = []
    for j, s in enumerate(plan.stages):
        slow = float(min(cluster.speeds[list(s.devices)])) * s.replicas
        pos.append(len(F))
        F.append(profile.forward_time(s.first, s.last) / slow)
        B.append(profile.backward_time(s.first, s.last) / slow)
        ar.append(all_reduce_time(cluster, s.devices, profile.param_bytes(s.first, s.last)))
        if j + 1 < len(plan.stages):
            e = boundary_time(cluster, s.devices, plan.stages[j + 1].devices, profile.boundary_bytes(s.last))
            F.append(e)
            B.append(e)
    return F, B, pos, ar


def pivot(F: list[float], B: list[float]) -> int:
    """Eq. (3): the latest pseudo-stage with the largest F + B."""
    tot = [f + b for f, b in zip(F, B)]
    top = max(tot)
    return max(x for x, t in enumerate(tot) if t >= top * (1 - 1e-12))


def latency(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions | None = None) -> float:
    """DAPPLE's L = T_w + T_s + T_e of a straight plan."""
    F, B, pos, ar = pseudo_stages(plan, profile, cluster)
    M = plan.num_microbatches
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
    dp = solve(profile, cluster, options)
    L = profile.num_blocks
    M = options.num_microbatches
    best: tuple[float, Plan] | None = None
    for idx in range(len(dp.keys)):
        if not np.isfinite(dp.best[idx][L]):
            continue
        plan = Plan(tuple(unwind(dp, idx, L)), M, ScheduleKind.ONE_F_ONE_B, algorithm="dapple")
        lat = latency(plan, profile, cluster)
        if best is not None and lat >= best[0]:
            continue
        if not fits_memory(plan, profile, cluster, options):
            continue
        best = (lat, plan)
    if best is None:
        raise UserError("dapple: no pipeline fits device memory (try more devices or fewer micro-batches)")
    return Plan(best[1].stages, M, ScheduleKind.ONE_F_ONE_B, algorithm="dapple", objective_s=best[0])


def _latency_objective(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions) -> float:
    return latency(plan, profile, cluster)


register(PlannerSpec("dapple", plan_dapple, "DAPPLE (PPoPP'21): latency model with pivot stage, DP over device sets, 1F1B", _latency_objective))
