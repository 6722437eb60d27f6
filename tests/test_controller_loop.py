"""The controller as a state machine, observed one iteration at a time by the job over the simulated runtime."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.core.cluster import flat
from orchestrator.adapt import (
    ArbiterConfig, ControllerConfig, Stay, FaultSchedule, Join, Kill, SimulatedCosts, SimulatedJob, SimulatedRuntime, Slowdown, ControllerState, Switch,
    full_replan, scenario,
)
from orchestrator.core.plan import Plan, Stage, straight_plan
from orchestrator.costmodel.simulator import simulate
from tests.helpers import uniform_profile

PROFILE = uniform_profile(16, 1.0, 2.0, act=1e6, params=1e6)
BALANCED = straight_plan([0, 4, 8, 12, 16], 8)


class FakeClock:
    """Advances 1 ms per reading, so every decision 'takes' exactly 1 ms."""

    def __init__(self) -> None:
        self._ticks = itertools.count()

    def __call__(self) -> float:
        return next(self._ticks) * 1e-3


def make(faults: FaultSchedule, plan: Plan = BALANCED, cluster=None, noise: float = 0.03, **cfg) -> tuple[SimulatedRuntime, SimulatedJob]:  # type: ignore[no-untyped-def]
    cluster = cluster or flat(4, 25)
    pipe = SimulatedRuntime(PROFILE, cluster, plan, faults, SimulatedCosts(noise=noise, checkpoint_every=4), seed=3)
    cfg.setdefault("straight", True)  # a straight pipeline job unless a test says otherwise
    return pipe, SimulatedJob(pipe, ControllerConfig(**cfg), clock=FakeClock())


def test_noise_alone_causes_no_switch() -> None:
    pipe, job = make(FaultSchedule())
    records, ctl = job.fit(60), job.controller
    assert [r.action for r in records if r.action] == []
    assert ctl.state is ControllerState.STEADY
    assert [(t.before, t.after) for t in ctl.transitions] == [(ControllerState.WARMUP, ControllerState.ADAPTING), (ControllerState.ADAPTING, ControllerState.STEADY)]
    assert pipe.plan == BALANCED


def test_slowdown_is_detected_and_fixed_by_moves() -> None:
    faults = scenario([Slowdown(1, 2.0, 10)])
    pipe, job = make(faults)
    records, ctl = job.fit(30), job.controller
    assert all(r.state in (ControllerState.WARMUP, ControllerState.STEADY, ControllerState.ADAPTING) for r in records)
    change = next(t for t in ctl.transitions if t.step >= 10)
    assert change.before is ControllerState.STEADY and change.after is ControllerState.ADAPTING and change.step <= 12 and "[1]" in change.reason
    moves = [r for r in records if r.action in ("move", "path-move")]
    assert moves and all(r.step >= 10 for r in moves)
    assert ctl.state is ControllerState.STEADY
    for r in records:
        if isinstance(r.decision, Switch) or r.decision is not None:
            assert r.decision_s == pytest.approx(1e-3)  # the injected clock, read twice per decision
    # the adapted plan on the true (slowed) cluster vs. the static plan and a fresh re-plan
    truth = faults.conditions(pipe.cluster, 29).cluster
    adapted = simulate(pipe.plan, PROFILE, truth).iteration_s
    static = simulate(BALANCED, PROFILE, truth).iteration_s
    fresh = simulate(full_replan(PROFILE, truth, range(4), BALANCED, straight=True), PROFILE, truth).iteration_s
    assert adapted < static / 1.3
    assert adapted <= fresh / 0.95


@pytest.mark.parametrize("horizon,expect_moves", [(1, False), (50, True)])
def test_switch_only_when_the_horizon_pays_for_it(horizon: int, expect_moves: bool) -> None:
    # 50 GB of parameters per block: every moved block stalls the pipeline for ~48 s, while the
    # 2x slowdown costs ~90 s per iteration. One iteration of gain cannot pay; fifty can.
    heavy = uniform_profile(16, 1.0, 2.0, act=1e6, params=5e10)
    cluster = flat(4, 25, memory_bytes=1e13)
    pipe = SimulatedRuntime(heavy, cluster, BALANCED, scenario([Slowdown(1, 2.0, 10)]), SimulatedCosts(noise=0.03), seed=3)
    job = SimulatedJob(pipe, ControllerConfig(straight=True, arbiter=ArbiterConfig(horizon_iterations=horizon)), clock=FakeClock())
    job.fit(16)
    ctl = job.controller
    assert bool([r for r in ctl.history if r.action]) is expect_moves
    decisions = [r.decision for r in ctl.history if r.step >= 10 and r.decision is not None]
    assert decisions
    if not expect_moves:
        assert all(isinstance(d, Stay) and d.best_gain_s > 0 and d.best_cost_s > d.best_gain_s for d in decisions)


@pytest.mark.parametrize("plan,dead", [(BALANCED, 2), (Plan((Stage(0, 8, (0, 1)), Stage(8, 16, (2, 3))), 8), 1)],
                         ids=["only-holder", "replica"])
def test_a_death_is_recovered_in_place_by_the_job_and_the_controller_carries_on(plan: Plan, dead: int) -> None:
    """A death is the job's failure policy's (in place onto a re-plan over the survivors, only the failed
    iteration redone), not the controller's: it sees the device gone at its next observation and goes on deciding
    on the survivors."""
    pipe, job = make(scenario([Kill(dead, 6)]), plan=plan, straight=False)
    records = job.fit(12)  # the failed iteration is the failure policy's: the controller never sees it
    assert job.failures == 1 and len(records) == 11 and all(r.completed for r in records)
    assert [e for e, *_ in pipe.log].count("recovered") == 1 and "restart" not in [e for e, *_ in pipe.log]
    assert dead not in pipe.plan.devices and set(pipe.plan.devices) <= {0, 1, 2, 3} - {dead}
    assert [r.iteration for r in records] == list(range(11))  # only the failed iteration is redone
    assert pipe.step == 11


@pytest.mark.parametrize("straight", [True, False])
def test_new_device_is_used_when_predicted_faster(straight: bool) -> None:
    plan = straight_plan([0, 5, 10, 16], 8)
    pipe, job = make(scenario([Join(3, 6)], initially_absent=[3]), plan=plan, straight=straight)
    before = simulate(plan, PROFILE, pipe.cluster).iteration_s
    job.fit(14)
    assert 3 in pipe.plan.devices  # (a plan naming it before it joined would have been refused)
    assert simulate(pipe.plan, PROFILE, pipe.cluster).iteration_s < 0.9 * before


@pytest.mark.parametrize("straight", [True, False])
def test_new_device_is_ignored_when_it_would_not_help(straight: bool) -> None:
    plan = straight_plan([0, 5, 10, 16], 8)
    slow = flat(4, 25, speeds=[1.0, 1.0, 1.0, 0.02])
    pipe, job = make(scenario([Join(3, 6)], initially_absent=[3]), plan=plan, cluster=slow, straight=straight)
    job.fit(14)
    assert 3 not in pipe.plan.devices
