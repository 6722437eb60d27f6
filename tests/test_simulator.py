"""The simulator against closed forms, hand-computed communication and memory."""

from __future__ import annotations

import pytest

from orchestrator.core.cluster import GBPS, flat, two_level
from orchestrator.core.plan import Plan, ScheduleKind, Stage, interleave, straight_plan
from orchestrator.core.profile import Block, Profile
from orchestrator.schedule import Action, Kind, Schedule, ScheduleError
from orchestrator.costmodel.simulator import lower_bound, simulate
from tests.helpers import uniform_profile


@pytest.mark.parametrize("kind", [ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("M", [1, 2, 5, 8])
def test_balanced_pipeline_closed_form(kind: ScheduleKind, p: int, M: int) -> None:
    f, b = 0.7, 1.3
    profile = uniform_profile(2 * p, f / 2, b / 2)
    plan = straight_plan([2 * i for i in range(p + 1)], M, kind)
    result = simulate(plan, profile, flat(p, 10))
    assert result.iteration_s == pytest.approx((M + p - 1) * (f + b), rel=1e-12)


@pytest.mark.parametrize("p,v,M", [(2, 2, 4), (2, 3, 8), (3, 2, 6), (4, 2, 8), (4, 4, 16)])
def test_interleaving_cuts_bubble_by_v(p: int, v: int, M: int) -> None:
    f, b = 1.0, 2.0
    profile = uniform_profile(p * v, f / v, b / v)
    plan = interleave(straight_plan([i * v for i in range(p + 1)], M), v)
    result = simulate(plan, profile, flat(p, 10))
    ideal = M * (f + b)
    assert result.iteration_s == pytest.approx(ideal + (p - 1) * (f + b) / v, rel=1e-9)
    bubble = (result.iteration_s - ideal) / ideal
    assert bubble == pytest.approx((p - 1) / (v * M), rel=1e-9)


def test_transfer_time_and_link_serialization() -> None:
    # two stages, 1 s compute each way, 1 GB activations at 8 Gb/s = 1 s per transfer
    profile = Profile("x", (Block("a", 1.0, 1.0, 1e9, 0.0), Block("b", 1.0, 1.0, 1e9, 0.0)))
    cluster = flat(2, 8.0)
    plan = straight_plan([0, 1, 2], 1, ScheduleKind.GPIPE)
    # F0 [0,1] -> transfer [1,2] -> F1 [2,3] -> B1 [3,4] -> grad transfer [4,5] -> B0 [5,6]
    assert simulate(plan, profile, cluster).iteration_s == pytest.approx(6.0)
    # with 3 micro-batches, the forward transfers queue on the single 0->1 link
    plan3 = straight_plan([0, 1, 2], 3, ScheduleKind.GPIPE)
    res = simulate(plan3, profile, cluster)
    transfers = sorted((e.start, e.end) for e in res.events if e.kind == "transfer" and e.link == (0, 1))
    for (s0, e0), (s1, _) in zip(transfers, transfers[1:]):
        assert s1 >= e0 - 1e-12


def test_all_reduce_ring_cost() -> None:
    params = 4e9
    profile = Profile("x", (Block("a", 1.0, 1.0, 0.0, params),))
    cluster = flat(4, 80.0)  # 1e10 B/s
    plan = Plan((Stage(0, 1, (0, 1, 2, 3)),), 1)
    result = simulate(plan, profile, cluster)
    ring = 2 * 3 / 4 * params / (80 * GBPS)
    assert result.iteration_s == pytest.approx(2.0 / 4 + ring)


def test_heterogeneous_speed_and_replication_split_compute() -> None:
    profile = uniform_profile(1, 1.0, 1.0)
    fast = flat(2, 10, speeds=[2.0, 2.0])
    assert simulate(Plan((Stage(0, 1, (0,)),), 3), profile, fast).iteration_s == pytest.approx(3.0)
    assert simulate(Plan((Stage(0, 1, (0, 1)),), 3), profile, flat(2, 1e9)).iteration_s == pytest.approx(3.0, rel=1e-6)


def test_peak_stash_memory_gpipe_vs_1f1b() -> None:
    profile = Profile("x", tuple(Block(f"b{i}", 1.0, 1.0, 0.0, 10.0, stash_bytes=100.0) for i in range(4)))
    cluster = flat(4, 10)
    g = simulate(straight_plan([0, 1, 2, 3, 4], 8, ScheduleKind.GPIPE), profile, cluster)
    o = simulate(straight_plan([0, 1, 2, 3, 4], 8, ScheduleKind.ONE_F_ONE_B), profile, cluster)
    assert g.peak_stash_bytes[0] == 800.0
    assert [o.peak_stash_bytes[d] for d in range(4)] == [400.0, 300.0, 200.0, 100.0]
    assert o.static_bytes[0] == 10.0 * 4


def test_sliced_microbatches_shorten_fill() -> None:
    profile = uniform_profile(4, 1.0, 2.0)
    cluster = flat(4, 10)
    base = straight_plan([0, 1, 2, 3, 4], 4, ScheduleKind.ONE_F_ONE_B)
    sliced = Plan(base.stages, 4, ScheduleKind.ONE_F_ONE_B, sliced_microbatches=1)
    t0 = simulate(base, profile, cluster).iteration_s
    t1 = simulate(sliced, profile, cluster).iteration_s
    assert t1 < t0
    halves = [e for e in simulate(sliced, profile, cluster).events if e.label in ("0F0.1", "0F0.2")]
    assert len(halves) == 2 and all(e.end - e.start == pytest.approx(0.5) for e in halves)


def test_deadlock_is_detected_with_grid() -> None:
    profile = uniform_profile(2)
    plan = straight_plan([0, 1, 2], 1, ScheduleKind.GPIPE)
    # device 1 waits for a gradient before anyone sends it
    programs = {
        0: (Action(Kind.FORWARD, 0, 0), Action(Kind.RECV_B, 0, 0, 0, 1), Action(Kind.SEND_F, 0, 0, 0, 1)),
        1: (Action(Kind.RECV_F, 1, 0, 0, 0), Action(Kind.FORWARD, 1, 0)),
    }
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(plan, profile, flat(2, 10), schedule=Schedule(plan, programs, ((0, 0),)))


def test_critical_path_ends_at_last_event_and_is_contiguous() -> None:
    profile = uniform_profile(3, 1.0, 2.0, act=1e8)
    result = simulate(straight_plan([0, 1, 2, 3], 4, ScheduleKind.ONE_F_ONE_B), profile, two_level(1, 3, 10, 10))
    path = [result.events[i] for i in result.critical_path]
    assert path[-1].end == pytest.approx(result.iteration_s)
    assert path[0].start == 0.0
    for a, b in zip(path, path[1:]):
        assert b.start == pytest.approx(a.end) or b.start >= a.end


def test_lower_bound_is_never_beaten() -> None:
    profile = uniform_profile(8, 1.0, 2.0, act=1e7)
    cluster = flat(4, 10)
    for kind in ScheduleKind:
        base = straight_plan([0, 2, 4, 6, 8], 8, ScheduleKind.ONE_F_ONE_B)
        plan = interleave(base, 2) if kind is ScheduleKind.INTERLEAVED else base.with_schedule(kind)
        assert simulate(plan, profile, cluster).iteration_s >= lower_bound(profile, cluster, 8) - 1e-12


def test_message_latency_is_charged_per_transfer() -> None:
    profile = Profile("x", (Block("a", 1.0, 1.0, 1e9, 0.0), Block("b", 1.0, 1.0, 1e9, 0.0)))
    plan = straight_plan([0, 1, 2], 1, ScheduleKind.GPIPE)
    base = simulate(plan, profile, flat(2, 8.0)).iteration_s
    slow = simulate(plan, profile, flat(2, 8.0).with_latency(0.25)).iteration_s
    assert slow == pytest.approx(base + 2 * 0.25)  # one activation and one gradient message
