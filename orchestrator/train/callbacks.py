"""Callbacks: the user's policies between iterations — evaluation, trackers, a stop condition, a checkpoint on demand.

Why: a user must be able to add what happens between steps without editing the job (Lightning's ``Callback``,
Ray Train's callbacks, torchtitan's components that own their cadence). A callback observes (``on_start``,
``on_step_end``, ``on_event``, ``on_end``) and may *ask* for an action by returning it from ``on_step_end``:
:class:`Checkpoint` or :class:`Stop`. It never calls the runtime: the job carries the actions out between
iterations, with nothing in flight, like its own policies' decisions::

    class StopAtLoss(orchestrator.Callback):
        def on_step_end(self, info):
            return orchestrator.Stop("converged") if info.loss < 0.1 else None

    ElasticJob(train, ..., callbacks=[StopAtLoss()]).fit(1000)

Steps are reported in order, each once, as they complete. With pipelined dispatch the next step may already
be running when ``on_step_end`` is called, so an action asked for at step ``k`` happens after step ``k`` or
``k + 1``. A callback's exception is the user's mistake (:class:`CallbackError`): reported once, by name, never
retried; the run ends on a committed checkpoint with the status ``failed``. The built-in progress line is a
callback too (:class:`Progress`).
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence, TextIO, Union

from tqdm import tqdm

from actors.user_code import UserCodeError
from orchestrator.core.errors import UserError

if TYPE_CHECKING:
    from orchestrator.train.fit_result import JobResult


@dataclass(frozen=True)
class StartInfo:
    """What a ``fit`` starts from: the step reached (a resumed run's), its target and where the run lives."""

    step: int
    target: int
    run_id: str
    storage: str
    plan: str
    resumed_from: int | None


@dataclass(frozen=True)
class StepInfo:
    """One completed step. ``step``: steps done after it (the first step of a fresh run is 1)."""

    step: int
    target: int
    loss: float
    iteration_s: float
    samples_per_s: float
    lr: float | None
    """The learning rate the step used: the first block optimizer's first parameter group (``None``: no optimizer)."""
    moves: int
    restarts: int
    failures: int
    usd_per_hour: float | None = None
    """The price of the offer the job runs on (``None``: unknown; see :mod:`orchestrator.elastic.ledger`)."""
    usd_total: float | None = None
    """The run's dollars so far."""


@dataclass(frozen=True)
class Checkpoint:
    """Ask for a committed checkpoint of the step reached."""

    reason: str = "callback"


@dataclass(frozen=True)
class Stop:
    """Ask the run to stop: the job finishes the step in flight, commits, records ``stopped`` and ``fit`` returns."""

    reason: str = "callback"


Action = Union[Checkpoint, Stop]


class Callback:
    """Subclass and override what you need; every method is optional (see the module docstring)."""

    def on_start(self, info: StartInfo) -> None:
        """Once per ``fit``, after the workers are up and the run resumed (before the first step)."""

    def on_step_end(self, info: StepInfo) -> Action | None:
        """After each completed step, in order; return :class:`Checkpoint` or :class:`Stop` to ask for one."""
        return None

    def on_event(self, event: dict[str, Any]) -> None:
        """Every event the job records (the lines of ``events.jsonl``), as it is recorded."""

    def on_end(self, result: JobResult) -> None:
        """Once per ``fit`` that returns (finished, or stopped by a :class:`Stop`)."""


class CallbackError(UserCodeError):
    """A user's callback raised: the run ends (committed, ``failed``), nothing is retried."""


class Callbacks:
    """The job's callbacks in order, and what they asked for: the one owner of pending actions and of a
    callback's failure. A failed callback is not called again; the job reads :attr:`failure` between steps."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        for cb in callbacks:
            if not isinstance(cb, Callback):
                raise UserError(f"callbacks: {cb!r} is not an orchestrator.Callback (subclass it)")
        self.callbacks = tuple(callbacks)
        self.pending: list[Action] = []
        self.failure: CallbackError | None = None

    def _call(self, cb: Callback, method: str, arg: Any) -> Any:
        if self.failure is not None:
            return None
        try:
            return getattr(cb, method)(arg)
        except Exception as exc:  # the user's code: reported once, by name, never retried
            name = f"{type(cb).__name__}.{method}"
            self.failure = CallbackError(f"callback {name} raised {type(exc).__name__}: {exc}", traceback.format_exc())
            return None

    def start(self, info: StartInfo) -> None:
        self.pending.clear()  # nothing asked in an earlier fit carries into this one
        for cb in self.callbacks:
            self._call(cb, "on_start", info)

    def step_end(self, info: StepInfo) -> None:
        for cb in self.callbacks:
            action = self._call(cb, "on_step_end", info)
            if action is None:
                continue
            if isinstance(action, (Checkpoint, Stop)):
                self.pending.append(action)
            elif self.failure is None:
                self.failure = CallbackError(f"callback {type(cb).__name__}.on_step_end returned {action!r}: return "
                                             "orchestrator.Checkpoint(), orchestrator.Stop(reason) or None", "")

    def event(self, record: dict[str, Any]) -> None:
        for cb in self.callbacks:
            self._call(cb, "on_event", record)

    def end(self, result: JobResult) -> None:
        for cb in self.callbacks:
            self._call(cb, "on_end", result)

    def take(self) -> list[Action]:
        """The actions asked for since the last call, in order (the job carries them out)."""
        actions, self.pending = self.pending, []
        return actions


def phase(text: str) -> None:
    """One start-up phase on stdout (profiling, planning, starting actors): nothing is silent before step 0."""
    print(f"[raypipe] {text} ...", flush=True)


class Progress(Callback):
    """The built-in progress, on stdout (never stderr, which stays for errors): a start line naming where the run
    resumed, then a tqdm bar when stdout is a terminal, else a line every ``every`` steps and at the last one, or
    every ``every_s`` seconds, whichever comes first (a log file gets lines, not a bar's carriage returns)."""

    def __init__(self, every: int = 10, every_s: float = 30.0, out: TextIO | None = None) -> None:
        self.every, self.every_s, self.out = every, every_s, out
        self._last = 0.0
        self._bar: tqdm | None = None

    def _print(self, line: str) -> None:
        out = self.out or sys.stdout
        print(line, file=out, flush=True)

    def on_start(self, info: StartInfo) -> None:
        where = f"resumed at step {info.resumed_from}" if info.resumed_from is not None else "from the seed"
        self._print(f"[raypipe] run {info.run_id}: training to step {info.target} {where} on {info.plan}")
        self._last = time.monotonic()
        out = self.out or sys.stdout
        if out.isatty():
            self._bar = tqdm(total=info.target, initial=info.step, file=out, desc="[raypipe]", unit="step", dynamic_ncols=True)

    def on_step_end(self, info: StepInfo) -> None:
        loss = f"{info.loss:.4f}" if math.isfinite(info.loss) else str(info.loss)
        lr = f" lr {info.lr:.3g}" if info.lr is not None else ""
        extra = (f" moves {info.moves}" if info.moves else "") + (f" failures {info.failures}" if info.failures else "")
        if self._bar is not None:
            self._bar.set_postfix_str(f"loss {loss}{lr} {info.samples_per_s:.1f} samples/s{extra}", refresh=False)
            self._bar.update(info.step - self._bar.n)
            return None
        now = time.monotonic()
        if info.step % self.every and info.step != info.target and now - self._last < self.every_s:
            return None
        self._last = now
        self._print(f"[raypipe] step {info.step}/{info.target} loss {loss}{lr} {info.samples_per_s:.1f} samples/s{extra}")
        return None

    def on_event(self, event: dict[str, Any]) -> None:
        if event.get("event") in ("stopped", "job_failed", "user_error", "migration_requested"):
            self.on_end(None)

    def on_end(self, result: Any) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


__all__ = ["Action", "Callback", "CallbackError", "Callbacks", "Checkpoint", "Progress", "StartInfo", "StepInfo", "Stop", "phase"]
