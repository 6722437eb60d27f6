"""Fault injection for rehearsals and tests: a slower device, slower outgoing links, a crash.

Opt-in: :func:`install` wraps entries of an executor's call table (``Executor.calls``, one
handler per program action, called with the action and its position) and is applied by the worker only once a test or a rehearsal asked
for injection (:meth:`actors.stage_worker.StageWorker.set_faults`, ``arm_kill``, or the :class:`Kills` a job
spec carries, which :func:`arm_kills` puts on a trainer). An executor nobody injects into
runs its handlers unwrapped: no branch of this module is on the hot path of a normal job.

* A slowdown factor sleeps ``(factor-1)x`` the compute's own CPU seconds (deterministic under
  load) after every compute action *inside* its span (so the slowdown is visible in measured
  compute time, and gradients are untouched).
* A per-peer delay sleeps ``delay x bytes`` before each send and counts that wait as transfer time.
* A kill at ``(step, device)`` ends the process (``os._exit``) halfway through that step's
  program, like a crashed process.

The knobs live on the worker, not the executor, so they survive re-partitioning (a co-located
job does not go away because we moved blocks); :func:`install` is applied to every executor the
worker builds after injection was first asked for.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterable

from orchestrator.schedule.ir import Action, Kind

if TYPE_CHECKING:
    from actors.execution import Executor, Handler

KILL_EXIT_CODE = 17
_NOT_COMPUTE = frozenset({Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B, Kind.ALL_REDUCE, Kind.STEP})


@dataclass(frozen=True)
class Kills:
    """Where workers die: ``(step, device)`` pairs. Carried by the job spec (``JobSpec.injected``) because a kill
    must reach the fresh processes a recovery starts; nothing outside this module reads it."""

    at: frozenset[tuple[int, int]] = frozenset()
    hangs: frozenset[tuple[int, int]] = frozenset()  # of ``at``: these block for ever instead of exiting (a hang)


def kills_of(spec: Any) -> frozenset[tuple[int, int]]:
    return spec.injected.at if isinstance(spec.injected, Kills) else frozenset()


def with_kills(spec: Any, kills: Iterable[tuple[int, int]], hangs: Iterable[tuple[int, int]] | None = None) -> Any:
    """``spec`` (a :class:`~actors.job_spec.JobSpec`) with exactly these kills armed (none: no injection); ``hangs``
    (default: those the spec had) are the kills that block instead of exiting."""
    kills = frozenset(kills)
    hung = frozenset(hangs) if hangs is not None else (spec.injected.hangs if isinstance(spec.injected, Kills) else frozenset())
    return replace(spec, injected=Kills(kills, hung & kills) if kills else None)


@dataclass
class FaultKnobs:
    """Injected slowness of this worker's device and of its outgoing links (see module docstring)."""

    slowdown: float = 1.0
    send_delay_per_byte: dict[int, float] = field(default_factory=dict)  # peer device -> s/byte

    @property
    def active(self) -> bool:
        return self.slowdown != 1.0 or any(self.send_delay_per_byte.values())

    def set(self, slowdown: float, send_delay_per_byte: dict[int, float]) -> None:
        """New knobs, in place: the hooks installed on every executor read this object at each call."""
        self.slowdown = float(slowdown)
        self.send_delay_per_byte = {int(k): float(v) for k, v in send_delay_per_byte.items()}


def install(ex: "Executor", knobs: FaultKnobs) -> "Executor":
    """Wrap ``ex``'s call table with the hooks of ``knobs`` (read at every call, so knobs set later
    apply) and the kill hook of the spec's :class:`Kills` (:meth:`Executor.wrap_calls`: once); returns ``ex``."""
    # the first compute action from the middle on: a kill or a hang mid-step, in the device's own work (a hang in a
    # receive would look like waiting for a peer, which is what the hung rank's peers do)
    middle = next((i for i in range(len(ex.program) // 2, len(ex.program)) if ex.program[i].kind not in _NOT_COMPUTE),
                  len(ex.program) // 2)

    def wrap(i: int, action: Action, call: "Handler") -> "Handler":
        if action.kind in (Kind.SEND_F, Kind.SEND_B):
            call = _delayed_send(ex, knobs, call)
        elif action.kind not in _NOT_COMPUTE:
            call = _slowed(ex, knobs, call)
        return _killing(ex, call) if i == middle else call

    ex.wrap_calls(wrap)
    return ex


def _slowed(ex: "Executor", knobs: FaultKnobs, handler: "Handler") -> "Handler":
    def run(a: Action, index: int) -> None:
        factor = knobs.slowdown
        if factor == 1.0:
            handler(a, index)
            return
        before = len(ex.spans)
        cpu0 = time.process_time()
        handler(a, index)
        if len(ex.spans) > before:
            # The extra time follows the work the action did (the process's CPU seconds), not its
            # wall time: on a CPU box where actors share cores, wall time also counts the waits for
            # a core, so a wall-time slowdown would grow and shrink with everyone else's load.
            time.sleep(max(0.0, (factor - 1.0) * (time.process_time() - cpu0)))
            ex.stretch_last_span(ex.now())  # the device was busy all along

    return run


def _delayed_send(ex: "Executor", knobs: FaultKnobs, handler: "Handler") -> "Handler":
    def run(a: Action, index: int) -> None:
        delay = knobs.send_delay_per_byte.get(a.peer, 0.0) if knobs.send_delay_per_byte else 0.0
        if delay <= 0.0:
            handler(a, index)
            return
        wanted = ex.now()  # host seconds: delays are injected on CPU workers only
        _, (lo, hi), _, _ = ex.tables.link_rows(a)
        if hi > lo:
            stage = ex.plan.stages[a.stage]
            shape, dtype = ex.boundary[stage.last if a.kind is Kind.SEND_F else stage.first]
            numel = hi - lo
            for n in shape:
                numel *= n
            time.sleep(delay * numel * dtype.itemsize)
        before = len(ex.exchange.sends)
        handler(a, index)
        ex.exchange.backdate_send(before, wanted)  # the link was "busy" from when the data was ready

    return run


def _killing(ex: "Executor", handler: "Handler") -> "Handler":
    def run(a: Action, index: int) -> None:
        here = (ex.step_index, ex.device)
        if here in kills_of(ex.spec):
            if here in ex.spec.injected.hangs:  # a hang: no progress, no error, until the driver ends this process
                while True:
                    time.sleep(1.0)
            os._exit(KILL_EXIT_CODE)  # die mid-iteration like a crashed process would
        handler(a, index)

    return run


def arm_kills(runtime: Any, kills: Iterable[tuple[int, int]]) -> Any:
    """Opt-in crash rehearsal on a :class:`~orchestrator.train.runtime.PipelineRuntime` (a test or a benchmark
    arms it): for each ``(step, device)`` that device's worker dies halfway through that step, once. Goes through the
    runtime's own interface (:meth:`~orchestrator.train.runtime.PipelineRuntime.rehearse_kills`), which drops a kill
    that fired before fresh processes are configured. A trainer is armed through its runtime. Returns what it was given."""
    getattr(runtime, "runtime", runtime).rehearse_kills(kills)
    return runtime
