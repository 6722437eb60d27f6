"""Copy one checkpoint between any two storage locations (local ↔ s3:// ↔ gs:// ↔ az://).

A migration is only as cheap as the checkpoint copy is trustworthy: a half-copied checkpoint
restored on the new instance silently corrupts training. So a copy uses the checkpoint format
itself (:mod:`actors.checkpoint`) instead of a second manifest:

- the source must be committed: its marker matches its manifest and every file name in the
  manifest is a plain name inside the checkpoint (a hostile ``../../escaped.txt`` is refused
  before anything is written);
- every block file is streamed (chunks, multipart uploads through the filesystem's own
  machinery, never a whole object in memory) and hashed on the way; a mismatch with the
  manifest aborts that object's write before it appears;
- the commit marker is written last, byte for byte the source's, so the destination is a
  checkpoint only once everything under it is durable; the copy is then verified by reading it
  back;
- a local destination is assembled under a temporary sibling folder and renamed into place, so an
  interrupted download leaves nothing behind (parent folders it had to create are removed again);
  a remote destination has no rename, so its objects are written in place with the marker last,
  and a failed or interrupted copy removes exactly the objects it created, one by one — never a
  recursive delete of a prefix (s3fs's ``rm(prefix, recursive=True)`` also deletes the bucket);
- nothing that was there is replaced: a copy onto its own source is refused, a remote destination
  already holding any of the checkpoint's object names is refused (unless it is the same committed
  checkpoint, byte for byte: then there is nothing to do), and a local one is replaced only when it
  is an older copy of the same step (a committed checkpoint) or an empty folder.

This lives next to the format, not in ``cloud/``: the cloud module stands alone and imports nothing
of ``actors`` or ``orchestrator``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from dataclasses import dataclass

from actors import checkpoint as ckpt
from actors import storage
from orchestrator.core.errors import UserError


class TransferError(ckpt.CheckpointError):
    """A copy that was refused or did not verify."""


@dataclass(frozen=True)
class TransferReport:
    source: str
    dest: str
    step: int
    files: int
    bytes: int
    seconds: float


def copy_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, block_size: int | None = None,
                    chunk: int = storage.CHUNK, verify_after: bool = True) -> TransferReport:
    """Copy the committed checkpoint at ``src`` to ``dst`` (each a path or URI); returns what moved.

    ``block_size`` is the part size of multipart uploads (the filesystem's default otherwise);
    ``chunk`` the bytes read at a time.
    """
    source, dest = os.fspath(src), os.fspath(dst).rstrip("/") or os.fspath(dst)
    t0 = time.perf_counter()
    if _same_or_nested(source, dest):
        raise TransferError(f"{dest}: is {source} itself or inside it; copy a checkpoint to another location")
    marker, manifest_bytes, manifest = ckpt.read_committed(source)
    step = int(manifest["step"])
    named = ckpt.dir_step(dest)
    if named is not None and named != step:
        raise TransferError(f"{dest}: the folder says step {named} but {source} holds step {step}")
    _check_not_another_run(dest, manifest)
    if storage.is_local(dest):
        _copy_local(source, storage.local_path(dest), marker, manifest_bytes, manifest, block_size, chunk)
    elif not _already_there(dest, manifest, marker):
        _copy_remote(source, dest, marker, manifest_bytes, manifest, block_size, chunk)
    if verify_after:
        ckpt.verify(dest)
    total = sum(int(e["bytes"]) for e in manifest["files"]) + len(manifest_bytes) + len(marker)
    return TransferReport(source, dest, step, len(manifest["files"]) + 2, total, time.perf_counter() - t0)


def _check_not_another_run(dest: str, manifest: dict[str, object]) -> None:
    """A committed checkpoint of another run at ``dest`` is never replaced (the two runs' ids differ)."""
    try:
        _, _, there = ckpt.read_committed(dest)
    except (UserError, OSError):
        return  # nothing committed there (or not readable as a checkpoint): the copy replaces what is not one
    ours, theirs = str(manifest.get("run_id") or ""), str(there.get("run_id") or "")
    if ours and theirs and ours != theirs:
        raise TransferError(f"{dest}: holds committed step {there.get('step')} of run {theirs!r}, not run {ours!r}; "
                            "copy to another location")


def _write_all(source: str, target: str, marker: bytes, manifest_bytes: bytes, manifest: dict[str, object],
               block_size: int | None, chunk: int, created: list[str] | None = None) -> None:
    """Every block (checked against the manifest while streaming), the manifest, the marker last.
    ``created`` gets each destination object before it is written (an aborted upload never appears;
    removing one that does not exist is fine)."""
    made = created if created is not None else []
    files = manifest["files"]
    assert isinstance(files, list)
    for entry in files:
        name = storage.check_relative(str(entry["file"]))
        origin = storage.join(source, name)
        try:
            storage.check_regular(origin)
            made.append(storage.join(target, name))
            storage.copy(origin, made[-1], expect=(str(entry["sha256"]), int(entry["bytes"])), block_size=block_size,
                         chunk=chunk)
        except storage.StorageError as exc:
            raise TransferError(f"copying {source} to {target}: {exc}") from None
    for name, data in ((ckpt.MANIFEST, manifest_bytes), (ckpt.COMMIT, marker)):  # the marker last: now it is a checkpoint
        made.append(storage.join(target, name))
        storage.write_bytes(made[-1], data)


def _same_or_nested(source: str, dest: str) -> bool:
    """Whether ``dest`` is ``source`` or lies inside it (a copy would rewrite what it reads)."""
    if storage.is_local(source) != storage.is_local(dest):
        return False
    if storage.is_local(source):
        a, b = os.path.realpath(storage.local_path(source)), os.path.realpath(storage.local_path(dest))
        return b == a or b.startswith(a.rstrip(os.sep) + os.sep)
    a, b = source.rstrip("/"), dest.rstrip("/")
    return b == a or b.startswith(a + "/")


def _names(manifest: dict[str, object]) -> list[str]:
    files = manifest["files"]
    assert isinstance(files, list)
    return [storage.check_relative(str(e["file"])) for e in files] + [ckpt.MANIFEST, ckpt.COMMIT]


def _already_there(dest: str, manifest: dict[str, object], marker: bytes) -> bool:
    """True when ``dest`` already is this very checkpoint (same commit marker); refuse when it holds
    any object the copy would write (that object would be replaced); False when the names are free."""
    present = set(storage.listdir(dest))
    clash = [n for n in _names(manifest) if n in present]
    if not clash:
        return False
    if ckpt.COMMIT in present and storage.read_bytes(storage.join(dest, ckpt.COMMIT), limit=1 << 16) == marker:
        return True  # verified after (copy_checkpoint): a damaged earlier copy is reported, not patched
    raise TransferError(f"{dest}: already holds {clash[0]}" + (f" and {len(clash) - 1} more" if len(clash) > 1 else "")
                        + "; refusing to replace objects that are there (copy to a new location)")


def _created_dirs(path: str) -> list[str]:
    """The missing ancestors of ``path``, outermost first (to remove again if the copy fails)."""
    missing: list[str] = []
    here = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(here) and here != os.path.dirname(here):
        missing.append(here)
        here = os.path.dirname(here)
    return missing[::-1]


def _replaceable(dest: str, step: int) -> bool:
    """An existing local destination may be replaced only when it is an empty folder or a committed
    checkpoint of the same step (an older copy); anything else there is the user's."""
    if not os.listdir(dest):
        return True
    try:
        return int(ckpt.read_committed(dest)[2]["step"]) == step
    except ckpt.CheckpointError:
        return False


def _copy_local(source: str, dest: str, marker: bytes, manifest_bytes: bytes, manifest: dict[str, object],
                block_size: int | None, chunk: int) -> None:
    if os.path.lexists(dest) and (os.path.islink(dest) or not os.path.isdir(dest)):
        raise TransferError(f"{dest}: exists and is not a folder; refusing to replace it")
    if os.path.isdir(dest) and not _replaceable(dest, int(str(manifest["step"]))):
        raise TransferError(f"{dest}: a folder that is neither empty nor a checkpoint of step {manifest['step']}; "
                            "refusing to replace it")
    parent = os.path.dirname(os.path.abspath(dest))
    made = _created_dirs(dest)
    with storage.errors(parent, "create the folder"):
        os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{os.path.basename(dest)}.partial-{uuid.uuid4().hex[:8]}")
    trash = None
    try:
        os.mkdir(staging)
        _write_all(source, staging, marker, manifest_bytes, manifest, block_size, chunk)
        if os.path.isdir(dest):  # an older copy of the same step: swap it out, then drop it
            trash = os.path.join(parent, f".{os.path.basename(dest)}.old-{uuid.uuid4().hex[:8]}")
            os.rename(dest, trash)
        os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if trash is not None and not os.path.exists(dest):
            os.rename(trash, dest)
            trash = None
        for folder in reversed(made):  # innermost first; only folders this copy created, and only if empty
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise
    finally:
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
    storage.fsync_dir(parent)


def _copy_remote(source: str, dest: str, marker: bytes, manifest_bytes: bytes, manifest: dict[str, object],
                 block_size: int | None, chunk: int) -> None:
    created: list[str] = []
    try:
        _write_all(source, dest, marker, manifest_bytes, manifest, block_size, chunk, created)
    except BaseException:
        for location in reversed(created):  # the marker first, if it got written: then nothing reads as a checkpoint
            with contextlib.suppress(storage.StorageError):
                storage.remove_file(location)
        raise
