"""The communication half of an executor: point-to-point sends and receives, and the all-reduce.

Split from :mod:`actors.execution` along the seam between computing a unit and moving its tensors, so that each
reads on its own. The rules are the executor's (see its docstring): sends are ``isend`` whose handles are kept until
they complete; receives are ``irecv`` posted ahead at the points :func:`orchestrator.schedule.nccl.recv_post_points`
chose and waited for at the RECV action; a unit fed by several peers is received into row slices of one buffer; a
sent tensor must keep the shape and dtype the probe saw. Nothing here knows a schedule's name.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from actors.gpu import EventClock, dtype_buckets
from actors.tables import Key, Piece, ProgramTables
from actors.transport import Range
from orchestrator.core.errors import UserError
from orchestrator.schedule.ir import Action

_perf = time.perf_counter


class Exchange(ProgramTables):
    """Mixin of :class:`actors.execution.Executor`: its tensors in and out; the attributes below are set there."""

    torch_device: torch.device
    modules: dict[int, nn.Module]
    groups: dict[tuple[int, ...], Any]
    cursor: int
    labels: list[str]
    info: list[Any]
    inbox: dict[tuple[str, int, tuple[int, int]], Tensor]
    out_f: dict[Key, Tensor]
    out_b: dict[Key, Tensor]
    uses: dict[tuple[str, int, tuple[int, int]], int]
    posted: dict[int, tuple[Any, Tensor, float]]
    pending_sends: deque[tuple[Any, Tensor]]
    spans: list[tuple[str, str, float, float]]
    sends: list[tuple[str, int, int, float]]
    recvs: list[tuple[str, int, int, float, float, float]]
    clock: EventClock  # CUDA only: set at the start of each iteration
    before_step: Any
    after_step: Any
    t0: float

    def _now(self) -> float:
        """Seconds since the iteration began (CPU), or an event index on CUDA (see actors/gpu.py)."""
        return self.clock.mark() if self.cuda else _perf() - self.t0

    # ----- compute -----
    def _assemble(self, direction: str, stage: int, unit: tuple[int, int], pieces: list[Piece], lo: int, hi: int) -> Tensor:
        """``stage``'s input (F) or output grad (B): received in place, or handed over locally."""
        buf = self.inbox.pop((direction, stage, unit), None)
        store = self.out_f if direction == "F" else self.out_b
        for local, src, s_lo, s_hi, d_lo, d_hi in pieces:
            if local:  # neighbouring virtual stage on this device
                part = store[src][s_lo:s_hi]
                if buf is None:  # the only piece: no copy
                    buf = part
                else:
                    buf[d_lo:d_hi].copy_(part)
                self._release(direction, src)
        if buf is None:
            shape, dtype = self.boundary[self.plan.stages[stage].first if direction == "F" else self.plan.stages[stage].last]
            return torch.zeros((hi - lo, *shape), dtype=dtype, device=self.torch_device)
        return buf

    def _gather(self, direction: str, stage: int, unit: tuple[int, int], other: int, mine: Range) -> Tensor:
        """Compatibility wrapper: the assembled input (F) or output grad (B) of ``stage``'s ``unit``."""
        return self._assemble(direction, stage, unit, self._pieces(direction, stage, unit, other), mine[0], mine[1])

    def _release(self, direction: str, key: Key) -> None:
        counter = (direction, key[0], key[1])
        left = self.uses.get(counter)
        if left is not None:
            left -= 1
            self.uses[counter] = left
            if left <= 0:
                (self.out_f if direction == "F" else self.out_b).pop(key, None)

    def drop_communicators(self) -> None:
        """Forget every handle on a communicator (receives posted, sends in flight, groups, links, the per-action
        table that caches them, the step hooks' groups) after a failed iteration. Why: a handle keeps its group,
        and so its sockets, alive; the worker aborts the groups next (:meth:`actors.stage_worker.StageWorker.abort`)
        and this executor is not run again (a new one comes with the re-formed group)."""
        self.posted = {}
        self.pending_sends = deque()
        self.groups, self.links, self.info = {}, {}, []
        self.before_step = self.after_step = None

    # ----- point-to-point -----
    def _send(self, a: Action) -> None:
        index = self.cursor
        direction, key, any_rows, whole, lo, hi, rank, msg_tag, group, expect = self.info[index]
        if any_rows:
            held = (self.out_f if direction == "F" else self.out_b)[key]
            data = (held if whole else held[lo:hi]).contiguous()
            if data.dtype != expect[1] or tuple(data.shape[1:]) != expect[0]:
                raise UserError(
                    f"stage {a.stage} on device {self.device} sends {str(data.dtype).replace('torch.', '')} "
                    f"{list(data.shape[1:])} per row to device {a.peer}, but the probe of the model saw "
                    f"{str(expect[1]).replace('torch.', '')} {list(expect[0])}: a block boundary must keep "
                    "its shape and dtype from step to step and device to device")
            post = self._now()
            work = dist.isend(data, rank, group=group, tag=msg_tag)
            sends = self.pending_sends
            sends.append((work, data))
            while len(sends) > 4 and sends[0][0].is_completed():  # keep handles of in-flight sends only
                sends.popleft()
            self.sends.append((self.labels[index], a.peer, data.numel() * data.element_size(), post))
        self._release(direction, key)

    def _post_recv(self, index: int) -> None:
        info = self.info[index]
        if info is None:
            return  # empty overlap: nothing was sent
        assembly, shape, dtype, lo, hi, whole, rank, msg_tag, group = info
        buf = self.inbox.get(assembly)
        if buf is None:
            buf = self.inbox[assembly] = torch.empty(shape, dtype=dtype, device=self.torch_device)
        part = buf if whole else buf[lo:hi]
        work = dist.irecv(part, rank, group=group, tag=msg_tag)
        self.posted[index] = (work, part, self._now())

    def _recv(self, a: Action) -> None:
        index = self.cursor
        found = self.posted.pop(index, None)
        if found is None:
            return  # empty overlap: nothing was sent
        work, buf, post = found
        wait = self._now()
        work.wait()  # on CUDA: the compute stream waits for the receive; the host does not
        done = self._now()
        self.recvs.append((self.labels[index], a.peer, buf.numel() * buf.element_size(), post, wait, done))

    # ----- per-stage -----
    def _stage_params(self, stage: int) -> list[nn.Parameter]:
        s = self.plan.stages[stage]
        return [p for b in range(s.first, s.last) for p in self.modules[b].parameters()]

    def _all_reduce(self, a: Action) -> None:
        start = self._now()
        params = self._stage_params(a.stage)
        group = self.groups[self.plan.stages[a.stage].devices]
        for bucket in dtype_buckets(params):  # one flat buffer per dtype: no bf16 -> fp32 promotion
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
            for p, g in zip(bucket, _unflatten_dense_tensors(flat, grads)):
                p.grad = g
        self.spans.append((self.labels[self.cursor], "all_reduce", start, self._now()))
