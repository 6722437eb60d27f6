"""Fewer, larger blocks for a planner whose cost grows too fast with the chain's length.

A graph.txt chain keeps one block per node with training work (a NASNet has over a thousand), so
that every prefix a plan could end a stage at is there. Thinning belongs to the planner that
cannot afford the length, not to the loader: PipeDream's vectorized DP plans 384-block chains in
about a second, while ``auto`` simulates candidates per structure and stays at 256 (see
:attr:`orchestrator.planners.options.PlannerSpec.max_blocks`). A loader that thinned every
profile to 256 blocks dropped the cuts that two of PipeDream's published optima end a stage at
(resnet101 on 4 GPUs, densenet121 on 8: 0.20% and 0.08% slower plans).
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

import numpy as np

from orchestrator.core.errors import UserError
from orchestrator.core.profile import Profile


def thin(cuts: Sequence[int], crossing: np.ndarray, work: np.ndarray, max_blocks: int) -> list[int]:
    """At most ``max_blocks - 1`` of ``cuts`` (positions), dropping the least useful first.

    A stage rarely needs to end within a fraction of a percent of the model's work of its ideal
    place, so cuts are removed one at a time, each time the one whose two neighbouring blocks
    together hold the least work (the finest resolution lost), but a cut with fewer bytes crossing
    than both neighbouring cuts goes only after all the others: communication-bound plans are made
    of those. ``crossing[k]`` is the bytes crossing a cut after position ``k``, ``work[k]`` the
    cumulative compute up to and including position ``k``.
    """
    if max_blocks < 1:
        raise UserError(f"max_blocks must be >= 1, got {max_blocks}")
    total = count = len(cuts)
    if count < max_blocks:
        return list(cuts)
    at = np.asarray(cuts, dtype=np.int64)
    cut_bytes = crossing[at]
    upto = np.concatenate([[0.0], work[at], [work[-1]]])  # cumulative work at cut i is upto[i + 1]
    left = list(range(-1, count - 1))
    right = list(range(1, count + 1))  # neighbours; -1 and ``total`` are the chain's ends
    alive = [True] * count
    version = [0] * count

    def key(i: int) -> tuple[bool, float]:
        lb = cut_bytes[left[i]] if left[i] >= 0 else math.inf
        rb = cut_bytes[right[i]] if right[i] < total else math.inf
        return (bool(cut_bytes[i] < min(lb, rb)), float(upto[right[i] + 1] - upto[left[i] + 1]))

    heap = [(key(i), i, 0) for i in range(count)]
    heapq.heapify(heap)
    while count >= max_blocks:
        _, i, ver = heapq.heappop(heap)
        if not alive[i] or ver != version[i]:
            continue
        alive[i] = False
        count -= 1
        lo, hi = left[i], right[i]
        if lo >= 0:
            right[lo] = hi
        if hi < total:
            left[hi] = lo
        for j in (lo, hi):
            if 0 <= j < total:
                version[j] += 1
                heapq.heappush(heap, (key(j), j, version[j]))
    return [c for c, keep in zip(cuts, alive) if keep]


def coarse_groups(profile: Profile, max_blocks: int) -> tuple[tuple[int, int], ...]:
    """``[first, last)`` block ranges, at most ``max_blocks`` of them, that :meth:`Profile.coarsened`
    merges: the boundaries :func:`thin` keeps of the profile's own."""
    L = profile.num_blocks
    work = np.cumsum([b.forward_s + b.backward_s for b in profile.blocks])
    kept = thin(range(L - 1), np.asarray(profile.activations, dtype=np.float64), work, max_blocks)
    bounds = [0] + [k + 1 for k in kept] + [L]
    return tuple(zip(bounds[:-1], bounds[1:]))
