"""The walk over plan structures ``auto`` uses on small instances (orchestrator/planners/exhaustive.py).

Listing one structure per device-class pattern and dropping partial structures by their bound
are both ways to miss the optimum silently; these tests pin them to the naive listing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from orchestrator.core.cluster import GBPS, Cluster, Device, two_level
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.core.profile import Profile
from orchestrator.costmodel.group_sim import FirstUnitPath
from orchestrator.planners import exhaustive
from tests.helpers import random_profile
from tests.oracle import busiest_group, headed_busiest_group, partitions, placements

CLASSES = [
    [(0,), (1,), (2,), (3,)],
    [(0, 1), (2, 3)],
    [(0, 1, 2, 3)],
    [(0, 1, 2), (3,)],
    [(0,), (1, 2), (3, 4, 5)],
]


def naive(L: int, n: int, max_stages: int, straight: bool) -> set[tuple[Stage, ...]]:
    """Every structure, listed the plain way (the oracle's own placements and partitions)."""
    out = set()
    for k in range(1, min(max_stages, L, n) + 1):
        for groups in placements(n, k, straight):
            for cuts in partitions(L, k):
                out.add(tuple(Stage(cuts[i], cuts[i + 1], groups[i]) for i in range(k)))
    for p in range(2, min(max_stages, n) + 1):
        for v in range(2, exhaustive.MAX_VIRTUAL_STAGES // p + 1):
            if p * v <= L:
                for groups in placements(n, p, straight):
                    for cuts in partitions(L, p * v):
                        out.add(tuple(Stage(cuts[i], cuts[i + 1], groups[i % p]) for i in range(p * v)))
    return out


@pytest.mark.parametrize("classes", CLASSES, ids=str)
@pytest.mark.parametrize("L", [3, 6])
@pytest.mark.parametrize("straight", [False, True])
def test_space_size_counts_what_the_walk_lists(classes: list[tuple[int, ...]], L: int, straight: bool) -> None:
    got = list(exhaustive.structures(L, classes, 4, straight, True))
    assert len(got) == len(set(got)) == exhaustive.space_size(L, classes, 4, straight, True)


@pytest.mark.parametrize("n,L", [(3, 5), (4, 4), (4, 6)])
@pytest.mark.parametrize("straight", [False, True])
def test_one_device_per_class_lists_every_structure(n: int, L: int, straight: bool) -> None:
    assert set(exhaustive.structures(L, [(d,) for d in range(n)], 4, straight, True)) == naive(L, n, 4, straight)


def test_classes_list_one_structure_per_swap_orbit() -> None:
    """Every naive structure maps, by swapping devices within classes, onto exactly one listed one."""
    classes = [(0, 1), (2, 3, 4)]
    listed = set(exhaustive.structures(5, classes, 3, False, True))
    perms = [dict(zip(range(5), (*a, *b))) for a in itertools.permutations(classes[0]) for b in itertools.permutations(classes[1])]
    for st in naive(5, 5, 3, False):
        images = {tuple(Stage(s.first, s.last, tuple(sorted(p[d] for d in s.devices))) for s in st) for p in perms}
        assert len(images & listed) == 1, st


@pytest.mark.parametrize("classes", CLASSES[:3], ids=str)
def test_bounds_drop_exactly_the_structures_over_the_bar(classes: list[tuple[int, ...]]) -> None:
    rng = np.random.default_rng(5)
    L = 6
    w = rng.uniform(0.1, 1.0, size=L)
    speed = rng.uniform(0.5, 1.5, size=sum(len(c) for c in classes))

    def cost(a: int, b: int, devs: tuple[int, ...]) -> float:
        return float(w[a:b].sum() / (len(devs) * speed[list(devs)].max()) + 0.05 * (len(devs) - 1))

    def worst(st: tuple[Stage, ...]) -> float:
        per: dict[tuple[int, ...], float] = {}
        for s in st:
            per[s.devices] = per.get(s.devices, 0.0) + cost(s.first, s.last, s.devices)
        return max(per.values())

    every = list(exhaustive.structures(L, classes, 4, False, True))
    for below in sorted({worst(st) for st in every})[:: max(1, len(every) // 7)]:
        kept = set(exhaustive.structures(L, classes, 4, False, True, cost, below))
        assert kept == {st for st in every if worst(st) * (1 - 1e-9) < below}


def test_the_walk_stops_at_its_budget() -> None:
    with pytest.raises(exhaustive.Budget):
        list(exhaustive.structures(8, [(d,) for d in range(6)], 6, False, True, budget=1000))


def test_device_classes() -> None:
    assert exhaustive.device_classes(two_level(2, 4, 100, 5)) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    bw = np.full((4, 4), 10 * GBPS)
    np.fill_diagonal(bw, 0.0)
    same = Cluster(tuple(Device(i, "n0", 1.0, 1e9) for i in range(4)), bw)
    assert exhaustive.device_classes(same) == [(0, 1, 2, 3)]
    # device 1 is slower: 0 and 2 are alike but not neighbours, so no class joins them (a ring's
    # order, sorted device ids, would differ between a set and its image)
    odd = Cluster(tuple(Device(i, "n0", 0.5 if i == 1 else 1.0, 1e9) for i in range(4)), bw)
    assert exhaustive.device_classes(odd) == [(0,), (1,), (2, 3)]
    bw2 = bw.copy()
    bw2[0, :] = bw2[:, 0] = 5 * GBPS  # device 0 sits behind a slower link
    np.fill_diagonal(bw2, 0.0)
    linked = Cluster(tuple(Device(i, "n0", 1.0, 1e9) for i in range(4)), bw2)
    assert exhaustive.device_classes(linked) == [(0,), (1, 2, 3)]


@pytest.mark.parametrize("seed", range(2))
def test_the_rest_bound_never_exceeds_a_simulated_plan(seed: int) -> None:
    """``auto``'s bound for the blocks a partial structure has not placed (their work at the free
    devices' summed speed) is below the simulated time of every plan completing it, schedule and
    slicing included: dropping a partial structure by it loses nothing."""
    from orchestrator.core.plan import ScheduleKind
    from orchestrator.costmodel.simulator import SimOptions, simulate
    from orchestrator.planners.auto import _RestCost
    from orchestrator.planners.options import PlannerOptions
    from tests.helpers import random_profile
    from tests.oracle import plan_space

    rng = np.random.default_rng(seed)
    n, M = 4, 2
    bw = rng.uniform(2, 50, size=(n, n)) * GBPS
    bw = (bw + bw.T) / 2
    np.fill_diagonal(bw, 0.0)
    cluster = Cluster(tuple(Device(i, f"n{i}", float(rng.uniform(0.5, 1.5)), 1e12) for i in range(n)), bw)
    profile = random_profile(4, seed)
    rest = _RestCost(profile, cluster, PlannerOptions(num_microbatches=M))
    checked = 0
    for plan in plan_space(profile, cluster, M):
        if plan.schedule is ScheduleKind.INTERLEAVED:
            continue
        t = simulate(plan, profile, cluster, SimOptions()).iteration_s
        used: set[int] = set()
        for stage in plan.stages:
            free = tuple(d for d in range(n) if d not in used)
            assert rest(stage.first, free) <= t * (1 + 1e-9), plan.describe()
            used.update(stage.devices)
        checked += 1
    assert checked > 500


def _busy(M: int, profile: Profile, cluster: Cluster) -> exhaustive.StageCost:
    speeds = cluster.speeds
    return lambda a, b, devs: M * profile.compute_time(a, b) / (len(devs) * float(speeds[list(devs)].min()))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_head_drops_exactly_the_structures_whose_headed_bound_is_over_the_bar(seed: int) -> None:
    rng = np.random.default_rng(seed)
    profile, cluster, M = random_profile(6, seed, act_scale=5e9), _slow_random_cluster(rng, 4), 2
    classes = exhaustive.device_classes(cluster)
    every = list(exhaustive.structures(6, classes, 4, False, True))
    path = FirstUnitPath(profile, cluster)
    bound = {st: headed_busiest_group(st, profile, cluster, M) for st in every}
    assert any(bound[st] > busiest_group(st, profile, cluster, M) * 1.01 for st in every)  # the head adds something
    for below in sorted(bound.values())[:: max(1, len(every) // 6)]:
        kept = set(exhaustive.structures(6, classes, 4, False, True, _busy(M, profile, cluster), below, None, None, path))
        assert kept == {st for st in every if bound[st] * (1 - 1e-9) < below}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_headed_bound_holds_for_every_schedule_and_slicing(seed: int) -> None:
    # Why: the walk and the certificate drop structures by it; a bound above some variant's simulated time would
    # hide that variant (slow links and large activations make the messages count).
    from orchestrator.costmodel.simulator import SimOptions, simulate

    rng = np.random.default_rng(100 + seed)
    profile, cluster, M = random_profile(6, seed, act_scale=5e9), _slow_random_cluster(rng, 4), 3
    every = list(exhaustive.structures(6, exhaustive.device_classes(cluster), 4, False, True))
    picked = [every[i] for i in rng.choice(len(every), size=min(120, len(every)), replace=False)]
    for st in picked:
        p = len({s.devices for s in st})
        if p == len(st):
            plans = [Plan(st, M, kind, sliced) for kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1) for sliced in range(M + 1)]
        else:
            plans = [Plan(st, M, ScheduleKind.INTERLEAVED, sliced) for sliced in range(M + 1) if (M + sliced) % p == 0]
        lo = headed_busiest_group(st, profile, cluster, M)
        for plan in plans:
            assert simulate(plan, profile, cluster, SimOptions()).iteration_s >= lo * (1 - 1e-9), plan.describe()


def _slow_random_cluster(rng: np.random.Generator, n: int) -> Cluster:
    bw = rng.uniform(0.5, 20, size=(n, n)) * GBPS
    bw = (bw + bw.T) / 2
    np.fill_diagonal(bw, 0.0)
    speeds = rng.uniform(0.5, 1.5, size=n)
    return Cluster(tuple(Device(i, f"n{i // 2}", float(speeds[i]), 1e12) for i in range(n)), bw, 1e-3)
