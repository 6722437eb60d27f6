"""A run is its storage location: the run record (``run.json``) beside the checkpoints.

Why: a job is one process on one cluster, a *run* outlives it — a second job on the same storage
(a resumed driver, a relaunch after a lost head node, a migration to another cluster) continues the
same training. The record says which run the location holds (an id, a fingerprint of the model's
blocks and of the training configuration), how far it got and what it is doing, so that

- a job on a location of *another* model refuses with one line before touching anything;
- a job of the same run resumes from the newest committed checkpoint into whatever plan it has;
- the supervisor outside the cluster (:mod:`orchestrator.supervise`) follows progress and sees a
  migration request or a clean stop without talking to the job.

The record is written by the job only (atomically: a local temporary file renamed, or one object
put), at start, at every committed checkpoint, at most once a second with progress, and at the end.
The newest committed checkpoint is the source of truth for *what can be restored*; the record's
``last_committed`` is a hint for readers that cannot afford to verify checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from actors import storage
from orchestrator.core.errors import UserError
from orchestrator.core.profile import Profile

RECORD = "run.json"
STOP = "stop.json"
"""``orchestrator stop`` writes this beside the record; the job honours it between steps and removes it."""
FORMAT = "raypipe-run"
VERSION = 1
Status = Literal["running", "finished", "migrating", "stopped", "failed"]
Resume = Literal["auto", "never", "require", "force"]
RESUME_MODES: tuple[str, ...] = ("auto", "never", "require", "force")


@dataclass(frozen=True)
class MigrationRequest:
    """The job asked its supervisor to move the run (it committed ``step`` and stopped)."""

    reason: str
    step: int
    target: str  # the offer's label (cloud.records.Offer.label())


@dataclass(frozen=True)
class StageStatus:
    """One stage of the plan in force, as a watcher reads it."""

    blocks: tuple[int, int]
    devices: tuple[int, ...]
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Live:
    """What a watcher of a running job wants (``orchestrator status``), written with the progress at most once
    a second. Numbers only, and the plan: never a secret (nothing the user configured is copied here)."""

    target: int
    loss: float | None = None
    eval_loss: float | None = None
    samples_per_s: float | None = None
    eta_s: float | None = None
    plan: tuple[StageStatus, ...] = ()
    recoveries: int = 0
    moves: int = 0
    usd_per_hour: float | None = None
    usd_total: float = 0.0
    """The run's dollars so far: every earlier job's ``usd_job`` plus this one's."""
    usd_job: float = 0.0
    usd_lost: float = 0.0
    """Of the dollars, those of recoveries: their stalls and the steps computed again."""
    samples: int = 0
    """Samples trained so far (steps done x the batch's rows)."""

    @property
    def usd_per_million_samples(self) -> float | None:
        return round(self.usd_total / self.samples * 1e6, 6) if self.samples and self.usd_total else None

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> "Live":
        known = {k: v for k, v in body.items() if k in cls.__dataclass_fields__ and k != "plan"}
        plan = tuple(StageStatus((int(s["blocks"][0]), int(s["blocks"][1])), tuple(int(d) for d in s["devices"]),
                                 tuple(str(n) for n in s["nodes"])) for s in body.get("plan") or ())
        return cls(**known, plan=plan)


@dataclass(frozen=True)
class RunRecord:
    """See the module docstring; one value per write, never changed in place."""

    run_id: str
    model_fingerprint: str
    config_fingerprint: str
    steps_done: int = 0
    last_committed: int | None = None
    status: Status = "running"
    cluster: str | None = None
    migration: MigrationRequest | None = None
    updated_at: float = field(default_factory=time.time)
    live: Live | None = None
    data_fingerprint: str | None = None
    """The data the run trains on (the data function's identity, rows, sample shape): a change is refused."""

    def to_json(self) -> bytes:
        body = {"format": FORMAT, "version": VERSION, **asdict(self)}
        return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "RunRecord":
        try:
            body = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise UserError(f"{where}: the run record is not valid JSON ({exc})") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise UserError(f"{where}: not a raypipe run record")
        if body.get("version") != VERSION:
            raise UserError(f"{where}: run record version {body.get('version')!r} is not supported (this raypipe reads {VERSION})")
        try:
            mig = body.get("migration")
            return cls(run_id=str(body["run_id"]), model_fingerprint=str(body["model_fingerprint"]),
                       config_fingerprint=str(body["config_fingerprint"]), steps_done=int(body["steps_done"]),
                       last_committed=None if body.get("last_committed") is None else int(body["last_committed"]),
                       status=body.get("status", "running"), cluster=body.get("cluster"),
                       migration=MigrationRequest(str(mig["reason"]), int(mig["step"]), str(mig["target"])) if mig else None,
                       updated_at=float(body.get("updated_at", 0.0)),
                       live=Live.from_dict(body["live"]) if isinstance(body.get("live"), dict) else None,
                       data_fingerprint=None if body.get("data_fingerprint") is None else str(body["data_fingerprint"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{where}: the run record is malformed ({type(exc).__name__}: {exc})") from None


def model_fingerprint(profile: Profile) -> str:
    """The model as the checkpoints see it: each block's name and parameter bytes, in order.

    Two models with these equal have checkpoints that restore into each other block by block; a
    different depth, width or block kind changes it (the profile is measured, so it is cheap)."""
    shape = [(b.name, int(b.param_bytes)) for b in profile.blocks]
    return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:16]


def config_fingerprint(num_microbatches: int, seed: int, optimizer: str) -> str:
    """What changes the arithmetic of training besides the model (a change is allowed, recorded)."""
    return hashlib.sha256(json.dumps([num_microbatches, seed, optimizer]).encode()).hexdigest()[:16]


def data_fingerprint(identity: str, rows: int, sample_shape: tuple[int, ...], dtype: str) -> str:
    """The data a run trains on: the data function's identity (its arguments: a file's path, ``--rows``), the rows
    of a batch and one sample's shape and type. Two jobs of one run must read the same batches."""
    return hashlib.sha256(json.dumps([identity, rows, list(sample_shape), dtype]).encode()).hexdigest()[:16]


def location(storage_root: str) -> str:
    return storage.join(storage_root, RECORD)


def read(storage_root: str) -> RunRecord | None:
    """The record under ``storage_root`` (``None``: none yet)."""
    where = location(storage_root)
    if not storage.exists(where):
        return None
    return RunRecord.from_json(storage.read_bytes(where, limit=1 << 20), where)


def write(storage_root: str, record: RunRecord) -> None:
    storage.write_bytes(location(storage_root), record.to_json())


def request_stop(storage_root: str, by: str) -> None:
    """Ask the job running on ``storage_root`` to stop (who may do so is whoever may write the storage)."""
    storage.write_bytes(storage.join(storage_root, STOP), json.dumps({"requested_at": time.time(), "by": by}).encode())


def stop_requested(storage_root: str) -> bool:
    return storage.exists(storage.join(storage_root, STOP))


def clear_stop(storage_root: str) -> None:
    where = storage.join(storage_root, STOP)
    if storage.exists(where):
        storage.remove_file(where)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def check_same_run(found: RunRecord, model: str, run_id: str | None, where: str) -> None:
    """One line, before anything is written, when ``where`` holds another run."""
    if found.model_fingerprint != model:
        raise UserError(f"{where} holds checkpoints of another model (fingerprint {found.model_fingerprint}, this job's "
                        f"model is {model}: a different depth, width or block kind); use another storage location")
    if run_id is not None and found.run_id != run_id:
        raise UserError(f"{where} holds run {found.run_id!r}, not run {run_id!r}; use another storage location")


def updated(record: RunRecord, **changes: Any) -> RunRecord:
    return replace(record, updated_at=time.time(), **changes)


__all__ = ["Live", "MigrationRequest", "RunRecord", "StageStatus", "clear_stop", "request_stop", "stop_requested", "RESUME_MODES", "check_same_run", "config_fingerprint", "model_fingerprint",
           "new_run_id", "read", "updated", "write"]
