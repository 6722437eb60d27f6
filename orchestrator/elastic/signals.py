"""How a job ends other than by finishing: a stop signal, or more deaths than its budget.

Ray's ``ray job stop`` sends SIGTERM to the driver (then SIGKILL after a grace period), and a user
presses Ctrl-C: both should leave the run on a committed checkpoint of the step reached, not lose
the steps since the last periodic one. :class:`StopSignals` only *records* the signal; the job loop
checks it between iterations, commits and raises :class:`JobStopped`. A second Ctrl-C while it
commits interrupts as Python normally does.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


class JobFailed(RuntimeError):
    """The job gave up: more worker deaths than ``RunConfig.max_failures`` (the newest committed
    checkpoint stays loadable). Drivers exit 1 with this one line."""


class JobStopped(SystemExit):
    """The job stopped on a signal after committing a checkpoint of the step it reached.

    A :class:`SystemExit` whose ``code`` is 128 + the signal's number: a driver that does not catch it exits as a
    shell expects of a stopped program (130 after Ctrl-C, 143 after ``ray job stop``'s SIGTERM) with no
    traceback, whatever wraps its ``main``. The job prints its one line on stderr when it raises it."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.message, self.signum = message, signum
        self.code = 128 + signum

    def __str__(self) -> str:
        return self.message


class MigrationRequested(RuntimeError):
    """A supervised job committed a checkpoint and asked its supervisor to move the run
    (:mod:`orchestrator.supervise`); the driver exits with :data:`EXIT_MIGRATE`."""


EXIT_MIGRATE = 75  # EX_TEMPFAIL: "try again later" — elsewhere, as the supervisor will


class StopSignals:
    """Records SIGTERM/SIGINT while a ``fit`` runs (main thread only; elsewhere it does nothing)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: do not wait for the commit
        self.received = signum

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


__all__ = ["EXIT_MIGRATE", "JobFailed", "JobStopped", "MigrationRequested", "StopSignals"]
