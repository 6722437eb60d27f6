"""Ready-made ``data_fn``\\ s: token windows from a file, batches from a map-style dataset.

``TrainConfig(data_fn=...)`` takes any picklable ``data_fn(step) -> (inputs, targets)`` that depends
only on ``step``. The two classes here are such functions for the common cases:

* :class:`TokenFile` — random windows of ``seq_len + 1`` tokens from one flat file of token ids (a raw
  binary such as nanoGPT's ``train.bin``, or a ``.npy`` array): ``inputs`` are the first ``seq_len``
  tokens of each window, ``targets`` the same window shifted by one token. The file is memory-mapped
  and only the windows a step needs are read.
* :class:`DatasetBatches` (made by :func:`from_dataset`) — consecutive batches of ``rows`` samples
  from any map-style dataset (``len`` and ``[i]``: a torch ``Dataset``, a Hugging Face
  ``datasets.Dataset``, a list), reshuffled every epoch.

Where they run: the data function is pickled to the stage workers that hold the first stage (which
needs ``inputs``) and the last stage (``targets``), and each calls it separately for every step; the
driver calls it too when it checks the job (:func:`actors.user_code.validate_job`). A
:class:`TokenFile` is checked on the driver when it is made (one line, :class:`UserError`, for a missing,
empty or truncated file) but read on those workers: **the file must exist, at the same path and
with the same content, on every node that may hold the first or the last stage** (a copy of another
size is refused there by name). A :class:`DatasetBatches` pickles its dataset object to those workers,
so a large dataset should be one that pickles by reference (a memory-mapped Hugging Face dataset
does, an in-memory tensor does not).

Why batches come from ``(seed, step)`` alone: the first and last stages must pair the same inputs
with the same targets, and a job resumed from a checkpoint at step ``k`` must see exactly the batches
``k, k+1, ...`` it would have seen without the restart. Nothing here keeps a cursor: step ``s`` is
drawn from ``seed`` and ``s`` with NumPy's PCG64 bit generator (raw 64-bit outputs, whose stream
NumPy keeps stable across versions, unlike its ``Generator`` methods), so a resumed run, another
node and another NumPy all agree.
"""

from __future__ import annotations

import operator
import os
import stat
import threading
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from orchestrator.core import limits
from orchestrator.core.errors import UserError

__all__ = ["TokenFile", "DatasetBatches", "from_dataset", "DTYPES", "MAX_BATCH_TOKENS", "MAX_ROWS"]

DTYPES: dict[str, str] = {
    "uint8": "u1", "int8": "i1", "uint16": "<u2", "int16": "<i2", "uint32": "<u4", "int32": "<i4", "int64": "<i8",
}
"""Token id types a :class:`TokenFile` reads. Raw files are little-endian (what ``ndarray.tofile`` writes
on x86 and ARM); a ``.npy`` file's own header says its byte order. ``uint64`` is left out: a LongTensor
cannot hold all of it."""

MAX_BATCH_TOKENS = 2**26
"""``rows * seq_len`` of one step, at most: 64 Mi tokens are 512 MiB per int64 tensor (inputs and targets
each), far beyond a realistic per-step batch; a typo in ``rows`` or ``seq_len`` is refused here instead
of exhausting a worker's memory."""

MAX_ROWS = 2**24
"""Samples per step of a :class:`DatasetBatches`, at most."""

MAX_SEED = 2**63 - 1
NPY_MAGIC = b"\x93NUMPY"


def _step(step: Any, where: str) -> int:
    """``step`` as an int >= 0 (NumPy integers too; a bool or a float is a mistake)."""
    if isinstance(step, bool):
        raise UserError(f"{where}: step must be an integer >= 0, got {step!r}")
    try:
        value = operator.index(step)
    except TypeError:
        raise UserError(f"{where}: step must be an integer >= 0, got {type(step).__name__}") from None
    if value < 0:
        raise UserError(f"{where}: step must be an integer >= 0, got {value}")
    return value


def _raw(seed: int, key: int, n: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """``n`` raw 64-bit draws of the PCG64 stream seeded by ``(seed, key)`` (stable across NumPy versions)."""
    return np.random.PCG64(np.random.SeedSequence((seed, key))).random_raw(n)


# ---------------------------------------------------------------------------------------------- token files

@dataclass(frozen=True)
class _Layout:
    """Where the tokens sit in the file: checked on the driver, compared on each worker."""

    size: int  # bytes of the whole file
    offset: int  # bytes before the first token (the .npy header)
    count: int  # tokens
    dtype: str  # NumPy dtype string with byte order ("<u2", ">i4")


def _open_regular(path: str, where: str, hint: str = "") -> tuple[int, int]:
    """An fd of the regular file ``path`` and its size. Opened non-blocking and checked with ``fstat``,
    so a FIFO (or a device) is never read and never blocks, even if it replaces the file after a ``stat``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{where}: no such file {path}{hint}") from None
    except OSError as exc:
        raise UserError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{where}: {path} is a directory; name the token file itself")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{where}: {path} is not a regular file (a FIFO, socket or device cannot be memory-mapped)")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UserError(f"{where}: no such file {path}{hint}") from None
    except OSError as exc:
        raise UserError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UserError(f"{where}: {path} is not a regular file (a FIFO, socket or device cannot be memory-mapped)")
    return fd, int(st.st_size)


def _npy_header(f: Any, path: str, where: str) -> tuple[np.dtype[Any], int]:
    """(dtype, tokens) from the header of the ``.npy`` file ``f`` (positioned at 0; left at the data)."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise UserError(f"{where}: {path} is a .npy file of format version {version[0]}.{version[1]}; "
                            "save the tokens with numpy.save (version 1.0 or 2.0)")
    except UserError:
        raise
    except (ValueError, EOFError, OSError, SyntaxError) as exc:
        text = " ".join(str(exc).split())[:120]
        raise UserError(f"{where}: {path} is not a valid .npy file ({text})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in "iu":
        raise UserError(f"{where}: {path} holds {dtype} values, not integer token ids")
    if fortran and sum(1 for d in shape if d != 1) > 1:
        raise UserError(f"{where}: {path} is a Fortran-order {len(shape)}-d array; save np.ascontiguousarray(tokens).reshape(-1)")
    count = 1
    for d in shape:
        count *= int(d)
    return dtype, count


def _layout(path: str, dtype: str | None, where: str) -> _Layout:
    """The file's layout, every mistake one line. The header (at most 6 bytes of a raw file) is all that is read."""
    fd, size = _open_regular(path, where)
    with os.fdopen(fd, "rb") as f:
        if size == 0:
            raise UserError(f"{where}: {path} is empty")
        is_npy = f.read(len(NPY_MAGIC)) == NPY_MAGIC
        if path.endswith(".npy") and not is_npy:
            raise UserError(f"{where}: {path} is named .npy but has no NumPy header; rename it if it is a raw token file")
        if not is_npy:
            name = dtype or "uint16"
            item = np.dtype(DTYPES[name]).itemsize
            if size % item:
                raise UserError(f"{where}: {path} has {size} bytes, not a whole number of {name} tokens ({item} bytes each); "
                                "is the dtype right, or is the file truncated?")
            return _Layout(size=size, offset=0, count=size // item, dtype=DTYPES[name])
        f.seek(0)
        np_dtype, count = _npy_header(f, path, where)
        offset = f.tell()
    if np_dtype.name not in DTYPES:
        raise UserError(f"{where}: {path} holds {np_dtype.name} token ids; supported: {', '.join(DTYPES)}")
    if dtype is not None and dtype != np_dtype.name:
        raise UserError(f"{where}: dtype={dtype!r} but {path} is a .npy file of {np_dtype.name}; "
                        "leave dtype out for .npy files (the header says it)")
    if offset + count * np_dtype.itemsize > size:
        raise UserError(f"{where}: {path} is truncated: its header promises {count} tokens "
                        f"({offset + count * np_dtype.itemsize} bytes) but the file has {size} bytes")
    return _Layout(size=size, offset=offset, count=count, dtype=np_dtype.str)


_MAPS: dict[tuple[str, _Layout], np.ndarray[Any, Any]] = {}
"""This process's memory maps, one per (file, layout): opened on a worker's first step, never pickled."""
_MAPS_LOCK = threading.Lock()


def _mapped(path: str, layout: _Layout, where: str) -> np.ndarray[Any, Any]:
    key = (path, layout)
    tokens = _MAPS.get(key)
    if tokens is not None:
        return tokens
    with _MAPS_LOCK:
        tokens = _MAPS.get(key)
        if tokens is None:
            fd, size = _open_regular(path, where, " on this node; every node that holds the first or last stage needs the file")
            with os.fdopen(fd, "rb") as f:
                if size != layout.size:
                    raise UserError(f"{where}: {path} has {size} bytes on this node but had {layout.size} when the job was "
                                    "configured; every node that holds the first or last stage needs the same file")
                tokens = np.memmap(f, dtype=np.dtype(layout.dtype), mode="r", offset=layout.offset, shape=(layout.count,))
            _MAPS[key] = tokens
    return tokens


@dataclass(frozen=True)
class TokenFile:
    """A ``data_fn`` of random next-token windows from a flat file of token ids.

    ``TokenFile("train.bin", seq_len=1024, rows=32)(step)`` is ``(inputs, targets)``, two LongTensors of
    shape ``[rows, seq_len]``: each row is a window of ``seq_len + 1`` consecutive tokens starting at a
    random position (any window that fits in the file), ``inputs`` its first ``seq_len`` tokens and
    ``targets`` its last ``seq_len`` (the next token of each input). The starts are drawn from
    ``(seed, step)`` alone, so every call for one step returns the same batch, in any process.

    The file is either raw token ids (``dtype``, default ``uint16``, little-endian: e.g.
    ``np.array(ids, np.uint16).tofile(path)``) or a ``.npy`` file (``np.save``), recognised by its
    NumPy header, whose dtype is the header's: leave ``dtype`` out for it, or give the same one (another
    is refused rather than reinterpreted). A multi-dimensional C-order ``.npy`` array is read as its
    flat token stream. The file is memory-mapped on first use in each process (not pickled, never
    read whole); it must be present, identical, on the nodes of the first and last stages.
    """

    path: str | os.PathLike[str]
    seq_len: int
    rows: int
    dtype: str | None = None
    """``uint8``, ``int8``, ``uint16``, ``int16``, ``uint32``, ``int32`` or ``int64`` (:data:`DTYPES`);
    ``None``: ``uint16`` for a raw file, the header's for a ``.npy`` file."""
    seed: int = 0
    _file: str = field(init=False, repr=False, compare=False)
    _layout: _Layout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = "TokenFile"
        text = limits.path_text(self.path, where, "path")
        if "://" in text:
            raise UserError(f"{where}: {text} is a URI; a token file is memory-mapped, so copy it to a local path on the nodes "
                            "of the first and last stages")
        file = os.path.abspath(os.path.expanduser(text))
        seq_len = limits.count(self.seq_len, where, "seq_len", maximum=MAX_BATCH_TOKENS)
        rows = limits.count(self.rows, where, "rows", maximum=MAX_BATCH_TOKENS)
        if rows * seq_len > MAX_BATCH_TOKENS:
            raise UserError(f"{where}: rows * seq_len = {rows} * {seq_len} = {rows * seq_len} tokens per step, "
                            f"above the limit {MAX_BATCH_TOKENS}")
        seed = limits.count(self.seed, where, "seed", minimum=0, maximum=MAX_SEED)
        dtype = self.dtype
        if dtype is not None:
            if not isinstance(dtype, str):
                try:
                    dtype = np.dtype(dtype).name  # np.uint16, np.dtype("uint16") are the same request
                except TypeError:
                    raise UserError(f"{where}: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}") from None
            if dtype not in DTYPES:
                try:
                    known = bool(np.dtype(dtype).name)
                except TypeError:
                    known = False
                raise UserError(f"{where}: dtype {dtype!r} is not a token id type; supported: {', '.join(DTYPES)}" if known
                                else f"{where}: unknown dtype {dtype!r}{limits.suggest(dtype, DTYPES)}")
        layout = _layout(file, dtype, where)
        if layout.count < seq_len + 1:
            raise UserError(f"{where}: {file} has {layout.count} tokens, fewer than one window of seq_len + 1 = {seq_len + 1}")
        for name, value in (("seq_len", seq_len), ("rows", rows), ("seed", seed), ("dtype", dtype),
                            ("_file", file), ("_layout", layout)):
            object.__setattr__(self, name, value)

    @property
    def tokens(self) -> int:
        """Tokens in the file."""
        return self._layout.count

    def starts(self, step: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The ``rows`` window starts of ``step``, each in ``0 .. tokens - seq_len - 1``."""
        step = _step(step, "TokenFile")
        choices = self._layout.count - self.seq_len  # windows of seq_len + 1 tokens that fit
        # the modulo's bias is below choices / 2**64: immaterial, and exactly reproducible
        return (_raw(self.seed, step, self.rows) % np.uint64(choices)).astype(np.int64)

    def __call__(self, step: int) -> tuple[Tensor, Tensor]:
        starts = self.starts(step)
        tokens = _mapped(self._file, self._layout, "TokenFile")
        windows = np.lib.stride_tricks.sliding_window_view(tokens, self.seq_len + 1)[starts]  # reads rows windows only
        if windows.dtype.kind == "i" and windows.size and int(windows.min()) < 0:
            row, col = (int(i) for i in np.argwhere(windows < 0)[0])
            raise UserError(f"TokenFile: {self._file} holds a negative token id {int(windows[row, col])} at token "
                            f"{int(starts[row]) + col}; token ids must be >= 0")
        inputs = torch.from_numpy(windows[:, :-1].astype(np.int64, order="C"))
        targets = torch.from_numpy(windows[:, 1:].astype(np.int64, order="C"))
        return inputs, targets


# ------------------------------------------------------------------------------------------------ datasets

def _pair(out: Any, step: int) -> tuple[Tensor, Tensor]:
    if isinstance(out, Mapping):
        raise UserError(f"DatasetBatches: step {step}'s samples collate to a dict ({', '.join(map(str, list(out)[:4]))}); "
                        "pass from_dataset(..., collate_fn=f) where f(samples) returns (inputs, targets) tensors")
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, Tensor) for t in out)):
        shown = f"a sequence of {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
        raise UserError(f"DatasetBatches: step {step}'s samples collate to {shown}, not (inputs, targets) tensors; "
                        "use (x, y) samples or pass from_dataset(..., collate_fn=f) returning (inputs, targets)")
    return out[0], out[1]


def _collate(samples: list[Any]) -> Any:
    from torch.utils.data import default_collate

    return default_collate(samples)


@dataclass(frozen=True)
class DatasetBatches:
    """A ``data_fn`` of consecutive batches from a map-style dataset (make it with :func:`from_dataset`).

    Step ``s`` takes the samples at global positions ``s * rows .. s * rows + rows - 1``; position
    ``p`` is sample ``order(p // len)[p % len]``, where ``order(epoch)`` is a permutation drawn from
    ``(seed, epoch)`` (the identity without ``shuffle``). So every epoch visits each sample exactly
    once, epochs are shuffled differently, a batch may straddle two epochs, and ``rows > len`` wraps.
    """

    dataset: Any
    rows: int
    collate_fn: Callable[[list[Any]], Any] | None = None
    shuffle: bool = True
    seed: int = 0
    _len: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = "from_dataset"
        dataset = self.dataset
        if isinstance(dataset, (str, bytes, os.PathLike)):
            raise UserError(f"{where}: dataset is a path or a string; use TokenFile(path, seq_len, rows) for a token file")
        from torch.utils.data import IterableDataset

        if isinstance(dataset, IterableDataset) or not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise UserError(f"{where}: {type(dataset).__name__} is not a map-style dataset (it needs len() and [i]); "
                            "an iterable dataset cannot be indexed by step")
        try:
            n = len(dataset)
        except Exception as exc:  # noqa: BLE001 - the user's __len__
            raise UserError(f"{where}: len(dataset) raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None
        if n == 0:
            raise UserError(f"{where}: the dataset is empty")
        rows = limits.count(self.rows, where, "rows", maximum=MAX_ROWS)
        limits.flag(self.shuffle, where, "shuffle")
        seed = limits.count(self.seed, where, "seed", minimum=0, maximum=MAX_SEED)
        if self.collate_fn is not None:
            limits.function(self.collate_fn, where, "collate_fn")
        else:
            try:
                sample = dataset[0]
            except Exception as exc:  # noqa: BLE001 - the user's __getitem__
                raise UserError(f"{where}: dataset[0] raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None
            if isinstance(sample, Mapping):
                raise UserError(f"{where}: samples are dicts ({', '.join(map(str, list(sample)[:4]))}); pass collate_fn=f where "
                                "f(samples) returns (inputs, targets) tensors")
            if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
                kind = (f"{type(sample).__name__}s of {len(sample)}" if isinstance(sample, (tuple, list))
                        else type(sample).__name__)
                raise UserError(f"{where}: samples are {kind}, not (inputs, targets) pairs; pass collate_fn=f "
                                "where f(samples) returns (inputs, targets) tensors")
        for name, value in (("rows", rows), ("seed", seed), ("_len", n)):
            object.__setattr__(self, name, value)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_orders"}  # the cached permutations stay here

    def order(self, epoch: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Epoch ``epoch``'s sample order (cached: the last two epochs in this process)."""
        if not self.shuffle:
            return np.arange(self._len, dtype=np.int64)
        orders: dict[int, np.ndarray[Any, np.dtype[np.int64]]] = self.__dict__.setdefault("_orders", {})
        got = orders.get(epoch)
        if got is None:
            # a stable sort of raw draws: the same permutation from any NumPy (ties break by index)
            got = np.argsort(_raw(self.seed, epoch, self._len), kind="stable").astype(np.int64)
            while len(orders) >= 2:
                orders.pop(next(iter(orders)))
            orders[epoch] = got
        return got

    def indices(self, step: int) -> list[int]:
        """The dataset indices of step ``step``'s samples, in batch order."""
        step = _step(step, "DatasetBatches")
        first, n = step * self.rows, self._len
        parts: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        for epoch in range(first // n, (first + self.rows - 1) // n + 1):  # a batch may straddle epochs
            lo, hi = max(first - epoch * n, 0), min(first + self.rows - epoch * n, n)
            parts.append(self.order(epoch)[lo:hi] if self.shuffle else np.arange(lo, hi, dtype=np.int64))
        return [int(i) for i in np.concatenate(parts)]

    def __call__(self, step: int) -> tuple[Tensor, Tensor]:
        indices = self.indices(step)
        n = len(self.dataset)
        if n != self._len:
            raise UserError(f"DatasetBatches: the dataset has {n} samples here but had {self._len} when the job was configured")
        out = (self.collate_fn or _collate)([self.dataset[i] for i in indices])
        return _pair(out, int(step))


def from_dataset(
    dataset: Any, rows: int, collate_fn: Callable[[list[Any]], Any] | None = None, shuffle: bool = True, seed: int = 0,
) -> DatasetBatches:
    """A picklable ``data_fn`` of ``rows`` samples per step from a map-style ``dataset``.

    ``dataset`` needs ``len()`` and ``dataset[i]`` (a torch ``Dataset``, a Hugging Face ``datasets.Dataset``,
    a list). Samples are collated with ``collate_fn(samples)``, by default torch's ``default_collate``,
    which suits ``(x, y)`` samples; dict samples (``{"input_ids": ...}``) need a ``collate_fn`` that
    returns ``(inputs, targets)``. See :class:`DatasetBatches` for the order; the dataset object is
    pickled to the first and last stages' workers.
    """
    return DatasetBatches(dataset, rows, collate_fn=collate_fn, shuffle=shuffle, seed=seed)
