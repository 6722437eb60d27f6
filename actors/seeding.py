"""Seeds that do not depend on where a block runs: per (job seed, name) for initialization and
per (job seed, step, micro-batch unit, block) for the random numbers a forward pass draws.

Why: a pipeline stage sees only its own blocks, so "seed once, then build or run everything in
order" (what single-process training does) cannot be reproduced on a stage — the stream a block
would have drawn from depends on everything before it. Keying every draw by names that both
sides know makes the draw a function of the block alone: a stage that materializes only its
blocks gets the weights a whole-model build gets, and a dropout mask drawn on device 3 for
micro-batch 5 of step 7 is the one single-process training draws there.

The current unit is process-global state set by whoever runs forwards (the executor for each
forward action, the reference trainer for each unit); it is read only by the pre-forward hooks
:func:`seed_forward` installs on every block (:func:`seed_block`) and on Hugging Face layers.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor, nn

SEEDED = "_raypipe_seeded"  # attribute on a module whose forward reseeds (its key)

# (job seed, step, (micro-batch, part)) of the forward being run; None outside training
_unit: tuple[int, int, tuple[int, int]] | None = None


def mix(*parts: Any) -> int:
    """A stable 63-bit seed from ``parts`` (the same in every process; Python's hash() is not)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def enter_unit(seed: int, step: int, unit: tuple[int, int]) -> None:
    """Declare the (step, unit) whose forward runs next in this process."""
    global _unit
    _unit = (seed, step, unit)


def leave_unit() -> None:
    global _unit
    _unit = None


def current_unit() -> tuple[int, int, tuple[int, int]] | None:
    return _unit


@contextmanager
def unit(state: tuple[int, int, tuple[int, int]] | None) -> Iterator[None]:
    """Run with ``state`` as the current unit (activation recomputation replays a forward later)."""
    global _unit
    saved, _unit = _unit, state
    try:
        yield
    finally:
        _unit = saved


def _reseed(seed: int, like: Tensor | None) -> None:
    if like is not None and like.is_cuda:
        torch.cuda.manual_seed(seed)
    else:  # torch.manual_seed would also walk lazy CUDA/XPU seeding on every call
        torch.default_generator.manual_seed(seed)


def seed_forward(module: nn.Module, key: str) -> None:
    """Before each forward of ``module`` during training, reseed the generator from
    (job seed, step, unit, ``key``); outside a declared unit nothing changes."""

    def hook(mod: nn.Module, args: tuple[Any, ...]) -> None:
        state = _unit
        if state is None or not mod.training:
            return
        first = next((a for a in args if isinstance(a, Tensor)), None)
        _reseed(mix("forward", state[0], state[1], state[2], key), first)

    module.register_forward_pre_hook(hook)
    setattr(module, SEEDED, key)


def seed_block(block: nn.Module, key: str) -> bool:
    """Seed ``block``'s forward by ``key`` unless it is seeded already. Called on every block a
    stage or the reference builds (:func:`actors.materialize.materialize`), whatever the factory
    did: every random draw of a block (``nn.Dropout``, an attention's functional dropout,
    ``torch.rand`` in a forward) then comes from (step, unit, block), the same in one process and
    on any stage. Submodules a factory seeded itself (Hugging Face layers, by path) reseed again
    inside, identically on both sides. Returns whether a hook was added."""
    if not key or hasattr(block, SEEDED):
        return False
    seed_forward(block, key)
    return True


def has_randomness(module: nn.Module) -> bool:
    """Whether ``module`` contains dropout with a nonzero rate (the draws we know of)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())
