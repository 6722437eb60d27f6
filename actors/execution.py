"""Executing one device's program: one handler per IR kind, nothing schedule-specific.

``Executor.run(step)`` walks ``program`` in order and calls ``HANDLERS[action.kind]``. GPipe,
1F1B, interleaving, slicing and replication differ only in the action lists the lowering built;
the handlers see stages, units, peers and row ranges, never a schedule name.

Communication: sends are ``isend`` (asynchronous; handles are kept until they complete and all
are waited for at the end of the iteration), receives are ``irecv`` posted up to
``recv_lookahead`` actions ahead of where the program is, and waited for at the RECV action, so
data from an early sender flows while this device still computes. Per-link order is the program
order on both sides (the lowering guarantees the orders match), which NCCL needs; gloo also
matches by tag.

Memory metric: on CUDA the allocator's ``max_memory_allocated``; on CPU the high-water mark of
the bytes this worker keeps for backward (autograd saved tensors of in-flight units, deduplicated
by storage, parameters excluded, plus received inputs), counted with ``saved_tensors_hooks``.
"""

from __future__ import annotations

import os
import resource
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from actors.transport import Range, intersect, nbytes, stage_rows, tag
from orchestrator.plan import Plan
from orchestrator.schedule.ir import Action, Kind
from orchestrator.schedule.lowering import peers

if TYPE_CHECKING:
    from actors.stage_worker import JobSpec

Key = tuple[int, tuple[int, int]]  # (stage, unit)


class Executor:
    """Per-plan state of one worker and the handlers of every IR kind."""

    def __init__(
        self, spec: "JobSpec", plan: Plan, device: int, rank_of: dict[int, int], program: tuple[Action, ...],
        modules: dict[int, nn.Module], optimizers: dict[int, torch.optim.Optimizer], groups: dict[tuple[int, ...], Any],
        boundary: list[tuple[tuple[int, ...], torch.dtype]], batch_rows: int, torch_device: torch.device,
    ) -> None:
        self.spec, self.plan, self.device, self.rank_of, self.program = spec, plan, device, rank_of, program
        self.modules, self.optimizers, self.groups = modules, optimizers, groups
        self.boundary, self.batch_rows, self.torch_device = boundary, batch_rows, torch_device
        self.last = len(plan.stages) - 1
        self._rows: dict[tuple[int, tuple[int, int], int], Range] = {}
        self._peers: dict[tuple[int, int], list[int]] = {}
        self.cuda = torch_device.type == "cuda"
        self.param_ptrs = {p.data_ptr() for m in modules.values() for p in m.parameters()}
        self.handlers: dict[Kind, Callable[[Action], None]] = {
            Kind.FORWARD: self._forward, Kind.BACKWARD: self._backward,
            Kind.SEND_F: self._send, Kind.SEND_B: self._send,
            Kind.RECV_F: self._recv, Kind.RECV_B: self._recv,
            Kind.ALL_REDUCE: self._all_reduce, Kind.STEP: self._step,
        }
        # How many actions consume each produced tensor (sends + a local hand-off), so it is
        # released as soon as the last consumer ran instead of at the end of the iteration.
        self.consumers: dict[tuple[str, int, tuple[int, int]], int] = defaultdict(int)
        mine = set(plan.stages_of_device(device))
        for a in program:
            if a.kind is Kind.SEND_F:
                self.consumers[("F", a.stage, a.unit)] += 1
            elif a.kind is Kind.SEND_B:
                self.consumers[("B", a.stage, a.unit)] += 1
            elif a.kind is Kind.FORWARD and a.stage > 0 and a.stage - 1 in mine:
                self.consumers[("F", a.stage - 1, a.unit)] += 1
            elif a.kind is Kind.BACKWARD and a.stage < self.last and a.stage + 1 in mine:
                self.consumers[("B", a.stage + 1, a.unit)] += 1

    # ----- rows -----
    def rows(self, stage: int, unit: tuple[int, int], device: int | None = None) -> Range:
        key = (stage, unit, self.device if device is None else device)
        found = self._rows.get(key)
        if found is None:
            found = self._rows[key] = stage_rows(self.plan, self.batch_rows, stage, key[2], unit)
        return found

    def peers(self, stage: int, other: int) -> list[int]:
        """Devices of ``other`` whose rows overlap this device's share of ``stage`` (lowering's rule)."""
        found = self._peers.get((stage, other))
        if found is None:
            replica = self.plan.stages[stage].devices.index(self.device)
            found = self._peers[(stage, other)] = [d for d, _ in peers(self.plan, stage, replica, other)]
        return found

    def _link_rows(self, a: Action) -> tuple[Range, Range, int, int]:
        """(my rows, overlap rows, sending stage, receiving-side stage) of a point-to-point action."""
        other = a.stage + 1 if a.kind in (Kind.SEND_F, Kind.RECV_B) else a.stage - 1
        mine = self.rows(a.stage, a.unit)
        both = intersect(mine, self.rows(other, a.unit, a.peer))
        sender = a.stage if a.kind in (Kind.SEND_F, Kind.SEND_B) else other
        return mine, both, sender, other

    # ----- the iteration -----
    def run(self, step: int) -> dict[str, Any]:
        spec = self.spec
        torch.manual_seed((spec.seed * 1_000_003 + step) * 131 + self.device)
        self.step_index = step
        self.inputs = self.targets = None
        stages = self.plan.stages_of_device(self.device)
        if 0 in stages or self.last in stages:
            inputs, targets = spec.data_fn(step)
            if int(inputs.shape[0]) != self.batch_rows:
                raise ValueError(f"data_fn({step}) returned {inputs.shape[0]} rows; every step must have {self.batch_rows}")
            self.inputs, self.targets = inputs.to(self.torch_device), targets.to(self.torch_device)
        self.stash: dict[Key, tuple[Tensor | None, Tensor, int]] = {}
        self.out_f: dict[Key, Tensor] = {}
        self.out_b: dict[Key, Tensor] = {}
        self.inbox: dict[tuple[str, int, tuple[int, int], int], Tensor] = {}
        self.posted: dict[int, tuple[Any, Tensor, float]] = {}
        self.pending_sends: list[tuple[Any, Tensor]] = []
        self.uses = dict(self.consumers)
        self.losses: list[Tensor] = []
        self.cursor = 0
        self.stash_now = self.stash_peak = 0
        self.spans: list[tuple[str, str, float, float]] = []
        self.sends: list[tuple[str, int, int, float]] = []
        self.recvs: list[tuple[str, int, int, float, float, float]] = []
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.t0_wall, self.t0 = time.time(), time.perf_counter()
        kill = (step, self.device) in spec.kill_at
        recv_at = [i for i, a in enumerate(self.program) if a.kind in (Kind.RECV_F, Kind.RECV_B)]
        next_recv = 0
        for i, action in enumerate(self.program):
            if kill and i == len(self.program) // 2:
                os._exit(17)  # fault injection: die mid-iteration like a crashed process would
            while next_recv < len(recv_at) and recv_at[next_recv] < i + spec.recv_lookahead:
                self._post_recv(recv_at[next_recv])
                next_recv += 1
            self.cursor = i
            self.handlers[action.kind](action)
            if self.pending_sends and i % 4 == 0:
                self.pending_sends = [(w, t) for w, t in self.pending_sends if not w.is_completed()]
        for work, _ in self.pending_sends:
            work.wait()
        self.pending_sends = []
        elapsed = time.perf_counter() - self.t0
        if self.stash or self.inbox or self.posted:
            raise RuntimeError(f"device {self.device}: iteration ended with unconsumed state (a lowering bug)")
        busy = sum(e - s for _, kind, s, e in self.spans if kind in ("F", "B", "all_reduce", "step"))
        peak = torch.cuda.max_memory_allocated() if self.cuda else self.stash_peak
        return {
            "device": self.device, "step": step, "t0_wall": self.t0_wall, "iteration_s": elapsed, "busy_s": busy,
            "bubble_s": max(0.0, elapsed - busy), "spans": self.spans, "sends": self.sends, "recvs": self.recvs,
            "loss": float(sum(float(v) for v in self.losses)) if self.last in stages else None,
            "peak_memory_bytes": int(peak), "memory_metric": "cuda_max_memory_allocated" if self.cuda else "stash_high_water",
            "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - self.t0

    # ----- compute -----
    def _forward(self, a: Action) -> None:
        start = self._now()
        key = (a.stage, a.unit)
        lo, hi = self.rows(a.stage, a.unit)
        if a.stage == 0:
            assert self.inputs is not None
            x = self.inputs[lo:hi]
            held = 0
        else:
            x = self._gather("F", a.stage, a.unit, a.stage - 1, (lo, hi)).detach()
            x.requires_grad_(x.is_floating_point())
            held = nbytes(x)
        seen: set[int] = {x.data_ptr()}

        def pack(t: Tensor) -> Tensor:
            nonlocal held
            ptr = t.untyped_storage().data_ptr()
            if ptr not in seen and ptr not in self.param_ptrs:
                seen.add(ptr)
                held += t.untyped_storage().nbytes()
            return t

        stage = self.plan.stages[a.stage]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = x
            if hi > lo:
                for b in range(stage.first, stage.last):
                    out = self.modules[b](out)
            if a.stage == self.last:
                assert self.targets is not None
                if hi > lo:
                    out = self.spec.loss_fn(out, self.targets[lo:hi]) * ((hi - lo) / self.batch_rows)
                    self.losses.append(out.detach())
                else:
                    out = torch.zeros((), device=self.torch_device, requires_grad=False)
        self.stash[key] = (x if a.stage > 0 else None, out, held)
        if a.stage < self.last:
            self.out_f[key] = out.detach()
        self.stash_now += held
        self.stash_peak = max(self.stash_peak, self.stash_now)
        self.spans.append((str(a), "F", start, self._now()))

    def _backward(self, a: Action) -> None:
        start = self._now()
        key = (a.stage, a.unit)
        x, out, held = self.stash.pop(key)
        lo, hi = self.rows(a.stage, a.unit)
        if a.stage == self.last:
            if out.requires_grad:
                out.backward()
        else:
            grad = self._gather("B", a.stage, a.unit, a.stage + 1, (lo, hi))
            if out.requires_grad:
                torch.autograd.backward(out, grad)
        if x is not None:
            self.out_b[key] = x.grad if x.grad is not None else torch.zeros_like(x)
            if self.uses.get(("B", a.stage, a.unit), 0) == 0:
                self.out_b.pop(key)
        self.stash_now -= held
        self.spans.append((str(a), "B", start, self._now()))

    def _gather(self, direction: str, stage: int, unit: tuple[int, int], other: int, mine: Range) -> Tensor:
        """Concatenate, in peer order, the pieces of ``stage``'s input (F) or output grad (B)."""
        pieces = []
        for peer in self.peers(stage, other):
            theirs = self.rows(other, unit, peer)
            lo, hi = intersect(mine, theirs)
            if hi <= lo:
                continue
            if peer == self.device:  # neighbouring virtual stage on this device: local hand-off
                store = self.out_f if direction == "F" else self.out_b
                pieces.append(store[(other, unit)][lo - theirs[0] : hi - theirs[0]])
                self._release(direction, (other, unit))
            else:
                pieces.append(self.inbox.pop((direction, stage, unit, peer)))
        if not pieces:
            shape, dtype = self.boundary[self.plan.stages[stage].first if direction == "F" else self.plan.stages[stage].last]
            return torch.zeros((0, *shape), dtype=dtype, device=self.torch_device)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _release(self, direction: str, key: Key) -> None:
        counter = (direction, key[0], key[1])
        if counter in self.uses:
            self.uses[counter] -= 1
            if self.uses[counter] <= 0:
                (self.out_f if direction == "F" else self.out_b).pop(key, None)

    # ----- point-to-point -----
    def _send(self, a: Action) -> None:
        direction = "F" if a.kind is Kind.SEND_F else "B"
        mine, (lo, hi), sender, _ = self._link_rows(a)
        key = (a.stage, a.unit)
        if hi > lo:
            data = (self.out_f if direction == "F" else self.out_b)[key][lo - mine[0] : hi - mine[0]].contiguous()
            post = time.perf_counter() - self.t0
            work = dist.isend(data, self.rank_of[a.peer], tag=tag(direction, sender, a.microbatch, a.part))
            self.pending_sends.append((work, data))
            self.sends.append((str(a), a.peer, nbytes(data), post))
        self._release(direction, key)

    def _post_recv(self, index: int) -> None:
        a = self.program[index]
        direction = "F" if a.kind is Kind.RECV_F else "B"
        _, (lo, hi), sender, _ = self._link_rows(a)
        if hi <= lo:
            return
        cut = self.plan.stages[a.stage].first if direction == "F" else self.plan.stages[a.stage].last
        shape, dtype = self.boundary[cut]
        buf = torch.empty((hi - lo, *shape), dtype=dtype, device=self.torch_device)
        work = dist.irecv(buf, self.rank_of[a.peer], tag=tag(direction, sender, a.microbatch, a.part))
        self.posted[index] = (work, buf, time.perf_counter() - self.t0)

    def _recv(self, a: Action) -> None:
        index = self.cursor
        if index not in self.posted:
            return  # empty overlap: nothing was sent
        work, buf, post = self.posted.pop(index)
        wait = time.perf_counter() - self.t0
        work.wait()
        done = self._now()
        direction = "F" if a.kind is Kind.RECV_F else "B"
        self.inbox[(direction, a.stage, a.unit, a.peer)] = buf
        self.recvs.append((str(a), a.peer, nbytes(buf), post, wait, done))

    # ----- per-stage -----
    def _stage_params(self, stage: int) -> list[nn.Parameter]:
        s = self.plan.stages[stage]
        return [p for b in range(s.first, s.last) for p in self.modules[b].parameters()]

    def _all_reduce(self, a: Action) -> None:
        start = self._now()
        params = self._stage_params(a.stage)
        if params:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.groups[self.plan.stages[a.stage].devices])
            for p, g in zip(params, _unflatten_dense_tensors(flat, grads)):
                p.grad = g
        self.spans.append((str(a), "all_reduce", start, self._now()))

    def _step(self, a: Action) -> None:
        start = self._now()
        s = self.plan.stages[a.stage]
        for b in range(s.first, s.last):
            opt = self.optimizers.get(b)
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
        self.spans.append((str(a), "step", start, self._now()))
