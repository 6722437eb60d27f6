"""``ElasticJob``: one job, one loop — training, adaptation, failures, preemptions and prices together.

::

    job = ElasticJob(TrainConfig(...), ScalingConfig(devices=4), RunConfig(storage="s3://b/run"),
                     AdaptConfig(), SpotConfig(notices=(InjectedNotice(10, 30.0),)))
    result = job.fit(24)

The loop runs iterations with pipelined dispatch (iteration k+1 is submitted before k is
gathered) on a :class:`~orchestrator.train.trainer.PipelineTrainer`, which owns the workers, the plan,
the step and the checkpoints. Between iterations the policies return decision values and the loop
carries them out through the trainer's public methods:

- the controller's arbiter (:mod:`orchestrator.adapt`): stay, or live two-worker moves;
- the evacuation policy (:func:`~orchestrator.elastic.evacuation.plan_evacuation`) on a preemption
  notice: live moves off the doomed devices with an asynchronous insurance checkpoint, or
  checkpoint → migration → restore with the reason recorded;
- the spot policy (:mod:`cloud.migration`): stay, or migrate when a price change makes it pay;
- the failure policy: a worker death without notice restores the newest checkpoint
  (:meth:`PipelineTrainer.recover`, the one recovery path) until ``max_failures``;
- growth (:mod:`orchestrator.elastic.growth`): devices that join get stage actors, and blocks by the
  arbiter's live moves when that pays.

A pending decision stops the loop from submitting ahead, so actions always happen with no
iteration in flight. Every decision is one line of ``events.jsonl``.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import replace
from typing import Any, Callable

from actors import checkpoint as ckpt
from actors import storage
from actors.group import PipelineActorError, WorkerGroup
from actors.metrics import MeasuredIteration
from orchestrator.core.cluster import flat
from orchestrator.adapt.controller import Controller
from orchestrator.adapt.handle import MoveReport, move_transfers
from orchestrator.adapt.policies import planner_plan
from orchestrator.core.errors import UserError
from orchestrator.train.discovery import connect
from orchestrator.elastic.evacuation import Evacuate, Fallback, Notice, check_notice, plan_evacuation
from orchestrator.elastic.job_config import AdaptConfig, RunConfig, ScalingConfig, SpotConfig, TrainConfig
from orchestrator.train.fit_result import JobResult
from orchestrator.elastic.growth import Growth, check_joins
from orchestrator.elastic.job_spot import JobHandle, profile_model, push_faults, relocate, spot_decision
from orchestrator.elastic.observability import EventLog
from orchestrator.core.plan import Plan, straight_plan
from orchestrator.train.trainer import InFlight, PipelineTrainer


class ElasticJob:
    """See the module docstring. ``notify`` is safe to call from any thread."""

    def __init__(self, train: TrainConfig, scaling: ScalingConfig = ScalingConfig(), run: RunConfig = RunConfig(),
                 adapt: AdaptConfig = AdaptConfig(), spot: SpotConfig = SpotConfig(),
                 clock: Callable[[], float] = time.monotonic, workers: WorkerGroup | None = None) -> None:
        """``workers``: an existing pool of stage workers (slot ``d`` runs device ``d``) to use
        instead of starting one, kept alive afterwards (tests share one pool)."""
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
        connect(None)  # RAY_ADDRESS (as under `ray job submit`) or the local instance; a dead address is one line
        self.profile = profile_model(train)
        plan = scaling.plan or planner_plan(self.profile, self.cluster, tuple(range(scaling.devices)),
                                            straight_plan([0, self.profile.num_blocks], train.num_microbatches), scaling.planner,
                                            straight=True)
        self.trainer = PipelineTrainer(train.model_factory, train.loss_fn, train.optimizer_factory, train.data_fn,
                                       train.num_microbatches, plan=plan, checkpoint_dir=run.storage, seed=train.seed,
                                       max_failures=run.max_failures, progress=False, use_gpu=scaling.use_gpu,
                                       async_checkpoints=run.async_checkpoints, workers=workers)
        where = run.events_path()
        self.events = EventLog(where) if where is not None else None
        self._skipped_told = 0  # trainer.skipped_checkpoints already in the event log
        self.alive: set[int] = set(range(scaling.devices))
        self.controller: Controller | None = None
        self.handle = JobHandle(self)
        self.iteration_s: list[float] = []
        self.records: list[dict[str, Any]] = []
        self.last_metrics: MeasuredIteration | None = None
        self._notices: list[Notice] = []
        self._lock = threading.Lock()
        self._ahead: InFlight | None = None
        self._last_done: float | None = None
        self.checkpoint_s = 1.0
        self._fired: set[int] = set()  # injected notices already delivered
        self._drained: set[str] = set()  # Ray nodes whose drain request was already turned into a notice
        self._drain_polled = 0.0
        # evacuated devices (their notice) still members of the process group, idle: they leave it
        # before their deadline or at the next re-formation, not during the evacuation's stall
        self.leaving: Notice | None = None
        self._node_watch: Any = None  # orchestrator.elastic.node_watch.NodeWatch while fit runs with spot.watch
        self._saved_at = -1  # the step of the newest checkpoint written (a step is saved once)
        self.moves = self.restarts = 0
        self.move_pairs: list[tuple[int, int]] = []  # (from, to) of every block hand-over, in order
        self.growth = Growth(self)
        self.prices: Any = None  # job_spot.PriceView, built when first needed
        self.target_steps = 0
        self.knobs: dict[int, Any] = {}  # rehearsal fault knobs sent to each device
        self.killed: set[Any] = set()  # rehearsal kills already armed

    # ----- inputs -----
    def notify(self, devices: tuple[int, ...], seconds_left: float, source: str = "injected") -> None:
        with self._lock:
            self._notices.append(Notice(tuple(devices), self.clock() + seconds_left, source))

    # ----- the loop -----
    def fit(self, steps: int) -> JobResult:
        if steps < 1:
            raise UserError("fit needs at least one step")
        start = time.perf_counter()
        trainer = self.trainer
        if not trainer.started:
            trainer.start(members=sorted(self.alive), slots={d: d for d in range(self.scaling.devices)}, size=self.scaling.devices)
            self.emit("job_started", devices=[{"device": d["device"], "node_id": d["node_id"], "pid": d["pid"]} for d in trainer.devices()],
                      plan=trainer.plan.describe(), step=trainer.step, storage=str(self.run.storage))
        if self.adapt.enabled and self.controller is None:
            config = replace(self.adapt.controller, total_iterations=trainer.step + steps)
            self.controller = Controller(self.handle, self.profile, config)
        elif self.controller is not None:  # a later fit: moves pay over this run's iterations
            self.controller.config = replace(self.controller.config, total_iterations=trainer.step + steps)
        target = self.target_steps = trainer.step + steps
        first = trainer.step
        if self.spot.enabled and self.spot.watch:  # one watcher on each node of the job and the driver's
            import ray

            from orchestrator.elastic.node_watch import NodeWatch

            nodes = {d["node_id"] for d in trainer.devices()} | {ray.get_runtime_context().get_node_id()}
            self._node_watch = NodeWatch(self.spot.watch, nodes)
        try:
            while trainer.step < target:
                push_faults(self, trainer.step)
                flight = self._ahead or trainer.submit_step()
                self._ahead = None
                nxt = trainer.step + 1
                if self.run.pipelined and nxt < target and not self._hold(nxt):
                    self._ahead = trainer.submit_step(nxt)
                try:
                    m = trainer.complete_step(flight, self._last_done)
                except PipelineActorError as exc:
                    self._failed(exc)
                    continue
                self._last_done = time.perf_counter() if self._ahead is not None else None
                try:
                    self._after(m, target)
                except PipelineActorError as exc:  # a worker died in a drained step or during an action
                    self._failed(exc)
            self._drain()
            trainer.finish_checkpoint()
            self.growth.finish()
        finally:
            if self._node_watch is not None:
                self._node_watch.stop()
                self._node_watch = None
        losses = {s: trainer.history[s] for s in range(first, target) if s in trainer.history}
        self.emit("job_finished", step=trainer.step, plan=trainer.plan.describe(), final_loss=losses.get(target - 1))
        return JobResult(trainer.step, losses, trainer.plan, self.events.read() if self.events else [],
                         time.perf_counter() - start, self.moves, self.restarts)

    def _hold(self, nxt: int) -> bool:
        """Whether a decision is due after the step before ``nxt``: then nothing is submitted ahead."""
        due = self.trainer.upload_pending or self._checkpoint_due(nxt) or bool(self._notices)
        due |= any(n.at_step == nxt for n in self.spot.notices)
        due |= self.spot.enabled and (any(s == nxt for s, _ in self.spot.price_events) or self._migration_due(nxt))
        due |= any(f.at_iteration in (nxt, nxt + 1) or getattr(f, "until_iteration", None) in (nxt, nxt + 1)
                   for f in self.adapt.faults.faults)
        return due

    def _after(self, m: MeasuredIteration, target: int) -> None:
        """Between iterations: each policy decides, the loop acts (after draining a step in flight)."""
        step = self.trainer.step
        if self.trainer.upload_pending and step > self._saved_at:
            # a background checkpoint uploaded during the step after it: commit it now, so that a
            # crash from here on loses at most the steps since it
            self._drain()
            t0 = time.perf_counter()
            where = self.trainer.finish_checkpoint()
            self.emit("checkpoint_committed", step=self._saved_at, path=str(where), wait_s=round(time.perf_counter() - t0, 4))
        self.iteration_s.append(m.iteration_s)
        self.last_metrics = m
        if self.spot.enabled:
            leaving = self.leaving
            if leaving is not None and self.clock() >= leaving.deadline - self.spot.margin_s:
                self._drain()
                t0 = time.perf_counter()
                self.move(self.trainer.plan)  # the process group is re-formed without them
                self.leaving = None
                self.emit("evacuated_left", devices=list(leaving.devices), step=self.trainer.step,
                          stall_s=round(time.perf_counter() - t0, 4))
            self._poll_signals()
            for k, n in enumerate(self.spot.notices):
                if n.at_step <= step and k not in self._fired:  # a drained step may have passed at_step
                    self._fired.add(k)
                    stages = self.trainer.plan.stages
                    doomed = stages[len(stages) // 2].devices[:1] if n.devices is None else n.devices or tuple(sorted(self.alive))
                    self.notify(doomed, n.seconds, "rehearsal")
            with self._lock:
                notices, self._notices = self._notices, []
            for notice in notices:
                self._drain()
                self._preempted(notice)
        self.growth.poll(self.trainer.step)
        if self.controller is not None and self.trainer.step < target:
            self.handle.stage(m)
            mark = len(self.move_pairs)
            record = self.controller.step()
            if record.action:
                self.emit("adapt", step=self.trainer.step, action=record.action, seconds=round(record.action_s, 4),
                          plan=self.trainer.plan.describe(), decision=type(record.decision).__name__)
            self.growth.decided(record, self.move_pairs[mark:])
        if self.spot.enabled and self.trainer.step < target:
            move = spot_decision(self, self.trainer.step)
            if move is not None:
                self._drain()
                relocate(self, move, forced=False, reason="price")
        if self._checkpoint_due(self.trainer.step) and self.trainer.step < target and self._saved_at != self.trainer.step:
            self._drain()
            self.checkpoint_now("periodic")

    def _poll_signals(self) -> None:
        """Notices from outside, every ``ray_drain_poll_s``: the cloud watchers on the job's nodes
        and Ray's drain requests (once per node), for the devices on those nodes (a notice for
        the driver's node alone is one for the whole job: the driver goes with it)."""
        every = self.spot.ray_drain_poll_s
        now = time.monotonic()
        if not every or now - self._drain_polled < every:
            return
        self._drain_polled = now
        from orchestrator.elastic.drain import drain_notices, draining_nodes

        where = self.trainer.devices()
        if self._node_watch is not None:
            for node, deadline in self._node_watch.poll():
                here = tuple(int(d["device"]) for d in where if d["node_id"] == node and d["device"] in self.alive)
                self.notify(here or tuple(sorted(self.alive)), deadline - time.time(), f"{self.spot.watch} notice on node {node[:12]}")
        draining = {n: d for n, d in draining_nodes().items() if n not in self._drained}
        if draining:
            for devices, left, source in drain_notices(draining, where):
                self.notify(tuple(d for d in devices if d in self.alive), left, source)
            self._drained |= set(draining)

    def _drain(self) -> None:
        """Finish the iteration in flight (if any) so that an action can run."""
        if self._ahead is not None:
            flight, self._ahead = self._ahead, None
            m = self.trainer.complete_step(flight, self._last_done)
            self.iteration_s.append(m.iteration_s)
        self._last_done = None

    # ----- actions -----
    def move(self, plan: Plan, members: set[int] | None = None) -> MoveReport:
        """A live switch to ``plan`` (the controller's moves and evacuation steps); ``members``:
        the devices that stay in the job (default: every alive one)."""
        self._drain()
        t0 = time.perf_counter()
        before = self.trainer.plan
        gone = frozenset(set(range(self.cluster.size)) - self.alive)
        transfers = move_transfers(before, plan, self.profile, self.cluster, gone)
        self.move_pairs += list(dict.fromkeys((t.src, t.dst) for t in transfers))
        reports = self.trainer.move_live(plan, [(t.src, t.dst, t.first, t.last) for t in transfers],
                                         sorted(self.alive if members is None else members))
        if any(r["rejoined"] for r in reports):
            self.leaving = None  # a new process group without the evacuated devices
        self.moves += 1
        return MoveReport(float(sum(int(r["bytes_sent"]) for r in reports)), time.perf_counter() - t0, plan)

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
                  seconds_left=round(notice.deadline - now, 3), step=self.trainer.step)
        decision = (plan_evacuation(self.trainer.plan, notice, self.alive, self.profile, self.cluster, now, self.spot.margin_s,
                                    iteration_s) if self.spot.evacuate_live else Fallback("live evacuation is switched off"))
        if isinstance(decision, Evacuate):
            t0 = time.perf_counter()
            insurance = self.trainer.save_checkpoint(background=True)  # snapshot now, upload while training goes on
            self._saved_at = self.trainer.step
            for plan in decision.steps:  # the doomed stay members while they hand their blocks over
                self.move(plan)
            self.alive -= set(notice.devices)
            self.leaving = notice  # idle members from now on; they leave the process group before the deadline
            stall = time.perf_counter() - t0
            self.emit("preemption_handled", mode="live", reason=decision.reason, lost_steps=0, stall_s=round(stall, 4),
                      iteration_s=round(iteration_s, 4), moves=[list(p) for p in decision.moves], step=self.trainer.step,
                      plan=self.trainer.plan.describe(), insurance_checkpoint=str(insurance))
            return
        self.emit("evacuation_refused", reason=decision.reason, devices=list(notice.devices))
        relocate(self, None, forced=True, reason=decision.reason, notice=notice, iteration_s=iteration_s)

    def _failed(self, exc: PipelineActorError) -> None:
        """A worker died without notice: the failure policy restores the newest checkpoint."""
        if self._ahead is not None:
            self.trainer.discard_step(self._ahead)
            self._ahead = None
        self._last_done = None
        if self.trainer.failures >= self.run.max_failures:
            raise exc
        self.trainer.failures += 1
        t0, before = time.perf_counter(), self.trainer.step
        recent = self.iteration_s[-5:]
        self.emit("worker_failed", step=before, error=str(exc).splitlines()[0])
        self.alive, self.leaving = set(range(self.growth.placed)), None
        self.knobs.clear()  # fresh processes: no injected knobs
        self.trainer.recover(exc)
        self.restarts += 1
        self.emit("resumed", step=self.trainer.step, lost_steps=before - self.trainer.step, stall_s=round(time.perf_counter() - t0, 4),
                  iteration_s=round(statistics.median(recent), 4) if recent else None, plan=self.trainer.plan.describe())

    def slot_map(self) -> dict[int, int]:
        """Device ``d`` is worker slot ``d``, for every device the job has had a worker for."""
        return {d: d for d in range(self.growth.placed)}

    def checkpoint_now(self, why: str) -> str | None:
        if self._saved_at == self.trainer.step:  # saved already (perhaps still uploading): commit and reuse it
            where = self.trainer.finish_checkpoint() or ckpt.step_dir(str(self.run.storage), self.trainer.step)
            return str(where)
        t0 = time.perf_counter()
        background = self.run.async_checkpoints and why == "periodic"
        try:
            where = self.trainer.save_checkpoint(background=background)
        except (PipelineActorError, UserError) as exc:
            self.emit("checkpoint_failed", why=why, step=self.trainer.step, error=str(exc).splitlines()[0])
            return None
        took = time.perf_counter() - t0
        self._saved_at = self.trainer.step
        if not background:
            self.checkpoint_s = took
        self.emit("checkpoint", why=why, step=self.trainer.step, path=str(where), stall_s=round(took, 4), background=background)
        return str(where)

    def _checkpoint_due(self, done: int) -> bool:
        every = self.run.checkpoint_every
        return bool(every) and done % every == 0

    def _migration_due(self, done: int) -> bool:
        every = self.spot.migration_check_every
        return bool(self.spot.enabled and every and done % every == 0)

    # ----- inspection -----
    def emit(self, event: str, **fields: Any) -> None:
        skipped = self.trainer.skipped_checkpoints  # damaged checkpoints a restore passed over come first, once each
        while self._skipped_told < len(skipped):
            s, self._skipped_told = skipped[self._skipped_told], self._skipped_told + 1
            self.emit("checkpoint_skipped", path=s.location, reason=s.reason)
        record = {"event": event, **fields}
        self.records.append(record)
        if self.events is not None:
            self.events.emit(event, **fields)

    def max_abs_diff(self) -> float:
        """Final weights against uninterrupted single-process training on the same data."""
        from actors.reference import ReferenceTrainer, max_difference

        t = self.train
        ref = ReferenceTrainer(t.model_factory, t.loss_fn, t.optimizer_factory, t.data_fn, t.num_microbatches, seed=t.seed)
        ref.train(self.trainer.step)
        return max_difference(self.trainer.state_dicts(), ref.state_dicts())

    def close(self) -> None:
        if self.controller is not None:
            self.controller.close()  # no background re-planning outlives the job
        self.trainer.shutdown()

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

        return user_state_dict(user_code.blocks(self.train.model_factory), self.trainer.state_dicts())


__all__ = ["ElasticJob", "JobResult"]
