"""The runtime's checkpoint I/O: save (at once, or snapshot now and upload in the background), commit, and
restore under any plan.

An object the runtime owns (:attr:`~orchestrator.train.runtime.PipelineRuntime.checkpoints`), apart so that the
runtime module is about running steps, and with its own state — where checkpoints go, the background upload not yet
committed, the damaged checkpoints passed over — which nothing else writes. What it saves (the workers, the plan,
the step, the losses) is passed in by the runtime on each call. Every block is written by the worker that holds it,
from its own node (replica 0 of each stage), and the driver writes only the manifest and the commit marker, last
(:mod:`actors.checkpoint` owns the format).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from actors.stage_worker import StageWorker
from actors import checkpoint as ckpt
from actors import storage
from actors.group import WorkerGroup
from actors.job_spec import JobSpec
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan


@dataclass(frozen=True)
class Upload:
    """A background checkpoint the workers are uploading: committed by :meth:`Checkpoints.finish`."""

    target: str | Path
    step: int
    num_blocks: int
    plan: dict[str, Any]
    extra: dict[str, Any]
    devices: list[int]


class Checkpoints:
    """Checkpoints of one runtime under ``directory`` (``None``: none configured)."""

    def __init__(self, directory: str | Path | None, retry_s: float = 180.0) -> None:
        self.retry_s = retry_s  # a commit is done again through a storage outage for this long
        # a local folder stays a Path; a storage URI (s3://, gs://, az://) stays a string
        self.directory: str | Path | None = (
            None if directory is None else directory if isinstance(directory, str) and not storage.is_local(directory)
            else Path(storage.local_path(directory)))
        self.skipped: list[ckpt.Skipped] = []  # damaged ones passed over by resume/recovery, with reasons
        self._upload: Upload | None = None

    def save(self, group: WorkerGroup, spec: JobSpec, plan: Plan, step: int, history: Mapping[int, float],
             directory: str | Path | None = None, background: bool = False) -> str | Path:
        """Every block once (replica 0 writes, from its own node), then the manifest and the commit marker
        (driver); returns the checkpoint location (a Path for a local one).

        ``background``: the workers snapshot their blocks (a CPU copy: the only stall) and upload them while
        training continues; :meth:`finish` waits and commits. Until then the folder has no commit marker and is
        not a checkpoint for any reader."""
        if directory is None:
            if self.directory is None:
                raise UserError("no checkpoint_dir configured and no directory given")
            directory = ckpt.step_dir(self.directory, step)
        target = Path(directory) if storage.scheme(directory) == "" else str(directory)
        extra = {"seed": spec.seed, "data_position": step, "rng": "reseeded from (seed, step, device) every step",
                 "losses": {str(s): v for s, v in sorted(history.items())}}
        if background:
            self.finish(group, spec)  # one upload at a time
            devices = group.plan_devices()
            group.call(StageWorker.save_blocks, str(target), True, step, devices=devices, what="checkpoint snapshot")
            self._upload = Upload(target, step, plan.num_blocks, plan.to_dict(), extra, devices)
            return target
        entries = [e for part in group.call(StageWorker.save_blocks, str(target), False, step, what="checkpoint") for e in part]
        storage.retried(lambda: ckpt.write_manifest(target, step, plan.num_blocks, entries, plan.to_dict(), extra, seed=spec.seed),
                        self.retry_s)
        return target

    @property
    def pending(self) -> bool:
        """Whether a background checkpoint is uploading (not yet committed)."""
        return self._upload is not None

    def finish(self, group: WorkerGroup, spec: JobSpec) -> str | Path | None:
        """Wait for the background checkpoint (if any), then commit it; returns its location."""
        if self._upload is None:
            return None
        up, self._upload = self._upload, None
        entries = [e for part in group.call(StageWorker.finish_blocks, devices=up.devices, what=f"checkpoint upload to {up.target}")
                   for e in part]
        storage.retried(lambda: ckpt.write_manifest(up.target, up.step, up.num_blocks, entries, up.plan, up.extra, seed=spec.seed),
                        self.retry_s)
        return up.target

    def abandon(self) -> None:
        """Forget the upload in flight: a dead worker was part of it, so it never commits (its folder stays
        unmarked and is no checkpoint for any reader)."""
        self._upload = None

    def latest(self) -> str | Path | None:
        """The newest intact checkpoint under ``directory`` (``None``: none, or no folder): what every recovery
        restores. Damaged ones passed over go to :attr:`skipped`."""
        if self.directory is None:
            return None
        found = ckpt.find_latest(self.directory)
        self.skipped.extend(found.skipped)
        return found.location

    def load(self, group: WorkerGroup, num_blocks: int, source: str | Path) -> tuple[int, dict[int, float]] | None:
        """Load a checkpoint taken under ANY plan of the same model into the workers; returns its step and the
        losses it recorded (``None``: ``"latest_or_fresh"`` found none).

        ``"latest"`` is the newest valid checkpoint under ``directory`` and an error when there is none;
        ``"latest_or_fresh"`` starts from the seed instead. Damaged checkpoints passed over are kept in
        :attr:`skipped` (with reasons) for the caller's event log."""
        if str(source) in ("latest", "latest_or_fresh"):
            if self.directory is None:
                raise UserError(f"resume={str(source)!r} needs a checkpoint_dir")
            found = ckpt.find_latest(self.directory)
            self.skipped.extend(found.skipped)
            if found.location is None:
                if str(source) == "latest_or_fresh":
                    return None
                why = f"; newest skipped: {found.skipped[0].reason}" if found.skipped else ""
                raise UserError(f"resume='latest': no valid checkpoint under {self.directory}{why} "
                                "(resume='latest_or_fresh' starts from the seed instead)")
            source = found.location
        directory = str(source)
        manifest = ckpt.verify(directory)
        ckpt.check_model(manifest, num_blocks, directory)
        group.call(StageWorker.load_blocks, str(directory), manifest, what=f"restore from {directory}")
        losses = {int(k): float(v) for k, v in manifest.get("extra", {}).get("losses", {}).items()}
        return int(manifest["step"]), losses


__all__ = ["Checkpoints", "Upload"]
