"""Schedule IR: per-device ordered action lists for one training iteration.

This is the single source of truth for *what runs when*. The simulator times these lists and the
stage actors execute them; neither re-derives the schedule. An action is plain data with an exact
text form (``2F5``, ``2B5.1``, ``2BI5``, ``2W5``, ``2SEND_F5@3``, ``1ALL_REDUCE``, ``0STEP``) that
round-trips through :func:`parse_action`, so schedules can be diffed, logged and kept as golden files.

Backward comes whole (``B``) or split in two (zero-bubble schedules, Qi et al. 2024): ``BI``
computes only the gradient of the stage's input, which the previous stage waits for, and ``W``
the weight gradients, which nothing downstream waits for and which a schedule may therefore defer
into its bubbles. A unit's backward on a stage is either one ``B`` or a ``BI`` followed by a ``W``.

Micro-batch *units*: AutoPipe's slicer splits some micro-batches into two halves; such a half is
the unit ``(mb, part)`` with ``part`` 1 or 2, and ``part`` 0 is a whole micro-batch. Every unit's
share of the micro-batch rows is given by :func:`unit_fraction`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping

from orchestrator.core.plan import Plan


class Kind(str, Enum):
    FORWARD = "F"
    BACKWARD = "B"
    BACKWARD_INPUT = "BI"  # the input-gradient half of a split backward (sends SEND_B like B)
    BACKWARD_WEIGHT = "W"  # the weight-gradient half of a split backward (no communication)
    SEND_F = "SEND_F"  # send this stage's output activation to a device of the next stage
    RECV_F = "RECV_F"  # receive this stage's input activation from a device of the previous stage
    SEND_B = "SEND_B"  # send the gradient of this stage's input to a device of the previous stage
    RECV_B = "RECV_B"  # receive the gradient of this stage's output from a device of the next stage
    ALL_REDUCE = "ALL_REDUCE"  # sum gradients of this stage across its replicas
    STEP = "STEP"  # optimizer step for this stage's parameters

    @property
    def is_compute(self) -> bool:
        return self in (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT)

    @property
    def grads_input(self) -> bool:
        """Produces the gradient of the stage input (what the previous stage receives)."""
        return self in (Kind.BACKWARD, Kind.BACKWARD_INPUT)

    @property
    def grads_weights(self) -> bool:
        """Accumulates the stage's weight gradients (what the all-reduce and the step read)."""
        return self in (Kind.BACKWARD, Kind.BACKWARD_WEIGHT)

    @property
    def is_comm(self) -> bool:
        return self in (Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B)


COMPUTE_KINDS = tuple(k.value for k in Kind if k.is_compute)
"""Text of every compute kind: the ``kind`` of compute spans and simulator events (F, B, BI, W)."""


@dataclass(frozen=True, slots=True)
class Action:
    """One step of one device. ``stage`` is the (virtual) stage index in the plan."""

    kind: Kind
    stage: int
    microbatch: int = -1
    part: int = 0
    peer: int = -1

    @property
    def unit(self) -> tuple[int, int]:
        return (self.microbatch, self.part)

    def __str__(self) -> str:
        text = f"{self.stage}{self.kind.value}"
        if self.microbatch >= 0:
            text += str(self.microbatch)
            if self.part:
                text += f".{self.part}"
        if self.peer >= 0:
            text += f"@{self.peer}"
        return text


_ACTION_RE = re.compile(r"^(\d+)([A-Z_]+?)(\d+)?(?:\.(\d))?(?:@(\d+))?$")


def parse_action(text: str) -> Action:
    """Inverse of ``str(action)``."""
    m = _ACTION_RE.match(text.strip())
    if not m:
        raise ValueError(f"not an action: {text!r}")
    stage, kind, mb, part, peer = m.groups()
    return Action(Kind(kind), int(stage), int(mb) if mb else -1, int(part) if part else 0, int(peer) if peer else -1)


def unit_fraction(part: int) -> float:
    """Share of a micro-batch's rows carried by a unit (whole or half)."""
    return 1.0 if part == 0 else 0.5


def units_of(plan: Plan) -> list[tuple[int, int]]:
    """Units in injection order: the first ``sliced_microbatches`` micro-batches are halved."""
    out: list[tuple[int, int]] = []
    for mb in range(plan.num_microbatches):
        if mb < plan.sliced_microbatches:
            out += [(mb, 1), (mb, 2)]
        else:
            out.append((mb, 0))
    return out


def row_share(index: int, count: int) -> tuple[float, float]:
    """Fractional row range ``[i/k, (i+1)/k)`` of replica ``index`` among ``count``.

    Its integer image is :func:`replica_range` (ceil boundaries), which never overlaps a replica
    whose fractional range does not, so the peers the lowering derives from these fractions are
    exactly the ones the actors need.
    """
    return index / count, (index + 1) / count


# ----- integer row rules shared by every interpreter (actors, single-process reference) -----
Range = tuple[int, int]


def split_range(lo: int, hi: int, count: int, index: int) -> Range:
    """``numpy.array_split`` of rows ``[lo, hi)`` into ``count`` pieces: piece ``index``.

    Micro-batches and slice halves use this rule.
    """
    n = hi - lo
    q, r = divmod(n, count)
    start = lo + index * q + min(index, r)
    return start, start + q + (1 if index < r else 0)


def unit_range(batch_rows: int, num_microbatches: int, microbatch: int, part: int) -> Range:
    """Absolute rows of unit ``(microbatch, part)`` in an iteration batch of ``batch_rows`` rows."""
    lo, hi = split_range(0, batch_rows, num_microbatches, microbatch)
    return (lo, hi) if part == 0 else split_range(lo, hi, 2, part - 1)


def replica_range(unit: Range, count: int, index: int) -> Range:
    """Rows ``[ceil(i·n/k), ceil((i+1)·n/k))`` of replica ``index`` of ``count`` inside ``unit``.

    Not ``array_split``: that rule is not monotone in ``i/k`` (6 rows: 2 replicas cut at 3, 4
    replicas at 4) and could need a peer the lowering never listed.
    """
    lo, hi = unit
    n = hi - lo
    return lo + -(-index * n // count), lo + -(-(index + 1) * n // count)


def intersect(a: Range, b: Range) -> Range:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if hi > lo else (lo, lo)


def overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


@dataclass(frozen=True)
class Schedule:
    """A lowered schedule: the plan and each device's ordered actions for one iteration."""

    plan: Plan
    programs: Mapping[int, tuple[Action, ...]]
    units: tuple[tuple[int, int], ...] = field(default=())

    def to_text(self) -> str:
        """One line per device: ``device: action action ...`` (golden-file format)."""
        return "\n".join(f"{d}: " + " ".join(str(a) for a in acts) for d, acts in sorted(self.programs.items()))

    @staticmethod
    def parse_programs(text: str) -> dict[int, tuple[Action, ...]]:
        out: dict[int, tuple[Action, ...]] = {}
        for line in text.strip().splitlines():
            dev, _, rest = line.partition(":")
            out[int(dev)] = tuple(parse_action(tok) for tok in rest.split())
        return out

    def compute_order(self, device: int) -> list[Action]:
        return [a for a in self.programs[device] if a.kind.is_compute]

    def count(self, kinds: Iterable[Kind]) -> int:
        wanted = set(kinds)
        return sum(1 for acts in self.programs.values() for a in acts if a.kind in wanted)
