"""Calling the user's code (``data_fn``, ``loss_fn``, model and optimizer factories) so that its
mistakes are reported once, by name, instead of looking like crashed workers.

Why a separate error type: a worker that raises an ordinary exception is indistinguishable from a
worker that lost its process group, and the trainer's recovery restarts every actor and tries
again (``max_failures`` times) — pointless for a ``data_fn`` that raises on every call, and slow
(each restart rebuilds the Ray actors). A :class:`UserCodeError` is a :class:`UserError`, which
:meth:`actors.group.WorkerGroup.gather` re-raises as-is and the trainer never retries; the CLI
and the driver show its one line.

:func:`validate_job` runs on the driver before any actor starts and catches what can be caught
cheaply: a ``num_microbatches`` outside ``1..rows``, blocks that do not chain (one probe forward on
two rows), a loss that is not a scalar, a ``data_fn`` that is not deterministic in ``step`` (stage 0
and the last stage call it separately, so two different draws would silently pair inputs with
the wrong targets), and a checkpoint directory that cannot be written.
"""

from __future__ import annotations

import functools
import os
import traceback
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import torch
from torch import Tensor, nn

from orchestrator.core.errors import UserError

T = TypeVar("T")

MAX_MESSAGE = 300  # characters of the user's exception message kept in the one line


class UserCodeError(UserError):
    """An exception raised by (or a contract broken by) code the user handed to the trainer. ``trace``: the user's
    own frames (for the run's event log; the one line on stderr stays one line)."""

    def __init__(self, message: str, trace: str = "") -> None:
        super().__init__(message)
        self.trace = trace[-MAX_TRACE:]

    def __reduce__(self) -> tuple[Any, ...]:  # the trace survives the trip from a worker to the driver
        return (type(self), (str(self), self.trace))


MAX_TRACE = 20_000
"""Characters of a user's traceback kept (the innermost frames)."""


def callable_name(fn: Any) -> str:
    """A readable name for a user callable: ``mypkg.data:batches`` (partials and lambdas too)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}:{name}" if module and module != "builtins" else str(name)


def _quote(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def call(role: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``; an exception becomes one :class:`UserCodeError` naming ``role`` and ``fn``.

    ``role`` says what the callable is for (``"data_fn(3)"``, ``"loss_fn"``, ``"model factory"``).
    A :class:`UserError` raised inside passes through unchanged (it already is one line).
    """
    try:
        return fn(*args)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the user's code raises is reported, not retried
        raise UserCodeError(f"{role} ({callable_name(fn)}) raised {_quote(exc)}", traceback.format_exc()) from None


def batch(
    data_fn: Callable[[int], Any], step: int, rows: int | None = None, sample: tuple[tuple[int, ...], torch.dtype] | None = None,
) -> tuple[Tensor, Tensor]:
    """``data_fn(step)`` checked to be ``(inputs, targets)`` tensors with equal (and expected) rows
    and, given ``sample`` (trailing shape and dtype of step 0's inputs), the same kind of rows."""
    out = call(f"data_fn({step})", data_fn, step)
    name = callable_name(data_fn)
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, Tensor) for t in out)):
        raise UserCodeError(f"data_fn({step}) ({name}) must return (inputs, targets) tensors, got {type(out).__name__}")
    inputs, targets = out
    if inputs.dim() == 0 or targets.dim() == 0:
        raise UserCodeError(f"data_fn({step}) ({name}) returned a 0-d tensor; rows are the first dimension")
    if int(inputs.shape[0]) != int(targets.shape[0]):
        raise UserCodeError(f"data_fn({step}) ({name}) returned {inputs.shape[0]} input rows but {targets.shape[0]} target rows")
    if rows is not None and int(inputs.shape[0]) != rows:
        raise UserCodeError(f"data_fn({step}) ({name}) returned {inputs.shape[0]} rows; every step must have {rows}")
    if sample is not None and (tuple(inputs.shape[1:]), inputs.dtype) != (tuple(sample[0]), sample[1]):
        raise UserCodeError(f"data_fn({step}) ({name}) returned rows of shape {tuple(inputs.shape[1:])} {inputs.dtype}; "
                            f"step 0 had {tuple(sample[0])} {sample[1]} and the pipeline's buffers are sized for that")
    return inputs, targets


def block_failed(index: int, block: nn.Module, x: Tensor, exc: BaseException) -> UserError:
    """The one-line error for block ``index`` raising on input ``x`` during training."""
    if isinstance(exc, UserError):
        return exc
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return UserCodeError(f"block {index} ({type(block).__name__}) raised {_quote(exc)} on a {tuple(x.shape)} input", trace)


def blocks(model_factory: Callable[[], Any]) -> list[nn.Module]:
    """``model_factory()`` checked to be a non-empty sequence of ``nn.Module`` blocks."""
    out = call("model factory", model_factory)
    name = callable_name(model_factory)
    try:
        built = list(out)
    except TypeError:
        raise UserCodeError(f"model factory ({name}) must return a list of nn.Module blocks, got {type(out).__name__}") from None
    if not built:
        raise UserCodeError(f"model factory ({name}) returned no blocks")
    for i, b in enumerate(built):
        if not isinstance(b, nn.Module):
            raise UserCodeError(f"model factory ({name}) returned {type(b).__name__} as block {i}; every block must be an nn.Module")
    return built


def optimizer(optimizer_factory: Callable[[Any], Any], params: Any, block: int) -> torch.optim.Optimizer:
    """``optimizer_factory(params)`` for ``block``, checked to be a torch optimizer."""
    out = call(f"optimizer factory (block {block})", optimizer_factory, params)
    if not isinstance(out, torch.optim.Optimizer):
        raise UserCodeError(f"optimizer factory ({callable_name(optimizer_factory)}) returned {type(out).__name__}, not a torch.optim.Optimizer")
    return out


def forward(index: int, block: nn.Module, x: Tensor) -> Tensor:
    """One block's forward; a shape mismatch names the block (index and class). A block built on
    the meta device (:mod:`actors.materialize`) runs on a meta copy of ``x``: shapes only."""
    if x.device.type != "meta" and any(p.is_meta for p in block.parameters()):
        x = x.to("meta")
    try:
        out = block(x)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - a block that does not fit its input is the user's model
        raise UserCodeError(f"block {index} ({type(block).__name__}) raised {_quote(exc)} on a {tuple(x.shape)} input",
                            traceback.format_exc()) from None
    if not isinstance(out, Tensor):
        raise UserCodeError(f"block {index} ({type(block).__name__}) returned {type(out).__name__}; every block must return one tensor "
                            "(orchestrator.profiling.modules.chain packs tuples and dicts of tensors into one)")
    return out


def loss(loss_fn: Callable[[Tensor, Tensor], Any], out: Tensor, targets: Tensor) -> Tensor:
    """``loss_fn(out, targets)`` checked to be a scalar tensor (backward needs one)."""
    value = call("loss_fn", loss_fn, out, targets)
    if not isinstance(value, Tensor) or value.numel() != 1:
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise UserCodeError(f"loss_fn ({callable_name(loss_fn)}) must return a scalar tensor, got {shape}")
    return value


def prepare_checkpoint_dir(directory: str | os.PathLike[str], what: str = "checkpoint_dir") -> str | Path:
    """Create ``directory`` if needed and prove a file can be written there (found now, not after training)."""
    from actors import storage

    if not storage.is_local(directory):  # s3://, gs://, az://: write and delete a probe object
        storage.check_writable(directory)
        return os.fspath(directory)
    path = Path(storage.local_path(directory))
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".raypipe-write-test.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"{what} {path} is not writable: {exc.strerror or exc}") from None
    return path


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def validate_job(
    model_factory: Callable[[], Any],
    loss_fn: Callable[[Tensor, Tensor], Any],
    optimizer_factory: Callable[[Any], Any],
    data_fn: Callable[[int], Any],
    num_microbatches: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
) -> int:
    """Check the user's pieces on the driver before any actor starts; returns the rows per step.

    One model is built (the same RNG seed as the workers), two rows go through every block and
    the loss, one optimizer is built per block that has parameters, and ``data_fn(0)`` is called
    twice and compared.
    """
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int):
        raise UserError(f"num_microbatches must be an integer, got {num_microbatches!r}")
    if checkpoint_dir is not None:
        prepare_checkpoint_dir(checkpoint_dir)
    with torch.random.fork_rng(devices=[]):  # the driver's RNG stream is the user's, not ours
        return _validate(model_factory, loss_fn, optimizer_factory, data_fn, num_microbatches, seed)


def _validate(
    model_factory: Callable[[], Any],
    loss_fn: Callable[[Tensor, Tensor], Any],
    optimizer_factory: Callable[[Any], Any],
    data_fn: Callable[[int], Any],
    num_microbatches: int,
    seed: int,
) -> int:
    inputs, targets = batch(data_fn, 0)
    rows = int(inputs.shape[0])
    if not 1 <= num_microbatches <= rows:
        raise UserError(f"num_microbatches={num_microbatches} must be between 1 and the {rows} rows data_fn returns per step")
    again = batch(data_fn, 0)
    if not (_same(inputs, again[0]) and _same(targets, again[1])):
        raise UserCodeError(
            f"data_fn ({callable_name(data_fn)}) is not deterministic: two calls of data_fn(0) returned different tensors; "
            "the first and last stages call it separately, so it must depend only on the step"
        )
    torch.manual_seed(seed)
    built = blocks(model_factory)
    x = inputs[:2]  # two rows (when there are): a per-row loss is then visibly not a scalar
    modes = [b.training for b in built]
    try:
        with torch.no_grad():
            for i, b in enumerate(built):
                b.eval()
                x = forward(i, b, x)
            loss(loss_fn, x, targets[:2].to(x.device))
    finally:
        for b, mode in zip(built, modes):
            b.train(mode)
    for i, b in enumerate(built):
        params = list(b.parameters())
        if params:
            optimizer(optimizer_factory, params, i)
    return rows


def probe(built: Sequence[nn.Module], inputs: Tensor) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Trailing shape and dtype of the tensor entering each block (index L: the model output),
    from one row; a block that fails or returns a non-tensor is a :class:`UserCodeError`."""
    modes = [b.training for b in built]
    x = inputs[:1]
    specs = [(tuple(x.shape[1:]), x.dtype)]
    try:
        with torch.no_grad():
            for i, b in enumerate(built):
                b.eval()
                x = forward(i, b, x)
                specs.append((tuple(x.shape[1:]), x.dtype))
    finally:
        for b, mode in zip(built, modes):
            b.train(mode)
    return specs
