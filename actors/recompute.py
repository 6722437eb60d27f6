"""Activation recomputation of a stage: keep only its input, run its forward again in backward.

``torch.utils.checkpoint`` (non-reentrant) restores the RNG state for the second forward, but
our dropout seeds come from the current (step, unit) that the executor declares before each
forward (:mod:`actors.seeding`) — by the time backward recomputes, another unit is current. The
unit is therefore captured with the first forward and declared again around the recomputation,
so the recomputed masks are the original ones and training stays exact.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from actors import seeding


def checkpointed(run: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``run(x)`` that saves only ``x`` for backward and recomputes the rest."""
    state = seeding.current_unit()

    def replay(t: Tensor) -> Tensor:
        with seeding.unit(state):
            return run(t)

    # no early stop: it ends the recomputation by raising through the blocks, which the executor
    # would report as the user's block failing
    with set_checkpoint_early_stop(False):
        out = checkpoint(replay, x, use_reentrant=False, preserve_rng_state=True)
    assert isinstance(out, Tensor)
    return out
