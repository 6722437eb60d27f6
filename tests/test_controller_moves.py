"""Two-worker moves: what they change, how many there are, and where repeated moves lead."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from orchestrator.core.cluster import flat, two_level
from orchestrator.adapt import CostModel, Layout, MoveKind, move_transfers, path_to, walk, workers_touched
from orchestrator.adapt.handle import SHIPPED_STATE_FACTOR
from orchestrator.core.plan import straight_plan
from orchestrator.costmodel.simulator import simulate
from tests.helpers import random_profile
from tests.move_oracle import enumerate_moves

STARTS = [
    (Layout((0, 3, 6, 10), ((0,), (1,), (2,))), range(5)),  # straight, two idle devices
    (Layout((0, 4, 7, 10), ((0, 1), (2,), (3, 4))), range(6)),  # replicated stages, one idle
    (Layout((0, 10), ((0, 1, 2),)), range(3)),  # pure data parallel
]


@pytest.mark.parametrize("start,alive,straight", [(s, a, False) for s, a in STARTS] + [(STARTS[0][0], STARTS[0][1], True)])
def test_every_candidate_changes_exactly_two_workers(start: Layout, alive: range, straight: bool) -> None:
    moves = enumerate_moves(start, alive, straight)
    assert moves
    for m in moves:
        assert len(workers_touched(start, m.layout, alive)) == 2, m
        assert m.layout.devices <= set(alive)
        assert m.layout.cuts[0] == 0 and m.layout.cuts[-1] == 10 and all(a < b for a, b in zip(m.layout.cuts, m.layout.cuts[1:]))
        if straight:
            assert all(len(g) == 1 for g in m.layout.groups)
    assert len({m.layout for m in moves}) == len(moves)  # no duplicates


def test_candidate_count_is_quadratic() -> None:
    counts = []
    for L in (16, 32, 64, 128):
        S = 8
        cuts = tuple(round(i * L / S) for i in range(S + 1))
        lay = Layout(cuts, tuple((d,) for d in range(S)))
        moves = enumerate_moves(lay, range(S + 2))
        shifts = sum(1 for m in moves if m.kind is MoveKind.SHIFT)
        assert shifts == sum(cuts[i + 2] - cuts[i] - 2 for i in range(S - 1))
        counts.append(len(moves))
        assert len(moves) <= 4 * L * L
    assert counts == sorted(counts)


def _brute_force(L: int, n: int) -> list[Layout]:
    out = []
    for k in range(1, n + 1):
        for cuts in itertools.combinations(range(1, L), k - 1):
            for assign in itertools.product(range(k + 1), repeat=n):  # k = unused
                groups = tuple(tuple(d for d in range(n) if assign[d] == s) for s in range(k))
                if all(groups):
                    out.append(Layout((0,) + cuts + (L,), groups))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_walk_reaches_brute_force_optimum_on_small_homogeneous_cases(seed: int) -> None:
    L, n = 8, 3
    profile = random_profile(L, seed, act_scale=5e7)
    model = CostModel(profile, flat(n, 10), 8)
    start = Layout((0, 3, 5, 8), ((0,), (1,), (2,)))
    everything = _brute_force(L, n)
    best = float(model.estimate(everything).time_s.min())
    w = walk(start, model, range(n))
    assert w.estimates[-1] == pytest.approx(best, rel=1e-9)
    assert all(b <= a for a, b in zip(w.estimates, w.estimates[1:]))
    for prev, m in zip((start,) + tuple(x.layout for x in w.moves), w.moves):
        assert len(workers_touched(prev, m.layout, range(n))) == 2


def test_path_to_reaches_any_straight_target_through_legal_moves() -> None:
    rng = np.random.default_rng(0)
    straight = [lay for lay in _brute_force(8, 4) if all(len(g) == 1 for g in lay.groups)]
    lengths = []
    for _ in range(200):
        a, b = straight[rng.integers(len(straight))], straight[rng.integers(len(straight))]
        path, cur = path_to(a, b, range(4)), a
        for m in path:
            assert m.layout in {c.layout for c in enumerate_moves(cur, range(4), straight=True)}
            cur = m.layout
        assert cur == b
        bound = len(a.devices - b.devices) + len(b.devices - a.devices) + 2 * (len(b.groups) - 1)
        assert len(path) <= bound
        lengths.append(len(path))
    assert max(lengths) >= 3  # the sample includes genuinely multi-move paths


def test_path_to_a_target_on_other_devices_drops_a_stage_before_a_split_would_need_more_stages_than_blocks() -> None:
    """Five new devices for an 8-block model on four: growing all first would need nine stages; a stage whose device
    the target drops is merged away first when no stage has two blocks left (the soak met this after a node left)."""
    start = Layout((0, 2, 4, 6, 8), ((0,), (1,), (2,), (3,)))
    target = Layout((0, 1, 2, 4, 6, 8), ((4,), (5,), (6,), (7,), (8,)))
    path, cur = path_to(start, target, range(9)), start
    for m in path:
        assert m.layout in {c.layout for c in enumerate_moves(cur, range(9), straight=True)}
        cur = m.layout
    assert cur == target
    assert len(path) <= len(start.devices - target.devices) + len(target.devices - start.devices) + 2 * (len(target.groups) - 1)


def test_estimate_ranks_like_the_simulator() -> None:
    profile = random_profile(16, 4, act_scale=3e8)
    cluster = two_level(2, 2, 100, 10, speeds=[1.0, 0.7, 1.3, 1.0])
    plan = straight_plan([0, 4, 8, 12, 16], 8)
    moves = enumerate_moves(Layout.of(plan), range(4))[::7]
    est = CostModel(profile, cluster, 8).estimate([m.layout for m in moves]).time_s
    sim = np.array([simulate(m.layout.to_plan(plan), profile, cluster).iteration_s for m in moves])
    ok = np.isfinite(est)
    assert np.all(np.abs(est[ok] / sim[ok] - 1) < 0.15)
    rank = lambda x: np.argsort(np.argsort(x))  # noqa: E731
    assert np.corrcoef(rank(est[ok]), rank(sim[ok]))[0, 1] > 0.9


def test_move_transfers_ship_only_the_moved_blocks() -> None:
    profile = random_profile(10, 1)
    cluster = flat(3, 10)
    old = straight_plan([0, 3, 6, 10], 4)
    new = straight_plan([0, 5, 6, 10], 4)  # blocks 3, 4 go from device 1 to device 0
    ts = move_transfers(old, new, profile, cluster)
    assert [(t.src, t.dst, t.first, t.last) for t in ts] == [(1, 0, 3, 5)]
    assert ts[0].nbytes == pytest.approx(profile.param_bytes(3, 5) * SHIPPED_STATE_FACTOR)
