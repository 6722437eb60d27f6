"""The one training loop: submit ahead → complete → observe → the policies decide → the loop acts.

Every way to train goes through :class:`TrainingLoop`: the fixed-plan trainer's ``fit``
(:class:`~orchestrator.train.trainer.PipelineTrainer`: the policies only checkpoint on schedule and restart
after a death, within a budget) and :class:`~orchestrator.elastic.job_loop.ElasticJob`'s (the controller,
evacuation, growth, spot and failure policies). The loop alone dispatches iterations, counts failures and
finishes the iteration in flight before anything acts; what happens between iterations is the policies'
(:class:`Policies`). Shaped like torchtitan's ``train()`` read top to bottom, with Ray Train v2's split between a
controller loop and the policies it consults.

Pipelined dispatch: the run after the current one is submitted before the current one is gathered, so the
workers start it as soon as they finish (each runs one call at a time, in submission order) instead of waiting
for the driver's round trip — unless a policy holds (a decision is due at that step: a checkpoint, a notice, a
rehearsed fault), so every action runs with nothing in flight. A run is one step or several consecutive steps
executed back to back in one remote call per worker (:meth:`Policies.run_length`), which pays Ray's per-call
work once per run.

Timing (``MeasuredIteration.iteration_s``): the time between the completions of consecutive steps. The first
step of a run is timed on the driver from the later of "run submitted" and "previous run gathered" (when the run
was submitted before that) to "run gathered", the later steps of a run on the workers' clocks; summed, they are
the training wall time less what ran between runs with nothing in flight (checkpoints, moves, recoveries).
"""

from __future__ import annotations

import time
from typing import Protocol, Sequence

from actors.group import PipelineActorError
from actors.metrics import MeasuredIteration
from orchestrator.train.fit_result import InFlight
from orchestrator.train.runtime import PipelineRuntime


class Policies(Protocol):
    """What the loop asks between iterations. Every method runs on the loop's thread with no step in flight,
    except :meth:`hold` and :meth:`run_length` (asked while choosing what to submit) and :meth:`completed`."""

    def before(self, step: int) -> None:
        """Before the step ``step`` is submitted (rehearsal knobs pushed, a stop signal honoured)."""

    def run_length(self, step: int, target: int) -> int:
        """How many consecutive steps one call runs from ``step`` (at least one, never past ``target``)."""

    def hold(self, done: int, target: int) -> bool:
        """Whether a decision is due once ``done`` steps have completed: nothing is submitted past it."""

    def completed(self, run: Sequence[MeasuredIteration]) -> None:
        """Every run gathered, in order, including one finished early for an action."""

    def between(self, run: Sequence[MeasuredIteration], target: int) -> None:
        """Observe the run the loop just gathered, decide, act (calling :meth:`TrainingLoop.finish_in_flight`
        before acting). A worker's death while acting propagates as :class:`PipelineActorError`."""

    def failed(self, exc: PipelineActorError, failures: int) -> None:
        """A worker died (the ``failures``-th death of this loop; every step in flight is discarded): recover,
        or raise to end the run."""


def every(n: int, done: int) -> bool:
    """Whether something done every ``n`` steps (0: never) is due once ``done`` steps have completed."""
    return bool(n) and done % n == 0


class TrainingLoop:
    """Runs ``runtime`` to a target step, asking ``policies`` between runs (see the module docstring)."""

    def __init__(self, runtime: PipelineRuntime, policies: Policies, pipelined: bool = True) -> None:
        self.runtime, self.policies, self.pipelined = runtime, policies, pipelined
        self.failures = 0  # worker deaths, counted here and nowhere else
        self.done_at: float | None = None  # when the newest step completed (a recovery's stall runs from it)
        self._ahead: InFlight | None = None
        self._last_done: float | None = None  # when the previous run was gathered, if the next was submitted before
        self.stopped = False  # a policy ended the run early (a user's Stop): no step is submitted after it

    def dispatch(self, pipelined: bool) -> None:
        """Submit the next run before gathering this one (``pipelined``) or not, from the next run on."""
        self.pipelined = pipelined

    def stop(self) -> None:
        """End :meth:`run` at the step reached (asked by a policy between runs, after it drained what was in flight)."""
        self.stopped = True

    def run(self, target: int) -> None:
        """Train to step ``target`` (at or past it, or once stopped: return at once); ends with nothing in flight."""
        runtime = self.runtime
        self.stopped = False
        try:
            while runtime.step < target and not self.stopped:
                self.policies.before(runtime.step)
                run = self._next(target)
                if run is None:  # a worker died: the failure policy recovered (or raised)
                    continue
                try:
                    self.policies.between(run, target)
                except PipelineActorError as exc:  # a worker died in a step finished for an action, or during one
                    self._failed(exc)
            self.finish_in_flight()
        finally:
            self.discard_in_flight()  # an error other than a worker's death left a run in flight

    def _next(self, target: int) -> list[MeasuredIteration] | None:
        """Gather the next run, with the one after it submitted first when no policy holds."""
        runtime, policies = self.runtime, self.policies
        step = runtime.step
        flight = self._ahead if self._ahead is not None and self._ahead.step == step else None
        if flight is None:
            self.discard_in_flight()
            flight = runtime.submit_step(step, policies.run_length(step, target))
        self._ahead = None
        end = step + flight.count
        if self.pipelined and end < target and not policies.hold(end, target):
            self._ahead = runtime.submit_step(end, policies.run_length(end, target))
        try:
            run = runtime.complete_run(flight, self._last_done)
        except PipelineActorError as exc:
            self._failed(exc)
            return None
        self.done_at = time.perf_counter()
        self._last_done = self.done_at if self._ahead is not None else None
        policies.completed(run)
        return run

    def finish_in_flight(self) -> None:
        """Gather the run in flight (if any) so that an action can run."""
        if self._ahead is not None:
            flight, self._ahead = self._ahead, None
            run = self.runtime.complete_run(flight, self._last_done)
            self.done_at = time.perf_counter()
            self.policies.completed(run)
        self._last_done = None

    def discard_in_flight(self) -> None:
        if self._ahead is not None:
            flight, self._ahead = self._ahead, None
            self.runtime.discard_step(flight)
        self._last_done = None

    def _failed(self, exc: PipelineActorError) -> None:
        """A worker died: what was in flight is discarded, the death counted once, here; the policy decides."""
        self.discard_in_flight()
        self.failures += 1
        self.policies.failed(exc, self.failures)


__all__ = ["Policies", "TrainingLoop", "every"]
