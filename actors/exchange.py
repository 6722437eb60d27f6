"""The communication state of one executor: its tensors in and out, point-to-point and all-reduce.

Why an object of its own (not a part of :class:`actors.execution.Executor`): everything that moves a tensor between
actions or devices has one owner here — the process groups and directed links, the receives posted, the sends in
flight, the receive buffers being assembled (``inbox``), the tensors produced for later consumers (``out_f``/``out_b``
and how many consumers each still has), and the iteration's send/receive metrics. The executor computes; it hands
over what it produced (:meth:`Exchange.hand_over`) and asks for what a unit consumes (:meth:`Exchange.assemble`).

The rules are the executor's (see its docstring): sends are ``isend`` whose handles are kept until they complete;
receives are ``irecv`` posted ahead at the points :func:`orchestrator.schedule.nccl.recv_post_points` chose and
waited for at the RECV action; a unit fed by several peers is received into row slices of one buffer; a sent tensor
must keep the shape and dtype the probe saw. Times come from the executor's one :class:`actors.clock.Clock`.
Nothing here knows a schedule's name.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from actors.clock import Clock
from actors.grad_sync import GradSync
from actors.tables import Key, Piece, ProgramTables
from orchestrator.core.errors import UserError
from orchestrator.schedule.ir import Action


class Exchange:
    """One executor's communication state (see module docstring); per-iteration state is reset by :meth:`start`."""

    def __init__(self, tables: ProgramTables, groups: dict[tuple[int, ...], Any], links: dict[tuple[int, int], Any],
                 torch_device: torch.device, clock: Clock) -> None:
        self.tables = tables
        self.info, self.labels = tables.info, tables.labels  # read, never changed here (hot path: one lookup)
        self.device = tables.device
        self.groups = groups  # replica devices -> their all-reduce group
        self.links = links  # (sender, receiver) device -> two-rank group; absent: the default group
        self.torch_device = torch_device
        self.now = clock.now  # the executor's clock: spans and transfers on one time base
        self.syncs: dict[int, GradSync] = {}  # replicated stage -> its gradient buckets (made at first use)
        self.start()

    def start(self) -> None:
        """A new iteration: nothing received, posted, in flight or held for a consumer; no metrics yet."""
        self.inbox: dict[tuple[str, int, tuple[int, int]], Tensor] = {}  # receive buffers being assembled
        self.out_f: dict[Key, Tensor] = {}
        self.out_b: dict[Key, Tensor] = {}
        self.uses = dict(self.tables.consumers)  # consumers still to come, per produced tensor
        self.posted: dict[int, tuple[Any, Tensor, float]] = {}
        self.pending_sends: deque[tuple[Any, Tensor]] = deque()
        self.sends: list[tuple[str, int, int, float]] = []
        self.recvs: list[tuple[str, int, int, float, float, float]] = []

    # ----- local hand-over -----
    def hand_over(self, direction: str, key: Key, tensor: Tensor) -> None:
        """``key``'s output (F) or input grad (B), kept until its last consumer (a send or a local unit) ran."""
        (self.out_f if direction == "F" else self.out_b)[key] = tensor

    def assemble(self, direction: str, stage: int, unit: tuple[int, int], pieces: list[Piece], lo: int, hi: int) -> Tensor:
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
            shape, dtype = self.tables.boundary_of(direction, stage)
            return torch.zeros((hi - lo, *shape), dtype=dtype, device=self.torch_device)
        return buf

    def _release(self, direction: str, key: Key) -> None:
        counter = (direction, key[0], key[1])
        left = self.uses.get(counter)
        if left is not None:
            left -= 1
            self.uses[counter] = left
            if left <= 0:
                (self.out_f if direction == "F" else self.out_b).pop(key, None)

    # ----- point-to-point -----
    def send(self, a: Action, index: int) -> None:
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
            post = self.now()
            work = dist.isend(data, rank, group=group, tag=msg_tag)
            sends = self.pending_sends
            sends.append((work, data))
            while len(sends) > 4 and sends[0][0].is_completed():  # keep handles of in-flight sends only
                sends.popleft()
            self.sends.append((self.labels[index], a.peer, data.numel() * data.element_size(), post))
        self._release(direction, key)

    def backdate_send(self, since: int, post: float) -> None:
        """The send recorded after the first ``since`` ones was ready at ``post`` (fault injection: an injected link
        delay counts as transfer time, :mod:`actors.injection`)."""
        if len(self.sends) > since:
            label, peer, size, _ = self.sends[-1]
            self.sends[-1] = (label, peer, size, post)

    def post(self, index: int) -> None:
        """Post the receive of action ``index`` (before its RECV action is reached; see module docstring)."""
        info = self.info[index]
        if info is None:
            return  # empty overlap: nothing was sent
        assembly, shape, dtype, lo, hi, whole, rank, msg_tag, group = info
        buf = self.inbox.get(assembly)
        if buf is None:
            buf = self.inbox[assembly] = torch.empty(shape, dtype=dtype, device=self.torch_device)
        part = buf if whole else buf[lo:hi]
        work = dist.irecv(part, rank, group=group, tag=msg_tag)
        self.posted[index] = (work, part, self.now())

    def recv(self, a: Action, index: int) -> None:
        """Wait for the receive of action ``index``, posted earlier."""
        found = self.posted.pop(index, None)
        if found is None:
            return  # empty overlap: nothing was sent
        work, buf, post = found
        wait = self.now()
        work.wait()  # on CUDA: the compute stream waits for the receive; the host does not
        done = self.now()
        self.recvs.append((self.labels[index], a.peer, buf.numel() * buf.element_size(), post, wait, done))

    # ----- collectives -----
    def grad_sync(self, stage: int, params: list[nn.Parameter], devices: tuple[int, ...]) -> GradSync:
        """The gradient buckets of replicated ``stage`` (``params``), summed over the replica group of ``devices``
        (:mod:`actors.grad_sync`: started during the stage's last backward, waited for at its ``ALL_REDUCE``)."""
        sync = self.syncs.get(stage)
        if sync is None:
            sync = self.syncs[stage] = GradSync(params, self.groups[devices])
        return sync

    # ----- the end of an iteration -----
    def finish(self) -> None:
        """Wait for every send still in flight (a receiver may be behind)."""
        for work, _ in self.pending_sends:
            work.wait()
        self.pending_sends.clear()

    def unconsumed(self) -> bool:
        """A receive posted but not waited for, or a buffer received but not consumed (a lowering bug)."""
        return bool(self.inbox or self.posted)

    def communicators(self) -> list[Any]:
        """Every group handle this executor communicates on (its watchdog time-outs are set on them)."""
        return [*self.groups.values(), *self.links.values()]

    def drop_communicators(self) -> None:
        """Forget every handle on a communicator: receives posted, sends in flight, groups, links. Why: a handle
        keeps its group, and so its sockets, alive (see :meth:`actors.execution.Executor.drop_communicators`)."""
        self.posted = {}
        self.pending_sends = deque()
        for sync in self.syncs.values():
            sync.drop()
        self.groups, self.links = {}, {}
