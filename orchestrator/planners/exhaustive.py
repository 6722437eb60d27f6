"""Every plan structure of a small instance, for ``auto`` to search with bounds.

A *structure* is the stages of a plan without its schedule: contiguous block ranges and, per
stage, a non-empty set of devices (several = data-parallel replicas; sets disjoint, in every
order, devices may stay idle), plus interleaved structures of ``p`` groups with ``v >= 2`` chunks
cut anywhere (``p·v <= MAX_VIRTUAL_STAGES``). ``auto`` times each structure under every schedule
and slicing count it allows, so on instances this small its answer is the optimum of the
simulator over that whole space, not the best of the literature planners' guesses.

The space grows as ``(k+1)^devices × C(blocks−1, k−1)``; :func:`space_size` counts it (by
inclusion–exclusion, without enumerating) so ``auto`` enumerates only when it is small.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from math import comb

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import Stage

MAX_VIRTUAL_STAGES = 4
MAX_SYMMETRY_DEVICES = 6
Structure = tuple[Stage, ...]


def count_placements(n: int, k: int, straight: bool) -> int:
    """Ordered k-tuples of disjoint non-empty device sets out of n devices (singletons if straight)."""
    if straight:
        return comb(n, k) * _factorial(k) if k <= n else 0
    return sum((-1) ** i * comb(k, i) * (k + 1 - i) ** n for i in range(k + 1))


def _factorial(k: int) -> int:
    out = 1
    for i in range(2, k + 1):
        out *= i
    return out


def space_size(num_blocks: int, num_devices: int, max_stages: int, straight: bool, interleave: bool) -> int:
    """Number of structures :func:`structures` yields."""
    total = 0
    for k in range(1, min(max_stages, num_blocks, num_devices) + 1):
        total += comb(num_blocks - 1, k - 1) * count_placements(num_devices, k, straight)
    if interleave:
        for p in range(2, min(max_stages, num_devices) + 1):
            for v in range(2, MAX_VIRTUAL_STAGES // p + 1):
                if p * v <= num_blocks:
                    total += comb(num_blocks - 1, p * v - 1) * count_placements(num_devices, p, straight)
    return total


def placements(n: int, k: int, straight: bool) -> Iterator[tuple[tuple[int, ...], ...]]:
    if straight:
        for perm in itertools.permutations(range(n), k):
            yield tuple((d,) for d in perm)
        return
    for owner in itertools.product(range(k + 1), repeat=n):  # 0 = idle, s = stage s-1
        groups = tuple(tuple(d for d in range(n) if owner[d] == s + 1) for s in range(k))
        if all(groups):
            yield groups


def automorphisms(cluster: Cluster) -> list[tuple[int, ...]]:
    """Device permutations that leave every cost unchanged (speeds, memories, effective links):
    a structure and its image under one simulate alike, so only one of them needs timing.
    Clusters of more than ``MAX_SYMMETRY_DEVICES`` devices get the identity only."""
    n = cluster.size
    ident = tuple(range(n))
    if n > MAX_SYMMETRY_DEVICES:
        return [ident]
    sp, mem, eff = cluster.speeds, cluster.memories, cluster.effective
    out = []
    for perm in itertools.permutations(range(n)):
        P = np.array(perm)
        if np.array_equal(sp[P], sp) and np.array_equal(mem[P], mem) and np.array_equal(eff[np.ix_(P, P)], eff):
            out.append(perm)
    return out


def _canonical(stages: Structure, autos: list[tuple[int, ...]]) -> bool:
    """Whether ``stages`` is the least image of itself under the automorphisms."""
    key = tuple((s.first, s.last, s.devices) for s in stages)
    for perm in autos:
        if tuple((s.first, s.last, tuple(perm[d] for d in s.devices)) for s in stages) < key:
            return False
    return True


def structures(num_blocks: int, num_devices: int, max_stages: int, straight: bool, interleave: bool, autos: list[tuple[int, ...]] | None = None) -> Iterator[Structure]:
    """Every straight structure with up to ``max_stages`` stages, then the interleaved ones; with
    ``autos``, one structure per class of structures the automorphisms map onto each other."""
    if autos is not None and len(autos) > 1:
        for st in structures(num_blocks, num_devices, max_stages, straight, interleave):
            if _canonical(st, autos):
                yield st
        return
    L = num_blocks
    for k in range(1, min(max_stages, L, num_devices) + 1):
        for groups in placements(num_devices, k, straight):
            for inner in itertools.combinations(range(1, L), k - 1):
                cuts = (0, *inner, L)
                yield tuple(Stage(cuts[i], cuts[i + 1], groups[i]) for i in range(k))
    if not interleave:
        return
    for p in range(2, min(max_stages, num_devices) + 1):
        for v in range(2, MAX_VIRTUAL_STAGES // p + 1):
            if p * v > L:
                continue
            for groups in placements(num_devices, p, straight):
                for inner in itertools.combinations(range(1, L), p * v - 1):
                    cuts = (0, *inner, L)
                    yield tuple(Stage(cuts[i], cuts[i + 1], groups[i % p]) for i in range(p * v))
