"""When the elastic job checkpoints and snapshots: one owner of what was saved when, and what it cost.

The cadence is ``RunConfig.checkpoint_every`` (a number of steps, or ``"auto"``: as often as pays, Young's interval
from the stall the newest checkpoint cost against the deaths seen, :func:`~orchestrator.adapt.policies.checkpoint_interval`)
and ``RunConfig.snapshot_every``. The job's carrier writes the checkpoints; it tells this policy each time
(:meth:`saved`), so that a step is saved once, an upload is committed once, and a notice knows how long a
synchronous checkpoint takes (:attr:`took_s`).
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Sequence

from orchestrator.adapt.policies import checkpoint_interval
from orchestrator.elastic.actions import Checkpoint, JobAction, Snapshot
from orchestrator.train.loop import every

if TYPE_CHECKING:
    from orchestrator.elastic.job_config import RunConfig


class CheckpointPolicy:
    def __init__(self, run: "RunConfig") -> None:
        self.run = run
        self.saved_at = -1
        """The step of the newest checkpoint written (committed or uploading); -1: none this job can rely on."""
        self.took_s = 1.0
        """How long the newest synchronous checkpoint took (a notice must leave room for one)."""
        self._stall_s = 0.0  # what the newest checkpoint cost training
        self._born = time.perf_counter()
        self._snapshots_told = False

    def checkpoint_due(self, step: int, recent_iteration_s: Sequence[float], failures: int) -> bool:
        """Whether a periodic checkpoint is due once ``step`` steps are done."""
        if self.run.checkpoint_every == "auto":
            return bool(recent_iteration_s) and step - self.saved_at >= checkpoint_interval(
                self._stall_s, statistics.median(recent_iteration_s), failures, time.perf_counter() - self._born)
        return every(int(self.run.checkpoint_every), step)

    def due(self, step: int, recent_iteration_s: Sequence[float], failures: int) -> list[JobAction]:
        """The periodic checkpoint and the in-memory snapshot due after ``step``, each on its own cadence."""
        actions: list[JobAction] = []
        if self.checkpoint_due(step, recent_iteration_s, failures) and self.saved_at != step:
            actions.append(Checkpoint("periodic"))
        if every(self.run.snapshot_every, step):
            actions.append(Snapshot())
        return actions

    def saved(self, step: int, took_s: float | None, background: bool) -> None:
        """A checkpoint of ``step`` was written (``background``: its upload goes on; it is committed later).
        ``took_s``: what it cost training (``None``: an evacuation's insurance, not the cadence's to learn from)."""
        self.saved_at = step
        if took_s is not None:
            self._stall_s = took_s
            if not background:
                self.took_s = took_s

    def resumed(self, step: int) -> None:
        """The job resumed from the committed checkpoint of ``step``."""
        self.saved_at = step

    def upload_lost(self) -> None:
        """A recovery discarded the upload in progress (it never commits): that step is saved again when due."""
        self.saved_at = -1

    def first_snapshot(self) -> bool:
        """True once: the first snapshot is waited for, to say what snapshots hold."""
        first, self._snapshots_told = not self._snapshots_told, True
        return first


__all__ = ["CheckpointPolicy"]
