"""``ElasticJob``: one job, one loop — training, adaptation, failures, preemptions and prices together.

::

    job = ElasticJob(TrainConfig(...), ScalingConfig(devices=4), RunConfig(storage="s3://b/run"),
                     AdaptConfig(), SpotConfig(notices=(InjectedNotice(10, 30.0),)))
    result = job.fit(24)

The job is the one training loop (:class:`~orchestrator.train.loop.TrainingLoop`: pipelined dispatch,
iteration k+1 submitted before k is gathered; failures counted once) over a
:class:`~orchestrator.train.runtime.PipelineRuntime`, which owns the workers, the plan, the step and the
checkpoints, with every policy on: this class is the loop's :class:`~orchestrator.train.loop.Policies`.
Between iterations the policies return decision values and the job carries them out through the runtime's
primitives:

- the controller's arbiter (:mod:`orchestrator.adapt`): stay, or live two-worker moves;
- the evacuation policy (:func:`~orchestrator.elastic.evacuation.plan_evacuation`) on a preemption
  notice: live moves off the doomed devices with an asynchronous insurance checkpoint, or
  checkpoint → migration → restore with the reason recorded;
- the spot policy (:mod:`cloud.migration`): stay, or migrate when a price change makes it pay;
- the failure policy (:func:`~orchestrator.adapt.policies.on_worker_death`): after a death without notice the
  survivors recover in place, or every worker restarts from the newest checkpoint, or the job gives up past
  ``max_failures``;
- growth (:mod:`orchestrator.elastic.growth`): devices that join get stage actors, and blocks by the
  arbiter's live moves when that pays.

A decision due at a known step (a checkpoint, a notice, a rehearsed fault) stops the loop from submitting past
it; every action is carried out after the step in flight is drained. Every decision is one line of
``events.jsonl``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import deque
import statistics
from datetime import datetime, timezone
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from actors import checkpoint as ckpt
from actors import storage
from actors.group import PipelineActorError, WorkerGroup
from actors.metrics import MeasuredIteration
from orchestrator.core.cluster import flat
from orchestrator.adapt.controller import Act, Controller
from orchestrator.adapt.handle import MoveReport, RestartReport, move_transfers
from orchestrator.adapt.live import to_controller_metrics
from orchestrator.adapt.rehearsal import Rehearsal
from orchestrator.adapt.policies import (DeathDecision, GiveUp, RecoverInPlace, Restart, on_worker_death,
                                         planner_plan)
from orchestrator.core.errors import UserError
from orchestrator.elastic.actions import Adapt, CommitUpload, Evaluate, JobAction, Leave, Preempt, Relocate, Snapshot
from orchestrator.train.callbacks import Callback, CallbackError, Callbacks, Checkpoint, Progress, StartInfo, StepInfo, Stop, phase
from orchestrator.train.discovery import connect
from orchestrator.elastic.evacuation import Evacuate, Fallback, Notice, check_notice, plan_evacuation
from orchestrator.elastic.job_config import AdaptConfig, RunConfig, ScalingConfig, SpotConfig, TrainConfig
from orchestrator.train.fit_result import KEPT_METRICS, JobResult
from orchestrator.elastic.checkpoint_policy import CheckpointPolicy
from orchestrator.elastic.growth import Growth, check_joins
from orchestrator.elastic.notices import Notices
from cloud.migration import MigrationSkipped
from orchestrator.elastic.job_spot import PriceView, build_price_view, profile_model, relocate, spot_decision
from orchestrator.elastic.run import RunState, open_run
from orchestrator.elastic.lease import Lease
from orchestrator.elastic.ledger import Ledger
from orchestrator.elastic import run_record
from orchestrator.elastic.run_record import Live, MigrationRequest, StageStatus
from orchestrator.elastic.signals import JobFailed, JobStopped, MigrationRequested, StopSignals
from orchestrator.core.plan import Plan, straight_plan
from orchestrator.train.recovery import InPlaceImpossible, InPlaceRecovery
from orchestrator.train.runtime import PipelineRuntime
from orchestrator.train.loop import TrainingLoop, every


class ElasticJob:
    """See the module docstring. ``notify`` is safe to call from any thread."""

    def __init__(self, train: TrainConfig, scaling: ScalingConfig = ScalingConfig(), run: RunConfig = RunConfig(),
                 adapt: AdaptConfig = AdaptConfig(), spot: SpotConfig = SpotConfig(),
                 clock: Callable[[], float] = time.monotonic, workers: WorkerGroup | None = None,
                 callbacks: Sequence[Callback] = ()) -> None:
        """``workers``: an existing pool of stage workers (slot ``d`` runs device ``d``) to use
        instead of starting one, kept alive afterwards (tests share one pool). ``callbacks``: the user's
        (:mod:`orchestrator.train.callbacks`), called in order after the built-in progress line."""
        self.callbacks = Callbacks([*([Progress()] if run.progress else []), *run.callbacks, *callbacks])
        for n in spot.notices:
            bad = sorted(d for d in n.devices or () if not 0 <= d < scaling.devices)
            if bad:
                raise UserError(f"SpotConfig: injected notice for device(s) {bad} that the job does not use (devices 0..{scaling.devices - 1})")
        self.cluster = scaling.cluster or flat(scaling.capacity, 10.0)
        adapt.faults.validate(self.cluster)
        check_joins(adapt.faults.faults, scaling.devices, scaling.capacity)
        self.train, self.scaling, self.run, self.adapt, self.spot = train, scaling, run, adapt, spot
        self.clock = clock
        storage.check_writable(run.storage)  # unreachable storage / missing credentials: one line, before any actor
        say = phase if run.progress else (lambda text: None)  # no silence before step 0: each start-up phase is a line
        say(f"profiling the model's blocks on this machine ({scaling.devices} devices requested)")
        self.profile = profile_model(train, scaling.devices)
        if scaling.devices > self.profile.num_blocks:  # a worker per device would hold nothing, and cost its memory
            raise UserError(f"ScalingConfig: devices={scaling.devices} but the model has {self.profile.num_blocks} blocks; "
                            f"at most {self.profile.num_blocks} devices can hold blocks (cut it finer or use fewer devices)")
        # the location is the run: another model's checkpoints are refused here, before anything is written
        self.opened = open_run(str(run.storage), self.profile, train.num_microbatches, train.seed,
                               _describe(train.optimizer_factory), run.resume, run.run_id, run.cluster, _data_fingerprint(train))
        self.lease = Lease(str(run.storage), run.cluster)  # one writer per run: taken before anything is written
        self.lease.take()
        try:
            self._build(train, scaling, run, adapt, workers, say)
        except BaseException:
            self.lease.release()
            raise

    def _build(self, train: TrainConfig, scaling: ScalingConfig, run: RunConfig, adapt: AdaptConfig,
               workers: WorkerGroup | None, say: Callable[[str], None]) -> None:
        """The rest of the job, once it holds the run's lease."""
        say("connecting to Ray")
        connect(None)  # RAY_ADDRESS (as under `ray job submit`) or the local instance; a dead address is one line
        # every worker failure is the failure policy's and an event; the results of steps in flight that a
        # failure discards would otherwise print their tracebacks when Ray collects them
        os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
        if scaling.plan is None:
            say(f"planning {self.profile.num_blocks} blocks over {scaling.devices} devices ({scaling.planner})")
        plan = scaling.plan or planner_plan(self.profile, self.cluster, tuple(range(scaling.devices)),
                                            straight_plan([0, self.profile.num_blocks], train.num_microbatches), scaling.planner,
                                            straight=scaling.straight)
        self.runtime = PipelineRuntime(train.model_factory, train.loss_fn, train.optimizer_factory, train.data_fn,
                                       train.num_microbatches, plan=plan, checkpoint_dir=run.storage, seed=train.seed,
                                       use_gpu=scaling.use_gpu, workers=workers, training=train.training,
                                       run_id=self.opened.record.run_id, eval_data_fn=train.eval_data_fn,
                                       hang_timeout_s=run.hang_timeout_s, storage_retry_s=run.storage_retry_s)
        self.loop = TrainingLoop(self.runtime, self, run.pipelined)  # dispatches, counts failures; this job decides
        self.runstate = RunState(str(run.storage), self.opened, run.events_path())
        self._skipped_told = 0  # runtime.skipped_checkpoints already in the event log
        self.alive: set[int] = set(range(scaling.devices))
        self.controller: Controller | None = None
        self.rehearsal = Rehearsal(adapt.faults, self.cluster)
        self.iteration_s: list[float] = []
        self.records: list[dict[str, Any]] = []
        self.last_metrics: MeasuredIteration | None = None
        self.notices = Notices(self.spot, self.clock)
        self._stop_signals: StopSignals | None = None  # SIGTERM/SIGINT while fit runs
        self._recovering: tuple[float, dict[str, Any]] | None = None  # a recovery's event, due when a step completes after it
        self.checkpoints = CheckpointPolicy(run)
        self.moves = self.restarts = 0
        self.move_pairs: list[tuple[int, int]] = []  # (from, to) of every block hand-over, in order
        self.growth = Growth(self)
        self._prices: PriceView | None = None  # built on first use (price_view)
        self.target_steps = 0
        self._stopped_for: str | None = None  # a callback's Stop ended this fit
        before = self.opened.record.live
        self.ledger = Ledger(before.usd_total if before is not None else 0.0, before.usd_lost if before is not None else 0.0)
        self._last_step: StepInfo | None = None  # what the run record's status shows
        self._eval_loss: float | None = None  # the newest evaluation's
        self._fit_metrics: deque[MeasuredIteration] = deque(maxlen=KEPT_METRICS)  # the current fit's, for its result

    # ----- inputs -----
    def notify(self, devices: tuple[int, ...], seconds_left: float, source: str = "injected") -> None:
        """A preemption notice for ``devices`` with ``seconds_left`` (from any thread; handled between iterations)."""
        self.notices.notify(devices, seconds_left, source)

    # ----- the loop -----
    def fit(self, steps: int) -> JobResult:
        """Train to step ``steps``: submit ahead → complete → observe → the policies decide → the loop acts."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise UserError(f"fit(steps) needs a whole number of steps >= 1, not {steps!r}")
        start = time.perf_counter()
        self._start()
        if self.runstate.fit_finished:  # a fit after a finished one: the run is running again
            self.runstate.started(self.runtime.step)
        target = self.target_steps = steps
        first = self.runtime.step
        self._watch(target)
        self._stop_signals = stop = StopSignals()
        self._stopped_for = None
        self._fit_metrics.clear()
        resumed = self.opened.resume_step if first == self.opened.resume_step else None
        self.callbacks.start(StartInfo(first, target, self.runstate.run_id, str(self.run.storage), self.runtime.plan.describe(), resumed))
        try:
            if self.callbacks.failure is not None:  # a callback that failed in on_start
                raise self.callbacks.failure
            self.loop.run(target)
            self._finish()
        except UserError as exc:  # the user's mistake (a callback, data_fn, loss_fn, ...): recorded, never retried
            self._user_failed(exc)
            raise
        except storage.StorageFailed as exc:  # a checkpoint the store did not take: the run stays 'running' for a relaunch
            self.emit("storage_failed", step=self.runtime.step, error=str(exc))
            raise
        finally:
            stop.restore()
            self._stop_signals = None
            self.notices.stop_watching()
        losses = {s: self.runtime.history[s] for s in range(first, target) if s in self.runtime.history}
        if self._stopped_for is None:
            self.emit("job_finished", step=self.runtime.step, plan=self.runtime.plan.describe(), final_loss=losses.get(target - 1),
                      usd_job=self._usd_job())
            self.runstate.fit_done(self.runtime.step, self._live())  # 'finished' when the job closes: fit(M) may follow
        result = JobResult(self.runtime.step, losses, self.runtime.plan, list(self.records), time.perf_counter() - start,
                           self.moves, self.restarts, list(self._fit_metrics), [],
                           {d.device: d.node_id for d in self.runtime.devices()})
        self.callbacks.end(result)
        return result

    def _start(self) -> None:
        """Workers up, resumed from the run's newest committed checkpoint (if any), ``job_started``."""
        runtime = self.runtime
        if runtime.started:
            return
        for skipped in self.opened.skipped:  # damaged checkpoints the run's opening passed over, before the resume
            self.emit("checkpoint_skipped", path=skipped.location, reason=skipped.reason)
        if self.opened.data_changed:
            self.emit("data_changed", reason="resume='force': the run goes on with other data than its checkpoints were trained on")
        if self.opened.rebuilt is not None:
            print(f"[raypipe] {self.opened.rebuilt}", flush=True)
            self.emit("run_record_rebuilt", reason=self.opened.rebuilt)
        if self.run.progress:
            phase(f"starting {self.scaling.devices} stage actors")
        runtime.start(members=sorted(self.alive), slots={d: d for d in range(self.scaling.devices)}, size=self.scaling.devices)
        resumed = None
        if self.opened.resume_from is not None:
            resumed = runtime.restore(self.opened.resume_from)
            self.checkpoints.resumed(resumed)
        self.emit("job_started", devices=[d.event() for d in runtime.devices()],
                  plan=runtime.plan.describe(), step=runtime.step, storage=str(self.run.storage), run_id=self.runstate.run_id,
                  cluster=self.run.cluster, resumed_from=resumed, offer=self._offer())
        self._usd_job()  # the ledger knows the offer's price from the start
        idle = sorted(set(range(self.scaling.devices)) - set(runtime.plan.devices))
        if idle:  # said once, on stdout and in the log: the user asked for these devices
            why = (f"the {self.scaling.planner} planner's fastest plan for this model uses {len(runtime.plan.devices)} of the "
                   f"{self.scaling.devices} devices (another stage would cost more in transfers than it saves)"
                   if self.scaling.plan is None else "the given plan does not use them")
            print(f"[raypipe] device(s) {idle} idle: {why}; the controller may give them blocks later", flush=True)
            self.emit("devices_idle", devices=idle, reason=why)
        self.runstate.started(runtime.step)

    def _watch(self, target: int) -> None:
        """The policies' horizon (moves pay over the steps left to ``target``) and the cloud watchers."""
        if self.adapt.enabled and self.controller is None:
            self.controller = Controller(self.profile, self.cluster, self.runtime.plan, tuple(sorted(self.alive)),
                                         replace(self.adapt.controller, total_iterations=target))
        elif self.controller is not None:  # a later fit
            self.controller.set_horizon(target)
        if self.spot.enabled and self.spot.watch:  # one watcher on each node of the job and the driver's
            import ray

            self.notices.watch({d.node_id for d in self.runtime.devices()} | {ray.get_runtime_context().get_node_id()})

    # ----- the loop's questions (orchestrator.train.loop.Policies) -----
    @property
    def failures(self) -> int:
        """Worker deaths so far (counted by the loop, once each)."""
        return self.loop.failures

    def before(self, step: int) -> None:
        """A stop signal ends the job here; the rehearsal's knobs for ``step`` reach the workers."""
        if self._stop_signals is not None and self._stop_signals.received is not None:
            self._stop(self._stop_signals.received)
        self.rehearsal.push(self.runtime, self.runtime.plan, step)

    def run_length(self, step: int, target: int) -> int:
        return 1  # the policies observe every step

    def hold(self, done: int, target: int) -> bool:
        return self._hold(done)

    def completed(self, run: Sequence[MeasuredIteration]) -> None:
        self.iteration_s.extend(m.iteration_s for m in run)
        self._fit_metrics.extend(run)
        if self._recovering is not None:
            self._recovered()
        self._usd_job()
        for m in run:
            info = self._last_step = StepInfo(m.step + 1, self.target_steps, m.loss, m.iteration_s,
                                              m.rows / m.iteration_s if m.rows and m.iteration_s > 0 else 0.0, m.lr,
                                              self.moves, self.restarts, self.loop.failures, self.ledger.usd_per_hour,
                                              round(self.ledger.total, 6))
            self.callbacks.step_end(info)

    def between(self, run: Sequence[MeasuredIteration], target: int) -> None:
        """Between iterations: each policy in turn looks at the step just gathered and returns what it wants done
        (typed actions, :mod:`orchestrator.elastic.actions`); the job carries each out (:meth:`_act`, the one
        carrier) after the step in flight is drained — once, before the first action of the batch. A policy sees
        what the ones before it did (a plan an evacuation changed, a checkpoint just written)."""
        self.last_metrics = run[-1]
        for policy in (self._user_policy, self._checkpoint_upload_policy, self._notice_policy, self._adapt_policy,
                       self._spot_policy, self._cadence_policy):
            for action in policy(run[-1], target):
                self.loop.finish_in_flight()  # the one drain: a no-op after the batch's first action
                self._act(action)
                if self.loop.stopped:
                    return

    # ----- the policies: each owns its cadence and returns actions for the carrier (inputs they read on the way,
    # such as notices polled or workers that came up, they record themselves) -----
    def _user_policy(self, m: MeasuredIteration, target: int) -> Sequence[JobAction]:
        """The evaluation due at this step, then what the user asked for since the last step: a callback's
        failure ends the run (raised to ``fit``), then the callbacks' checkpoints and stops in order; a stop
        requested from outside (``orchestrator stop``) last."""
        actions: list[JobAction] = [Evaluate()] if every(self.train.eval_every, self.runtime.step) else []
        stop_requested = self.runstate.progress(self.runtime.step, self._live)
        if self.callbacks.failure is not None or self.callbacks.pending or stop_requested:
            self.loop.finish_in_flight()  # the step in flight completes (its callbacks run) before they are read
        if self.callbacks.failure is not None:
            raise self.callbacks.failure
        return actions + self.callbacks.take() + ([Stop("requested by orchestrator stop")] if stop_requested else [])

    def _checkpoint_upload_policy(self, m: MeasuredIteration, target: int) -> Sequence[JobAction]:
        """A background checkpoint uploaded during the step after it is committed now, so that a crash from here
        on loses at most the steps since it."""
        return [CommitUpload()] if self.runtime.upload_pending and self.runtime.step > self.checkpoints.saved_at else []

    def _notice_policy(self, m: MeasuredIteration, target: int) -> Sequence[JobAction]:
        """Evacuated devices leave the process group before their deadline; notices from outside (cloud watchers,
        Ray's drain requests) and rehearsed ones are each handled (:meth:`_preempted`)."""
        if not self.spot.enabled:
            return []
        return self.notices.due(self.runtime.step, self.runtime.plan, self.alive, self.runtime.devices)

    def _adapt_policy(self, m: MeasuredIteration, target: int) -> Sequence[JobAction]:
        """Devices that joined or whose node left (growth's), then the controller's arbiter: stay, or live moves."""
        self.growth.poll(self.runtime.step)
        self._idle_lost()
        if self.controller is None or self.runtime.step >= target:
            return []
        plan = self.runtime.plan
        out = self.controller.observe(to_controller_metrics(m, self.runtime.step - 1, plan), plan, tuple(sorted(self.alive)))
        if out.act is None:
            self.growth.decided(out.record, [])
            return []
        return [Adapt(out)]

    def _spot_policy(self, m: MeasuredIteration, target: int) -> Sequence[JobAction]:
        """Stay, or move the job where a price change makes it pay (a skipped check is recorded with why)."""
        if not self.spot.enabled or self.runtime.step >= target:
            return []
        move = spot_decision(self, self.runtime.step, max_price_age_s=self.spot.max_price_age_s)
        if isinstance(move, MigrationSkipped):
            self.emit("migration_skipped", step=self.runtime.step, reason=move.reason, age_s=move.age_s,
                      max_age_s=move.max_age_s, target=move.target.label(), refresh=move.refresh)
            return []
        return [] if move is None else [Relocate(move)]

    def _cadence_policy(self, m: MeasuredIteration, target: int) -> Sequence[JobAction]:
        """The periodic checkpoint and the in-memory snapshot, each on its own cadence."""
        if self.runtime.step >= target:
            return []
        return self.checkpoints.due(self.runtime.step, self.iteration_s[-5:], self.failures)

    # ----- the carrier: the only code that acts between iterations -----
    def _act(self, action: JobAction) -> None:
        """Carry ``action`` out, with nothing in flight."""
        if isinstance(action, Evaluate):
            t0 = time.perf_counter()
            self._eval_loss = loss = self.runtime.evaluate(self.train.eval_steps)
            if self.train.training.lr_scheduler is not None:  # ReduceLROnPlateau steps on it (actors.training.BlockSchedule)
                self.runtime.step_on_metric(loss)
            self.emit("eval", step=self.runtime.step, loss=loss, batches=self.train.eval_steps,
                      seconds=round(time.perf_counter() - t0, 4))
        elif isinstance(action, Checkpoint):
            self.checkpoint_now(action.reason)
        elif isinstance(action, Stop):
            self._commit_final()
            self._stopped_for = action.reason
            self.emit("stopped", step=self.runtime.step, reason=action.reason, usd_job=self._usd_job())
            self.runstate.ended("stopped", self.runtime.step, live=self._live())
            self.loop.stop()
        elif isinstance(action, CommitUpload):
            t0 = time.perf_counter()
            where = self._finish_checkpoint()
            self.emit("checkpoint_committed", step=self.checkpoints.saved_at, path=str(where), wait_s=round(time.perf_counter() - t0, 4))
        elif isinstance(action, Leave):
            t0 = time.perf_counter()
            self.switch_live(self.runtime.plan)  # the process group is re-formed without them
            self.notices.left()
            self.emit("evacuated_left", devices=list(action.notice.devices), step=self.runtime.step,
                      stall_s=round(time.perf_counter() - t0, 4))
        elif isinstance(action, Preempt):
            self._preempted(action.notice)
        elif isinstance(action, Adapt):
            act = action.decided.act
            assert self.controller is not None and act is not None
            mark = len(self.move_pairs)
            record = self.controller.acted(action.decided, self._carry_out(act))
            self.emit("adapt", step=self.runtime.step, action=record.action, seconds=round(record.action_s, 4),
                      plan=self.runtime.plan.describe(), decision=type(record.decision).__name__)
            self.growth.decided(record, self.move_pairs[mark:])
        elif isinstance(action, Relocate):
            relocate(self, action.move, forced=False, reason="price")
        else:
            assert isinstance(action, Snapshot)
            self.runtime.snapshot_in_memory()  # copied while the next step runs
            if self.checkpoints.first_snapshot():  # what in-memory snapshots cost, once (waited for, this once)
                held = self.runtime.settle_snapshots()
                self.emit("snapshots", step=self.runtime.step, every=self.run.snapshot_every,
                          bytes_per_worker={str(d): int(b) for d, b in held.items()})

    def _usd_job(self) -> float:
        """This job's dollars so far, at the price of the offer it runs on (see :mod:`orchestrator.elastic.ledger`)."""
        return round(self.ledger.accrue(self._prices.current.usd_per_hour if self._prices is not None else None), 6)

    def _live(self) -> Live:
        """What ``orchestrator status`` shows of this job (the run record's ``live``, at most once a second)."""
        self._usd_job()
        last, recent = self._last_step, self.iteration_s[-5:]
        median = statistics.median(recent) if recent else None
        nodes = {d.device: d.node_id for d in self.runtime.devices()}
        plan = tuple(StageStatus((s.first, s.last), s.devices, tuple(str(nodes.get(d, "")) for d in s.devices))
                     for s in self.runtime.plan.stages)
        return Live(self.target_steps, loss=last.loss if last is not None else None, eval_loss=self._eval_loss,
                    samples_per_s=round(last.samples_per_s, 3) if last is not None else None,
                    eta_s=round(median * max(0, self.target_steps - self.runtime.step), 1) if median is not None else None,
                    plan=plan, recoveries=self.loop.failures, moves=self.moves, usd_per_hour=self.ledger.usd_per_hour,
                    usd_total=round(self.ledger.total, 6), usd_job=round(self.ledger.job, 6),
                    usd_lost=round(self.ledger.before_lost + self.ledger.lost, 6),
                    samples=self.runtime.step * (self.last_metrics.rows if self.last_metrics is not None else 0))

    def _user_failed(self, exc: UserError) -> None:
        """The run ends on the user's mistake: ``failed`` in the run record with the cause, never relaunched.
        A callback's failure leaves the workers consistent: the step reached is committed first."""
        if isinstance(exc, CallbackError):
            try:
                self._commit_final()
            except (PipelineActorError, UserError):
                pass  # the newest committed checkpoint stands
        trace = str(getattr(exc, "trace", "") or "")  # the user's own frames (a callback's, or code on a worker)
        self.emit("user_error", step=self.runtime.step, error=" ".join(str(exc).split()), traceback=trace)
        self.runstate.ended("failed", self.runtime.step, live=self._live())

    def failed(self, exc: PipelineActorError, failures: int) -> None:
        self._failed(exc, failures)

    def _finish(self) -> None:
        self.loop.finish_in_flight()
        if self._recovering is not None:
            self._recovered()
        if self.callbacks.failure is not None:
            raise self.callbacks.failure
        for action in self.callbacks.take():  # what the last step's callbacks asked for
            if not self.loop.stopped:
                self._act(action)
        self._commit_final()
        self.growth.finish()

    def _offer(self) -> dict[str, object] | None:
        """The offer this job runs on, when it was given a price catalog (a rehearsal's is stamped now)."""
        if not (self.spot.enabled and self.spot.catalog):
            return None
        stamp = datetime.now(timezone.utc) if self.spot.price_events else None
        return self.price_view(stamp_now=stamp).current.as_event()

    def _commit_final(self) -> None:
        """The run always ends (or stops) on a committed checkpoint of its last step."""
        if self.checkpoints.saved_at != self.runtime.step:
            self.checkpoint_now("final")
        self._finish_checkpoint()

    def _finish_checkpoint(self) -> str | None:
        """Wait for a background upload (if any) and commit it; the run record learns of every commit."""
        where = self.runtime.finish_checkpoint()  # the one place the job commits a background checkpoint
        if where is not None:
            self.runstate.committed(self.checkpoints.saved_at, self.runtime.step)
        return None if where is None else str(where)

    def _stop(self, signum: int) -> None:
        """SIGTERM (Ray's job stop) or SIGINT: finish the step in flight, commit, record, and leave."""
        self.loop.finish_in_flight()
        self._commit_final()
        name = signal.Signals(signum).name
        self.emit("stopped", step=self.runtime.step, signal=name, usd_job=self._usd_job())
        self.runstate.ended("stopped", self.runtime.step, live=self._live())
        stopped = JobStopped(f"stopped by {name} at step {self.runtime.step}; checkpoint committed", signum)
        print(f"stopped: {stopped}", file=sys.stderr, flush=True)
        raise stopped

    def _hold(self, nxt: int) -> bool:
        """Whether a decision is due after the step before ``nxt``: then nothing is submitted ahead."""
        due = self.runtime.upload_pending or self.checkpoints.checkpoint_due(nxt, self.iteration_s[-5:], self.failures) \
            or every(self.run.snapshot_every, nxt) or self.notices.waiting
        due |= every(self.train.eval_every, nxt)
        due |= any(n.at_step == nxt for n in self.spot.notices)
        due |= self.spot.enabled and (any(s == nxt for s, _ in self.spot.price_events) or every(self.spot.migration_check_every, nxt))
        due |= any(f.at_iteration in (nxt, nxt + 1) or getattr(f, "until_iteration", None) in (nxt, nxt + 1)
                   for f in self.adapt.faults.faults)
        return due

    # ----- actions -----
    def _carry_out(self, act: Act) -> list[MoveReport | RestartReport]:
        """The controller's act: live moves in order, or a planned restart (checkpointed first)."""
        if act.kind != "restart":
            return [self.switch_live(p) for p in act.plans]
        before, t0 = self.runtime.step, time.perf_counter()  # the downtime counts the planned checkpoint's write
        source = self.checkpoint_now("planned restart")
        self.restart_on(act.plans[0], source, tuple(sorted(self.alive)))
        return [RestartReport(time.perf_counter() - t0, before - self.runtime.step, act.plans[0])]

    def device_joined(self, device: int) -> None:
        """A worker that came up on capacity that joined (growth) is a device of the job from now on."""
        self.alive.add(device)

    def switch_live(self, plan: Plan, members: set[int] | None = None) -> MoveReport:
        """A live switch to ``plan`` (the controller's moves and evacuation steps); ``members``:
        the devices that stay in the job (default: every alive one). Called with nothing in flight."""
        t0 = time.perf_counter()
        before = self.runtime.plan
        gone = frozenset(set(range(self.cluster.size)) - self.alive)
        transfers = move_transfers(before, plan, self.profile, self.cluster, gone)
        self.move_pairs += list(dict.fromkeys((t.src, t.dst) for t in transfers))
        reports = self.runtime.move_live(plan, [(t.src, t.dst, t.first, t.last) for t in transfers],
                                         sorted(self.alive if members is None else members))
        if any(r.rejoined for r in reports):
            self.notices.left()  # a new process group without the evacuated devices
        self.moves += 1
        return MoveReport(float(sum(r.bytes_sent for r in reports)), time.perf_counter() - t0, plan)

    def _preempted(self, notice: Notice) -> None:
        now = self.clock()
        try:
            check_notice(notice, self.alive, now)
        except UserError as exc:
            self.emit("notice_rejected", devices=list(notice.devices), source=notice.source, reason=str(exc))
            return
        recent = self.iteration_s[-5:]
        iteration_s = statistics.median(recent) if recent else 0.0
        self.emit("preemption_notice", devices=list(notice.devices), source=notice.source,
                  seconds_left=round(notice.deadline - now, 3), step=self.runtime.step)
        decision = (plan_evacuation(self.runtime.plan, notice, self.alive, self.profile, self.cluster, now, self.spot.margin_s,
                                    iteration_s, replan=self._replan) if self.spot.evacuate_live else Fallback("live evacuation is switched off"))
        if isinstance(decision, Evacuate):
            t0 = time.perf_counter()
            insurance = self.runtime.save_checkpoint(background=True)  # snapshot now, upload while training goes on
            self.checkpoints.saved(self.runtime.step, None, background=True)
            for plan in decision.steps:  # the doomed stay members while they hand their blocks over
                self.switch_live(plan)
            self.alive -= set(notice.devices)
            self.notices.evacuated(notice)  # idle members from now on; they leave the process group before the deadline
            stall = time.perf_counter() - t0
            self.emit("preemption_handled", mode="live", reason=decision.reason, lost_steps=0, stall_s=round(stall, 4),
                      iteration_s=round(iteration_s, 4), moves=[list(p) for p in decision.moves], step=self.runtime.step,
                      plan=self.runtime.plan.describe(), insurance_checkpoint=str(insurance))
            return
        self.emit("evacuation_refused", reason=decision.reason, devices=list(notice.devices))
        relocate(self, None, forced=True, reason=decision.reason, notice=notice, iteration_s=iteration_s)

    def _failed(self, exc: PipelineActorError, failures: int) -> None:
        """A worker died without notice (the loop counted it and discarded what was in flight): the failure
        policy decides, the job carries it out."""
        if self._recovering is not None:  # died again before a step completed after the last recovery
            self._recovered(interrupted=True)
        t0, before = self.loop.done_at or time.perf_counter(), self.runtime.step
        recent = self.iteration_s[-5:]
        # the worker that failed, and every worker whose node left with it (slot d runs device d)
        dead = sorted(({exc.device} if exc.device >= 0 else set()) | (self.alive & self.runtime.unreachable()))
        hang = {"hang_detect_s": round(exc.detect_s, 3)} if exc.cause == "hang" and exc.detect_s is not None else {}
        self.emit("worker_failed", step=before, device=exc.device if exc.device >= 0 else None, dead=dead, failures=failures,
                  error=str(exc).splitlines()[0], cause=exc.cause or ("death" if exc.died else "error"), **hang)
        if self.runtime.upload_pending:  # either recovery discards the upload (it never commits): save that step again when due
            self.checkpoints.upload_lost()
        plan = self.runtime.plan
        decision: DeathDecision = on_worker_death(failures, self.run.max_failures, plan, dead, sorted(self.alive),
                                                  in_place=self.run.recover_in_place, hazard=self.runtime.in_place_hazard())
        if isinstance(decision, GiveUp):
            self.emit("job_failed", step=before, failures=failures, max_failures=self.run.max_failures, reason=decision.reason)
            self.runstate.ended("failed", before, live=self._live())
            raise JobFailed(f"{decision.reason} (last: {str(exc).splitlines()[0]})") from exc
        if isinstance(decision, RecoverInPlace):
            try:
                rec = self._recover_in_place(decision)
            except InPlaceImpossible as why:
                decision = Restart(plan, True, f"recovery in place impossible: {why.reason}")
            else:
                self.alive = set(rec.members)  # the survivors keep their processes, idle ones too
                self.notices.left()
                self._recovering = (t0, {"mode": "in_place", "reason": decision.reason, "step": rec.resumed_step,
                                         "lost_steps": before - rec.resumed_step, "source": rec.source,
                                         "blocks_from": dict(rec.blocks_from),
                                         "snapshot_bytes": {str(d): int(b) for d, b in rec.snapshot_bytes.items()},
                                         "iteration_s": round(statistics.median(recent), 4) if recent else None,
                                         "plan": self.runtime.plan.describe(), "devices": [dict(d) for d in rec.devices]})
                return
        assert isinstance(decision, Restart)
        # every device the job has had a worker for, but those whose node left: no worker can start there
        self.alive = set(range(self.growth.placed)) - self.runtime.node_lost()
        self.notices.left()
        self.rehearsal.forget()  # fresh processes: no injected knobs
        self.runtime.recover(exc, self._reachable(plan), sorted(self.alive), self.slot_map())
        self.restarts += 1
        self._recovering = (t0, {"mode": "restart", "reason": decision.reason, "step": self.runtime.step,
                                 "lost_steps": before - self.runtime.step,
                                 "iteration_s": round(statistics.median(recent), 4) if recent else None,
                                 "plan": self.runtime.plan.describe(),
                                 "devices": [d.event() for d in self.runtime.devices()]})

    def _replan(self, devices: Iterable[int]) -> Plan:
        """The job's plan for ``devices``: its planner, from the plan in force (micro-batches, schedule)."""
        return planner_plan(self.profile, self.cluster, tuple(sorted(devices)), self.runtime.plan, self.scaling.planner,
                            straight=self.scaling.straight)

    def _reachable(self, plan: Plan) -> Plan:
        """``plan``, or (if it uses a device whose node left) a plan re-made over the alive devices."""
        if set(plan.devices) <= self.alive:
            return plan
        return self._replan(self.alive)

    def _idle_lost(self) -> None:
        """Devices without blocks whose node left (a node that joined, or an evacuated device's) stop being
        members now: nobody computes on them, so no step fails for them, and the next re-formation of the
        process group would wait for them. Read at the growth poll's pace (growth on) or every step."""
        if not self.runtime.started or self.scaling.max_devices is None:
            return
        idle = self.alive - set(self.runtime.plan.devices)
        gone = sorted(idle & self.runtime.unreachable()) if idle else []
        if gone:
            self.alive -= set(gone)
            self.emit("capacity_lost", step=self.runtime.step, devices=gone, reason="their node left; they held no blocks")

    def _recover_in_place(self, decision: RecoverInPlace) -> InPlaceRecovery:
        """The survivors continue on a plan re-made for them. A node that left takes all its workers,
        and Ray may report the node gone only after the first worker's error: then the plan is made
        again for the survivors Ray knows of now, once."""
        dead, survivors = set(decision.dead), decision.survivors
        for attempt in range(2):
            plan = self._replan(survivors)
            try:
                return self.runtime.recover_in_place(sorted(dead), plan, survivors)
            except InPlaceImpossible:
                more = (set(survivors) & self.runtime.unreachable()) - dead
                if attempt or not more or not set(survivors) - more:
                    raise
                dead |= more
                survivors = tuple(sorted(set(survivors) - more))
        raise AssertionError("unreachable")

    def _recovered(self, interrupted: bool = False) -> None:
        """The ``recovered`` event of the last recovery, once the first step after it completed: its
        stall runs from the completion of the last step before the death to that completion
        (detection included)."""
        assert self._recovering is not None
        (since, fields), self._recovering = self._recovering, None
        extra = {"interrupted": True} if interrupted else {}
        stall = time.perf_counter() - since
        redo = float(fields.get("lost_steps") or 0) * float(fields.get("iteration_s") or 0.0)
        self.ledger.lose(stall + redo)
        self.emit("recovered", **fields, stall_s=round(stall, 4), **extra)

    def restart_on(self, plan: Plan, source: str | Path | None, devices: tuple[int, ...]) -> None:
        """Every worker configured afresh on ``plan`` over ``devices`` from the checkpoint ``source``."""
        self.alive = set(devices)
        self.notices.left()
        self.rehearsal.forget()
        self.runtime.restart_on(plan, source, members=sorted(devices), slots=self.slot_map())
        self.restarts += 1
        self.iteration_s.clear()

    def commit_pending(self) -> None:
        """Commit a background checkpoint still uploading (before a restart replaces the workers)."""
        self._finish_checkpoint()

    def request_migration(self, reason: str, target: str, detail: str, commit: bool = True) -> None:
        """A supervised job leaves this cluster: commit the step reached (``commit=False``: a notice
        too short for it, the newest committed step stands), record the request in the run record
        for the supervisor, and stop (the driver exits :data:`EXIT_MIGRATE`)."""
        self.loop.finish_in_flight()
        if commit:
            self._commit_final()
        else:
            self._finish_checkpoint()
        step = self.runtime.step if commit else (self.runstate.record.last_committed or 0)
        self.emit("migration_requested", reason=reason, step=step, target=target, detail=detail, cluster=self.run.cluster,
                  usd_job=self._usd_job())
        self.runstate.ended("migrating", step, MigrationRequest(reason, step, target), live=self._live())
        raise MigrationRequested(f"run {self.runstate.run_id} committed step {step} and asks its supervisor to move it to {target} ({reason})")

    def price_view(self, stamp_now: datetime | None = None) -> PriceView:
        """The job's view of the price catalog, built once (see :func:`~orchestrator.elastic.job_spot.build_price_view`)."""
        if self._prices is None:
            self._prices = build_price_view(self, stamp_now)
        return self._prices

    def slot_map(self) -> dict[int, int]:
        """Device ``d`` is worker slot ``d``, for every device the job has had a worker for."""
        return {d: d for d in range(self.growth.placed)}

    def checkpoint_now(self, why: str) -> str | None:
        if self.checkpoints.saved_at == self.runtime.step:  # saved already (perhaps still uploading): commit and reuse it
            committed = self._finish_checkpoint()
            return committed if committed is not None else str(ckpt.step_dir(str(self.run.storage), self.runtime.step))
        t0 = time.perf_counter()
        background = self.run.async_checkpoints and why == "periodic"
        try:
            where = self.runtime.save_checkpoint(background=background)
        except (PipelineActorError, UserError) as exc:
            self.emit("checkpoint_failed", why=why, step=self.runtime.step, error=str(exc).splitlines()[0])
            return None
        took = time.perf_counter() - t0
        self.checkpoints.saved(self.runtime.step, took, background)
        if not background:
            self.runstate.committed(self.runtime.step, self.runtime.step)
        self.emit("checkpoint", why=why, step=self.runtime.step, path=str(where), stall_s=round(took, 4), background=background)
        return str(where)

    @property
    def checkpoint_s(self) -> float:
        """How long the newest synchronous checkpoint took (a notice must leave room for one)."""
        return self.checkpoints.took_s

    # ----- inspection -----
    def emit(self, event: str, **fields: Any) -> None:
        skipped = self.runtime.skipped_checkpoints  # damaged checkpoints a restore passed over come first, once each
        while self._skipped_told < len(skipped):
            s, self._skipped_told = skipped[self._skipped_told], self._skipped_told + 1
            self.emit("checkpoint_skipped", path=s.location, reason=s.reason)
        record = self.runstate.emit(event, **fields)
        self.records.append(record)
        self.callbacks.event(record)

    def max_abs_diff(self) -> float:
        """Final weights against uninterrupted single-process training on the same data."""
        from actors.reference import ReferenceTrainer, max_difference

        t = self.train
        ref = ReferenceTrainer(t.model_factory, t.loss_fn, t.optimizer_factory, t.data_fn, t.num_microbatches, seed=t.seed,
                               training=t.training)
        evaluations = t.eval_data_fn if t.training.lr_scheduler is not None else None  # ReduceLROnPlateau steps on them
        if evaluations is None:
            ref.train(self.runtime.step)
        for _ in range(ref.step, self.runtime.step):  # with evaluations at the job's cadence
            ref.train(1)
            if evaluations is not None and every(t.eval_every, ref.step):
                ref.step_on_metric(ref.evaluate(evaluations, t.eval_steps))
        return max_difference(self.runtime.state_dicts(), ref.state_dicts())

    def close(self) -> None:
        """The run is ``finished`` if its last ``fit`` was (a stopped, failed or migrating run keeps its status)."""
        if self.controller is not None:
            self.controller.close()  # no background re-planning outlives the job
        if self.runstate.fit_finished:
            self.runstate.ended("finished", self.runtime.step, live=self._live())
        self.runtime.shutdown()
        self.lease.release()

    def __enter__(self) -> "ElasticJob":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """The current weights keyed by the user's names (Hugging Face names, module paths for
        ``split_at`` and ``sequential_blocks``; ``"<block>.<name>"`` for a plain block list), tied
        weights one tensor under all their keys: ``load_state_dict`` them into the user's model."""
        from actors import user_code
        from orchestrator.profiling.export import user_state_dict

        return user_state_dict(user_code.blocks(self.train.model_factory), self.runtime.state_dicts())


def _data_fingerprint(train: TrainConfig) -> str:
    """What identifies the run's data (see :func:`~orchestrator.elastic.run_record.data_fingerprint`)."""
    import dataclasses

    from actors import user_code

    inputs, _ = user_code.batch(train.data_fn, 0)
    fn = train.data_fn
    identity = repr(fn) if dataclasses.is_dataclass(fn) else _describe(fn)  # a TokenFile says its path and sizes
    return run_record.data_fingerprint(identity, int(inputs.shape[0]), tuple(int(s) for s in inputs.shape[1:]), str(inputs.dtype))


def _describe(factory: Any) -> str:
    """A stable description of an optimizer factory (``functools.partial`` and its arguments)."""
    func = getattr(factory, "func", factory)
    name = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', type(func).__name__)}"
    args = getattr(factory, "args", ())
    keywords = getattr(factory, "keywords", {})
    return f"{name}{tuple(args)!r}{sorted(keywords.items())!r}" if (args or keywords) else name


__all__ = ["ElasticJob", "JobFailed", "JobResult", "JobStopped"]
