"""What a job has cost: the offer's price in force × wall time, from the job's start to its last event.

Why: a spot user's first question is what the run has cost, and what its preemptions and migrations cost. The
job knows the price of the offer it runs on (its price view, replayed changes included) and how long it has run;
it accrues dollars whenever it reports (the run record's progress, its last event), so a price change counts from
when the job saw it. The run's total is every earlier job's ``usd_job`` (carried in the run record) plus this one's.
"""

from __future__ import annotations

import time
from typing import Callable


class Ledger:
    """One job's dollars (the one owner of them; see the module docstring)."""

    def __init__(self, before: float, before_lost: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.before, self.before_lost = before, before_lost  # the run's dollars (and lost ones) before this job
        self.job = 0.0
        self.lost = 0.0
        self.usd_per_hour: float | None = None
        self._clock = clock
        self._since = clock()
        self._priced = False

    def accrue(self, usd_per_hour: float | None) -> float:
        """Dollars since the last call at the rate in force until now, then ``usd_per_hour`` from now on;
        returns the job's total."""
        now = self._clock()
        rate = self.usd_per_hour if self._priced else usd_per_hour  # the first price known counts from the start
        if rate is not None:
            self.job += rate * max(0.0, now - self._since) / 3600.0
        self._since, self.usd_per_hour, self._priced = now, usd_per_hour, True
        return self.job

    def lose(self, seconds: float) -> None:
        """Dollars of work lost or stalled (a recovery's stall and the steps it computes again), at the price in
        force: part of the job's dollars, also reported apart (``usd_lost``)."""
        self.lost += (self.usd_per_hour or 0.0) * max(0.0, seconds) / 3600.0

    @property
    def total(self) -> float:
        return self.before + self.job


__all__ = ["Ledger"]
