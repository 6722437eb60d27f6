"""Injected slowness for rehearsals and tests: a slower device, slower outgoing links.

Fault injection (:class:`FaultKnobs`): a slowdown factor sleeps ``(factor-1)x`` the measured
compute after every forward/backward (whole or split) *inside* its span (so the slowdown is visible in measured
compute time, and gradients are untouched); a per-peer delay sleeps ``delay x bytes`` before each
send and counts that wait as transfer time. Both live on the worker, not the executor, so they
survive re-partitioning — a co-located job does not go away because we moved blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from actors.execution import Executor
from orchestrator.schedule.ir import Action, Kind


@dataclass
class FaultKnobs:
    """Injected slowness of this worker's device and of its outgoing links (see module docstring)."""

    slowdown: float = 1.0
    send_delay_per_byte: dict[int, float] = field(default_factory=dict)  # peer device -> s/byte


class FaultyExecutor(Executor):
    """The executor with the injection hooks of :class:`FaultKnobs` around compute and sends.

    A subclass (not edits to ``execution.py``) keeps the hot path of the base executor exactly as
    its owners write it: with default knobs every override is one comparison and a super call.
    """

    knobs: FaultKnobs = FaultKnobs()

    def _slow(self, handler: Callable[[Action], None], a: Action) -> None:
        before = len(self.spans)
        handler(a)
        factor = self.knobs.slowdown
        if factor != 1.0 and len(self.spans) > before:
            label, kind, start, end = self.spans[-1]
            time.sleep(max(0.0, (factor - 1.0) * (end - start)))
            self.spans[-1] = (label, kind, start, self._now())  # the device was busy all along

    def _forward(self, a: Action) -> None:
        if self.knobs.slowdown == 1.0:
            super()._forward(a)
        else:
            self._slow(super()._forward, a)

    def _backward(self, a: Action) -> None:
        if self.knobs.slowdown == 1.0:
            super()._backward(a)
        else:
            self._slow(super()._backward, a)

    def _backward_input(self, a: Action) -> None:
        if self.knobs.slowdown == 1.0:
            super()._backward_input(a)
        else:
            self._slow(super()._backward_input, a)

    def _backward_weight(self, a: Action) -> None:
        if self.knobs.slowdown == 1.0:
            super()._backward_weight(a)
        else:
            self._slow(super()._backward_weight, a)

    def _send(self, a: Action) -> None:
        delay = self.knobs.send_delay_per_byte.get(a.peer, 0.0) if self.knobs.send_delay_per_byte else 0.0
        if delay <= 0.0:
            super()._send(a)
            return
        wanted = time.perf_counter() - self.t0
        mine, (lo, hi), _, _ = self._link_rows(a)
        if hi > lo:
            stage = self.plan.stages[a.stage]
            shape, dtype = self.boundary[stage.last if a.kind is Kind.SEND_F else stage.first]
            numel = hi - lo
            for n in shape:
                numel *= n
            time.sleep(delay * numel * dtype.itemsize)
        before = len(self.sends)
        super()._send(a)
        if len(self.sends) > before:  # the link was "busy" from when the data was ready
            label, peer, size, _ = self.sends[-1]
            self.sends[-1] = (label, peer, size, wanted)
