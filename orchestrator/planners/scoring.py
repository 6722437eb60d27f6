"""Fast scoring of straight pipelines: SPP's PE, its bounds, and the static memory check.

SPP's PE (Luo et al., INFOCOM'22, step 3) runs every stage's order queue ``U_s`` as soon as a
unit is ready and first in its queue, transfers queue on their link in send order, each stage
all-reduces after its last backward. That is exactly the simulator's group-level mode
(:func:`orchestrator.costmodel.group_sim.simulate_groups`) on the generator's 1F1B or GPipe order, so
:func:`estimate` is that mode — no scheduler of its own. :class:`PipelineCosts` holds a plan's
per-unit terms (:mod:`orchestrator.costmodel.terms`, at a stage's slowest replica and a boundary's
slowest replica pair) for the bounds SPP prunes candidates with before timing them.

``plan_fits_memory`` is the static memory check every straight-pipeline planner uses (static
state plus the schedule's in-flight stash per replica, :func:`cost_terms.stage_memory`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.costmodel.terms import compute_time, fits_memory, in_flight, stage_memory, transfer_time
from orchestrator.costmodel.terms import group_all_reduce, seconds_per_byte
from orchestrator.costmodel.group_sim import simulate_groups
from orchestrator.core.plan import Plan, ScheduleKind
from orchestrator.planners.options import PlannerOptions
from orchestrator.core.profile import Profile

INF = float("inf")


@dataclass(frozen=True)
class PipelineCosts:
    """Per-micro-batch cost terms of a straight pipeline (one entry per stage / boundary)."""

    fwd: list[float]  # compute_time of a stage's forward at its slowest replica
    bwd: list[float]
    out_bytes: list[float]  # boundary s -> s+1 bytes per unit (activation forward, gradient backward)
    spb: list[float]  # boundary s -> s+1 seconds per byte (slowest replica pair)
    allreduce: list[float]
    latency: float = 0.0  # per message, also for half units

    @property
    def num_stages(self) -> int:
        return len(self.fwd)

    def message(self, boundary: int, fraction: float) -> float:
        """One unit's message across ``boundary`` (either direction)."""
        return transfer_time(self.out_bytes[boundary] * fraction, self.spb[boundary], self.latency)


def plan_costs(plan: Plan, profile: Profile, cluster: Cluster) -> PipelineCosts:
    speeds = cluster.speeds
    fwd, bwd, nbytes, spb, ar = [], [], [], [], []
    for j, s in enumerate(plan.stages):
        slow = float(min(speeds[list(s.devices)]))
        fwd.append(compute_time(profile.forward_time(s.first, s.last), slow, s.replicas))
        bwd.append(compute_time(profile.backward_time(s.first, s.last), slow, s.replicas))
        ar.append(group_all_reduce(cluster, s.devices, profile.param_bytes(s.first, s.last)) if j < plan.num_physical_stages else 0.0)
        if j + 1 < len(plan.stages):
            nbytes.append(profile.boundary_bytes(s.last))
            spb.append(seconds_per_byte(cluster, s.devices, plan.stages[j + 1].devices))
    return PipelineCosts(fwd, bwd, nbytes, spb, ar, cluster.latency_s)


def unit_fractions(num_microbatches: int, sliced: int = 0) -> list[float]:
    """Each unit's share of a micro-batch, in :func:`orchestrator.schedule.ir.units_of`'s order."""
    return [0.5] * (2 * sliced) + [1.0] * (num_microbatches - sliced)


def plan_fits_memory(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions, schedule: ScheduleKind | None = None) -> bool:
    """Static check of a straight plan: static state + the schedule's in-flight stash per replica."""
    if not options.check_memory:
        return True
    schedule = schedule or plan.schedule
    S = len(plan.stages)
    mem = cluster.memories
    for j, s in enumerate(plan.stages):
        k = in_flight(schedule, j, S, plan.num_microbatches)
        need = stage_memory(profile.param_bytes(s.first, s.last), profile.stash_bytes(s.first, s.last), k, s.replicas, options.state_factor)
        if not fits_memory(need, float(min(mem[list(s.devices)]))):
            return False
    return True


def fewest_devices(profile: Profile, cluster: Cluster, options: PlannerOptions, kind: ScheduleKind, replicas: Sequence[int] | None = None) -> float:
    """A lower bound on the devices any straight ``kind`` plan (no recomputation, replicas splitting a
    stage's stash) needs to pass :func:`plan_fits_memory`, or inf when none can: a stage [a, b) holding
    ``u`` units needs ``r >= u · stash / (memory − static)`` replicas of the largest device, and under
    1F1B a stage with ``k`` stages from it to the end holds ``min(k, M)`` (GPipe: M), so
    ``g_k(a) = min_b r(a, b, k) + g_{k−1}(b)`` over the stages' ends; ``replicas`` (ascending) restricts
    ``r`` to the counts a planner tries. Other schedules get 0 (no bound).
    A few [L, L] array passes per depth: what DAPPLE checks before widening its beam (issue 42)."""
    if kind not in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE) or not options.check_memory:
        return 0.0
    L, M = profile.num_blocks, options.num_microbatches
    pp, st = profile.prefix("param_bytes"), profile.prefix("stash_bytes")
    a, b = np.arange(L + 1)[:, None], np.arange(L + 1)[None, :]
    ok = b > a
    spare = float(cluster.memories.max()) - stage_memory(pp[b] - pp[a], 0.0, 0.0, 1.0, options.state_factor)
    stash = np.where(ok, st[b] - st[a], 0.0)
    feasible = ok & (spare >= 0) & ((spare > 0) | (stash <= 0))
    with np.errstate(divide="ignore", invalid="ignore"):
        per_unit = np.where(feasible, np.where(stash > 0, stash / np.where(spare > 0, spare, 1.0), 0.0), np.inf)
    g = np.full(L + 1, np.inf)
    g[L] = 0.0
    best = np.inf
    for k in range(1, min(L, cluster.size) + 1):
        u = M if kind is ScheduleKind.GPIPE else min(k, M)
        need = np.maximum(1.0, np.ceil(u * per_unit * (1 - 1e-9)))  # rounded down a hair: a bound, never above
        if replicas is not None:  # the least count tried that is enough
            counts = np.append(np.asarray(replicas, dtype=np.float64), np.inf)
            need = counts[np.minimum(np.searchsorted(counts, np.minimum(need, 1e18)), len(counts) - 1)]
        g = np.min(need + g[None, :], axis=1)
        g[L] = np.inf  # a stage is never empty
        best = min(best, float(g[0]))
    return best


def estimate(plan: Plan, profile: Profile, cluster: Cluster, schedule: ScheduleKind | None = None) -> float:
    """SPP's PE makespan of a straight plan under the 1F1B or GPipe queue (halved warm-up units
    included): the simulator's group-level mode on the generator's order."""
    kind = schedule or plan.schedule
    if kind is not plan.schedule:
        plan = replace(plan, schedule=kind)
    return simulate_groups(plan, profile, cluster).iteration_s


def pe_lower_bound(costs: PipelineCosts, fractions: Sequence[float]) -> float:
    """A lower bound on :func:`estimate` under either queue (both start every stage
    with unit 0's forward and end it with the last unit's backward): stage s waits for unit 0 to go
    forward through stages < s, then runs all its units, then either all-reduces or hands the
    last unit's gradient back through stages < s (stage 0 then all-reduces)."""
    S = costs.num_stages
    f0, fl = fractions[0], fractions[-1]
    total = sum(fractions)
    best = 0.0
    head = 0.0
    tail = costs.allreduce[0]
    for s in range(S):
        if s > 0:
            head += costs.fwd[s - 1] * f0 + costs.message(s - 1, f0)
            tail += costs.message(s - 1, fl) + costs.bwd[s - 1] * fl
        best = max(best, head + (costs.fwd[s] + costs.bwd[s]) * total + max(costs.allreduce[s], tail))
    return best * (1 - 1e-9)


def compute_costs(plan: Plan, profile: Profile, cluster: Cluster) -> tuple[float, PipelineCosts]:
    """``(max_s M·(F_s + B_s) + AR_s, costs without transfers)`` with exactly :func:`plan_costs`'
    terms: PE's makespan is at least the first and :func:`pe_lower_bound` of the second for
    either queue (transfers only delay)."""
    speeds = cluster.speeds
    M = plan.num_microbatches
    bound = -INF
    fwd, bwd, ar = [], [], []
    for j, s in enumerate(plan.stages):
        slow = float(min(speeds[list(s.devices)]))
        f = compute_time(profile.forward_time(s.first, s.last), slow, s.replicas)
        b = compute_time(profile.backward_time(s.first, s.last), slow, s.replicas)
        x = group_all_reduce(cluster, s.devices, profile.param_bytes(s.first, s.last)) if j < plan.num_physical_stages else 0.0
        bound = max(bound, M * (f + b) + x)
        fwd.append(f)
        bwd.append(b)
        ar.append(x)
    zeros = [0.0] * (len(fwd) - 1)
    return float(bound), PipelineCosts(fwd, bwd, zeros, zeros, ar, cluster.latency_s)

