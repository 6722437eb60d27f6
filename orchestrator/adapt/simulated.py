"""The pipeline runtime's primitives over the simulator (:class:`SimulatedRuntime`), and the job's control over them
(:class:`SimulatedJob`): the controller's tests and benchmarks without Ray.

Each iteration is timed by :func:`orchestrator.costmodel.simulator.simulate` on the *true* cluster of that
iteration (speeds and bandwidths after the scenario's slowdowns and throttles), then reported the
way a runtime would report it: per-device compute seconds and per-link bytes and send seconds,
each multiplied by log-normal measurement noise. The controller sees only these metrics, never
the scenario, so tests exercise the same inference path the live job will use.

Moves are charged their hand-over time on the true cluster (via the shared
:func:`move_transfers`) plus a fixed overhead (barrier, schedule regeneration); restarts are
charged a fixed process restart plus checkpoint load at storage bandwidth, and from-checkpoint
restarts redo the iterations since the last checkpoint. ``wall_s`` accumulates all of it, so a
benchmark's total time is honest about stalls and replays.

Instead of log-normal noise, a :class:`NoiseTrace` recorded from a live runtime
(``benchmarks/noise_traces.py``) can be replayed: each iteration's true device speeds and link
bandwidths are scaled by the recorded multipliers, so the controller meets a real machine's
noise — its size, its correlations across devices and its bursts over time — on any plan.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from orchestrator.core.cluster import GBPS, Cluster
from orchestrator.costmodel.terms import shipped_bytes, transfer_time
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.core.profile import Profile
from orchestrator.schedule.ir import COMPUTE_KINDS
from orchestrator.costmodel.simulator import SimOptions, simulate
from orchestrator.adapt.controller import Controller
from orchestrator.adapt.faults import FaultSchedule
from orchestrator.adapt.handle import (
    SHIPPED_STATE_FACTOR, IterationMetrics, Link, MoveReport, RestartReport, check_plan_alive, handover_time, move_transfers,
)
from orchestrator.adapt.policies import RecoverInPlace, full_replan, on_worker_death
from orchestrator.adapt.states import ControllerConfig, StepRecord


@dataclass(frozen=True)
class NoiseTrace:
    """Per-iteration multipliers recorded from a live run with nothing changed (median 1 each):
    ``speed[d][k]`` for device ``d``, ``link[j][k]`` for the ``j``-th used link. Replay maps
    device ``d`` to recorded device ``d mod len(speed)`` and link ``(a, b)`` of an ``n``-device
    cluster to recorded link ``(a·n + b) mod len(link)``, starting at iteration ``offset``."""

    speed: tuple[tuple[float, ...], ...]
    link: tuple[tuple[float, ...], ...]
    offset: int = 0

    @classmethod
    def load(cls, path: str | Path, offset: int = 0) -> "NoiseTrace":
        data = json.loads(Path(path).read_text())
        speed = tuple(tuple(float(x) for x in data["speed"][d]) for d in sorted(data["speed"], key=int))
        link = tuple(tuple(float(x) for x in v) for v in data["link"]) or ((1.0,),)
        if not speed or any(len(v) == 0 or min(v) <= 0 for v in speed + link):
            raise ValueError(f"{path}: a noise trace needs positive multipliers for at least one device")
        return cls(speed, link, offset)

    def speeds(self, k: int, n: int) -> list[float]:
        return [self.speed[d % len(self.speed)][(k + self.offset) % len(self.speed[d % len(self.speed)])] for d in range(n)]

    def links(self, k: int, n: int) -> np.ndarray:
        out = np.ones((n, n))
        for a in range(n):
            for b in range(n):
                row = self.link[(a * n + b) % len(self.link)]
                out[a, b] = row[(k + self.offset) % len(row)]
        return out


@dataclass(frozen=True, kw_only=True)
class SimulatedCosts:
    """What switching costs in the simulated world (the controller must learn it, not read it)."""

    noise: float = 0.03
    """Std-dev of the log-normal noise on every reported timing (0: exact)."""
    move_overhead_s: float = 0.05
    """Fixed stall of a live move on top of the hand-over transfers."""
    restart_fixed_s: float = 20.0
    """Stopping all actors and starting new ones (process start, NCCL/gloo init, warm-up)."""
    storage_gbps: float = 8.0
    """Checkpoint read bandwidth per actor on restart."""
    checkpoint_every: int = 10
    """Iterations between checkpoints; a from-checkpoint restart redoes up to this many."""
    recovery_fixed_s: float = 2.0
    """A recovery in place's fixed part (the survivors' re-formation; 0.28 s measured on gloo, 2 s allowed for a GPU
    cluster's NCCL communicators, as ``benchmarks/spot_goodput.py`` calibrates it)."""
    shipped_factor: float = SHIPPED_STATE_FACTOR
    trace: NoiseTrace | None = None
    """Replay recorded noise instead of log-normal noise (``noise`` is then ignored)."""


def restart_downtime(plan: Plan, profile: Profile, costs: SimulatedCosts) -> float:
    """Fixed restart time plus the largest stage's state read from checkpoint storage."""
    biggest = max(profile.param_bytes(s.first, s.last) for s in plan.stages)
    return costs.restart_fixed_s + transfer_time(shipped_bytes(biggest, costs.shipped_factor), 1.0 / (costs.storage_gbps * GBPS))


class SimulatedRuntime:
    """The pipeline runtime's primitives over the simulator, named as :class:`~orchestrator.train.runtime.PipelineRuntime`
    names them (``plan``, ``step``, ``move_live``, ``restart_on``, ``recover_in_place``) plus :meth:`run_step` for
    one iteration (the runtime's ``submit_step`` then ``complete_step``).

    ``step`` counts completed training iterations (it goes back on a restart from a checkpoint); ``step_index``
    counts calls to :meth:`run_step` and indexes the scenario, so faults happen at a fixed point in time, as they
    would on a real cluster. ``wall_s`` accumulates iterations, stalls and replays.
    """

    def __init__(self, profile: Profile, cluster: Cluster, plan: Plan, faults: FaultSchedule = FaultSchedule(),
                 costs: SimulatedCosts = SimulatedCosts(), seed: int = 0) -> None:
        plan.check_against(profile.num_blocks, cluster.size)
        faults.validate(cluster)
        self.profile, self.cluster, self.faults, self.costs = profile, cluster, faults, costs
        self.plan = plan
        self._rng = np.random.default_rng(seed)
        self.step = 0
        self.step_index = 0
        self.wall_s = 0.0
        self.last_checkpoint = 0
        self._dead: set[int] = set()
        self._reported_alive = set(self._alive_now())
        bad = set(plan.devices) - self._reported_alive
        if bad:
            raise UserError(f"initial plan uses device(s) {sorted(bad)} that are not up")
        self.log: list[tuple[str, int, float]] = []  # (event, step_index, seconds) for benchmarks

    def alive_devices(self) -> tuple[int, ...]:
        return tuple(sorted(self._alive_now()))

    def run_step(self) -> IterationMetrics:
        """One iteration, timed on the true cluster of this point of the scenario; ``completed=False`` with
        ``lost_devices`` when a device of the plan died in it (its time spent, the step not taken)."""
        cond = self.faults.conditions(self.cluster, self.step_index)
        self.step_index += 1
        self._dead |= set(cond.killed_now)
        alive = self._alive_now()
        lost = tuple(sorted(self._reported_alive - alive))
        new = tuple(sorted(alive - self._reported_alive))
        self._reported_alive = set(alive)
        trace = self.costs.trace
        if trace is not None:  # the recorded noise is real slowness: time the iteration under it
            k, n = self.step_index - 1, cond.cluster.size
            speeds = [d.speed * m for d, m in zip(cond.cluster.devices, trace.speeds(k, n))]
            cond = replace(cond, cluster=cond.cluster.with_speeds(speeds).with_bandwidth(cond.cluster.bandwidth * trace.links(k, n)))
        result = simulate(self.plan, self.profile, cond.cluster, SimOptions())
        if set(self.plan.devices) & (set(lost) | set(cond.killed_now)):
            self.wall_s += result.iteration_s
            self.log.append(("failed", self.step_index - 1, result.iteration_s))
            return IterationMetrics(self.step, result.iteration_s, self.plan, completed=False, lost_devices=lost, new_devices=new)
        compute: dict[int, float] = {}
        link_bytes: dict[Link, float] = {}
        link_s: dict[Link, float] = {}
        for ev in result.events:
            if ev.kind in COMPUTE_KINDS:
                compute[ev.device] = compute.get(ev.device, 0.0) + (ev.end - ev.start)
            elif ev.kind == "transfer" and ev.link is not None and ev.end > ev.start:
                dur = ev.end - ev.start
                link_bytes[ev.link] = link_bytes.get(ev.link, 0.0) + dur * cond.cluster.link(*ev.link)
                link_s[ev.link] = link_s.get(ev.link, 0.0) + dur
        noisy_iter = result.iteration_s * self._noise()
        self.wall_s += noisy_iter
        self.step += 1
        if self.step % self.costs.checkpoint_every == 0:
            self.last_checkpoint = self.step
        self.log.append(("iteration", self.step_index - 1, noisy_iter))
        return IterationMetrics(self.step - 1, noisy_iter, self.plan, {d: t * self._noise() for d, t in compute.items()},
                                link_bytes, {k: t * self._noise() for k, t in link_s.items()}, lost_devices=lost, new_devices=new)

    def move_live(self, plan: Plan) -> MoveReport:
        """A live move: the hand-over of :func:`move_transfers` on the true cluster plus a fixed overhead."""
        self._check_plan(plan)
        cond = self.faults.conditions(self.cluster, self.step_index)
        moves = move_transfers(self.plan, plan, self.profile, cond.cluster, frozenset(self._dead), self.costs.shipped_factor)
        stall = handover_time(moves, cond.cluster) + self.costs.move_overhead_s
        self.wall_s += stall
        self.plan = plan
        self.log.append(("move", self.step_index, stall))
        return MoveReport(sum(t.nbytes for t in moves), stall, plan)

    def restart_on(self, plan: Plan, from_checkpoint: bool) -> RestartReport:
        """Every worker restarts on ``plan``: from the newest checkpoint (the steps since it are redone) or from a
        checkpoint of the live state written first (a planned restart)."""
        self._check_plan(plan)
        downtime = restart_downtime(plan, self.profile, self.costs)
        replayed = self.step - self.last_checkpoint if from_checkpoint else 0
        self.step -= replayed
        self.wall_s += downtime
        self.plan = plan
        self.log.append(("restart", self.step_index, downtime))
        return RestartReport(downtime, replayed, plan)

    def recover_in_place(self, dead: tuple[int, ...], plan: Plan) -> RestartReport:
        """The survivors keep their processes and continue on ``plan`` from their snapshot of the last step: a
        re-formation, and the dead devices' blocks read back (from a peer's copy or storage) at storage speed."""
        self._check_plan(plan)
        lost = sum(self.profile.param_bytes(s.first, s.last) for s in self.plan.stages if set(s.devices) <= set(dead))
        downtime = self.costs.recovery_fixed_s + transfer_time(shipped_bytes(lost, self.costs.shipped_factor),
                                                               1.0 / (self.costs.storage_gbps * GBPS))
        self.wall_s += downtime
        self.plan = plan
        self.log.append(("recovered", self.step_index, downtime))
        return RestartReport(downtime, 0, plan)

    def _alive_now(self) -> set[int]:
        return set(self.faults.alive_at(self.cluster, self.step_index)) - self._dead

    def _check_plan(self, plan: Plan) -> None:
        check_plan_alive(plan, self.profile.num_blocks, self.cluster, self._alive_now())

    def _noise(self) -> float:
        if self.costs.trace is not None:
            return 1.0
        sigma = self.costs.noise
        return float(np.exp(self._rng.normal(0.0, sigma))) if sigma > 0 else 1.0


class SimulatedJob:
    """The elastic job's control over a :class:`SimulatedRuntime`, for the controller's tests and benchmarks: the
    same policies, asked in the same order as :class:`~orchestrator.elastic.job_loop.ElasticJob` asks them between
    iterations — a death goes to the failure policy (:func:`~orchestrator.adapt.policies.on_worker_death`: in place
    onto a re-plan over the survivors), then the controller observes the iteration and its act is carried out (moves
    in order, or a planned restart) and reported back. What ``ElasticJob`` adds around it (storage, checkpoints,
    notices, callbacks) needs no simulation to test the controller.

    ``profile``: the profile the controller believes (default: the true one the runtime is timed with);
    ``controller``: one built by the caller (a subclass under test) instead.
    """

    def __init__(self, runtime: SimulatedRuntime, config: ControllerConfig = ControllerConfig(), profile: Profile | None = None,
                 clock: Callable[[], float] = time.perf_counter, controller: Controller | None = None) -> None:
        self.runtime = runtime
        self.controller = controller or Controller(profile or runtime.profile, runtime.cluster, runtime.plan,
                                                   runtime.alive_devices(), config, clock=clock)
        self.failures = 0
        self.records: list[StepRecord] = []

    def fit(self, iterations: int) -> list[StepRecord]:
        """``iterations`` more iterations; the controller's records of those that completed (a failed one is the
        failure policy's, as in the job: counted in :attr:`failures`, never observed)."""
        out = [r for r in (self._iteration() for _ in range(iterations)) if r is not None]
        self.records += out
        return out

    def close(self) -> None:
        """No background re-planning outlives the job (the controller stays readable)."""
        self.controller.close()

    def __enter__(self) -> "SimulatedJob":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _iteration(self) -> StepRecord | None:
        rt = self.runtime
        m = rt.run_step()
        if not m.completed:
            self._failed(tuple(d for d in m.lost_devices if d in m.plan.devices))
            return None
        out = self.controller.observe(m, rt.plan, rt.alive_devices())
        if out.act is None:
            return out.record
        if out.act.kind == "restart":
            reports: list[MoveReport | RestartReport] = [rt.restart_on(out.act.plans[0], from_checkpoint=False)]
        else:
            reports = [rt.move_live(p) for p in out.act.plans]
        return self.controller.acted(out, reports)

    def _failed(self, dead: tuple[int, ...]) -> None:
        self.failures += 1
        rt = self.runtime
        alive = rt.alive_devices()
        decision = on_worker_death(self.failures, 10**9, rt.plan, dead, sorted(set(alive) | set(dead)), in_place=True)
        believed, model, template = self.controller.profile, self.controller.model(), rt.plan  # what the job knows
        if isinstance(decision, RecoverInPlace):
            rt.recover_in_place(decision.dead, full_replan(believed, model, decision.survivors, template))
        else:
            rt.restart_on(full_replan(believed, model, alive, template), from_checkpoint=True)
