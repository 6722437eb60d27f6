"""Incremental moves: the candidate plans that differ from the current one in two workers.

A *worker* here is a stage's device group (one device in a straight pipeline; the replicas of a
stage otherwise); an idle live device is a worker of its own with no blocks. Every candidate
changes the block set or replica set of exactly two workers, so a live switch touches two actors
and everybody else keeps running (AutoPipe-Hu's design). The families:

========== ============================================================== ==============
kind       change                                                          count
========== ============================================================== ==============
SHIFT      move the boundary between stages i, i+1 to any block of theirs  O(L)
SWAP       exchange the device groups of stages i and j                    O(S²)
SWAP_SHIFT exchange adjacent groups and move their boundary                O(L)
REPLICA    move one replica of stage i to stage j                          O(N·S)
GROW       an idle device joins stage j as a replica, or takes the head   O(I·L)
           or tail run of stage j's blocks as a new stage
MERGE      a one-device stage's blocks go to its neighbour; it goes idle  O(S)
FUSE       two adjacent stages become one stage replicated on both groups O(S)
FISSION    one replica of stage i leaves with its head or tail run        O(N·L)
========== ============================================================== ==============

``straight`` (no replication, as PipeDream's ``--straight_pipeline``) keeps only the families
that leave every stage on one device.

with L blocks, S stages, N devices and I idle devices — O(L²) in all, since S, N ≤ L.

:func:`walk` repeats the best single move on the cost model (:class:`CostModel`), accepting a
move when it lowers the estimate or keeps it and improves balance (lexicographic descent, so it
terminates and crosses bottleneck plateaus). This is how the controller reaches — move by move,
each one a cheap live switch — the partition a full re-plan would choose.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterable, Sequence

import numpy as np

from orchestrator.core.plan import Plan
from orchestrator.costmodel.estimate import CostModel, Layout


class MoveKind(str, Enum):
    SHIFT = "shift"
    SWAP = "swap"
    SWAP_SHIFT = "swap_shift"
    REPLICA = "replica"
    GROW = "grow"
    MERGE = "merge"
    FUSE = "fuse"
    FISSION = "fission"


@dataclass(frozen=True, slots=True)
class Move:
    kind: MoveKind
    layout: Layout
    note: str = ""


def workers_touched(old: Layout, new: Layout, alive: Iterable[int]) -> set[tuple[int, ...]]:
    """Workers (device groups; idle devices as singletons) holding a device whose block range or
    replica group differs between ``old`` and ``new``: those of ``old`` or those of ``new``,
    whichever are more (a fission turns one worker into two). Candidates touch exactly two."""

    def assignment(lay: Layout) -> dict[int, tuple[int, int, tuple[int, ...]]]:
        return {d: (lay.cuts[s], lay.cuts[s + 1], g) for s, g in enumerate(lay.groups) for d in g}

    before, after = assignment(old), assignment(new)
    changed = {d for d in set(before) | set(after) if before.get(d) != after.get(d)}
    sides = []
    for lay in (old, new):
        worker_of = {d: g for g in lay.groups for d in g}
        sides.append({worker_of.get(d, (d,)) for d in changed})
    return max(sides, key=len)


@dataclass(frozen=True)
class Walk:
    """A sequence of moves from ``start`` and the cost-model estimate before and after each."""

    start: Layout
    moves: tuple[Move, ...]
    estimates: tuple[float, ...]  # estimates[0] = start, estimates[k] = after k moves

    @property
    def end(self) -> Layout:
        return self.moves[-1].layout if self.moves else self.start

    def plans(self, template: Plan) -> list[Plan]:
        return [m.layout.to_plan(template) for m in self.moves]


class Candidates:
    """Every two-worker neighbour of a layout (the families above), held as arrays. The order is
    fixed (tests compare it with a plain Layout-by-Layout enumeration, ``tests/move_oracle.py``).

    The O(L) families (boundary shifts, swap-shifts, an idle device taking a run of blocks, a
    replica leaving with a run) are built with numpy broadcasts, one block of rows per
    (family, stage); the few others row by row. Rows are ranked with one
    :meth:`CostModel.estimate_arrays` call per pipeline depth, and only the chosen rows become
    :class:`Move` objects (:meth:`move`), so a walk step allocates no per-candidate Python objects.
    """

    def __init__(self, layout: Layout, alive: Iterable[int], straight: bool, model: CostModel) -> None:
        self.model = model
        # blocks: (cuts [m, S'+1], gids [m, S'], describe(row) -> (kind, note))
        self._blocks: list[tuple[np.ndarray, np.ndarray, Callable[[int], tuple[MoveKind, str]]]] = []
        self._build(layout, alive, straight)
        self.offsets = np.cumsum([0] + [len(b[0]) for b in self._blocks])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _add(self, cuts: np.ndarray, gids: np.ndarray, describe: Callable[[int], tuple[MoveKind, str]]) -> None:
        if len(cuts):
            self._blocks.append((cuts, gids, describe))

    def _rows(self, rows: list[tuple[Sequence[int], Sequence[tuple[int, ...]], MoveKind, str]]) -> None:
        """Append row-by-row candidates (consecutive rows of one depth share a block)."""
        self.model.group_ids(g for r in rows for g in r[1])  # register unseen groups in one go
        k = 0
        while k < len(rows):
            j = k
            while j < len(rows) and len(rows[j][1]) == len(rows[k][1]):
                j += 1
            chunk = rows[k:j]
            cuts = np.array([r[0] for r in chunk], dtype=np.int64)
            gids = np.array([self.model.group_ids(r[1]) for r in chunk], dtype=np.int64)
            info = [(r[2], r[3]) for r in chunk]
            self._add(cuts, gids, info.__getitem__)
            k = j

    def _build(self, layout: Layout, alive: Iterable[int], straight: bool) -> None:
        cuts_t, groups = layout.cuts, list(layout.groups)
        cuts = np.array(cuts_t, dtype=np.int64)
        S = len(groups)
        idle = sorted(set(alive) - layout.devices)
        g = np.array(self.model.group_ids(groups), dtype=np.int64)
        # SHIFT / SWAP_SHIFT, interleaved per new cut
        for i in range(S - 1):
            cs = np.arange(cuts_t[i] + 1, cuts_t[i + 2], dtype=np.int64)
            cs = cs[cs != cuts_t[i + 1]]
            if not len(cs):
                continue
            nc = np.repeat(cuts[None, :], 2 * len(cs), axis=0)
            nc[:, i + 1] = np.repeat(cs, 2)
            sw = g.copy()
            sw[i], sw[i + 1] = g[i + 1], g[i]
            ng = np.empty((2 * len(cs), S), dtype=np.int64)
            ng[0::2], ng[1::2] = g, sw

            def shift(r: int, i: int = i, cs: np.ndarray = cs) -> tuple[MoveKind, str]:
                c = int(cs[r // 2])
                if r % 2 == 0:
                    return MoveKind.SHIFT, f"cut {i}: {cuts_t[i + 1]}->{c}"
                return MoveKind.SWAP_SHIFT, f"swap {i},{i + 1}; cut {cuts_t[i + 1]}->{c}"

            self._add(nc, ng, shift)
        pairs = [(i, j) for i in range(S) for j in range(i + 1, S)]
        if pairs:
            ng = np.repeat(g[None, :], len(pairs), axis=0)
            a, b = np.array(pairs, dtype=np.int64).T
            rows = np.arange(len(pairs))
            ng[rows, a], ng[rows, b] = g[b], g[a]
            self._add(np.repeat(cuts[None, :], len(pairs), axis=0), ng,
                      lambda r: (MoveKind.SWAP, f"swap {pairs[r][0]},{pairs[r][1]}"))
        rows_: list[tuple[Sequence[int], Sequence[tuple[int, ...]], MoveKind, str]] = []
        for i in range(S):
            if len(groups[i]) < 2 or straight:
                continue
            for d in groups[i]:
                for j in range(S):
                    if j != i:
                        gg = list(groups)
                        gg[i] = tuple(x for x in groups[i] if x != d)
                        gg[j] = groups[j] + (d,)
                        rows_.append((cuts_t, gg, MoveKind.REPLICA, f"device {d}: stage {i}->{j}"))
        self._rows(rows_)
        if idle and not straight:  # register the grown groups in one go
            self.model.group_ids([(d,) for d in idle] + [groups[j] + (d,) for d in idle for j in range(S)])
        for d in idle:
            (dg,) = self.model.group_ids([(d,)])
            for j in range(S):
                if not straight:
                    gg = list(groups)
                    gg[j] = groups[j] + (d,)
                    self._rows([(cuts_t, gg, MoveKind.GROW, f"device {d} replicates stage {j}")])
                cs = np.arange(cuts_t[j] + 1, cuts_t[j + 1], dtype=np.int64)
                if not len(cs):
                    continue
                nc = np.empty((2 * len(cs), S + 2), dtype=np.int64)
                nc[:, : j + 1], nc[:, j + 1], nc[:, j + 2 :] = cuts[: j + 1], np.repeat(cs, 2), cuts[j + 1 :]
                ng = np.empty((2 * len(cs), S + 1), dtype=np.int64)
                ng[:, :j], ng[:, j + 2 :] = g[:j], g[j + 1 :]
                ng[0::2, j], ng[0::2, j + 1] = g[j], dg  # takes the tail
                ng[1::2, j], ng[1::2, j + 1] = dg, g[j]  # takes the head

                def grow(r: int, d: int = d, j: int = j, cs: np.ndarray = cs) -> tuple[MoveKind, str]:
                    c = int(cs[r // 2])
                    if r % 2 == 0:
                        return MoveKind.GROW, f"device {d} takes [{c},{cuts_t[j + 1]})"
                    return MoveKind.GROW, f"device {d} takes [{cuts_t[j]},{c})"

                self._add(nc, ng, grow)
        rows_ = []
        for i in range(S):
            if S < 2 or len(groups[i]) > 1:
                continue
            if i + 1 < S:
                rows_.append((cuts_t[: i + 1] + cuts_t[i + 2 :], groups[:i] + groups[i + 1 :], MoveKind.MERGE, f"stage {i} into {i + 1}"))
            if i > 0:
                rows_.append((cuts_t[:i] + cuts_t[i + 1 :], groups[:i] + groups[i + 1 :], MoveKind.MERGE, f"stage {i} into {i - 1}"))
        self._rows(rows_)
        if straight:
            return
        self._rows([(cuts_t[: i + 1] + cuts_t[i + 2 :], groups[:i] + [groups[i] + groups[i + 1]] + groups[i + 2 :], MoveKind.FUSE,
                     f"fuse {i},{i + 1}") for i in range(S - 1)])
        self.model.group_ids(g for i in range(S) if len(groups[i]) > 1 for d in groups[i]
                             for g in ((d,), tuple(x for x in groups[i] if x != d)))
        for i in range(S):
            if len(groups[i]) < 2:
                continue
            # with two replicas, "a leaves with the tail" = "b leaves with the head": the second
            # device's rows would all repeat the first's (the plain enumeration drops them as seen)
            leavers = groups[i][:1] if len(groups[i]) == 2 else groups[i]
            cs = np.arange(cuts_t[i] + 1, cuts_t[i + 1], dtype=np.int64)
            if not len(cs):
                continue
            for d in leavers:
                rest = tuple(x for x in groups[i] if x != d)
                dg, rg = self.model.group_ids([(d,), rest])
                nc = np.empty((2 * len(cs), S + 2), dtype=np.int64)
                nc[:, : i + 1], nc[:, i + 1], nc[:, i + 2 :] = cuts[: i + 1], np.repeat(cs, 2), cuts[i + 1 :]
                ng = np.empty((2 * len(cs), S + 1), dtype=np.int64)
                ng[:, :i], ng[:, i + 2 :] = g[:i], g[i + 1 :]
                ng[0::2, i], ng[0::2, i + 1] = rg, dg  # leaves with the tail
                ng[1::2, i], ng[1::2, i + 1] = dg, rg  # leaves with the head

                def fission(r: int, d: int = d, i: int = i) -> tuple[MoveKind, str]:
                    return MoveKind.FISSION, f"device {d} leaves stage {i} with its {'tail' if r % 2 == 0 else 'head'}"

                self._add(nc, ng, fission)

    def estimate(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(time, balance, fits) of every candidate, in enumeration order."""
        n = len(self)
        t, b, ok = np.full(n, np.inf), np.full(n, np.inf), np.zeros(n, dtype=bool)
        by_depth: dict[int, list[int]] = {}
        for k, blk in enumerate(self._blocks):
            by_depth.setdefault(blk[1].shape[1], []).append(k)
        for ks in by_depth.values():
            cuts = np.concatenate([self._blocks[k][0] for k in ks])
            gids = np.concatenate([self._blocks[k][1] for k in ks])
            idx = np.concatenate([np.arange(self.offsets[k], self.offsets[k + 1]) for k in ks])
            t[idx], b[idx], ok[idx] = self.model.estimate_arrays(cuts, gids)
        return t, b, ok

    def move(self, k: int) -> Move:
        blk = int(np.searchsorted(self.offsets, k, side="right")) - 1
        cuts, gids, describe = self._blocks[blk]
        r = k - int(self.offsets[blk])
        kind, note = describe(r)
        lay = Layout(tuple(int(c) for c in cuts[r]), tuple(self.model.group_of(int(x)) for x in gids[r]))
        return Move(kind, lay, note)


def best_moves(layout: Layout, model: CostModel, alive: Iterable[int], count: int, straight: bool = False) -> list[tuple[Move, float]]:
    """The ``count`` best single moves by estimate (feasible ones only), best first."""
    cands = Candidates(layout, alive, straight, model)
    if not len(cands):
        return []
    t, b, fits = cands.estimate()
    order = np.lexsort((b, t))
    return [(cands.move(int(k)), float(t[k])) for k in order[:count] if fits[k]]


def walk(layout: Layout, model: CostModel, alive: Iterable[int], max_moves: int = 64, rel_tol: float = 1e-9,
         straight: bool = False) -> Walk:
    """Greedy lexicographic descent on (estimate, balance) over two-worker moves."""
    alive = tuple(alive)
    here = model.estimate([layout])
    t0, b0 = float(here.time_s[0]), float(here.balance[0])
    moves: list[Move] = []
    estimates = [t0]
    current = layout
    for _ in range(max_moves):
        cands = Candidates(current, alive, straight, model)
        if not len(cands):
            break
        t, b, fits = cands.estimate()
        better = t < t0 * (1 - rel_tol)
        level = (t <= t0) & (b < b0 * (1 - rel_tol))
        ok = (better | level) & fits
        if not ok.any():
            break
        idx = np.flatnonzero(ok)
        k = int(idx[np.lexsort((b[idx], t[idx]))[0]])
        move = cands.move(k)
        current, t0, b0 = move.layout, float(t[k]), float(b[k])
        moves.append(move)
        estimates.append(t0)
    return Walk(layout, tuple(moves), tuple(estimates))


def path_to(start: Layout, target: Layout, alive: Iterable[int]) -> list[Move]:
    """Two-worker moves turning ``start`` into ``target`` (both straight: one device per stage).

    Greedy descent can stop in a local optimum — with heterogeneous devices the best order of
    devices may be a 3-cycle away, every single swap on the way being worse. A full re-plan's
    partition is still reachable: (1) split the longest stage for each device the target adds (when every
    stage is down to one block, first merging away a stage whose device the target does not use),
    (2) merge away the other stages whose device the target does not use, (3) sort the devices into the target's
    order with swaps, (4) shift each boundary to its target once, choosing at each step a
    boundary whose target lies strictly between its neighbours (one always exists). At most
    ``|dropped| + |added| + (S−1) + (S−1)`` moves; the arbiter prices the whole path.
    """
    if any(len(g) != 1 for g in start.groups + target.groups):
        raise ValueError("path_to handles straight layouts only")
    alive = set(alive)
    if not target.devices <= alive:
        raise ValueError("target uses devices that are not alive")
    moves: list[Move] = []
    cur = start
    want = [g[0] for g in target.groups]

    def do(kind: MoveKind, cuts: Sequence[int], devs: Sequence[int], note: str) -> None:
        nonlocal cur
        cur = Layout(tuple(cuts), tuple((d,) for d in devs))
        moves.append(Move(kind, cur, note))

    def drop(d: int) -> None:
        devs = [g[0] for g in cur.groups]
        i = devs.index(d)
        cuts = list(cur.cuts)
        del cuts[i + 1 if i + 1 < len(devs) else i]
        devs.pop(i)
        do(MoveKind.MERGE, cuts, devs, f"drop device {d}")

    for d in want:
        if d in {g[0] for g in cur.groups}:
            continue
        while max(b - a for a, b in zip(cur.cuts, cur.cuts[1:])) < 2:  # every stage one block: drop one first
            spare = [g[0] for g in cur.groups if g[0] not in target.devices]
            if not spare:
                raise ValueError("not enough blocks to add a stage")
            drop(spare[0])
        devs = [g[0] for g in cur.groups]
        cuts = list(cur.cuts)
        j = max(range(len(devs)), key=lambda s: cuts[s + 1] - cuts[s])
        cuts.insert(j + 1, (cuts[j] + cuts[j + 1]) // 2)
        devs.insert(j + 1, d)
        do(MoveKind.GROW, cuts, devs, f"device {d} splits stage {j}")
    for d in [g[0] for g in cur.groups if g[0] not in target.devices]:
        drop(d)
    for pos, d in enumerate(want):
        devs = [g[0] for g in cur.groups]
        k = devs.index(d)
        if k != pos:
            devs[pos], devs[k] = devs[k], devs[pos]
            do(MoveKind.SWAP, cur.cuts, devs, f"swap {pos},{k}")
    goal = list(target.cuts)
    while list(cur.cuts) != goal:
        cuts = list(cur.cuts)
        i = next(i for i in range(1, len(cuts) - 1) if cuts[i] != goal[i] and cuts[i - 1] < goal[i] < cuts[i + 1])
        cuts[i] = goal[i]
        do(MoveKind.SHIFT, cuts, want, f"cut {i - 1}: -> {goal[i]}")
    return moves
