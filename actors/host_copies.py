"""A worker's host copies of block state: what a recovery in place restores from without reading storage.

Why in memory: after a worker dies without notice the survivors keep their processes
(:meth:`orchestrator.train.runtime.PipelineRuntime.recover_in_place`); each rolls back from a copy it
already holds, and the dead worker's blocks come from a neighbour's copy (Gemini, SOSP'23: restoring
from peers' memory is an order of magnitude faster than from storage) or, failing that, from the
newest committed checkpoint. Three things put copies here, all keyed ``step -> block``:

* **own snapshots** (``RunConfig.snapshot_every``): the blocks this worker holds, at a step, written once into
  Ray's object store by this worker (:func:`actors.snapshot.to_wire`; the object is this worker's);
* **a neighbour's snapshots**: the next device in the ring's objects, read here without a copy. The mapped
  buffers stay valid after their owner died (the store frees an object only once nobody uses it), and on
  another node reading them pulls a copy there, which survives the owner's node;
* **checkpoint copies**: the host snapshot a checkpoint was written from (synchronous) or uploaded
  from (asynchronous, once its upload finished) is that step's state too, at no extra cost.

Why the object store and not this process's memory: one snapshot is then one copy of the state on the node (the
own snapshot and the neighbour's copy on the same node are one object, and sending it costs nothing), where
copies in each process's memory took the state, two generations of own copies, two of the neighbour's and the
message in transit (about 8x the state per worker with training's own memory; now about 4.4x). Own snapshots are
put by a background thread (:class:`actors.snapshot.BackgroundCopy`: on CPU the put is the copy, of the live
tensors, while the next forward and backward run; on a GPU a side stream copies into pinned memory first) and
join the inventory once taken; a put that fails (the store full) costs that generation only. Two generations of
own snapshots are kept: a death while the newest is being taken still leaves the previous step complete on every
survivor (the driver starts a snapshot only once the previous one's neighbour copies all arrived). Of a
neighbour's blocks only the newest copy is kept (so that the older is freed before the next one is written: two
of a worker's state in the store, not three); older steps of blocks that no longer arrive (the ring changed) are
dropped at the next snapshot, once the driver knows every keeper holds the newest. Two deaths at once in the
moment one keeper has the newest generation and another not yet roll back to the checkpoint. Checkpoint copies
are a slot of their own (the newest), never written into here. Neighbours' copies arrive while this worker
trains (its ``copies`` concurrency group), so every read and change holds a lock.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import ray
import torch
from torch import nn

from actors.snapshot import BackgroundCopy, deferred_snapshot, from_wire, tensor_bytes, to_wire

GENERATIONS = 2  # own snapshots kept; of a neighbour's blocks, the newest copy only
_log = logging.getLogger(__name__)
Payload = Mapping[str, Any]


@dataclass(frozen=True)
class Stored:
    """An own snapshot of one block in Ray's object store: its ref (this worker's) and the bytes of its tensors."""

    ref: Any
    nbytes: int


def _put(block: int, snapshot: Callable[[], Payload]) -> Callable[[], Payload]:
    """``snapshot`` written into Ray's object store once taken: ``{"block", "stored"}``."""

    def put() -> Payload:
        taken = snapshot()
        return {"block": block, "stored": Stored(ray.put(to_wire(taken)), tensor_bytes(taken))}

    return put


class HostCopies:
    """Own, neighbour and checkpoint copies of block state held by one worker (see the module docstring)."""

    def __init__(self) -> None:
        self._own: dict[int, dict[int, Stored]] = {}  # step -> block -> this worker's snapshot in the object store
        self._peer: dict[int, dict[int, Payload]] = {}  # step -> block -> the neighbour's snapshot, as sent (wire form)
        self._checkpoint: tuple[int, dict[int, Payload]] | None = None  # the newest checkpoint's host copy (not ours)
        self._taking: tuple[int, BackgroundCopy] | None = None  # the own snapshot being taken, not yet in _own
        self._lock = threading.RLock()  # the neighbour's copies arrive on another thread

    # ----- taking -----
    def take(self, step: int, modules: Mapping[int, nn.Module], optimizers: Mapping[int, torch.optim.Optimizer]) -> BackgroundCopy:
        """Start a snapshot of ``modules`` (and their optimizers) as the state at ``step``: buffers now, parameters and
        optimizer state by a thread into the object store; the caller's next optimizer step waits for the returned
        copy's ``snapshotted``. It joins the inventory once taken (:meth:`settle`). Called once the driver knows the
        previous snapshot complete everywhere: a neighbour's copies older than its newest are dropped now."""
        with self._lock:
            self.settle()
            self._own.pop(step, None)
            while len(self._own) >= GENERATIONS:
                del self._own[min(self._own)]
            for old in sorted(self._peer)[:-1]:
                del self._peer[old]
            copy = BackgroundCopy([_put(b, deferred_snapshot(b, m, optimizers.get(b), copy=False)) for b, m in modules.items()],
                                  name="snapshot", idle=False)
            self._taking = (step, copy)
            return copy

    def settle(self) -> None:
        """Wait for the own snapshot being taken (if any) and add it to the inventory; one whose copy failed (the
        object store full) is left out and logged: a snapshot is insurance, training goes on without this one."""
        with self._lock:
            if self._taking is None:
                return
            (step, copy), self._taking = self._taking, None
            try:
                copy.result()
            except Exception as exc:  # noqa: BLE001 - see the docstring
                _log.warning("in-memory snapshot at step %d failed, not kept: %s", step, exc)
                return
            self._own[step] = {b: p["stored"] for b, p in copy.hand_over().items()}

    def keep_checkpoint(self, step: int, payloads: Mapping[int, Payload]) -> None:
        """The host snapshot a checkpoint at ``step`` was written from (not copied; never written into here); it
        replaces an older checkpoint's."""
        with self._lock:
            if self._checkpoint is not None and self._checkpoint[0] == step:
                self._checkpoint[1].update(payloads)
            elif self._checkpoint is None or self._checkpoint[0] < step:
                self._checkpoint = (step, dict(payloads))

    def keep_peer(self, step: int, payloads: Mapping[int, Payload]) -> None:
        """A neighbour's snapshot at ``step`` as read from its objects (wire form, not copied); older copies of the
        same blocks are dropped."""
        with self._lock:
            for held_step, held in list(self._peer.items()):
                if held_step < step:
                    for b in payloads:
                        held.pop(b, None)
                    if not held:
                        del self._peer[held_step]
            self._peer.setdefault(step, {}).update(payloads)

    def forget(self, payloads: Mapping[int, Payload]) -> None:
        """Drop the checkpoint copy if it shares a payload with ``payloads`` (buffers about to be reused)."""
        ids = {id(p) for p in payloads.values()}
        with self._lock:
            if self._checkpoint is not None and any(id(p) in ids for p in self._checkpoint[1].values()):
                self._checkpoint = None

    def drop_after(self, step: int) -> None:
        """Forget copies of steps after ``step`` (a recovery resumed there)."""
        with self._lock:
            self.settle()
            for held in (self._own, self._peer):
                for s in [s for s in held if s > step]:
                    del held[s]
            if self._checkpoint is not None and self._checkpoint[0] > step:
                self._checkpoint = None

    # ----- reading (a snapshot being taken is waited for first) -----
    def get(self, step: int, block: int) -> Payload | None:
        """A copy of ``block`` at ``step`` in this process's memory, the caller's to keep (an optimizer keeps the
        tensors it is given): its own snapshot first, then the checkpoint's copy, then the neighbour's; ``None``: none."""
        found = self._held(step, block)
        return None if found is None else from_wire(ray.get(found.ref) if isinstance(found, Stored) else found)

    def export(self, step: int, block: int) -> Any:
        """This worker's copy of ``block`` at ``step`` as an object ref (for another survivor: read it with
        :func:`actors.snapshot.from_wire`), or ``None``. An own snapshot is its object; other copies are put."""
        found = self._held(step, block)
        if found is None:
            return None
        return found.ref if isinstance(found, Stored) else ray.put(to_wire(found))

    def _held(self, step: int, block: int) -> Any:
        with self._lock:
            self.settle()
            for held in self._held_at(step):
                if block in held:
                    return held[block]
            return None

    def _held_at(self, step: int) -> list[Mapping[int, Any]]:
        """What is held at ``step``: own, then the checkpoint's, then the neighbour's (the lock held)."""
        checkpoint = self._checkpoint[1] if self._checkpoint is not None and self._checkpoint[0] == step else {}
        return [self._own.get(step, {}), checkpoint, self._peer.get(step, {})]

    def own_objects(self, step: int) -> dict[int, Any]:
        """This worker's own snapshot at ``step`` (waited for if being taken, and nothing if it failed): block ->
        object ref, for the neighbour."""
        with self._lock:
            self.settle()
            return {b: p.ref for b, p in self._own.get(step, {}).items()}

    def inventory(self) -> dict[int, list[int]]:
        """``step -> blocks`` this worker holds a copy of (own, checkpoint or neighbour's)."""
        with self._lock:
            self.settle()
            steps = set(self._own) | set(self._peer) | ({self._checkpoint[0]} if self._checkpoint is not None else set())
            return {s: sorted(set().union(*self._held_at(s))) for s in sorted(steps)}

    def nbytes(self) -> int:
        """Bytes of state in the copies held (own and checkpoint copies, and the neighbour's mapped from the object
        store: on one node the neighbour's and its owner's are the same memory, counted by both)."""
        with self._lock:
            self.settle()
            held = [p for by_step in (self._own, self._peer) for step in by_step.values() for p in step.values()]
            held += list(self._checkpoint[1].values()) if self._checkpoint is not None else []
            return sum(p.nbytes if isinstance(p, Stored) else tensor_bytes(p) for p in held)
