"""Policies decide, the controller acts: the switch arbiter and the failure policy.

Both are pure functions of their inputs returning frozen decision values; neither keeps counters
or caches. The controller carries decisions out and records them.

**Switch rule** (AutoPipe-Hu's arbiter, made explicit). For an option that would take the job
from predicted iteration time ``t_now`` to ``t_new`` at a one-off cost ``cost_s`` (hand-over
transfers and stall for live moves, downtime for a restart), with ``H`` iterations left in the
horizon::

    gain = t_now − t_new
    switch  ⇔  gain ≥ max(min_relative_gain, noise_z · σ) · t_now   and   gain · H > margin · cost_s

Among options that pass, the one with the largest net benefit ``gain · H − cost_s`` wins. The
first clause ignores gains inside the model's own error — ``σ`` is the measured relative noise of
the iteration time (the controller estimates it from the iterations it saw): a gain smaller than
what one iteration to the next varies by cannot be told from noise, neither by the monitor that
estimated the speeds behind it nor by anyone checking the move afterwards; the second clause is
the break-even test.
A learned arbiter can replace :class:`ExplicitArbiter` behind the :class:`Arbiter` protocol.

**Failure policy** (:func:`on_worker_death`, the job's one): give up past the budget; recover in place when workers
survive (the survivors continue on a plan re-made for them from their own snapshots and a peer's copy or storage);
otherwise every worker restarts from the newest checkpoint — chosen up front where in place cannot be made safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence, Union

from orchestrator.core.cluster import Cluster
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.planners.base import PlannerOptions, run_planner
from orchestrator.core.profile import Profile
from orchestrator.costmodel.simulator import simulate
from orchestrator.costmodel.estimate import CostModel, Layout
from orchestrator.planners.moves import walk


@dataclass(frozen=True, kw_only=True)
class ArbiterConfig:
    horizon_iterations: int = 50
    """Iterations over which a gain must pay for its switch (capped by the job's remaining ones)."""
    margin: float = 1.0
    """Required ratio of horizon gain to switch cost (>1: more conservative)."""
    min_relative_gain: float = 0.02
    """Gains below this fraction of the current iteration time are treated as model error."""
    noise_z: float = 1.0
    """Gains below this many standard deviations of the iteration time's measured relative noise
    are treated as noise too (0: off)."""

    def __post_init__(self) -> None:
        if self.horizon_iterations < 1 or self.margin <= 0 or self.min_relative_gain < 0 or self.noise_z < 0:
            raise ValueError("horizon must be >= 1, margin > 0, min_relative_gain >= 0, noise_z >= 0")

    def min_gain(self, noise: float) -> float:
        """The smallest relative gain that counts when iteration times vary by ``noise`` (log sd)."""
        return max(self.min_relative_gain, self.noise_z * noise)


@dataclass(frozen=True)
class Option:
    """A way to change the plan: ``steps`` are the plans to apply in order (one live move each,
    or a single restart), ``predicted_s`` the simulated iteration time at the end."""

    kind: str  # "move" or "restart"
    steps: tuple[Plan, ...]
    predicted_s: float
    cost_s: float
    label: str = ""


@dataclass(frozen=True)
class Switch:
    option: Option
    gain_s: float  # per iteration
    horizon: int

    @property
    def net_s(self) -> float:
        return self.gain_s * self.horizon - self.option.cost_s


@dataclass(frozen=True)
class Stay:
    reason: str
    best_gain_s: float = 0.0
    best_cost_s: float = 0.0


Decision = Union[Switch, Stay]


def should_switch(current_s: float, predicted_s: float, cost_s: float, horizon: int, cfg: ArbiterConfig, noise: float = 0.0) -> bool:
    """The explicit rule above, on its own so tests can probe both sides of the boundary."""
    gain = current_s - predicted_s
    return gain >= cfg.min_gain(noise) * current_s and gain > 0 and gain * horizon > cfg.margin * cost_s


class Arbiter(Protocol):
    def decide(self, current_s: float, options: Sequence[Option], remaining: int | None, noise: float = 0.0) -> Decision: ...


@dataclass(frozen=True)
class ExplicitArbiter:
    config: ArbiterConfig = ArbiterConfig()

    def decide(self, current_s: float, options: Sequence[Option], remaining: int | None, noise: float = 0.0) -> Decision:
        horizon = self.config.horizon_iterations if remaining is None else max(0, min(remaining, self.config.horizon_iterations))
        if horizon == 0:
            return Stay("no iterations left")
        passing = [o for o in options if should_switch(current_s, o.predicted_s, o.cost_s, horizon, self.config, noise)]
        if not passing:
            best = max(options, key=lambda o: current_s - o.predicted_s, default=None)
            if best is None:
                return Stay("no candidates")
            return Stay("gain does not pay for the switch", current_s - best.predicted_s, best.cost_s)
        win = max(passing, key=lambda o: (current_s - o.predicted_s) * horizon - o.cost_s)
        return Switch(win, current_s - win.predicted_s, horizon)


# ----- failure policy -----
@dataclass(frozen=True)
class Restart:
    plan: Plan
    from_checkpoint: bool
    reason: str


@dataclass(frozen=True)
class GiveUp:
    """The failure budget is spent: the job ends (its newest committed checkpoint stays loadable)."""

    reason: str


@dataclass(frozen=True)
class RecoverInPlace:
    """The ``survivors`` keep their processes and continue on a plan over them from their own
    newest snapshot; the dead worker's blocks come from a peer's copy or from storage."""

    dead: tuple[int, ...]
    survivors: tuple[int, ...]
    reason: str


DeathDecision = Union[GiveUp, RecoverInPlace, Restart]


def on_worker_death(failures: int, max_failures: int, plan: Plan, dead: Sequence[int], alive: Sequence[int],
                    in_place: bool, hazard: str | None = None) -> DeathDecision:
    """After workers died without notice (``failures`` deaths so far, this one included): give up
    past the budget; recover in place when it is on (``in_place``), safe on the installed communicators
    (``hazard``: why not, from :func:`actors.gpu.in_place_hazard`; then the restart is chosen up front rather than
    after a recovery that would wait and fail), the dead are known and workers survive (the runtime may still find it
    impossible: then the caller restarts); otherwise restart every worker on the same plan from the newest checkpoint."""
    if failures > max_failures:
        return GiveUp(f"{failures} worker deaths exceed max_failures={max_failures}")
    gone = set(dead)
    survivors = tuple(sorted(set(alive) - gone))
    if not in_place:
        return Restart(plan, True, "recovery in place is switched off: every worker restarts")
    if hazard is not None:
        return Restart(plan, True, f"recovery in place is not safe here ({hazard}): every worker restarts")
    if not gone:
        return Restart(plan, True, "the dead worker is not known: every worker restarts")
    if not survivors:
        return Restart(plan, True, "no survivor")
    return RecoverInPlace(tuple(sorted(gone)), survivors,
                          f"device(s) {sorted(gone)} died; {len(survivors)} survivors keep their processes")


def checkpoint_interval(stall_s: float, iteration_s: float, failures: int, elapsed_s: float, prior_mtbf_s: float = 3600.0,
                        most: int = 1000) -> int:
    """Steps between checkpoints for ``RunConfig(checkpoint_every="auto")``: Young's interval sqrt(2 C M) (Young,
    CACM 1974; Daly 2006 gives it as the first-order optimum), which balances the stall ``C`` each checkpoint costs
    against the work a failure loses (half an interval on average) at a failure every ``M`` seconds. ``M`` is what the
    job has seen: its running time plus one prior hour over its deaths plus one (no death yet: an hour, the mean
    shrinking as deaths come). In whole steps of ``iteration_s``, between 1 and ``most``."""
    mtbf = (max(elapsed_s, 0.0) + prior_mtbf_s) / (max(failures, 0) + 1)
    steps = math.sqrt(2.0 * max(stall_s, 0.0) * mtbf) / max(iteration_s, 1e-9)
    return int(min(most, max(1, round(steps))))


SPEED_AGNOSTIC_PLANNERS = frozenset({"pipedream"})
"""Planners whose raw answer (before polishing) ignores device speeds — PipeDream's DP reads the
profile, the bandwidth hierarchy and memory only — so a caller may reuse it across speed-only
model changes and just re-polish. ``tests/test_controller_speed.py`` checks that this stays true."""


def full_replan(profile: Profile, model: Cluster, alive: Sequence[int], template: Plan, algorithm: str = "pipedream",
                straight: bool = False, polish: bool = True, time_plan: Callable[[Plan], float] | None = None) -> Plan:
    """A from-scratch plan on the live devices of the believed cluster, in nominal device ids.

    Runs a registered planner (a pure function) on ``model.subset(alive)`` and maps the
    renumbered devices back, falling back to ``even`` when the planner cannot place the model.
    With ``polish``, the planner's answer is then improved by a walk of moves on the cost model
    and the faster of the two by the simulator is returned: PipeDream's DP ignores device speeds
    and pipeline fill, so on its own it is a weak "best plan" once GPUs differ. ``time_plan`` (a
    plan's simulated iteration seconds on ``model``; default :func:`simulate`) lets a caller memoize.
    """
    plan = planner_plan(profile, model, alive, template, algorithm, straight)
    return polish_plan(plan, profile, model, alive, straight, time_plan) if polish else plan


def planner_plan(profile: Profile, model: Cluster, alive: Sequence[int], template: Plan, algorithm: str = "pipedream",
                 straight: bool = False) -> Plan:
    """The raw (unpolished) half of :func:`full_replan`."""
    ids = sorted(alive)
    sub = model.subset(ids)
    opts = PlannerOptions(num_microbatches=template.num_microbatches, schedule=template.schedule, straight=straight,
                          max_stages=min(len(ids), profile.num_blocks))
    try:
        plan = run_planner(algorithm, profile, sub, opts).plan
    except UserError:
        plan = run_planner("even", profile, sub, PlannerOptions(num_microbatches=template.num_microbatches, schedule=template.schedule,
                                                                 check_memory=False, max_stages=opts.max_stages)).plan
    stages = tuple(replace(s, devices=tuple(ids[d] for d in s.devices)) for s in plan.stages)  # recomputation kept
    return Plan(stages, plan.num_microbatches, plan.schedule, plan.sliced_microbatches, algorithm=f"replan:{plan.algorithm}")


def polish_plan(plan: Plan, profile: Profile, model: Cluster, alive: Sequence[int], straight: bool = False,
                time_plan: Callable[[Plan], float] | None = None) -> Plan:
    """The polishing half of :func:`full_replan`: a walk of moves from ``plan`` on the cost model,
    then the faster of the two by the simulator."""
    cm = CostModel(profile, model, plan.num_microbatches, plan.schedule)
    end = walk(Layout.of(plan), cm, sorted(alive), straight=straight).end
    if end == Layout.of(plan):
        return plan  # nothing to polish (the same plan would tie, and min keeps the first)
    polished = end.to_plan(plan, algorithm=f"{plan.algorithm}+walk")
    timed = time_plan or (lambda p: simulate(p, profile, model).iteration_s)
    return min((plan, polished), key=timed)
