"""Fast scoring of straight pipelines: SPP's PE list scheduler and the static memory check.

``list_schedule`` is SPP's PE (Luo et al., INFOCOM'22, step 3): every stage runs its order queue
``U_s`` as soon as a unit is ready and first in its queue, transfers queue on their link in send
order, each stage all-reduces after its last backward. The queues are the schedule generators'
own orders (:mod:`orchestrator.schedule.generators`, cached per shape), and every duration is a
term of :mod:`orchestrator.cost_terms` at the simulator's values (a stage at its slowest replica,
a boundary at its slowest replica pair), so on a straight plan its makespan is the group-level
simulation's (:func:`orchestrator.group_sim.simulate_groups`; tested on random instances) at a
fraction of its cost: the planners score thousands of candidates with it. It also records, per
operation, what bounded its start, which AutoPipe's critical-path heuristic walks back.

``plan_fits_memory`` is the static memory check every straight-pipeline planner uses (static
state plus the schedule's in-flight stash per replica, :func:`cost_terms.stage_memory`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from orchestrator.cluster import Cluster
from orchestrator.cost_terms import compute_time, fits_memory, in_flight, stage_memory, transfer_time
from orchestrator.group_sim import group_all_reduce, seconds_per_byte
from orchestrator.plan import Plan, ScheduleKind, Stage
from orchestrator.planners.options import PlannerOptions
from orchestrator.profile import Profile
from orchestrator.schedule.generators import GENERATORS
from orchestrator.schedule.ir import Kind

INF = float("inf")
Queue = tuple[tuple[bool, int], ...]  # (is forward, unit index) in run order


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


@lru_cache(maxsize=512)
def queues(kind: ScheduleKind, num_stages: int, num_units: int) -> tuple[Queue, ...]:
    """``U_s`` of every stage: the generator's compute order of ``kind`` (GPipe or 1F1B) for
    ``num_stages`` stages and ``num_units`` units, as (is forward, unit index) pairs."""
    if kind not in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B):
        raise ValueError(f"the list scheduler runs unsplit straight schedules, not {kind.value}")
    shape = Plan(tuple(Stage(j, j + 1, (j,)) for j in range(num_stages)), num_units, kind)
    orders = GENERATORS[kind](shape, [(u, 0) for u in range(num_units)])
    return tuple(tuple((a.kind is Kind.FORWARD, a.microbatch) for a in order) for order in orders)


@dataclass
class PEResult:
    makespan: float
    stage_end: list[float]  # last backward end per stage (before the all-reduce)
    # (stage, is_forward, unit) -> (start, end, cause) where cause is "dev" or "dep"; only with trace
    trace: dict[tuple[int, bool, int], tuple[float, float, str]] | None = None


def list_schedule(
    costs: PipelineCosts,
    fractions: Sequence[float],
    orders: Sequence[Sequence[tuple[bool, int]]],
    trace: bool = False,
) -> PEResult:
    """SPP's PE: run every queue ``U_s`` as-soon-as-possible; transfers FIFO per link direction."""
    S = costs.num_stages
    U = len(fractions)
    fwd, bwd = costs.fwd, costs.bwd
    msg = {fr: [costs.message(s, fr) for s in range(S - 1)] for fr in set(fractions)}
    arr_f: list[list[float]] = [[-1.0] * U for _ in range(S)]
    arr_b: list[list[float]] = [[-1.0] * U for _ in range(S)]
    link_f = [0.0] * S
    link_b = [0.0] * S
    pc = [0] * S
    clock = [0.0] * S
    rec: dict[tuple[int, bool, int], tuple[float, float, str]] | None = {} if trace else None
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(S):
            order = orders[s]
            p = pc[s]
            t = clock[s]
            n = len(order)
            while p < n:
                is_f, u = order[p]
                frac = fractions[u]
                cause = "dev"
                if is_f:
                    if s > 0:
                        a = arr_f[s][u]
                        if a < 0:
                            break
                        if a > t:
                            t, cause = a, "dep"
                    start = t
                    t += fwd[s] * frac
                    if s + 1 < S:
                        st = t if t > link_f[s] else link_f[s]
                        link_f[s] = st + msg[frac][s]
                        arr_f[s + 1][u] = link_f[s]
                else:
                    if s + 1 < S:
                        a = arr_b[s][u]
                        if a < 0:
                            break
                        if a > t:
                            t, cause = a, "dep"
                    start = t
                    t += bwd[s] * frac
                    if s > 0:
                        st = t if t > link_b[s - 1] else link_b[s - 1]
                        link_b[s - 1] = st + msg[frac][s - 1]
                        arr_b[s - 1][u] = link_b[s - 1]
                if rec is not None:
                    rec[(s, is_f, u)] = (start, t, cause)
                p += 1
            if p != pc[s]:
                remaining -= p - pc[s]
                pc[s], clock[s] = p, t
                progressed = True
        if not progressed:
            raise RuntimeError("PE deadlock: the order queues are inconsistent")
    ends = [clock[s] + costs.allreduce[s] for s in range(S)]
    return PEResult(max(ends), list(clock), rec)


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


def estimate(plan: Plan, profile: Profile, cluster: Cluster, schedule: ScheduleKind | None = None, trace: bool = False) -> PEResult:
    """PE makespan of a straight plan under the 1F1B or GPipe queue (halved warm-up units included)."""
    schedule = schedule or plan.schedule
    costs = plan_costs(plan, profile, cluster)
    fr = unit_fractions(plan.num_microbatches, plan.sliced_microbatches)
    kind = ScheduleKind.GPIPE if schedule is ScheduleKind.GPIPE else ScheduleKind.ONE_F_ONE_B
    return list_schedule(costs, fr, queues(kind, costs.num_stages, len(fr)), trace)


def pe_lower_bound(costs: PipelineCosts, fractions: Sequence[float]) -> float:
    """A lower bound on :func:`list_schedule`'s makespan under either queue (both start every stage
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

