"""The adaptive controller: an explicit state machine that observes each completed training iteration.

::

    WARMUP ──(warm-up iterations done)──▶ ADAPTING ◀──(model or membership changed)── STEADY
                                            │  Switch: a move / restart, stay          ▲
                                            └──────────── Stay ───────────────────────┘

The controller is a policy, never a loop: :meth:`Controller.observe` takes one iteration's metrics (with the
plan and the devices up), folds them into the monitor (:mod:`.monitor`) and returns what to do as
a typed :class:`Act` (live moves or a restart) or nothing; the job that runs it
(:class:`~orchestrator.elastic.job_loop.ElasticJob`, or :class:`~orchestrator.adapt.simulated.SimulatedJob` over the
simulated runtime) carries the act out and hands the measured reports back through :meth:`Controller.acted`, which
calibrates what moves and restarts really cost. A death is not the controller's: the job's failure policy
(:func:`~orchestrator.adapt.policies.on_worker_death`) recovers, and the controller sees the devices gone at its next
observation. Decisions come from pure policies (:mod:`.policies`); the controller keeps the few facts a policy must
not: the monitor state, the rest of a committed multi-move path, and calibrations of what moves and restarts really
cost (from their reports).

Deciding (in ADAPTING): on the believed cluster, the vectorized :class:`CostModel` ranks every
two-worker move; :func:`walk` repeats the best one; :func:`path_to` gives the moves to a full
re-plan's partition (for straight plans — greedy walks can stop in local optima). Each resulting
destination, and the current plan, is then timed by the real simulator, and each path is priced
by its hand-over transfers and per-move overhead as earlier moves calibrated them
(:mod:`.calibration`). The arbiter picks. With ``use_restart`` the stop-and-restart onto a full re-plan is one more option (the baseline when
``use_moves`` is off).

Converging fast without chasing noise (issue 15): a chosen path is carried out in the same pause
as one hand-over to its end; the arbiter's noise floor is the iteration time's variation with the
machine-wide load factored out, or the believed speeds' standard error where that is larger —
except for a device whose change the monitor has just confirmed (:meth:`Controller.noise`); and
after a move the devices whose work changed re-learn their speed silently
(:func:`~orchestrator.adapt.monitor.relearn`), so a move's own side effects on what they
are observed to do do not start the next move — and the controller decides again once they have
learned (a change that arrived meanwhile became their baseline unreported, and is acted on then).

Not chasing its own model's errors: a profile off on some blocks puts its error into the speeds of
the devices that run them, which moves with the devices. So a plan already run since the last
confirmed change is judged by its measured iteration times (:mod:`.tried`), a move made on the
controller's own initiative is checked against the gain it delivered (the miss is a noise floor
for later predicted gains), and moves are priced by what earlier moves stalled where that is less
than the hand-over the believed links predict.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from orchestrator.core.cluster import GBPS, Cluster
from orchestrator.core.plan import Plan
from orchestrator.core.profile import Profile
from orchestrator.costmodel.estimate import CostModel, Layout
from orchestrator.adapt.handle import IterationMetrics, MoveReport, RestartReport, handover_time, move_transfers
from orchestrator.costmodel.terms import shipped_bytes, transfer_time
from orchestrator.adapt.monitor import (
    Observation, initial_state, log_noise, model_cluster, observe, relearn, relearning, settled_links, speed_error,
)
from orchestrator.planners.moves import best_moves, path_to, walk
from orchestrator.adapt.simcache import SimCache
from orchestrator.adapt.policies import Arbiter, Decision, ExplicitArbiter, Option, Stay, Switch
from orchestrator.adapt.calibration import Calibration
from orchestrator.adapt.replan import Replanner
from orchestrator.adapt.tried import Check, Tried
from orchestrator.adapt.states import ControllerConfig, ControllerState, StepRecord, Transition  # re-exported


@dataclass(frozen=True)
class Act:
    """What the controller's decision needs done, in order: ``move``/``path-move`` — one live move per plan of
    ``plans`` (a path); ``restart`` — stop and restart onto ``plans[0]`` from the live state (a planned restart)."""

    kind: str  # "move" | "path-move" | "restart"
    plans: tuple[Plan, ...]


@dataclass(frozen=True)
class Observed:
    """:meth:`Controller.observe`'s answer: the record of this iteration's decision and the act to carry out."""

    record: StepRecord
    act: Act | None


@dataclass
class Controller:
    profile: Profile
    nominal: Cluster
    """The nominal cluster: every device the job may have, by id, with its nominal figures."""
    initial_plan: Plan
    """The plan training starts on."""
    initial_alive: tuple[int, ...]
    """The devices up at the start."""
    config: ControllerConfig = ControllerConfig()
    clock: Callable[[], float] = time.perf_counter
    arbiter: Arbiter | None = None
    state: ControllerState = field(default=ControllerState.WARMUP, init=False)
    transitions: list[Transition] = field(default_factory=list, init=False)
    history: list[StepRecord] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._nominal: Cluster = self.nominal
        self._plan: Plan = self.initial_plan  # as of the last observation (or act carried out)
        self._alive: tuple[int, ...] = tuple(self.initial_alive)
        self._arbiter: Arbiter = self.arbiter or ExplicitArbiter(self.config.arbiter)
        self._monitor = initial_state(self._nominal, self._alive)
        self._warm = 0
        self._path: tuple[Plan, ...] = ()
        self._cal = Calibration(self.config.move_overhead_s, self.config.restart_fixed_s, alpha=self.config.calibration_alpha)
        self._tried = Tried()
        self._check: Check | None = None
        self._initiative = False
        self._model_error = 0.0  # how far the last checked move's realized gain was from its prediction (log sd)
        self._steps = 0
        self._iteration_logs: tuple[float, ...] = ()  # recent completed iterations, for the noise floor
        self._sims = SimCache(self.profile)
        tol = self.config.replan_reuse_tol
        self._replanner = Replanner(self.profile, self.config.replan_algorithm, self.config.monitor.enter if tol is None else tol,
                                    self._sims)
        if self.config.plan_ahead:
            # Start-up: plan the nominal cluster now, so the first decision finds it ready (the
            # controller is built before training starts, like the initial plan).
            self._replanner.prepare(self.model(), self._alive, self._plan, self._replans_wanted(self._plan, self._alive), background=False)

    # ----- public -----
    def model(self) -> Cluster:
        """The believed cluster (observed speeds and bandwidths) decisions are made on."""
        return model_cluster(self._monitor, self._nominal)

    def set_horizon(self, total_iterations: int | None) -> None:
        """The iteration training ends at (a later ``fit`` of the same job): moves pay over what is left."""
        self.config = replace(self.config, total_iterations=total_iterations)

    def observe(self, metrics: IterationMetrics, plan: Plan, alive: tuple[int, ...]) -> Observed:
        """Fold one completed iteration's metrics in and decide (``plan``: the plan in force now; ``alive``: the
        devices up now). With an act, carry it out and report back through :meth:`acted`. A failed iteration is
        never observed: the job's failure policy recovers, and the next completed one shows what changed."""
        assert metrics.completed, "a failed iteration is the failure policy's, not the controller's"
        self._plan, self._alive = plan, tuple(alive)
        out = self._step(metrics)
        if out.act is None:
            self.history.append(out.record)
            self._plan_ahead()
        return out

    def acted(self, out: Observed, reports: "list[MoveReport | RestartReport] | list[MoveReport] | list[RestartReport]") -> StepRecord:
        """The measured reports of ``out.act`` (one per move, or the restart's): calibrate the
        prices of moves and restarts from them and re-learn the devices whose work changed."""
        act = out.act
        assert act is not None and len(reports) == (1 if act.kind == "restart" else len(act.plans))
        spent = 0.0
        if act.kind == "restart":
            report = reports[0]
            assert isinstance(report, RestartReport)
            io = self.restart_cost(act.plans[0], planned=False) - self._cal.restart_fixed_s
            self._cal = self._cal.after_restart(io, report.downtime_s)
            spent = report.downtime_s
            self._plan = act.plans[0]
        else:
            for nxt, report in zip(act.plans, reports):
                assert isinstance(report, MoveReport)
                model = self.model()
                predicted = handover_time(move_transfers(self._plan, nxt, self.profile, model), model)
                self._cal = self._cal.after_move(predicted, report.stall_s)
                self._monitor = relearn(self._monitor, _work_changed(self._plan, nxt))
                spent += report.stall_s
                self._plan = nxt
        record = replace(out.record, action_s=spent)
        self.history.append(record)
        self._plan_ahead()
        return record

    def _plan_ahead(self) -> None:
        if self.config.plan_ahead:
            self._replanner.prepare(self.model(), self._alive, self._plan, self._replans_wanted(self._plan, self._alive), background=True)

    def close(self) -> None:
        """Stop the background re-planning thread (pending work is dropped)."""
        self._replanner.close()

    def _step(self, metrics: IterationMetrics) -> Observed:
        step = self._steps
        self._steps += 1
        alive = self._alive
        known_links = settled_links(self._monitor)  # a link's first samples are no change of the world
        obs = observe(self._monitor, metrics, self.profile, alive, self.config.monitor)
        confirmed = bool(obs.speed_changes or obs.membership_changed or set(obs.link_changes) & known_links)
        self._monitor = obs.state
        if metrics.completed and metrics.iteration_s > 0:
            # The iteration time with the machine-wide load factored out (time × common speed):
            # a load that slows every device alike slows every plan alike, so it is no noise on
            # the comparison of two plans (the arbiter's noise floor).
            residual = math.log(metrics.iteration_s) + obs.common_log
            self._iteration_logs = (self._iteration_logs + (residual,))[-self.config.monitor.noise_window :]
            if confirmed:
                self._tried, self._check = self._tried.forget(), None
            self._tried = self._tried.record(Layout.of(metrics.plan), residual, self.config.monitor.noise_window)
            self._check_move()
        if self.state is ControllerState.WARMUP:
            self._warm += 1
            if self._warm < self.config.warmup_iterations:
                return self._record(step, metrics)
            self._to(step, ControllerState.ADAPTING, "warm-up done")
        elif self.state is ControllerState.STEADY:
            if not (obs.model_changed or obs.membership_changed):
                return self._record(step, metrics)
            self._to(step, ControllerState.ADAPTING, _why(obs))
        return self._adapt(step, metrics, obs, alive, confirmed)

    # ----- states -----
    def _adapt(self, step: int, metrics: IterationMetrics, obs: Observation, alive: tuple[int, ...], confirmed: bool) -> Observed:
        """``confirmed``: the monitor confirmed a change of the world this iteration (a speed, a
        link it knew, the membership)."""
        changed = obs.model_changed or obs.membership_changed
        if self._path and not changed and set(self._path[0].devices) <= set(alive):
            nxt, self._path = self._path[0], self._path[1:]
            return self._record(step, metrics, None, 0.0, Act("path-move", (nxt,)))
        self._path = ()
        t0 = self.clock()
        learning = () if confirmed else relearning(self._monitor, self._plan.devices)
        if learning:  # stays ADAPTING: the decision comes once they have learned
            return self._record(step, metrics, Stay(f"device(s) {list(learning)} re-learning after a move"), self.clock() - t0)
        self._initiative = not confirmed  # read by noise(): a decision on the controller's own initiative
        decision = self._decide(alive, metrics, changed, obs.speed_changes)
        elapsed = self.clock() - t0
        if isinstance(decision, Stay):
            self._to(step, ControllerState.STEADY, decision.reason)
            return self._record(step, metrics, decision, elapsed)
        option = decision.option
        if option.kind == "restart":
            return self._record(step, metrics, decision, elapsed, Act("restart", (option.steps[0],)))
        # A move on the controller's own initiative (nothing confirmed) is checked afterwards; one
        # answering a confirmed change is not: the world it answers may still be changing under it.
        current_s = option.predicted_s + decision.gain_s
        self._check = None if confirmed else Check(Layout.of(self._plan), Layout.of(option.steps[-1]),
                                                 math.log(option.predicted_s / current_s))
        if self.config.moves_per_pause == 0:
            return self._record(step, metrics, decision, elapsed, Act("move", (option.steps[-1],)))
        now = option.steps[: self.config.moves_per_pause]
        self._path = option.steps[len(now):]
        return self._record(step, metrics, decision, elapsed, Act("move", tuple(now)))

    # ----- deciding -----
    def _decide(self, alive: tuple[int, ...], metrics: IterationMetrics, changed: bool, confirmed: tuple[int, ...] = ()) -> Decision:
        """``changed``: this decision follows a detected change of the model or the membership;
        ``confirmed``: the devices whose speed change the monitor has just confirmed."""
        cfg = self.config
        plan = self._plan
        model = self.model()
        current_s = self._sims.iteration_s(plan, model)
        remaining = None if cfg.total_iterations is None else cfg.total_iterations - metrics.iteration - 1
        movable = cfg.use_moves and plan.virtual_chunks == 1
        cm = CostModel(self.profile, model, plan.num_microbatches, plan.schedule)
        start = Layout.of(plan)
        # Fast path: the best single moves, confirmed by the simulator.
        singles = [(f"single {m.kind.value}", [m.layout]) for m, _ in best_moves(start, cm, alive, cfg.confirm_top, cfg.straight)] if movable else []
        options = self._price(plan, model, singles)
        if cfg.use_restart:
            target = self._replanner.replan(model, alive, plan, straight=False)
            if Layout.of(target) != start:
                options.append(Option("restart", (target,), self._sims.iteration_s(target, model),
                                      self.restart_cost(target, planned=True), "full re-plan"))
        noise = self.noise(plan, confirmed)
        options = self._tried.judge(start, current_s, options, log_noise(self._iteration_logs))
        decision = self._arbiter.decide(current_s, options, remaining, noise)
        if not movable or (isinstance(decision, Switch) and not changed):
            return decision
        # Slow path, when no single move pays or right after a detected change: multi-move walks
        # across plateaus, and the path to a full re-plan's partition out of a local optimum —
        # after a change the best destination is wanted, not the best first step (a whole path
        # is carried out in one pause), so the controller gets there in one decision.
        paths: list[tuple[str, list[Layout]]] = []
        w = walk(start, cm, alive, cfg.max_walk, straight=cfg.straight)
        if len(w.moves) > 1:
            paths.append(("walk", [m.layout for m in w.moves]))
        if all(len(g) == 1 for g in start.groups):
            target_layout = Layout.of(self._replanner.replan(model, alive, plan, straight=True))
            if target_layout != start:
                paths.append(("path to re-plan", [m.layout for m in path_to(start, target_layout, alive)]))
        priced = self._tried.judge(start, current_s, self._price(plan, model, paths), log_noise(self._iteration_logs))
        return self._arbiter.decide(current_s, options + priced, remaining, noise)

    def noise(self, plan: Plan, confirmed: tuple[int, ...] = ()) -> float:
        """The relative error a predicted gain must beat (the arbiter's noise floor): the larger of
        how much the iteration time varies beyond the machine-wide load, and how uncertain the
        believed speeds of the plan's devices still are — except those in ``confirmed``, whose new
        level the monitor has just told from noise (its persistence test is the stricter one:
        a level confirmed from ``persist`` samples is uncertain by its noise over √persist, and
        a real step of a factor of two would be refused as "noise" under that floor on a loaded
        machine). A decision nothing was confirmed for — the first after warm-up, one after a
        link's change — rests on speed differences nobody tested, so their error counts; and one
        no confirmed change of the world prompted weighs it ``initiative_noise`` times (see there),
        plus the error the last checked move showed the model to have."""
        devices = [d for d in plan.devices if d not in confirmed]
        floor = max(log_noise(self._iteration_logs), speed_error(self._monitor, devices), self._model_error)
        return floor * (self.config.initiative_noise if self._initiative else 1.0)

    def _price(self, plan: Plan, model: Cluster, paths: list[tuple[str, list[Layout]]]) -> list[Option]:
        """Simulate each path's destination on the model and price the path's switches."""
        seen: set[Layout] = set()
        out = []
        for label, layouts in paths:
            if layouts[-1] in seen:
                continue
            seen.add(layouts[-1])
            steps = tuple(lay.to_plan(plan) for lay in layouts)
            iteration_s, fits = self._sims.run(steps[-1], model)
            if not fits:
                continue
            out.append(Option("move", steps, iteration_s, self.path_cost(plan, steps, model), f"{label} ({len(steps)} moves)"))
        return out

    def _replans_wanted(self, plan: Plan, alive: tuple[int, ...]) -> list[bool]:
        """The full re-plans (``straight`` flags) a decision on ``plan`` may ask for."""
        wanted = []
        if alive and self.config.use_moves and plan.virtual_chunks == 1 and all(len(s.devices) == 1 for s in plan.stages):
            wanted.append(True)  # the slow path's target
        if alive and self.config.use_restart:
            wanted.append(False)  # the restart option
        return wanted

    def path_cost(self, plan: Plan, steps: tuple[Plan, ...], model: Cluster) -> float:
        """Predicted stall of carrying ``steps`` out: transfers + per-move overhead of each live
        move — one move to the last step when a whole path goes in one pause."""
        total, prev = 0.0, plan
        for nxt in steps[-1:] if self.config.moves_per_pause == 0 else steps:
            total += self._cal.move_price(handover_time(move_transfers(prev, nxt, self.profile, model), model))
            prev = nxt
        return total

    def restart_cost(self, plan: Plan, planned: bool) -> float:
        """Fixed restart time plus checkpoint I/O of the biggest stage (written first if planned)."""
        biggest = shipped_bytes(max(self.profile.param_bytes(s.first, s.last) for s in plan.stages))
        io = transfer_time(biggest, 1.0 / (self.config.storage_gbps * GBPS))
        return self._cal.restart_fixed_s + io * (2 if planned else 1)

    # ----- bookkeeping -----
    def _check_move(self) -> None:
        """Read the pending :class:`~orchestrator.adapt.tried.Check`: its miss is the model's
        error (a noise floor for predicted gains) until the next check."""
        if self._check is None:
            return
        done, error = self._check.read(self._tried, log_noise(self._iteration_logs))
        if done:
            self._check = None
            if error is not None:
                self._model_error = error

    def _to(self, step: int, state: ControllerState, reason: str) -> None:
        if state is not self.state:
            self.transitions.append(Transition(step, self.state, state, reason))
            self.state = state

    def _record(self, step: int, metrics: IterationMetrics, decision: Decision | None = None,
                decision_s: float = 0.0, act: Act | None = None) -> Observed:
        rec = StepRecord(step, metrics.iteration, self.state, metrics.iteration_s, metrics.completed, decision, decision_s,
                         act.kind if act is not None else "")
        return Observed(rec, act)


def _work_changed(before: Plan, after: Plan) -> list[int]:
    """Devices whose blocks differ between two plans."""
    def work(plan: Plan) -> dict[int, set[tuple[int, int, int]]]:
        out: dict[int, set[tuple[int, int, int]]] = {}
        for s in plan.stages:
            for d in s.devices:
                out.setdefault(d, set()).add((s.first, s.last, s.replicas))
        return out

    old, new = work(before), work(after)
    return sorted(d for d in set(old) | set(new) if old.get(d) != new.get(d))


def _why(obs: Observation) -> str:
    parts = []
    if obs.speed_changes:
        parts.append(f"speed of {list(obs.speed_changes)} changed")
    if obs.link_changes:
        parts.append(f"bandwidth of {list(obs.link_changes)} changed")
    if obs.appeared:
        parts.append(f"device(s) {list(obs.appeared)} appeared")
    if obs.disappeared:
        parts.append(f"device(s) {list(obs.disappeared)} left")
    return "; ".join(parts)
