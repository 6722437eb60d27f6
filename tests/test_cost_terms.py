"""The cost terms are one definition: scalar and vectorized calls agree bit for bit, and every fast
scorer built on them reproduces the simulator on random small instances."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.costmodel import terms as ct
from orchestrator.core.cluster import heterogeneous_servers, two_level
from orchestrator.costmodel.estimate import CostModel, Layout
from orchestrator.costmodel.group_sim import simulate_groups
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.planners import autopipe, scoring
from orchestrator.planners.options import PlannerOptions
from orchestrator.schedule.ir import Kind
from orchestrator.costmodel.simulator import simulate
from tests.helpers import random_profile


def test_all_reduce_scalar_and_vectorized_agree_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    k = rng.integers(1, 9, size=200)
    nbytes = rng.uniform(0, 1e9, size=200)
    bw = rng.uniform(1e8, 1e11, size=200)
    bw[::7] = np.inf  # one device: an infinite ring
    vec = ct.all_reduce_time(k, nbytes, bw)
    assert isinstance(vec, np.ndarray)
    scalar = [ct.all_reduce_time(int(a), float(b), float(c)) for a, b, c in zip(k, nbytes, bw)]
    assert np.array_equal(vec, np.array(scalar))
    assert all(x == 0.0 for x, r in zip(scalar, k) if r == 1)
    assert ct.all_reduce_time(4, 8.0, 2.0) == pytest.approx(2 * 3 / 4 * 8 / 2)
    # broadcasting (a planner's [blocks, blocks, runs] table) gives the same values
    grid = ct.all_reduce_time(k[None, :], nbytes[:, None], bw[None, :])
    assert isinstance(grid, np.ndarray)
    assert grid[5, 9] == ct.all_reduce_time(int(k[9]), float(nbytes[5]), float(bw[9]))


def test_other_terms_scalar_and_vectorized_agree() -> None:
    rng = np.random.default_rng(1)
    work, speed, reps = rng.uniform(0, 1, 50), rng.uniform(0.5, 2, 50), rng.integers(1, 5, 50).astype(float)
    assert np.array_equal(ct.compute_time(work, speed, reps), np.array([ct.compute_time(float(w), float(s), float(r)) for w, s, r in zip(work, speed, reps)]))
    nbytes, spb = rng.uniform(0, 1e8, 50), rng.uniform(1e-11, 1e-9, 50)
    assert np.array_equal(ct.transfer_time(nbytes, spb, 1e-4), np.array([ct.transfer_time(float(b), float(s), 1e-4) for b, s in zip(nbytes, spb)]))
    params, stash, units = rng.uniform(0, 1e9, 50), rng.uniform(0, 1e8, 50), rng.integers(1, 9, 50).astype(float)
    mem = ct.stage_memory(params, stash, units, reps, 4.0)
    assert np.array_equal(mem, np.array([ct.stage_memory(float(p), float(s), float(u), float(r), 4.0) for p, s, u, r in zip(params, stash, units, reps)]))
    assert np.array_equal(ct.fits_memory(mem, 5e9), mem <= 5e9)
    for kind in ScheduleKind:
        vec = ct.in_flight(kind, np.arange(6), 6, 4)
        assert list(vec) == [ct.in_flight(kind, s, 6, 4) for s in range(6)]
    assert ct.in_flight(ScheduleKind.ONE_F_ONE_B, 0, 6, 4) == 4 and ct.in_flight(ScheduleKind.ONE_F_ONE_B, 5, 6, 4) == 1
    assert ct.shipped_bytes(10.0) == 10.0 * ct.SHIPPED_STATE_FACTOR


def _random_straight(rng: np.random.Generator, n_blocks: int, groups: list[tuple[int, ...]]) -> tuple[Stage, ...]:
    cuts = sorted(rng.choice(np.arange(1, n_blocks), size=len(groups) - 1, replace=False).tolist())
    bounds = [0, *cuts, n_blocks]
    return tuple(Stage(bounds[k], bounds[k + 1], g) for k, g in enumerate(groups))


@pytest.mark.parametrize("seed", range(6))
def test_fast_scorers_reproduce_the_simulator(seed: int) -> None:
    """On random straight plans SPP's PE is the group mode, which is the full simulator's time where
    replicas are alike (else bracketed by its two passes), and the PE bounds stay below it; the group
    mode's memory is the simulator's, and the static check agrees with the controller's."""
    rng = np.random.default_rng(seed)
    prof = random_profile(8, seed, act_scale=float(rng.choice([2e6, 5e8])))
    cl = two_level(2, 3, 100, 10).with_latency(float(rng.choice([0.0, 1e-4])))
    perm = [int(d) for d in rng.permutation(6)]
    sizes = [[1, 1, 1, 1], [2, 1, 3], [1, 2, 2], [3, 3]][seed % 4]
    groups, pos = [], 0
    for r in sizes:
        groups.append(tuple(sorted(perm[pos : pos + r])))
        pos += r
    stages = _random_straight(rng, prof.num_blocks, groups)
    M = int(rng.integers(2, 7))
    for kind in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE):
        for sliced in (0, min(2, M)):
            plan = Plan(stages, M, kind, sliced)
            full = simulate(plan, prof, cl)
            grouped = simulate_groups(plan, prof, cl)
            pe = scoring.estimate(plan, prof, cl)
            assert pe == grouped.iteration_s
            if grouped.exact:
                assert pe == pytest.approx(full.iteration_s, rel=1e-9)
            else:  # replicas on unlike links: an upper bound, and the lower mode a lower one
                assert pe >= full.iteration_s * (1 - 1e-12)
                low = simulate_groups(plan, prof, cl, lower=True)
                assert low.iteration_s <= full.iteration_s * (1 + 1e-12)
                assert simulate_groups(plan, prof, cl, lower=True, memory=False).iteration_s == low.iteration_s  # the bound skips only memory
            assert max(grouped.peak_bytes) == pytest.approx(max(full.peak_memory_bytes.values()), rel=1e-9)
            costs = scoring.plan_costs(plan, prof, cl)
            fr = scoring.unit_fractions(M, sliced)
            assert scoring.pe_lower_bound(costs, fr) <= pe
            load, partial = scoring.compute_costs(plan, prof, cl)
            assert load <= pe * (1 + 1e-12) and scoring.pe_lower_bound(partial, fr) <= pe
        # the controller's vectorized memory check is the planners' static check
        for cap in (1e9, 3e9, 1e12):
            small = heterogeneous_servers([3, 3], [100, 100], 10, memory_bytes=cap)
            model = CostModel(prof, small, M, ScheduleKind.ONE_F_ONE_B)
            fits = bool(model.estimate([Layout.of(Plan(stages, M))]).fits[0])
            assert fits == scoring.plan_fits_memory(Plan(stages, M), prof, small, PlannerOptions(num_microbatches=M))


def test_group_mode_trace_covers_every_compute_action() -> None:
    prof = random_profile(6, 3)
    cl = two_level(1, 4, 100, 10)
    plan = Plan(_random_straight(np.random.default_rng(3), 6, [(0,), (1,), (2,), (3,)]), 6, ScheduleKind.ONE_F_ONE_B)
    res = simulate_groups(plan, prof, cl, trace=True)
    assert [len(t) for t in res.trace] == [2 * 6] * 4
    for evs in res.trace:
        assert all(a.kind in (Kind.FORWARD, Kind.BACKWARD) and end >= start for a, start, end, _ in evs)
        assert all(b[1] >= a[2] for a, b in zip(evs, evs[1:]))  # one device: no overlap
    assert max(e[2] for evs in res.trace for e in evs) == pytest.approx(res.iteration_s)
    total, per = autopipe.critical_stage_times(plan, prof, cl)
    assert total == res.iteration_s and 0 < sum(per) <= total * (1 + 1e-12)


def test_groups_registered_a_few_at_a_time_get_the_same_links_as_all_at_once() -> None:
    """The cost model grows its group-to-group link table by new rows and columns only (a climb
    registers thousands of groups); the table must equal the one built in one go."""
    rng = np.random.default_rng(11)
    cluster = heterogeneous_servers([3, 2, 3], [300.0, 100.0, 600.0], np.array([[0, 10, 25], [10, 0, 40], [25, 40, 0]], dtype=float))
    profile = random_profile(6, 1)
    groups = list({tuple(sorted(rng.choice(cluster.size, size=int(rng.integers(1, 4)), replace=False).tolist())) for _ in range(40)})
    one, many = CostModel(profile, cluster, 4), CostModel(profile, cluster, 4)
    one.group_ids(groups)
    for k in range(0, len(groups), 3):
        many.group_ids(groups[k: k + 3])
    a, b = one.group_ids(groups), many.group_ids(groups)
    assert np.array_equal(one._glink[np.ix_(a, a)], many._glink[np.ix_(b, b)])
    worst = np.array([[min(cluster.effective[i, j] for i in g for j in h) for h in groups] for g in groups])
    assert np.array_equal(one._glink[np.ix_(a, a)], worst)
