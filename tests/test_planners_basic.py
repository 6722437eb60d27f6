"""even, params and pipedream against brute force of their own objectives."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from orchestrator.cluster import GBPS, Cluster, flat, two_level
from orchestrator.errors import UserError
from orchestrator.planners.base import PlannerOptions, available, get_planner, run_planner
from orchestrator.planners.partition import min_max_partition
from orchestrator.planners.pipedream import Level, _ranges, bottleneck, solve_level
from orchestrator.profile import Block, Profile
from tests.helpers import random_profile, uniform_profile


def _cut_sets(n: int, k: int):
    for cuts in itertools.combinations(range(1, n), k - 1):
        yield [0, *cuts, n]


@pytest.mark.parametrize("seed", range(8))
def test_min_max_partition_is_optimal(seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = rng.uniform(0, 10, size=int(rng.integers(2, 9)))
    for k in range(1, len(w) + 1):
        cuts = min_max_partition(w, k)
        assert len(cuts) == k + 1 and all(b > a for a, b in zip(cuts, cuts[1:]))
        got = max(w[a:b].sum() for a, b in zip(cuts, cuts[1:]))
        best = min(max(w[a:b].sum() for a, b in zip(c, c[1:])) for c in _cut_sets(len(w), k))
        assert got == pytest.approx(best, rel=1e-9)


def test_even_and_params_shapes() -> None:
    profile = Profile("x", tuple(Block(f"b{i}", 1.0, 1.0, 0.0, float(p)) for i, p in enumerate([8, 1, 1, 1, 1, 8, 4, 4])))
    opts = PlannerOptions(num_microbatches=4)
    even = run_planner("even", profile, flat(4, 10), opts)
    assert [(s.first, s.last) for s in even.plan.stages] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    params = run_planner("params", profile, flat(4, 10), opts)
    sizes = [profile.param_bytes(s.first, s.last) for s in params.plan.stages]
    assert max(sizes) == 8.0 and params.objective_s == 8.0


def _brute_flat(profile: Profile, n: int, bw: float, straight: bool) -> float:
    best = np.inf
    L = profile.num_blocks
    for k in range(1, min(n, L) + 1):
        for cuts in _cut_sets(L, k):
            reps_iter = [(1,) * k] if straight else (r for r in itertools.product(range(1, n + 1), repeat=k) if sum(r) <= n)
            for reps in reps_iter:
                worst = 0.0
                for s in range(k):
                    m = reps[s]
                    a, b = cuts[s], cuts[s + 1]
                    worst = max(worst, (profile.compute_time(a, b) + 4 * (m - 1) * profile.param_bytes(a, b) / (m * bw)) / m)
                    if s < k - 1:
                        worst = max(worst, 2 * profile.boundary_bytes(b) / bw)
                best = min(best, worst)
    return best


@pytest.mark.parametrize("seed", range(10))
def test_pipedream_flat_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    L, n, straight = int(rng.integers(2, 7)), int(rng.integers(1, 5)), bool(seed % 2)
    profile = random_profile(L, seed)
    cluster = flat(n, 10)
    result = run_planner("pipedream", profile, cluster, PlannerOptions(num_microbatches=4, straight=straight, check_memory=False))
    expected = _brute_flat(profile, n, 10 * GBPS, straight)
    assert result.objective_s == pytest.approx(expected, rel=1e-9)
    # the returned plan realizes the objective it reports
    assert bottleneck(result.plan, profile, cluster, PlannerOptions(num_microbatches=4)) == pytest.approx(expected, rel=1e-9)
    if straight:
        assert all(s.replicas == 1 for s in result.plan.stages)


@pytest.mark.parametrize("seed", range(4))
def test_pipedream_inner_level_table_is_optimal_for_every_range(seed: int) -> None:
    profile = random_profile(5, seed)
    compute, params, cut = _ranges(profile)
    level = Level(3, 100 * GBPS, 1)
    table = solve_level(compute, params, cut, level, straight=False, all_starts=True)
    for i in range(5):
        for j in range(i, 5):
            sub = Profile("s", profile.blocks[i : j + 1])
            assert table.best[i, j, 2] == pytest.approx(_brute_flat(sub, 3, 100 * GBPS, False), rel=1e-9)


def test_pipedream_two_level_uses_whole_servers_and_fast_links() -> None:
    profile = uniform_profile(16, 0.01, 0.02, act=5e7, params=1e6)
    cluster = two_level(4, 4, 100, 10)
    result = run_planner("pipedream", profile, cluster, PlannerOptions(num_microbatches=16, check_memory=False))
    used = sorted(result.plan.devices)
    assert len(used) == len(set(used)) and set(used) <= set(range(16))
    assert result.objective_s is not None and result.objective_s > 0
    # a replicated stage spread over servers never splits a server's GPUs between two top-level stages
    assert result.iteration_time_s >= result.lower_bound_s


def test_registry_and_unknown_name() -> None:
    assert {"even", "params", "pipedream"} <= set(available())
    assert get_planner("PD").name == "pipedream"
    with pytest.raises(UserError, match="did you mean 'pipedream'"):
        get_planner("pipedrem")


def test_memory_is_enforced() -> None:
    profile = uniform_profile(4, params=2**30)
    tiny = flat(2, 10, memory_bytes=2**30)
    with pytest.raises(UserError, match="does not fit"):
        run_planner("even", profile, tiny, PlannerOptions(num_microbatches=2))
