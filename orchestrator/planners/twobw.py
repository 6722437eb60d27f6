"""``2bw``: the PipeDream-2BW planner (Narayanan et al., ICML'21; Narayanan's thesis ch. 3).

2BW splits the model into ``d`` equal stages (depth) and replicates the pipeline ``w`` times
(width), ``w·d ≤`` devices, and picks the (w, d) with the best estimated throughput among those that
fit memory. Per (w, d), following the thesis' cost model with per-micro-batch stage times
``t_s = max((F + B)_s / w, 2·a_s / (w·B_link))`` and ring all-reduce ``AR_s``::

    T(w, d) = (M + d − 1) · max_s t_s + max_s AR_s          (flushed 1F1B iteration; see below)
    mem_s   = params_s · (state_factor + 1) + min(d − s, M) · stash_s / w

``+1`` is 2BW's second (double-buffered) weight version; the stash is 1F1B's in-flight count.
Choices left open: 2BW runs without flushes (its steady state hides the fill), but this runtime
flushes every iteration, so the fill term ``(d − 1)`` is kept; "equal stages" is the exact min-max
partition of ``F + B`` (equal layer counts for uniform transformers); replicas are laid out either
pipeline-major (one whole pipeline per server run, p2p stays inside servers) or stage-major
(a stage's replicas together, all-reduce stays inside servers) — both are estimated, the better kept.
"""

from __future__ import annotations

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.planners.options import PlannerOptions, PlannerSpec
from orchestrator.planners.partition import devices_by_speed_order, min_max_partition
from orchestrator.costmodel.terms import compute_time, in_flight, stage_memory
from orchestrator.costmodel.terms import boundary_time, group_all_reduce
from orchestrator.core.profile import Profile


def layouts(order: list[int], w: int, d: int) -> list[list[tuple[int, ...]]]:
    pipeline_major = [tuple(order[k * d + s] for k in range(w)) for s in range(d)]
    stage_major = [tuple(order[s * w + k] for k in range(w)) for s in range(d)]
    return [pipeline_major] if w == 1 or d == 1 else [pipeline_major, stage_major]


def estimate_2bw(plan: Plan, profile: Profile, cluster: Cluster, state_factor: float) -> tuple[float, float]:
    """(iteration time, worst memory surplus ratio need/capacity) by the 2BW cost model."""
    M = plan.num_microbatches
    d = len(plan.stages)
    t_max, ar_max, worst = 0.0, 0.0, 0.0
    for s, st in enumerate(plan.stages):
        w = st.replicas
        slow = float(min(cluster.speeds[list(st.devices)]))
        t = compute_time(profile.compute_time(st.first, st.last), slow, w)
        if s + 1 < d:
            t = max(t, 2.0 * boundary_time(cluster, st.devices, plan.stages[s + 1].devices, profile.boundary_bytes(st.last)))
        t_max = max(t_max, t)
        ar_max = max(ar_max, group_all_reduce(cluster, st.devices, profile.param_bytes(st.first, st.last)))
        # 2BW's second weight version: one more parameter copy; 1F1B's in-flight stash
        need = stage_memory(profile.param_bytes(st.first, st.last), profile.stash_bytes(st.first, st.last), in_flight(ScheduleKind.ONE_F_ONE_B, s, d, M), w, state_factor + 1)
        worst = max(worst, need / float(min(cluster.memories[list(st.devices)])))
    return (M + d - 1) * t_max + ar_max, worst


def plan_2bw(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    M = options.num_microbatches
    order = devices_by_speed_order(cluster)
    weights = np.array([b.forward_s + b.backward_s for b in profile.blocks])
    d_max = min(cluster.size, profile.num_blocks, options.max_stages or cluster.size)
    best: tuple[float, Plan] | None = None
    for d in range(1, d_max + 1):
        cuts = min_max_partition(weights, d)
        widths = [1] if options.straight else range(1, cluster.size // d + 1)
        for w in widths:
            for groups in layouts(order, w, d):
                plan = Plan(tuple(Stage(cuts[s], cuts[s + 1], groups[s]) for s in range(d)), M, ScheduleKind.ONE_F_ONE_B, algorithm="2bw")
                t, mem_ratio = estimate_2bw(plan, profile, cluster, options.state_factor)
                if options.check_memory and mem_ratio > 1.0:
                    continue
                if best is None or t < best[0] - 1e-12:
                    best = (t, plan)
    if best is None:
        raise UserError("2bw: no width x depth fits device memory with double-buffered weights")
    plan = Plan(best[1].stages, M, ScheduleKind.ONE_F_ONE_B, algorithm="2bw", objective_s=best[0])
    return plan


def _objective(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions) -> float:
    return estimate_2bw(plan, profile, cluster, options.state_factor)[0]


SPEC = PlannerSpec("2bw", plan_2bw, "PipeDream-2BW: width x depth search with double-buffered weight memory", _objective, ("pipedream-2bw", "twobw"))
