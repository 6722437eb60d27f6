"""Host copies of a block's state for checkpoints: taken now, or deferred to the upload thread.

Why apart from the checkpoint format (:mod:`actors.checkpoint`): what a snapshot holds and when it is
taken is a question of the training loop (an optimizer step changes weights in place; a forward
changes BatchNorm statistics in place; on a GPU a copy on the compute stream would stall it), not of
the files. On CUDA the deferred copy runs on its own stream into pinned host memory, after an event
recorded when the checkpoint was asked for, so it overlaps the next forward and backward on the
device's copy engine; on CPU it is a plain copy.
"""

from __future__ import annotations

import os
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor, nn


def snapshot_block(block: int, module: nn.Module, optimizer: torch.optim.Optimizer | None,
                   taken: Mapping[str, Tensor] | None = None, into: Mapping[str, Any] | None = None,
                   non_blocking: bool = False) -> dict[str, Any]:
    """A CPU copy of one block's state, independent of later optimizer steps (so it can be
    uploaded in the background while training goes on). ``taken``: entries copied earlier.
    ``into``: an earlier snapshot of this block whose host tensors are overwritten where shape and
    dtype still match (see :class:`actors.checkpoint.BackgroundWrite`: warm staging buffers copy
    without page faults). ``non_blocking``: device tensors are copied asynchronously into pinned
    memory; the caller synchronizes the stream before reading the result."""
    return _block_copy(block, module.state_dict(), optimizer.state_dict() if optimizer is not None else None,
                       taken, into, non_blocking)


def _block_copy(block: int, state: Mapping[str, Tensor], optimizer_state: Mapping[str, Any] | None,
                taken: Mapping[str, Tensor] | None, into: Mapping[str, Any] | None, non_blocking: bool,
                copy: bool = True) -> dict[str, Any]:
    """:func:`snapshot_block` of state dicts read earlier. ``copy=False``: host tensors are the state itself, for a
    caller that copies them before the next optimizer step (into the object store)."""
    taken = taken or {}
    model = into.get("model") if into is not None else None
    out = {k: taken[k] if k in taken else host_copy(v, copy, model.get(k) if isinstance(model, dict) else None, non_blocking)
           for k, v in state.items()}
    opt = host_copy(optimizer_state, copy, into.get("optimizer") if into is not None else None,
                    non_blocking) if optimizer_state is not None else None
    return {"block": block, "model": out, "optimizer": opt, "shapes": {k: list(v.shape) for k, v in out.items()}}


def host_copy(item: Any, copy: bool = True, into: Any = None, non_blocking: bool = False) -> Any:
    """``item`` (nested dicts, lists, tuples) with every tensor detached and in host memory, every container new.

    ``copy``: host tensors are copied too, so later in-place updates of the original (an optimizer step) do not
    reach the result (snapshots); without it only device tensors are copied (a live hand-over, sent at once).
    ``into``: the same structure from an earlier copy; its host tensors are reused where shape and dtype match.
    ``non_blocking`` (copies only): a device tensor goes into pinned memory without waiting for the copy."""
    if isinstance(item, Tensor):
        if not copy:
            return item.detach().cpu()
        pinned = non_blocking and item.device.type == "cuda"
        if not (isinstance(into, Tensor) and into.device.type == "cpu" and into.shape == item.shape and into.dtype == item.dtype
                and into.is_contiguous() and (into.is_pinned() or not pinned)):
            into = torch.empty(item.shape, dtype=item.dtype, pin_memory=pinned)
        return into.copy_(item.detach(), non_blocking=pinned)
    if isinstance(item, dict):
        return {k: host_copy(v, copy, into.get(k) if isinstance(into, dict) else None, non_blocking) for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        olds = into if isinstance(into, (list, tuple)) and len(into) == len(item) else [None] * len(item)
        return type(item)(host_copy(v, copy, o, non_blocking) for v, o in zip(item, olds))
    return item


@dataclass(frozen=True)
class WireTensor:
    """A host tensor on its way to another process: its bytes as a numpy array, which Ray's object store writes
    once and reads without a copy (a torch tensor is pickled instead: measured 6x slower to put, 300x to get)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    data: Any  # numpy uint8 array of the tensor's bytes


def to_wire(item: Any) -> Any:
    """``item`` (nested dicts, lists, tuples of host tensors and plain values) with every tensor a :class:`WireTensor`
    (no copy: a view of the tensor's bytes)."""
    if isinstance(item, Tensor):
        flat = item.detach().contiguous().reshape(-1)
        return WireTensor(item.dtype, tuple(item.shape), flat.view(torch.uint8).numpy())
    if isinstance(item, dict):
        return {k: to_wire(v) for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        return type(item)(to_wire(v) for v in item)
    return item


def from_wire(item: Any) -> Any:
    """:func:`to_wire`'s inverse, every tensor (a host tensor too) copied into this process's memory, the caller's to
    keep: the object store's buffers are read-only and go with their ref."""
    if isinstance(item, WireTensor):
        with warnings.catch_warnings():  # a read-only buffer: only read, to copy it
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(item.data) if item.data.size else torch.empty(0, dtype=torch.uint8)
        return host_copy(raw.view(item.dtype).reshape(item.shape))
    if isinstance(item, Tensor):
        return host_copy(item)
    if isinstance(item, dict):
        return {k: from_wire(v) for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        return type(item)(from_wire(v) for v in item)
    return item


def deferred_snapshot(block: int, module: nn.Module, optimizer: torch.optim.Optimizer | None,
                      into: Mapping[str, Any] | None = None, copy: bool = True) -> Callable[[], dict[str, Any]]:
    """:func:`snapshot_block` in two parts: the buffers now, the parameters and the optimizer state when called.

    Why: parameters and optimizer state change only in the optimizer step, so their copy may run in a thread while
    the next iteration's forward and backward run, as long as it ends before that step (the executor waits for it,
    ``Executor.snapshot_due``) — the training then stalls only for what the copy does not overlap. Buffers are
    copied at once because a forward may update them in place (BatchNorm's running statistics); the state dicts
    are read at once too (references: what a hyperparameter change between iterations sets, the learning rate,
    is the next step's, not this snapshot's). ``copy=False`` (on CPU): the parameters and optimizer state are the
    live tensors themselves, for a caller that copies them in the thread (into the object store:
    :mod:`actors.host_copies`); on a GPU they are copied into pinned memory either way."""
    state = module.state_dict()
    optimizer_state = optimizer.state_dict() if optimizer is not None else None
    params = {k for k, v in module.state_dict(keep_vars=True).items() if isinstance(v, nn.Parameter)}
    model = into.get("model") if into is not None else None
    buffers = {k: host_copy(v, into=model.get(k) if isinstance(model, dict) else None) for k, v in state.items() if k not in params}
    device = next((t.device for t in state.values() if t.is_cuda), None)
    if device is None:
        return lambda: _block_copy(block, state, optimizer_state, buffers, into, False, copy)
    asked = torch.cuda.Event()
    asked.record(torch.cuda.current_stream(device))  # after the step that produced this state

    def take() -> dict[str, Any]:
        with _copy_stream(device, asked) as stream:
            snap = _block_copy(block, state, optimizer_state, buffers, into, True)
        stream.synchronize()  # the pinned copies are complete before anyone reads them (or the step goes on)
        return snap

    return take


@contextmanager
def _copy_stream(device: torch.device, after: Any) -> Iterator[Any]:
    """A side CUDA stream made current in this thread, ordered after the event ``after``: the copies queued on it
    run on the copy engine while the compute stream goes on with the next forward and backward."""
    stream = torch.cuda.Stream(device=device)
    stream.wait_event(after)
    with torch.cuda.stream(stream):
        yield stream


class BackgroundCopy:
    """Deferred snapshots (:func:`deferred_snapshot`) taken by a thread while training goes on, then ``then(taken)``.

    Why a thread: parameters and optimizer state change only in the next optimizer step, so their copy overlaps
    the next forward and backward; the executor's optimizer step waits for :attr:`snapshotted` (set once every
    copy exists, or failed), so training stalls only for the part of the copy it does not hide. On CUDA each
    deferred snapshot copies on a side stream into pinned buffers; on CPU the thread copies. Once taken the
    payloads are :attr:`staged` (block -> what each deferred snapshot returned: a host copy, read-only from then
    on, or an in-memory snapshot's object). ``then`` runs on the same thread afterwards (an upload);
    :meth:`result` waits for it and returns what it returned, or raises what the copy or ``then`` raised.

    ``idle`` (the asynchronous checkpoint, :class:`actors.checkpoint.BackgroundWrite`): the thread runs at the
    lowest CPU priority while nobody waits for it (:class:`UploadPriority`), so the copy and the upload use the
    cores training leaves idle (a GPU's, a pipeline's bubbles); where training keeps every core busy the copy runs
    when the step waits for it (at normal priority then). The in-memory snapshots
    (:class:`actors.host_copies.HostCopies`) run at normal priority: they are due at the very next optimizer step,
    and at the lowest priority on cores training fills the whole copy would become the step's stall.
    """

    def __init__(self, payloads: Sequence[Mapping[str, Any] | Callable[[], Mapping[str, Any]]],
                 then: Callable[[list[Mapping[str, Any]]], Any] | None = None, name: str = "host-copy",
                 idle: bool = True) -> None:
        self.staged: dict[int, Mapping[str, Any]] = {}
        self.error: BaseException | None = None
        self._payloads, self._then, self._outcome = list(payloads), then, None
        self._priority = UploadPriority(idle)
        self.snapshotted = WaitRaising(self._priority)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._priority.lower()
        try:
            try:
                taken = [p() if callable(p) else p for p in self._payloads]
                self.staged = {int(p["block"]): p for p in taken}
            finally:
                self.snapshotted.set()  # the step may go on: the copies exist, or the error is recorded below
            self._payloads = []
            self._priority.lower(copied=True)  # again, if a step waiting for the copy had raised it
            if self._then is not None:
                self._outcome = self._then(taken)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of result()
            self.error = exc
        finally:
            self._payloads = []

    def done(self) -> bool:
        return not self._thread.is_alive()

    def hand_over(self) -> dict[int, Mapping[str, Any]]:
        """:attr:`staged`, which this object then forgets: their new holder alone decides how long they live."""
        staged, self.staged = self.staged, {}
        return staged

    def result(self, timeout_s: float | None = None) -> Any:
        """Wait (at normal priority) for the copy and ``then``; raises their error, or TimeoutError."""
        self._priority.waited(for_good=True)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"{self._thread.name}: still running after {timeout_s} s")
        if self.error is not None:
            raise self.error
        return self._outcome


class UploadPriority:
    """The CPU priority of an asynchronous checkpoint's thread: the lowest while nobody waits for it, normal while
    someone does.

    Why the lowest: training's OpenMP teams wait for each other at every barrier, so even a small share of a core
    taken from one of them stalls them all (measured on 2 cores: a nice-10 upload still doubled an iteration).
    Linux's SCHED_IDLE runs the thread only on CPU time nothing else wants. Why back to normal when waited for:
    an optimizer step waiting for the copy, or a caller waiting for the upload (a migration, the end of a run),
    must not depend on other processes leaving a core idle. Only where the thread may raise its priority again
    (root, or an RLIMIT_NICE that allows nice 0) is it lowered at all; elsewhere it runs at normal priority.
    """

    def __init__(self, idle: bool = True) -> None:
        self._idle = idle  # False: never lowered
        self._lock = threading.Lock()
        self._tid: int | None = None  # the thread, while lowered
        self._copy_waited = False  # a step waits for the copy: normal priority until the copy exists
        self._waited = False  # result() is waiting: normal priority for good

    def lower(self, copied: bool = False) -> None:
        """Called by the upload thread: at its start, and with ``copied`` once the snapshot exists."""
        with self._lock:
            self._copy_waited = self._copy_waited and not copied
            if not self._idle or self._waited or self._copy_waited or self._tid is not None or not _can_raise_again():
                return
            tid = threading.get_native_id()
            try:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                self._tid = tid
            except (AttributeError, OSError):
                pass

    def waited(self, for_good: bool = False) -> None:
        """Someone waits for the thread: back to normal priority (``for_good``: until it ends; else until the copy
        exists)."""
        with self._lock:
            self._waited = self._waited or for_good
            self._copy_waited = not for_good
            if self._tid is not None:
                try:
                    os.sched_setscheduler(self._tid, os.SCHED_OTHER, os.sched_param(0))
                except OSError:
                    pass
                self._tid = None


class WaitRaising(threading.Event):
    """An event whose :meth:`wait` first raises an :class:`UploadPriority` (the step waiting for a snapshot)."""

    def __init__(self, priority: UploadPriority) -> None:
        super().__init__()
        self._priority = priority

    def wait(self, timeout: float | None = None) -> bool:
        if not self.is_set():
            self._priority.waited()
        return super().wait(timeout)


def _can_raise_again() -> bool:
    if not hasattr(os, "SCHED_IDLE"):
        return False
    if os.geteuid() == 0:
        return True
    import resource

    return resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20  # the nice ceiling is 20 − limit: 20 allows nice 0


def tensor_bytes(item: Any) -> int:
    """The bytes of the tensors in ``item`` (nested dicts, lists, tuples): about what saving it needs."""
    if isinstance(item, torch.Tensor):
        return item.numel() * item.element_size()
    if isinstance(item, WireTensor):
        return int(item.data.nbytes)
    if isinstance(item, Mapping):
        return sum(tensor_bytes(v) for v in item.values())
    if isinstance(item, (list, tuple)):
        return sum(tensor_bytes(v) for v in item)
    return 0
