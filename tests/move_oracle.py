"""The plain enumeration of two-worker moves, Layout by Layout: the test oracle that
:class:`orchestrator.planners.moves.Candidates` (the array-built candidates the controller uses)
must equal, move for move and in the same order. It lives with the tests, not in the product:
the product has one enumeration of moves."""

from __future__ import annotations

from typing import Iterable, Sequence

from orchestrator.costmodel.estimate import Layout
from orchestrator.planners.moves import Move, MoveKind


def enumerate_moves(layout: Layout, alive: Iterable[int], straight: bool = False) -> list[Move]:
    """Every two-worker neighbour of ``layout`` that uses only ``alive`` devices (without
    replication changes when ``straight``)."""
    cuts, groups = list(layout.cuts), list(layout.groups)
    S = len(groups)
    idle = sorted(set(alive) - layout.devices)
    out: list[Move] = []

    def lay(c: Sequence[int], g: Sequence[tuple[int, ...]]) -> Layout:
        return Layout(tuple(c), tuple(g))

    for i in range(S - 1):
        swapped = groups[:i] + [groups[i + 1], groups[i]] + groups[i + 2 :]
        for c in range(cuts[i] + 1, cuts[i + 2]):
            nc = cuts[:i + 1] + [c] + cuts[i + 2 :]
            if c != cuts[i + 1]:
                out.append(Move(MoveKind.SHIFT, lay(nc, groups), f"cut {i}: {cuts[i + 1]}->{c}"))
                out.append(Move(MoveKind.SWAP_SHIFT, lay(nc, swapped), f"swap {i},{i + 1}; cut {cuts[i + 1]}->{c}"))
    for i in range(S):
        for j in range(i + 1, S):
            g = list(groups)
            g[i], g[j] = g[j], g[i]
            out.append(Move(MoveKind.SWAP, lay(cuts, g), f"swap {i},{j}"))
    for i in range(S):
        if len(groups[i]) < 2 or straight:
            continue
        for d in groups[i]:
            for j in range(S):
                if j != i:
                    g = list(groups)
                    g[i] = tuple(x for x in groups[i] if x != d)
                    g[j] = groups[j] + (d,)
                    out.append(Move(MoveKind.REPLICA, lay(cuts, g), f"device {d}: stage {i}->{j}"))
    for d in idle:
        for j in range(S):
            g = list(groups)
            g[j] = groups[j] + (d,)
            if not straight:
                out.append(Move(MoveKind.GROW, lay(cuts, g), f"device {d} replicates stage {j}"))
            for c in range(cuts[j] + 1, cuts[j + 1]):
                nc = cuts[: j + 1] + [c] + cuts[j + 1 :]
                out.append(Move(MoveKind.GROW, lay(nc, groups[:j] + [groups[j], (d,)] + groups[j + 1 :]), f"device {d} takes [{c},{cuts[j + 1]})"))
                out.append(Move(MoveKind.GROW, lay(nc, groups[:j] + [(d,), groups[j]] + groups[j + 1 :]), f"device {d} takes [{cuts[j]},{c})"))
    for i in range(S):
        if S < 2 or len(groups[i]) > 1:
            continue
        if i + 1 < S:  # stage i's blocks join stage i+1
            out.append(Move(MoveKind.MERGE, lay(cuts[:i + 1] + cuts[i + 2 :], groups[:i] + groups[i + 1 :]), f"stage {i} into {i + 1}"))
        if i > 0:  # stage i's blocks join stage i-1
            out.append(Move(MoveKind.MERGE, lay(cuts[:i] + cuts[i + 1 :], groups[:i] + groups[i + 1 :]), f"stage {i} into {i - 1}"))
    if straight:
        return out
    for i in range(S - 1):  # two adjacent stages become one, replicated on both groups
        out.append(Move(MoveKind.FUSE, lay(cuts[:i + 1] + cuts[i + 2 :], groups[:i] + [groups[i] + groups[i + 1]] + groups[i + 2 :]), f"fuse {i},{i + 1}"))
    for i in range(S):  # one replica leaves stage i with its head or tail run of blocks
        if len(groups[i]) < 2:
            continue
        seen: set[Layout] = set()  # with two replicas, "a leaves with the tail" = "b leaves with the head"
        for d in groups[i]:
            rest = tuple(x for x in groups[i] if x != d)
            for c in range(cuts[i] + 1, cuts[i + 1]):
                nc = cuts[: i + 1] + [c] + cuts[i + 1 :]
                for split, end in (([rest, (d,)], "tail"), ([(d,), rest], "head")):
                    new = lay(nc, groups[:i] + split + groups[i + 1 :])
                    if new not in seen:
                        seen.add(new)
                        out.append(Move(MoveKind.FISSION, new, f"device {d} leaves stage {i} with its {end}"))
    return out
