"""Preemption with notice: empty the doomed devices by live two-worker moves, or say why not.

A spot notice names devices that will be gone at a deadline. If the survivors can hold the
doomed devices' blocks (memory from the profile, checked by the controller's cost model) and
the hand-overs finish before the deadline minus a margin (transfer times on the believed
cluster plus the calibrated per-move overhead, and the iteration still in flight), the job
evacuates live: no checkpoint reload, no lost step, exact. Otherwise it falls back to
checkpoint → migration → restore. :func:`plan_evacuation` is the policy: a pure function of
the plan, the notice and the model of the world, returning a decision value the job's loop
carries out (:class:`Evacuate`) or records (:class:`Fallback`, with the reason).

Each step removes one doomed device from the plan and touches two workers (AutoPipe-Hu's rule
for live switches, as the controller's moves): the doomed stage's blocks merge into a pipeline
neighbour, an idle survivor takes them over, or — for a replicated stage — the doomed replica
is dropped (its peers hold the same state). Among the steps that fit in memory the one with
the best estimated iteration time wins; the controller can re-balance afterwards with its own
moves once the membership change is observed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, Union

from orchestrator.core.cluster import Cluster
from orchestrator.costmodel.estimate import CostModel, Layout
from orchestrator.adapt.handle import move_transfers, handover_time
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.core.profile import Profile


@dataclass(frozen=True)
class Notice:
    """Devices that go away at ``deadline`` (seconds on the job's clock); ``source`` says who told."""

    devices: tuple[int, ...]
    deadline: float
    source: str = "injected"


@dataclass(frozen=True)
class Evacuate:
    """Live evacuation: apply ``steps`` in order (one two-worker move each). ``moves[k]`` is the
    (from_device, to_device) pair of step ``k``; ``predicted_s`` the predicted total stall."""

    steps: tuple[Plan, ...]
    moves: tuple[tuple[int, int], ...]
    predicted_s: float
    reason: str


@dataclass(frozen=True)
class Fallback:
    """No live evacuation: checkpoint → migration → restore. ``reason`` goes to the event log."""

    reason: str


EvacuationDecision = Union[Evacuate, Fallback]


def check_notice(notice: Notice, known: Iterable[int], now: float) -> None:
    """A notice for a device the job never had, or whose deadline has passed, is bad input."""
    unknown = sorted(set(notice.devices) - set(known))
    if not notice.devices:
        raise UserError("a preemption notice must name at least one device")
    if unknown:
        raise UserError(f"preemption notice for device(s) {unknown} that the job does not use (it has {sorted(set(known))})")
    if notice.deadline <= now:
        raise UserError(f"preemption notice deadline passed {now - notice.deadline:.1f} s ago; nothing can be saved live")


def _other(old: Layout, new: Layout, doomed: int) -> int:
    """The surviving device whose blocks or replica group a step changes (the move's receiver)."""

    def assignment(lay: Layout) -> dict[int, tuple[int, int, tuple[int, ...]]]:
        return {d: (lay.cuts[s], lay.cuts[s + 1], g) for s, g in enumerate(lay.groups) for d in g}

    before, after = assignment(old), assignment(new)
    return min(d for d in after if d != doomed and before.get(d) != after[d])


def _without(layout: Layout, doomed: int, idle: Sequence[int]) -> list[Layout]:
    """Layouts without ``doomed`` that differ from ``layout`` in two workers."""
    out: list[Layout] = []
    for s, group in enumerate(layout.groups):
        if doomed not in group:
            continue
        if len(group) > 1:  # a replica leaves; its peers already hold the state
            rest = tuple(d for d in group if d != doomed)
            out.append(Layout(layout.cuts, layout.groups[:s] + (rest,) + layout.groups[s + 1:]))
            continue
        for d in idle:  # an idle survivor takes the whole stage over
            out.append(Layout(layout.cuts, layout.groups[:s] + ((d,),) + layout.groups[s + 1:]))
        # the doomed stage's blocks join a pipeline neighbour (the controller's MERGE move)
        cuts, groups = layout.cuts, layout.groups[:s] + layout.groups[s + 1:]
        if s + 1 < len(layout.groups):
            out.append(Layout(cuts[:s + 1] + cuts[s + 2:], groups))
        if s > 0:
            out.append(Layout(cuts[:s] + cuts[s + 1:], groups))
    return out


def plan_evacuation(plan: Plan, notice: Notice, alive: Iterable[int], profile: Profile, cluster: Cluster, now: float,
                    margin_s: float = 5.0, inflight_s: float = 0.0, move_overhead_s: float = 0.5,
                    replan: Callable[[Sequence[int]], Plan] | None = None) -> EvacuationDecision:
    """The sequence of two-worker moves that empties ``notice.devices`` onto the survivors, if it
    fits in memory and finishes ``margin_s`` before the deadline; else why not (see module doc).

    ``inflight_s``: the iteration that must finish before the first move (the current iteration
    time). ``move_overhead_s``: per-move stall beyond the transfers (the controller calibrates it).
    ``replan(survivors)``: the plan the job would make for the survivors. When given, the evacuation
    is one live switch to it if that finishes in time: the two-worker steps leave the survivors on a
    plan the controller would re-balance at once (a second stall), and when several devices are doomed
    at once they rarely find room by merges alone. The two-worker steps remain the fallback, and the
    answer when every doomed device is a replica (dropping it moves nothing; the controller may
    re-balance later when that pays).
    """
    doomed = set(notice.devices)
    survivors = sorted(set(alive) - doomed)
    if not survivors:
        return Fallback(f"every device is doomed ({sorted(doomed)}): nowhere to evacuate to")
    left = notice.deadline - now
    replicas_only = all(len(s.devices) > len(doomed & set(s.devices)) for s in plan.stages)  # every stage keeps a copy
    if replan is not None and doomed & set(plan.devices) and not replicas_only:  # (dropping replicas moves nothing)
        target = replan(survivors)  # a planner that cannot place the model falls back to a plan that may not fit
        fits = bool(CostModel(profile, cluster, target.num_microbatches, target.schedule).estimate([Layout.of(target)]).fits[0])
        transfers = move_transfers(plan, target, profile, cluster, frozenset())
        predicted = inflight_s + handover_time(transfers, cluster) + move_overhead_s
        if fits and predicted <= left - margin_s:
            pairs = tuple(dict.fromkeys((t.src, t.dst) for t in transfers))
            return Evacuate((target,), pairs, predicted, f"one live switch to a plan re-made for the {len(survivors)} survivors, "
                                                         f"predicted {predicted:.2f} s of {left:.1f} s left")
    return _two_worker_steps(plan, doomed, survivors, profile, cluster, left, margin_s, inflight_s, move_overhead_s)


def _two_worker_steps(plan: Plan, doomed: set[int], survivors: list[int], profile: Profile, cluster: Cluster, left: float,
                      margin_s: float, inflight_s: float, move_overhead_s: float) -> EvacuationDecision:
    if plan.virtual_chunks != 1:
        return Fallback("interleaved plans are not evacuated live")
    model = CostModel(profile, cluster, plan.num_microbatches, plan.schedule)
    layout = Layout.of(plan)
    steps: list[Plan] = []
    pairs: list[tuple[int, int]] = []
    for d in sorted(doomed & layout.devices):
        idle = [x for x in survivors if x not in layout.devices]
        options = _without(layout, d, idle)
        if not options:
            return Fallback(f"device {d}'s blocks cannot move in one two-worker step")
        est = model.estimate(options)
        fitting = [k for k in range(len(options)) if est.fits[k]]
        if not fitting:
            return Fallback(f"no room: the survivors cannot hold device {d}'s blocks in memory")
        best = options[min(fitting, key=lambda k: (float(est.time_s[k]), float(est.balance[k])))]
        pairs.append((d, _other(layout, best, d)))
        layout = best
        steps.append(layout.to_plan(plan, algorithm="evacuation"))
    if not steps:
        return Evacuate((), (), 0.0, "the doomed devices hold no blocks")
    predicted, prev = inflight_s, plan
    for nxt in steps:
        predicted += handover_time(move_transfers(prev, nxt, profile, cluster, frozenset()), cluster) + move_overhead_s
        prev = nxt
    if predicted > left - margin_s:
        return Fallback(f"deadline: the moves need {predicted:.1f} s but {left:.1f} s are left (margin {margin_s:g} s)")
    return Evacuate(tuple(steps), tuple(pairs), predicted,
                    f"{len(steps)} move(s), predicted {predicted:.2f} s of {left:.1f} s left")
