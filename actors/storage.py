"""The one storage layer: local paths and s3://, gs://, az:// URIs behind the same few functions.

Why one layer: checkpoints are written by every stage worker from its own node, read back under
any plan, verified from the command line and copied between clouds for a migration. If each of
those spoke to S3, GCS and Azure Blob in its own way there would be four sets of bugs (the old
hand-written transfer read whole objects into memory and capped S3 at one ``put_object``). Here
everything goes through fsspec (s3fs, gcsfs, adlfs), whose file objects already do multipart /
resumable / block uploads and ranged reads, so reads and copies are streamed in chunks.

Credentials and endpoints come from each cloud's usual environment variables, read when a
filesystem is made (so tests can point them at local servers; see :mod:`actors.storage_env`):

- S3: the botocore chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, instance
  roles) and ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` for S3-compatible servers;
- GCS: ``GOOGLE_APPLICATION_CREDENTIALS`` or the metadata server; ``STORAGE_EMULATOR_HOST``;
- Azure Blob: ``AZURE_STORAGE_CONNECTION_STRING`` (Azurite), or ``AZURE_STORAGE_ACCOUNT_NAME`` with
  ``AZURE_STORAGE_ACCOUNT_KEY`` / ``AZURE_STORAGE_SAS_TOKEN`` / Azure AD credentials.

Local writes are atomic (temporary name in the same directory, fsync, rename, fsync of the
directory) and never replace anything that is not a regular file: a symlink, a device or a
directory at the target is refused. Remote writes become visible only when the upload is
completed; an error aborts it (multipart uploads are discarded), so a reader never sees half an
object. Every failure is a :class:`StorageError`: one line naming the location and the reason,
never a secret.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import posixpath
import socket
import stat
import time
import urllib.parse
import uuid
from typing import IO, Any, Callable, Iterator, TypeVar

import fsspec
from fsspec.spec import AbstractFileSystem

from actors.storage_env import (FULL, PROTOCOLS, SUPPORTED, StorageError, StorageFailed, StorageFull, StorageUnreachable,
                                classify, credentials_hint, first_line, full, options, scheme, unreachable)
from orchestrator.core.errors import UserError

T = TypeVar("T")
CHUNK = 1 << 20
"""Bytes per read/write when streaming; never a whole object."""


def is_local(location: str | os.PathLike[str]) -> bool:
    return scheme(location) in ("", "file")


def local_path(location: str | os.PathLike[str]) -> str:
    """The filesystem path of a local location (``file:///x`` -> ``/x``)."""
    text = os.fspath(location)
    return text[len("file://"):] if scheme(text) == "file" else text


def join(location: str | os.PathLike[str], *names: str) -> str:
    """``location/name/...`` with each name checked to be a plain relative path (no ``..``)."""
    text = os.fspath(location)
    for name in names:
        check_relative(name)
    if scheme(text) in ("", "file"):
        return os.path.join(text, *names)
    return "/".join([text.rstrip("/"), *names])


def basename(location: str | os.PathLike[str]) -> str:
    text = os.fspath(location).rstrip("/")
    return posixpath.basename(text) if not is_local(text) else os.path.basename(local_path(text))


def parent(location: str | os.PathLike[str]) -> str:
    text = os.fspath(location).rstrip("/")
    if is_local(text):
        return os.path.dirname(text) or "."
    return text.rsplit("/", 1)[0] if text.count("/") > 2 else text


def check_relative(name: str) -> str:
    """Refuse anything but a relative path of plain components (no ``..``, no absolute, no ``\\``)."""
    parts = name.split("/")
    if (not isinstance(name, str) or not name or "\\" in name or "\x00" in name or name.startswith("/")
            or any(p in ("", ".", "..") for p in parts) or ":" in parts[0]):
        raise StorageError(f"{name!r} is not a plain relative name (it could point outside its folder)")
    return name


def filesystem(location: str | os.PathLike[str]) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem for a location and the path inside it."""
    text = os.fspath(location)
    sch = scheme(text)
    if sch == "":
        return fsspec.filesystem("file"), text
    protocol = PROTOCOLS.get(sch)
    if protocol is None:
        raise StorageError(f"{text}: unsupported storage scheme {sch!r} (use {SUPPORTED})")
    if protocol == "file":
        return fsspec.filesystem("file"), local_path(text)
    kwargs = options(protocol, text)
    if protocol == "gcs":
        _reachable(str(kwargs.get("endpoint_url") or "https://storage.googleapis.com"), text)
    try:
        if protocol == "gcs" and os.environ.get("STORAGE_EMULATOR_HOST"):
            # The plain JSON-API filesystem: emulators do not serve the gRPC control plane that
            # gcsfs's default (extended) class asks first, and each such call waits 60 s.
            from gcsfs.core import GCSFileSystem

            fs = GCSFileSystem(**kwargs)
        else:
            fs = fsspec.filesystem(protocol, **kwargs)
    except ImportError as exc:
        raise StorageError(f"{text}: the {protocol} filesystem is not installed ({exc})") from None
    except (ValueError, TypeError) as exc:
        raise StorageError(f"{text}: {credentials_hint(protocol)} ({first_line(exc)})") from None
    return fs, fs._strip_protocol(text)


PROBE_TIMEOUT_S = 5.0
_REACHED: set[str] = set()
"""Endpoints a TCP connection was made to in this process (only successes are remembered)."""


def _reachable(endpoint: str, text: str) -> None:
    """Refuse an endpoint no TCP connection can be made to, in at most :data:`PROBE_TIMEOUT_S`.

    Why here: gcsfs retries every request six times with exponential backoff (a constant of the
    library), so an unreachable endpoint took 44 s and printed a 49-line traceback through its
    logger before the one line. A connection that works is remembered, so this costs one connect per
    endpoint and process. gcsfs's own error log is left to the application's logging configuration
    (a ``NullHandler`` keeps Python's last-resort handler from printing it when there is none)."""
    logging.getLogger("gcsfs").addHandler(_NULL)
    if endpoint in _REACHED:
        return
    parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    host, port = parsed.hostname or "", parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError:
        raise StorageUnreachable(f"{text}: storage endpoint unreachable ({endpoint})") from None
    _REACHED.add(endpoint)


_NULL = logging.NullHandler()


@contextlib.contextmanager
def errors(location: str | os.PathLike[str], action: str, need: int | None = None) -> Iterator[None]:
    """Turn whatever the SDKs raise into one :class:`StorageError` line naming location and reason (an outage is a
    :class:`StorageUnreachable`, no room a :class:`StorageFull` naming the ``need`` bytes)."""
    try:
        yield
    except StorageError:
        raise
    except UserError:
        raise
    except FileNotFoundError:
        raise StorageError(f"{os.fspath(location)}: cannot {action}: no such file or object") from None
    except PermissionError as exc:
        raise StorageError(f"{os.fspath(location)}: cannot {action}: permission denied ({first_line(exc)})") from None
    except OSError as exc:
        if exc.errno in FULL:
            raise full(location, action, exc, need) from None
        raise (StorageUnreachable if unreachable(exc) else StorageError)(
            f"{os.fspath(location)}: cannot {action}: {classify(location, exc)}") from None
    except Exception as exc:  # noqa: BLE001 - every SDK has its own hierarchy; classify by name
        raise (StorageUnreachable if unreachable(exc) else StorageError)(
            f"{os.fspath(location)}: cannot {action}: {classify(location, exc)}") from None


def retried(write: Callable[[], T], retry_s: float) -> T:
    """``write()`` — one all-or-nothing write, so doing it again is harmless — again with backoff while the store is
    unreachable, for at most ``retry_s`` seconds. Then, or at once on a full store, a :class:`StorageFailed`: what a job
    ends on (a checkpoint that cannot commit), not the user's mistake and not a worker's death."""
    deadline, pause = time.monotonic() + retry_s, 0.25
    while True:
        try:
            return write()
        except StorageFull as exc:
            raise StorageFailed(str(exc)) from None
        except StorageUnreachable as exc:
            if time.monotonic() + pause > deadline:
                raise StorageFailed(f"{exc}; gave up after {retry_s:g} s (RunConfig.storage_retry_s)") from None
            time.sleep(pause)
            pause = min(2 * pause, 5.0)


# ----- reading -----
@contextlib.contextmanager
def open_read(location: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    fs, path = filesystem(location)
    with errors(location, "read"):
        handle = fs.open(path, "rb")
    try:
        yield handle  # errors inside are the caller's; SDK errors while reading are mapped by read_chunks
    finally:
        handle.close()


def read_chunks(location: str | os.PathLike[str], chunk: int = CHUNK) -> Iterator[bytes]:
    with open_read(location) as handle, errors(location, "read"):
        while True:
            data = handle.read(chunk)
            if not data:
                return
            yield data


def read_bytes(location: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """A small object whole (manifests, markers); ``limit`` refuses anything larger."""
    out = bytearray()
    for data in read_chunks(location):
        out += data
        if limit is not None and len(out) > limit:
            raise StorageError(f"{os.fspath(location)}: larger than {limit} bytes; refusing to read it")
    return bytes(out)


def digest(location: str | os.PathLike[str]) -> tuple[str, int]:
    """sha256 hex and size, streamed."""
    sha, size = hashlib.sha256(), 0
    for data in read_chunks(location):
        sha.update(data)
        size += len(data)
    return sha.hexdigest(), size


# ----- writing -----
class _Hashing:
    """A write-only file that hashes and counts what passes through (torch.save writes into it).

    A write that fails is kept in :attr:`failed` as its :class:`StorageError`: torch.save turns the error of the
    file it writes into a ``RuntimeError`` ("unexpected pos") that never says "no space left"; the write's own
    error is the one raised (:func:`open_write`)."""

    def __init__(self, inner: IO[bytes], location: str | os.PathLike[str], need: int | None) -> None:
        self.inner, self.sha, self.size = inner, hashlib.sha256(), 0
        self.location, self.need = location, need
        self.failed: StorageError | None = None

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        try:
            with errors(self.location, "write", self.need):
                self.inner.write(data)
        except StorageError as exc:
            self.failed = exc
            raise
        return len(data)

    def flush(self) -> None:
        self.inner.flush()


@contextlib.contextmanager
def open_write(location: str | os.PathLike[str], block_size: int | None = None, need: int | None = None) -> Iterator[_Hashing]:
    """A streamed, all-or-nothing write; the handle's ``sha``/``size`` say what was written. ``need``: the bytes it
    will write, if known (a full store's line names them)."""
    out: _Hashing | None = None
    try:
        if is_local(location):
            with _local_write(local_path(location), need) as local:
                out = _Hashing(local, location, need)
                yield out
            return
        fs, path = filesystem(location)
        with errors(location, "write", need):
            handle = fs.open(path, "wb", **({"block_size": block_size} if block_size else {}))
        out = _Hashing(handle, location, need)
        try:
            with errors(location, "write", need):
                yield out
                handle.close()  # completes the (multipart) upload: the object appears only now
        except BaseException:
            with contextlib.suppress(Exception):
                handle.discard()  # abort a multipart upload; the object never appears
            handle.closed = True
            raise
    except Exception:
        if out is not None and out.failed is not None:  # the write's own error, not what torch made of it
            raise out.failed from None
        raise


@contextlib.contextmanager
def _local_write(path: str, need: int | None = None) -> Iterator[IO[bytes]]:
    refuse_non_regular(path)
    directory = os.path.dirname(path) or "."
    with errors(path, "create the folder"):
        os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with errors(path, "write"):
            handle = open(tmp, "xb")
        try:
            yield handle
            with errors(path, "write", need):
                handle.flush()
                os.fsync(handle.fileno())
        finally:
            with contextlib.suppress(OSError):  # flushed already; a write that failed would fail again here
                handle.close()
        refuse_non_regular(path)  # something may have appeared meanwhile
        with errors(path, "write"):
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def check_regular(location: str | os.PathLike[str], what: str = "a checkpoint") -> None:
    """A local file that is not a regular file (a symlink, a FIFO, a device, a folder) is refused
    before it is opened: opening a FIFO blocks until a writer comes, ``/dev/zero`` never ends, and
    a symlink points outside the folder whose integrity a reader is checking. Object stores hold
    only objects, so a remote location passes."""
    if not is_local(location):
        return
    path = local_path(location)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise StorageError(f"{path}: no such file") from None
    except OSError as exc:
        raise StorageError(f"{path}: cannot inspect ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        raise StorageError(f"{path}: is {_kind(mode)}; {what} holds only regular files")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def refuse_non_regular(path: str) -> None:
    """Only a regular file may be replaced: never a symlink, a device, a FIFO or a directory."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StorageError(f"{path}: cannot inspect ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        raise StorageError(f"{path}: is {_kind(mode)}; refusing to replace it")


def fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes(location: str | os.PathLike[str], data: bytes) -> None:
    with open_write(location) as handle:
        handle.write(data)


def copy(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, expect: tuple[str, int] | None = None,
         block_size: int | None = None, chunk: int = CHUNK) -> tuple[str, int]:
    """Stream one object from ``src`` to ``dst``; with ``expect`` (sha256, size) a mismatch aborts
    the write before the destination appears. Returns what was copied."""
    with open_write(dst, block_size=block_size, need=expect[1] if expect is not None else None) as out:
        for data in read_chunks(src, chunk):
            out.write(data)
            if expect is not None and out.size > expect[1]:
                raise StorageError(f"{os.fspath(src)}: larger than the {expect[1]} bytes recorded; not copied")
        got = (out.sha.hexdigest(), out.size)
        if expect is not None and got != expect:
            raise StorageError(f"{os.fspath(src)}: checksum mismatch while copying (corrupted source); not copied")
    return got


# ----- listing and removing -----
def exists(location: str | os.PathLike[str]) -> bool:
    fs, path = filesystem(location)
    with errors(location, "check"):
        return bool(fs.exists(path))


def isdir(location: str | os.PathLike[str]) -> bool:
    fs, path = filesystem(location)
    with errors(location, "check"):
        return bool(fs.isdir(path))


def listdir(location: str | os.PathLike[str]) -> list[str]:
    """Names of the direct children (files and folders), sorted; [] when there is nothing."""
    fs, path = filesystem(location)
    try:
        with errors(location, "list"):
            entries = fs.ls(path, detail=False)
    except StorageError:
        if not exists(location):
            return []
        raise
    names = {posixpath.basename(str(e).rstrip("/")) for e in entries}
    names.discard("")
    return sorted(names)


def remove_file(location: str | os.PathLike[str]) -> None:
    """Delete one file or object, never a folder or a prefix; nothing there is fine.

    Why not ``fs.rm(path, recursive=True)``: on s3fs that deletes every key under the prefix and then
    tries the bucket itself, so a cleanup aimed at a few objects can take a bucket with it. Whoever
    cleans up deletes exactly the objects it wrote, one by one (see :mod:`actors.checkpoint_transfer`)."""
    if is_local(location):
        path = local_path(location)
        refuse_non_regular(path)
        with errors(path, "remove"), contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    fs, path = filesystem(location)
    with errors(location, "remove"):
        try:
            fs.rm_file(path)
        except FileNotFoundError:
            pass


def check_writable(location: str | os.PathLike[str]) -> None:
    """Write and delete a probe, so an unusable location fails at start, not at the first checkpoint."""
    probe = join(location, f".raypipe-probe-{uuid.uuid4().hex[:8]}")
    write_bytes(probe, b"ok")
    remove_file(probe)
