"""Interleaved 1F1B (Megatron-LM PTD-P, Narayanan et al. SC'21) as a planner option.

Given any straight plan with ``p`` device groups, :func:`best_interleaving` tries ``v = 1, 2, …``
virtual chunks per group: the blocks are re-cut into ``p·v`` balanced chunks (exact min-max of
``F + B``) and chunk ``k`` runs on group ``k mod p`` (:func:`orchestrator.core.plan.interleave`). Each
candidate is scored by the simulator — interleaving shrinks the bubble by ``v`` but multiplies the
point-to-point traffic by ``v`` and changes the stash, so only simulation can tell — and the fastest
that fits device memory is returned (``v = 1``, the plan itself, when nothing beats it).

Megatron requires the micro-batch count to be a multiple of the depth ``p``; when it is not, the
plan is returned unchanged. AutoPipe's slicing does not combine with interleaving (the unit count
would break that rule), so interleaved candidates drop it.

Use: ``options.interleave`` (CLI ``--interleave``) makes :func:`run_planner` pass every planner's
plan through here; ``auto`` offers interleaving to every candidate and keeps those its bounds
cannot rule out.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, ScheduleKind, interleave
from orchestrator.planners.options import PlannerOptions
from orchestrator.planners.partition import min_max_partition
from orchestrator.core.profile import Profile
from orchestrator.costmodel.simulator import memory_error, simulate

MAX_CHUNKS = 8


def candidate_chunks(plan: Plan, profile: Profile) -> list[int]:
    p = plan.num_physical_stages
    if p < 2 or plan.num_microbatches % p:
        return [1]
    return list(range(1, min(MAX_CHUNKS, profile.num_blocks // p) + 1))


def interleaved_plan(plan: Plan, profile: Profile, v: int) -> Plan:
    base = replace(plan, stages=plan.stages[: plan.num_physical_stages], schedule=ScheduleKind.ONE_F_ONE_B, sliced_microbatches=0)
    weights = np.array([b.forward_s + b.backward_s for b in profile.blocks])
    cuts = min_max_partition(weights, base.num_physical_stages * v)
    out = interleave(base, v, cuts)
    return replace(out, algorithm=plan.algorithm, objective_s=plan.objective_s)


def best_interleaving(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions, min_chunks: int = 1) -> Plan:
    """The plan with the number of virtual chunks (>= ``min_chunks``) that minimizes simulated
    time within memory; ``plan`` itself when none qualifies."""
    best: tuple[float, Plan] | None = None
    sim_options = options.sim_options
    for v in candidate_chunks(plan, profile):
        if v < min_chunks:
            continue
        try:
            cand = plan if v == 1 else interleaved_plan(plan, profile, v)
        except UserError:
            continue
        res = simulate(cand, profile, cluster, sim_options)
        if options.check_memory and memory_error(res, cluster):
            continue
        if best is None or res.iteration_s < best[0] - 1e-12:
            best = (res.iteration_s, cand)
    return best[1] if best is not None else plan

