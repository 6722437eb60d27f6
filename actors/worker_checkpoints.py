"""A stage worker's checkpoints: it writes the blocks it owns from its own node, and restores the ones it holds.

The mixin of :class:`actors.stage_worker.StageWorker` for checkpoints, written apart because the asynchronous
path has a rule of its own: the upload thread copies parameters and optimizer state while the next iteration's
forward and backward run (:func:`actors.checkpoint.deferred_snapshot`), so every change of the state outside an
iteration — the next optimizer step, a live move, a restore — first waits for that copy.
"""

from __future__ import annotations

from typing import Any

from actors import checkpoint as ckpt
from actors.execution import Executor
from actors.training import schedulers_for


class WorkerCheckpoints:
    """Mixin of :class:`actors.stage_worker.StageWorker`; the attributes below are set there."""

    device_id: int
    schedulers: dict[int, Any]
    upload: ckpt.BackgroundWrite | None = None  # the asynchronous checkpoint being uploaded
    staged: dict[int, Any] | None = None  # the last uploaded snapshots: warm host buffers for the next one

    def _ready(self) -> Executor:  # the worker's configured executor (StageWorker._ready)
        raise NotImplementedError

    def save_blocks(self, directory: str, background: bool = False, step: int | None = None) -> list[dict[str, Any]]:
        """Write the blocks this worker owns (replica 0 of each stage only), from this node.

        ``background``: snapshot them now and upload in a thread while training goes on; the
        entries then come from :meth:`finish_blocks` (this returns []). Each block records its
        place (the job's run id, ``step`` — default the ``step_N`` folder's — and its index)."""
        ex = self._ready()
        mine = [b for j in ex.plan.stages_of_device(self.device_id) if ex.plan.stages[j].devices[0] == self.device_id
                for b in range(ex.plan.stages[j].first, ex.plan.stages[j].last)]
        if background:  # the parameters are copied by the upload thread, before this worker's next optimizer step
            self.finish_blocks()  # one upload at a time; an earlier one's error surfaces here
            warm = self.staged or {}
            upload = ckpt.BackgroundWrite(directory, [ckpt.deferred_snapshot(b, ex.modules[b], ex.optimizers.get(b), into=warm.get(b))
                                                      for b in mine], step, ex.spec.run_id)
            self.upload = upload
            ex.snapshot_due = upload.snapshotted
            return []
        return [ckpt.write_payload(directory, ckpt.snapshot_block(b, ex.modules[b], ex.optimizers.get(b)), step, ex.spec.run_id)
                for b in mine]

    def _snapshot_taken(self) -> None:
        """Wait until an asynchronous checkpoint's copy of this worker's state exists (before the state is changed
        outside an iteration: blocks moved away or restored)."""
        upload = self.upload
        if upload is not None:
            upload.snapshotted.wait()

    def finish_blocks(self) -> list[dict[str, Any]]:
        """Wait for the background upload (if any) and return its manifest entries."""
        upload, self.upload = self.upload, None
        if upload is None:
            return []
        self.staged = None  # kept only from an upload that succeeded
        entries = upload.result()
        self.staged = upload.staged
        return entries

    def load_blocks(self, directory: str, manifest: dict[str, Any]) -> int:
        """Restore every block this worker holds (all replicas load the same files)."""
        self._snapshot_taken()
        ex = self._ready()
        entries = {int(e["block"]): e for e in manifest["files"]}
        for b, module in ex.modules.items():
            payload = ckpt.read_block(directory, entries[b])
            ckpt.restore_block(payload, module, ex.optimizers.get(b), f"{directory.rstrip('/')}/{entries[b]['file']}")
        if self.schedulers:  # schedules continue from the restored step
            self.schedulers.clear()
            self.schedulers.update(schedulers_for(ex.spec.training, ex.optimizers, int(manifest["step"])))
        return len(ex.modules)
