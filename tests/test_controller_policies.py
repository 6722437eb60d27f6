"""Arbiter rule on both sides of its boundary; failure policy decisions; re-plans on live devices."""

from __future__ import annotations

import pytest

from orchestrator.core.cluster import flat
from orchestrator.adapt.policies import GiveUp, RecoverInPlace, checkpoint_interval
from orchestrator.adapt import (
    ArbiterConfig, ExplicitArbiter, Option, Restart, Stay, Switch, full_replan, on_worker_death, should_switch,
)
from orchestrator.core.plan import straight_plan
from tests.helpers import random_profile

CFG = ArbiterConfig(horizon_iterations=50, margin=1.0, min_relative_gain=0.02)
PLAN = straight_plan([0, 2, 4], 4)


@pytest.mark.parametrize("cost,expect", [(49.999, True), (50.001, False)])
def test_gain_over_horizon_vs_cost_boundary(cost: float, expect: bool) -> None:
    # gain 1 s/iteration over 50 iterations breaks even at a switch cost of 50 s
    assert should_switch(10.0, 9.0, cost, 50, CFG) is expect


def test_margin_and_horizon_scale_the_boundary() -> None:
    assert should_switch(10.0, 9.0, 99.0, 100, CFG)
    assert not should_switch(10.0, 9.0, 101.0, 100, CFG)
    strict = ArbiterConfig(horizon_iterations=50, margin=2.0)
    assert should_switch(10.0, 9.0, 24.9, 50, strict) and not should_switch(10.0, 9.0, 25.1, 50, strict)


def test_gains_inside_model_error_are_ignored_even_if_free() -> None:
    assert not should_switch(10.0, 9.9, 0.0, 50, CFG)  # 1% < 2%
    assert should_switch(10.0, 9.7, 0.0, 50, CFG)
    assert not should_switch(10.0, 10.5, 0.0, 50, CFG)  # a loss is never taken


def test_arbiter_picks_the_largest_net_benefit_and_respects_remaining() -> None:
    cheap = Option("move", (PLAN,), 9.0, 1.0, "cheap")  # net 50 - 1 = 49
    better = Option("restart", (PLAN,), 8.0, 30.0, "better")  # net 100 - 30 = 70
    arb = ExplicitArbiter(CFG)
    win = arb.decide(10.0, [cheap, better], remaining=None)
    assert isinstance(win, Switch) and win.option.label == "better" and win.net_s == pytest.approx(70.0)
    near_end = arb.decide(10.0, [cheap, better], remaining=10)  # nets 9 and -10
    assert isinstance(near_end, Switch) and near_end.option.label == "cheap"
    assert isinstance(arb.decide(10.0, [cheap, better], remaining=0), Stay)
    assert isinstance(arb.decide(10.0, [], remaining=None), Stay)


@pytest.mark.parametrize("failures,in_place,dead,alive,expect", [
    (4, True, [1], [0, 1, 2], GiveUp),  # past the budget of 3
    (1, False, [1], [0, 1, 2], Restart),  # in place switched off
    (1, True, [], [0, 1, 2], Restart),  # the dead worker is not known
    (1, True, [0, 1], [0, 1], Restart),  # no survivor
    (3, True, [1], [0, 1, 2], RecoverInPlace),
    (1, True, [1], [0, 1, 2], "nccl 2.18 cannot abort"),  # in place unsafe on the installed NCCL: a restart up front
])
def test_the_failure_policy(failures: int, in_place: bool, dead: list[int], alive: list[int], expect: type | str) -> None:
    """The one failure policy (the job's and the simulated job's): give up past the budget, recover in place when
    workers survive and it can be made safe, otherwise every worker restarts on the same plan from the newest
    checkpoint (with the reason in the decision)."""
    hazard = expect if isinstance(expect, str) else None
    decision = on_worker_death(failures, 3, PLAN, dead, alive, in_place, hazard=hazard)
    if isinstance(expect, str):
        assert isinstance(decision, Restart) and expect in decision.reason
        return
    assert isinstance(decision, expect)
    if isinstance(decision, Restart):
        assert decision.plan == PLAN and decision.from_checkpoint
    if isinstance(decision, RecoverInPlace):
        assert decision.dead == (1,) and decision.survivors == (0, 2)


@pytest.mark.parametrize("alive", [[1, 3], [0, 2, 3], [3]])
def test_full_replan_uses_only_live_devices_in_nominal_ids(alive: list[int]) -> None:
    profile = random_profile(10, 5)
    cluster = flat(4, 25, speeds=[1.0, 0.5, 2.0, 1.0])
    plan = full_replan(profile, cluster, alive, straight_plan([0, 10], 8))
    assert set(plan.devices) <= set(alive)
    plan.check_against(10, cluster.size)


def test_checkpoint_interval_follows_the_deaths_seen() -> None:
    """Young's interval sqrt(2 C M) in steps: rare while nothing fails, shorter as deaths come, a cheap checkpoint
    more often than a dear one, never below one step nor above the cap."""
    calm = checkpoint_interval(stall_s=0.2, iteration_s=2.0, failures=0, elapsed_s=0.0)
    assert calm == round((2 * 0.2 * 3600) ** 0.5 / 2.0) == 19
    stormy = checkpoint_interval(stall_s=0.2, iteration_s=2.0, failures=11, elapsed_s=3600.0)  # a death every 10 min
    assert stormy == round((2 * 0.2 * 600) ** 0.5 / 2.0) == 8 < calm
    assert checkpoint_interval(0.05, 2.0, 11, 3600.0) < stormy < checkpoint_interval(2.0, 2.0, 11, 3600.0)
    assert checkpoint_interval(0.0, 2.0, 0, 0.0) == 1  # nothing measured yet: the first checkpoint measures the stall
    assert checkpoint_interval(50.0, 0.001, 0, 0.0) == 1000
