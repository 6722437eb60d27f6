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
  interrupted download leaves nothing behind; a remote destination has no rename, so its objects
  are written in place with the marker last and removed again if the copy fails.

This lives next to the format, not in ``cloud/``: the cloud module stands alone and imports nothing
of ``actors`` or ``orchestrator``.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass

from actors import checkpoint as ckpt
from actors import storage


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
    marker, manifest_bytes, manifest = ckpt.read_committed(source)
    step = int(manifest["step"])
    named = ckpt.dir_step(dest)
    if named is not None and named != step:
        raise TransferError(f"{dest}: the folder says step {named} but {source} holds step {step}")
    if storage.is_local(dest):
        _copy_local(source, storage.local_path(dest), marker, manifest_bytes, manifest, block_size, chunk)
    else:
        _copy_remote(source, dest, marker, manifest_bytes, manifest, block_size, chunk)
    if verify_after:
        ckpt.verify(dest)
    total = sum(int(e["bytes"]) for e in manifest["files"]) + len(manifest_bytes) + len(marker)
    return TransferReport(source, dest, step, len(manifest["files"]) + 2, total, time.perf_counter() - t0)


def _write_all(source: str, target: str, marker: bytes, manifest_bytes: bytes, manifest: dict[str, object],
               block_size: int | None, chunk: int) -> None:
    files = manifest["files"]
    assert isinstance(files, list)
    for entry in files:
        name = storage.check_relative(str(entry["file"]))
        try:
            storage.copy(storage.join(source, name), storage.join(target, name),
                         expect=(str(entry["sha256"]), int(entry["bytes"])), block_size=block_size, chunk=chunk)
        except storage.StorageError as exc:
            raise TransferError(f"copying {source} to {target}: {exc}") from None
    storage.write_bytes(storage.join(target, ckpt.MANIFEST), manifest_bytes)
    storage.write_bytes(storage.join(target, ckpt.COMMIT), marker)  # last: now it is a checkpoint


def _copy_local(source: str, dest: str, marker: bytes, manifest_bytes: bytes, manifest: dict[str, object],
                block_size: int | None, chunk: int) -> None:
    if os.path.lexists(dest) and (os.path.islink(dest) or not os.path.isdir(dest)):
        raise TransferError(f"{dest}: exists and is not a folder; refusing to replace it")
    parent = os.path.dirname(os.path.abspath(dest))
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
        raise
    finally:
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
    storage.fsync_dir(parent)


def _copy_remote(source: str, dest: str, marker: bytes, manifest_bytes: bytes, manifest: dict[str, object],
                 block_size: int | None, chunk: int) -> None:
    # An older checkpoint there stops being one before any of its objects change.
    storage.remove(storage.join(dest, ckpt.COMMIT))
    try:
        _write_all(source, dest, marker, manifest_bytes, manifest, block_size, chunk)
    except BaseException:
        try:
            storage.remove(dest)
        except storage.StorageError:
            pass  # without its marker nothing left there is ever read as a checkpoint
        raise
