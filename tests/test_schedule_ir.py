"""The schedule IR: text round-trip, generator invariants, lowering and the validator."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.core.plan import Plan, ScheduleKind, Stage, interleave, straight_plan
from orchestrator.schedule import Action, Kind, Schedule, ScheduleError, lower, parse_action, validate


def _plans() -> list[Plan]:
    out = []
    for p, M in itertools.product([1, 2, 3, 4], [1, 3, 4, 8]):
        for kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1):
            out.append(straight_plan([2 * i for i in range(p + 1)], M, kind))
        if M % p == 0 and p > 1:
            out.append(interleave(straight_plan([2 * i for i in range(p + 1)], M), 2))
    # replicated stages with mismatched replica counts (row shares overlap partially)
    out.append(Plan((Stage(0, 2, (0, 1)), Stage(2, 3, (2, 3, 4)), Stage(3, 5, (5,))), 4))
    out.append(Plan((Stage(0, 2, (0, 1)), Stage(2, 4, (2,))), 5, sliced_microbatches=2))
    out.append(Plan((Stage(0, 2, (0, 1)), Stage(2, 4, (2,))), 5, ScheduleKind.ZB_H1, sliced_microbatches=2))
    return out


@pytest.mark.parametrize("plan", _plans(), ids=lambda p: p.describe())
def test_every_generated_schedule_validates_and_round_trips(plan: Plan) -> None:
    schedule = lower(plan)
    text = schedule.to_text()
    programs = Schedule.parse_programs(text)
    assert programs == dict(schedule.programs)
    # each device forwards and backwards every unit of each of its stages exactly once
    for dev, acts in schedule.programs.items():
        for stage in plan.stages_of_device(dev):
            fs = [a.unit for a in acts if a.kind is Kind.FORWARD and a.stage == stage]
            bs = [a.unit for a in acts if a.kind.grads_input and a.stage == stage]
            ws = [a.unit for a in acts if a.kind.grads_weights and a.stage == stage]
            assert sorted(fs) == sorted(schedule.units) == sorted(bs) == sorted(ws)
        assert acts[-1].kind is Kind.STEP


def test_action_text_format() -> None:
    for text in ["2F5", "2B5.1", "2BI5", "2W5.2", "2SEND_F5@3", "0RECV_B12.2@7", "1ALL_REDUCE", "0STEP"]:
        assert str(parse_action(text)) == text
    assert parse_action("3RECV_F4@1") == Action(Kind.RECV_F, 3, 4, 0, 1)
    assert parse_action("1BI3") == Action(Kind.BACKWARD_INPUT, 1, 3) and parse_action("1W3.1") == Action(Kind.BACKWARD_WEIGHT, 1, 3, 1)
    with pytest.raises(ValueError):
        parse_action("F5")


def test_one_f_one_b_bounds_in_flight_units() -> None:
    plan = straight_plan([0, 1, 2, 3, 4], 8, ScheduleKind.ONE_F_ONE_B)
    schedule = lower(plan)
    for r, dev in enumerate(plan.devices):
        live = peak = 0
        for a in schedule.compute_order(dev):
            live += 1 if a.kind is Kind.FORWARD else -1
            peak = max(peak, live)
        assert peak == 4 - r  # stage r keeps p - r units in flight (GPipe would keep 8)


def test_replica_peers_cover_rows_exactly() -> None:
    plan = Plan((Stage(0, 1, (0, 1)), Stage(1, 2, (2, 3, 4))), 1)
    schedule = lower(plan)
    sends = {d: [a.peer for a in acts if a.kind is Kind.SEND_F] for d, acts in schedule.programs.items()}
    # rows [0, 1/2) overlap replicas 0 and 1 of three; rows [1/2, 1) overlap 1 and 2
    assert sends[0] == [2, 3] and sends[1] == [3, 4]


def test_validator_reports_grid_on_mismatched_send() -> None:
    plan = straight_plan([0, 1, 2], 2, ScheduleKind.GPIPE)
    good = lower(plan)
    programs = dict(good.programs)
    programs[0] = tuple(a for a in programs[0] if not (a.kind is Kind.SEND_F and a.microbatch == 1))
    with pytest.raises(ScheduleError, match="ERROR HERE"):
        validate(Schedule(plan, programs, good.units))


def test_validator_rejects_backward_before_forward() -> None:
    plan = straight_plan([0, 1], 1, ScheduleKind.GPIPE)
    bad = Schedule(plan, {0: (Action(Kind.BACKWARD, 0, 0), Action(Kind.FORWARD, 0, 0), Action(Kind.STEP, 0))}, ((0, 0),))
    with pytest.raises(ScheduleError, match="before its forward"):
        validate(bad)
