"""``auto``'s hill-climb (orchestrator/planners/climb.py) where it cannot walk every structure.

On clusters whose devices all differ the walk's space has no symmetry to fold (10 blocks on 8
devices: 1.1·10^8 structures) and is skipped; the climb must then reach what the full walk finds.
Here the walk is forced on instances small enough to finish (8 blocks, 6 devices) and switched off
for the climb, so the two answers can be compared on the same instance."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.core.cluster import GBPS, Cluster, Device
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.costmodel.group_sim import work_bound
from orchestrator.planners import auto
from orchestrator.planners.base import PlannerOptions, run_planner
from orchestrator.planners.climb import Neighbours
from tests.helpers import random_profile
from tests.test_planner_oracle import random_cluster

STATE = 4.0


def instance(seed: int, L: int, n: int) -> tuple[object, Cluster, int]:
    rng = np.random.default_rng(500 + seed)
    M = int(rng.choice([2, 3, 4]))
    profile = random_profile(L, seed)
    return profile, random_cluster(rng, n, profile, M), M


@pytest.mark.parametrize("seed", [0, 2, 3, 4])
def test_the_climb_reaches_the_full_walks_optimum(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    profile, cluster, M = instance(seed, 8, 6)
    opts = PlannerOptions(num_microbatches=M, state_factor=STATE)
    monkeypatch.setattr(auto, "WALK_STRUCTURES", float("inf"))
    monkeypatch.setattr(auto, "WALK_BUDGET", 10**9)
    walked = run_planner("auto", profile, cluster, opts)  # type: ignore[arg-type]
    assert "climb" not in walked.plan.algorithm
    monkeypatch.setattr(auto, "WALK_STRUCTURES", 0)
    climbed = run_planner("auto", profile, cluster, opts)  # type: ignore[arg-type]
    assert climbed.iteration_time_s <= walked.iteration_time_s * 1.005, (climbed.plan.describe(), walked.plan.describe())


def test_on_eight_different_devices_the_climb_beats_the_planners(monkeypatch: pytest.MonkeyPatch) -> None:
    """10 blocks × 8 devices that all differ: not walked; the climb finds a faster plan than any seed."""
    profile, cluster, M = instance(1, 10, 8)
    opts = PlannerOptions(num_microbatches=M, state_factor=STATE)
    got = run_planner("auto", profile, cluster, opts)  # type: ignore[arg-type]
    monkeypatch.setattr(auto, "CLIMB_DEVICES", 0)
    seeds_only = run_planner("auto", profile, cluster, opts)  # type: ignore[arg-type]
    assert "climb" in got.plan.algorithm and "climb" not in seeds_only.plan.algorithm
    assert got.iteration_time_s < seeds_only.iteration_time_s * (1 - 1e-3)


def test_identical_servers_are_not_climbed() -> None:
    profile = random_profile(40, 3)
    bw = np.full((8, 8), 10 * GBPS)
    bw[:4, :4] = bw[4:, 4:] = 100 * GBPS
    np.fill_diagonal(bw, 0.0)
    cluster = Cluster(tuple(Device(i, f"n{i // 4}", 1.0, 1e12) for i in range(8)), bw)
    got = run_planner("auto", profile, cluster, PlannerOptions(num_microbatches=8, state_factor=STATE))
    assert "climb" not in got.plan.algorithm


def _neighbours(cluster: Cluster, L: int, straight: bool, max_stages: int = 8) -> Neighbours:
    profile = random_profile(L, 7)
    return Neighbours(profile, cluster, 4, straight, max_stages, 10**6, lambda st: work_bound(st, profile, cluster, 4))


@pytest.mark.parametrize("straight", [False, True])
def test_every_neighbour_is_a_valid_plan_one_move_away(straight: bool) -> None:
    profile = random_profile(9, 7)
    cluster = random_cluster(np.random.default_rng(3), 7, profile, 4)
    parent = (Stage(0, 3, (0, 2) if not straight else (0,)), Stage(3, 5, (4,)), Stage(5, 9, (1, 5) if not straight else (5,)))
    got = _neighbours(cluster, 9, straight, max_stages=4)(parent)
    assert got and parent not in got and len(set(got)) > len(got) // 2
    for st in got:
        Plan(st, 4)  # contiguous, every device in one group
        assert len(st) <= 4
        if straight:
            assert all(len(s.devices) == 1 for s in st)
        moved_devices = {d for s in st for d in s.devices} != {d for s in parent for d in s.devices}
        moved_cuts = [s.first for s in st] != [s.first for s in parent]
        moved_groups = [s.devices for s in st] != [s.devices for s in parent]
        assert moved_devices or moved_cuts or moved_groups
    # an exchange keeps every group's size: a slow device can leave a heavy stage for an idle one
    assert (Stage(0, 3, (0, 3)), Stage(3, 5, (4,)), Stage(5, 9, (1, 5))) in got or straight
    assert (Stage(0, 3, (3,)), Stage(3, 5, (4,)), Stage(5, 9, (5,))) in got or not straight


def test_interleaved_neighbours_keep_the_pattern() -> None:
    profile = random_profile(8, 7)
    cluster = random_cluster(np.random.default_rng(4), 5, profile, 4)
    g0, g1 = (0, 1), (2,)
    parent = (Stage(0, 2, g0), Stage(2, 4, g1), Stage(4, 6, g0), Stage(6, 8, g1))
    got = _neighbours(cluster, 8, False)(parent)
    assert (Stage(0, 1, g0), Stage(1, 4, g1), Stage(4, 6, g0), Stage(6, 8, g1)) in got  # a chunk cut moved
    assert (Stage(0, 2, g1), Stage(2, 4, g0), Stage(4, 6, g1), Stage(6, 8, g0)) in got  # the two groups swapped
    for st in got:
        plan = Plan(st, 4, ScheduleKind.INTERLEAVED)
        assert len(plan.device_groups) == 2 and len(st) == 4
