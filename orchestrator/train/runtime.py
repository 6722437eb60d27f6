"""``PipelineRuntime``: a plan's stage actors on Ray and the primitives that drive them.

The runtime runs what it is told and decides nothing: start, submit a step (or a run of consecutive steps) and
complete it, move blocks live to another plan, restart or recover after a death, save, commit and restore
checkpoints, snapshot in memory. When to do which is the one training loop's
(:class:`~orchestrator.train.loop.TrainingLoop`) and its policies'; the user-facing fixed-plan trainer
(:class:`~orchestrator.train.trainer.PipelineTrainer`) is that loop over this runtime.

The driver only sends "run iteration ``step``" to every worker and gathers small reports; the workers fetch their
own data (``data_fn(step)``, deterministic in ``step``) and exchange activations and gradients directly over
``torch.distributed``, so no tensor per micro-batch ever passes through the driver or the object store. Without a
``plan`` the model is profiled here and a planner from :mod:`orchestrator.planners` chooses one for the live Ray
cluster.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence, overload

import ray
import torch
from torch import Tensor, nn

from actors.stage_worker import StageWorker
from actors import checkpoint as ckpt
from actors import injection
from actors import user_code
from actors import waits
from actors.group import PipelineActorError, WorkerGroup
from actors.metrics import MeasuredIteration, MoveReply, combine_run
from actors.placement import Slot, WorkerPlace, discover
from actors.job_spec import JobSpec
from actors.training import TrainingOptions
from actors.ray_session import ensure_ray
from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.train import recovery
from orchestrator.train.checkpointing import Checkpoints
from orchestrator.train.fit_result import InFlight


HANG_FACTOR = 10.0
HANG_FLOOR_S = 30.0
HANG_WINDOW = 8  # steps the median is taken over


class PipelineRuntime:
    """A plan's stage workers and their primitives; see the module docstring for the data and control flow."""

    def __init__(
        self,
        model_factory: Callable[[], list[nn.Module]],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        optimizer_factory: Callable[[Any], torch.optim.Optimizer],
        data_fn: Callable[[int], tuple[Tensor, Tensor]],
        num_microbatches: int,
        plan: Plan | None = None,
        planner: str = "pipedream",
        cluster: Cluster | None = None,
        checkpoint_dir: str | Path | None = None,
        seed: int = 0,
        resume: str | Path | None = None,
        iteration_timeout_s: float = 600.0,
        pg_timeout_s: float = 120.0,
        workers: WorkerGroup | None = None,
        use_gpu: bool | None = None,
        validate: bool = True,
        training: TrainingOptions | None = None,
        run_id: str = "",
        eval_data_fn: Callable[[int], tuple[Tensor, Tensor]] | None = None,
        hang_timeout_s: float | None = None,
        storage_retry_s: float = 180.0,
    ) -> None:
        """``validate``: check the user's functions on the driver first (see
        :func:`actors.user_code.validate_job`): one model build, one probe row, two ``data_fn(0)``.
        ``training``: gradient clipping by the global norm and LR schedules
        (:class:`actors.training.TrainingOptions`)."""
        if validate:
            user_code.validate_job(model_factory, loss_fn, optimizer_factory, data_fn, num_microbatches, checkpoint_dir, seed)
        self.spec = JobSpec(model_factory, loss_fn, optimizer_factory, data_fn, seed, pg_timeout_s, training=training or TrainingOptions(),
                            run_id=run_id, eval_data_fn=eval_data_fn, storage_retry_s=storage_retry_s)  # every block a worker writes records the run it belongs to
        self.num_microbatches = num_microbatches
        self.use_gpu = use_gpu
        self._probed: WorkerGroup | None = None  # the workers that measured the cluster, kept to run the plan
        if plan is None:  # profiled here, planned for the given or the measured cluster
            from orchestrator.train.discovery import plan_on_cluster

            plan, self._probed = plan_on_cluster(self.spec, num_microbatches, planner, cluster, use_gpu)
        self.plan = plan
        if self.plan.num_microbatches != num_microbatches:
            raise UserError(f"the plan has {self.plan.num_microbatches} micro-batches but num_microbatches={num_microbatches}")
        self.checkpoints = Checkpoints(checkpoint_dir, storage_retry_s)  # owns where they go, the upload in flight, the damaged ones
        self.iteration_timeout_s = iteration_timeout_s
        self.hang_timeout_s = hang_timeout_s  # None: from the measured steps (deadline_s)
        self._times: list[float] = []  # the newest steps' times, for the hang deadline
        self.resume = resume
        self.group = workers if workers is not None else self._probed
        self._owns_group = workers is None
        self._started = False
        self.step = 0
        self._failed_run: tuple[int, int] | None = None  # the steps being gathered when a worker failed
        self._snapshot: recovery.SnapshotInFlight | None = None  # an in-memory snapshot not waited for yet
        self.history: dict[int, float] = {}

    # ----- setup -----
    def _ensure_started(self) -> None:
        if not self._started:
            self.start()

    @property
    def started(self) -> bool:
        return self._started

    def start(self, members: Sequence[int] | None = None, slots: Mapping[int, int] | None = None, size: int | None = None) -> None:
        """Create (if needed) and configure the workers. ``members``/``slots``: see
        :meth:`WorkerGroup.configure` — the elastic job pins device ``d`` to worker ``d`` and makes every alive
        device a rank so that blocks can move live."""
        if not ray.is_initialized():
            ensure_ray()
        if self.group is None:
            self.group = WorkerGroup(size or len(self.plan.devices), use_gpu=self.use_gpu)
        self.group.configure(self.spec, self.plan, members=members, slots=slots)
        self._started = True
        if self.resume is not None:
            self.restore(self.resume)
            self.resume = None

    def _workers(self) -> WorkerGroup:
        self._ensure_started()
        assert self.group is not None
        return self.group

    def _started_group(self) -> WorkerGroup:
        """The workers, for a question about them (never starts them)."""
        assert self._started and self.group is not None, "the runtime has not started its workers"
        return self.group

    def recover(self, exc: PipelineActorError, plan: Plan | None = None, members: Sequence[int] | None = None,
                slots: Mapping[int, int] | None = None) -> None:
        """New processes (a broken process group cannot be repaired in place), the same plan (or ``plan``, one
        without the devices whose node left: no worker restarts there), state from the newest complete
        checkpoint (or the seed); the caller's loop counts the failure. An upload from a dead worker never
        commits: its folder stays unmarked. ``members``, ``slots``: as :meth:`restart_on`."""
        assert self.group is not None
        self._drop_fired_kills({exc.device} if exc.died else None)
        self.group.restart()
        self.restart_on(plan or self.plan, self.latest(), members, slots)

    # ----- primitives of the one loop (orchestrator.train.loop) and the jobs that act between its steps -----
    def submit_step(self, step: int | None = None, count: int = 1) -> "InFlight":
        """Start iteration ``step`` (default: the next) — or the run of ``count`` consecutive
        steps from it, executed back to back in one call per worker — without waiting."""
        at = self.step if step is None else step
        refs, devices = self._workers().submit(StageWorker.run_iterations, at, max(1, count))
        return InFlight(at, refs, devices, time.perf_counter(), max(1, count))

    def complete_step(self, flight: "InFlight", since: float | None = None) -> MeasuredIteration:
        """Gather the next step (``flight``, one step), record its loss and advance; ``since``: when
        the previous step was gathered if ``flight`` was submitted before that (pipelined timing)."""
        assert flight.count == 1, "a run of steps is gathered with complete_run"
        return self.complete_run(flight, since)[0]

    def complete_run(self, flight: "InFlight", since: float | None = None) -> list[MeasuredIteration]:
        """Gather the run ``flight`` started (see :mod:`orchestrator.train.loop` for how its steps are timed), record
        the losses and advance past it."""
        assert flight.step == self.step, (flight.step, self.step)
        end = flight.step + flight.count
        what = f"steps {flight.step}-{end - 1}" if flight.count > 1 else f"step {flight.step}"
        deadline = self.deadline_s() * flight.count  # bound per step
        try:
            reports = self._workers().gather(flight.refs, what, deadline, flight.devices)
        except PipelineActorError as exc:
            self._failed_run = (flight.step, end)
            if exc.pending and not exc.died:  # no answer by the deadline: a hung worker, ended like a dead one
                raise self._hung(exc, deadline, what) from None
            raise
        self._times = (self._times + [(time.perf_counter() - max(flight.submitted, since or flight.submitted)) / flight.count])[-HANG_WINDOW:]
        elapsed = time.perf_counter() - max(flight.submitted, since if since is not None else flight.submitted)
        self._echo(reports)
        run = combine_run(reports, elapsed)
        for m in run:
            self.history[self.step] = m.loss
            self.step += 1
        return run

    # ----- membership: the workers as devices (the job asks; only the runtime talks to the worker group) -----
    @property
    def kind(self) -> str:
        """The devices' kind: ``gpu`` or ``cpu``."""
        return "gpu" if self._started_group().use_gpu else "cpu"

    @property
    def size(self) -> int:
        """Worker slots (device ``d`` runs on slot ``d`` when the job pins them)."""
        return self.group.size if self.group is not None else len(self.plan.devices)

    def unreachable(self) -> set[int]:
        """Slots whose worker cannot be reached now (its process or its node is gone)."""
        return self._started_group().unreachable_slots()

    def node_lost(self) -> set[int]:
        """Slots whose node left the cluster: no worker can start there again."""
        return self._started_group().node_lost_slots()

    def in_place_hazard(self) -> str | None:
        """Why recovery in place cannot be made safe on the workers' NCCL, or ``None`` (gloo, or a safe NCCL)."""
        return self._started_group().in_place_hazard()

    def node_of(self, device: int) -> str:
        return str(self._started_group().identities[device]["node_id"])

    def add_worker(self, device: int, slot: Slot | None) -> None:
        """A worker for a new device, without waiting for it: a shared pool's spare slot stands in (respawned if it
        died), else ``slot`` (``None``: the next free local one) is added to the group."""
        group = self._workers()
        if device < group.size:
            if device in group.dead:
                group.respawn([device])
            return
        if slot is None:
            found = discover(self.kind, local_slots=device + 1)
            if len(found) <= device:
                raise UserError(f"the Ray cluster has no free slot for device {device}")
            slot = found[device]
        group.extend([slot])

    def workers_up(self, waiting: Collection[int]) -> tuple[list[int], list[tuple[int, str]]]:
        """Of the workers being started for ``waiting`` devices: those up now (a recovery in between restarted
        every worker, these too) and those that failed to start, with why."""
        group = self._workers()
        up, failed = group.started()
        return sorted(set(up) | {d for d in waiting if group.identities[d]}), failed

    # ----- rehearsal: the runtime's interface for injected faults (actors.injection) -----
    def set_knobs(self, device: int, slowdown: float, send_delay_per_byte: dict[int, float]) -> None:
        """Injected slowness of ``device``'s compute and outgoing links (CPU workers only)."""
        self._workers().call(StageWorker.set_faults, slowdown, send_delay_per_byte, devices=[device], what="set faults")

    def arm_kill(self, device: int, step: int, hang: bool = False) -> None:
        """``device``'s worker dies (or, ``hang``, blocks for ever) halfway through step ``step``."""
        self._workers().call(StageWorker.arm_kill, step, hang, devices=[device], what="arm kill")

    def rehearse_kills(self, kills: Iterable[tuple[int, int]]) -> None:
        """Arm crashes: for each ``(step, device)`` that device's worker dies halfway through that step, once. The
        kills travel in the job spec (every executor built from it installs them, fresh processes included)."""
        self.spec = injection.with_kills(self.spec, injection.kills_of(self.spec) | frozenset(kills))

    def _drop_fired_kills(self, dead: Collection[int] | None) -> None:
        """Before a recovery configures workers: the kill that fired in the run being gathered when the failure
        surfaced is dropped, so a replayed step does not die again. A worker dies at its first armed kill and the
        run ends there for every worker, so only the kills of the earliest step among those armed in the run (of
        the ``dead`` devices; ``None``: only a peer's error surfaced, any device) fired; later ones are still due."""
        armed = injection.kills_of(self.spec)
        lo, hi = self._failed_run or (self.step, self.step + 1)
        self._failed_run = None
        in_run = [(s, d) for s, d in armed if lo <= s < hi and (dead is None or d in dead)]
        if in_run:
            first = min(s for s, _ in in_run)
            self.spec = injection.with_kills(self.spec, armed - {(s, d) for s, d in in_run if s == first})

    def deadline_s(self) -> float:
        """How long one step may take before a worker is taken for hung: ``hang_timeout_s`` when fixed, else
        :data:`HANG_FACTOR` x the recent median step with a floor of :data:`HANG_FLOOR_S` (a loaded machine never
        trips it), and the plain ``iteration_timeout_s`` until a few steps were measured."""
        if self.hang_timeout_s is not None:
            return min(self.hang_timeout_s, self.iteration_timeout_s)
        if len(self._times) < HANG_WINDOW // 2:
            return self.iteration_timeout_s
        return min(self.iteration_timeout_s, max(HANG_FLOOR_S, HANG_FACTOR * statistics.median(self._times)))

    def _hung(self, exc: PipelineActorError, deadline: float, what: str) -> PipelineActorError:
        """The workers of a missed deadline that are hung themselves are ended (their peers, blocked on them, then fail
        at once on the closed links, as after a death); the failure is theirs, with ``cause="hang"``."""
        group = self._workers()
        culprits = group.hung(exc.pending)
        for d in culprits:
            group.kill_worker(d)
        first = culprits[0]
        return PipelineActorError(f"device {first} made no progress in {what} for {deadline:.1f} s (hung): its process was "
                                  f"ended", first, self.plan.stages_of_device(first), died=True, cause="hang", detect_s=deadline)

    def _echo(self, reports: Sequence[Sequence[Mapping[str, Any]]]) -> None:
        """The user's output from the workers, on the driver's stdout, each line prefixed by where it ran."""
        for per_device in reports:
            for r in per_device:
                text = r.get("out")
                if text:
                    device = int(r["device"])
                    stages = ",".join(str(j) for j in self.plan.stages_of_device(device))
                    for line in str(text).splitlines():
                        print(f"[stage {stages} device {device}] {line}", flush=True)

    def evaluate(self, batches: int) -> float:
        """The mean loss of the forward-only pass over ``eval_data_fn(0 .. batches - 1)`` on the current plan (no
        gradient, dropout off, nothing changed); no step may be in flight. Each batch's loss is weighted by unit
        rows as a training step's is, so it equals the single-process model's on the same batch."""
        group = self._workers()
        reports = group.call(StageWorker.evaluate, batches, devices=sorted(self.plan.devices), what="evaluation",
                             timeout_s=self.iteration_timeout_s * batches)
        self._echo(reports)
        per_batch = [sum(float(r[i]["loss"]) for r in reports if r[i].get("loss") is not None) for i in range(batches)]
        return sum(per_batch) / batches

    def step_on_metric(self, value: float) -> None:
        """After an evaluation, with nothing in flight: every worker's metric-driven LR schedulers
        (``ReduceLROnPlateau``) step on ``value``, before the next step runs (so a resumed run does the same)."""
        self._workers().call(StageWorker.step_on_metric, value, devices=sorted(self.plan.devices), what="LR schedules",
                             timeout_s=self.iteration_timeout_s)

    def discard_step(self, flight: "InFlight") -> None:
        self._workers().discard(flight.refs)

    def move_live(self, plan: Plan, transfers: Sequence[tuple[int, int, int, int]], members: Sequence[int]) -> list[MoveReply]:
        """Switch to ``plan`` between iterations, handing block state worker to worker
        (:meth:`WorkerGroup.move`); no step may be in flight."""
        reports = self._workers().move(plan, transfers, members, self.iteration_timeout_s, self.step)
        self.plan = plan
        return reports

    def restart_on(self, plan: Plan, source: str | Path | None, members: Sequence[int] | None = None,
                   slots: Mapping[int, int] | None = None) -> int:
        """The same (or, if broken, fresh) processes on ``plan``, state from the checkpoint at
        ``source`` (``None``: the seed); returns the step training resumes at."""
        group = self._workers()
        self.checkpoints.abandon()
        self._snapshot = None  # the host copies go with the processes' old state
        self.plan = plan
        group.configure(self.spec, plan, self.iteration_timeout_s, members=members, slots=slots)
        if source is None:
            self.step = 0
            return 0
        return self.restore(source)

    # ----- checkpoints (orchestrator.train.checkpointing owns their state) -----
    @property
    def checkpoint_dir(self) -> str | Path | None:
        return self.checkpoints.directory

    @property
    def skipped_checkpoints(self) -> list[ckpt.Skipped]:
        """Damaged checkpoints a resume or recovery passed over, with reasons (for the caller's event log)."""
        return self.checkpoints.skipped

    @overload
    def save_checkpoint(self, directory: Path, background: bool = False) -> Path: ...
    @overload
    def save_checkpoint(self, directory: str | Path | None = None, background: bool = False) -> str | Path: ...
    def save_checkpoint(self, directory: str | Path | None = None, background: bool = False) -> str | Path:
        """A checkpoint of the current step (see :meth:`Checkpoints.save`; ``background``: committed by
        :meth:`finish_checkpoint`)."""
        return self.checkpoints.save(self._workers(), self.spec, self.plan, self.step, self.history, directory, background)

    @property
    def upload_pending(self) -> bool:
        return self.checkpoints.pending

    def finish_checkpoint(self) -> str | Path | None:
        """Wait for the background checkpoint (if any) and commit it; returns its location."""
        return self.checkpoints.finish(self._workers(), self.spec)

    def latest(self) -> str | Path | None:
        return self.checkpoints.latest()

    def restore(self, source: str | Path) -> int:
        """Load a checkpoint taken under ANY plan of the same model (``"latest"``, ``"latest_or_fresh"`` or a
        location; see :meth:`Checkpoints.load`); returns the step training resumes at."""
        loaded = self.checkpoints.load(self._workers(), self.plan.num_blocks, source)
        if loaded is not None:
            self.step, losses = loaded
            self.history.update(losses)
        return self.step

    # ----- inspection -----
    def devices(self) -> list[WorkerPlace]:
        """Where each plan device's actor actually runs (reported by the actor at start)."""
        group = self._workers()
        out = []
        for d in sorted(self.plan.devices):
            seen = group.identities[group.slot_of[d]]
            out.append(WorkerPlace(d, str(seen["node_id"]), int(seen["pid"]), str(seen["accelerator"]), str(seen["device"])))
        return out

    def state_dicts(self) -> dict[int, dict[str, Tensor]]:
        """Current weights keyed by block (from replica 0 of every stage)."""
        group = self._workers()
        owners = sorted({s.devices[0] for s in self.plan.stages})
        merged: dict[int, dict[str, Tensor]] = {}
        for part in group.call(StageWorker.state_dicts, devices=owners):
            merged.update(part)
        return merged

    def shutdown(self) -> None:
        if self.group is not None and self._owns_group:
            self.group.shutdown()
            self.group = None
        self._started = False

    def __enter__(self) -> "PipelineRuntime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ----- recovery in place (orchestrator/train/recovery.py chooses; these carry it out) -----
    def snapshot_in_memory(self) -> None:
        """Every worker snapshots its blocks at the current step into Ray's object store and the next device in the
        ring keeps it (Gemini-style: mapped on one node, pulled to its own node otherwise; :mod:`actors.host_copies`),
        so a death without notice loses only the steps since. Between iterations (no step in flight), and
        asynchronous: this only submits. Each worker copies while its next iteration's forward and backward run (its
        optimizer step waits for the copy, the first thing that changes the state); the neighbour takes it beside
        training (the workers' ``copies`` concurrency group). The previous snapshot is waited for first
        (:meth:`settle_snapshots`: usually done long before), so the older generation each worker replaces is never
        the only complete one."""
        self.settle_snapshots()
        group = self._workers()
        devices = group.plan_devices()
        started, _ = group.submit(StageWorker.snapshot_copies, self.step, devices=devices)
        neighbours = recovery.ring_neighbours(devices, {d: str(group.identities[group.slot_of[d]].get("node_id", d)) for d in devices})
        sent = dict(zip(neighbours, group.submit_each(StageWorker.peer_payloads, {o: (self.step, started[devices.index(o)]) for o in neighbours})[0]))
        parts: dict[int, list[Any]] = {}  # keeper -> refs of its owners' payloads
        for owner, keeper in neighbours.items():
            parts.setdefault(keeper, []).append(sent[owner])
        kept, keepers = group.submit_each(StageWorker.keep_peer_copy, {k: (self.step, *p) for k, p in parts.items()})
        self._snapshot = recovery.SnapshotInFlight(self.step, started, devices, kept, keepers)

    def settle_snapshots(self) -> dict[int, int]:
        """Wait for the snapshot in flight (every own copy and every neighbour's); returns the host bytes of copies
        held by each keeper ({} when none was in flight). A worker's death surfaces as :class:`PipelineActorError`."""
        flight, self._snapshot = self._snapshot, None
        if flight is None:
            return {}
        group = self._workers()
        group.gather(flight.started, f"in-memory snapshot at step {flight.step}", self.iteration_timeout_s, flight.devices)
        held = group.gather(flight.kept, "neighbour's snapshot copy", self.iteration_timeout_s, flight.keepers)
        return {k: int(b) for k, b in zip(flight.keepers, held)}

    def _drain_snapshot(self, timeout_s: float) -> None:
        """After a death: let the copies still in flight arrive (they count), those a dead worker was part of fail.
        One still running after ``timeout_s`` could change a survivor's copies after they were counted: then no
        recovery in place."""
        flight, self._snapshot = self._snapshot, None
        if flight is not None:
            refs = [*flight.started, *flight.kept]
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            if pending:
                raise recovery.InPlaceImpossible(f"the snapshot at step {flight.step} was still being copied after {timeout_s:.0f} s")

    def recover_in_place(self, dead: Collection[int], plan: Plan, alive: Collection[int] | None = None) -> recovery.InPlaceRecovery:
        """After workers died without notice (``dead``, and any on a node that left; every step in flight discarded):
        the survivors keep their processes, re-form their process group among themselves on ``plan`` (a plan over
        survivors), and roll back to the newest restorable step from host copies (their own, a neighbour's on
        another node) or the newest committed checkpoint. Several deaths at once (a node) are recovered in place too:
        blocks whose every copy died come from storage, at the checkpoint's step.
        ``alive``: the devices the caller counts on (default: the process group's members); an idle device that
        joined and is not a member yet survives too (device ``d`` is slot ``d``), an evacuated one still a member
        but not counted on does not (it is left out of the new group).
        Raises :class:`~orchestrator.train.recovery.InPlaceImpossible` (with a one-line ``reason``) when it cannot:
        then :meth:`recover` restarts everything as before."""
        t0 = time.perf_counter()
        group = self._workers()
        counted = sorted(group.rank_of if alive is None else {int(d) for d in alive})
        group.know_devices(counted)  # an idle device that joined is not placed yet: it is its own slot
        lost = group.unreachable_slots()  # a node that went away takes all its workers
        gone = sorted({int(d) for d in dead} | {d for d in counted if group.slot_of[d] in lost})
        survivors = [d for d in counted if d not in gone]
        self._drop_fired_kills(gone)
        missing = sorted(set(plan.devices) - set(survivors))
        if missing or not survivors:
            raise recovery.InPlaceImpossible(f"the plan uses device(s) {missing} that have no live worker")
        group.release(survivors)  # NCCL: a survivor blocked on the dead peer is freed by aborting its communicators
        late = group.unresponsive(survivors, waits.stretched(30.0))  # each finishes (fails) its iteration first (10 s missed one on a loaded 2-core machine)
        if late:
            raise recovery.InPlaceImpossible(f"survivor(s) {sorted(late)} did not answer after the death of {gone}")
        self._drain_snapshot(waits.stretched(30.0))
        copies = {d: r.steps for d, r in zip(survivors, group.call(StageWorker.host_copies, devices=survivors, what="host copies"))}
        self.checkpoints.abandon()  # an upload the dead worker was part of never commits
        stored = self.latest()
        manifest = ckpt.verify(str(stored)) if stored is not None else None
        stored_step = int(manifest["step"]) if manifest is not None else None
        step = recovery.restorable_step(copies, self.plan.num_blocks, stored_step)
        group.reform(self.spec, plan, survivors, self.iteration_timeout_s)
        self.plan = plan
        if step is None:  # nothing kept anywhere: the seed, as a restart without checkpoint
            self.step = 0
            return recovery.InPlaceRecovery(0, "seed", {}, {}, tuple(self._survivors()), time.perf_counter() - t0, tuple(survivors))
        sources = recovery.block_sources(step, plan, copies, stored_step)
        wanted: dict[int, list[int]] = {}
        for device, blocks in sources.items():
            for b, holder in blocks.items():
                if holder not in (device, recovery.STORAGE):
                    wanted.setdefault(holder, []).append(b)
        exported: dict[int, Any] = {}
        if wanted:
            for part in group.call_each(StageWorker.export_copies, {h: (step, sorted(set(bs))) for h, bs in wanted.items()}, "export copies"):
                exported.update(part)
        args = {d: (step, {b: exported[b] for b, h in blocks.items() if h not in (d, recovery.STORAGE)},
                    str(stored) if stored is not None else None, manifest)
                for d, blocks in sources.items()}
        counts: dict[str, int] = {}
        for restored in group.call_each(StageWorker.restore_copies, args, f"roll back to step {step}", self.iteration_timeout_s):
            for k, v in restored.items():
                counts[k] = counts.get(k, 0) + v
        self.step = step
        held = {d: r.nbytes for d, r in zip(survivors, group.call(StageWorker.host_copies, devices=survivors))}
        return recovery.InPlaceRecovery(step, recovery.source_of(sources), counts, held, tuple(self._survivors()),
                                        time.perf_counter() - t0, tuple(survivors))

    def _survivors(self) -> list[dict[str, Any]]:
        return [d.event() for d in self.devices()]
