"""The one reader and writer of the project's files, with the guarantees every command relies on.

Reading: an unreadable, oversized, non-UTF-8 or malformed file is a :class:`UserError` naming the
file and the problem (one line, no traceback). Reads are capped (:data:`MAX_INPUT_BYTES`). An input
must be a regular file (a symlink to one is fine): it is opened without blocking and checked before
a byte is read, so ``--profile fifo`` is refused at once instead of waiting forever for a writer,
and ``--profile /dev/zero`` is refused instead of read. JSON objects with a key twice are refused
(Python's parser silently keeps the last one).

Inputs are never outputs: during one command (:func:`one_command`, which the CLI's ``main`` opens)
every file read is remembered, and writing one of them is refused before anything is written, so
``--trace p.json --profile p.json`` cannot replace the profile it was computed from, whichever
command passes which flags. Outside a command (the Python API) nothing is remembered: loading a
profile and saving it back in place is an ordinary thing to do there.

Writing: every output path is checked *before* a command does its work (:func:`check_outputs`),
so a bad ``--png`` does not cost a planning run and does not leave the ``--out`` file behind.
Only a missing path or a regular file is ever replaced: a symlink, a directory, a device or a
FIFO named as an output file is refused (the usual temporary-name-then-rename would otherwise
turn ``/dev/null`` into a regular file, or replace a link instead of writing through it). Several
outputs of one command are written all or none (:func:`write_outputs`: every file is rendered
under a temporary name first, then all are renamed), and files get the usual ``0666 & ~umask``
mode rather than ``mkstemp``'s 0600.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Sequence

from orchestrator.core.errors import UserError

MAX_INPUT_BYTES = 256 * 2**20  # the largest profile/plan/cluster/trace we read; far above real ones (< 5 MB)

Render = Callable[[IO[bytes]], None]


@dataclass(frozen=True)
class Output:
    """One file a command will write: its path, its role in messages, and how to render it."""

    path: Path
    what: str
    render: Render


# ----- reading -----
_INPUTS: list[dict[str, str]] = []
"""The open commands' inputs (real path -> role), innermost last; owned here: :func:`one_command`
opens and closes a scope, :func:`read_bytes` records into the innermost one."""


@contextlib.contextmanager
def one_command() -> Iterator[dict[str, str]]:
    """A scope in which every input read is remembered and refused as an output (see the module's doc)."""
    scope: dict[str, str] = {}
    _INPUTS.append(scope)
    try:
        yield scope
    finally:
        _INPUTS.remove(scope)


def _input_role(path: str | os.PathLike[str]) -> str | None:
    real = os.path.realpath(path)
    return next((scope[real] for scope in reversed(_INPUTS) if real in scope), None)


def read_bytes(path: str | os.PathLike[str], what: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of ``path`` (at most ``limit``); anything but a regular file, a missing file or a
    bigger one is a UserError. Opened with ``O_NONBLOCK`` and checked with ``fstat`` before reading,
    so a FIFO never blocks and the check and the read see the same file."""
    p = Path(path)
    if not str(path):
        raise UserError(f"{what}: an empty path is not a file name")
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise UserError(f"cannot read {what} {p}: is a directory") from None
    except OSError as exc:
        raise UserError(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserError(f"cannot read {what} {p}: is {_kind(mode)}; an input must be a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise UserError(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UserError(f"{what} {p} is larger than the {limit // 2**20} MiB limit for input files")
    if _INPUTS:
        _INPUTS[-1].setdefault(os.path.realpath(p), f"{what} {p}")
    return data


def decode(data: bytes, path: str | os.PathLike[str], what: str) -> str:
    """UTF-8 text, or a UserError naming the file and the first bad byte (a binary or Latin-1 file)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); is it a binary file?") from None


def read_text(path: str | os.PathLike[str], what: str, limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of ``path``; every way of failing is one UserError naming the file."""
    return decode(read_bytes(path, what, limit), path, what)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are all different: ``{"speed": 1, "speed": 2}`` is a mistake, not 2."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            shown = repr(key) if len(key) <= 40 else repr(key[:37]) + "..."
            raise _DuplicateKey(f"key {shown} appears twice in one object")
        out[key] = value
    return out


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """Parse ``path``; ``what`` names the file's role in errors ("profile", "plan", "cluster").

    ``NaN`` and ``Infinity`` (which Python's json accepts but JSON does not) are refused here, so
    no non-finite number reaches a loader's arithmetic."""
    return parse_json(read_text(path, what), path, what)


def parse_json(text: str, path: str | os.PathLike[str], what: str) -> Any:
    """JSON text read from ``path`` (for messages) with :func:`read_json`'s rules."""
    p = Path(path)
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} {p}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:
        raise UserError(f"{what} {p}: invalid JSON ({exc})") from None
    except RecursionError:
        raise UserError(f"{what} {p}: invalid JSON (nested too deeply)") from None


# ----- checking outputs -----
def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _probe(directory: Path) -> None:
    """Prove a file can be created in ``directory`` (permissions, read-only or pseudo file systems)."""
    fd, name = tempfile.mkstemp(prefix=".raypipe-probe.", dir=directory)
    os.close(fd)
    os.unlink(name)


def check_output(path: str | os.PathLike[str], what: str = "output") -> Path:
    """``path`` as a Path if a file can be written there, else a UserError saying why.

    Missing parent folders are fine (they are created when writing) as long as the nearest
    existing one is a writable directory."""
    p = Path(path)
    if not str(path) or p.name in ("", ".", ".."):
        raise UserError(f"{what} {str(path)!r} is not a file name")
    try:
        mode = os.lstat(p).st_mode
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        raise UserError(f"cannot write {what} {p}: {exc.strerror or exc}") from None
    else:
        if not stat.S_ISREG(mode):
            raise UserError(f"{what} {p} is {_kind(mode)}; only a regular file is replaced")
        source = _input_role(p)
        if source is not None:
            raise UserError(f"{what} {p} is the {source} this command reads; refusing to overwrite an input")
    parent = p.parent
    while True:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            if parent == parent.parent:
                raise UserError(f"cannot write {what} {p}: no existing parent folder") from None
            parent = parent.parent
            continue
        except NotADirectoryError:
            parent = parent.parent
            continue
        except OSError as exc:
            raise UserError(f"cannot write {what} {p}: {parent}: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise UserError(f"cannot write {what} {p}: {parent} is not a directory")
        break
    try:
        _probe(parent)
    except OSError as exc:
        raise UserError(f"cannot write {what} {p}: {parent} does not accept new files ({exc.strerror or exc})") from None
    return p


def check_outputs(paths: Iterable[tuple[str | os.PathLike[str] | None, str]],
                  inputs: Iterable[tuple[str | os.PathLike[str] | None, str]] = ()) -> None:
    """:func:`check_output` for every given ``(path, role)`` (``None`` skipped), no path twice, and
    none of them one of ``inputs`` (checked before the inputs are read, so before any work)."""
    seen: dict[str, str] = {}
    for path, what in inputs:
        if path is not None and str(path):
            seen[os.path.realpath(path)] = f"input {what} {path}"
    for path, what in paths:
        if path is None:
            continue
        p = check_output(path, what)
        key = os.path.realpath(p)
        if key in seen and seen[key].startswith("input "):
            raise UserError(f"{what} {p} is the {seen[key][6:]} this command reads; refusing to overwrite an input")
        if key in seen:
            raise UserError(f"{what} and {seen[key]} are the same file {p}")
        seen[key] = what


def check_output_dir(path: str | os.PathLike[str], what: str = "output folder") -> Path:
    """A folder a command writes into: reused if it is one, created later if missing, refused if it
    is anything else (a file, a link to a file, a device)."""
    if not str(path):
        raise UserError(f"{what}: an empty path is not a folder name")
    p = Path(path)
    if p.exists() or p.is_symlink():
        if not p.is_dir():
            raise UserError(f"{what} {p} exists and is not a directory")
        try:
            _probe(p)
        except OSError as exc:
            raise UserError(f"cannot write into {what} {p}: {exc.strerror or exc}") from None
        return p
    try:
        check_output(p / "probe", what)  # the nearest existing ancestor must take a new folder
    except UserError as exc:
        raise UserError(str(exc).replace(f"{p / 'probe'}", str(p))) from None  # the folder's name, not the probe's
    return p


# ----- writing -----
def write_outputs(outputs: Sequence[Output]) -> list[Path]:
    """Write every output all or none: each rendered and fsynced under a temporary name in its own
    folder, then all renamed into place. A failure while rendering leaves nothing behind."""
    check_outputs((o.path, o.what) for o in outputs)
    mode = 0o666 & ~_umask()
    staged: list[tuple[str, Path]] = []
    try:
        for o in outputs:
            try:
                o.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=f".{o.path.name}.", suffix=".tmp", dir=o.path.parent)
            except OSError as exc:
                raise UserError(f"cannot write {o.what} {o.path}: {exc.strerror or exc}") from None
            staged.append((tmp, o.path))
            try:
                with os.fdopen(fd, "wb") as handle:
                    o.render(handle)
                    handle.flush()
                    os.fchmod(handle.fileno(), mode)
                    os.fsync(handle.fileno())
            except OSError as exc:
                raise UserError(f"cannot write {o.what} {o.path}: {exc.strerror or exc}") from None
        for tmp, final in staged:
            # re-checked at the last moment: a link or device put there meanwhile is still refused
            try:
                st = os.lstat(final)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISREG(st.st_mode):
                    raise UserError(f"output {final} became {_kind(st.st_mode)} while writing; not replaced")
        for tmp, final in staged:
            os.replace(tmp, final)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [o.path for o in outputs]


def json_output(path: str | os.PathLike[str], payload: Any, what: str = "output") -> Output:
    """An :class:`Output` rendering ``payload`` as indented JSON."""

    def render(handle: IO[bytes]) -> None:
        handle.write(json.dumps(payload, indent=1).encode())

    return Output(Path(path), what, render)


def figure_output(path: str | os.PathLike[str], fig: Any, what: str = "figure", dpi: int = 110) -> Output:
    """An :class:`Output` rendering a matplotlib figure as PNG (the caller closes the figure)."""

    def render(handle: IO[bytes]) -> None:
        fig.savefig(handle, format="png", dpi=dpi)

    return Output(Path(path), what, render)


def write_json_atomic(path: str | os.PathLike[str], payload: Any, what: str = "output") -> Path:
    """Write one JSON file through :func:`write_outputs` (checked, atomic, usual permissions)."""
    return write_outputs([json_output(path, payload, what)])[0]


def write_text(path: str | os.PathLike[str], text: str, what: str = "output") -> Path:
    """Write one text file through :func:`write_outputs`."""
    def render(handle: IO[bytes]) -> None:
        handle.write(text.encode())

    return write_outputs([Output(Path(path), what, render)])[0]
