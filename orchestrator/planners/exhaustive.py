"""Every plan structure of a small instance, for ``auto`` to search with bounds.

A *structure* is the stages of a plan without its schedule: contiguous block ranges and, per
stage, a non-empty set of devices (several = data-parallel replicas; sets disjoint, in every
order, devices may stay idle), plus interleaved structures of ``p`` groups with ``v >= 2`` chunks
cut anywhere (``p·v <= MAX_VIRTUAL_STAGES``). ``auto`` times each structure under every schedule
and slicing count it allows, so on these instances its answer is the optimum of the simulator
over that whole space, not the best of the literature planners' guesses.

Two things keep the space small enough to walk at 10 blocks × 8 devices (1.1·10^8 structures of
up to 8 stages listed naively):

* **Symmetry.** Devices that can be swapped without changing any cost (same speed and memory,
  the same links to every other device: the GPUs of one server, usually) form a *class*; a
  structure and its image under such a swap simulate alike, so only one per class-count pattern
  is listed (the lowest-numbered devices of each class go to the earliest stage). A class is a
  run of consecutive device ids, which also keeps a ring all-reduce's order (sorted device ids)
  the same between the two. 8 identical devices: 1.1·10^8 → 21 800; two servers of four: 505 560.
* **Bounds.** Stages are chosen one at a time; a partial structure whose cheapest bound (one
  device group's compute and all-reduces: ``group_sim.work_bound``'s terms) already reaches the
  best time ``auto`` has found is dropped with everything below it. ``auto``'s best-first search
  would never expand such a structure, so dropping it early changes nothing but the time spent.
  With ``rest``, a partial structure is also dropped when the blocks still to place cannot be done
  in time by the devices still free (``auto``: their work at the free devices' summed speed), which
  is what makes clusters of all-different devices (no symmetry) walkable.

:func:`space_size` counts the listed space (without bounds) so ``auto`` knows what it takes on.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol
from math import comb

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import Stage

MAX_VIRTUAL_STAGES = 4
Structure = tuple[Stage, ...]
StageCost = Callable[[int, int, tuple[int, ...]], float]
"""A stage's share of its device group's lower bound: (first block, end block, devices) -> seconds."""
RestCost = Callable[[int, tuple[int, ...]], float]
"""A lower bound for blocks ``[b, L)`` on (a subset of) the given free devices."""
INF = float("inf")


class HeadCost(Protocol):
    """When the first unit reaches each stage (:class:`orchestrator.costmodel.group_sim.FirstUnitPath`): a device
    group is busy no earlier than its first stage's head, so head + cost bounds the group."""

    def forward(self, first: int, last: int, devices: tuple[int, ...]) -> float: ...

    def message(self, boundary: int, src: tuple[int, ...], dst: tuple[int, ...]) -> float: ...


class Budget(Exception):
    """The walk visited more partial structures than it was allowed (it is then not exhaustive)."""


def device_classes(cluster: Cluster) -> list[tuple[int, ...]]:
    """Runs of consecutive devices any two of which can be swapped without changing a cost."""
    sp, mem, eff = cluster.speeds, cluster.memories, cluster.effective
    n = cluster.size

    def swappable(i: int, j: int) -> bool:
        others = [k for k in range(n) if k not in (i, j)]
        return bool(sp[i] == sp[j] and mem[i] == mem[j] and eff[i, j] == eff[j, i]
                    and np.array_equal(eff[i, others], eff[j, others]) and np.array_equal(eff[others, i], eff[others, j]))

    classes: list[list[int]] = []
    for d in range(n):
        if classes and swappable(classes[-1][0], d):
            classes[-1].append(d)
        else:
            classes.append([d])
    return [tuple(c) for c in classes]


def _placements_count(sizes: Sequence[int], k: int) -> int:
    """Ordered k-tuples of disjoint non-empty device sets, one per class-count pattern: by
    inclusion-exclusion over the stages left empty (a class of c devices spreads over the idle
    bin and j stage bins in C(c + j, j) ways)."""
    total = 0
    for i in range(k + 1):
        ways = 1
        for c in sizes:
            ways *= comb(c + k - i, k - i)
        total += (-1) ** i * comb(k, i) * ways
    return total


def _sequences_count(sizes: Sequence[int], kmax: int) -> list[int]:
    """[number of sequences of k classes, class j used at most sizes[j] times, for k = 0..kmax]:
    the straight placements (one device per stage)."""
    ways = [1] + [0] * kmax
    for c in sizes:
        nxt = [0] * (kmax + 1)
        for t, w in enumerate(ways):
            if w:
                for m in range(min(c, kmax - t) + 1):
                    nxt[t + m] += w * comb(t + m, m)  # where the m uses of this class go among t + m
        ways = nxt
    return ways


def space_size(num_blocks: int, classes: Sequence[Sequence[int]], max_stages: int, straight: bool, interleave: bool) -> int:
    """Number of structures :func:`structures` lists without bounds."""
    sizes = [len(c) for c in classes]
    n = sum(sizes)
    kmax = min(max_stages, n)
    seqs = _sequences_count(sizes, kmax) if straight else []

    def placed(k: int) -> int:
        return seqs[k] if straight else _placements_count(sizes, k)

    total = 0
    for k in range(1, min(max_stages, num_blocks, n) + 1):
        total += comb(num_blocks - 1, k - 1) * placed(k)
    if interleave:
        for p, v in _interleavings(num_blocks, n, max_stages):
            total += comb(num_blocks - 1, p * v - 1) * placed(p)
    return total


def _interleavings(num_blocks: int, num_devices: int, max_stages: int) -> Iterator[tuple[int, int]]:
    for p in range(2, min(max_stages, num_devices) + 1):
        for v in range(2, MAX_VIRTUAL_STAGES // p + 1):
            if p * v <= num_blocks:
                yield p, v


def _takes(rem: Sequence[int], straight: bool) -> Iterator[tuple[int, ...]]:
    """Non-empty per-class counts a stage can take from what is left (one device if straight)."""
    if straight:
        for j, r in enumerate(rem):
            if r:
                yield tuple(1 if i == j else 0 for i in range(len(rem)))
        return
    for x in itertools.product(*(range(r + 1) for r in rem)):
        if any(x):
            yield x


def structures(num_blocks: int, classes: Sequence[Sequence[int]], max_stages: int, straight: bool, interleave: bool,
               cost: StageCost | None = None, below: float = INF, budget: int | None = None, rest: RestCost | None = None,
               head: HeadCost | None = None) -> Iterator[Structure]:
    """Every straight structure with up to ``max_stages`` stages, then the interleaved ones, one per
    class-count pattern; with ``cost``, only those whose every device group costs less than
    ``below`` (raises :class:`Budget` after ``budget`` partial structures), and with ``rest`` too,
    only straight partial structures whose unplaced blocks cost less than ``below`` on the free
    devices. With ``head``, each group's cost (and the unplaced blocks') starts when the first unit
    reaches it.

    Why the head: with few micro-batches the fill is a large share of a plan's time, and a bound
    without it keeps millions of deep partial structures the simulator then rejects (10 blocks on 8
    devices that all differ, M = 4: 3.5·10^6 in two minutes before the head, see
    ``benchmarks/results/planner_oracle.md``)."""
    L = num_blocks
    sizes = tuple(len(c) for c in classes)
    n = sum(sizes)
    keep = (lambda c: c * (1 - 1e-9) < below) if cost is not None else (lambda c: True)
    price: StageCost = cost if cost is not None else (lambda a, b, d: 0.0)
    visits = [0]
    made: dict[tuple[int, int, tuple[int, ...]], Stage] = {}

    def devices(off: Sequence[int], x: Sequence[int]) -> tuple[int, ...]:
        return tuple(sorted(d for j, c in enumerate(classes) for d in c[off[j]: off[j] + x[j]]))

    def stage_of(a: int, b: int, devs: tuple[int, ...]) -> Stage:
        """One Stage object per (blocks, devices): the walk builds the same ones over and over."""
        key = (a, b, devs)
        got = made.get(key)
        if got is None:
            got = made[key] = Stage(a, b, devs)
        return got

    rest_cache: dict[tuple[int, tuple[int, ...]], float] = {}

    def rest_ok(b: int, off: tuple[int, ...], start: float) -> bool:
        if rest is None:
            return True
        key = (b, off)
        got = rest_cache.get(key)
        if got is None:
            free = tuple(d for j, c in enumerate(classes) for d in c[off[j]:])
            got = rest_cache[key] = rest(b, free) if free else INF
        return keep(start + got)

    def hop(boundary: int, src: tuple[int, ...] | None, dst: tuple[int, ...]) -> float:
        return 0.0 if head is None or src is None else head.message(boundary, src, dst)

    def ahead(a: int, b: int, devs: tuple[int, ...]) -> float:
        return 0.0 if head is None else head.forward(a, b, devs)

    def tick() -> None:
        visits[0] += 1
        if budget is not None and visits[0] > budget:
            raise Budget

    def straight_from(k: int, s: int, a: int, off: tuple[int, ...], done: tuple[Stage, ...], h: float) -> Iterator[Structure]:
        """Stage ``s`` of ``k`` from block ``a`` on; ``h``: when the first unit left the stage before (its head
        plus its forward), the message to this stage not yet counted."""
        rem = tuple(c - o for c, o in zip(sizes, off))
        last = s == k - 1
        for x in _takes(rem, straight):
            devs = devices(off, x)
            nxt = tuple(o + t for o, t in zip(off, x))
            start = h + hop(a, done[-1].devices if done else None, devs)
            for b in ((L,) if last else range(a + 1, L - (k - 1 - s) + 1)):
                tick()
                if not keep(start + price(a, b, devs)):
                    break  # more blocks on the same devices only cost more
                stage = stage_of(a, b, devs)
                if last:
                    yield (*done, stage)
                else:
                    left = start + ahead(a, b, devs)
                    if rest_ok(b, nxt, left):
                        yield from straight_from(k, s + 1, b, nxt, (*done, stage), left)

    def groups_from(p: int, off: tuple[int, ...], done: tuple[tuple[int, ...], ...]) -> Iterator[tuple[tuple[int, ...], ...]]:
        if len(done) == p:
            yield done
            return
        rem = tuple(c - o for c, o in zip(sizes, off))
        for x in _takes(rem, straight):
            yield from groups_from(p, tuple(o + t for o, t in zip(off, x)), (*done, devices(off, x)))

    def chunks_from(groups: tuple[tuple[int, ...], ...], total: int, i: int, a: int, sums: tuple[float, ...], done: tuple[Stage, ...],
                    h: float, starts: tuple[float, ...]) -> Iterator[Structure]:
        """Chunk ``i`` from block ``a`` on; ``sums``: each group's cost so far, ``starts``: the heads of the groups
        placed so far (a group is busy from its first chunk's head), ``h``: as in ``straight_from``."""
        p = len(groups)
        g = i % p
        last = i == total - 1
        at = h + hop(a, groups[(i - 1) % p] if i else None, groups[g])
        begins = starts if i >= p else (*starts, at)
        for b in ((L,) if last else range(a + 1, L - (total - 1 - i) + 1)):
            tick()
            spent = sums[g] + price(a, b, groups[g])
            if not keep(begins[g] + spent):
                break
            stage = stage_of(a, b, groups[g])
            if last:
                yield (*done, stage)
            else:
                yield from chunks_from(groups, total, i + 1, b, sums[:g] + (spent,) + sums[g + 1:], (*done, stage),
                                       at + ahead(a, b, groups[g]), begins)

    zero = tuple(0 for _ in sizes)
    for k in range(1, min(max_stages, L, n) + 1):
        yield from straight_from(k, 0, 0, zero, (), 0.0)
    if not interleave:
        return
    for p, v in _interleavings(L, n, max_stages):
        for groups in groups_from(p, zero, ()):
            yield from chunks_from(groups, p * v, 0, 0, tuple(0.0 for _ in groups), (), 0.0, ())
