"""Discrete-event interpreter of the schedule IR over the cost model.

Cost model (the terms of :mod:`orchestrator.costmodel.terms`, the same ones the planners optimize):
- compute: profile time / (device speed × stage replicas) × unit fraction; a split backward's ``BI``
  and ``W`` take the profile's input- and weight-gradient parts (:func:`backward_parts`);
- point-to-point: message latency + bytes / effective link bandwidth, one transfer at a time per link direction,
  in the sender's program order (sends are asynchronous; receives block);
- ring all-reduce: 2(k−1)/k · stage parameter bytes / slowest link of the ring, a barrier for
  the replicas;
- optimizer step: ``step_s_per_param_byte`` × stage parameter bytes (0 by default).

Each device runs its program in order. An action's start is bounded by its device being free and,
for a receive, by the transfer's arrival; the action that set that bound is remembered, so the
critical path is read back from the last event. Because every link is fed by one device in program
order, the result does not depend on the order in which devices are advanced; when none can
advance the schedule is deadlocked and the error shows the grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.core import limits
from orchestrator.core.cluster import Cluster
from orchestrator.costmodel.terms import DEFAULT_STATE_FACTOR, all_reduce_time, compute_time, fits_memory, stash_bytes, static_bytes, transfer_time
from orchestrator.core.plan import Plan
from orchestrator.core.profile import Profile
from orchestrator.schedule.ir import Action, Kind, Schedule, unit_fraction
from orchestrator.schedule.lowering import lower, peers
from orchestrator.schedule.validate import ScheduleError, render_grid


@dataclass(frozen=True, slots=True)
class Event:
    """One timed interval: an action on a device, or a transfer on a link (``device`` = sender)."""

    device: int
    label: str
    kind: str
    start: float
    end: float
    cause: int  # index of the event that bounded this one's start, -1 for none
    link: tuple[int, int] | None = None


@dataclass(frozen=True)
class SimOptions:
    state_factor: float = DEFAULT_STATE_FACTOR
    step_s_per_param_byte: float = 0.0
    # Extra per-stage compute multipliers (observed slowdowns) keyed by device id.
    slowdown: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SimResult:
    iteration_s: float
    busy_s: dict[int, float]
    peak_stash_bytes: dict[int, float]
    static_bytes: dict[int, float]
    events: tuple[Event, ...]
    critical_path: tuple[int, ...]  # event indices, first to last

    @property
    def bubble_fraction(self) -> dict[int, float]:
        return {d: 1.0 - b / self.iteration_s if self.iteration_s > 0 else 0.0 for d, b in self.busy_s.items()}

    @property
    def peak_memory_bytes(self) -> dict[int, float]:
        return {d: self.static_bytes[d] + self.peak_stash_bytes[d] for d in self.busy_s}

    def critical_path_labels(self) -> list[str]:
        return [f"{self.events[i].label}@{self.events[i].device}" for i in self.critical_path]

    def summary(self) -> dict[str, Any]:
        bubbles = self.bubble_fraction
        return {
            "iteration_s": self.iteration_s,
            "mean_bubble_fraction": float(np.mean(list(bubbles.values()))) if bubbles else 0.0,
            "max_peak_memory_bytes": max(self.peak_memory_bytes.values()) if self.busy_s else 0.0,
            "critical_path_length": len(self.critical_path),
        }


def backward_parts(profile: Profile, stage: int, first: int, last: int, recompute: bool = False) -> tuple[float, float]:
    """Seconds of ``(BI, W)``, the two halves of stage ``stage``'s split backward over blocks ``[first, last)``.

    The first stage has no input gradient to compute: its ``BI`` is empty and its ``W`` is the
    whole backward, which is also what the executor runs (as torch.distributed.pipelining does).
    A recomputing stage pays its forward again before the first half (the costs stay consistent
    even though the runtime refuses recomputation under a split backward)."""
    total = profile.backward_time(first, last)
    again = profile.forward_time(first, last) if recompute else 0.0
    if stage == 0:
        return 0.0, total + again
    weight = min(profile.weight_time(first, last), total)
    return total - weight + again, weight


def stash_sign(kind: Kind) -> int:
    """+1 where an action starts holding a unit's activations, -1 where it frees them, else 0
    (a split backward frees them at ``W``, which still reads them)."""
    if kind is Kind.FORWARD:
        return 1
    return -1 if kind.grads_weights else 0


class _Costs:
    """Per-plan cost lookups, computed once per simulation."""

    def __init__(self, plan: Plan, profile: Profile, cluster: Cluster, options: SimOptions) -> None:
        self.plan, self.profile, self.cluster = plan, profile, cluster
        self.fwd = [profile.forward_time(s.first, s.last) for s in plan.stages]
        self.bwd = [profile.stage_backward_time(s.first, s.last, s.recompute) for s in plan.stages]
        self.split = [backward_parts(profile, j, s.first, s.last, s.recompute) for j, s in enumerate(plan.stages)]
        self.params = [profile.param_bytes(s.first, s.last) for s in plan.stages]
        self.stash = [profile.stage_stash_bytes(s.first, s.last, s.recompute) for s in plan.stages]
        self.out_bytes = [profile.boundary_bytes(s.last) for s in plan.stages]
        self.in_bytes = [profile.boundary_bytes(s.first) for s in plan.stages]
        self.options = options
        # memo of the terms by what they depend on (a schedule repeats them for every unit)
        self._compute: dict[tuple[Kind, int, int], float] = {}
        self._message: dict[tuple[Kind, int, int, int, int], float] = {}
        self._stash: dict[tuple[int, int], float] = {}

    def compute(self, a: Action, device: int) -> float:
        key = (a.kind, a.stage, device)
        dur = self._compute.get(key)
        if dur is None:
            kind = a.kind
            if kind is Kind.FORWARD:
                base = self.fwd[a.stage]
            elif kind is Kind.BACKWARD:
                base = self.bwd[a.stage]
            else:
                base = self.split[a.stage][0 if kind is Kind.BACKWARD_INPUT else 1]
            speed = self.cluster.devices[device].speed / self.options.slowdown.get(device, 1.0)
            dur = self._compute[key] = compute_time(base, speed, self.plan.stages[a.stage].replicas)
        return dur * unit_fraction(a.part)

    def message(self, a: Action, src: int) -> float:
        """Seconds of a send from ``src`` on its link (latency + bytes at the link's rate)."""
        key = (a.kind, a.stage, a.part, src, a.peer)
        dur = self._message.get(key)
        if dur is None:
            dur = self._message[key] = transfer_time(self.transfer_bytes(a, src), 1.0 / self.cluster.link(src, a.peer), self.cluster.latency_s)
        return dur

    def stash_delta(self, a: Action) -> float:
        """Activation bytes one replica of ``a.stage`` holds for ``a``'s unit."""
        key = (a.stage, a.part)
        got = self._stash.get(key)
        if got is None:
            got = self._stash[key] = stash_bytes(self.stash[a.stage], unit_fraction(a.part), self.plan.stages[a.stage].replicas)
        return got

    def transfer_bytes(self, a: Action, src: int) -> float:
        """Bytes of a send from ``src`` (whose replica index in ``a.stage`` defines the row share)."""
        stage = self.plan.stages[a.stage]
        replica = stage.devices.index(src)
        other = a.stage + 1 if a.kind is Kind.SEND_F else a.stage - 1
        share = dict(peers(self.plan, a.stage, replica, other)).get(a.peer, 0.0)
        size = self.out_bytes[a.stage] if a.kind is Kind.SEND_F else self.in_bytes[a.stage]
        return size * share * unit_fraction(a.part)

    def all_reduce(self, stage_index: int) -> float:
        group = self.plan.stages[stage_index].devices
        if len(group) < 2:
            return 0.0
        return all_reduce_time(len(group), self.params[stage_index], self.cluster.ring_bandwidth(group))


def simulate(
    plan: Plan,
    profile: Profile,
    cluster: Cluster,
    options: SimOptions | None = None,
    schedule: Schedule | None = None,
) -> SimResult:
    """Time one iteration of ``plan``; raises :class:`ScheduleError` on deadlock."""
    plan.check_against(profile.num_blocks, cluster.size)
    limits.sim_events(len(plan.stages), plan.num_microbatches + plan.sliced_microbatches)  # before lowering allocates
    options = options or SimOptions()
    schedule = schedule or lower(plan, check=False)
    costs = _Costs(plan, profile, cluster, options)
    programs = schedule.programs
    devices = sorted(programs)
    pc = {d: 0 for d in devices}
    clock = {d: 0.0 for d in devices}
    last_event = {d: -1 for d in devices}
    busy = {d: 0.0 for d in devices}
    stash = {d: 0.0 for d in devices}
    peak = {d: 0.0 for d in devices}
    link_free: dict[tuple[int, int], tuple[float, int]] = {}
    arrivals: dict[tuple[str, int, int, int, int, int], int] = {}  # transfer key -> event index
    barrier: dict[int, dict[int, tuple[float, int]]] = {}  # stage -> device -> (arrival time, event)
    events: list[Event] = []

    def emit(ev: Event) -> int:
        events.append(ev)
        return len(events) - 1

    remaining = sum(len(p) for p in programs.values())
    while remaining:
        progressed = False
        for d in devices:
            prog = programs[d]
            while pc[d] < len(prog):
                a = prog[pc[d]]
                t = clock[d]
                if a.kind.is_compute:
                    dur = costs.compute(a, d)
                    idx = emit(Event(d, str(a), a.kind.value, t, t + dur, last_event[d]))
                    busy[d] += dur
                    delta = costs.stash_delta(a)
                    stash[d] += stash_sign(a.kind) * delta
                    peak[d] = max(peak[d], stash[d])
                    clock[d], last_event[d] = t + dur, idx
                elif a.kind in (Kind.SEND_F, Kind.SEND_B):
                    link = (d, a.peer)
                    free_at, prev = link_free.get(link, (0.0, -1))
                    start = max(t, free_at)
                    cause = last_event[d] if t >= free_at else prev
                    dur = costs.message(a, d)
                    idx = emit(Event(d, str(a), "transfer", start, start + dur, cause, link))
                    link_free[link] = (start + dur, idx)
                    tag = "F" if a.kind is Kind.SEND_F else "B"
                    arrivals[(tag, a.stage, a.microbatch, a.part, d, a.peer)] = idx
                elif a.kind in (Kind.RECV_F, Kind.RECV_B):
                    tag = "F" if a.kind is Kind.RECV_F else "B"
                    src_stage = a.stage - 1 if tag == "F" else a.stage + 1
                    key = (tag, src_stage, a.microbatch, a.part, a.peer, d)
                    if key not in arrivals:
                        break  # the matching send has not been issued yet
                    tr_idx = arrivals.pop(key)
                    if events[tr_idx].end > t:
                        clock[d], last_event[d] = events[tr_idx].end, tr_idx
                elif a.kind is Kind.ALL_REDUCE:
                    group = plan.stages[a.stage].devices
                    waiting = barrier.setdefault(a.stage, {})
                    waiting.setdefault(d, (t, last_event[d]))
                    if len(waiting) < len(group):
                        break
                    start, cause = max(waiting.values())
                    dur = costs.all_reduce(a.stage)
                    for member in group:
                        idx = emit(Event(member, str(a), "all_reduce", start, start + dur, cause))
                        busy[member] += dur
                        clock[member], last_event[member] = start + dur, idx
                        if member != d:
                            pc[member] += 1
                            remaining -= 1
                    del barrier[a.stage]
                elif a.kind is Kind.STEP:
                    dur = options.step_s_per_param_byte * costs.params[a.stage]
                    idx = emit(Event(d, str(a), "step", t, t + dur, last_event[d]))
                    busy[d] += dur
                    clock[d], last_event[d] = t + dur, idx
                pc[d] += 1
                remaining -= 1
                progressed = True
        if not progressed and remaining:
            stuck = next(d for d in devices if pc[d] < len(programs[d]))
            raise ScheduleError(
                f"deadlock: no device can advance (device {stuck} waits at {programs[stuck][pc[stuck]]})\n"
                + render_grid(schedule, (stuck, pc[stuck]))
            )

    iteration = max(clock.values()) if clock else 0.0
    static = {d: static_bytes(sum(costs.params[j] for j in plan.stages_of_device(d)), options.state_factor) for d in devices}
    path = _critical_path(events)
    return SimResult(iteration, busy, peak, static, tuple(events), path)


def _critical_path(events: list[Event]) -> tuple[int, ...]:
    if not events:
        return ()
    i = max(range(len(events)), key=lambda k: events[k].end)
    path = []
    seen = set()
    while i >= 0 and i not in seen:
        seen.add(i)
        path.append(i)
        i = events[i].cause
    return tuple(reversed(path))


def lower_bound(profile: Profile, cluster: Cluster, num_microbatches: int) -> float:
    """A true lower bound on any plan's iteration time: all work spread perfectly over all devices."""
    return num_microbatches * profile.total_compute_s / float(np.sum(cluster.speeds))


def memory_error(result: SimResult, cluster: Cluster) -> str | None:
    for d, mem in result.peak_memory_bytes.items():
        cap = cluster.devices[d].memory_bytes
        if not fits_memory(mem, cap):
            return f"device {d} needs {mem / 2**30:.2f} GiB but has {cap / 2**30:.2f} GiB"
    return None

