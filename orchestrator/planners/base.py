"""The registry that names every planner, and the one place that runs and scores them.

A planner is a pure function ``(profile, cluster, options) -> Plan``: no Ray, no I/O, no hidden
state. :func:`run_planner` is the single place that times it, scores the plan with the simulator,
checks device memory and attaches the planner's own objective, so every planner is compared on
the same footing (the simulator), whatever it optimizes internally.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.core.cluster import Cluster
from orchestrator.core.coarsen import coarse_groups
from orchestrator.core.errors import UserError
from orchestrator.costmodel.group_sim import simulate_groups
from orchestrator.costmodel.terms import fits_memory, stage_memory
from orchestrator.core.plan import Plan, ScheduleKind
from orchestrator.planners import auto, catalog
from orchestrator.planners.interleaving import best_interleaving
from orchestrator.planners.options import PlannerOptions, PlannerSpec, find
from orchestrator.core.profile import Profile
from orchestrator.costmodel.simulator import SimResult, lower_bound, memory_error, simulate

__all__ = ["REGISTRY", "MemoryFitError", "PlanResult", "PlannerOptions", "PlannerSpec", "available", "evaluate", "get_planner", "run_planner"]


@dataclass(frozen=True)
class PlanResult:
    """A plan with everything a user compares planners by."""

    algorithm: str
    plan: Plan
    sim: SimResult
    lower_bound_s: float
    planning_time_s: float
    objective_s: float | None = None

    @property
    def iteration_time_s(self) -> float:
        return self.sim.iteration_s

    def to_json(self) -> dict[str, Any]:
        out = self.plan.to_dict()
        out.update(
            {
                "algorithm": self.plan.algorithm or self.algorithm,
                "iteration_time_s": self.sim.iteration_s,
                "bottleneck_s": self.objective_s,
                "lower_bound_s": self.lower_bound_s,
                "ratio_to_lower_bound": self.sim.iteration_s / self.lower_bound_s if self.lower_bound_s > 0 else None,
                "planning_time_s": self.planning_time_s,
                "peak_memory_bytes": {str(d): m for d, m in self.sim.peak_memory_bytes.items()},
                # one number (the mean over devices, what users compare) and the per-device values
                "bubble_fraction": self.sim.summary()["mean_bubble_fraction"],
                "bubble_fraction_per_device": {str(d): b for d, b in self.sim.bubble_fraction.items()},
            }
        )
        return out


REGISTRY: dict[str, PlannerSpec] = {**catalog.BASELINES, auto.SPEC.name: auto.SPEC}
"""Every planner by name: the ones ``auto`` combines, and ``auto``."""


def get_planner(name: str) -> PlannerSpec:
    return find(REGISTRY, name)


def available() -> list[str]:
    return sorted(REGISTRY)


GROUP_EVAL_DEVICES = 64
"""Plans on more devices are scored by the simulator's group-level mode when it is exact for them."""


def evaluate(plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions) -> SimResult:
    """Simulate ``plan``; a plan that exceeds device memory is a user-facing error.

    A plan on more than ``GROUP_EVAL_DEVICES`` devices whose groups' replicas are alike is timed
    by the group-level mode (same result, no per-device events): the full simulation of a
    1024-GPU plan costs a minute and gigabytes, the group mode milliseconds."""
    result: SimResult | None = None
    if len(plan.devices) > GROUP_EVAL_DEVICES:
        grouped = simulate_groups(plan, profile, cluster, options.sim_options)
        if grouped.exact:
            result = grouped.as_sim_result(plan)
    if result is None:
        result = simulate(plan, profile, cluster, options.sim_options)
    if options.check_memory:
        problem = memory_error(result, cluster)
        if problem:
            raise MemoryFitError(f"plan does not fit in device memory: {problem}", result)
    return result


def _check_blocks_fit(profile: Profile, cluster: Cluster, options: PlannerOptions) -> None:
    """A block whose state alone (weights, gradients, optimizer state, and its input for one
    micro-batch when recomputed) exceeds the largest device fits no plan: say which block."""
    biggest = max(d.memory_bytes for d in cluster.devices)
    for i, block in enumerate(profile.blocks):
        need = stage_memory(block.param_bytes, profile.boundary_bytes(i), 1.0, 1.0, options.state_factor)  # recomputing: its input
        if not fits_memory(need, biggest):
            raise UserError(f"plan does not fit in device memory: block {i} ({block.name!r}) alone needs {need / 2**30:.2f} GiB (its parameters x "
                            f"{options.state_factor:g} for gradients and optimizer state, and its input) but the "
                            f"largest device has {biggest / 2**30:.2f} GiB")


class MemoryFitError(UserError):
    """A plan over some device's memory; ``result`` says which devices and by how much."""

    def __init__(self, message: str, result: SimResult) -> None:
        super().__init__(message)
        self.result = result


def recompute_to_fit(plan: Plan, result: SimResult, cluster: Cluster) -> Plan | None:
    """``plan`` with activation recomputation on every stage of a device over its memory (its
    stash shrinks to the stage inputs, its backward pays one more forward), or ``None`` when
    those stages already recompute."""
    if plan.schedule is ScheduleKind.ZB_H1:
        return None  # the split backward cannot recompute (the runtime refuses the pair)
    over = {d for d, mem in result.peak_memory_bytes.items() if mem > cluster.devices[d].memory_bytes}
    stages = tuple(replace(s, recompute=True) if over & set(s.devices) else s for s in plan.stages)
    return None if stages == plan.stages else replace(plan, stages=stages)


def run_planner(name: str, profile: Profile, cluster: Cluster, options: PlannerOptions) -> PlanResult:
    spec = get_planner(name)
    if options.max_stages is not None and options.max_stages > cluster.size:
        raise UserError(f"asked for up to {options.max_stages} stages but the cluster has {cluster.size} devices")
    start = time.perf_counter()
    if profile.num_blocks > spec.max_blocks:
        groups = coarse_groups(profile, spec.max_blocks)
        coarse = profile.coarsened(groups)
        plan = _expanded(_honour_schedule(spec.name, spec.fn(coarse, cluster, options), coarse, cluster, options), groups)
    else:
        plan = _honour_schedule(spec.name, spec.fn(profile, cluster, options), profile, cluster, options)
    elapsed = time.perf_counter() - start
    plan.check_against(profile.num_blocks, cluster.size)
    try:
        sim = evaluate(plan, profile, cluster, options)
    except MemoryFitError as exc:  # every planner may fit memory by recomputing activations
        _check_blocks_fit(profile, cluster, options)
        fitted = recompute_to_fit(plan, exc.result, cluster)
        if fitted is None:
            raise
        plan = fitted
        sim = evaluate(plan, profile, cluster, options)
    plan = replace(plan, algorithm=plan.algorithm or spec.name, predicted_iteration_s=sim.iteration_s)
    objective = plan.objective_s
    if objective is None and spec.objective is not None:
        objective = spec.objective(plan, profile, cluster, options)
    return PlanResult(spec.name, plan, sim, lower_bound(profile, cluster, options.num_microbatches), elapsed, objective)


def _expanded(plan: Plan, groups: tuple[tuple[int, int], ...]) -> Plan:
    """A plan over the coarsened blocks ``groups`` as a plan over the blocks they merge."""
    return replace(plan, stages=tuple(replace(s, first=groups[s.first][0], last=groups[s.last - 1][1]) for s in plan.stages))


def _honour_schedule(name: str, plan: Plan, profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    """The planner's plan under the schedule the user asked for (``--schedule``, ``--interleave``).

    A planner's partition is re-timed under GPipe or 1F1B when it chose the other one; the
    interleaved schedule is reached by re-cutting the plan into virtual chunks, and a plan that
    cannot be interleaved (one stage, or a micro-batch count that is not a multiple of the depth)
    is one line of error naming the planner and the schedule."""
    want = options.schedule
    if want is ScheduleKind.INTERLEAVED:
        if plan.virtual_chunks == 1:
            plan = best_interleaving(replace(plan, schedule=ScheduleKind.ONE_F_ONE_B), profile, cluster, options, min_chunks=2)
        if plan.virtual_chunks == 1:
            p, M = plan.num_physical_stages, plan.num_microbatches
            why = (
                "its plan has one stage" if p < 2
                else f"{M} micro-batches are not a multiple of its depth {p}" if M % p
                else "no re-cut into virtual chunks fits device memory"
            )
            raise UserError(f"{name}: cannot produce the interleaved schedule: {why}")
        return plan
    if want is not None and plan.schedule is not want:
        if plan.virtual_chunks > 1:
            raise UserError(f"{name}: its plan is interleaved and cannot run the {want.value} schedule")
        plan = replace(plan, schedule=want)
    if options.interleave and plan.virtual_chunks == 1:
        if want in (ScheduleKind.GPIPE, ScheduleKind.ZB_H1):  # interleaving is 1F1B's (Megatron's PTD-P)
            raise UserError(f"{name}: cannot interleave the {want.value} schedule (--interleave runs interleaved 1F1B)")
        plan = best_interleaving(plan, profile, cluster, options)
    return plan
