"""Per-plan tables of one worker's program: rows, peers, tags, buffers, posting points, consumers.

Hot path: everything that depends only on the plan (row ranges, peers, tags, peer ranks, buffer
shapes, labels, which receives to post before which action, how many actions consume each produced
tensor) is computed once when the executor is built, into per-action tables indexed by program
position; ``Executor.run`` only walks them and hands each handler its position. A sender and its
receiver compute their tables independently from the same plan, so no shape header ever travels
with a micro-batch.

Why an object of its own: these tables are read by both the executor's compute handlers and its
exchange (:mod:`actors.exchange`), and changed by neither; built once, they are the one place the
plan's row and tag rules are applied. They know no handler: the executor builds its call table.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from actors.gpu import recv_lookahead
from actors.transport import Range, intersect, stage_rows, tag
from orchestrator.core.plan import Plan
from orchestrator.schedule.ir import Action, Kind
from orchestrator.schedule.lowering import peers
from orchestrator.schedule.nccl import gradient_launch_points, recv_post_points

Key = tuple[int, tuple[int, int]]  # (stage, unit)
Piece = tuple[bool, Key, int, int, int, int]  # (local, source key, src lo, src hi, dst lo, dst hi)


class ProgramTables:
    """The per-action tables of one device's ``program`` under ``plan`` (see module docstring).

    ``info[i]`` is the precomputed entry of action ``i`` (its layout depends on the action's kind, see
    :meth:`_compile`); ``post_before[i]`` the receives to post before action ``i``; ``labels[i]`` its
    trace label; ``consumers`` how many actions consume each produced tensor (sends and local hand-offs).
    """

    def __init__(
        self, lookahead: int, plan: Plan, device: int, rank_of: dict[int, int], program: tuple[Action, ...],
        links: dict[tuple[int, int], Any], boundary: list[tuple[tuple[int, ...], torch.dtype]], batch_rows: int,
        cuda: bool,
    ) -> None:
        self.plan, self.device, self.rank_of, self.program = plan, device, rank_of, program
        self.boundary, self.batch_rows = boundary, batch_rows
        self.last = len(plan.stages) - 1
        self._rows: dict[tuple[int, tuple[int, int], int], Range] = {}
        self._peers: dict[tuple[int, int], list[int]] = {}
        self.consumers = self._count_consumers()
        self.labels = [str(a) for a in program]
        # Which receives to post before action i (the rule the NCCL replay proves hang-free).
        self.post_before = recv_post_points(program, recv_lookahead(lookahead, cuda))
        # The backward during which each replicated stage's gradient buckets start (the rule the replay models).
        self.launch_grads = gradient_launch_points(program)
        self.info: list[Any] = self._compile(links)

    def _count_consumers(self) -> dict[tuple[str, int, tuple[int, int]], int]:
        """How many actions consume each produced tensor (sends + a local hand-off), so it is
        released as soon as the last consumer ran instead of at the end of the iteration."""
        consumers: dict[tuple[str, int, tuple[int, int]], int] = defaultdict(int)
        mine = set(self.plan.stages_of_device(self.device))
        for a in self.program:
            if a.kind is Kind.SEND_F:
                consumers[("F", a.stage, a.unit)] += 1
            elif a.kind is Kind.SEND_B:
                consumers[("B", a.stage, a.unit)] += 1
            elif a.kind is Kind.FORWARD and a.stage > 0 and a.stage - 1 in mine:
                consumers[("F", a.stage - 1, a.unit)] += 1
            elif a.kind.grads_input and a.stage < self.last and a.stage + 1 in mine:
                consumers[("B", a.stage + 1, a.unit)] += 1
        return dict(consumers)

    def boundary_of(self, direction: str, stage: int) -> tuple[tuple[int, ...], torch.dtype]:
        """Trailing shape and dtype of ``stage``'s input (F) or of its output's gradient (B)."""
        s = self.plan.stages[stage]
        return self.boundary[s.first if direction == "F" else s.last]

    def drop_links(self) -> None:
        """Forget the per-action entries, which hold the link groups' handles (after a failed iteration:
        see :meth:`actors.execution.Executor.drop_communicators`). Emptied in place: readers hold this list."""
        self.info.clear()

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

    def link_rows(self, a: Action) -> tuple[Range, Range, int, int]:
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

    def _compile(self, links: dict[tuple[int, int], Any]) -> list[Any]:
        """Per-action entries (see module docstring), indexed by program position."""
        program = self.program
        info: list[Any] = [None] * len(program)
        for i, a in enumerate(program):
            key = (a.stage, a.unit)
            if a.kind is Kind.FORWARD:
                lo, hi = self.rows(a.stage, a.unit)
                stage = self.plan.stages[a.stage]
                pieces = self._pieces("F", a.stage, a.unit, a.stage - 1) if a.stage > 0 else []
                info[i] = (key, lo, hi, list(range(stage.first, stage.last)), pieces, (hi - lo) / self.batch_rows)
            elif a.kind is Kind.BACKWARD_WEIGHT:
                info[i] = key
            elif a.kind.grads_input:  # B, or the BI of a split backward
                lo, hi = self.rows(a.stage, a.unit)
                pieces = self._pieces("B", a.stage, a.unit, a.stage + 1) if a.stage < self.last else []
                keep = self.consumers.get(("B", a.stage, a.unit), 0) > 0
                info[i] = (key, lo, hi, pieces, keep)
            elif a.kind in (Kind.SEND_F, Kind.SEND_B):
                direction = "F" if a.kind is Kind.SEND_F else "B"
                mine, (lo, hi), sender, _ = self.link_rows(a)
                whole = (lo, hi) == mine
                stage = self.plan.stages[a.stage]
                expect = self.boundary[stage.last if direction == "F" else stage.first]
                info[i] = (direction, key, hi > lo, whole, lo - mine[0], hi - mine[0],
                           self.rank_of[a.peer], tag(direction, sender, a.microbatch, a.part),
                           links.get((self.device, a.peer)), expect)
            elif a.kind in (Kind.RECV_F, Kind.RECV_B):
                direction = "F" if a.kind is Kind.RECV_F else "B"
                mine, (lo, hi), sender, _ = self.link_rows(a)
                if hi <= lo:
                    continue  # empty overlap: nothing is sent, nothing is posted
                shape, dtype = self.boundary_of(direction, a.stage)
                info[i] = ((direction, a.stage, a.unit), (mine[1] - mine[0], *shape), dtype, lo - mine[0], hi - mine[0],
                           (lo, hi) == mine, self.rank_of[a.peer], tag(direction, sender, a.microbatch, a.part),
                           links.get((a.peer, self.device)))
        return info
