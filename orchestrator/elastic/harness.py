"""The controller's real-runtime harness: :class:`RayPipeline` implements
:class:`~orchestrator.adapt.handle.PipelineHandle` on a :class:`~orchestrator.train.runtime.PipelineRuntime`, and
:func:`run_adaptive` drives a controller over it — for the live-move tests and the controller's live benchmarks
(``benchmarks/adaptive_live.py``, ``noise_traces.py``). A job does not use it: :class:`~orchestrator.elastic.job_loop.ElasticJob`
observes and acts in its own loop.

Why a handle at all: it mirrors :class:`~orchestrator.adapt.simulated.SimulatedPipeline` call for call, so a controller
tested on the simulator is driven on real actors unchanged, one ``controller.step()`` at a time. Every iteration it
runs goes through the one training loop (:class:`~orchestrator.elastic.loop.TrainingLoop`, one step, nothing ahead),
which alone dispatches:

- ``run_iteration``: applies the fault scenario of this step (slowdowns and link delays as knobs on the workers, kills
  armed inside the iteration), runs one training step, and reports per-device forward+backward seconds and per-link
  bytes/seconds from the workers' own spans;
- ``apply_move``: a live move. Block state (weights + optimizer state) goes worker to worker over the job's process
  group exactly as :func:`~orchestrator.adapt.handle.move_transfers` lists it; other workers keep process and state;
  the schedule IR is lowered again for the new plan; the process group is rebuilt only when the set of live devices
  changed;
- ``restart``: the same processes re-configured for a new plan, state from the newest checkpoint
  (``from_checkpoint``) or from a checkpoint of the live state taken just before (planned).

Device ``d`` of the nominal cluster is always worker slot ``d`` of the worker group, so device ids are never
renumbered. A device the scenario lists as initially absent has a worker that is not a process-group member until it
joins.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, Union

from actors import checkpoint as ckpt
from actors.group import PipelineActorError, WorkerGroup
from actors.metrics import MeasuredIteration
from orchestrator.adapt.controller import Controller, ControllerConfig, StepRecord
from orchestrator.adapt.faults import FaultSchedule, Join, Kill, Slowdown, Throttle
from orchestrator.adapt.handle import IterationMetrics, MoveReport, RestartReport, check_plan_alive, move_transfers
from orchestrator.adapt.live import measured_profile, to_controller_metrics
from orchestrator.adapt.policies import Stay, Switch
from orchestrator.adapt.rehearsal import Rehearsal
from orchestrator.core.cluster import Cluster, flat
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.core.profile import Profile
from orchestrator.elastic.loop import TrainingLoop, every
from orchestrator.train.runtime import PipelineRuntime


class OneStep:
    """The harness's policies (:class:`~orchestrator.elastic.loop.Policies`): one step per call, nothing submitted
    ahead, a checkpoint every ``checkpoint_every`` steps, and a death handed back to the harness (which reports it
    to the controller as a failed iteration)."""

    def __init__(self, runtime: PipelineRuntime, checkpoint_every: int) -> None:
        self.runtime, self.checkpoint_every = runtime, checkpoint_every
        self.last: MeasuredIteration | None = None

    def before(self, step: int) -> None:
        pass

    def run_length(self, step: int, target: int) -> int:
        return 1

    def hold(self, done: int, target: int) -> bool:
        return True

    def completed(self, run: Sequence[MeasuredIteration]) -> None:
        self.last = run[-1]

    def between(self, run: Sequence[MeasuredIteration], target: int) -> None:
        if every(self.checkpoint_every, self.runtime.step):
            self.runtime.save_checkpoint()

    def failed(self, exc: PipelineActorError, failures: int) -> None:
        raise exc


class RayPipeline:
    """:class:`PipelineHandle` over a :class:`PipelineRuntime` (see the module docstring).

    ``cluster``: the nominal cluster (device ``d`` = worker slot ``d``; default: ``flat`` over
    the plan's devices at 10 Gb/s — the monitor adopts measured links on first sight anyway).
    ``profile``: the model's profile (default: measured here). ``faults``: the scenario, indexed
    by calls to :meth:`run_iteration` like the simulated pipeline's.
    """

    def __init__(self, runtime: PipelineRuntime, cluster: Cluster | None = None, faults: FaultSchedule = FaultSchedule(),
                 profile: Profile | None = None, timeout_s: float = 300.0, checkpoint_every: int = 0) -> None:
        plan = runtime.plan
        self.cluster = cluster if cluster is not None else flat(max(plan.devices) + 1, 10.0)
        plan.check_against(plan.num_blocks, self.cluster.size)
        faults.validate(self.cluster)
        self.runtime, self.faults, self.timeout_s = runtime, faults, timeout_s
        if checkpoint_every and runtime.checkpoint_dir is None:
            raise UserError("checkpoint_every needs the runtime's checkpoint_dir")
        self._steps = OneStep(runtime, checkpoint_every)  # a checkpoint every so often: what a restart "from checkpoint" goes back to
        self._loop = TrainingLoop(runtime, self._steps, pipelined=False)
        self.profile = profile if profile is not None else measured_profile(runtime)
        if self.profile.num_blocks != plan.num_blocks:
            raise UserError(f"the profile has {self.profile.num_blocks} blocks but the plan covers {plan.num_blocks}")
        self.batch_rows = int(runtime.spec.data_fn(0)[0].shape[0])
        self.step_index = 0
        self._dead: set[int] = set()
        self._failed_step: int | None = None
        self._rehearsal = Rehearsal(faults, self.cluster)
        alive = self._alive_now()
        if set(plan.devices) - alive:
            raise UserError(f"initial plan uses device(s) {sorted(set(plan.devices) - alive)} that are not up")
        self._reported_alive = set(alive)
        self.log: list[tuple[str, int, float]] = []  # (event, step_index, seconds), like SimulatedPipeline.log
        self.move_reports: list[MoveReport] = []
        if runtime.group is not None and runtime.group.size < self.cluster.size:
            raise UserError(f"the worker group has {runtime.group.size} workers but the cluster {self.cluster.size} devices")
        if runtime.started:
            raise UserError("pass a runtime that has not started yet: the handle pins device d to worker d")
        runtime.start(members=sorted(alive), slots={d: d for d in range(self.cluster.size)}, size=self.cluster.size)

    def set_faults(self, faults: FaultSchedule) -> None:
        """Rehearse ``faults`` from now on, indexed by calls to :meth:`run_iteration` as before (the knobs pushed
        and the kills armed come from it: the rehearsal is rebuilt with it)."""
        faults.validate(self.cluster)
        self.faults = faults
        self._rehearsal = Rehearsal(faults, self.cluster)

    # ----- PipelineHandle -----
    def current_plan(self) -> Plan:
        return self.runtime.plan

    def nominal_cluster(self) -> Cluster:
        return self.cluster

    def alive_devices(self) -> tuple[int, ...]:
        return tuple(sorted(self._alive_now()))

    @property
    def iteration(self) -> int:
        """Completed training iterations (goes back on a from-checkpoint restart)."""
        return self.runtime.step

    def run_iteration(self) -> IterationMetrics:
        k = self.step_index
        self.step_index += 1
        plan = self.current_plan()
        group = self._group()
        killed = {f.device for f in self.faults.faults if isinstance(f, Kill) and f.at_iteration == k and f.device is not None} - self._dead
        for d in sorted(killed):
            if d in plan.devices:
                group.call("arm_kill", self.runtime.step, devices=[d], what="arm kill")
            elif d in group.rank_of or d in group.slot_of:
                group.kill_worker(d)  # an idle device dies: nobody notices until it is needed
            self._dead.add(d)
        self._push_faults(k, plan)
        alive = self._alive_now()
        lost = tuple(sorted(self._reported_alive - alive))
        new = tuple(sorted(alive - self._reported_alive))
        self._reported_alive = set(alive)
        t0 = time.perf_counter()
        try:
            self._loop.run(self.runtime.step + 1)  # one step through the one loop
            m = self._steps.last
            assert m is not None
        except PipelineActorError as exc:
            if not (exc.died or killed & set(plan.devices)):
                raise
            spent = time.perf_counter() - t0
            if exc.died and exc.device >= 0:
                self._dead.add(exc.device)
            if exc.died:  # a lost node takes all its devices at once: ask every member
                members = sorted(set(group.rank_of) - self._dead)
                self._dead |= group.unresponsive(members, self.runtime.spec.pg_timeout_s + 30.0)
                gone = group.unreachable_slots()
                self._dead |= {d for d in range(self.cluster.size) if group.slot_of.get(d, d) in gone}
            alive = self._alive_now()
            lost = tuple(sorted(set(lost) | (self._reported_alive - alive)))
            self._reported_alive = set(alive)
            self._failed_step = self.runtime.step
            self.log.append(("failed", k, spent))
            return IterationMetrics(self.runtime.step, spent, plan, completed=False, lost_devices=lost, new_devices=new)
        self.last_measured = m
        self.log.append(("iteration", k, m.iteration_s))
        return to_controller_metrics(m, self.runtime.step - 1, plan, lost, new)

    def apply_move(self, new_plan: Plan) -> MoveReport:
        self._check_plan(new_plan)
        t0 = time.perf_counter()
        old = self.current_plan()
        transfers = move_transfers(old, new_plan, self.profile, self.cluster, frozenset(self._dead))
        self._check_survivors()
        reports = self.runtime.move_live(new_plan, [(t.src, t.dst, t.first, t.last) for t in transfers], sorted(self._alive_now()))
        self._failed_step = None
        stall = time.perf_counter() - t0
        self.log.append(("move", self.step_index, stall))
        self.last_move_reports = reports
        report = MoveReport(float(sum(int(r["bytes_sent"]) for r in reports)), stall, new_plan)
        self.move_reports.append(report)
        return report

    def restart(self, new_plan: Plan, from_checkpoint: bool) -> RestartReport:
        self._check_plan(new_plan)
        t0 = time.perf_counter()
        runtime, group = self.runtime, self._group()
        before = runtime.step
        source: str | Path | None = None
        if not from_checkpoint and self._failed_step is None:
            # A planned restart keeps the live state: write it out first, read it back after.
            base = runtime.checkpoint_dir or Path(tempfile.mkdtemp(prefix="raypipe-restart-"))
            source = runtime.save_checkpoint(ckpt.step_dir(base, runtime.step))
        else:
            source = runtime.latest()
        group.deaths_known()  # survivors' failed tasks drain before the new setup
        # no checkpoint yet (source None): the seed is the last consistent state
        runtime.restart_on(new_plan, source, members=sorted(self._alive_now()), slots={d: d for d in range(self.cluster.size)})
        self._failed_step = None
        downtime = time.perf_counter() - t0
        self.log.append(("restart", self.step_index, downtime))
        return RestartReport(downtime, before - runtime.step, new_plan)

    # ----- helpers -----
    def _group(self) -> WorkerGroup:
        assert self.runtime.group is not None
        return self.runtime.group

    def _alive_now(self) -> set[int]:
        return set(self.faults.alive_at(self.cluster, self.step_index)) - self._dead

    def _check_plan(self, plan: Plan) -> None:
        check_plan_alive(plan, self.profile.num_blocks, self.cluster, self._alive_now())
        if plan.num_microbatches != self.runtime.num_microbatches:
            raise UserError("a live move cannot change the number of micro-batches (the data path is fixed)")

    def _check_survivors(self) -> None:
        """After a failed iteration, continuing live is exact only if no survivor took that step."""
        if self._failed_step is None:
            return
        plan = self.current_plan()
        alive = sorted(set(self._group().rank_of) & self._alive_now())
        states = self._group().call("status", devices=alive, what="status after failure", timeout_s=self.timeout_s)
        stepped = [s["device"] for s in states if s["completed_step"] >= self._failed_step and s["device"] in plan.devices]
        if stepped:
            raise RuntimeError(f"device(s) {stepped} completed the failed step {self._failed_step}; "
                               "live state is inconsistent, restart from a checkpoint instead")

    def _push_faults(self, k: int, plan: Plan) -> None:
        """Knobs of step ``k`` to the plan's devices (kills are armed by :meth:`run_iteration`)."""
        self._rehearsal.push(self._group(), plan, k, kills=False)


# ----- the demo's entry point -----
@dataclass(frozen=True)
class AdaptiveEvent:
    step: int
    kind: str  # "slowdown", "throttle", "kill", "join", "decision", "move", "path-move", "restart", "drop-replicas"
    detail: str
    seconds: float = 0.0


@dataclass
class AdaptiveRun:
    """One controller-driven run: per-step timing and throughput, and what happened when."""

    iteration_s: list[float]
    samples_per_s: list[float]
    plans: list[str]
    states: list[str]
    events: list[AdaptiveEvent]
    records: list[StepRecord]
    moved_bytes: list[float]  # per live move, measured
    controller: Controller = field(repr=False)

    def summary(self) -> str:
        lines = []
        for e in self.events:
            extra = f" ({e.seconds * 1e3:.1f} ms)" if e.seconds else ""
            lines.append(f"step {e.step:>3} {e.kind:<13} {e.detail}{extra}")
        return "\n".join(lines)


def _fault_events(faults: FaultSchedule, steps: int) -> list[AdaptiveEvent]:
    out = []
    for f in faults.faults:
        if f.at_iteration >= steps:
            continue
        if isinstance(f, Slowdown):
            out.append(AdaptiveEvent(f.at_iteration, "slowdown", f"device {f.device} computes {f.factor:g}x slower"))
        elif isinstance(f, Throttle):
            what = f"{f.gbps:g} Gb/s" if f.gbps is not None else f"+{f.delay_per_byte:g} s/byte"
            out.append(AdaptiveEvent(f.at_iteration, "throttle", f"link {f.src}->{f.dst} at {what}"))
        elif isinstance(f, Kill):
            out.append(AdaptiveEvent(f.at_iteration, "kill", f"device {f.device} dies"))
        elif isinstance(f, Join):
            out.append(AdaptiveEvent(f.at_iteration, "join", f"device {f.device} becomes available"))
    return out


def run_adaptive(runtime_or_handle: Union[PipelineRuntime, RayPipeline], controller_config: ControllerConfig,
                 iterations: int, faults: FaultSchedule | Sequence[Any] = FaultSchedule(), *,
                 profile: Profile | None = None, cluster: Cluster | None = None) -> AdaptiveRun:
    """Drive ``iterations`` controller steps over the real runtime with ``faults`` injected.

    Accepts a not-yet-started runtime (a :class:`RayPipeline` is built around it) or a handle.
    """
    schedule = faults if isinstance(faults, FaultSchedule) else FaultSchedule(tuple(faults))
    if isinstance(runtime_or_handle, RayPipeline):
        handle = runtime_or_handle
        handle.set_faults(schedule)
    else:
        handle = RayPipeline(runtime_or_handle, cluster, schedule, profile)
    controller = Controller(handle, handle.profile, controller_config)
    first, moves_before = handle.step_index, len(handle.move_reports)
    records: list[StepRecord] = []
    plans: list[str] = []
    try:
        for _ in range(iterations):
            records.append(controller.step())
            plans.append(handle.current_plan().describe())  # the plan in force after this step's action
    finally:
        controller.close()  # no background re-planning outlives the run; model() stays readable
    events = [e for e in _fault_events(schedule, first + iterations) if e.step >= first]
    for r in records:
        step = first + r.step
        if isinstance(r.decision, Switch):
            events.append(AdaptiveEvent(step, "decision", f"switch: {r.decision.option.label}, predicted gain "
                                        f"{r.decision.gain_s * 1e3:.1f} ms/iteration", r.decision_s))
        elif isinstance(r.decision, Stay):
            events.append(AdaptiveEvent(step, "decision", f"stay: {r.decision.reason}", r.decision_s))
        elif r.decision is not None:
            events.append(AdaptiveEvent(step, "decision", type(r.decision).__name__, r.decision_s))
        if r.action:
            events.append(AdaptiveEvent(step, r.action, f"-> {plans[r.step]}", r.action_s))
    events.sort(key=lambda e: e.step)  # stable: faults, then decision, then action within a step
    rows = handle.batch_rows
    return AdaptiveRun(
        [r.iteration_s for r in records],
        [rows / r.iteration_s if r.completed and r.iteration_s > 0 else 0.0 for r in records],
        plans, [r.state.value for r in records], events, records,
        [m.bytes_moved for m in handle.move_reports[moves_before:]], controller,
    )
