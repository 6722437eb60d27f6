"""Executing one device's program: one handler per IR kind, nothing schedule-specific.

``Executor.run(step)`` walks ``program`` in order and calls the handler of each action's kind. GPipe,
1F1B, interleaving, slicing and replication differ only in the action lists the lowering built;
the handlers see stages, units, peers and row ranges, never a schedule name.

Communication: sends are ``isend`` (asynchronous; handles are kept until they complete and all
are waited for at the end of the iteration), receives are ``irecv`` posted up to
``recv_lookahead`` actions ahead of where the program is (the rule is
:func:`orchestrator.schedule.nccl.recv_post_points`), and waited for at the RECV action, so data
from an early sender flows while this device still computes. Every directed link has its own
two-rank process group (``links``): on NCCL one communicator is one in-order stream with tags
ignored, and a stream per direction is what makes early receives and 1F1B's crossing sends safe
— :func:`orchestrator.schedule.nccl.check_hang_free` proves it for every schedule shape. Per-link order is
the program order on both sides (the lowering guarantees the orders match). A unit whose input
(or output gradient) comes from several peers is received straight into row slices of one
buffer, so no concatenation copy is made.

GPU: no host synchronisation inside the iteration. Spans are CUDA events recorded on the compute
stream and resolved once at the end; losses stay on the device and are read once; inputs are
copied from pinned memory without blocking. Sent tensors are checked against the probed boundary
shape and dtype, so a mismatch (e.g. a kernel that changes dtype only on the GPU) is one clear
error instead of an NCCL byte-count mismatch.

Three objects, each owning its state: the executor owns compute (the forward, backward, BI, W and
step handlers), the stash of units awaiting backward, the losses and the spans; its
:class:`actors.exchange.Exchange` owns communication (groups and links, receives posted, sends in
flight, buffers being assembled, tensors held for consumers, transfer metrics); its
:class:`actors.tables.ProgramTables` owns what depends only on the plan. One
:class:`actors.clock.Clock` times both the spans and the transfers.

Hot path: everything that depends only on the plan is computed once into per-action tables; the
call table ``calls`` holds one bound handler per action (the exchange's own ``send``/``recv`` for
point-to-point actions, no trampoline), and ``run`` only walks it, handing each handler the action
and its program position.

Metrics: per action a ``perf_counter`` pair appended as a tuple (labels are precomputed
strings), per-iteration main-thread CPU time in ``cpu_s``.

Memory metric: on CUDA the allocator's ``max_memory_allocated``; on CPU the high-water mark of
the bytes this worker keeps for backward (autograd saved tensors of in-flight units, deduplicated
by storage, parameters excluded, plus received inputs), counted with ``saved_tensors_hooks``.
The count is taken on the executor's first iteration for every forward action and reused after
(shapes are fixed per action, so it does not change), which keeps the Python hooks off the hot
path of every later iteration.
"""

from __future__ import annotations

import contextlib
import resource
import threading
import time
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import Tensor, nn

from actors import recompute, seeding, user_code
from actors.backward_split import PendingWeights, backward_input
from actors.clock import clock_for
from actors.gpu import check_nccl_dtypes
from actors.exchange import Exchange
from actors.grad_sync import GradSync
from actors.job_spec import JobSpec
from actors.tables import Key, ProgramTables
from actors.transport import nbytes
from orchestrator.core.plan import Plan
from orchestrator.schedule.ir import Action, Kind


_run_backward: Callable[..., Any] | None
try:  # the engine call behind torch.autograd.backward, without its per-call argument checks
    from torch.autograd.graph import _engine_run_backward as _run_backward
except ImportError:  # pragma: no cover - older/newer torch: the public API is equivalent
    _run_backward = None

_thread_time = time.thread_time


def _backward(out: Tensor, grad: Tensor) -> None:
    """``torch.autograd.backward(out, grad)``; ``grad`` is built from the plan with ``out``'s shape."""
    if _run_backward is None:
        torch.autograd.backward(out, grad)
    else:
        _run_backward((out,), (grad,), False, False, (), allow_unreachable=True, accumulate_grad=True)


Handler = Callable[[Action, int], None]  # (the action, its position in the program)


class Executor:
    """Per-plan state of one worker and the handlers of every IR kind (see module docstring)."""

    # Called with the step before the device's first optimizer step of each iteration, and with
    # the stage after each stage's optimizer steps (the stage worker sets them: tied weights,
    # global-norm clipping, LR schedulers; actors/training.py).
    before_step: Callable[[int], bool] | None = None  # False: skip this iteration's steps (fp16 overflow)
    after_step: Callable[[int], None] | None = None
    scale_loss: Callable[[Tensor], Tensor] | None = None  # fp16 loss scaling (after the loss is recorded)
    # Set while copies of this worker's state are being taken in the background (an asynchronous checkpoint's, an
    # in-memory snapshot's: actors.snapshot.BackgroundCopy): the next optimizer step waits for them, which overlap
    # the forward and backward before it.
    snapshot_due: tuple[threading.Event, ...] = ()

    def __init__(
        self, spec: JobSpec, plan: Plan, device: int, rank_of: dict[int, int], program: tuple[Action, ...],
        modules: dict[int, nn.Module], optimizers: dict[int, torch.optim.Optimizer], groups: dict[tuple[int, ...], Any],
        boundary: list[tuple[tuple[int, ...], torch.dtype]], batch_rows: int, torch_device: torch.device,
        links: dict[tuple[int, int], Any] | None = None, evaluating: bool = False,
    ) -> None:
        """``evaluating``: ``program`` is a forward-only pass (:func:`~orchestrator.schedule.lowering.forward_only`) run
        with no gradient and the blocks in eval mode (dropout off), which changes no state."""
        self.spec, self.plan, self.device, self.rank_of, self.program = spec, plan, device, rank_of, program
        self.evaluating = evaluating
        self.modules, self.optimizers = modules, optimizers
        self.boundary, self.batch_rows, self.torch_device = boundary, batch_rows, torch_device
        self.last = len(plan.stages) - 1
        self.cuda = torch_device.type == "cuda"
        if not self.cuda and torch.get_num_interop_threads() != 1:
            try:  # stage workers share the node's cores: no second thread pool (only jit.fork uses it)
                torch.set_num_interop_threads(1)
            except RuntimeError:  # already set, or inter-op work already ran in this process
                pass
        self.param_ptrs = {p.data_ptr() for m in modules.values() for p in m.parameters()}
        links = links or {}  # (sender, receiver) device -> two-rank group; absent: the default group
        self.tables = ProgramTables(spec.recv_lookahead, plan, device, rank_of, program, links, boundary, batch_rows, self.cuda)
        self.clock = clock_for(self.cuda)
        self.now = self.clock.now  # the one time base of spans and transfers (bound once: the hot path)
        self.exchange = Exchange(self.tables, groups, links, torch_device, self.clock)
        self._info, self._labels = self.tables.info, self.tables.labels  # read-only views (hot path: one lookup)
        self._launch_grads = self.tables.launch_grads
        exchange = self.exchange
        self._assemble, self._hand_over = exchange.assemble, exchange.hand_over  # bound once (hot path)
        self.handlers: dict[Kind, Handler] = {
            Kind.FORWARD: self._forward, Kind.BACKWARD: self._backward,
            Kind.BACKWARD_INPUT: self._backward_input, Kind.BACKWARD_WEIGHT: self._backward_weight,
            Kind.SEND_F: exchange.send, Kind.SEND_B: exchange.send,
            Kind.RECV_F: exchange.recv, Kind.RECV_B: exchange.recv,
            Kind.ALL_REDUCE: self._all_reduce, Kind.STEP: self._step,
        }
        self.calls: list[Handler] = [self.handlers[a.kind] for a in program]  # wrapped by actors.injection
        if self.cuda:
            check_nccl_dtypes(self.device, program, self.tables.info,
                              {j: self._stage_params(j) for j in plan.stages_of_device(device) if plan.stages[j].replicas > 1})
        self.held_bytes: dict[int, int] = {}  # forward index -> bytes kept for backward (first iteration)
        self.spans: list[tuple[str, str, float, float]] = []
        self.step_index = -1
        self.at = -1  # the program action running now (len(program): finishing the sends)
        self.injected = False  # call table wrapped by actors.injection.install (tests, rehearsals)

    def waiting_on_peers(self) -> bool:
        """Whether the action running now waits for other workers (a receive, an all-reduce, the last sends): a
        worker that has stopped progressing anywhere else is hung itself, the others wait for it."""
        at = self.at
        if at < 0 or at >= len(self.program):
            return True
        return self.program[at].kind in (Kind.RECV_F, Kind.RECV_B, Kind.ALL_REDUCE)

    # ----- what the stage worker and rehearsals set, through these methods only -----
    def use_hooks(self, before_step: Callable[[int], bool] | None, after_step: Callable[[int], None] | None,
                  scale_loss: Callable[[Tensor], Tensor] | None) -> None:
        """The step hooks of this plan (tied weights, clipping, LR schedules, fp16 loss scaling; actors/training.py)."""
        self.before_step, self.after_step, self.scale_loss = before_step, after_step, scale_loss

    def wait_before_step(self, *copied: threading.Event) -> None:
        """The next optimizer step also waits for ``copied`` (a background copy of the state: a checkpoint's, a
        snapshot's), the first place where the state changes."""
        self.snapshot_due = tuple(e for e in (*self.snapshot_due, *copied) if not e.is_set())  # none kept once set

    def rehearse_with(self, spec: JobSpec) -> None:
        """Rehearsal: ``spec`` with the kills armed (:func:`actors.injection.with_kills`), read by the kill hook."""
        self.spec = spec

    def wrap_calls(self, wrap: Callable[[int, Action, Handler], Handler]) -> bool:
        """Rehearsal (actors/injection.py): every entry of the call table becomes ``wrap(i, action, handler)``, once
        per executor; returns whether it was wrapped now. Between iterations only: ``run`` reads the table once."""
        if self.injected:
            return False
        self.injected = True
        self.calls = [wrap(i, a, h) for i, (a, h) in enumerate(zip(self.program, self.calls))]
        return True

    def stretch_last_span(self, end: float) -> None:
        """Rehearsal: the newest compute span ends at ``end`` (an injected slowdown kept the device busy)."""
        label, kind, start, _ = self.spans[-1]
        self.spans[-1] = (label, kind, start, end)

    def drop_communicators(self) -> None:
        """Forget every handle on a communicator (receives posted, sends in flight, groups, links, the per-action
        table that caches them, the step hooks' groups) after a failed iteration. Why: a handle keeps its group,
        and so its sockets, alive; the worker aborts the groups next (:meth:`actors.stage_worker.StageWorker.abort`)
        and this executor is not run again (a new one comes with the re-formed group)."""
        self.exchange.drop_communicators()
        self.tables.drop_links()
        self.before_step = self.after_step = None

    # ----- the iteration -----
    def run(self, step: int) -> dict[str, Any]:
        spec = self.spec
        seed = (spec.seed * 1_000_003 + step) * 131 + self.device
        if self.cuda:
            torch.manual_seed(seed)
        else:  # the same CPU generator state; torch.manual_seed also walks lazy CUDA/XPU/MTIA seeding
            torch.default_generator.manual_seed(seed)
        self.step_index = step
        self.inputs = self.targets = None
        stages = self.plan.stages_of_device(self.device)
        lr = None if self.evaluating else self._first_lr()  # the rate this step's optimizer steps use (schedulers step after them)
        if 0 in stages or self.last in stages:
            inputs, targets = user_code.batch(spec.data_fn, step, self.batch_rows, self.boundary[0])
            if self.cuda:  # pinned host memory: the copy overlaps instead of blocking the host
                inputs, targets = (t if t.is_cuda else t.pin_memory() for t in (inputs, targets))
                inputs, targets = (t.to(self.torch_device, non_blocking=True) for t in (inputs, targets))
            self.inputs, self.targets = inputs, targets
        self.stash: dict[Key, tuple[Tensor | None, Tensor, int]] = {}
        self.weights_due: dict[Key, tuple[PendingWeights, int]] = {}  # split backwards between BI and W
        exchange, clock = self.exchange, self.clock
        exchange.start()
        if not self.evaluating:  # replicated stages' gradients accumulate in their buckets (actors/grad_sync.py)
            for j in stages:
                if self.plan.stages[j].replicas > 1:
                    self._sync(j).attach()
        self.losses: list[Tensor] = []
        self.stash_now = self.stash_peak = 0
        self.spans = []
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        post_before, calls, program, post = self.tables.post_before, self.calls, self.program, exchange.post
        cpu0 = _thread_time()
        clock.start()
        with evaluation(self.modules.values()) if self.evaluating else contextlib.nullcontext():
            for i in range(len(program)):
                self.at = i  # where this worker is, for the driver's hang triage (StageWorker.progress)
                for r in post_before[i]:
                    post(r)
                calls[i](program[i], i)
        self.at = len(program)  # waiting for its last sends
        exchange.finish()
        loss = float(torch.stack(self.losses).sum().item()) if self.losses else 0.0  # the one host sync (CUDA)
        if self.cuda:
            torch.cuda.synchronize()
        spans, sends, recvs = clock.resolve(self.spans, exchange.sends, exchange.recvs)  # seconds (CUDA: from events)
        self.spans = spans
        elapsed = clock.elapsed()
        cpu = _thread_time() - cpu0
        if self.stash or self.weights_due or exchange.unconsumed():
            raise RuntimeError(f"device {self.device}: iteration ended with unconsumed state (a lowering bug)")
        busy = sum(e - s for _, kind, s, e in spans if kind in ("F", "B", "BI", "W", "all_reduce", "step"))
        waited = sum(d - w for _, _, _, _, w, d in recvs)  # blocked on receives (the rest is overhead)
        peak = torch.cuda.max_memory_allocated() if self.cuda else self.stash_peak
        return {
            "device": self.device, "step": step, "t0_wall": clock.t0_wall, "iteration_s": elapsed, "busy_s": busy,
            "bubble_s": max(0.0, elapsed - busy), "spans": spans, "sends": sends, "recvs": recvs,
            "loss": loss if self.last in stages else None,
            "rows": self.batch_rows if 0 in stages else None, "lr": lr,
            "peak_memory_bytes": int(peak), "memory_metric": "cuda_max_memory_allocated" if self.cuda else "stash_high_water",
            "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu_s": cpu,
            "wait_s": waited, "actions": len(self.program),
        }

    def _first_lr(self) -> tuple[int, float] | None:
        """``(block, lr)`` of this device's first block optimizer's first parameter group (reported so that the
        driver can show the learning rate in force: the lowest block across devices wins)."""
        if not self.optimizers:
            return None
        block = min(self.optimizers)
        groups = self.optimizers[block].param_groups
        return (block, float(groups[0]["lr"])) if groups and "lr" in groups[0] else None

    def _forward(self, a: Action, index: int) -> None:
        start = self.now()
        key, lo, hi, blocks, pieces, scale = self._info[index]
        if a.stage == 0:
            assert self.inputs is not None
            x = self.inputs[lo:hi]
            held = 0
        else:
            x = self._assemble("F", a.stage, a.unit, pieces, lo, hi).detach()
            x.requires_grad_(x.is_floating_point() and not self.evaluating)
            held = nbytes(x)
        known = self.held_bytes.get(index)
        if known is None and not self.cuda:  # first time: count what autograd saves (see module docstring)
            seen: set[int] = {x.data_ptr()}
            counted = 0

            def pack(t: Tensor) -> Tensor:
                nonlocal counted
                ptr = t.untyped_storage().data_ptr()
                if ptr not in seen and ptr not in self.param_ptrs:
                    seen.add(ptr)
                    counted += t.untyped_storage().nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, _identity):
                out = self._apply(a, x, blocks, lo, hi, scale)
            self.held_bytes[index] = counted
            held += counted
        else:
            out = self._apply(a, x, blocks, lo, hi, scale)
            held += known or 0
        if not self.evaluating:  # kept for the backward (an evaluation has none)
            self.stash[key] = (x if a.stage > 0 else None, out, held)
        if a.stage < self.last:
            self._hand_over("F", key, out.detach())
        self.stash_now += held
        if self.stash_now > self.stash_peak:
            self.stash_peak = self.stash_now
        self.spans.append((self._labels[index], "F", start, self.now()))

    def _apply(self, a: Action, x: Tensor, blocks: list[int], lo: int, hi: int, scale: float) -> Tensor:
        out = x
        if hi > lo:
            seeding.enter_unit(self.spec.seed, self.step_index, a.unit)  # dropout seeds (actors/seeding.py)
            if self.plan.stages[a.stage].recompute:  # activation recomputation (actors/recompute.py)
                return self._finish(a, recompute.checkpointed(lambda t: self._blocks(blocks, t), out), lo, hi, scale)
            out = self._blocks(blocks, out)
        return self._finish(a, out, lo, hi, scale)

    def _blocks(self, blocks: list[int], out: Tensor) -> Tensor:
        modules = self.modules
        try:
            for b in blocks:
                out = modules[b](out)
        except Exception as exc:  # noqa: BLE001 - deterministic in the user's model: reported once, not retried
            raise user_code.block_failed(b, modules[b], out, exc) from None
        return out

    def _finish(self, a: Action, out: Tensor, lo: int, hi: int, scale: float) -> Tensor:
        """The last stage turns its output into the unit's weighted loss."""
        if a.stage == self.last:
            assert self.targets is not None
            if hi > lo:
                out = user_code.loss(self.spec.loss_fn, out, self.targets[lo:hi]) * scale
                self.losses.append(out.detach())
                if self.scale_loss is not None and not self.evaluating:
                    out = self.scale_loss(out)
            else:
                out = torch.zeros((), device=self.torch_device, requires_grad=False)
        return out

    def _backward(self, a: Action, index: int) -> None:
        start = self.now()
        key, lo, hi, pieces, keep = self._info[index]
        x, out, held = self.stash.pop(key)
        grad = torch.ones_like(out) if a.stage == self.last else self._assemble("B", a.stage, a.unit, pieces, lo, hi)
        if out.requires_grad:
            stage = self._launch_grads.get(index)
            if stage is None:
                _backward(out, grad)
            else:  # the stage's last backward: its gradient buckets start as they become final
                sync = self._sync(stage)
                sync.arm()
                try:
                    _backward(out, grad)
                finally:
                    sync.disarm()
        if x is not None and keep:
            self._hand_over("B", key, x.grad if x.grad is not None else torch.zeros_like(x))
        self.stash_now -= held
        self.spans.append((self._labels[index], "B", start, self.now()))

    def _backward_input(self, a: Action, index: int) -> None:
        """``BI``: the input gradient now, the weight gradients kept for ``W`` (actors/backward_split.py)."""
        start = self.now()
        key, lo, hi, pieces, keep = self._info[index]
        x, out, held = self.stash.pop(key)
        grad = torch.ones_like(out) if a.stage == self.last else self._assemble("B", a.stage, a.unit, pieces, lo, hi)
        dx, pending = backward_input(out, grad, x, self._stage_params(a.stage), _backward)
        if x is not None and keep:
            self._hand_over("B", key, dx if dx is not None else torch.zeros_like(x))
        self.weights_due[key] = (pending, held)
        self.spans.append((self._labels[index], "BI", start, self.now()))

    def _backward_weight(self, a: Action, index: int) -> None:
        start = self.now()
        pending, held = self.weights_due.pop(self._info[index])
        stage = self._launch_grads.get(index)
        if stage is None:
            pending.run(self._stage_params(a.stage), _backward)
        else:  # the stage's last W: its gradient buckets start as they become final
            sync = self._sync(stage)
            sync.arm()
            try:
                pending.run(self._stage_params(a.stage), _backward, sync.ready)
            finally:
                sync.disarm()
        self.stash_now -= held
        self.spans.append((self._labels[index], "W", start, self.now()))

    def _stage_params(self, stage: int) -> list[nn.Parameter]:
        s = self.plan.stages[stage]
        return [p for b in range(s.first, s.last) for p in self.modules[b].parameters()]

    def _sync(self, stage: int) -> GradSync:
        return self.exchange.grad_sync(stage, self._stage_params(stage), self.plan.stages[stage].devices)

    def _all_reduce(self, a: Action, index: int) -> None:
        """The buckets started during the stage's last backward (the rest start now); waits for their sums."""
        start = self.now()
        self._sync(a.stage).finish()
        self.spans.append((self._labels[index], "all_reduce", start, self.now()))

    def _step(self, a: Action, index: int) -> None:
        start = self.now()
        s = self.plan.stages[a.stage]
        if self.snapshot_due:
            for copied in self.snapshot_due:
                copied.wait()
            self.snapshot_due = ()
            self.spans.append((self._labels[index], "copy_wait", start, self.now()))  # the stall the copy cost
            start = self.now()
        stepping = self.before_step is None or self.before_step(self.step_index)
        for b in range(s.first, s.last):
            opt = self.optimizers.get(b)
            if opt is not None:
                if stepping:
                    opt.step()
                opt.zero_grad(set_to_none=True)
        if self.after_step is not None:
            self.after_step(a.stage)
        self.spans.append((self._labels[index], "step", start, self.now()))


@contextlib.contextmanager
def evaluation(modules: Iterable[nn.Module]) -> Iterator[None]:
    """No gradient and every block in eval mode (dropout off, batch norm on its running statistics); each block's
    own mode is restored after, so an evaluation changes nothing the next training step sees."""
    held = list(modules)
    modes = [m.training for m in held]
    try:
        for m in held:
            m.eval()
        with torch.no_grad():
            yield
    finally:
        for m, mode in zip(held, modes):
            m.train(mode)


def _identity(t: Tensor) -> Tensor:
    return t
