"""Recovery in place after a death without notice: which step to resume, where each block comes from.

Why a module of pure functions: the trainer's :meth:`~orchestrator.train.runtime.PipelineRuntime.recover_in_place`
carries a recovery out (abort, re-form, restore); the choices it makes are data in, data out, and tested without
Ray. The step is the newest one whose every block is somewhere: in a survivor's host copy (its own snapshot, a
neighbour's copy it holds, or the host copy of a checkpoint it wrote) or in the newest committed checkpoint. Each
block a device holds under the new plan comes from that device's own copy first (no transfer), then a peer's
(memory to memory), then storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from orchestrator.core.plan import Plan

STORAGE = -1  # the "holder" of a block read from the committed checkpoint


class InPlaceImpossible(RuntimeError):
    """Recovery in place cannot run (several deaths, a survivor that does not answer, a plan over a dead device);
    ``reason`` is one line for the event log, and the caller falls back to a full restart."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class InPlaceRecovery:
    """What a recovery in place did: the step training resumes at, where the state came from (``snapshot``: every
    block from its own device's copy; ``peer``: some from a peer's memory; ``storage``: some from the checkpoint;
    ``seed``: nothing to restore), blocks per source, host bytes of copies held per device, the survivors the plan
    uses (``{"device", "node_id", "pid"}``: the same processes as before), the seconds it took, and every surviving
    member of the new process group (``members``: the plan's devices and the idle ones, which stay the job's)."""

    resumed_step: int
    source: str
    blocks_from: Mapping[str, int] = field(default_factory=dict)
    snapshot_bytes: Mapping[int, int] = field(default_factory=dict)
    devices: tuple[Mapping[str, object], ...] = ()
    seconds: float = 0.0
    members: tuple[int, ...] = ()


def restorable_step(copies: Mapping[int, Mapping[int, Sequence[int]]], num_blocks: int, stored_step: int | None) -> int | None:
    """The newest step whose blocks ``0..num_blocks-1`` are all held by the survivors (``copies``: device -> step ->
    blocks) or stored (``stored_step``: the newest committed checkpoint's step); ``None``: none (start from the seed)."""
    every = set(range(num_blocks))
    held: dict[int, set[int]] = {}
    for steps in copies.values():
        for step, blocks in steps.items():
            held.setdefault(int(step), set()).update(blocks)
    found = [s for s, blocks in held.items() if blocks >= every]
    if stored_step is not None:
        found.append(stored_step)
    return max(found) if found else None


def block_sources(step: int, plan: Plan, copies: Mapping[int, Mapping[int, Sequence[int]]],
                  stored_step: int | None) -> dict[int, dict[int, int]]:
    """For every device of ``plan``: ``block -> holder`` (the device itself, a survivor holding a copy at ``step``,
    or :data:`STORAGE`). Raises ``ValueError`` for a block nobody has (``step`` was not restorable)."""
    holders: dict[int, list[int]] = {}
    for device, steps in sorted(copies.items()):
        for b in steps.get(step, ()):
            holders.setdefault(int(b), []).append(device)
    out: dict[int, dict[int, int]] = {}
    for device in plan.devices:
        mine: dict[int, int] = {}
        for j in plan.stages_of_device(device):
            for b in range(plan.stages[j].first, plan.stages[j].last):
                have = holders.get(b, [])
                if device in have:
                    mine[b] = device
                elif have:
                    mine[b] = have[0]
                elif stored_step == step:
                    mine[b] = STORAGE
                else:
                    raise ValueError(f"block {b} at step {step}: no survivor holds a copy and no checkpoint is at that step")
        out[device] = mine
    return out


def source_of(sources: Mapping[int, Mapping[int, int]]) -> str:
    """One word for the event: ``storage`` if any block is read from it, else ``peer`` if any crosses devices,
    else ``snapshot``."""
    pairs = [(d, h) for d, blocks in sources.items() for h in blocks.values()]
    if any(h == STORAGE for _, h in pairs):
        return "storage"
    return "peer" if any(h != d for d, h in pairs) else "snapshot"


@dataclass(frozen=True)
class SnapshotInFlight:
    """An in-memory snapshot started and not yet waited for: each worker's own copy (``started``, one ref per
    device of ``devices``) and each keeper's copy of its neighbour's (``kept``, one ref per device of ``keepers``)."""

    step: int
    started: list[Any]
    devices: list[int]
    kept: list[Any]
    keepers: list[int]


def ring_neighbours(devices: Sequence[int], node_of: Mapping[int, str] | None = None) -> dict[int, int]:
    """Who keeps a copy of whose snapshot: each device's copy goes to the next device in the ring on another node
    (a node that goes away takes all its devices, and their copies with them), else to the next device."""
    order = sorted(devices)
    if len(order) < 2:
        return {}
    node = node_of or {}
    out: dict[int, int] = {}
    for i, d in enumerate(order):
        ring = [order[(i + k) % len(order)] for k in range(1, len(order))]
        elsewhere = [e for e in ring if node.get(e, e) != node.get(d, d)]
        out[d] = (elsewhere or ring)[0]
    return out
