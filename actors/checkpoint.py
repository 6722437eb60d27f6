"""The checkpoint format, defined once: block files, a manifest, and a commit marker written last.

Why per block and not per stage: a stage is an artefact of one plan, while a block is a fixed
piece of the model. Keying weights *and* optimizer state by block (the runtime gives every block
its own optimizer) lets a checkpoint taken with 3 stages restore onto 2 stages, other boundaries
or other replica counts without any resharding logic.

Layout of ``<root>/step_<NNNNNNNN>/`` (``root`` is any location of :mod:`actors.storage`: a local
folder or an ``s3://``, ``gs://``, ``az://`` prefix)::

    block_00000.pt ... block_<L-1>.pt   a header line (run id, step, block index: the block's place),
                                        then torch.save({block, model, optimizer, shapes}); each
                                        stage worker writes its own blocks from its own node
    manifest.json                       step, plan, seed, sha256 + size of every block file
    COMMIT                              written last: step and the manifest's sha256 + size

Why a commit marker and not just "manifest last": the manifest itself must be covered by a
checksum, or an edited ``step``, an edited loss or a ``file`` entry pointing into another
checkpoint is loaded as if it were genuine. A reader (:func:`read_manifest`, :func:`verify`)
trusts a checkpoint only when the marker exists and matches the manifest byte for byte, every
manifest field has the right type, the step equals both the marker's and the folder's
(``step_N``), every file is a plain name inside the checkpoint, and every block checksum
matches. Each block's header must name the run, step and index its manifest entry names, so a
block of another step or run cannot stand in for the right one even with the manifest's checksum and
the marker re-written; every file must be a regular file (a symlink, a FIFO or a device inside a
checkpoint is refused before it is opened, so ``verify`` never blocks on one nor reads ``/dev/zero``
forever). Anything else is a :class:`CheckpointError` (a :class:`UserError`: one line), so
explicit restores, :func:`latest` and automatic recovery all refuse the same things. The format's names and the
manifest's validator live in :mod:`actors.manifest`.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, overload

import torch
from torch import Tensor, nn

from actors import storage
from actors.snapshot import BackgroundCopy, deferred_snapshot, host_copy, snapshot_block, tensor_bytes  # re-exported: one format module
from actors.manifest import (
    COMMIT, FORMAT, MANIFEST, MAX_HEADER_BYTES, MAX_MANIFEST_BYTES, SHA256_HEX, VERSION, CheckpointError, block_header,
    check_place, dir_step, is_int, split_header, validate_manifest,
)
from orchestrator.core.errors import UserError

log = logging.getLogger(__name__)

def block_file(block: int) -> str:
    return f"block_{block:05d}.pt"


@overload
def step_dir(root: Path, step: int) -> Path: ...
@overload
def step_dir(root: str, step: int) -> str: ...
@overload
def step_dir(root: str | Path, step: int) -> str | Path: ...
def step_dir(root: str | Path, step: int) -> str | Path:
    """``root/step_<NNNNNNNN>``; a Path for a Path, a string (local path or URI) for a string."""
    name = f"step_{step:08d}"
    return root / name if isinstance(root, Path) else storage.join(root, name)


# ----- writing -----
def place_step(directory: str | os.PathLike[str], step: int | None) -> int | None:
    """The step a block written into ``directory`` belongs to: ``step``, else the ``step_N`` folder's.

    None when neither says: such blocks can be written (a benchmark's scratch files) but never
    committed, since :func:`write_manifest` refuses entries not bound to the manifest's step."""
    return step if step is not None else dir_step(directory)


def write_payload(directory: str | os.PathLike[str], payload: Mapping[str, Any], step: int | None = None,
                  run_id: str = "", retry_s: float | None = None) -> dict[str, Any]:
    """Stream one block snapshot to storage, after its header (run id, step, block index); return
    its manifest entry (sha256 and size as written, and the same place). ``retry_s``: a job's write, done again
    through a storage outage for that long (:func:`actors.storage.retried`)."""
    block, step = int(payload["block"]), place_step(directory, step)
    name = block_file(block)
    location = storage.join(directory, name)

    def write() -> Any:
        with storage.open_write(location, need=tensor_bytes(payload)) as handle:
            handle.write(block_header(run_id, step, block))
            torch.save(dict(payload), handle)  # type: ignore[arg-type]  # a write-only binary file
        return handle

    handle = write() if retry_s is None else storage.retried(write, retry_s)
    return {"block": block, "file": name, "sha256": handle.sha.hexdigest(), "bytes": handle.size,
            "shapes": payload["shapes"], "step": step, "run_id": run_id}


def write_block(directory: str | os.PathLike[str], block: int, module: nn.Module,
                optimizer: torch.optim.Optimizer | None, step: int | None = None, run_id: str = "") -> dict[str, Any]:
    """Write one block's weights and optimizer state; return its manifest entry."""
    return write_payload(directory, snapshot_block(block, module, optimizer), step, run_id)


class BackgroundWrite(BackgroundCopy):
    """Block snapshots uploaded by a thread while training goes on (the asynchronous checkpoint).

    Why a snapshot first: the next optimizer step changes the weights in place, so the state is
    copied to host memory and only the copies are uploaded. The copy and its overlap with training are
    :class:`actors.snapshot.BackgroundCopy`'s (a :func:`deferred_snapshot` is taken by the thread, before any
    upload; the executor's next optimizer step waits for :attr:`snapshotted`); the upload follows on the same
    thread. :meth:`result` waits and returns the manifest entries (or raises what the upload raised); nothing is
    committed here, so a process that dies mid-upload leaves a folder without commit marker, which no reader
    trusts. The snapshots stay in :attr:`staged`, so the next checkpoint copies into warm host buffers
    (``deferred_snapshot(into=...)``) instead of faulting in fresh pages — the reuse torch.distributed.checkpoint's
    async stager offers as a cache; a recovery in place may roll back to them while the upload still runs.
    """

    def __init__(self, directory: str | os.PathLike[str],
                 payloads: Sequence[Mapping[str, Any] | Callable[[], Mapping[str, Any]]], step: int | None = None,
                 run_id: str = "", retry_s: float | None = None) -> None:
        self.directory, self.entries, self.retry_s = os.fspath(directory), [], retry_s
        self.step, self.run_id = place_step(directory, step), run_id
        super().__init__(payloads, self._upload, "checkpoint-upload")

    entries: list[dict[str, Any]]

    def _upload(self, taken: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        for payload in taken:
            self.entries.append(write_payload(self.directory, payload, self.step, self.run_id, self.retry_s))
        return list(self.entries)

    def result(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        try:
            return list(super().result(timeout_s))
        except TimeoutError:
            raise CheckpointError(f"checkpoint {self.directory}: upload still running after {timeout_s} s") from None


def write_manifest(
    directory: str | Path, step: int, num_blocks: int, entries: Sequence[Mapping[str, Any]], plan: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None, seed: int | None = None,
) -> str | Path:
    """Written by the driver once every block file is durable: the manifest, then the commit marker.

    Returns the checkpoint location. The manifest is validated by the same rules a reader applies,
    so a writer can never produce what a reader would refuse.
    """
    by_block = {int(e["block"]): dict(e) for e in entries}
    missing = sorted(set(range(num_blocks)) - set(by_block))
    if missing:
        raise CheckpointError(f"checkpoint {directory}: no actor wrote block(s) {missing}; not committing it")
    extra = dict(extra or {})
    runs = {str(e.get("run_id", "")) for e in by_block.values()}
    if len(runs) > 1:
        raise CheckpointError(f"checkpoint {directory}: blocks written by different runs {sorted(runs)}; not committing it")
    payload = {
        "format": FORMAT, "version": VERSION, "step": step, "num_blocks": num_blocks, "run_id": runs.pop() if runs else "",
        "seed": seed if seed is not None else extra.get("seed"),
        "plan": dict(plan), "files": [by_block[b] for b in range(num_blocks)], "extra": extra,
    }
    data = json.dumps(payload, indent=1, sort_keys=True).encode()
    validate_manifest(json.loads(data), str(directory), step)
    storage.write_bytes(storage.join(directory, MANIFEST), data)
    commit(directory, step, data)
    return directory


def commit(directory: str | os.PathLike[str], step: int, manifest: bytes) -> None:
    """The commit marker, written last: a checkpoint without it does not exist for any reader."""
    marker = {"format": FORMAT, "version": VERSION, "step": step,
              "manifest_sha256": hashlib.sha256(manifest).hexdigest(), "manifest_bytes": len(manifest)}
    storage.write_bytes(storage.join(directory, COMMIT), json.dumps(marker, sort_keys=True).encode())


# ----- reading -----
def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a committed checkpoint whose marker matches it, validated field by field."""
    return read_committed(directory)[2]


def read_committed(directory: str | os.PathLike[str]) -> tuple[bytes, bytes, dict[str, Any]]:
    """(commit marker bytes, manifest bytes, validated manifest): what a copy must reproduce exactly."""
    where = os.fspath(directory)
    marker_at, manifest_at = storage.join(where, COMMIT), storage.join(where, MANIFEST)
    if not storage.exists(marker_at):
        if not storage.exists(where):
            raise CheckpointError(f"checkpoint {where}: no such checkpoint")
        raise CheckpointError(f"checkpoint {where}: missing commit marker {COMMIT} (torn or never completed)")
    if not storage.exists(manifest_at):
        raise CheckpointError(f"checkpoint {where}: missing {MANIFEST}")
    storage.check_regular(marker_at)
    storage.check_regular(manifest_at)
    raw_marker = storage.read_bytes(marker_at, limit=1 << 16)
    marker = _json(marker_at, raw_marker)
    if (not isinstance(marker, dict) or marker.get("format") != FORMAT or not is_int(marker.get("step"))
            or not is_int(marker.get("manifest_bytes")) or not SHA256_HEX.fullmatch(str(marker.get("manifest_sha256")))):
        raise CheckpointError(f"checkpoint {where}: malformed commit marker {COMMIT}")
    data = storage.read_bytes(manifest_at, limit=MAX_MANIFEST_BYTES)
    if len(data) != marker["manifest_bytes"] or hashlib.sha256(data).hexdigest() != marker["manifest_sha256"]:
        raise CheckpointError(f"checkpoint {where}: {MANIFEST} does not match its commit marker (edited or torn)")
    manifest = _json(manifest_at, data)
    validate_manifest(manifest, where, int(marker["step"]))
    return raw_marker, data, dict(manifest)


def _json(location: str, data: bytes) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint file {location}: not valid JSON ({exc})") from None
    except RecursionError:
        raise CheckpointError(f"checkpoint file {location}: not valid JSON (nested too deeply)") from None


def verify(directory: str | os.PathLike[str], manifest: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Marker, manifest and every block file (size, sha256 and header, streamed); returns the manifest."""
    data = dict(manifest) if manifest is not None else read_manifest(directory)
    for entry in data["files"]:
        location = storage.join(directory, entry["file"])
        try:
            storage.check_regular(location)
            got, head = _digest(location, int(entry["bytes"]))
        except storage.StorageError as exc:
            raise CheckpointError(f"checkpoint file {location}: cannot read ({str(exc).rsplit(': ', 1)[-1]})") from None
        _check(location, got, entry)
        check_place(split_header(head, location)[0], entry, location)
    return data


def _digest(location: str, limit: int) -> tuple[tuple[str, int], bytes]:
    """(sha256 hex, size) streamed, stopping one chunk past ``limit`` bytes (an endless file is not
    read to its end), and the file's first bytes (its header)."""
    sha, size, head = hashlib.sha256(), 0, b""
    for chunk in storage.read_chunks(location):
        if len(head) < MAX_HEADER_BYTES:
            head += chunk[:MAX_HEADER_BYTES - len(head)]
        sha.update(chunk)
        size += len(chunk)
        if size > limit:
            break
    return (sha.hexdigest(), size), head


def _check(location: str, got: tuple[str, int], entry: Mapping[str, Any]) -> None:
    if got != (entry["sha256"], int(entry["bytes"])):
        raise CheckpointError(f"checkpoint file {location}: checksum mismatch (corrupted or partially written); refusing to load")


def check_model(manifest: Mapping[str, Any], num_blocks: int, directory: str | os.PathLike[str]) -> None:
    if int(manifest["num_blocks"]) != num_blocks:
        raise CheckpointError(
            f"checkpoint {os.fspath(directory)} holds {manifest['num_blocks']} blocks but the model has {num_blocks}: "
            "it was taken from a different model"
        )


def read_block(directory: str | os.PathLike[str], entry: Mapping[str, Any]) -> dict[str, Any]:
    """Load one block file after verifying its checksum against the manifest entry."""
    location = storage.join(directory, storage.check_relative(str(entry["file"])))
    try:
        storage.check_regular(location)
        data = storage.read_bytes(location, limit=int(entry["bytes"]))
    except storage.StorageError as exc:
        raise CheckpointError(f"checkpoint file {location}: cannot read ({str(exc).rsplit(': ', 1)[-1]})") from None
    _check(location, (hashlib.sha256(data).hexdigest(), len(data)), entry)
    header, start = split_header(data, location)
    check_place(header, entry, location)
    try:
        payload = torch.load(io.BytesIO(memoryview(data)[start:]), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a checksummed file torch cannot read: written by something else
        raise CheckpointError(f"checkpoint file {location}: not a readable block ({type(exc).__name__})") from None
    if not isinstance(payload, dict) or payload.get("block") != int(entry["block"]) or not isinstance(payload.get("model"), dict):
        raise CheckpointError(f"checkpoint file {location}: does not hold block {entry['block']}")
    return payload


def restore_block(
    payload: Mapping[str, Any], module: nn.Module, optimizer: torch.optim.Optimizer | None, path: str
) -> None:
    """Load weights and optimizer state, turning shape/key mismatches into one clear UserError."""
    try:
        module.load_state_dict(payload["model"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])
        raise CheckpointError(f"checkpoint file {path}: block {payload['block']} does not match the model ({detail})") from None
    state = payload.get("optimizer")
    if optimizer is not None and state is not None:
        try:
            optimizer.load_state_dict(state)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint file {path}: optimizer state of block {payload['block']} does not fit ({exc})") from None


# ----- finding the newest good one -----
@dataclass(frozen=True)
class Skipped:
    """A checkpoint :func:`find_latest` passed over, and why (for the caller's event log)."""

    location: str
    reason: str


@dataclass(frozen=True)
class Found:
    location: str | None
    step: int | None
    skipped: tuple[Skipped, ...]


def candidates(root: str | os.PathLike[str]) -> list[str]:
    """``step_N`` folders under ``root``, newest first."""
    named = [(dir_step(n), n) for n in storage.listdir(root)]
    return [storage.join(root, n) for s, n in sorted(((s, n) for s, n in named if s is not None), reverse=True)]


def find_latest(root: str | os.PathLike[str], check_files: bool = True) -> Found:
    """The newest checkpoint under ``root`` that passes every check, and every newer one skipped
    with its reason (each skip is also logged). Folders without a commit marker are still being
    written or were torn; they are skipped too."""
    skipped: list[Skipped] = []
    for location in candidates(root):
        try:
            if storage.is_local(location) and os.path.islink(storage.local_path(location)):
                raise CheckpointError(f"checkpoint {location}: is a symlink (to {os.readlink(storage.local_path(location))}); "
                                      "a run's checkpoints are folders of its own")
            manifest = verify(location) if check_files else read_manifest(location)
        except UserError as exc:  # one being written has no commit marker yet: not worth a warning (nor is a torn one)
            (log.info if f"missing commit marker {COMMIT}" in str(exc) else log.warning)("skipping checkpoint %s: %s", location, exc)
            skipped.append(Skipped(location, str(exc)))
            continue
        return Found(location, int(manifest["step"]), tuple(skipped))
    return Found(None, None, tuple(skipped))


@overload
def latest(root: Path, check_files: bool = True) -> Path | None: ...
@overload
def latest(root: str, check_files: bool = True) -> str | None: ...
@overload
def latest(root: str | Path, check_files: bool = True) -> str | Path | None: ...
def latest(root: str | Path, check_files: bool = True) -> str | Path | None:
    """Newest valid checkpoint under ``root`` (same type as ``root``), None when there is none."""
    found = find_latest(root, check_files)
    if found.location is None:
        return None
    return Path(found.location) if isinstance(root, Path) else found.location


def is_checkpoint(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is meant as one checkpoint (rather than a folder holding several)."""
    return dir_step(location) is not None or storage.exists(storage.join(location, MANIFEST)) \
        or storage.exists(storage.join(location, COMMIT))


def check(location: str | os.PathLike[str]) -> tuple[str, dict[str, Any], tuple[Skipped, ...]]:
    """What ``orchestrator checkpoint verify`` checks: one checkpoint, or the newest valid one under
    a location holding several. Returns (checkpoint, manifest, skipped); raises naming the reason."""
    where = os.fspath(location)
    if is_checkpoint(where):
        return where, verify(where), ()
    found = find_latest(where)
    if found.location is None:
        if found.skipped:
            last = found.skipped[0]
            raise CheckpointError(f"{where}: no valid checkpoint ({len(found.skipped)} damaged; newest: {last.reason})")
        raise CheckpointError(f"{where}: no checkpoint here")
    return found.location, read_manifest(found.location), found.skipped
