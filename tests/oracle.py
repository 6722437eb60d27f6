"""Exhaustive plan search: the test oracle for ``auto`` (test machinery, not part of the product).

Every plan of the space a planner may choose from is built and timed by the project's own
simulator, with no bound, heuristic or symmetry argument that could hide a mistake in ``auto``:

* every contiguous partition into 1..``max_stages`` stages;
* every placement: each stage gets a non-empty set of devices (several = data-parallel replicas),
  sets disjoint, in every order, devices may stay idle;
* GPipe, 1F1B and ZB-H1, each with every count of sliced warm-up micro-batches (AutoPipe's slicing);
* interleaved 1F1B: ``p`` device groups with ``v >= 2`` chunks each (``p·v <= max_stages``), every
  partition into ``p·v`` stages, with every slicing count ``s`` that makes the unit count ``M + s``
  a multiple of ``p``.

A plan that exceeds a device's memory (the simulator's accounting) is not a candidate. The
space grows fast: about 55 000 plans at 12 blocks × 4 devices (M = 2, ~20 s), 10^6 at 16 × 4 with
M = 8 (~20 min); tests keep to <= 12 blocks, the benchmark goes further.

:func:`optimum_by_classes` reaches 10 blocks × 8 devices (up to 8 stages: 10^8 structures listed
naively) with two arguments that are each checked rather than trusted:

* *symmetry*: one structure per pattern of device-class counts (``exhaustive.structures``; devices
  of a class are interchangeable in every cost). Tests check it equals :func:`optimum` on small
  symmetric clusters, and the walk equals the naive listing when every class is one device;
* *busiest device*: no plan is faster than the compute its busiest device group must do (each
  unit's forward and backward, at the group's slowest device, rows split over its replicas).
  Structures are timed in order of that bound, which is computed here from the profile alone,
  not by ``auto``'s bound code, and asserted against every plan simulated; the walk stops when the
  next structure's bound reaches the best time found.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.core.profile import Profile
from orchestrator.costmodel.simulator import SimOptions, memory_error, simulate


def placements(num_devices: int, k: int, straight: bool = False) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Ordered ``k``-tuples of disjoint non-empty device sets (devices not listed stay idle)."""
    for owner in itertools.product(range(k + 1), repeat=num_devices):  # 0 = idle, s = stage s-1
        groups = tuple(tuple(d for d in range(num_devices) if owner[d] == s + 1) for s in range(k))
        if all(groups) and (not straight or all(len(g) == 1 for g in groups)):
            yield groups


def partitions(num_blocks: int, k: int) -> Iterator[tuple[int, ...]]:
    for inner in itertools.combinations(range(1, num_blocks), k - 1):
        yield (0, *inner, num_blocks)


def plan_space(profile: Profile, cluster: Cluster, M: int, max_stages: int = 4, straight: bool = False) -> Iterator[Plan]:
    L, n = profile.num_blocks, cluster.size
    for k in range(1, min(max_stages, L, n) + 1):
        for groups in placements(n, k, straight):
            for cuts in partitions(L, k):
                stages = tuple(Stage(cuts[i], cuts[i + 1], groups[i]) for i in range(k))
                for kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1):
                    for sliced in range(M + 1):
                        yield Plan(stages, M, kind, sliced)
    for p in range(2, min(max_stages, n) + 1):
        for v in range(2, max_stages // p + 1):
            if p * v > L:
                continue
            for groups in placements(n, p, straight):
                for cuts in partitions(L, p * v):
                    stages = tuple(Stage(cuts[i], cuts[i + 1], groups[i % p]) for i in range(p * v))
                    for sliced in range(M + 1):
                        if (M + sliced) % p == 0:  # Megatron's rule: units a multiple of the depth
                            yield Plan(stages, M, ScheduleKind.INTERLEAVED, sliced)


def optimum(profile: Profile, cluster: Cluster, M: int, state_factor: float, max_stages: int = 4, straight: bool = False) -> tuple[float, Plan | None, int]:
    """(least simulated iteration time of a plan that fits memory, that plan, plans simulated)."""
    opts = SimOptions(state_factor=state_factor)
    best: tuple[float, Plan | None] = (float("inf"), None)
    count = 0
    for plan in plan_space(profile, cluster, M, max_stages, straight):
        res = simulate(plan, profile, cluster, opts)
        count += 1
        if memory_error(res, cluster) is None and res.iteration_s < best[0]:
            best = (res.iteration_s, plan)
    return best[0], best[1], count


def busiest_group(stages: tuple[Stage, ...], profile: Profile, cluster: Cluster, M: int) -> float:
    """Seconds of compute the busiest device group's slowest device does per iteration (each replica
    computes an equal share of the rows at its own speed)."""
    speeds = cluster.speeds
    per: dict[tuple[int, ...], float] = {}
    for s in stages:
        per[s.devices] = per.get(s.devices, 0.0) + M * profile.compute_time(s.first, s.last) / (len(s.devices) * float(speeds[list(s.devices)].min()))
    return max(per.values())


def headed_busiest_group(stages: tuple[Stage, ...], profile: Profile, cluster: Cluster, M: int) -> float:
    """:func:`busiest_group` with each group's work starting when the first (half) unit reaches its first
    stage (:class:`~orchestrator.costmodel.group_sim.FirstUnitPath`): the bound the walk's ``head`` applies,
    computed here independently, stage by stage, from the whole structure."""
    from orchestrator.costmodel.group_sim import FirstUnitPath

    path = FirstUnitPath(profile, cluster)
    speeds = cluster.speeds
    start: dict[tuple[int, ...], float] = {}
    work: dict[tuple[int, ...], float] = {}
    at = 0.0
    for j, s in enumerate(stages):
        if j:
            at += path.message(s.first, stages[j - 1].devices, s.devices)
        start.setdefault(s.devices, at)
        work[s.devices] = work.get(s.devices, 0.0) + M * profile.compute_time(s.first, s.last) / (len(s.devices) * float(speeds[list(s.devices)].min()))
        at += path.forward(s.first, s.last, s.devices)
    return max(start[g] + work[g] for g in work)


def optimum_by_classes(profile: Profile, cluster: Cluster, M: int, state_factor: float, max_stages: int | None = None) -> tuple[float, Plan | None, int]:
    """:func:`optimum` over up to ``max_stages`` (default: every device) stages, one structure per
    device-class pattern, structures in order of :func:`busiest_group` (see the module docstring)."""
    from orchestrator.planners.exhaustive import device_classes, structures

    n = cluster.size
    max_stages = max_stages or n
    opts = SimOptions(state_factor=state_factor)
    listed = sorted(((busiest_group(st, profile, cluster, M), i, st) for i, st in
                     enumerate(structures(profile.num_blocks, device_classes(cluster), max_stages, False, True))), key=lambda t: (t[0], t[1]))
    best: tuple[float, Plan | None] = (float("inf"), None)
    count = 0
    for bound, _, stages in listed:
        if bound >= best[0]:
            break
        p = len({s.devices for s in stages})
        if p == len(stages):
            plans = [Plan(stages, M, kind, sliced) for kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1) for sliced in range(M + 1)]
        else:
            plans = [Plan(stages, M, ScheduleKind.INTERLEAVED, sliced) for sliced in range(M + 1) if (M + sliced) % p == 0]
        for plan in plans:
            res = simulate(plan, profile, cluster, opts)
            count += 1
            assert res.iteration_s >= bound * (1 - 1e-9), f"{plan.describe()}: {res.iteration_s} s under its busiest group's compute {bound} s"
            if memory_error(res, cluster) is None and res.iteration_s < best[0]:
                best = (res.iteration_s, plan)
    return best[0], best[1], count


def optimum_below(profile: Profile, cluster: Cluster, M: int, state_factor: float, below: float, max_stages: int | None = None) -> tuple[float, Plan | None, int]:
    """The fastest plan of :func:`optimum_by_classes`'s space *under* ``below`` seconds, or (inf, None)
    when there is none: a certificate that nothing beats ``below``, where the full optimum is out of
    reach (10 blocks on 8 devices that all differ: no symmetry folds the 1.1·10^8 structures).

    Partial structures are dropped by the busiest-device bound (:func:`busiest_group`'s terms, from when the
    first unit reaches the group: :class:`FirstUnitPath`) and by the blocks still to place at the free devices'
    summed speed (every group's share of that work
    at its slowest device is at least its share at their summed speed); each remaining plan is then
    dropped by the simulator's own lower bounds (``plan_lower_bound``, then the group mode's lower
    pass) before a full simulation, and every bound is asserted against every plan simulated."""
    from orchestrator.costmodel.group_sim import BoundTerms, FirstUnitPath, simulate_groups
    from orchestrator.planners.exhaustive import device_classes, structures

    n, L = cluster.size, profile.num_blocks
    speeds = cluster.speeds
    opts = SimOptions(state_factor=state_factor)

    def cost(a: int, b: int, devs: tuple[int, ...]) -> float:
        return M * profile.compute_time(a, b) / (len(devs) * float(speeds[list(devs)].min()))

    def rest(b: int, free: tuple[int, ...]) -> float:
        return M * profile.compute_time(b, L) / float(speeds[list(free)].sum())

    best: tuple[float, Plan | None] = (below, None)
    count = 0
    for stages in structures(L, device_classes(cluster), max_stages or n, False, True, cost, below, None, rest, FirstUnitPath(profile, cluster)):
        p = len({s.devices for s in stages})
        if p == len(stages):
            plans = [Plan(stages, M, kind, sliced) for kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1) for sliced in range(M + 1)]
        else:
            plans = [Plan(stages, M, ScheduleKind.INTERLEAVED, sliced) for sliced in range(M + 1) if (M + sliced) % p == 0]
        terms = BoundTerms(stages, profile, cluster)
        for plan in plans:
            lo = terms.bound(M, 0.5 if plan.sliced_microbatches else 1.0, M + plan.sliced_microbatches, plan.schedule is ScheduleKind.ZB_H1)
            if lo >= best[0]:
                continue
            group_lo = simulate_groups(plan, profile, cluster, opts, lower=True, memory=False).iteration_s
            if group_lo * (1 - 1e-9) >= best[0]:
                continue
            res = simulate(plan, profile, cluster, opts)
            count += 1
            assert res.iteration_s >= max(lo, group_lo * (1 - 1e-9), headed_busiest_group(stages, profile, cluster, M)) * (1 - 1e-9), plan.describe()
            if memory_error(res, cluster) is None and res.iteration_s < best[0]:
                best = (res.iteration_s, plan)
    return (best[0], best[1], count) if best[1] is not None else (float("inf"), None, count)
