"""The job manager: one training job's life across preemptions, migrations and restarts.

    start on a placement → train → checkpoint periodically
      ↳ preemption notice (watcher or injected) → durable checkpoint before the deadline
      ↳ or a cheaper place found (voluntary migration)
    → ask the policy where to go → bring the target up → re-plan for the devices actually got
    → restore from the block-keyed checkpoint → continue

The manager is a state machine over small, injected parts, so each transition can be tested
without Ray or a cloud: a :class:`Session` is one training attempt on one placement (the real one
wraps :class:`~orchestrator.train.trainer.PipelineTrainer`), a ``launcher`` brings a placement up and
says how many devices really came, a ``policy`` returns the cloud module's ``KeepOffer``/``Migrate``
decisions, and ``clock`` is injectable. Every transition is one JSONL event with its timestamp
and cost so far.
"""

from __future__ import annotations

import shutil
import threading
import time
from datetime import datetime, timezone
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Protocol

from actors import checkpoint as ckpt
from cloud.migration import Migrate, KeepOffer
from cloud.records import Offer
from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.elastic.launch import LaunchTarget
from orchestrator.elastic.observability import EventLog
from orchestrator.core.plan import Plan


class JobState(str, Enum):
    STARTING = "starting"
    TRAINING = "training"
    CHECKPOINTING = "checkpointing"
    MIGRATING = "migrating"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class Placement:
    """Where the job runs: an offer (None on a private cluster), its launch target and its devices."""

    target: LaunchTarget
    devices: int
    offer: Offer | None = None
    cluster: Cluster | None = None

    @property
    def usd_per_hour(self) -> float:
        return self.offer.usd_per_hour if self.offer is not None else 0.0

    def label(self) -> str:
        where = self.offer.label() if self.offer is not None else self.target.kind
        return f"{where} ×{self.devices}"


@dataclass(frozen=True)
class PreemptionNotice:
    deadline: float  # on the manager's clock
    source: str = "injected"


class Session(Protocol):
    """One training attempt on one placement."""

    @property
    def plan(self) -> Plan: ...

    @property
    def step(self) -> int: ...

    def train(self, steps: int) -> list[float]: ...

    def checkpoint(self, directory: Path) -> Path: ...

    def close(self) -> None: ...


SessionFactory = Callable[[Placement, Path | None], Session]
Launcher = Callable[[Placement], Placement]
MigrationPolicy = Callable[[Placement, bool, int], "KeepOffer | Migrate"]


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    name: str
    total_steps: int
    checkpoint_dir: Path
    checkpoint_every: int = 10
    """Periodic checkpoints bound the work lost to a crash without notice."""
    migration_check_every: int = 0
    """Ask the policy for a cheaper place every N steps (0: only on preemption)."""
    deadline_margin_s: float = 2.0
    """Checkpoint must finish this long before the notice's deadline to count as durable."""
    initial_checkpoint_estimate_s: float = 5.0
    final_checkpoint: bool = True
    """Write a checkpoint when the last step is done (the trained model is the point of the job)."""
    rehearse_notice_at: int | None = None
    """Fault injection: deliver a preemption notice right after this step (once), to rehearse."""
    rehearse_notice_s: float = 120.0
    """Time left on the rehearsed notice (AWS gives 120 s, GCP and Azure about 30 s)."""
    checkpoint_store: Path | None = None
    """Where checkpoints are copied before a move (a path, or the target's bucket via cloud.transfer)."""

    def __post_init__(self) -> None:
        if self.total_steps < 1:
            raise UserError("a job needs at least one step")
        if self.checkpoint_every < 0 or self.migration_check_every < 0:
            raise UserError("checkpoint and migration intervals must be >= 0")


@dataclass
class JobReport:
    steps: int
    losses: dict[int, float]
    placements: list[str]
    migrations: int
    preemptions: int
    cost_usd: float
    wall_s: float
    events: list[dict[str, Any]] = field(default_factory=list)


class JobManager:
    """Owns the job; see the module docstring. ``notify_preemption`` is safe to call from a watcher thread."""

    def __init__(
        self,
        config: JobConfig,
        placement: Placement,
        session_factory: SessionFactory,
        launcher: Launcher,
        policy: MigrationPolicy,
        events: EventLog,
        clock: Callable[[], float] = time.monotonic,
        metrics: Any = None,
    ) -> None:
        """``metrics``: an :class:`~orchestrator.elastic.observability.RayMetrics` (or anything with its
        methods) that receives throughput, bubble fraction and cost rate every step."""
        self.config, self.placement = config, placement
        self.session_factory, self.launcher, self.policy = session_factory, launcher, policy
        self.events, self.clock, self.metrics = events, clock, metrics
        self.state = JobState.STARTING
        self.losses: dict[int, float] = {}
        self._notice: PreemptionNotice | None = None
        self._lock = threading.Lock()
        self._checkpoint_s = config.initial_checkpoint_estimate_s
        self._last_durable: Path | None = None
        self._cost = 0.0
        self._since = clock()
        self.migrations = self.preemptions = 0
        self._last_check = -1
        self._rehearsed = False
        self.placements = [placement.label()]

    # ----- inputs -----
    def notify_preemption(self, deadline: float, source: str = "injected") -> None:
        with self._lock:
            if self._notice is None or deadline < self._notice.deadline:
                self._notice = PreemptionNotice(deadline, source)

    def on_cloud_notice(self, deadline_utc: datetime, source: str = "cloud metadata") -> None:
        """Callback for :mod:`cloud.preemption` watchers: a UTC deadline on the manager's clock."""
        left = (deadline_utc - datetime.now(timezone.utc)).total_seconds()
        self.notify_preemption(self.clock() + left, source)

    def _take_notice(self) -> PreemptionNotice | None:
        with self._lock:
            notice, self._notice = self._notice, None
            return notice

    # ----- the loop -----
    def run(self, session: Session | None = None) -> JobReport:
        start = self.clock()
        if session is None:  # otherwise the caller already runs a session on this placement
            self.placement = self.launcher(self.placement)
            session = self.session_factory(self.placement, self._resume_point())
        where = getattr(session, "devices", None)  # sessions on real actors report their nodes
        self._emit("job_started", placement=self.placement.label(), plan=session.plan.describe(), step=session.step,
                   devices=where() if callable(where) else [])
        try:
            while session.step < self.config.total_steps:
                notice = self._take_notice()
                if notice is not None:
                    session = self._preempted(session, notice)
                    continue
                if self._migration_due(session):
                    decision = self.policy(self.placement, False, session.step)
                    if isinstance(decision, Migrate):
                        session = self._migrate(session, decision, forced=False, checkpoint=self._checkpoint(session, "voluntary"))
                        continue
                self.state = JobState.TRAINING
                step = session.step
                t0 = self.clock()
                for offset, loss in enumerate(session.train(1)):
                    self.losses[step + offset] = loss
                self._record_step(session, self.clock() - t0)
                if session.step == self.config.rehearse_notice_at and not self._rehearsed:
                    self._rehearsed = True
                    self.notify_preemption(self.clock() + self.config.rehearse_notice_s, "rehearsal")
                if self.config.checkpoint_every and session.step % self.config.checkpoint_every == 0:
                    self._checkpoint(session, "periodic")
            if self.config.final_checkpoint and (self._last_durable is None or self._last_durable.name != ckpt.step_dir(self.config.checkpoint_dir, session.step).name):
                self._checkpoint(session, "final")
            self.state = JobState.DONE
        except BaseException as exc:
            self.state = JobState.FAILED
            self._emit("job_failed", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            session.close()
        self._accrue()
        self._emit("job_finished", step=session.step)
        return JobReport(session.step, dict(self.losses), list(self.placements), self.migrations, self.preemptions,
                         self._cost, self.clock() - start, self.events.read())

    # ----- transitions -----
    def _checkpoint(self, session: Session, why: str, deadline: float | None = None) -> Path | None:
        """Write a checkpoint; it counts only if complete (manifest verified) before ``deadline``."""
        self.state = JobState.CHECKPOINTING
        directory = ckpt.step_dir(self.config.checkpoint_dir, session.step)
        t0 = self.clock()
        try:
            path = session.checkpoint(directory)
        except Exception as exc:  # a worker died mid-write, the disk filled up, ...: never half-load it
            shutil.rmtree(directory, ignore_errors=True)
            self._emit("checkpoint_failed", why=why, step=session.step, error=f"{type(exc).__name__}: {exc}",
                       fallback=str(self._last_durable) if self._last_durable else "start")
            return None
        took = self.clock() - t0
        self._checkpoint_s = took
        durable = deadline is None or self.clock() <= deadline - self.config.deadline_margin_s
        try:
            ckpt.verify(path)
        except UserError as exc:
            durable = False
            self._emit("checkpoint_invalid", path=str(path), error=str(exc))
        if durable:
            self._last_durable = path
        else:
            shutil.rmtree(path, ignore_errors=True)  # finished too late: the instance was gone mid-write
        self._emit("checkpoint", why=why, step=session.step, path=str(path), seconds=round(took, 4), durable=durable)
        return path if durable else None

    def _preempted(self, session: Session, notice: PreemptionNotice) -> Session:
        self.preemptions += 1
        left = notice.deadline - self.clock()
        self._emit("preemption_notice", source=notice.source, seconds_left=round(left, 3), step=session.step,
                   checkpoint_estimate_s=round(self._checkpoint_s, 3))
        saved: Path | None = None
        if left >= self._checkpoint_s + self.config.deadline_margin_s:
            saved = self._checkpoint(session, "preemption", deadline=notice.deadline)
        else:
            self._emit("notice_too_short", seconds_left=round(left, 3), needed_s=round(self._checkpoint_s + self.config.deadline_margin_s, 3),
                       fallback=str(self._last_durable) if self._last_durable else "start")
        decision = self.policy(self.placement, True, session.step)
        move: Migrate | None = decision if isinstance(decision, Migrate) else None
        if move is None and self.placement.offer is not None:  # nowhere better: re-acquire the same kind of place
            move = Migrate(self.placement.offer, f"re-acquire after preemption ({getattr(decision, 'reason', '')})", 0.0)
        return self._migrate(session, move, forced=True, checkpoint=saved or self._last_durable)

    def _migrate(self, session: Session, decision: Migrate | None, forced: bool, checkpoint: Path | None) -> Session:
        self.state = JobState.MIGRATING
        self._accrue()
        old = self.placement
        wanted = replace(old, offer=decision.target, devices=decision.target.gpu_count) if decision and decision.target else old
        self._emit("migration_decision", forced=forced, reason=decision.reason if decision else "restart in place",
                   source=old.label(), target=wanted.label(), expected_saving_usd=decision.expected_saving_usd if decision else 0.0)
        step_before = session.step
        session.close()
        if checkpoint is not None and self.config.checkpoint_store is not None:
            checkpoint = self._transfer(checkpoint)
        t0 = self.clock()
        got = self.launcher(wanted)
        self._emit("target_up", placement=got.label(), requested_devices=wanted.devices, devices=got.devices,
                   seconds=round(self.clock() - t0, 4))
        self.placement = got
        self.placements.append(got.label())
        new = self.session_factory(got, checkpoint)
        lost = step_before - new.step
        for s in [s for s in self.losses if s >= new.step]:
            del self.losses[s]
        self.migrations += 1
        if self.metrics is not None:
            self.metrics.record_move()
        self._emit("resumed", step=new.step, lost_steps=lost, plan=new.plan.describe(), checkpoint=str(checkpoint) if checkpoint else None)
        return new

    def _transfer(self, checkpoint: Path) -> Path:
        from actors.checkpoint_transfer import copy_checkpoint

        assert self.config.checkpoint_store is not None
        dest = Path(self.config.checkpoint_store) / checkpoint.name
        t0 = self.clock()
        copy_checkpoint(checkpoint, dest)
        self._emit("checkpoint_transferred", source=str(checkpoint), dest=str(dest), seconds=round(self.clock() - t0, 4))
        return dest

    # ----- helpers -----
    def _migration_due(self, session: Session) -> bool:
        """Every ``migration_check_every`` steps, once per step (a KeepOffer must not be re-asked)."""
        every = self.config.migration_check_every
        if not every or session.step == 0 or session.step % every or self._last_check == session.step:
            return False
        self._last_check = session.step
        return True

    def _resume_point(self) -> Path | None:
        found = ckpt.find_latest(self.config.checkpoint_dir) if self.config.checkpoint_dir.exists() else None
        for skip in found.skipped if found is not None else ():
            self._emit("checkpoint_skipped", path=skip.location, reason=skip.reason)
        self._last_durable = Path(found.location) if found is not None and found.location is not None else None
        return self._last_durable

    def _record_step(self, session: Session, seconds: float) -> None:
        if self.metrics is None or seconds <= 0:
            return
        samples = float(getattr(session, "samples_per_step", 0.0))
        bubble = float(getattr(session, "bubble_fraction", 0.0))
        self.metrics.record_iteration(samples / seconds, bubble, self.placement.usd_per_hour)

    def _accrue(self) -> None:
        now = self.clock()
        self._cost += self.placement.usd_per_hour * (now - self._since) / 3600.0
        self._since = now

    def _emit(self, event: str, **fields: Any) -> None:
        self.events.emit(event, state=self.state.value, cost_usd=round(self._cost, 6), **fields)
