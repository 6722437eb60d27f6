"""The evacuation policy: which two-worker moves empty the doomed devices, and when it refuses.

Pure tests (no Ray): a notice names devices; the policy returns the moves that hand their blocks
to survivors when memory (from the profile) and the deadline allow, and a fallback with the
reason otherwise. Bad notices (unknown device, deadline passed) are one-line errors.
"""

from __future__ import annotations

import pytest

from orchestrator.core.cluster import flat
from orchestrator.core.errors import UserError
from orchestrator.elastic.evacuation import Evacuate, Fallback, Notice, check_notice, plan_evacuation
from orchestrator.core.plan import Plan, Stage, straight_plan
from orchestrator.core.profile import Block, Profile

PROFILE = Profile("toy", tuple(Block(f"b{i}", 1e-3, 2e-3, 1e4, 1e6) for i in range(8)))
PLAN = straight_plan([0, 2, 4, 6, 8], 4)


def covers(plan: Plan) -> bool:
    return plan.stages[0].first == 0 and plan.stages[-1].last == 8


def test_one_doomed_device_merges_into_a_neighbour() -> None:
    d = plan_evacuation(PLAN, Notice((1,), 60.0), range(4), PROFILE, flat(4, 10), now=0.0)
    assert isinstance(d, Evacuate)
    assert len(d.steps) == 1 and 1 not in d.steps[-1].devices and covers(d.steps[-1])
    src, dst = d.moves[0]
    assert src == 1 and dst in (0, 2)  # a pipeline neighbour takes the blocks (two workers touched)
    assert d.predicted_s < 60.0 - 5.0


def test_an_idle_survivor_takes_the_stage_over() -> None:
    d = plan_evacuation(PLAN, Notice((2,), 60.0), range(5), PROFILE, flat(5, 10), now=0.0)
    assert isinstance(d, Evacuate)
    assert d.moves == ((2, 4),)  # same partition, device 4 instead of 2: the best estimate
    assert d.steps[0].stages[2].devices == (4,)


def test_a_doomed_replica_is_dropped_without_transfers() -> None:
    plan = Plan((Stage(0, 4, (0, 1)), Stage(4, 8, (2,))), 4)
    d = plan_evacuation(plan, Notice((1,), 60.0), range(3), PROFILE, flat(3, 10), now=0.0)
    assert isinstance(d, Evacuate) and d.steps[0].stages[0].devices == (0,) and d.moves == ((1, 0),)


def test_two_doomed_devices_take_two_moves() -> None:
    d = plan_evacuation(PLAN, Notice((1, 2), 60.0), range(4), PROFILE, flat(4, 10), now=0.0)
    assert isinstance(d, Evacuate) and len(d.moves) == 2
    assert not {1, 2} & set(d.steps[-1].devices) and covers(d.steps[-1])


def test_no_room_falls_back_with_the_reason() -> None:
    # each device holds exactly its two blocks' state (x4 for weights and optimizer) and no more
    tight = flat(4, 10, memory_bytes=2 * 1e6 * 4.5)
    d = plan_evacuation(PLAN, Notice((1,), 60.0), range(4), PROFILE, tight, now=0.0)
    assert isinstance(d, Fallback) and "no room" in d.reason


def test_with_a_replan_the_evacuation_is_one_switch_to_the_survivors_plan_when_it_fits() -> None:
    """The job passes its planner: one switch to the plan it would make for the survivors (no second stall for a
    re-balance); a re-made plan that does not fit in memory is never taken, the two-worker steps decide then."""
    def replan(survivors: object) -> Plan:
        return straight_plan([0, 3, 6, 8], 4, devices=[[0], [2], [3]])

    d = plan_evacuation(PLAN, Notice((1,), 60.0), range(4), PROFILE, flat(4, 10), now=0.0, replan=replan)
    assert isinstance(d, Evacuate) and d.steps == (replan(None),) and "re-made for the 3 survivors" in d.reason
    assert (1, 0) in d.moves or (1, 2) in d.moves
    tight = flat(4, 10, memory_bytes=2 * 1e6 * 4.5)  # three blocks on a device do not fit, nor do merges
    d = plan_evacuation(PLAN, Notice((1,), 60.0), range(4), PROFILE, tight, now=0.0, replan=replan)
    assert isinstance(d, Fallback) and "no room" in d.reason


def test_a_short_deadline_falls_back() -> None:
    d = plan_evacuation(PLAN, Notice((1,), 3.0), range(4), PROFILE, flat(4, 10), now=0.0, margin_s=5.0)
    assert isinstance(d, Fallback) and d.reason.startswith("deadline")


def test_every_device_doomed_falls_back() -> None:
    d = plan_evacuation(PLAN, Notice((0, 1, 2, 3), 60.0), range(4), PROFILE, flat(4, 10), now=0.0)
    assert isinstance(d, Fallback) and "every device" in d.reason


def test_bad_notices_are_one_line_errors() -> None:
    with pytest.raises(UserError, match="does not use"):
        check_notice(Notice((7,), 60.0), range(4), now=0.0)
    with pytest.raises(UserError, match="deadline passed"):
        check_notice(Notice((1,), 10.0), range(4), now=12.0)


def test_ray_drain_requests_become_notices_for_the_devices_on_that_node() -> None:
    from actors.placement import WorkerPlace
    from orchestrator.elastic.drain import DEFAULT_DRAIN_S, drain_notices, draining_nodes

    devices = [WorkerPlace(0, "aa", 10), WorkerPlace(1, "bb", 11), WorkerPlace(2, "bb", 12)]
    found = drain_notices({"bb": 1030.0, "cc": None, "aa": None}, devices, now=1000.0)
    assert found == [((0,), DEFAULT_DRAIN_S, "ray drain of node aa"), ((1, 2), 30.0, "ray drain of node bb")]
    assert isinstance(draining_nodes(), dict)  # without a Ray connection: no information, no crash
