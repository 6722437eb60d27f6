"""Spot goodput on Parcae's public traces: the job's own policies against restarts, Parcae and the bound.

Why a replay and not the CPU soak: at 32 V100 nodes and an hour per window, what a policy earns is set by what its
decisions cost at that scale (state over 10 Gb/s links, restarts, iterations lost), not by a tiny model's fixed costs.
So each policy runs on a simulated cluster: iteration times come from the cost engine's simulator for the plan in
force; a change of plan, an evacuation, an in-place recovery or a restart is charged what the cost engine says it
costs (state bytes over the links, communicator re-formation, checkpoint reads at the storage's bandwidth), with
fixed costs calibrated from the CPU runs (:class:`Costs`). The *decisions* are the job's own functions, called as
the job calls them, never re-written here: :func:`plan_evacuation` for a notice, :func:`on_worker_death` and the
in-place recovery's re-plan for a death, the arbiter (:class:`ExplicitArbiter`) for whether a better plan pays for
its move, and ``auto`` for every plan.

Time is continuous: events (a notice, a removal, a join, a minute's new Parcae shape) happen at their times, a
policy trains between them at its plan's iteration time, a stall holds it up, and work since the newest copy of
the state is lost when that state dies. ``oracle`` runs, each minute, the fastest plan any policy or ``auto`` knows
for the nodes available, switched at no cost: no policy can beat it.

    python benchmarks/spot_goodput.py --traces ../shared/parcae_traces --json
    python benchmarks/spot_goodput.py --availability FILE --model gpt-1.5b --json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.parcae_profiles import BATCHES, load_parcae_profile, microbatches  # noqa: E402
from orchestrator.adapt.handle import BlockHandover, handover_time, move_transfers  # noqa: E402
from orchestrator.adapt.policies import (ArbiterConfig, ExplicitArbiter, Option, RecoverInPlace, Switch,  # noqa: E402
                                         checkpoint_interval, on_worker_death, planner_plan)
from orchestrator.core.cluster import GBPS, Cluster, flat  # noqa: E402
from orchestrator.core.errors import UserError  # noqa: E402
from orchestrator.core.plan import Plan, Stage, straight_plan  # noqa: E402
from orchestrator.core.profile import Profile  # noqa: E402
from orchestrator.costmodel.simulator import simulate  # noqa: E402
from orchestrator.costmodel.terms import shipped_bytes, transfer_time  # noqa: E402
from orchestrator.elastic.evacuation import Evacuate, Notice, plan_evacuation  # noqa: E402
from orchestrator.elastic.job_config import RunConfig, ScalingConfig  # noqa: E402
from orchestrator.planners.partition import min_max_partition  # noqa: E402
from benchmarks.spot_traces import Event, Trace, fail, availability_trace, parcae_trace, scaled, with_notices  # noqa: E402
from orchestrator.train.recovery import ring_neighbours  # noqa: E402

V100_GIB = 16.0
LINK_GBPS = 10.0
# The bundled catalog's p3.2xlarge rows (cloud/catalog): on-demand is AWS's list price; the spot row is an estimate
# at 30% of it (no public spot history is bundled for p3), said so in the output.
P3_ON_DEMAND_USD = 3.06
P3_SPOT_USD = round(P3_ON_DEMAND_USD * 0.3, 3)


@dataclass(frozen=True)
class Costs:
    """What the simulated cluster charges; see ``benchmarks/results/spot_goodput.md`` for where each comes from."""

    restart_s: float = 66.0
    """Every process stopped and started again, actors placed, process groups formed: the median cold restart of
    ``benchmarks/faults.py`` (66 s on CPU actors; the model's state read from storage is charged apart)."""
    reform_s: float = 2.0
    """Survivors re-form their process group (in-place recovery, a join or a leave): 0.28 s measured on gloo by
    ``faults.py``; NCCL's communicator set-up for tens of ranks takes seconds, so 2 s."""
    move_overhead_s: float = 0.5
    """Per live switch beyond its transfers (barrier, schedule regeneration): the evacuation policy's default."""
    storage_gbps: float = 8.0
    """Checkpoint read per node on a restart (an object store per node)."""
    copy_gbps: float = 80.0
    """Device-to-host copy of a checkpoint's state (pinned PCIe 3): an asynchronous checkpoint's stall (the upload
    runs while training goes on)."""


class World:
    """The model, the cluster and what plans cost on it, memoized: nodes are alike, so a plan's time and ``auto``'s
    plan depend only on the plan's shape and the number of nodes."""

    def __init__(self, profile: Profile, nodes: int, microbatches: int, samples_per_iteration: int, costs: Costs = Costs(),
                 straight: bool = ScalingConfig().straight) -> None:
        self.profile, self.costs, self.samples, self.straight = profile, costs, samples_per_iteration, straight
        self.cluster: Cluster = flat(nodes, LINK_GBPS, memory_bytes=V100_GIB * 2**30)
        self.template = straight_plan([0, profile.num_blocks], microbatches)
        self._times: dict[tuple[Any, ...], float] = {}
        self._auto: dict[int, Plan] = {}
        self.planning_s: list[float] = []

    def iteration_s(self, plan: Plan) -> float:
        key = _shape_key(plan)
        if key not in self._times:
            self._times[key] = simulate(_relabel(plan, range(len(plan.devices))), self.profile, self.cluster).iteration_s
        return self._times[key]

    def auto(self, alive: Iterable[int]) -> Plan:
        """``auto``'s plan over ``alive``: the job's re-plan (``planner_plan`` with the job's default ``straight``)."""
        ids = sorted(alive)
        if len(ids) not in self._auto:
            t0 = time.process_time()
            self._auto[len(ids)] = planner_plan(self.profile, self.cluster, range(len(ids)), self.template, "auto", self.straight)
            self.planning_s.append(time.process_time() - t0)
        return _relabel(self._auto[len(ids)], ids)

    def shape(self, data: int, pipeline: int, alive: Sequence[int], keep: Plan | None) -> Plan:
        """The best cut of a (D, P) shape on ``alive`` (devices the ``keep`` plan holds first): P stages balanced by
        compute, each on D replicas; every stage recomputes if it would not fit otherwise."""
        pipeline = max(1, min(pipeline, self.profile.num_blocks, len(alive)))
        data = max(1, min(data, len(alive) // pipeline))
        kept = [d for d in (keep.devices if keep else ()) if d in set(alive)]
        order = kept + [d for d in sorted(alive) if d not in set(kept)]
        cuts = min_max_partition(np.array([b.forward_s + b.backward_s for b in self.profile.blocks]), pipeline)
        stages = tuple(Stage(cuts[j], cuts[j + 1], tuple(order[j * data:(j + 1) * data])) for j in range(len(cuts) - 1))
        plan = Plan(stages, self.template.num_microbatches, self.template.schedule, algorithm=f"shape:{data}x{pipeline}")
        if not self.fits(plan):
            plan = replace(plan, stages=tuple(replace(s, recompute=True) for s in stages))
        return plan

    def fits(self, plan: Plan) -> bool:
        peak = simulate(_relabel(plan, range(len(plan.devices))), self.profile, self.cluster).peak_memory_bytes
        return max(peak.values(), default=0.0) <= V100_GIB * 2**30

    def state_bytes(self, plan: Plan) -> float:
        """The largest device's training state (weights and optimizer), which a restart reads from storage."""
        return max(shipped_bytes(self.profile.param_bytes(s.first, s.last)) for s in plan.stages)

    def switch_s(self, old: Plan, new: Plan) -> float:
        """A live change of plan: the hand-overs (busiest endpoint), one re-formation, the per-move overhead."""
        return handover_time(move_transfers(old, new, self.profile, self.cluster), self.cluster) + self.costs.reform_s + self.costs.move_overhead_s

    def recovery_s(self, old: Plan, new: Plan, dead: frozenset[int], snapshots: bool) -> tuple[float, bool]:
        """The survivors re-form on ``new`` from host copies (the runtime's ``recover_in_place``): seconds, and
        whether training goes back to the newest checkpoint. Without snapshots it does (the host copies are the
        checkpoint's); with them, only when some block's every copy died (a dead device's blocks come from a live
        replica or the snapshot neighbour's memory, else from storage, read at the storage's bandwidth)."""
        ring = ring_neighbours(old.devices)
        moves: list[BlockHandover] = []
        stored: dict[int, float] = {}
        for t in move_transfers(old, new, self.profile, self.cluster):
            replicas = [d for s in old.stages if s.first <= t.first and t.last <= s.last for d in s.devices if d not in dead]
            if t.src not in dead:
                moves.append(t)
            elif replicas:
                moves.append(replace(t, src=replicas[0]))
            elif snapshots and ring.get(t.src, t.src) not in dead:
                moves.append(replace(t, src=ring[t.src]))
            else:
                stored[t.dst] = stored.get(t.dst, 0.0) + t.nbytes
        read = max((transfer_time(b, 1.0 / (self.costs.storage_gbps * GBPS)) for b in stored.values()), default=0.0)
        seconds = max(handover_time(moves, self.cluster), read) + self.costs.reform_s + self.costs.move_overhead_s
        return seconds, bool(stored) or not snapshots

    def restart_s(self, plan: Plan) -> float:
        """Every process started afresh, the state read from storage (the runtime's ``recover``, a cold start)."""
        return self.costs.restart_s + self.storage_s(plan)

    def relocate_s(self, plan: Plan) -> float:
        """The job's ``relocate`` within its cluster: a synchronous checkpoint written, then the same processes
        re-configured on ``plan`` and the state read back (``restart_on``: a warm restart)."""
        return 2 * self.storage_s(plan) + self.costs.reform_s

    def storage_s(self, plan: Plan) -> float:
        return transfer_time(self.state_bytes(plan), 1.0 / (self.costs.storage_gbps * GBPS))

    def checkpoint_stall_s(self, plan: Plan) -> float:
        return transfer_time(self.state_bytes(plan), 1.0 / (self.costs.copy_gbps * GBPS))


def _relabel(plan: Plan, ids: Iterable[int]) -> Plan:
    """``plan`` with its ``k``-th device (in order of first appearance) replaced by ``ids[k]``."""
    order = list(dict.fromkeys(d for s in plan.stages for d in s.devices))
    new = dict(zip(order, ids))
    return replace(plan, stages=tuple(replace(s, devices=tuple(new[d] for d in s.devices)) for s in plan.stages))


def _shape_key(plan: Plan) -> tuple[Any, ...]:
    order = {d: k for k, d in enumerate(dict.fromkeys(d for s in plan.stages for d in s.devices))}
    return (plan.schedule, plan.num_microbatches, plan.sliced_microbatches,
            tuple((s.first, s.last, tuple(order[d] for d in s.devices), s.recompute) for s in plan.stages))


@dataclass
class Tally:
    """One policy's run over one trace."""

    policy: str
    notice_s: float = 0.0  # the notice before each removal this policy got (raypipe runs with and without)
    samples: float = 0.0
    lost_samples: float = 0.0
    stall_s: float = 0.0
    transitions: int = 0
    ran: dict[int, float] = field(default_factory=dict)  # minute -> fastest iteration time it ran in that minute

    @property
    def label(self) -> str:
        return label(self.policy, self.notice_s)


def label(policy: str, notice_s: float) -> str:
    """A table column: the policy, and whether it had notices."""
    return f"{policy}-notice" if notice_s else policy


class Replay:
    """What every policy shares: the clock, training between events at the plan's pace, stalls, lost work."""

    def __init__(self, world: World, trace: Trace, policy: str, notice_s: float = 0.0) -> None:
        self.world, self.trace = world, trace
        self.tally = Tally(policy, notice_s)
        self.now = 0.0
        self.busy_until = 0.0  # stalled until then
        self.plan: Plan | None = None
        self.alive: set[int] = set()
        self.iterations = 0.0  # done since the start (fractional: an iteration in flight)
        self.checkpoint_at = 0.0  # iterations in the newest checkpoint

    def run(self) -> Tally:
        for event in self.trace.events:
            self.advance(event.t)
            self.on(event)
        self.advance(self.trace.duration_s)
        return self.tally

    def checkpoint_every(self, pace: float) -> float:
        """Iterations between periodic checkpoints (``inf``: none), at ``pace`` seconds per iteration."""
        return float(RunConfig().checkpoint_every or math.inf)

    def advance(self, until: float) -> None:
        """Train from ``now`` to ``until`` (after any stall), checkpointing on the way when due."""
        while self.now < until:
            start = max(self.now, self.busy_until)
            if self.plan is None or start >= until:
                self.now = until
                return
            pace = self.world.iteration_s(self.plan)
            due = start + (self.checkpoint_at + self.checkpoint_every(pace) - self.iterations) * pace
            stop = min(until, max(start, due))
            done = (stop - start) / pace
            self.iterations += done
            self.tally.samples += done * self.world.samples
            minute = int(start // self.trace.gap_s)
            self.tally.ran[minute] = min(self.tally.ran.get(minute, math.inf), pace)
            self.now = stop
            if stop >= due:
                self.checkpoint_at = self.iterations
                self.stall(self.world.checkpoint_stall_s(self.plan))

    def stall(self, seconds: float) -> None:
        self.busy_until = max(self.busy_until, self.now) + seconds
        self.tally.stall_s += seconds

    def lose(self, back_to: float) -> None:
        """Work since ``back_to`` iterations is gone; training goes on from there."""
        lost = max(0.0, self.iterations - back_to)
        self.iterations -= lost
        self.tally.samples -= lost * self.world.samples
        self.tally.lost_samples += lost * self.world.samples

    def switch(self, plan: Plan | None, seconds: float) -> None:
        if plan != self.plan:
            self.tally.transitions += 1
        self.plan = plan
        self.stall(seconds)

    def on(self, event: Event) -> None:
        raise NotImplementedError


SPOT_RUN = RunConfig(checkpoint_every="auto")
"""The job as a spot user runs it (``docs``: spot): checkpoints as often as pay for the deaths seen."""


class RayPipe(Replay):
    """The job's policies (see the module docstring), with :data:`SPOT_RUN`'s settings."""

    def __init__(self, world: World, trace: Trace, notice_s: float = 0.0) -> None:
        super().__init__(world, with_notices(trace, notice_s), "raypipe", notice_s)
        self.deaths = 0  # as the job's loop counts them: removals without notice of devices holding blocks
        self.doomed: set[int] = set()  # told to leave, emptied already
        self.changes: list[float] = []  # when capacity changed: the arbiter's horizon comes from these alone
        self.arbiter = ExplicitArbiter(ArbiterConfig(horizon_iterations=10**9))

    def on(self, event: Event) -> None:
        if event.kind == "add":
            self.alive |= set(event.nodes)
            self.changes.append(event.t)
            if self.plan is None:
                self.switch(self.world.auto(self.alive), self.world.restart_s(self.world.auto(self.alive)))
            self.rebalance()
        elif event.kind == "notice":
            self.notice(event)
        elif event.kind == "remove":
            self.changes.append(event.t)
            self.removed(set(event.nodes))

    def checkpoint_every(self, pace: float) -> float:
        every = SPOT_RUN.checkpoint_every
        if every != "auto":
            return float(every or math.inf)
        assert self.plan is not None
        return checkpoint_interval(self.world.checkpoint_stall_s(self.plan), pace, self.deaths, self.now)

    def usable(self) -> set[int]:
        return self.alive - self.doomed

    def notice(self, event: Event) -> None:
        """The job's ``_preempted``: evacuate live if the moves fit before the deadline, else ``relocate``: checkpoint
        now and restart on the survivors from it (no step lost)."""
        doomed = set(event.nodes) & self.alive
        if not doomed or self.plan is None:
            return
        if not doomed & set(self.plan.devices):
            self.doomed |= doomed
            return
        pace = self.world.iteration_s(self.plan)
        decision = plan_evacuation(self.plan, Notice(tuple(sorted(doomed)), event.deadline), self.usable(), self.world.profile,
                                   self.world.cluster, self.now, inflight_s=pace, move_overhead_s=self.world.costs.move_overhead_s,
                                   replan=self.world.auto)
        if isinstance(decision, Evacuate):  # the doomed stay members, idle, until they leave at the removal
            self.doomed |= doomed
            self.switch(decision.steps[-1] if decision.steps else self.plan, decision.predicted_s - pace)
            self.rebalance()
        else:  # relocate: checkpoint, then the survivors restart warm from it
            self.doomed |= doomed
            self.checkpoint_at = self.iterations
            if self.usable():
                plan = self.world.auto(self.usable())
                self.switch(plan, self.world.relocate_s(plan))
            else:
                self.stall(self.world.storage_s(self.plan))
                self.plan = None

    def removed(self, gone: set[int]) -> None:
        self.alive -= gone
        self.doomed -= gone
        if self.plan is None:
            return
        dead = gone & set(self.plan.devices)
        if not self.alive:
            self.lose(self.checkpoint_at)
            self.plan = None
            return
        if not dead:
            self.stall(self.world.costs.reform_s)  # the process group is re-formed without them
            self.rebalance()
            return
        self.deaths += 1
        decision = on_worker_death(1, 10**9, self.plan, sorted(dead), sorted(self.alive | dead), in_place=SPOT_RUN.recover_in_place)
        survivors = self.usable()
        plan = self.world.auto(survivors or self.alive)
        if isinstance(decision, RecoverInPlace) and survivors:  # re-planned over the survivors, as the job does
            snapshots = SPOT_RUN.snapshot_every > 0
            seconds, back = self.world.recovery_s(self.plan, plan, frozenset(dead), snapshots)
            self.lose(self.checkpoint_at if back else math.floor(self.iterations))  # the step in flight at least
            self.switch(plan, seconds)
            return
        self.lose(self.checkpoint_at)
        self.switch(plan, self.world.restart_s(plan))

    def rebalance(self) -> None:
        """The arbiter's rule: move to ``auto``'s plan for the usable nodes when its gain over the time until the
        next capacity change (predicted from the changes so far) pays for the move."""
        if self.plan is None or not self.usable():
            return
        best = self.world.auto(self.usable())
        current, predicted = self.world.iteration_s(self.plan), self.world.iteration_s(best)
        if predicted >= current:
            return
        cost = self.world.switch_s(self.plan, best)
        decision = self.arbiter.decide(current, [Option("move", (best,), predicted, cost)], int(self.horizon_s() / current))
        if isinstance(decision, Switch):
            self.switch(best, cost)

    def horizon_s(self) -> float:
        """Expected time to the next capacity change: the mean gap between past changes (10 minutes before two)."""
        past = [b - a for a, b in zip(self.changes, self.changes[1:]) if b > a]
        return sum(past) / len(past) if past else 600.0


class Restarts(Replay):
    """What Ray Train and SkyPilot do: checkpoint every N minutes; any change that touches the plan, or a join that
    ``auto`` would use, restarts everything from the newest checkpoint on ``auto``'s plan for the nodes up."""

    def __init__(self, world: World, trace: Trace, policy: str, every_s: float) -> None:
        super().__init__(world, trace, policy)
        self.every_s = every_s

    def checkpoint_every(self, pace: float) -> float:
        return self.every_s / pace

    def on(self, event: Event) -> None:
        if event.kind not in ("add", "remove"):
            return
        before = set(self.alive)
        self.alive = before | set(event.nodes) if event.kind == "add" else before - set(event.nodes)
        if not self.alive:
            self.lose(self.checkpoint_at)
            self.plan = None
            return
        plan = self.world.auto(self.alive)
        hit = self.plan is not None and bool(set(event.nodes) & set(self.plan.devices)) and event.kind == "remove"
        faster = self.plan is None or self.world.iteration_s(plan) < self.world.iteration_s(self.plan)
        if hit or (event.kind == "add" and faster):
            if self.plan is not None:
                self.lose(self.checkpoint_at)
            self.switch(plan, self.world.restart_s(plan))


class Parcae(Replay):
    """Parcae's recorded (D, P) for each minute, timed by our simulator on the best cut of that shape; each change of
    shape or loss of a node it uses charged by the same cost model (a live change; from the checkpoint if a block's
    every copy died)."""

    def __init__(self, world: World, trace: Trace, policy: str, strategy: str) -> None:
        super().__init__(world, trace, policy)
        self.strategy = strategy
        self.dims: tuple[int, int] | None = None
        self.dead: frozenset[int] = frozenset()  # nodes of the plan that left since the last shape

    def on(self, event: Event) -> None:
        if event.kind == "add":
            self.alive |= set(event.nodes)
            return
        if event.kind == "remove":
            self.alive -= set(event.nodes)
            if not self.alive:
                self.lose(self.checkpoint_at)
                self.plan, self.dims = None, None
            elif self.plan is not None and set(event.nodes) & set(self.plan.devices):
                self.dims = None  # re-laid on the next shape event (same time)
                self.dead |= set(event.nodes)
            return
        if event.kind != "shape":
            return
        dims = dict(event.shapes).get(self.strategy)
        if dims is None or not self.alive:
            return
        if dims == self.dims and self.plan is not None:
            return
        plan = self.world.shape(dims[0], dims[1], sorted(self.alive), self.plan)
        dead = self.dead
        if self.plan is None:
            self.switch(plan, self.world.restart_s(plan))
        elif dead:
            seconds, back = self.world.recovery_s(self.plan, plan, dead, snapshots=True)  # live replicas: Parcae's copies
            self.lose(self.checkpoint_at if back else math.floor(self.iterations))
            self.switch(plan, seconds)
        else:
            self.switch(plan, self.world.switch_s(self.plan, plan))
        self.dims, self.dead = dims, frozenset()


def oracle(world: World, trace: Trace, others: Sequence[Tally]) -> Tally:
    """Each minute the fastest plan known for its nodes (``auto``'s or one another policy ran), at no cost."""
    out = Tally("oracle")
    for minute, up in enumerate(trace.minutes):
        if not up:
            continue
        best = min([world.iteration_s(world.auto(up)), *(t.ran[minute] for t in others if minute in t.ran)])
        out.samples += trace.gap_s / best * world.samples
        out.ran[minute] = best
    return out


def replay_all(world: World, trace: Trace, notice_s: float = 120.0, restart_every_s: float = 300.0,
               parcae: bool = True) -> list[tuple[Tally, float]]:
    """Every policy on ``trace``: (tally, CPU seconds of its replay)."""
    replays: list[Replay] = [RayPipe(world, trace, notice_s), RayPipe(world, trace),
                             Restarts(world, trace, "restart", restart_every_s)]
    if parcae and any(e.kind == "shape" for e in trace.events):
        replays += [Parcae(world, trace, name, key) for name, key in (("parcae-liveput", "liveput_predict"),
                    ("parcae-oracle-liveput", "liveput_truth"), ("parcae-throughput", "throughput_opt"))]
    out = []
    for replay in replays:
        t0 = time.process_time()
        tally = replay.run()
        out.append((tally, time.process_time() - t0))
    t0 = time.process_time()
    out.append((oracle(world, trace, [t for t, _ in out]), time.process_time() - t0))
    return out


def rows(model: str, window: str, trace: Trace, world: World, results: list[tuple[Tally, float]], usd_per_hour: float) -> list[dict[str, Any]]:
    node_hours = sum(len(m) for m in trace.minutes) * trace.gap_s / 3600.0
    usd = node_hours * usd_per_hour
    best = next(t for t, _ in results if t.policy == "oracle").samples
    out = []
    for tally, cpu in results:
        out.append({"model": model, "window": window, "policy": tally.policy, "notice_s": tally.notice_s, "samples": round(tally.samples),
                    "ratio_to_oracle": round(tally.samples / best, 4) if best > 0 else None, "transitions": tally.transitions,
                    "stall_s": round(tally.stall_s, 1), "lost_samples": round(tally.lost_samples), "usd": round(usd, 2),
                    "usd_per_million_samples": round(usd / tally.samples * 1e6, 2) if tally.samples > 0 else None,
                    "replay_cpu_s": round(cpu, 3)})
    return out


def load_world(model: str, nodes: int, costs: Costs, batch_scale: int = 1) -> World:
    """Parcae's model on ``nodes`` V100s: its profile, and iterations of one global batch of micro-batches.
    ``batch_scale``: a trace scaled up keeps each node's share of the work (weak scaling): every micro-batch
    carries that many times the samples (its compute and activations scale with it), the global batch too."""
    if model not in BATCHES:
        fail(f"--model {model!r}: choose one of {', '.join(BATCHES)}")
    profile = load_parcae_profile(model, calibrated=True)
    if batch_scale != 1:
        profile = profile.scaled(batch_scale).with_activation_scale(batch_scale)
    return World(profile, nodes, microbatches(model), BATCHES[model][1] * batch_scale, costs)


def parcae_traces(root: Path, models: Sequence[str], windows: Sequence[str]) -> list[tuple[str, Path]]:
    found = [(m, f) for m in models for f in sorted((root / m).glob("trace_*.txt"))
             if not windows or f.stem.removeprefix("trace_") in windows]
    if not found:
        fail(f"--traces {root}: no <model>/trace_<window>.txt files for {', '.join(models)}")
    return found


def table(rows_: Sequence[dict[str, Any]]) -> str:
    policies = list(dict.fromkeys(label(r["policy"], r["notice_s"]) for r in rows_))
    head = "| model | window | " + " | ".join(policies) + " |\n|---|---|" + "---|" * len(policies)
    lines = [head]
    for key in dict.fromkeys((r["model"], r["window"]) for r in rows_):
        got = {label(r["policy"], r["notice_s"]): r for r in rows_ if (r["model"], r["window"]) == key}
        cells = [f"{got[p]['ratio_to_oracle']:.3f} ({got[p]['transitions']} tr, {got[p]['stall_s']:.0f} s)" if p in got else "-" for p in policies]
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--traces", type=Path, help="Parcae's traces: <model>/trace_<window>.txt")
    src.add_argument("--availability", type=Path, help='{"metadata": {"gap_seconds": S}, "data": [nodes, ...]}')
    ap.add_argument("--model", action="append", help="model(s) to run (default: every model of --traces; gpt-1.5b for --availability)")
    ap.add_argument("--window", action="append", default=[], help="Parcae window(s) to run (default: all)")
    ap.add_argument("--nodes", type=int, default=0,
                    help="scale the trace to this many nodes (node groups replicated, the global batch with them)")
    ap.add_argument("--notice-s", type=float, default=120.0, help="notice before each removal for raypipe-notice (AWS: 120)")
    ap.add_argument("--restart-every-min", type=float, default=5.0, help="the restart policy's checkpoint interval")
    ap.add_argument("--usd-per-hour", type=float, default=P3_SPOT_USD, help="per node (default: the catalog's p3.2xlarge spot estimate)")
    ap.add_argument("--json", action="store_true", help="one JSON row per (model, window, policy)")
    ap.add_argument("--markdown", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except UserError as exc:
        print(f"spot_goodput: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.nodes < 0 or args.nodes > 4096 or args.notice_s < 0 or args.restart_every_min <= 0 or not 0 < args.usd_per_hour < 1000:
        fail("--nodes in 0..4096, --notice-s >= 0, --restart-every-min > 0, --usd-per-hour in (0, 1000)")
    costs = Costs()
    if args.availability is not None:
        trace = availability_trace(args.availability)
        jobs = [(m, trace) for m in (args.model or ["gpt-1.5b"])]
    else:
        models = args.model or [m for m in BATCHES if (args.traces / m).is_dir()]
        jobs = [(m, parcae_trace(p)) for m, p in parcae_traces(args.traces, models, args.window)]
    out: list[dict[str, Any]] = []
    worlds: dict[tuple[str, int], World] = {}
    spot_note = "" if args.usd_per_hour != P3_SPOT_USD else f" (p3.2xlarge spot estimated at 30% of on-demand ${P3_ON_DEMAND_USD}/h)"
    for model, trace in jobs:
        factor = max(1, args.nodes // max(1, max(len(m) for m in trace.minutes))) if args.nodes else 1
        trace = scaled(trace, factor)
        key = (model, trace.nodes)
        if key not in worlds:
            worlds[key] = load_world(model, trace.nodes, costs, factor)
        world = worlds[key]
        results = replay_all(world, trace, args.notice_s, args.restart_every_min * 60.0)
        window = trace.name.split("/")[-1]
        got = rows(model, window, trace, world, results, args.usd_per_hour)
        for r in got:
            r["usd_on_demand"] = round(r["usd"] / args.usd_per_hour * P3_ON_DEMAND_USD, 2)
        out += got
        if args.json:
            for r in got:
                print(json.dumps(r), flush=True)
        else:
            print(table(got), flush=True)
    if not args.json:
        print(f"usd per node-hour {args.usd_per_hour}{spot_note}", flush=True)
    if args.markdown is not None:
        args.markdown.write_text(table(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
