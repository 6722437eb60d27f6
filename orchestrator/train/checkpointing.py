"""The trainer's checkpoint I/O: save (at once, or snapshot now and upload in the background),
commit, and restore under any plan.

A mixin of :class:`~orchestrator.train.runtime.PipelineRuntime`, apart so that the runtime module is
about running steps: every block is written by the worker that holds it, from its own node
(replica 0 of each stage), and the driver writes only the manifest and the commit marker, last
(:mod:`actors.checkpoint` owns the format).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, overload

from actors import checkpoint as ckpt
from actors import storage
from actors.group import WorkerGroup
from actors.job_spec import JobSpec
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan


class Checkpointing:
    """Checkpoint methods over the trainer's workers, plan, step and losses."""

    spec: JobSpec
    plan: Plan
    step: int
    history: dict[int, float]
    checkpoint_dir: str | Path | None
    skipped_checkpoints: list[ckpt.Skipped]
    _uploading: tuple[str | Path, int, int, dict[str, Any], dict[str, Any], list[int]] | None

    def _workers(self) -> WorkerGroup:
        raise NotImplementedError

    @overload
    def save_checkpoint(self, directory: Path, background: bool = False) -> Path: ...
    @overload
    def save_checkpoint(self, directory: str | Path | None = None, background: bool = False) -> str | Path: ...
    def save_checkpoint(self, directory: str | Path | None = None, background: bool = False) -> str | Path:
        """Every block once (replica 0 writes, from its own node), then the manifest and the commit
        marker (driver); returns the checkpoint location (a Path for a local one).

        ``background``: the workers snapshot their blocks (a CPU copy: the only stall) and upload
        them while training continues; :meth:`finish_checkpoint` waits and commits. Until then the
        folder has no commit marker and is not a checkpoint for any reader."""
        group = self._workers()
        if directory is None:
            if self.checkpoint_dir is None:
                raise UserError("no checkpoint_dir configured and no directory given")
            directory = ckpt.step_dir(self.checkpoint_dir, self.step)
        target = Path(directory) if storage.scheme(directory) == "" else str(directory)
        extra = {"seed": self.spec.seed, "data_position": self.step, "rng": "reseeded from (seed, step, device) every step",
                 "losses": {str(s): v for s, v in sorted(self.history.items())}}
        if background:
            self.finish_checkpoint()  # one upload at a time
            devices = group.plan_devices()
            group.call("save_blocks", str(target), True, self.step, devices=devices, what="checkpoint snapshot")
            self._uploading = (target, self.step, self.plan.num_blocks, self.plan.to_dict(), extra, devices)
            return target
        entries = [e for part in group.call("save_blocks", str(target), False, self.step, what="checkpoint") for e in part]
        ckpt.write_manifest(target, self.step, self.plan.num_blocks, entries, self.plan.to_dict(), extra, seed=self.spec.seed)
        return target

    @property
    def upload_pending(self) -> bool:
        """Whether a background checkpoint is uploading (not yet committed)."""
        return self._uploading is not None

    def finish_checkpoint(self) -> str | Path | None:
        """Wait for the background checkpoint (if any), then commit it; returns its location."""
        if self._uploading is None:
            return None
        (target, step, num_blocks, plan, extra, devices), self._uploading = self._uploading, None
        entries = [e for part in self._workers().call("finish_blocks", devices=devices, what=f"checkpoint upload to {target}")
                   for e in part]
        ckpt.write_manifest(target, step, num_blocks, entries, plan, extra, seed=self.spec.seed)
        return target

    def latest(self) -> str | Path | None:
        """The newest intact checkpoint under ``checkpoint_dir`` (``None``: none, or no folder):
        what every recovery restores. Damaged ones passed over go to ``skipped_checkpoints``."""
        if self.checkpoint_dir is None:
            return None
        found = ckpt.find_latest(self.checkpoint_dir)
        self.skipped_checkpoints.extend(found.skipped)
        return found.location

    def restore(self, source: str | Path) -> int:
        """Load a checkpoint taken under ANY plan of the same model; returns the resumed step.

        ``"latest"`` is the newest valid checkpoint under ``checkpoint_dir`` and an error when there
        is none; ``"latest_or_fresh"`` starts from the seed instead. Damaged checkpoints passed over
        are kept in ``skipped_checkpoints`` (with reasons) for the caller's event log."""
        group = self._workers()
        if str(source) in ("latest", "latest_or_fresh"):
            if self.checkpoint_dir is None:
                raise UserError(f"resume={str(source)!r} needs a checkpoint_dir")
            found = ckpt.find_latest(self.checkpoint_dir)
            self.skipped_checkpoints.extend(found.skipped)
            if found.location is None:
                if str(source) == "latest_or_fresh":
                    return self.step
                why = f"; newest skipped: {found.skipped[0].reason}" if found.skipped else ""
                raise UserError(f"resume='latest': no valid checkpoint under {self.checkpoint_dir}{why} "
                                "(resume='latest_or_fresh' starts from the seed instead)")
            source = found.location
        directory = str(source)
        manifest = ckpt.verify(directory)
        ckpt.check_model(manifest, self.plan.num_blocks, directory)
        group.call("load_blocks", str(directory), manifest, what=f"restore from {directory}")
        self.step = int(manifest["step"])
        self.history.update({int(k): float(v) for k, v in manifest.get("extra", {}).get("losses", {}).items()})
        return self.step
