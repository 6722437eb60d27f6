"""One job's view of its run: the run record it keeps and the event segment it writes.

:class:`RunState` is the one owner of this job's run record (:mod:`orchestrator.elastic.run_record`) and of
its event segment under ``STORAGE/events/``; the job loop tells it what happened (started, a step done,
a checkpoint committed, a migration requested, finished) and it decides when to write. Opening it is where
a location of another model is refused and where the resume point is found — before any worker
starts and before anything is written.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from actors import checkpoint as ckpt
from actors import storage
from orchestrator.core.errors import UserError
from orchestrator.core.profile import Profile
from orchestrator.elastic import run_record as rr
from orchestrator.elastic.observability import EventLog, redact

EVENTS = "events"
PROGRESS_EVERY_S = 1.0


class SegmentLog:
    """This job's events as one object (or file) under ``STORAGE/events/``, named so that segments
    sort by start time. A local location is appended to line by line (fsynced); an object store
    cannot append, so the segment is re-uploaded whole, at most once a second and on ``flush``."""

    def __init__(self, storage_root: str, name: str) -> None:
        self.where = storage.join(storage_root, EVENTS, name)
        self.local = storage.is_local(storage_root)
        if self.local:
            Path(storage.local_path(self.where)).parent.mkdir(parents=True, exist_ok=True)
        self._lines: list[str] = []
        self._uploaded = 0.0
        self._dirty = False
        self._lock = threading.Lock()

    def append(self, record: dict[str, Any], force: bool = False) -> None:
        line = json.dumps(record, default=str)
        with self._lock:
            if self.local:
                try:
                    with open(storage.local_path(self.where), "a") as handle:
                        handle.write(line + "\n")
                        handle.flush()
                        os.fsync(handle.fileno())
                except OSError:
                    pass  # a full disk: events are hints, the job ends on the checkpoint that cannot be written
                return
            self._lines.append(line)
            self._dirty = True
        if force or time.monotonic() - self._uploaded >= PROGRESS_EVERY_S:
            try:
                self.flush()
            except storage.StorageError:
                pass  # an outage: the lines stay, the next flush uploads them (the local copy has them already)

    def flush(self) -> None:
        with self._lock:
            if self.local or not self._dirty:
                return
            data = ("\n".join(self._lines) + "\n").encode()
            self._dirty = False
            self._uploaded = time.monotonic()
        try:
            storage.write_bytes(self.where, data)
        except storage.StorageError:
            with self._lock:
                self._dirty = True
            raise


@dataclass(frozen=True)
class Opened:
    """What opening the run found: the record to continue (or a new one) and where to resume from."""

    record: rr.RunRecord
    resume_from: str | None  # the newest committed checkpoint to restore, None: start from the seed
    resume_step: int | None
    skipped: tuple[ckpt.Skipped, ...]
    rebuilt: str | None = None  # why the run record was made again from the newest checkpoint (the job says so)
    data_changed: bool = False  # resume="force" accepted other data (the job records it)


def open_run(root: str, profile: Profile, num_microbatches: int, seed: int, optimizer: str, resume: str,
             run_id: str | None, cluster: str | None, data: str | None = None) -> Opened:
    """Read the location's record and checkpoints and decide: continue, start fresh, or refuse.

    Refusals are one line and happen before anything is written: a location of another model or
    run; ``resume="require"`` with nothing committed; ``resume="never"`` on a location that already
    holds this run's checkpoints (training from the seed there would overwrite them)."""
    model = rr.model_fingerprint(profile)
    config = rr.config_fingerprint(num_microbatches, seed, optimizer)
    latest = ckpt.find_latest(root) if storage.exists(root) else ckpt.Found(None, None, ())
    rebuilt = None
    try:
        found = rr.read(root)
    except UserError as damaged:  # a torn or foreign run.json: the checkpoints are the truth, if there are any
        if latest.location is None:
            raise
        found, rebuilt = None, f"{damaged}; made again from the newest committed checkpoint (step {latest.step})"
    if found is not None:
        rr.check_same_run(found, model, run_id, root)
    # other data matters only once something trained on the old data is committed (a run that failed on its first
    # steps, fixed by its user, starts again from the seed with the fixed data)
    changed = found is not None and latest.location is not None and data is not None and found.data_fingerprint not in (None, data)
    if changed and resume != "force":
        raise UserError(f"{root} holds run {found.run_id!r} trained on other data (another data function, batch size or "  # type: ignore[union-attr]
                        "sample shape): use another storage location, or resume='force' (--resume force) to go on with this data")
    if latest.location is not None and found is None:  # checkpoints of an older raypipe: check their model at least
        manifest = ckpt.read_manifest(latest.location)
        if int(manifest.get("num_blocks", profile.num_blocks)) != profile.num_blocks:
            raise UserError(f"{root} holds checkpoints of another model ({manifest.get('num_blocks')} blocks, this job's "
                            f"model has {profile.num_blocks}); use another storage location")
    if resume == "require" and latest.location is None:
        why = f" (newest skipped: {latest.skipped[0].reason})" if latest.skipped else ""
        raise UserError(f"resume='require': no committed checkpoint under {root}{why}")
    if resume == "never" and latest.location is not None:
        raise UserError(f"resume='never': {root} already holds this run's checkpoints (newest: step {latest.step}); "
                        "use another storage location, or resume='auto'")
    if found is None and latest.location is not None:  # checkpoints without a record: the run they belong to goes on
        owner = str(ckpt.read_manifest(latest.location).get("run_id") or "")
        if run_id is not None and owner and owner != run_id:
            raise UserError(f"{root} holds checkpoints of run {owner!r}, not run {run_id!r}; use another storage location")
        rebuilt = rebuilt or (f"no run record; run {owner or 'with a new id'} continues from the newest committed checkpoint "
                              f"(step {latest.step})")
        record = rr.RunRecord(run_id or owner or rr.new_run_id(), model, config, last_committed=latest.step,
                              steps_done=latest.step or 0, cluster=cluster, data_fingerprint=data)
    elif found is None:
        record = rr.RunRecord(run_id or rr.new_run_id(), model, config, cluster=cluster, data_fingerprint=data)
    else:
        record = rr.updated(found, config_fingerprint=config, cluster=cluster, status="running", migration=None,
                            data_fingerprint=data or found.data_fingerprint)
    step = latest.step if latest.location is not None else None
    return Opened(record, latest.location, step, latest.skipped, rebuilt, changed)


class RunState:
    """The run record and event segment of one job (see the module docstring)."""

    def __init__(self, root: str, opened: Opened, local_events: Path | None) -> None:
        self.root = root
        self.record = opened.record
        self.config_changed = False
        now = time.time()  # names sort by start time; two jobs of one process in one second still get their own
        name = (f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}.{int(now * 1000) % 1000:03d}-"
                f"{self.record.cluster or 'local'}-{os.getpid()}-{uuid.uuid4().hex[:6]}.jsonl")
        self.segment = SegmentLog(root, name)
        self.local_events = EventLog(local_events) if local_events is not None else None
        self._progress_at = 0.0
        self._stop_seen = False
        self.fit_finished = False  # the last fit reached its target: the run is finished unless another fit follows

    @property
    def run_id(self) -> str:
        return self.record.run_id

    # ----- events -----
    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        important = event not in ("adapt", "checkpoint", "price_change", "migration_decision")
        if self.local_events is not None:
            record = self.local_events.emit(event, **fields)
        else:
            record = {"time": time.time(), "event": event, **redact(fields)}
        self.segment.append(record, force=important)
        return record

    def read_local(self) -> list[dict[str, Any]]:
        return self.local_events.read() if self.local_events is not None else []

    # ----- the record -----
    def _write(self, **changes: Any) -> None:
        self.record = rr.updated(self.record, **changes)
        rr.write(self.root, self.record)

    def started(self, step: int) -> None:
        self.fit_finished = False
        self._write(steps_done=step, status="running")

    def fit_done(self, step: int, live: rr.Live) -> None:
        """A ``fit`` reached its target: the record says so at once (steps, the last status fields) but stays
        ``running`` while the job lives, since another ``fit`` may follow; :meth:`ended` writes ``finished``."""
        self.fit_finished = True
        self._write(steps_done=step, live=live)
        self.segment.flush()

    def progress(self, step: int, live: Callable[[], rr.Live]) -> bool:
        """At most once a second: the record learns the step and what a watcher wants (the supervisor and
        ``orchestrator status`` follow the run by this), and the stop request is looked for. Returns whether
        a stop was requested (once seen, it stays seen)."""
        now = time.monotonic()
        if now - self._progress_at >= PROGRESS_EVERY_S:
            self._progress_at = now
            try:
                self._write(steps_done=step, live=live())
                self._stop_seen = self._stop_seen or rr.stop_requested(self.root)
            except storage.StorageError:
                pass  # a hint: training goes on through a storage outage, the next beat writes it
        return self._stop_seen

    def committed(self, step: int, steps_done: int) -> None:
        self._write(last_committed=step if self.record.last_committed is None else max(step, self.record.last_committed),
                    steps_done=steps_done)

    def ended(self, status: rr.Status, step: int, migration: rr.MigrationRequest | None = None,
              live: rr.Live | None = None) -> None:
        self.fit_finished = False
        self._write(status=status, steps_done=step, migration=migration, **({"live": live} if live is not None else {}))
        if status != "migrating":  # a stop asked for during a migration is the next job's to honour
            rr.clear_stop(self.root)
        self.segment.flush()


__all__ = ["Opened", "RunState", "SegmentLog", "open_run"]
