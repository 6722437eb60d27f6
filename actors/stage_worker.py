"""The stage actor: a dispatch table from IR :class:`Kind` to handler, walked in program order.

One worker per plan device. It never re-derives the schedule: it calls
:func:`orchestrator.schedule.lowering.lower` on the plan it was given and executes
``programs[device]`` action by action, exactly as the simulator times the same list. Everything
the handlers need (row ranges, peers, tags, buffer shapes) is recomputed from the plan, so a
sender and its receiver agree without exchanging metadata per micro-batch.

Shapes: each worker builds the full model from the factory once at setup (same seed everywhere,
which is also how all workers get identical initial weights), pushes ONE row of ``data_fn(0)``
through every block under ``no_grad`` and records each block boundary's trailing shape and dtype.
Row counts come from the row rules in :mod:`actors.transport`, so receive buffers are allocated
exactly and no header is sent. Boundary tensors must therefore be batch-first, floating point,
with trailing dimensions that do not change from step to step.

Data: stage-0 and last-stage workers call the picklable ``data_fn(step)`` themselves and slice
their rows; the driver is never on the data path.

Live re-partitioning (:meth:`StageWorker.live_move`): between iterations the driver sends every
member the new plan and the list of block hand-overs (from
:func:`orchestrator.adapt.handle.move_transfers`). Senders ship weights *and* optimizer
state of whole blocks straight to the receiver over the job's own process group; everyone else
keeps its modules and optimizer objects untouched, so training stays exact across the move. A
worker may be a process-group *member* without holding blocks (an idle, alive device): that is
what lets the job start using a device without re-creating the process group.

Fault injection (slowdowns, link delays, a crash) lives in :mod:`actors.injection` and is
installed only when asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import time
from typing import Any, Callable, Iterator

import ray
import torch
import torch.distributed as dist
from torch import Tensor, nn

from actors import placement, probe
from actors import user_code
from actors.materialize import materialize
from actors.tied import TiedGrads, tie_table
from actors.training import BlockSchedule, NormLayout, StepHooks, norm_contributors, schedulers_for
from actors.execution import Executor
from actors.metrics import HeldCopies, MoveReply, WorkerProgress, WorkerStatus
from actors.checkpoint import host_copy
from actors.job_spec import JobSpec, cpu_threads
from actors.worker_checkpoints import WorkerCheckpoints
from actors import injection
from actors.injection import FaultKnobs
from actors.transport import (
    MAX_MICROBATCHES, CommunicatorsAborted, abort_communicators, backend_for, destroy_groups, free_endpoint, init_group, largest_buckets,
    link_groups, link_messages, new_group, replica_groups, select_device, shorten_timeouts, warm_up,
)
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.schedule.ir import Action, Kind
from orchestrator.schedule.lowering import forward_only, lower
from orchestrator.schedule.nccl import directed_links

class StageWorker:
    """Wrapped with ``ray.remote`` by :mod:`actors.group`; plain class so it is testable in-process."""

    def __init__(self) -> None:
        self.device_id = -1
        self.executor: Executor | None = None
        self.knobs = FaultKnobs()
        self.injecting = False  # a rehearsal or test asked for injection (actors/injection.py)
        self.completed_step = -1  # last step whose iteration finished here (failure triage)
        self.steady = False  # a first iteration ran under the current communicators
        self.ties: dict[str, list[tuple[int, str]]] = {}  # tied weights' copies (actors/tied.py)
        self.schedulers: dict[int, BlockSchedule] = {}  # block -> LR scheduler of its optimizer (actors/training.py)
        self.checkpoints = WorkerCheckpoints()  # checkpoints written from here, host copies for recovery in place
        self.aborted = False  # communicators closed after a failed iteration (until the next group is formed)
        self.norm_layout: NormLayout | None = None  # the model's clip_grad_norm_ order (actors/training.py)
        self.hooks: StepHooks | None = None  # owns the norm and tied groups of the current plan
        self._evaluator: tuple[Executor, Executor] | None = None  # (the training executor it was built for, the evaluation's)
        self.left_at: float | None = None  # wall clock when it last shut down (left the job's process group)

    # ----- setup -----
    def endpoint(self) -> tuple[str, int]:
        """Rank 0 picks the rendezvous address; the driver hands it to everyone once."""
        return free_endpoint()

    def pid(self) -> int:
        return os.getpid()

    def identity(self) -> dict[str, Any]:
        """Where this process runs (node, accelerator, device), for the placement check at start."""
        select_device()
        return placement.identity()

    # ----- probes (before the first plan; see actors/probe.py) -----
    def probe_speed(self, seconds_of: Callable[[torch.device], float] | None = None) -> float:
        """Seconds of the probe's work on this device (``None``: the built-in matmul probe)."""
        return (seconds_of or probe.builtin_seconds)(select_device())

    def probe_join(self, host: str, port: int, rank_of: dict[int, int], device: int, timeout_s: float = 120.0) -> None:
        torch_device = select_device()
        self.device_id = device
        init_group(host, port, rank_of[device], len(rank_of), backend_for(torch_device), timeout_s, torch_device)

    def probe_links(self, pairs: list[tuple[int, int]], rank_of: dict[int, int]) -> dict[tuple[int, int], tuple[float, float]]:
        out = probe.ping(pairs, self.device_id, rank_of, select_device())
        dist.destroy_process_group()  # the job's own group is created by configure
        return out

    def configure(
        self, spec: JobSpec, plan_dict: dict[str, Any], device: int, rank_of: dict[int, int], host: str, port: int,
        keep_copies: bool = False,
    ) -> dict[str, Any]:
        """Build this device's blocks and optimizers, join the process group, prepare the program.
        ``keep_copies``: keep the host copies of block state (a recovery in place restores from them next);
        otherwise they belong to an earlier job or state and are dropped."""
        if not keep_copies:
            self.checkpoints.forget_copies()
        plan = Plan.from_dict(plan_dict)
        if plan.num_microbatches > MAX_MICROBATCHES:
            raise UserError(f"at most {MAX_MICROBATCHES} micro-batches per iteration are supported")
        self.device_id = device
        torch_device = select_device()
        if torch_device.type == "cpu":
            torch.set_num_threads(cpu_threads(spec.threads, len(rank_of)))
        torch.manual_seed(spec.seed)
        blocks = user_code.blocks(spec.model_factory)
        if len(blocks) != plan.num_blocks:
            raise UserError(f"the model factory built {len(blocks)} blocks but the plan covers {plan.num_blocks}")
        inputs, _ = user_code.batch(spec.data_fn, 0)
        boundary = probe_boundaries(blocks, inputs)
        # An alive member that the plan does not use holds no blocks and runs an empty program.
        mine = sorted(b for j in plan.stages_of_device(device) for b in range(plan.stages[j].first, plan.stages[j].last))
        # meta-built models: only this device's blocks get real weights (actors/materialize.py)
        modules = {b: materialize(blocks[b], torch_device, spec.seed, f"block{b}") for b in mine}
        self.ties = tie_table(blocks)
        self.norm_layout = NormLayout.of(blocks)
        del blocks  # the other devices' blocks: only needed for the identical RNG stream and the probe
        optimizers = {b: user_code.optimizer(spec.optimizer_factory, m.parameters(), b) for b, m in modules.items() if any(True for _ in m.parameters())}
        self.schedulers = schedulers_for(spec.training, optimizers)
        if spec.eval_data_fn is None and any(s.on_metric for s in self.schedulers.values()):
            raise UserError("ReduceLROnPlateau steps on the evaluation loss: give TrainConfig an eval_data_fn and eval_every")
        # keep_copies: only a recovery after a death asks for it (WorkerGroup.reform), so the old world holds a dead rank
        init_group(host, port, rank_of[device], len(rank_of), backend_for(torch_device), spec.pg_timeout_s, torch_device,
                   member_died=keep_copies)
        self.aborted = False
        schedule = lower(plan)
        groups = replica_groups(plan, rank_of, timeout_s=spec.pg_timeout_s)
        links = link_groups(directed_links(schedule), rank_of, timeout_s=spec.pg_timeout_s)
        hooks = self._step_hooks(spec, plan, device, rank_of, modules, torch_device)
        warm_up(device, rank_of, links, groups, torch_device, link_messages(plan, schedule.programs, boundary, int(inputs.shape[0])),
                largest_buckets(plan, device, modules))
        self.executor = self._executor(
            spec, plan, device, rank_of, schedule.programs.get(device, ()), modules, optimizers, groups, boundary,
            int(inputs.shape[0]), torch_device, links=links,
        )
        self._install(hooks)
        self.completed_step = -1
        self.steady = False
        return {"device": device, "rank": rank_of[device], "blocks": mine, "pid": os.getpid(), "backend": dist.get_backend()}

    # ----- training -----
    def run_iteration(self, step: int) -> dict[str, Any]:
        if self.executor is None:
            raise RuntimeError("worker not configured")
        if self.aborted:
            raise CommunicatorsAborted(f"device {self.device_id}: communicators aborted after a failed iteration; reconfigure first")
        try:
            with user_output() as out:
                report = self.executor.run(step)
        except BaseException:
            self.abort()
            raise
        if out.getvalue():
            report["out"] = out.getvalue()
        self.completed_step = step
        if not self.steady:
            self.steady = True
            if self.executor.cuda:  # the watchdog's clock starts at enqueue: leave room for a slow iteration
                ex = self.executor
                bound = max(ex.spec.steady_timeout_s, 5.0 * float(report["iteration_s"]))
                shorten_timeouts(bound, ex.exchange.communicators())
        return report

    def evaluate(self, batches: int) -> list[dict[str, Any]]:
        """The evaluation pass over ``eval_data_fn(0 .. batches - 1)``, forward only on the current plan (one
        report each, losses from the last stage). Its executor shares this worker's blocks and communicators and is
        built once per plan (a move or a re-configure builds a new training executor, and so a new one)."""
        ex = self._ready()
        if self.aborted:
            raise CommunicatorsAborted(f"device {self.device_id}: communicators aborted after a failed iteration; reconfigure first")
        spec = ex.spec
        if spec.eval_data_fn is None:
            raise UserError("evaluate: the job has no eval_data_fn")
        if self._evaluator is None or self._evaluator[0] is not ex:
            program = forward_only(ex.plan).programs.get(ex.device, ())
            eval_spec = dataclasses.replace(spec, data_fn=spec.eval_data_fn, injected=None)
            rows = int(user_code.batch(spec.eval_data_fn, 0)[0].shape[0])
            self._evaluator = (ex, Executor(eval_spec, ex.plan, ex.device, ex.rank_of, program, ex.modules, ex.optimizers,
                                            ex.exchange.groups, ex.boundary, rows, ex.torch_device, links=ex.exchange.links,
                                            evaluating=True))
        evaluator = self._evaluator[1]
        try:
            with user_output() as out:
                reports = [evaluator.run(i) for i in range(batches)]
        except BaseException:
            self.abort()
            raise
        if out.getvalue():
            reports[-1]["out"] = out.getvalue()
        return reports

    def run_iterations(self, first: int, count: int) -> list[dict[str, Any]]:
        """Steps ``first .. first + count - 1`` back to back in one call, one report each.

        Why: every remote call costs the worker Ray's task hand-off (the result returned, the next
        task started) and the driver a gather; on a small model that is a large share of an
        iteration. A failure ends the call (the reports of the finished steps are lost with it;
        the trainer recovers from a checkpoint, which never lies inside a run)."""
        return [self.run_iteration(first + i) for i in range(count)]

    def _step_hooks(self, spec: JobSpec, plan: Plan, device: int, rank_of: dict[int, int],
                    modules: dict[int, nn.Module], torch_device: torch.device) -> StepHooks | None:
        """Tied-gradient sums, global-norm clipping and LR schedules of this plan (a collective:
        every member creates the same groups in the same order). The previous plan's hooks' groups
        are destroyed first: each NCCL communicator holds GPU memory and a stream for its life."""
        if self.hooks is not None:
            destroy_groups(self.hooks.groups())  # gone already if the default group was re-created
            self.hooks = None
        make = lambda ranks: new_group(ranks, spec.pg_timeout_s)  # noqa: E731
        tied = TiedGrads.build(self.ties, plan, device, rank_of, modules, make)
        agree = spec.training.max_grad_norm is not None or spec.training.loss_scale is not None  # needs every stage
        norm_group = make(sorted(rank_of[d] for d in plan.devices)) if agree and len(plan.devices) > 1 else None
        if tied is None and not agree and not self.schedulers:
            return None
        every = [p for m in modules.values() for p in m.parameters()]
        self.hooks = StepHooks(spec.training, tied, norm_contributors(plan, device, modules), every, norm_group, self.schedulers,
                               plan, torch_device, self.norm_layout)
        return self.hooks

    def _install(self, hooks: StepHooks | None) -> None:
        ex = self._ready()
        ex.use_hooks(None if hooks is None else hooks.before,
                     None if hooks is None or not self.schedulers else hooks.after,
                     None if hooks is None or hooks.scaler is None else hooks.scaler.scale_loss)

    def _executor(self, *args: Any, **kwargs: Any) -> Executor:
        ex = Executor(*args, **kwargs)
        ex.wait_before_step(*self.checkpoints.snapshot_pending())  # a new plan's first step waits for the copy too
        if self.injecting or ex.spec.injected is not None:  # fault injection is opt-in (actors/injection.py)
            injection.install(ex, self.knobs)
        return ex

    def abort(self) -> None:
        """Give up this iteration's communication: close every communicator at once (see
        :func:`actors.transport.abort_communicators`), so the peers blocked on this rank fail now
        instead of at their timeout. The next configure or re-forming move builds a new group."""
        # The executor's handles would keep the groups, and so their sockets, alive: dropped first
        # (a gc.collect here would cost most of a second; reference counting frees them at once).
        if self.executor is not None:
            self.executor.drop_communicators()
        if self._evaluator is not None:
            self._evaluator[1].drop_communicators()
            self._evaluator = None
        self.hooks = None  # its norm and tied groups too
        abort_communicators()
        self.aborted = True

    # ----- fault injection -----
    def set_faults(self, slowdown: float, send_delay_per_byte: dict[int, float]) -> None:
        """Refused on a GPU worker, before any iteration: a host sleep cannot slow a GPU kernel, and
        the injected spans would mix host seconds with CUDA events."""
        if (float(slowdown) != 1.0 or any(send_delay_per_byte.values())) and select_device().type == "cuda":
            raise UserError("slowdown and link-delay injection run on CPU workers only")
        self.knobs.set(slowdown, send_delay_per_byte)
        if self.knobs.active:
            self.injecting = True  # from now on every executor this worker builds carries the hooks
            if self.executor is not None:
                injection.install(self.executor, self.knobs)

    def arm_kill(self, step: int, hang: bool = False) -> None:
        """Die halfway through iteration ``step`` (like a crashed process), via the executor's hook; ``hang``: block
        there for ever instead (a hung rank)."""
        ex = self._ready()
        here = {(step, self.device_id)}
        hangs = (ex.spec.injected.hangs if isinstance(ex.spec.injected, injection.Kills) else frozenset()) | (here if hang else set())
        ex.rehearse_with(injection.with_kills(ex.spec, injection.kills_of(ex.spec) | here, hangs))
        injection.install(ex, self.knobs)

    @ray.method(concurrency_group="probe")
    def release(self) -> None:
        """After a peer died or was ended (NCCL only): abort this worker's communicators from the probe thread, so an
        iteration blocked on the dead peer fails and the worker answers again. Why: a kernel waiting for a dead peer
        never returns and the host waits in the loss read; with the watchdog's kill off
        (:func:`actors.transport.nccl_environment`) nothing else ends it. Gloo needs none (the peer's closed sockets
        fail the waits) and cannot use it (an abort from another thread does not end a gloo receive)."""
        abort_communicators()
        self.aborted = True  # until the recovery's re-form: nothing runs on these communicators

    @ray.method(concurrency_group="probe")
    def progress(self) -> WorkerProgress:
        """Where this worker is, answered on its own thread while an iteration may be blocked (hang triage)."""
        ex = self.executor
        if ex is None:
            return WorkerProgress(self.device_id, None, None, True)
        return WorkerProgress(self.device_id, ex.step_index, ex.at, ex.waiting_on_peers())

    def status(self) -> WorkerStatus:
        held = tuple(sorted(self.executor.modules)) if self.executor is not None else ()
        return WorkerStatus(self.device_id, self.completed_step, held, os.getpid(), self.left_at)

    # ----- live re-partitioning -----
    def live_move(
        self, plan_dict: dict[str, Any], rank_of: dict[int, int], endpoint: tuple[str, int] | None,
        transfers: list[tuple[int, int, int, int]], create_groups: list[tuple[int, ...]],
        device: int = -1, spec: JobSpec | None = None, step: int = 0,
    ) -> MoveReply:
        """Switch to ``plan_dict`` keeping this process and every block it keeps.

        ``endpoint``: re-join a new process group first (membership changed); ``None`` keeps the
        current one. ``transfers``: ``(src, dst, first, last)`` in one global order; each worker
        walks the list and does its sends and receives in that order, which cannot deadlock (the
        earliest unfinished transfer always has both ends ready). ``create_groups``: replica
        subgroups to create, in the same order on every member (``new_group`` is collective).
        ``spec``/``device``/``step``: only for a worker joining the job (a new device), which
        continues at ``step`` (its LR schedules too).
        """
        self.checkpoints.snapshot_taken()
        plan = Plan.from_dict(plan_dict)
        ex = self.executor
        previous = self.schedulers if spec is None else {}  # a newcomer's belong to another job
        t0 = time.perf_counter()
        modules: dict[int, nn.Module] = {}
        optimizers: dict[int, torch.optim.Optimizer] = {}
        old_groups: dict[tuple[int, ...], Any] = {}
        old_links: dict[tuple[int, int], Any] = {}
        if spec is not None:  # a newcomer: whatever it ran before belongs to another job or plan
            self.device_id, self.completed_step = device, step - 1
            torch_device = select_device()
            if torch_device.type == "cpu":
                torch.set_num_threads(cpu_threads(spec.threads, len(rank_of)))
            inputs, _ = user_code.batch(spec.data_fn, 0)
            built = user_code.blocks(spec.model_factory)
            boundary, batch_rows = probe_boundaries(built, inputs), int(inputs.shape[0])
            self.ties = tie_table(built)
            self.norm_layout = NormLayout.of(built)
        elif ex is not None:
            spec, boundary, batch_rows, torch_device = ex.spec, ex.boundary, ex.batch_rows, ex.torch_device
            if ex.cuda and self.steady:  # state hand-over and the next first iteration get the setup bound back
                shorten_timeouts(spec.pg_timeout_s, ex.exchange.communicators())
            modules, optimizers = dict(ex.modules), dict(ex.optimizers)
            old_groups, old_links = ex.exchange.groups, ex.exchange.links
            # A failed iteration may have left accumulated gradients behind.
            for module in modules.values():
                module.zero_grad(set_to_none=True)
        else:
            raise RuntimeError("worker not configured and no job spec given")
        device = self.device_id
        groups: dict[tuple[int, ...], Any]
        schedule = lower(plan)
        if endpoint is not None:  # a new process group: every old subgroup went with the old one
            init_group(endpoint[0], endpoint[1], rank_of[device], len(rank_of), backend_for(torch_device), spec.pg_timeout_s,
                       torch_device)
            groups, old_links = {}, {}
            self.aborted = False
        elif self.aborted:
            raise CommunicatorsAborted(f"device {device}: communicators aborted after a failed iteration; a move must re-form the group")
        else:
            wanted = {g for g in plan.device_groups if len(g) > 1}
            groups = {g: h for g, h in old_groups.items() if g in wanted}
            destroy_groups(h for g, h in old_groups.items() if g not in wanted)
        for g in create_groups:
            groups[tuple(g)] = new_group(sorted(rank_of[d] for d in g), spec.pg_timeout_s)
        wanted_links = directed_links(schedule)
        links = link_groups(wanted_links, rank_of, old_links, spec.pg_timeout_s)
        destroy_groups(h for k, h in old_links.items() if k not in links)
        t_group = time.perf_counter()
        sent = received = 0
        templates: list[nn.Module] | None = None
        fresh: dict[int, BlockSchedule] = {}  # the received blocks' schedules, restored with their optimizers
        for src, dst, first, last in transfers:
            if src == device:
                payload = {b: (modules[b].state_dict(), optimizers[b].state_dict() if b in optimizers else None) for b in range(first, last)}
                # Host copies: pickling CUDA tensors would move them host -> GPU -> host through
                # the object collective (about 3x the payload in transient GPU memory).
                payload = host_copy(payload, copy=False)
                dist.send_object_list([payload], dst=rank_of[dst])
                sent += _state_bytes(payload)
            elif dst == device:
                box: list[Any] = [None]
                dist.recv_object_list(box, src=rank_of[src])
                if templates is None:
                    templates = user_code.blocks(spec.model_factory)
                for b, (weights, opt_state) in box[0].items():
                    module = materialize(templates[b], torch_device, spec.seed, f"block{b}")
                    module.load_state_dict(weights)
                    modules[b] = module
                    if opt_state is not None:
                        optimizer = user_code.optimizer(spec.optimizer_factory, module.parameters(), b)
                        fresh.update(schedulers_for(spec.training, {b: optimizer}))  # before the load: it restores them
                        optimizer.load_state_dict(opt_state)
                        optimizers[b] = optimizer
                    received += _state_bytes({b: (weights, opt_state)})
        held = {b for j in plan.stages_of_device(device) for b in range(plan.stages[j].first, plan.stages[j].last)}
        missing = held - set(modules)
        if missing:
            raise RuntimeError(f"device {device}: blocks {sorted(missing)} were neither held nor received (bad transfer list)")
        modules = {b: m for b, m in modules.items() if b in held}
        optimizers = {b: o for b, o in optimizers.items() if b in held}
        # after the hand-overs (one global order: transfers, then the links and groups), when every held block is here
        warm_up(device, rank_of, links, groups, torch_device, link_messages(plan, schedule.programs, boundary, batch_rows),
                largest_buckets(plan, device, modules))
        for arrived in fresh.values():
            arrived.forward(self.completed_step + 1)
        self.schedulers = {**{b: s for b, s in previous.items() if b in optimizers and b not in fresh}, **fresh}
        hooks = self._step_hooks(spec, plan, device, rank_of, modules, torch_device)
        self.executor = self._executor(
            spec, plan, device, rank_of, schedule.programs.get(device, ()), modules, optimizers, groups, boundary,
            batch_rows, torch_device, links=links,
        )
        self._install(hooks)
        self.steady = False
        done = time.perf_counter()
        return MoveReply(device, sent, received, tuple(sorted(held)), endpoint is not None, len(create_groups),
                         t_group - t0, done - t_group, os.getpid(), time.time())

    def state_dicts(self) -> dict[int, dict[str, Tensor]]:
        """Weights of the blocks held here (tests compare them with the reference)."""
        ex = self._ready()
        return {b: {k: v.detach().cpu().clone() for k, v in m.state_dict().items()} for b, m in ex.modules.items()}

    # ----- checkpoints and host copies (actors/worker_checkpoints.py) -----
    def save_blocks(self, directory: str, background: bool = False, step: int | None = None) -> list[dict[str, Any]]:
        """Write the blocks this worker owns (see :meth:`WorkerCheckpoints.save_blocks`)."""
        ex = self._ready()
        out = self.checkpoints.save_blocks(ex, self.completed_step + 1, directory, background, step)
        if background:  # the next optimizer step waits for the upload thread's copy of the state
            ex.wait_before_step(*self.checkpoints.snapshot_pending())
        return out

    def finish_blocks(self) -> list[dict[str, Any]]:
        return self.checkpoints.finish_blocks()

    def load_blocks(self, directory: str, manifest: dict[str, Any]) -> int:
        ex = self._ready()
        self._resume_at(self.checkpoints.load_blocks(ex, directory, manifest))
        return len(ex.modules)

    def host_copies(self) -> HeldCopies:
        return self.checkpoints.host_copies()

    def snapshot_copies(self, step: int) -> int:
        """Start the in-memory snapshot at ``step`` (see :meth:`WorkerCheckpoints.snapshot_copies`); returns ``step``."""
        self.checkpoints.snapshot_copies(self._ready(), step)
        return step

    @ray.method(concurrency_group="copies")
    def peer_payloads(self, step: int, started: int) -> dict[int, Any]:
        """``started``: :meth:`snapshot_copies`'s answer, passed by reference so that this runs after it."""
        return self.checkpoints.peer_payloads(step)

    @ray.method(concurrency_group="copies")
    def keep_peer_copy(self, step: int, *parts: dict[int, Any]) -> int:
        return self.checkpoints.keep_peer_copy(step, *parts)

    def export_copies(self, step: int, blocks: list[int]) -> dict[int, Any]:
        return self.checkpoints.export_copies(self.device_id, step, blocks)

    def restore_copies(self, step: int, fetched: dict[int, Any], directory: str | None,
                       manifest: dict[str, Any] | None) -> dict[str, int]:
        counts = self.checkpoints.restore_copies(self._ready(), step, fetched, directory, manifest)
        self._resume_at(step)
        return counts

    def _resume_at(self, step: int) -> None:
        """After a restore: ``step`` is the next step to run here (the LR schedules came back with the optimizers'
        state; one saved without them is stepped forward to ``step``)."""
        for lr in self.schedulers.values():
            lr.forward(step)
        self.completed_step = step - 1

    def step_on_metric(self, value: float) -> None:
        """After an evaluation (nothing in flight): schedulers driven by a metric (``ReduceLROnPlateau``) step on its loss."""
        for lr in self.schedulers.values():
            lr.metric(value)

    def shutdown(self) -> None:
        self.left_at = time.time()  # when it began to leave (a live move's leaver leaves while the members re-join)
        if dist.is_initialized():
            dist.destroy_process_group()
        self.executor = self._evaluator = None

    def _ready(self) -> Executor:
        if self.executor is None:
            raise RuntimeError("worker not configured")
        return self.executor


def _state_bytes(payload: dict[int, tuple[Any, Any]]) -> int:
    """Tensor bytes in a hand-over payload (weights and optimizer state)."""
    total = 0
    stack: list[Any] = [payload]
    while stack:
        item = stack.pop()
        if isinstance(item, Tensor):
            total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


USER_OUTPUT_LIMIT = 1 << 16
"""Characters of the user's printed output a worker returns per call (the rest is cut, saying so)."""


class _Bounded(io.StringIO):
    def write(self, text: str) -> int:
        room = USER_OUTPUT_LIMIT - self.tell()
        if room > 0:
            super().write(text[:room] if len(text) <= room else text[:room] + "\n[output cut]\n")
        return len(text)


@contextlib.contextmanager
def user_output() -> Iterator[io.StringIO]:
    """What the user's code (their model, ``data_fn``, loss) prints during a call, kept for the driver, which prints
    it on its own stdout prefixed by stage (Ray's log streaming is off: a driver's stderr is for its errors)."""
    buffer = _Bounded()
    with contextlib.redirect_stdout(buffer):
        yield buffer


def probe_boundaries(blocks: list[nn.Module], inputs: Tensor) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Trailing shape and dtype of the tensor entering each block (index L: the model output)."""
    return user_code.probe(blocks, inputs)
