"""Measure a list of blocks on this machine and produce a :class:`Profile`.

Planners need per-block forward and backward time, the bytes each block hands to the next
(what a stage boundary must send), parameter bytes (what a stage must hold) and stash bytes
(what a stage keeps per in-flight micro-batch for the backward pass), and how the backward splits
into its input-gradient and weight-gradient parts (zero-bubble schedules run them apart: the
split is timed with the executor's own ``BI``/``W`` halves, :mod:`actors.backward_split`, and
``weight_s`` is the weight half's share of the whole backward). Each block is timed in
isolation on a detached copy of its input, so the backward time covers exactly that block and
not its predecessors. Medians are used because the first iterations and occasional OS/driver
hiccups produce outliers that a mean would fold into the plan.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from actors import user_code
from actors.backward_split import backward_input
from actors.materialize import materialize, on_meta
from orchestrator.core.errors import UserError
from orchestrator.profiling.models import EXAMPLE_MODELS, example_batch, load_factory, resolve_spec
from orchestrator.core.profile import Block, Profile

_DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
_INT_DTYPES = {"long": torch.int64, "int64": torch.int64, "int": torch.int32, "int32": torch.int32}


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class _StashMeter:
    """Sum the bytes autograd saves for backward during a forward pass.

    Parameters are excluded (a stage holds them anyway, whatever is in flight) and storages
    saved twice (e.g. a tensor and its transpose) are counted once.
    """

    def __init__(self, params: set[int]) -> None:
        self.params = params
        self.storages: dict[int, int] = {}

    def pack(self, t: Tensor) -> Tensor:
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in self.params:
                self.storages[ptr] = max(self.storages.get(ptr, 0), storage.nbytes())
        except (RuntimeError, NotImplementedError):  # sparse/meta tensors have no plain storage
            self.storages[id(t)] = _nbytes(t)
        return t

    @staticmethod
    def unpack(t: Tensor) -> Tensor:
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def _as_input(t: Tensor, first: bool = False) -> Tensor:
    """A detached leaf; floating inputs require grad so backward reaches the block's input — except the first
    block's, which is the data batch: the runtime never computes a gradient for it, so neither does its timing."""
    x = t.detach()
    return x.requires_grad_(True) if x.is_floating_point() and not first else x


def _measure_block(block: nn.Module, x: Tensor, warmup: int, repeats: int, sync: Callable[[], None]) -> tuple[
    float, float, Tensor, int, float
]:
    """(median forward s, median backward s, output, stash bytes, weight share of the backward) for one block."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    meter = _StashMeter(params)
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        out = block(x)
    if not isinstance(out, Tensor):
        raise UserError(f"block {type(block).__name__} returned {type(out).__name__}; blocks must return one tensor")
    differentiable = out.requires_grad and out.is_floating_point()
    grad = torch.ones_like(out) if differentiable else None
    fwd: list[float] = []
    bwd: list[float] = []
    for i in range(warmup + repeats):
        sync()
        start = time.perf_counter()
        y = block(x)
        sync()
        mid = time.perf_counter()
        if differentiable:
            y.backward(grad)
            sync()
        end = time.perf_counter()
        if i >= warmup:
            fwd.append(mid - start)
            bwd.append(end - mid if differentiable else 0.0)
        block.zero_grad(set_to_none=True)
        x.grad = None
    return statistics.median(fwd), statistics.median(bwd), out.detach(), meter.total, _weight_share(block, x, grad, warmup, repeats, sync)


def _weight_share(block: nn.Module, x: Tensor, grad: Tensor | None, warmup: int, repeats: int, sync: Callable[[], None]) -> float:
    """Median share of the weight half ``W`` in a split backward's ``BI`` + ``W`` time.

    An input that needs no gradient (token ids) leaves everything to ``W`` (share 1); a block
    without parameters has no ``W`` (share 0)."""
    params = [p for p in block.parameters() if p.requires_grad]
    if grad is None or not params:
        return 0.0
    if not x.requires_grad:
        return 1.0

    def whole(o: Tensor, g: Tensor) -> None:
        torch.autograd.backward(o, g)

    shares: list[float] = []
    for i in range(warmup + repeats):
        y = block(x)
        sync()
        start = time.perf_counter()
        _, pending = backward_input(y, grad, x, params, whole)
        sync()
        mid = time.perf_counter()
        pending.run(params, whole)
        sync()
        end = time.perf_counter()
        if i >= warmup and end > start:
            shares.append((end - mid) / (end - start))
        block.zero_grad(set_to_none=True)
        x.grad = None
    return statistics.median(shares) if shares else 0.5


def profile_blocks(
    blocks: Sequence[nn.Module], sample_input: Tensor, name: str, microbatch_size: int,
    warmup: int = 2, repeats: int = 5, device: str | None = None,
) -> Profile:
    """Profile ``blocks`` as a chain, feeding ``sample_input`` (one micro-batch) to the first.

    Blocks built on the meta device are materialized one at a time and released after their
    measurement, so a model larger than this host's memory can be profiled.

    Blocks are moved to ``device`` (default: CUDA when available, else CPU) in place. Backward
    time is measured with an all-ones upstream gradient of the output's shape; the value does not
    matter for timing, only the shape does.
    """
    if not blocks:
        raise UserError(f"profile {name!r}: no blocks to profile")
    if repeats < 1 or warmup < 0:
        raise UserError("profiling needs repeats >= 1 and warmup >= 0")
    dev = torch.device(device or _default_device())
    sync: Callable[[], None] = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    x = sample_input.to(dev)
    input_bytes = float(_nbytes(x))
    measured: list[Block] = []
    for i, block in enumerate(blocks):
        lazy = on_meta(block)  # built on the meta device: real weights for this block only, then dropped
        materialize(block, dev, seed=0, fallback_path=f"block{i}")
        fwd, bwd, out, stash, share = _measure_block(block, _as_input(x, first=i == 0), warmup, repeats, sync)
        if lazy:
            block.to("meta")
        measured.append(
            Block(
                name=f"{i}:{type(block).__name__}",
                forward_s=fwd,
                backward_s=bwd,
                activation_bytes=float(_nbytes(out)),
                param_bytes=float(sum(_nbytes(p) for p in block.parameters())),
                stash_bytes=float(stash),
                weight_s=bwd * share,
            )
        )
        x = out
    source = f"profiled on {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}"
    return Profile(name, tuple(measured), microbatch_size, input_bytes, source)


def profile_example(
    name: str, microbatch_size: int, seed: int = 0, model_kwargs: Mapping[str, Any] | None = None, **kw: Any
) -> Profile:
    """Profile a built-in model from :data:`EXAMPLE_MODELS`; ``kw`` goes to :func:`profile_blocks`."""
    if name not in EXAMPLE_MODELS:
        raise UserError(f"unknown example model {name!r} (choose from {', '.join(sorted(EXAMPLE_MODELS))})")
    model_kwargs = dict(model_kwargs or {})
    torch.manual_seed(seed)
    blocks = EXAMPLE_MODELS[name](**model_kwargs)
    inputs, _ = example_batch(name, microbatch_size, seed, **model_kwargs)
    return profile_blocks(blocks, inputs, name, microbatch_size, **kw)


def sample_input(microbatch_size: int, shape: Sequence[int], dtype: str = "float32", vocab: int | None = None,
                 seed: int = 0) -> Tensor:
    """A random micro-batch of ``shape`` (one sample, no batch dimension): floats for
    image/feature models, or token ids below ``vocab`` for an integer ``dtype`` (``long``)."""
    gen = torch.Generator().manual_seed(seed)
    full = (microbatch_size, *(int(d) for d in shape))
    if any(d < 1 for d in full):
        raise UserError(f"--input-shape {list(full[1:])} must be positive integers")
    if dtype in _INT_DTYPES:
        if vocab is None or vocab < 1:
            raise UserError(f"--input-dtype {dtype} needs --vocab N (token ids are drawn from 0 .. N-1)")
        return torch.randint(0, vocab, full, generator=gen, dtype=_INT_DTYPES[dtype])
    if dtype not in _DTYPES:
        raise UserError(f"--input-dtype {dtype!r} not supported (choose from {', '.join([*_DTYPES, *_INT_DTYPES])})")
    if vocab is not None:
        raise UserError(f"--vocab goes with an integer --input-dtype (long), not {dtype}")
    return torch.randn(full, generator=gen).to(_DTYPES[dtype])


def profile_factory(
    spec: str, microbatch_size: int, input_shape: Sequence[int] | None = None, dtype: str = "float32",
    seed: int = 0, name: str | None = None, vocab: int | None = None, **kw: Any,
) -> Profile:
    """Profile a user model given as ``"module:factory"`` (or ``"file.py:factory"``); the module
    is imported as ``python -c`` would (the current directory on the path).

    The sample micro-batch comes from, in order of preference:

    * ``input_shape`` (the CLI's ``--input-shape``): the shape of ONE sample, without the batch
      dimension; random floats of ``dtype``, or token ids below ``vocab`` for an integer
      ``dtype`` (``--input-dtype long --vocab N``). Random values time the same as real ones.
    * ``example_input(batch_size)`` defined in the factory's module, returning one tensor.

    A user expects the explicit flag to win over a convention, hence that order.
    """
    module, _ = resolve_spec(spec)
    build = load_factory(spec)
    if input_shape is not None:
        sample = sample_input(microbatch_size, input_shape, dtype, vocab, seed)
    elif callable(getattr(module, "example_input", None)):
        sample = user_code.call("example_input", module.example_input, microbatch_size)
        if not isinstance(sample, Tensor):
            raise UserError(f"{spec}: example_input() must return a torch.Tensor, got {type(sample).__name__}")
    else:
        raise UserError(
            f"{spec}: cannot build a sample input; pass --input-shape (one sample, no batch dim; with --input-dtype long "
            "--vocab N for token ids) or define example_input(batch_size) in the factory's module"
        )
    torch.manual_seed(seed)
    blocks = user_code.blocks(build)
    user_code.probe(blocks, sample)  # blocks that do not chain: one line naming the block, not a torch traceback
    return profile_blocks(blocks, sample, name or spec.rpartition(":")[2], microbatch_size, **kw)


def profile_hf(config: Any, microbatch_size: int, seq_len: int | None = None, seed: int = 0, **kw: Any) -> Profile:
    """Profile a Hugging Face causal LM built from ``config`` (:func:`orchestrator.profiling.hf.causal_lm_blocks`,
    one block materialized at a time) on random token ids of ``seq_len`` (default: up to 128)."""
    from orchestrator.profiling import hf

    blocks = hf.causal_lm_blocks(config)
    limit = int(getattr(config, "max_position_embeddings", 0) or 128)
    seq = seq_len if seq_len is not None else min(128, limit)
    if not 1 <= seq <= limit:
        raise UserError(f"a sequence of {seq} tokens does not fit {type(config).__name__} (max_position_embeddings={limit})")
    sample = sample_input(microbatch_size, (seq,), "long", int(config.vocab_size), seed)
    user_code.probe(blocks, sample)
    return profile_blocks(blocks, sample, str(config.model_type), microbatch_size, **kw)
