"""A worker's host copies of block state: what a recovery in place restores from without reading storage.

Why in memory: after a worker dies without notice the survivors keep their processes
(:meth:`orchestrator.train.runtime.PipelineRuntime.recover_in_place`); each rolls back from a copy it
already holds, and the dead worker's blocks come from a neighbour's copy (Gemini, SOSP'23: restoring
from peers' memory is an order of magnitude faster than from storage) or, failing that, from the
newest committed checkpoint. Three things put copies here, all keyed ``step -> block -> payload``
(the :func:`actors.snapshot.snapshot_block` format, which is also what a checkpoint file holds):

* **own snapshots** (``RunConfig.snapshot_every``): the blocks this worker holds, at a step;
* **a neighbour's snapshots**: the same from the next device in the ring, copied into this process
  (a reference would die with its owner);
* **checkpoint copies**: the host snapshot a checkpoint was written from (synchronous) or uploaded
  from (asynchronous, once its upload finished) is that step's state too, at no extra cost.

Own snapshots are taken in the background (:class:`actors.snapshot.BackgroundCopy`: the parameters and the
optimizer state are copied while the next forward and backward run, before the next optimizer step) and join
the inventory once taken; a neighbour's arrive while this worker trains (its ``copies`` concurrency group), so
every read and change of the inventory holds a lock. Two generations of each are kept: a death while the
newest is being taken (the owner's copy new, the neighbour's still old) still leaves an older step that is
complete (the driver starts a snapshot only once the previous one's neighbour copies all arrived). Buffers of the oldest own or
neighbour generation are reused for the next one (no page faults, steady memory); checkpoint copies
are never written into (the next asynchronous upload reuses them itself, so they are dropped first:
:meth:`HostCopies.forget`).
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

import torch
from torch import nn

from actors.snapshot import BackgroundCopy, deferred_snapshot, from_wire, tensor_bytes

GENERATIONS = 2
Payload = Mapping[str, Any]


class HostCopies:
    """Own, neighbour and checkpoint copies of block state held by one worker (see the module docstring)."""

    def __init__(self) -> None:
        self._own: dict[int, dict[int, Payload]] = {}  # step -> block -> payload (snapshots and checkpoint copies)
        self._peer: dict[int, dict[int, Payload]] = {}  # step -> block -> payload (the neighbour's snapshots)
        self._reusable: set[int] = set()  # own steps whose buffers this store may overwrite (snapshots only)
        self._taking: tuple[int, BackgroundCopy] | None = None  # the own snapshot being taken, not yet in _own
        self._lock = threading.RLock()  # the neighbour's copies arrive on another thread

    # ----- taking -----
    def take(self, step: int, modules: Mapping[int, nn.Module], optimizers: Mapping[int, torch.optim.Optimizer]) -> BackgroundCopy:
        """Start a snapshot of ``modules`` (and their optimizers) as the state at ``step``: buffers now, parameters and
        optimizer state by a thread into the buffers of the generation it replaces; the caller's next optimizer step
        waits for the returned copy's ``snapshotted``. It joins the inventory once taken (:meth:`settle`)."""
        with self._lock:
            self.settle()
            warm = self._evict(self._own, step, self._reusable)
            copy = BackgroundCopy([deferred_snapshot(b, m, optimizers.get(b), into=warm.get(b)) for b, m in modules.items()],
                                  name="snapshot")
            self._taking = (step, copy)
            return copy

    def settle(self) -> None:
        """Wait for the own snapshot being taken (if any) and add it to the inventory (raises if the copy failed)."""
        with self._lock:
            if self._taking is None:
                return
            (step, copy), self._taking = self._taking, None
            copy.result()
            self._own[step] = dict(copy.staged)
            self._reusable.add(step)

    def keep_checkpoint(self, step: int, payloads: Mapping[int, Payload]) -> None:
        """The host snapshot a checkpoint at ``step`` was written from (not copied; never overwritten here)."""
        with self._lock:
            self.settle()
            self._evict(self._own, step, self._reusable)
            self._own.setdefault(step, {}).update(payloads)
            self._reusable.discard(step)

    def keep_peer(self, step: int, payloads: Mapping[int, Payload]) -> None:
        """A neighbour's snapshot at ``step`` (as sent: :func:`actors.snapshot.to_wire`), copied into this process's own
        memory (into the buffers of the generation it replaces, outside the lock: nobody reads those any more)."""
        with self._lock:
            warm = self._evict(self._peer, step, None)
        copied = {b: from_wire(p, into=warm.get(b)) for b, p in payloads.items()}
        with self._lock:
            self._peer[step] = copied

    def forget(self, payloads: Mapping[int, Payload]) -> None:
        """Drop every checkpoint copy that shares a payload with ``payloads`` (buffers about to be reused)."""
        ids = {id(p) for p in payloads.values()}
        with self._lock:
            for step in [s for s, held in self._own.items() if any(id(p) in ids for p in held.values())]:
                del self._own[step]
                self._reusable.discard(step)

    def drop_after(self, step: int) -> None:
        """Forget copies of steps after ``step`` (a recovery resumed there)."""
        with self._lock:
            self.settle()
            for held in (self._own, self._peer):
                for s in [s for s in held if s > step]:
                    del held[s]
            self._reusable &= set(self._own)

    # ----- reading (a snapshot being taken is waited for first) -----
    def get(self, step: int, block: int) -> Payload | None:
        """This worker's copy of ``block`` at ``step`` (own first, then the neighbour's), or ``None``."""
        with self._lock:
            self.settle()
            found = self._own.get(step, {}).get(block)
            return found if found is not None else self._peer.get(step, {}).get(block)

    def own(self, step: int) -> dict[int, Payload]:
        """This worker's own snapshot at ``step`` (waited for if being taken), block -> payload."""
        with self._lock:
            self.settle()
            return dict(self._own.get(step, {}))

    def inventory(self) -> dict[int, list[int]]:
        """``step -> blocks`` this worker holds a copy of (own or neighbour's)."""
        with self._lock:
            self.settle()
            steps = set(self._own) | set(self._peer)
            return {s: sorted(set(self._own.get(s, {})) | set(self._peer.get(s, {}))) for s in sorted(steps)}

    def nbytes(self) -> int:
        """Host bytes held in copies (what the snapshots cost; checkpoint copies included)."""
        with self._lock:
            self.settle()
            return sum(tensor_bytes(p) for held in (self._own, self._peer) for step in held.values() for p in step.values())

    # ----- generations -----
    @staticmethod
    def _evict(held: dict[int, dict[int, Payload]], step: int, reusable: set[int] | None) -> dict[int, Payload]:
        """Make room for ``step`` (at most :data:`GENERATIONS` steps); returns the evicted generation's payloads
        when their buffers may be reused (``reusable``: the steps whose may; ``None``: all)."""
        held.pop(step, None)
        warm: dict[int, Payload] = {}
        while len(held) >= GENERATIONS:
            oldest = min(held)
            gone = held.pop(oldest)
            if reusable is None or oldest in reusable:
                warm = gone
            if reusable is not None:
                reusable.discard(oldest)
        return warm
