"""What the supervisor reads and writes in the run's storage.

- ``STORAGE/run.json``, the run record (:class:`~orchestrator.elastic.run_record.RunRecord`, the job's own type):
  written by the job, read here, never written here.
- ``STORAGE/supervisor.json``, the supervisor's own state (:class:`SupervisorState`): the cluster
  it runs the job on and how to reach and stop it, offers that failed and when, recoveries spent,
  and which supervisor process owns the run (so a second copy refuses, and a restarted one adopts).
- ``STORAGE/events/*.jsonl``, the run's event log: one segment per job and the supervisor's own
  (:class:`EventSegment`); :func:`merged_events` reads them as one log ordered by time.

Reads go around fsspec's listing cache: the job writes these objects from another process.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from actors import storage
from orchestrator.core.errors import UserError
from orchestrator.elastic import run_record as rr
from orchestrator.elastic.lease import gone
from orchestrator.supervise.provision import ClusterHandle

STATE = "supervisor.json"
EVENTS = "events"
RETRY_S = 180.0
"""How long the supervisor's state is written again through a storage outage (as a job's checkpoint)."""
OWNER_STALE_S = 30.0
"""A supervisor that has not written its heartbeat for this long is gone (its run may be adopted)."""


def _fresh(location: str) -> None:
    fs, _ = storage.filesystem(location)
    fs.invalidate_cache()


def read_json(location: str) -> dict[str, Any] | None:
    """The JSON object at ``location``, None when there is none (or it is being replaced)."""
    _fresh(location)
    if not storage.exists(location):
        return None
    try:
        data = json.loads(storage.read_bytes(location, limit=1 << 20))
    except (ValueError, storage.StorageError):
        return None
    return data if isinstance(data, dict) else None


_TOLD: set[str] = set()


def read_record(root: str) -> rr.RunRecord | None:
    """The job's run record (``STORAGE/run.json``), as the job's own type reads it; None when there is none, or it
    is being replaced or unreadable now (read again at the next poll). A record this supervisor cannot read (another
    raypipe's version, say) is said once on stderr, not taken silently for a run that never started."""
    _fresh(rr.location(root))
    try:
        return rr.read(root)
    except storage.StorageError:
        return None
    except UserError as exc:
        if str(exc) not in _TOLD:
            _TOLD.add(str(exc))
            print(f"[supervisor] {exc}", file=sys.stderr, flush=True)
        return None


def newest_committed(root: str, last_committed: int | None) -> int | None:
    """The newest committed checkpoint's step: the record's ``last_committed``, checked against the
    commit markers actually in storage (a checkpoint committed after the record's last write counts)."""
    from actors.checkpoint import find_latest

    steps = [last_committed] if last_committed is not None else []
    for where in (root, storage.join(root, "checkpoints")):
        _fresh(where)
        found = find_latest(where, check_files=False)
        if found.step is not None:
            steps.append(found.step)
    return max(steps) if steps else None


@dataclass(frozen=True)
class SupervisorState:
    """The supervisor's state in ``STORAGE/supervisor.json`` (one owner: :class:`Supervisor`)."""

    run_id: str
    host: str = ""
    pid: int = 0
    heartbeat: float = 0.0
    cluster: ClusterHandle | None = None
    """The cluster the job runs on now."""
    job_id: str | None = None
    owned: tuple[ClusterHandle, ...] = ()
    """Every cluster provisioned and not yet torn down (source and target during a migration): a restarted supervisor
    tears down those it no longer needs."""
    failed_offers: dict[str, float] = field(default_factory=dict)
    """Offer label -> time it failed (provisioning, or its cluster lost); skipped for a while."""
    recoveries: int = 0
    clusters_made: int = 0
    price_migrated: bool = False
    killed: bool = False
    finished: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["cluster"] = self.cluster.to_json() if self.cluster else None
        data["owned"] = [h.to_json() for h in self.owned]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "SupervisorState":
        cluster = data.get("cluster")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, "cluster": ClusterHandle.from_json(cluster) if cluster else None,
                      "owned": tuple(ClusterHandle.from_json(h) for h in data.get("owned") or ()),
                      "failed_offers": {str(k): float(v) for k, v in (data.get("failed_offers") or {}).items()}})

    def owned_by_other(self, now: float) -> bool:
        """Whether another live supervisor holds this run (same host: its pid runs; elsewhere: a recent heartbeat)."""
        if not self.pid or self.finished or (self.host, self.pid) == (socket.gethostname(), os.getpid()):
            return False
        if gone(self.host, self.pid):
            return False
        return now - self.heartbeat < OWNER_STALE_S

    def blocked(self, label: str, now: float, block_s: float) -> bool:
        at = self.failed_offers.get(label)
        return at is not None and now - at < block_s


class StateStore:
    """Reads and writes ``STORAGE/supervisor.json``."""

    def __init__(self, root: str) -> None:
        self.location = storage.join(root, STATE)

    def load(self) -> SupervisorState | None:
        data = read_json(self.location)
        try:
            return SupervisorState.from_json(data) if data else None
        except (TypeError, ValueError) as exc:
            raise UserError(f"{self.location}: not a supervisor state ({exc})") from None

    def save(self, state: SupervisorState, retry_s: float = RETRY_S) -> SupervisorState:
        """Written again with backoff through a storage outage for up to ``retry_s`` (what it owns must be on record
        before it acts), then :class:`~actors.storage.StorageFailed`."""
        state = replace(state, heartbeat=time.time())
        data = json.dumps(state.to_json(), indent=1).encode()
        storage.retried(lambda: storage.write_bytes(self.location, data), retry_s)
        return state


def stamp(t: float | None = None) -> str:
    """A wall-clock time as ISO-8601 UTC with microseconds (sorts as text)."""
    return datetime.fromtimestamp(time.time() if t is None else t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventSegment:
    """The supervisor's own segment ``STORAGE/events/supervisor-<time>.jsonl``, rewritten whole on
    each event (object stores have no append; a segment holds tens of lines)."""

    def __init__(self, root: str, echo: bool = True) -> None:
        self.location = storage.join(root, EVENTS, f"supervisor-{stamp().replace(':', '')}.jsonl")
        self.lines: list[str] = []
        self.echo = echo

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """One event, ``time`` in epoch seconds as the job's segments have it, credentials redacted."""
        from orchestrator.elastic.observability import redact

        record = {"event": event, "time": time.time(), **redact(fields)}
        self.lines.append(json.dumps(record, default=str))
        try:
            storage.write_bytes(self.location, ("\n".join(self.lines) + "\n").encode())
        except storage.StorageError:
            pass  # a storage outage: the segment is rewritten whole with this line at the next event
        if self.echo:
            detail = " ".join(f"{k}={v}" for k, v in fields.items())
            print(f"[supervisor] {event} {detail}", flush=True)
        return record


def _time_key(value: Any) -> float:
    """Events carry ``time`` as ISO text or epoch seconds; both order on one axis."""
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return float("inf")


def merged_events(root: str) -> list[dict[str, Any]]:
    """Every segment of the run as one log, ordered by time (ties: segment order, then line order)."""
    folder = storage.join(root, EVENTS)
    _fresh(folder)
    rows: list[tuple[float, int, int, dict[str, Any]]] = []
    for s, name in enumerate(n for n in storage.listdir(folder) if n.endswith(".jsonl")):
        text = storage.read_bytes(storage.join(folder, name)).decode(errors="replace")
        for i, line in enumerate(text.splitlines()):
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a segment being written: its last line may be cut
            if isinstance(event, dict) and "event" in event:
                rows.append((_time_key(event.get("time")), s, i, event))
    rows.sort(key=lambda r: r[:3])
    return [r[3] for r in rows]
