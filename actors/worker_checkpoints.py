"""A stage worker's checkpoints: it writes the blocks it owns from its own node, and restores the ones it holds.

:class:`WorkerCheckpoints` is an object the stage worker owns (:class:`actors.stage_worker.StageWorker` exposes its
methods to the driver), with state of its own: the upload in flight, the warm host buffers of the last one, and the
host copies kept for a recovery in place. It is given the worker's executor (the blocks and optimizers) at each call
and never changes the worker's own state: after a restore it returns the step to resume at. It is apart because the
asynchronous path has a rule of its own: the upload thread copies parameters and optimizer state while the next iteration's
forward and backward run (:func:`actors.checkpoint.deferred_snapshot`), so every change of the state outside an
iteration — the next optimizer step, a live move, a restore — first waits for that copy.
"""

from __future__ import annotations

import threading
from typing import Any

import ray

from actors import checkpoint as ckpt
from actors.execution import Executor
from actors.host_copies import HostCopies
from actors.metrics import HeldCopies
from actors.snapshot import BackgroundCopy, from_wire, snapshot_block


class WorkerCheckpoints:
    """The checkpoints and host copies of one stage worker (see the module docstring)."""

    def __init__(self) -> None:
        self.copies = HostCopies()  # own, neighbour and checkpoint copies of block state (actors/host_copies.py)
        self.upload: ckpt.BackgroundWrite | None = None  # the asynchronous checkpoint being uploaded
        self.upload_step = 0  # the step that upload holds
        self.staged: dict[int, Any] | None = None  # the last uploaded snapshots: warm host buffers for the next one
        self.snapshot: BackgroundCopy | None = None  # the in-memory snapshot being taken (copies.take)

    def forget_copies(self) -> None:
        """The host copies belong to an earlier job or state (a fresh configuration): drop them."""
        self.snapshot_taken()
        self.copies, self.snapshot = HostCopies(), None

    def snapshot_pending(self) -> list[threading.Event]:
        """The events set once this worker's copies of its state being taken in the background exist (an
        asynchronous checkpoint's, an in-memory snapshot's): the next optimizer step waits for them."""
        pending = [c.snapshotted for c in (self.upload, self.snapshot) if c is not None]
        return [e for e in pending if not e.is_set()]

    def save_blocks(self, ex: Executor, next_step: int, directory: str, background: bool = False,
                    step: int | None = None) -> list[dict[str, Any]]:
        """Write the blocks this worker owns (replica 0 of each stage only), from this node; the state is that before
        ``next_step`` (the worker's next step to run).

        ``background``: snapshot them now and upload in a thread while training goes on; the
        entries then come from :meth:`finish_blocks` (this returns []). Each block records its
        place (the job's run id, ``step`` — default the ``step_N`` folder's — and its index)."""
        mine = [b for j in ex.plan.stages_of_device(ex.device) if ex.plan.stages[j].devices[0] == ex.device
                for b in range(ex.plan.stages[j].first, ex.plan.stages[j].last)]
        if background:  # the parameters are copied by the upload thread, before this worker's next optimizer step
            self.finish_blocks()  # one upload at a time; an earlier one's error surfaces here
            warm = self.staged or {}
            self.copies.forget(warm)  # the previous checkpoint's host copy is about to be overwritten
            self.upload_step = next_step
            upload = ckpt.BackgroundWrite(directory, [ckpt.deferred_snapshot(b, ex.modules[b], ex.optimizers.get(b), into=warm.get(b))
                                                      for b in mine], step, ex.spec.run_id, ex.spec.storage_retry_s)
            self.upload = upload  # the worker's next optimizer step waits for its copy (snapshot_pending)
            return []
        snaps = {b: snapshot_block(b, ex.modules[b], ex.optimizers.get(b)) for b in mine}
        self.copies.keep_checkpoint(next_step, snaps)  # the same state, kept for a recovery in place
        return [ckpt.write_payload(directory, snap, step, ex.spec.run_id, ex.spec.storage_retry_s) for snap in snaps.values()]

    def snapshot_taken(self) -> None:
        """Wait until the copies of this worker's state being taken in the background exist (an asynchronous
        checkpoint's, an in-memory snapshot's), before the state is changed outside an iteration: blocks moved away
        or restored."""
        for copying in (self.upload, self.snapshot):
            if copying is not None:
                copying.snapshotted.wait()

    def finish_blocks(self) -> list[dict[str, Any]]:
        """Wait for the background upload (if any) and return its manifest entries."""
        upload, self.upload = self.upload, None
        if upload is None:
            return []
        self.staged = None  # kept only from an upload that succeeded
        entries = upload.result()
        self.staged = upload.staged
        self.copies.keep_checkpoint(self.upload_step, upload.staged)
        return entries

    def load_blocks(self, ex: Executor, directory: str, manifest: dict[str, Any]) -> int:
        """Restore every block this worker holds (all replicas load the same files); returns the step to resume at."""
        self.snapshot_taken()
        entries = {int(e["block"]): e for e in manifest["files"]}
        for b, module in ex.modules.items():
            payload = ckpt.read_block(directory, entries[b])
            ckpt.restore_block(payload, module, ex.optimizers.get(b), f"{directory.rstrip('/')}/{entries[b]['file']}")
        return int(manifest["step"])

    # ----- host copies (recovery in place; actors/host_copies.py) -----
    def host_copies(self) -> HeldCopies:
        """What this worker holds (the driver picks the step to resume).

        An asynchronous checkpoint still uploading counts: its snapshot is that step's state on this host already,
        so a death during the upload can roll back to the step being uploaded (when every block has a copy there)
        instead of the previous committed checkpoint's."""
        self.snapshot_taken()
        upload = self.upload
        if upload is not None and upload.staged:  # every block's copy taken (the thread sets them all at once)
            self.copies.keep_checkpoint(self.upload_step, upload.staged)
        return HeldCopies(self.copies.inventory(), self.copies.nbytes())

    def snapshot_copies(self, ex: Executor, step: int) -> None:
        """Start a snapshot of the blocks held here as the state at ``step`` (between iterations): the copy runs while
        the next iteration's forward and backward do, and its optimizer step waits for it. The neighbour that keeps
        a copy gets it from :meth:`peer_payloads`."""
        self.snapshot_taken()
        self.snapshot = self.copies.take(step, ex.modules, ex.optimizers)
        ex.wait_before_step(self.snapshot.snapshotted)

    def peer_payloads(self, step: int) -> dict[int, Any]:
        """This worker's snapshot at ``step`` once taken, as object refs owned by this worker, for the neighbour that
        keeps a copy (:meth:`keep_peer_copy`). Runs beside training (the ``copies`` concurrency group)."""
        return self.copies.own_objects(step)

    def keep_peer_copy(self, step: int, *parts: dict[int, Any]) -> int:
        """Keep neighbours' snapshots at ``step`` (``parts``: block -> object ref, one per owner), mapped from the
        object store (pulled to this node if they are on another); returns the bytes of copies held here. Runs beside
        training (the ``copies`` concurrency group)."""
        refs = {int(b): r for part in parts for b, r in part.items()}
        self.copies.keep_peer(step, dict(zip(refs, ray.get(list(refs.values())))))
        return self.copies.nbytes()

    def export_copies(self, device: int, step: int, blocks: list[int]) -> dict[int, Any]:
        """This worker's copies of ``blocks`` at ``step`` as object refs (for a survivor that now holds them)."""
        out: dict[int, Any] = {}
        for b in blocks:
            out[b] = self.copies.export(step, b)
            if out[b] is None:
                raise RuntimeError(f"device {device} holds no copy of block {b} at step {step}")
        return out

    def restore_copies(self, ex: Executor, step: int, fetched: dict[int, Any], directory: str | None,
                       manifest: dict[str, Any] | None) -> dict[str, int]:
        """Roll every block held here back to ``step``: from this worker's own copy, else from a peer's
        (``fetched``: block -> object ref), else from the checkpoint at ``directory``. Returns the count per source."""
        entries = {int(e["block"]): e for e in manifest["files"]} if manifest is not None else {}
        counts = {"own": 0, "peer": 0, "storage": 0}
        for b, module in ex.modules.items():
            payload = self.copies.get(step, b)  # each source gives a copy of its own: the optimizer keeps the tensors
            where = "own"
            if payload is None and b in fetched:
                payload, where = from_wire(ray.get(fetched[b])), "peer"
            if payload is None:
                if directory is None or b not in entries:
                    raise RuntimeError(f"device {ex.device}: no copy of block {b} at step {step} and no checkpoint")
                payload, where = ckpt.read_block(directory, entries[b]), "storage"
            ckpt.restore_block(payload, module, ex.optimizers.get(b), f"host copy of block {b} at step {step}")
            counts[where] += 1
        self.copies.drop_after(step)
        return counts
