"""NCCL's rules on CPU: every schedule the runtime can run completes under them, and the model is sharp.

The replay (orchestrator.schedule.nccl) is only worth something if it catches the hangs a GPU
would hit. So besides proving the runtime's layout (one communicator per directed link, receives
posted early) hang-free for every plan shape and every planner's output, these tests show that
the layouts a GPU runtime must avoid do hang: one communicator per rank pair with early
receives, the 1F1B steady state on one pair communicator even with receives at their own
position (but not with small messages — why a toy smoke test on a GPU would mislead), and a
host sync around every compute action.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from actors.execution import Executor
from actors.job_spec import JobSpec
from orchestrator.core.cluster import flat, two_level
from orchestrator.core.plan import Plan, ScheduleKind, Stage, interleave, straight_plan
from orchestrator.planners.base import PlannerOptions, available, run_planner
from orchestrator.schedule import Kind, ScheduleError, lower
from orchestrator.schedule.nccl import RUNTIME_LAYOUT, CommLayout, directed_links, recv_post_points, check_hang_free
from tests.helpers import random_profile


def _shapes() -> list[Plan]:
    out = []
    for p, m in itertools.product([1, 2, 3, 4], [1, 2, 3, 4, 8]):
        for kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1):
            out.append(straight_plan([2 * i for i in range(p + 1)], m, kind))
        if m % p == 0 and p > 1:
            out.append(interleave(straight_plan([2 * i for i in range(p + 1)], m), 2))
            out.append(interleave(straight_plan([3 * i for i in range(p + 1)], m), 3))
    # replicas with mismatched counts (a replica talks to several peers), sliced micro-batches
    out.append(Plan((Stage(0, 2, (0, 1)), Stage(2, 3, (2, 3, 4)), Stage(3, 5, (5,))), 4))
    out.append(Plan((Stage(0, 2, (0, 1)), Stage(2, 4, (2,))), 5, sliced_microbatches=2))
    out.append(Plan((Stage(0, 2, (0,)), Stage(2, 4, (1, 2)), Stage(4, 6, (3,))), 6, ScheduleKind.GPIPE, sliced_microbatches=3))
    # zero bubble with replicas and sliced units (W after BI, all-reduce after the last W)
    out.append(Plan((Stage(0, 2, (0, 1)), Stage(2, 3, (2, 3, 4)), Stage(3, 5, (5,))), 4, ScheduleKind.ZB_H1))
    out.append(Plan((Stage(0, 2, (0,)), Stage(2, 4, (1, 2)), Stage(4, 6, (3,))), 6, ScheduleKind.ZB_H1, sliced_microbatches=3))
    # interleaved stages on replicated groups
    out.append(Plan((Stage(0, 1, (0, 1)), Stage(1, 2, (2,)), Stage(2, 3, (0, 1)), Stage(3, 4, (2,))), 4, ScheduleKind.INTERLEAVED))
    return out


SHAPES = _shapes()


@pytest.mark.parametrize("lookahead", [1, RUNTIME_LAYOUT.recv_lookahead, 64])
@pytest.mark.parametrize("plan", SHAPES, ids=lambda p: p.describe())
def test_runtime_layout_never_hangs(plan: Plan, lookahead: int) -> None:
    check_hang_free(lower(plan), CommLayout(links="directed", recv_lookahead=lookahead))


@pytest.mark.parametrize("name", sorted(available()))
def test_every_planners_plans_replay_under_nccl_rules(name: str) -> None:
    """Whatever shape a planner produces (replicas, interleaving, slicing, uneven stages) runs."""
    clusters = [flat(4, 10.0), two_level(2, 2, 100.0, 5.0)]
    replayed = set()
    for seed, cluster, m, interleaved in itertools.product([1, 2], clusters, [4, 8], [False, True]):
        options = PlannerOptions(num_microbatches=m, check_memory=False, interleave=interleaved)
        try:
            result = run_planner(name, random_profile(12, seed), cluster, options)
        except Exception as exc:  # noqa: BLE001 - a planner may refuse a setting; that is not our concern here
            if "UserError" not in type(exc).__name__ and not isinstance(exc, ValueError):
                raise
            continue
        check_hang_free(lower(result.plan))
        replayed.add(result.plan.describe())
    assert replayed, f"{name} produced no plan to replay"


def test_one_pair_communicator_with_early_receives_hangs() -> None:
    """The old runtime: receives posted 8 actions early on a stream shared by both directions."""
    plan = straight_plan([0, 2, 4], 4, ScheduleKind.GPIPE)
    with pytest.raises(ScheduleError, match="hangs under NCCL's rules"):
        check_hang_free(lower(plan), CommLayout(links="pair", recv_lookahead=8))
    check_hang_free(lower(plan), CommLayout(links="directed", recv_lookahead=8))


def test_one_f_one_b_sends_meet_head_to_head_on_a_pair_communicator() -> None:
    plan = straight_plan([0, 2, 4], 4, ScheduleKind.ONE_F_ONE_B)
    with pytest.raises(ScheduleError) as err:
        check_hang_free(lower(plan), CommLayout(links="pair", recv_lookahead=1))
    assert "SEND_F" in str(err.value) and "SEND_B" in str(err.value)
    assert "ERROR HERE" in str(err.value)  # the validator's grid marks where
    # Messages that fit NCCL's buffer complete without their receiver: the same layout passes,
    # which is why a smoke test with tiny tensors would not find the hang.
    check_hang_free(lower(plan), CommLayout(links="pair", recv_lookahead=1, eager_bytes=1 << 20), message_bytes=lambda a: 1024)
    with pytest.raises(ScheduleError):
        check_hang_free(lower(plan), CommLayout(links="pair", recv_lookahead=1, eager_bytes=1 << 20), message_bytes=lambda a: 8 << 20)


def test_host_sync_around_compute_hangs_interleaved() -> None:
    """``torch.cuda.synchronize()`` in the hot loop also waits for sends whose receivers are behind."""
    plan = interleave(straight_plan([0, 2, 4], 4), 2)
    with pytest.raises(ScheduleError):
        check_hang_free(lower(plan), CommLayout(links="directed", recv_lookahead=1, host_sync_compute=True))
    check_hang_free(lower(plan), CommLayout(links="directed", recv_lookahead=1))


def test_a_broken_schedule_is_caught() -> None:
    """A receive whose send never comes (programs edited by hand) is a hang, not a pass."""
    schedule = lower(straight_plan([0, 2, 4], 2, ScheduleKind.GPIPE))
    programs = dict(schedule.programs)
    programs[0] = tuple(a for a in programs[0] if not (a.kind is Kind.SEND_F and a.microbatch == 1))
    broken = type(schedule)(schedule.plan, programs, schedule.units)
    with pytest.raises(ScheduleError, match="hangs"):
        check_hang_free(broken)


def test_executor_posts_by_the_replayed_rule_on_the_directed_link_groups() -> None:
    """What the replay proves is what the executor does: same posting rule, a group per direction."""
    plan = Plan((Stage(0, 1, (0, 1)), Stage(1, 2, (2,)), Stage(2, 3, (0, 1)), Stage(3, 4, (2,))), 4, ScheduleKind.INTERLEAVED)
    schedule = lower(plan)
    links = {key: object() for key in directed_links(schedule)}
    rank_of = {d: d for d in plan.devices}
    boundary = [((3,), torch.float32)] * (plan.num_blocks + 1)
    spec = JobSpec(_unused, _unused, _unused, _unused, recv_lookahead=5)
    for device, program in schedule.programs.items():
        ex = Executor(spec, plan, device, rank_of, program, {}, {}, {}, boundary, 8, torch.device("cpu"), links=links)
        assert ex.tables.post_before == recv_post_points(program, 5)
        for i, a in enumerate(program):
            if a.kind in (Kind.SEND_F, Kind.SEND_B) and ex.tables.info[i][2]:
                assert ex.tables.info[i][8] is links[(device, a.peer)]
            elif a.kind in (Kind.RECV_F, Kind.RECV_B) and ex.tables.info[i] is not None:
                assert ex.tables.info[i][8] is links[(a.peer, device)]
    assert all((b, a) in links for a, b in links)  # pipelines talk both ways: two groups per neighbour pair


def _unused(*_: object) -> None:
    raise AssertionError("not called")


def test_executor_passes_the_directed_link_group_to_isend_and_irecv(monkeypatch: pytest.MonkeyPatch) -> None:
    """The group objects handed to torch.distributed are the directed link's, in both directions."""
    import actors.exchange as exchange

    calls: list[tuple[str, int, object]] = []

    class Done:
        def wait(self) -> None:
            pass

        def is_completed(self) -> bool:
            return True

    monkeypatch.setattr(exchange.dist, "isend", lambda t, dst, group=None, tag=0: calls.append(("send", dst, group)) or Done())
    monkeypatch.setattr(exchange.dist, "irecv", lambda t, src, group=None, tag=0: calls.append(("recv", src, group)) or Done())
    plan = straight_plan([0, 1, 2], 2, ScheduleKind.ONE_F_ONE_B)
    schedule = lower(plan)
    links = {key: object() for key in directed_links(schedule)}
    blocks = {0: torch.nn.Linear(3, 3)}
    spec = JobSpec(_unused, lambda out, y: out.sum(), _unused, lambda step: (torch.ones(4, 3), torch.zeros(4, 3)))
    ex = Executor(spec, plan, 0, {0: 0, 1: 1}, schedule.programs[0], blocks, {}, {}, [((3,), torch.float32)] * 3, 4,
                  torch.device("cpu"), links=links)
    ex.run(0)
    assert {(kind, group is links[(0, 1)] if kind == "send" else group is links[(1, 0)]) for kind, _, group in calls} == {
        ("send", True), ("recv", True)}
    assert len(calls) == 4  # two micro-batches: two activations out, two gradients in


# ----- issue #29: the step's collectives, warm-up, live-move transfers, one hardware queue -----
from orchestrator.schedule.nccl import check_ordered_blocking, step_groups  # noqa: E402


@pytest.mark.parametrize("plan", SHAPES, ids=lambda p: p.describe())
def test_runtime_layout_with_step_collectives_and_flag_read_never_hangs(plan: Plan) -> None:
    """Tied sums (first and last stage hold the embedding), then the one norm/flag all-reduce over
    every device, then the host read of the overflow flag: no schedule hangs."""
    tied = [(plan.stages[0].devices[0], plan.stages[-1].devices[0])]
    check_hang_free(lower(plan), CommLayout("directed", 1, step_host_sync=True), step_groups=step_groups(plan, tied))


def test_one_hardware_queue_hangs_the_1f1b_steady_state() -> None:
    """CUDA_DEVICE_MAX_CONNECTIONS=1 serialises every communicator's kernels: the directed layout
    loses what it buys (41 of the 78 shapes above hang, as many as with one pair communicator)."""
    plan = straight_plan([0, 2, 4], 4, ScheduleKind.ONE_F_ONE_B)
    check_hang_free(lower(plan), CommLayout("directed", 1))
    with pytest.raises(ScheduleError, match="hangs under NCCL's rules"):
        check_hang_free(lower(plan), CommLayout("directed", 1, serialised=True))


def test_warm_up_and_live_move_transfers_in_one_global_order_complete() -> None:
    """Every device walks the same list of blocking operations (warm_up: the sorted links, then the
    replica groups; a live move: the hand-overs in the driver's order, then the warm-up of the new plan's
    links and groups, once every block it holds is there to size their largest bucket)."""
    plan = Plan((Stage(0, 2, (0, 1)), Stage(2, 3, (2, 3, 4)), Stage(3, 5, (5,))), 4)
    links = directed_links(lower(plan))
    check_ordered_blocking([*links, (0, 1), (2, 3, 4)], list(range(6)))
    check_ordered_blocking([(0, 2), (1, 2), (2, 0), (5, 3)], list(range(6)))
    check_ordered_blocking([(0, 2), (1, 2), (2, 0), (5, 3), *links, (0, 1), (2, 3, 4)], list(range(6)))
