"""What crosses between the controller and the job that runs it, as frozen values: one iteration's
:class:`IterationMetrics` in, the measured :class:`MoveReport`/:class:`RestartReport` of an act back. The controller
never touches actors, Ray or torch, so the same controller runs in :class:`~orchestrator.elastic.job_loop.ElasticJob`
and, in tests and benchmarks, in :class:`~orchestrator.adapt.simulated.SimulatedJob`.

Also here: :func:`move_transfers`, the one definition of *which bytes a plan change ships
between which actors*. The runtime executes exactly these hand-overs; the arbiter prices them on
its model; the simulated runtime charges them on the true cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from orchestrator.core.cluster import Cluster
from orchestrator.costmodel.terms import SHIPPED_STATE_FACTOR, shipped_bytes, transfer_time
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.core.profile import Profile

Link = tuple[int, int]


@dataclass(frozen=True)
class IterationMetrics:
    """What one iteration reports. ``compute_s[d]``: seconds device ``d`` spent in forward and
    backward work; ``link_bytes``/``link_s``: bytes sent and seconds spent sending on each
    directed link in use. ``completed`` is False when a device died mid-iteration (its work is
    lost); ``lost_devices``/``new_devices`` are membership changes seen since the last call."""

    iteration: int
    iteration_s: float
    plan: Plan
    compute_s: Mapping[int, float] = field(default_factory=dict)
    link_bytes: Mapping[Link, float] = field(default_factory=dict)
    link_s: Mapping[Link, float] = field(default_factory=dict)
    completed: bool = True
    lost_devices: tuple[int, ...] = ()
    new_devices: tuple[int, ...] = ()


@dataclass(frozen=True)
class MoveReport:
    """Measured cost of a live move: bytes handed over and how long the pipeline stalled."""

    bytes_moved: float
    stall_s: float
    plan: Plan


@dataclass(frozen=True)
class RestartReport:
    """Measured cost of a stop-and-restart onto ``plan``: downtime, and iterations to redo
    (work since the last checkpoint, when restarting from it)."""

    downtime_s: float
    replayed_iterations: int
    plan: Plan


@dataclass(frozen=True, slots=True)
class BlockHandover:
    """Blocks ``[first, last)`` whose state (weights + optimizer, ``nbytes``) device ``src`` hands
    to device ``dst`` in a live move — a prediction, unlike the runtime's measured transfers."""

    src: int
    dst: int
    first: int
    last: int
    nbytes: float


def _holdings(plan: Plan) -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {}
    for s in plan.stages:
        for d in s.devices:
            out.setdefault(d, []).append((s.first, s.last))
    return out


def _minus(a: tuple[int, int], held: list[tuple[int, int]]) -> list[tuple[int, int]]:
    pieces = [a]
    for h0, h1 in held:
        nxt = []
        for p0, p1 in pieces:
            if h1 <= p0 or h0 >= p1:
                nxt.append((p0, p1))
                continue
            if p0 < h0:
                nxt.append((p0, h0))
            if h1 < p1:
                nxt.append((h1, p1))
        pieces = nxt
    return pieces


def move_transfers(old: Plan, new: Plan, profile: Profile, cluster: Cluster, dead: frozenset[int] = frozenset(),
                   shipped_factor: float = SHIPPED_STATE_FACTOR) -> list[BlockHandover]:
    """Block state each device of ``new`` lacks, and the old holder (alive, fastest link) to take
    it from. Devices that keep their blocks appear in no transfer."""
    held = _holdings(old)
    out: list[BlockHandover] = []
    for stage in new.stages:
        for d in stage.devices:
            for first, last in _minus((stage.first, stage.last), held.get(d, [])):
                for src_stage in old.stages:
                    lo, hi = max(first, src_stage.first), min(last, src_stage.last)
                    if lo >= hi:
                        continue
                    sources = [s for s in src_stage.devices if s not in dead]
                    if not sources:
                        raise ValueError(f"blocks [{lo},{hi}) have no live holder; restart from a checkpoint instead")
                    src = max(sources, key=lambda s: cluster.link(s, d))
                    out.append(BlockHandover(src, d, lo, hi, shipped_bytes(profile.param_bytes(lo, hi), shipped_factor)))
    return out


def handover_time(transfers: list[BlockHandover], cluster: Cluster) -> float:
    """Time for all hand-overs when each sender and each receiver handles one transfer at a time
    and distinct pairs run in parallel: the busiest endpoint bounds it."""
    busy: dict[tuple[str, int], float] = {}
    for t in transfers:
        dur = transfer_time(t.nbytes, 1.0 / cluster.link(t.src, t.dst))
        busy[("s", t.src)] = busy.get(("s", t.src), 0.0) + dur
        busy[("r", t.dst)] = busy.get(("r", t.dst), 0.0) + dur
    return max(busy.values(), default=0.0)


def check_plan_alive(plan: Plan, num_blocks: int, cluster: Cluster, alive: set[int]) -> None:
    """What every handle checks before running or moving to ``plan``: it covers the model, uses
    devices of the cluster, and only devices that are up."""
    plan.check_against(num_blocks, cluster.size)
    down = set(plan.devices) - alive
    if down:
        raise UserError(f"plan uses device(s) {sorted(down)} that are not up")
