"""Rehearsed faults carried to the real workers: slowdowns and link delays as knobs, kills armed.

One owner for what has been sent: the knobs each worker has now (sent again only on change) and
the kills already armed. The elastic job pushes through it, once per
iteration, before submitting it; after a restart (fresh processes, no knobs) it is told to
:meth:`forget`. The workers are reached only through the runtime's ``set_knobs`` and ``arm_kill`` (rehearsal is
opt-in: nothing here runs unless a :class:`~orchestrator.adapt.faults.FaultSchedule` has faults).
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.adapt.faults import FaultSchedule, Kill, Slowdown, Throttle
from orchestrator.core.cluster import GBPS, Cluster
from orchestrator.core.plan import Plan

Knob = tuple[float, tuple[tuple[int, float], ...]]  # (compute slowdown factor, sorted outgoing link delays s/byte)


class Workers(Protocol):
    """The runtime's two rehearsal primitives (:class:`~orchestrator.train.runtime.PipelineRuntime`)."""

    def set_knobs(self, device: int, slowdown: float, send_delay_per_byte: dict[int, float]) -> None: ...

    def arm_kill(self, device: int, step: int, hang: bool = False) -> None: ...


class Rehearsal:
    def __init__(self, faults: FaultSchedule, cluster: Cluster) -> None:
        self.faults = faults
        self.cluster = cluster
        self._knobs: dict[int, Knob] = {}
        self._armed: set[Kill] = set()

    def wanted(self, k: int, devices: tuple[int, ...] | list[int]) -> dict[int, Knob]:
        """Each device's knob for iteration ``k`` (the latest active throttle of a link wins)."""
        factor: dict[int, float] = {}
        delays: dict[int, dict[int, float]] = {}
        for f in self.faults.faults:
            if isinstance(f, Slowdown) and f.active(k):
                factor[f.device] = factor.get(f.device, 1.0) * f.factor
            elif isinstance(f, Throttle) and f.active(k):
                for s, d in [(f.src, f.dst)] + ([(f.dst, f.src)] if f.symmetric else []):
                    if f.delay_per_byte is not None:
                        delays.setdefault(s, {})[d] = f.delay_per_byte
                    else:
                        assert f.gbps is not None
                        delays.setdefault(s, {})[d] = max(0.0, 1.0 / (f.gbps * GBPS) - 1.0 / self.cluster.link(s, d))
        return {d: (factor.get(d, 1.0), tuple(sorted(delays.get(d, {}).items()))) for d in devices}

    def push(self, workers: Workers, plan: Plan, k: int, kills: bool = True) -> None:
        """Knobs of iteration ``k`` to ``plan``'s devices (on change only) and, with ``kills``, the
        kills of iteration ``k`` armed: the worker exits halfway through the iteration, like a
        crashed process (a kill without a device takes the middle stage's device)."""
        if not self.faults.faults:
            return
        if kills:
            for f in self.faults.faults:
                if isinstance(f, Kill) and f.at_iteration == k and f not in self._armed:
                    device = plan.stages[len(plan.stages) // 2].devices[0] if f.device is None else f.device
                    if device in plan.devices:
                        self._armed.add(f)
                        workers.arm_kill(device, k, f.hang)
        for d, want in self.wanted(k, plan.devices).items():
            if self._knobs.get(d) != want:
                workers.set_knobs(d, want[0], dict(want[1]))
                self._knobs[d] = want

    def forget(self) -> None:
        """Fresh worker processes hold no knobs: send them again."""
        self._knobs.clear()


__all__ = ["Rehearsal"]
