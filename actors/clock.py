"""The one time base of an executor's iteration, shared by its compute spans and its exchange's transfer metrics.

Why one object: spans (the executor's) and send/receive times (the exchange's) are compared with each other by the
metrics (a device's busy time against its waits), so they must come from the same origin. On CPU a time is
``perf_counter`` seconds since the iteration began; on CUDA it is the index of a CUDA event recorded on the compute
stream (:class:`actors.gpu.EventClock`), resolved into seconds once, after the iteration's one synchronisation.
:func:`clock_for` picks the kind once per executor, so ``now`` carries no per-call branch on the hot path.
"""

from __future__ import annotations

import time
from typing import Any

from actors.gpu import EventClock

_perf = time.perf_counter


class Clock:
    """Host time: ``now()`` is seconds since :meth:`start`."""

    def __init__(self) -> None:
        self.t0 = _perf()
        self.t0_wall = time.time()

    def start(self) -> None:
        """A new iteration begins: its origin on this process's clock and on the wall clock (to align devices)."""
        self.t0_wall, self.t0 = time.time(), _perf()

    def now(self) -> float:
        return _perf() - self.t0

    def elapsed(self) -> float:
        """Host seconds since :meth:`start` (on CUDA too: the iteration's length as the host saw it)."""
        return _perf() - self.t0

    def resolve(self, spans: list[Any], sends: list[Any], recvs: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        """The iteration's records in seconds (host times already are)."""
        return spans, sends, recvs


class CudaClock(Clock):
    """CUDA events: ``now()`` records one on the compute stream and returns its index (see :class:`EventClock`)."""

    def __init__(self) -> None:
        super().__init__()
        self.events = EventClock()

    def start(self) -> None:
        super().start()
        self.events = EventClock()  # its event 0 is the origin every other event is measured from

    def now(self) -> float:
        return self.events.mark()

    def resolve(self, spans: list[Any], sends: list[Any], recvs: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        return self.events.resolve(spans, sends, recvs)


def clock_for(cuda: bool) -> Clock:
    return CudaClock() if cuda else Clock()
