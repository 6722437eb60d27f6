"""Per-plan tables of one worker's program: rows, peers, tags, buffers, posting points.

Hot path: everything that depends only on the plan (row ranges, peers, tags, peer ranks, buffer
shapes, labels, which receives to post before which action) is computed once when the executor
is built, into per-action tables indexed by program position; ``Executor.run`` only walks them.
Handlers still take the :class:`Action` (subclasses wrap them) and find their precomputed entry
at ``self.cursor``. A sender and its receiver compute their tables independently from the same
plan, so no shape header ever travels with a micro-batch.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from actors.gpu import recv_lookahead
from actors.transport import Range, intersect, stage_rows, tag
from orchestrator.core.plan import Plan
from orchestrator.schedule.ir import Action, Kind
from orchestrator.schedule.lowering import peers
from orchestrator.schedule.nccl import recv_post_points

Key = tuple[int, tuple[int, int]]  # (stage, unit)
Piece = tuple[bool, Key, int, int, int, int]  # (local, source key, src lo, src hi, dst lo, dst hi)


class ProgramTables:
    """Mixin of :class:`actors.execution.Executor`: the attributes below are set by its ``__init__``."""

    spec: Any
    plan: Plan
    device: int
    program: tuple[Action, ...]
    rank_of: dict[int, int]
    links: dict[tuple[int, int], Any]
    boundary: list[tuple[tuple[int, ...], torch.dtype]]
    batch_rows: int
    last: int
    cuda: bool
    consumers: dict[tuple[str, int, tuple[int, int]], int]
    handlers: dict[Kind, Callable[[Action], None]]
    _rows: dict[tuple[int, tuple[int, int], int], Range]
    _peers: dict[tuple[int, int], list[int]]

    # ----- rows -----
    def rows(self, stage: int, unit: tuple[int, int], device: int | None = None) -> Range:
        key = (stage, unit, self.device if device is None else device)
        found = self._rows.get(key)
        if found is None:
            found = self._rows[key] = stage_rows(self.plan, self.batch_rows, stage, key[2], unit)
        return found

    def peers(self, stage: int, other: int) -> list[int]:
        """Devices of ``other`` whose rows overlap this device's share of ``stage`` (lowering's rule)."""
        found = self._peers.get((stage, other))
        if found is None:
            replica = self.plan.stages[stage].devices.index(self.device)
            found = self._peers[(stage, other)] = [d for d, _ in peers(self.plan, stage, replica, other)]
        return found

    def _link_rows(self, a: Action) -> tuple[Range, Range, int, int]:
        """(my rows, overlap rows, sending stage, receiving-side stage) of a point-to-point action."""
        other = a.stage + 1 if a.kind in (Kind.SEND_F, Kind.RECV_B) else a.stage - 1
        mine = self.rows(a.stage, a.unit)
        both = intersect(mine, self.rows(other, a.unit, a.peer))
        sender = a.stage if a.kind in (Kind.SEND_F, Kind.SEND_B) else other
        return mine, both, sender, other

    def _pieces(self, direction: str, stage: int, unit: tuple[int, int], other: int) -> list[Piece]:
        """The parts of ``stage``'s input (F) or output grad (B) in peer order, as row offsets."""
        mine = self.rows(stage, unit)
        out: list[Piece] = []
        for peer in self.peers(stage, other):
            theirs = self.rows(other, unit, peer)
            lo, hi = intersect(mine, theirs)
            if hi > lo:
                out.append((peer == self.device, (other, unit), lo - theirs[0], hi - theirs[0], lo - mine[0], hi - mine[0]))
        return out

    def _compile(self) -> None:
        """Per-action tables (see module docstring); entries are indexed by program position."""
        program, n = self.program, len(self.program)
        self.labels = [str(a) for a in program]
        self.calls = [self.handlers[a.kind] for a in program]
        self.info: list[Any] = [None] * n
        # Which receives to post before action i (the rule the NCCL replay proves hang-free).
        self.post_before = recv_post_points(program, recv_lookahead(self.spec.recv_lookahead, self.cuda))
        for i, a in enumerate(program):
            key = (a.stage, a.unit)
            if a.kind is Kind.FORWARD:
                lo, hi = self.rows(a.stage, a.unit)
                stage = self.plan.stages[a.stage]
                pieces = self._pieces("F", a.stage, a.unit, a.stage - 1) if a.stage > 0 else []
                self.info[i] = (key, lo, hi, list(range(stage.first, stage.last)), pieces, (hi - lo) / self.batch_rows)
            elif a.kind is Kind.BACKWARD_WEIGHT:
                self.info[i] = key
            elif a.kind.grads_input:  # B, or the BI of a split backward
                lo, hi = self.rows(a.stage, a.unit)
                pieces = self._pieces("B", a.stage, a.unit, a.stage + 1) if a.stage < self.last else []
                keep = self.consumers.get(("B", a.stage, a.unit), 0) > 0
                self.info[i] = (key, lo, hi, pieces, keep)
            elif a.kind in (Kind.SEND_F, Kind.SEND_B):
                direction = "F" if a.kind is Kind.SEND_F else "B"
                mine, (lo, hi), sender, _ = self._link_rows(a)
                whole = (lo, hi) == mine
                stage = self.plan.stages[a.stage]
                expect = self.boundary[stage.last if direction == "F" else stage.first]
                self.info[i] = (direction, key, hi > lo, whole, lo - mine[0], hi - mine[0],
                                self.rank_of[a.peer], tag(direction, sender, a.microbatch, a.part),
                                self.links.get((self.device, a.peer)), expect)
            elif a.kind in (Kind.RECV_F, Kind.RECV_B):
                direction = "F" if a.kind is Kind.RECV_F else "B"
                mine, (lo, hi), sender, _ = self._link_rows(a)
                if hi <= lo:
                    continue  # empty overlap: nothing is sent, nothing is posted
                cut = self.plan.stages[a.stage].first if direction == "F" else self.plan.stages[a.stage].last
                shape, dtype = self.boundary[cut]
                self.info[i] = ((direction, a.stage, a.unit), (mine[1] - mine[0], *shape), dtype, lo - mine[0], hi - mine[0],
                                (lo, hi) == mine, self.rank_of[a.peer], tag(direction, sender, a.microbatch, a.part),
                                self.links.get((a.peer, self.device)))
