"""Fault and slowdown injection specs shared by the simulated runtime and the elastic job's rehearsal.

A scenario is plain data: a tuple of :class:`Slowdown`, :class:`Throttle`, :class:`Kill` and
:class:`Join` events, each keyed by the iteration from which it holds. Keeping the spec as data
(not callbacks) is what lets the same scenario drive :class:`~orchestrator.adapt.simulated.SimulatedRuntime`
in tests and the real :class:`~orchestrator.elastic.job_loop.ElasticJob` (``AdaptConfig(faults=...)``), and lets a
benchmark print exactly what it injected.

:meth:`FaultSchedule.conditions` turns the spec into the *true* state of the world at an iteration
(a :class:`Cluster` with the real speeds and bandwidths, and the set of live devices). Only the
simulated runtime reads it; the controller never does — it must infer the same facts from
metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence, Union

import numpy as np

from orchestrator.core.cluster import GBPS, Cluster
from orchestrator.core.errors import UserError


@dataclass(frozen=True, slots=True)
class Slowdown:
    """From ``at_iteration`` (until ``until_iteration``, exclusive, if given) ``device`` computes
    ``factor`` times slower — e.g. a co-located job sharing the GPU. Factors on one device multiply."""

    device: int
    factor: float
    at_iteration: int
    until_iteration: int | None = None

    def __post_init__(self) -> None:
        if not (self.factor > 0 and math.isfinite(self.factor)):
            raise UserError(f"slowdown factor must be positive, got {self.factor}")
        _check_window(self.at_iteration, self.until_iteration)

    def active(self, iteration: int) -> bool:
        return _in_window(iteration, self.at_iteration, self.until_iteration)


@dataclass(frozen=True, slots=True)
class Throttle:
    """From ``at_iteration`` the link ``src → dst`` (and back, if ``symmetric``) runs at ``gbps``,
    or with ``delay_per_byte`` seconds added to every byte of its nominal speed.

    ``gbps`` *sets* the bandwidth (it may raise it, as in the 10 → 100 Gb/s scenario); the
    latest active throttle of a link wins. Exactly one of ``gbps`` / ``delay_per_byte`` is given.
    """

    src: int
    dst: int
    at_iteration: int
    gbps: float | None = None
    delay_per_byte: float | None = None
    symmetric: bool = True
    until_iteration: int | None = None

    def __post_init__(self) -> None:
        if (self.gbps is None) == (self.delay_per_byte is None):
            raise UserError("a throttle needs exactly one of gbps or delay_per_byte")
        if self.gbps is not None and not (self.gbps > 0 and math.isfinite(self.gbps)):
            raise UserError(f"throttle bandwidth must be positive, got {self.gbps}")
        if self.delay_per_byte is not None and not (self.delay_per_byte >= 0 and math.isfinite(self.delay_per_byte)):
            raise UserError(f"delay per byte must be >= 0, got {self.delay_per_byte}")
        if self.src == self.dst:
            raise UserError("a throttle needs two distinct devices")
        _check_window(self.at_iteration, self.until_iteration)

    def active(self, iteration: int) -> bool:
        return _in_window(iteration, self.at_iteration, self.until_iteration)

    def apply(self, nominal_bytes_per_s: float) -> float:
        if self.gbps is not None:
            return self.gbps * GBPS
        assert self.delay_per_byte is not None
        return 1.0 / (1.0 / nominal_bytes_per_s + self.delay_per_byte)


@dataclass(frozen=True, slots=True)
class Kill:
    """The actor on ``device`` (or its node) dies during iteration ``at_iteration``. On the real
    runtime ``device=None`` means the device of the middle stage at that moment (one that holds
    blocks, whatever earlier faults left), as a rehearsed notice without devices does."""

    device: int | None
    at_iteration: int
    hang: bool = False
    """Instead of dying, the worker stops making progress mid-iteration (a stuck kernel, a wedged collective):
    the job's hang detection must notice, end its process and recover, as for a death."""

    def __post_init__(self) -> None:
        _check_window(self.at_iteration, None)


@dataclass(frozen=True, slots=True)
class Join:
    """``device`` (listed in the nominal cluster but absent so far) becomes available at
    ``at_iteration``: a new GPU node joined or another job freed resources."""

    device: int
    at_iteration: int

    def __post_init__(self) -> None:
        _check_window(self.at_iteration, None)


Fault = Union[Slowdown, Throttle, Kill, Join]


@dataclass(frozen=True)
class Conditions:
    """The true world at one iteration: real speeds/bandwidths and which devices are up."""

    cluster: Cluster
    alive: frozenset[int]
    killed_now: frozenset[int]


@dataclass(frozen=True)
class FaultSchedule:
    """An ordered scenario. ``initially_absent`` devices are in the nominal cluster but not up
    until a :class:`Join` brings them."""

    faults: tuple[Fault, ...] = ()
    initially_absent: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", tuple(self.faults))
        object.__setattr__(self, "initially_absent", frozenset(self.initially_absent))

    def validate(self, cluster: Cluster) -> None:
        for f in self.faults:
            devs = (f.src, f.dst) if isinstance(f, Throttle) else (f.device,)
            for d in devs:
                if d is None:  # a Kill of "the middle stage's device", resolved when it fires
                    continue
                if not 0 <= d < cluster.size:
                    raise UserError(f"{type(f).__name__} names device {d}, but the cluster has {cluster.size}")

    def alive_at(self, cluster: Cluster, iteration: int) -> frozenset[int]:
        """Devices up at the *start* of ``iteration`` (kills take effect after their iteration)."""
        alive = set(range(cluster.size)) - set(self.initially_absent)
        for f in self.faults:
            if isinstance(f, Join) and f.at_iteration <= iteration:
                alive.add(f.device)
        for f in self.faults:
            if isinstance(f, Kill) and f.at_iteration < iteration and f.device is not None:
                alive.discard(f.device)
        return frozenset(alive)

    def conditions(self, nominal: Cluster, iteration: int) -> Conditions:
        speeds = nominal.speeds.astype(np.float64)
        for f in self.faults:
            if isinstance(f, Slowdown) and f.active(iteration):
                speeds[f.device] /= f.factor
        bw = np.array(nominal.bandwidth, dtype=np.float64)
        np.fill_diagonal(bw, 0.0)
        base = bw.copy()
        for f in self.faults:
            if isinstance(f, Throttle) and f.active(iteration):
                pairs = [(f.src, f.dst)] + ([(f.dst, f.src)] if f.symmetric else [])
                for s, d in pairs:
                    bw[s, d] = f.apply(float(base[s, d]) if base[s, d] > 0 else float(nominal.link(s, d)))
        killed = frozenset(f.device for f in self.faults if isinstance(f, Kill) and f.at_iteration == iteration and f.device is not None)
        return Conditions(nominal.with_speeds(speeds.tolist()).with_bandwidth(bw), self.alive_at(nominal, iteration), killed)

    def __add__(self, other: "FaultSchedule") -> "FaultSchedule":
        return FaultSchedule(self.faults + other.faults, self.initially_absent | other.initially_absent)


def set_inter_node_bandwidth(cluster: Cluster, gbps: float, at_iteration: int, devices: Sequence[int] | None = None) -> list[Throttle]:
    """Throttles that put every inter-node link among ``devices`` at ``gbps`` (AutoPipe-Hu's
    bandwidth scenario: 10 → 25 → 40 → 100 Gb/s)."""
    ids = list(range(cluster.size)) if devices is None else list(devices)
    out = []
    for a in ids:
        for b in ids:
            if a < b and cluster.devices[a].node != cluster.devices[b].node:
                out.append(Throttle(a, b, at_iteration, gbps=gbps))
    return out


def scenario(faults: Iterable[Fault], initially_absent: Iterable[int] = ()) -> FaultSchedule:
    return FaultSchedule(tuple(faults), frozenset(initially_absent))


def _check_window(start: int, end: int | None) -> None:
    if start < 0:
        raise UserError(f"fault iteration must be >= 0, got {start}")
    if end is not None and end <= start:
        raise UserError(f"fault window [{start}, {end}) is empty")


def _in_window(iteration: int, start: int, end: int | None) -> bool:
    return iteration >= start and (end is None or iteration < end)
