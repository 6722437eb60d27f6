"""even, params and pipedream against brute force of their own objectives."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from orchestrator.core.cluster import GBPS, Cluster, flat, two_level
from orchestrator.core.errors import UserError
from orchestrator.planners.base import PlannerOptions, available, get_planner, run_planner
from orchestrator.planners.partition import min_max_partition
from orchestrator.planners.pipedream import _ranges, bottleneck
from orchestrator.planners.pipedream_dp import Level, solve_level
from orchestrator.core.profile import Block, Profile
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


def _brute_flat(profile: Profile, n: int, bw: float, straight: bool, max_stages: int | None = None, exact: bool = False,
                out_bytes: float = 0.0) -> float:
    """PipeDream's flat objective minimized over every plan (at most ``max_stages`` stages; exactly
    that many with ``exact``). A cut is charged 2a/B over the receiving stage's replicas and, when
    the sending stage is not the first, over its own too; ``out_bytes`` leave the last block (0 at
    the model's end) and are charged to a last stage that is not the first."""
    best = np.inf
    L = profile.num_blocks
    cap = min(n, L) if max_stages is None else min(n, L, max_stages)
    for k in range(cap if exact else 1, cap + 1):
        for cuts in _cut_sets(L, k):
            reps_iter = [(1,) * k] if straight else (r for r in itertools.product(range(1, n + 1), repeat=k) if sum(r) <= n)
            for reps in reps_iter:
                worst = 0.0
                for s in range(k):
                    m = reps[s]
                    a, b = cuts[s], cuts[s + 1]
                    worst = max(worst, (profile.compute_time(a, b) + 4 * (m - 1) * profile.param_bytes(a, b) / (m * bw)) / m)
                    sent = profile.boundary_bytes(b) if s < k - 1 else out_bytes
                    if s < k - 1:
                        worst = max(worst, 2 * sent / (bw * reps[s + 1]))
                    if s > 0:
                        worst = max(worst, 2 * sent / (bw * m))
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
            out = profile.activations[j] if j < 4 else 0.0
            assert table.best[2, i, j] == pytest.approx(_brute_flat(sub, 3, 100 * GBPS, False, out_bytes=out), rel=1e-9)


@pytest.mark.parametrize("seed", range(12))
def test_pipedream_flat_max_stages_matches_brute_force(seed: int) -> None:
    """The stage cap is inside the DP: the optimum over plans with at most s stages, never an error."""
    rng = np.random.default_rng(100 + seed)
    L, n, straight = int(rng.integers(2, 7)), int(rng.integers(2, 6)), bool(seed % 3 == 0)
    profile = random_profile(L, seed)
    cluster = flat(n, 10)
    for cap in range(1, n + 1):
        o = PlannerOptions(num_microbatches=4, straight=straight, check_memory=False, max_stages=cap)
        result = run_planner("pipedream", profile, cluster, o)
        expected = _brute_flat(profile, n, 10 * GBPS, straight, max_stages=cap)
        assert len(result.plan.stages) <= cap
        assert result.objective_s == pytest.approx(expected, rel=1e-9), cap
        assert bottleneck(result.plan, profile, cluster, o) == pytest.approx(expected, rel=1e-9), cap


def _brute_two_level(profile: Profile, servers: int, gpus: int, intra: float, inter: float, max_stages: int) -> float:
    """PipeDream's hierarchical objective over every two-level plan with at most ``max_stages`` flat
    stages: top-level stages of whole servers, each server pipelining its range as s' inner stages
    (s' flat stages, replicated across the stage's servers)."""
    L = profile.num_blocks
    inner: dict[tuple[int, int, int], float] = {}
    for a in range(L):
        for b in range(a + 1, L + 1):
            sub = Profile("s", profile.blocks[a:b], input_bytes=profile.boundary_bytes(a))
            for sp in range(1, min(gpus, b - a) + 1):
                inner[(a, b, sp)] = _brute_flat(sub, gpus, intra, False, max_stages=sp, exact=True, out_bytes=profile.boundary_bytes(b) if b < L else 0.0)
    best = np.inf
    for k in range(1, min(servers, L) + 1):
        for cuts in _cut_sets(L, k):
            for reps in itertools.product(range(1, servers + 1), repeat=k):
                if sum(reps) > servers:
                    continue
                for flat_counts in itertools.product(range(1, gpus + 1), repeat=k):
                    if sum(flat_counts) > max_stages:
                        continue
                    worst = 0.0
                    for s in range(k):
                        a, b, m, sp = cuts[s], cuts[s + 1], reps[s], flat_counts[s]
                        c = inner.get((a, b, sp), np.inf)
                        worst = max(worst, (c + 4 * (m - 1) * profile.param_bytes(a, b) / (m * inter) / gpus) / m)
                        if s < k - 1:
                            worst = max(worst, 2 * profile.boundary_bytes(b) / (inter * reps[s + 1]))
                            if s > 0:
                                worst = max(worst, 2 * profile.boundary_bytes(b) / (inter * m))
                    best = min(best, worst)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_pipedream_two_level_max_stages_matches_brute_force(seed: int) -> None:
    """Two levels: the cap counts flat stages (a top-level stage whose servers pipeline it as s'
    inner stages counts s'), and the DP is exact for it."""
    profile = random_profile(5, seed)
    cluster = two_level(2, 2, 100, 10)
    for cap in range(1, 5):
        o = PlannerOptions(num_microbatches=4, check_memory=False, max_stages=cap)
        result = run_planner("pipedream", profile, cluster, o)
        assert len(result.plan.stages) <= cap
        expected = _brute_two_level(profile, 2, 2, 100 * GBPS, 10 * GBPS, cap)
        assert result.objective_s == pytest.approx(expected, rel=1e-9), cap


def test_pipedream_max_stages_is_planned_not_rejected() -> None:
    profile = uniform_profile(24, 0.01, 0.02, act=5e6, params=1e6)
    cluster = two_level(4, 4, 100, 10)
    free = run_planner("pipedream", profile, cluster, PlannerOptions(num_microbatches=16, check_memory=False))
    previous = np.inf
    for cap in (1, 2, 3, 4, 6, 8, 12, 15):
        got = run_planner("pipedream", profile, cluster, PlannerOptions(num_microbatches=16, check_memory=False, max_stages=cap))
        assert 1 <= len(got.plan.stages) <= cap
        assert got.objective_s is not None and free.objective_s is not None
        assert got.objective_s <= previous * (1 + 1e-12)  # a looser cap never hurts
        assert got.objective_s >= free.objective_s * (1 - 1e-12)
        previous = got.objective_s
        if len(free.plan.stages) <= cap:
            assert got.objective_s == pytest.approx(free.objective_s, rel=1e-12)


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
