"""``PipelineTrainer``: pipeline-parallel training on Ray actors, driven by a :class:`Plan`.

Shaped like Ray Train's ``TorchTrainer`` (construct with factories, call ``fit``, get a result
and checkpoints back), but the workers are pipeline stages, not data-parallel copies::

    trainer = PipelineTrainer(model_factory, loss_fn, lambda p: torch.optim.AdamW(p, 1e-3),
                              data_fn, num_microbatches=8, checkpoint_dir="ckpt", checkpoint_every=100)
    result = trainer.fit(1000)

The driver only sends "run iteration ``step``" to every worker and gathers small reports; the
workers fetch their own data (``data_fn(step)``, deterministic in ``step``) and exchange
activations and gradients directly over ``torch.distributed``, so no tensor per micro-batch ever
passes through the driver or the object store. Without a ``plan`` the model is profiled here and
a planner from :mod:`orchestrator.planners` chooses one for the live Ray cluster.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

import ray
import torch
from torch import Tensor, nn
from tqdm import tqdm

from actors import checkpoint as ckpt
from actors import storage
from actors import user_code
from actors import waits
from actors.group import PipelineActorError, WorkerGroup
from actors.metrics import MeasuredIteration, combine, combine_run
from actors.job_spec import JobSpec
from actors.training import TrainingOptions
from actors.ray_session import ensure_ray
from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.train import recovery
from orchestrator.train.checkpointing import Checkpointing
from orchestrator.train.fit_result import FitResult, InFlight


class PipelineTrainer(Checkpointing):
    """Pipeline-parallel trainer; see the module docstring for the data and control flow."""

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
        checkpoint_every: int = 0,
        max_failures: int = 0,
        seed: int = 0,
        resume: str | Path | None = None,
        progress: bool | None = None,
        iteration_timeout_s: float = 600.0,
        pg_timeout_s: float = 120.0,
        workers: WorkerGroup | None = None,
        use_gpu: bool | None = None,
        pipelined_dispatch: bool = True,
        iterations_per_call: int = 8,
        validate: bool = True,
        async_checkpoints: bool = False,
        training: TrainingOptions | None = None,
        run_id: str = "",
    ) -> None:
        """``validate``: check the user's functions on the driver first (see
        :func:`actors.user_code.validate_job`): one model build, one probe row, two ``data_fn(0)``.
        ``training``: gradient clipping by the global norm and LR schedules
        (:class:`actors.training.TrainingOptions`)."""
        if checkpoint_every and checkpoint_dir is None:
            raise UserError("checkpoint_every needs a checkpoint_dir")
        if validate:
            user_code.validate_job(model_factory, loss_fn, optimizer_factory, data_fn, num_microbatches, checkpoint_dir, seed)
        self.spec = JobSpec(model_factory, loss_fn, optimizer_factory, data_fn, seed, pg_timeout_s, training=training or TrainingOptions(),
                            run_id=run_id)  # every block a worker writes records the run it belongs to
        self.num_microbatches = num_microbatches
        self.use_gpu = use_gpu
        self._probed: WorkerGroup | None = None  # the workers that measured the cluster, kept to run the plan
        if plan is None:  # profiled here, planned for the given or the measured cluster
            from orchestrator.train.discovery import plan_on_cluster

            plan, self._probed = plan_on_cluster(self.spec, num_microbatches, planner, cluster, use_gpu)
        self.plan = plan
        if self.plan.num_microbatches != num_microbatches:
            raise UserError(f"the plan has {self.plan.num_microbatches} micro-batches but num_microbatches={num_microbatches}")
        # a local folder stays a Path; a storage URI (s3://, gs://, az://) stays a string
        self.checkpoint_dir: str | Path | None = (
            None if checkpoint_dir is None else checkpoint_dir if isinstance(checkpoint_dir, str) and not storage.is_local(checkpoint_dir)
            else Path(storage.local_path(checkpoint_dir)))
        self.skipped_checkpoints: list[ckpt.Skipped] = []  # damaged ones passed over by resume/recovery, with reasons
        self._uploading: tuple[str | Path, int, int, dict[str, Any], dict[str, Any], list[int]] | None = None
        self.checkpoint_every, self.max_failures = checkpoint_every, max_failures
        self.progress, self.iteration_timeout_s = progress, iteration_timeout_s
        self.resume = resume
        self.pipelined_dispatch = pipelined_dispatch
        self.iterations_per_call = iterations_per_call  # fit: consecutive steps per remote call (see fit)
        # periodic checkpoints snapshot the blocks and upload while the next steps train; each
        # commits when the next one starts or when fit returns (see save_checkpoint(background=))
        self.async_checkpoints = async_checkpoints
        self.group = workers if workers is not None else self._probed
        self._owns_group = workers is None
        self._started = False
        self.step = 0
        self.failures = 0
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
        :meth:`WorkerGroup.configure` — the live handle (:mod:`orchestrator.adapt.live`) pins device
        ``d`` to worker ``d`` and makes every alive device a rank so it can move blocks live."""
        if not ray.is_initialized():
            ensure_ray()
        if self.group is None:
            self.group = WorkerGroup(size or len(self.plan.devices), use_gpu=self.use_gpu)
        self.group.configure(self.spec, self.plan, members=members, slots=slots)
        self._started = True
        if self.resume is not None:
            self.restore(self.resume)
            self.resume = None

    def run_step(self) -> MeasuredIteration:
        """Exactly one iteration of ``self.plan`` (no retry: a failure propagates as
        :class:`PipelineActorError`), then a checkpoint if one is due. The adaptive controller's
        handle drives training through this, one step at a time, between its decisions."""
        group = self._workers()
        t = time.perf_counter()
        reports = group.call("run_iteration", self.step, what=f"step {self.step}", timeout_s=self.iteration_timeout_s)
        m = combine(reports, time.perf_counter() - t)
        self.history[self.step] = m.loss
        self.step += 1
        if self._checkpoint_due(self.step):
            self.save_checkpoint()
        return m

    def _checkpoint_due(self, done: int) -> bool:
        """Whether a checkpoint is written once ``done`` steps have completed."""
        return bool(self.checkpoint_every) and done % self.checkpoint_every == 0

    def _workers(self) -> WorkerGroup:
        self._ensure_started()
        assert self.group is not None
        return self.group

    # ----- training -----
    def fit(self, steps: int) -> FitResult:
        """Train up to step ``steps`` (not ``steps`` more: a resumed trainer continues to the same
        target; at or past it, return at once), restarting from the last checkpoint on worker death.
        With a ``checkpoint_dir`` the last step is always committed before ``fit`` returns.

        Calls of several iterations (``iterations_per_call``, default 8): each worker runs a run of
        consecutive steps back to back in one remote call (:meth:`StageWorker.run_iterations`), so
        Ray's per-call work (task hand-off in the worker, the driver's gather) is paid once per
        run instead of once per iteration. A run never crosses a checkpoint and never passes the
        last step. Pipelined dispatch (``pipelined_dispatch=True``, the default): run ``k + 1`` is
        submitted to every worker before run ``k``'s results are gathered, so the workers start it
        as soon as they finish ``k`` (each runs one call at a time, in submission order) instead of
        waiting for the driver's round trip; not across a checkpoint. If a run fails, the next is
        cancelled or ignored (see :meth:`WorkerGroup.discard`) and recovery is as without it.

        ``metrics[k].iteration_s``: the time between the completions of step ``k - 1`` and ``k``.
        The first step of a run is timed on the driver from the later of "run submitted" and
        "previous run gathered" (submit-to-gather when nothing was in flight: the first run, and
        the one after a checkpoint or a restart) to "run gathered", less the later steps of the
        run, which are timed on the workers' clocks (completion = the last device to finish).
        Summed, they are the training wall time less checkpoint writes and restarts (and, when not
        pipelined, less the driver's own time between runs). Per-step losses, checkpoints and
        failure handling do not depend on either setting.
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise UserError(f"fit(steps) needs a whole number of steps >= 0, not {steps!r}")
        group = self._workers()
        first, target = self.step, max(self.step, steps)
        metrics: dict[int, MeasuredIteration] = {}
        written: list[str] = []
        restarts = 0
        show = self.progress if self.progress is not None else target - first >= 50
        bar = tqdm(total=target - first, disable=not show, desc="pipeline", unit="it")
        start = time.perf_counter()
        ahead: InFlight | None = None
        last_done: float | None = None  # when the previous run was gathered, if this one was submitted before that
        try:
            while self.step < target:
                step = self.step
                try:
                    flight = ahead if ahead is not None and ahead.step == step else self.submit_step(step, self._run_end(step, target) - step)
                    ahead = None
                    end = step + flight.count
                    if self.pipelined_dispatch and end < target and not self._checkpoint_due(end):
                        ahead = self.submit_step(end, self._run_end(end, target) - end)
                    run = self.complete_run(flight, last_done)
                    last_done = time.perf_counter() if ahead is not None else None
                except PipelineActorError as exc:
                    if ahead is not None:
                        group.discard(ahead.refs)
                        ahead = None
                    last_done = None
                    if self.failures >= self.max_failures:
                        raise
                    self.failures += 1
                    restarts += 1
                    self.recover(exc)
                    bar.n = max(0, self.step - first)
                    bar.refresh()
                    continue
                for k, m in enumerate(run):
                    metrics[step + k] = m
                bar.update(len(run))
                bar.set_postfix(loss=f"{run[-1].loss:.4f}")
                if self._checkpoint_due(self.step):
                    written.append(str(self.save_checkpoint(background=self.async_checkpoints)))
        finally:
            if ahead is not None:  # an error other than a worker failure left a run in flight
                group.discard(ahead.refs)
            bar.close()
        self.finish_checkpoint()  # the last background upload commits before fit returns
        if self.checkpoint_dir is not None and target > first and not self._checkpoint_due(self.step):
            written.append(str(self.save_checkpoint()))  # the run ends on a committed checkpoint of its last step
        steps_done = list(range(first, target))
        return FitResult(
            steps_done, [self.history[s] for s in steps_done], [metrics[s] for s in steps_done if s in metrics],
            self.plan, restarts, written, time.perf_counter() - start, {d["device"]: d["node_id"] for d in self.devices()},
        )

    def _run_end(self, step: int, target: int) -> int:
        """End (exclusive) of the run of steps one call executes from ``step``: at most
        ``iterations_per_call`` steps, never past ``target`` or a checkpoint."""
        end = min(target, step + max(1, self.iterations_per_call))
        if self.checkpoint_every:
            end = min(end, (step // self.checkpoint_every + 1) * self.checkpoint_every)
        return end

    def recover(self, exc: PipelineActorError) -> None:
        """New processes (a broken process group cannot be repaired in place), same plan, state
        from the newest complete checkpoint (or the seed); the caller's loop counts the failure.
        An upload from a dead worker never commits: its folder stays unmarked."""
        assert self.group is not None
        self.group.restart()
        self.restart_on(self.plan, self.latest())

    # ----- primitives of the job loop (orchestrator.elastic.job_loop) and the live handle -----
    def submit_step(self, step: int | None = None, count: int = 1) -> "InFlight":
        """Start iteration ``step`` (default: the next) — or the run of ``count`` consecutive
        steps from it, executed back to back in one call per worker — without waiting."""
        at = self.step if step is None else step
        refs, devices = self._workers().submit("run_iterations", at, max(1, count))
        return InFlight(at, refs, devices, time.perf_counter(), max(1, count))

    def complete_step(self, flight: "InFlight", since: float | None = None) -> MeasuredIteration:
        """Gather the next step (``flight``, one step), record its loss and advance; ``since``: when
        the previous step was gathered if ``flight`` was submitted before that (pipelined timing)."""
        assert flight.count == 1, "a run of steps is gathered with complete_run"
        return self.complete_run(flight, since)[0]

    def complete_run(self, flight: "InFlight", since: float | None = None) -> list[MeasuredIteration]:
        """Gather the run ``flight`` started (see :meth:`fit` for how its steps are timed), record
        the losses and advance past it."""
        assert flight.step == self.step, (flight.step, self.step)
        end = flight.step + flight.count
        what = f"steps {flight.step}-{end - 1}" if flight.count > 1 else f"step {flight.step}"
        reports = self._workers().gather(flight.refs, what, self.iteration_timeout_s * flight.count, flight.devices)  # bound per step
        elapsed = time.perf_counter() - max(flight.submitted, since if since is not None else flight.submitted)
        run = combine_run(reports, elapsed)
        for m in run:
            self.history[self.step] = m.loss
            self.step += 1
        return run

    def discard_step(self, flight: "InFlight") -> None:
        self._workers().discard(flight.refs)

    def move_live(self, plan: Plan, transfers: Sequence[tuple[int, int, int, int]], members: Sequence[int]) -> list[dict[str, Any]]:
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
        self._uploading = None
        self.plan = plan
        group.configure(self.spec, plan, self.iteration_timeout_s, members=members, slots=slots)
        if source is None:
            self.step = 0
            return 0
        return self.restore(source)

    # ----- inspection -----
    def devices(self) -> list[dict[str, Any]]:
        """Where each plan device's actor actually runs (reported by the actor at start)."""
        group = self._workers()
        out = []
        for d in sorted(self.plan.devices):
            seen = group.identities[group.slot_of[d]]
            out.append({"device": d, "node_id": seen["node_id"], "accelerator": seen["accelerator"],
                        "actual_device": seen["device"], "pid": seen["pid"]})
        return out

    def state_dicts(self) -> dict[int, dict[str, Tensor]]:
        """Current weights keyed by block (from replica 0 of every stage)."""
        group = self._workers()
        owners = sorted({s.devices[0] for s in self.plan.stages})
        merged: dict[int, dict[str, Tensor]] = {}
        for part in group.call("state_dicts", devices=owners):
            merged.update(part)
        return merged

    def shutdown(self) -> None:
        if self.group is not None and self._owns_group:
            self.group.shutdown()
            self.group = None
        self._started = False

    def __enter__(self) -> "PipelineTrainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ----- recovery in place (orchestrator/train/recovery.py chooses; these carry it out) -----
    def snapshot_in_memory(self) -> dict[int, int]:
        """Every worker snapshots its blocks at the current step into host memory and the next device in the ring
        keeps a copy (Gemini-style), so a death without notice loses only the steps since; returns the host bytes
        of copies held per device. Between iterations only (no step in flight): synchronous, two calls per worker."""
        group = self._workers()
        devices = group.plan_devices()
        refs = dict(zip(devices, group.call("snapshot_copies", self.step, devices=devices, what="in-memory snapshot")))
        neighbours = recovery.ring_neighbours(devices, {d: str(group.identities[group.slot_of[d]].get("node_id", d)) for d in devices})
        kept: dict[int, dict[int, Any]] = {}  # keeper -> block -> ref of the owner's snapshot
        for owner, keeper in neighbours.items():
            kept.setdefault(keeper, {}).update(refs[owner])
        held = group.call_each("keep_peer_copy", {k: (self.step, r) for k, r in kept.items()}, "neighbour's snapshot copy")
        sizes = {k: int(b) for k, b in zip(kept, held)}
        rest = [d for d in devices if d not in sizes]  # keeps no neighbour's copy (alone, or all on one node)
        sizes.update({d: int(r["bytes"]) for d, r in zip(rest, group.call("host_copies", devices=rest))} if rest else {})
        return {d: sizes[d] for d in devices}

    def recover_in_place(self, dead: Collection[int], plan: Plan) -> recovery.InPlaceRecovery:
        """After workers died without notice (``dead``, and any on a node that left; every step in flight discarded):
        the survivors keep their processes, re-form their process group among themselves on ``plan`` (a plan over
        survivors), and roll back to the newest restorable step from host copies (their own, a neighbour's on
        another node) or the newest committed checkpoint. Several deaths at once (a node) are recovered in place too:
        blocks whose every copy died come from storage, at the checkpoint's step.
        Raises :class:`~orchestrator.train.recovery.InPlaceImpossible` (with a one-line ``reason``) when it cannot:
        then :meth:`recover` restarts everything as before."""
        t0 = time.perf_counter()
        group = self._workers()
        lost = group.unreachable_slots()  # a node that went away takes all its workers
        gone = sorted({int(d) for d in dead} | {d for d in group.rank_of if group.slot_of.get(d, d) in lost})
        survivors = sorted(d for d in group.rank_of if d not in gone)
        missing = sorted(set(plan.devices) - set(survivors))
        if missing or not survivors:
            raise recovery.InPlaceImpossible(f"the plan uses device(s) {missing} that have no live worker")
        late = group.unresponsive(survivors, waits.stretched(30.0))  # each finishes (fails) its iteration first (10 s missed one on a loaded 2-core machine)
        if late:
            raise recovery.InPlaceImpossible(f"survivor(s) {sorted(late)} did not answer after the death of {gone}")
        copies = {d: {int(s): b for s, b in r["steps"].items()}
                  for d, r in zip(survivors, group.call("host_copies", devices=survivors, what="host copies"))}
        self._uploading = None  # an upload the dead worker was part of never commits
        stored = self.latest()
        manifest = ckpt.verify(str(stored)) if stored is not None else None
        stored_step = int(manifest["step"]) if manifest is not None else None
        step = recovery.restorable_step(copies, self.plan.num_blocks, stored_step)
        group.reform(self.spec, plan, survivors, self.iteration_timeout_s)
        self.plan = plan
        if step is None:  # nothing kept anywhere: the seed, as a restart without checkpoint
            self.step = 0
            return recovery.InPlaceRecovery(0, "seed", {}, {}, tuple(self._survivors()), time.perf_counter() - t0)
        sources = recovery.block_sources(step, plan, copies, stored_step)
        wanted: dict[int, list[int]] = {}
        for device, blocks in sources.items():
            for b, holder in blocks.items():
                if holder not in (device, recovery.STORAGE):
                    wanted.setdefault(holder, []).append(b)
        exported: dict[int, Any] = {}
        if wanted:
            for part in group.call_each("export_copies", {h: (step, sorted(set(bs))) for h, bs in wanted.items()}, "export copies"):
                exported.update(part)
        args = {d: (step, {b: exported[b] for b, h in blocks.items() if h not in (d, recovery.STORAGE)},
                    str(stored) if stored is not None else None, manifest)
                for d, blocks in sources.items()}
        counts: dict[str, int] = {}
        for part in group.call_each("restore_copies", args, f"roll back to step {step}", self.iteration_timeout_s):
            for k, v in part.items():
                counts[k] = counts.get(k, 0) + v
        self.step = step
        held = {d: int(r["bytes"]) for d, r in zip(survivors, group.call("host_copies", devices=survivors))}
        return recovery.InPlaceRecovery(step, recovery.source_of(sources), counts, held, tuple(self._survivors()),
                                        time.perf_counter() - t0)

    def _survivors(self) -> list[dict[str, Any]]:
        return [{"device": d["device"], "node_id": d["node_id"], "pid": d["pid"]} for d in self.devices()]
