"""PipeDream's level DP (``solve_level``) against a direct transcription of its recurrence.

The DP fills its tables one diagonal at a time with strided views, small diagonals in one batch over
every unit count and large ones one unit count at a time. Both paths must give the very tables of
the textbook loop — values, back-pointers and which of several equal optima is kept — because
the plan a user gets is read from the back-pointers."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.planners import pipedream_dp
from orchestrator.planners.pipedream_dp import INF, Level, solve_level, stage_time


def _textbook(compute: np.ndarray, params: np.ndarray, cut: np.ndarray, level: Level, straight: bool, all_starts: bool) -> tuple[np.ndarray, ...]:
    """A(i→j, m) = min(T(i→j, m), min over k, m' of max(A(i→k, m−m'), 2a_k/(B·m'), T(k+1→j, m'), 2a_j/(B·m') unless j is the last block)), scanning k
    then m' and keeping the first strict improvement; then "use fewer units"."""
    L, n = compute.shape[0], level.units
    T = lambda s, e, m: float(stage_time(compute[s, e], params[s, e], float(m), level))  # noqa: E731
    best = np.full((L, L, n), INF)
    split = np.full((L, L, n), -1, dtype=np.int32)
    last = np.broadcast_to(np.arange(1, n + 1, dtype=np.int32), best.shape).copy()
    for i in range(L):  # the single stage everywhere (INF where j < i: no such range)
        for j in range(i, L):
            for m in range(1, n + 1):
                best[i, j, m - 1] = T(i, j, m) if (m == 1 or not straight) else INF
    for i in range(L) if all_starts else range(1):
        for j in range(i + 1, L):
            for m in range(2, n + 1):
                top, arg = INF, None
                for k in range(i, j):
                    for mp in range(1, (m - 1 if not straight else 1) + 1):
                        out = 2.0 * cut[j] / (level.bandwidth * mp) if j < L - 1 else 0.0  # the tail sends its output on
                        v = max(best[i, k, m - mp - 1], 2.0 * cut[k] / (level.bandwidth * mp), T(k + 1, j, mp), out)
                        if v < top:
                            top, arg = v, (k, mp)
                if arg is not None and top < best[i, j, m - 1]:
                    best[i, j, m - 1], split[i, j, m - 1], last[i, j, m - 1] = top, arg[0], arg[1]
    used = np.broadcast_to(np.arange(1, n + 1, dtype=np.int32), best.shape).copy()
    for m in range(1, n):
        worse = best[:, :, m - 1] <= best[:, :, m]
        best[:, :, m] = np.where(worse, best[:, :, m - 1], best[:, :, m])
        used[:, :, m] = np.where(worse, used[:, :, m - 1], used[:, :, m])
    return best, split, last, used


@pytest.mark.parametrize("batch", [0, 10**9], ids=["one-m-at-a-time", "all-m-batched"])
@pytest.mark.parametrize("seed", range(12))
def test_level_tables_equal_the_textbook_recurrence(seed: int, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipedream_dp, "BATCH_ALL_UNITS", batch)
    rng = np.random.default_rng(seed)
    L, n = int(rng.integers(1, 10)), int(rng.integers(1, 6))
    # Integer times and bytes make ties common, so the tie-break is tested too.
    work = rng.integers(1, 4, L).astype(float) if seed % 2 else rng.random(L)
    weights = rng.integers(0, 3, L).astype(float) * 1e9
    f, p = np.concatenate([[0.0], np.cumsum(work)]), np.concatenate([[0.0], np.cumsum(weights)])
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    ok = (j >= i) & ((j - i < 3) if seed % 3 == 0 else True)  # some ranges too big for memory
    end = np.minimum(j + 1, L)
    compute, params = np.where(ok, f[end] - f[i], INF), np.where(ok, p[end] - p[i], 0.0)
    cut = rng.integers(0, 3, L).astype(float) * 1e9
    level = Level(n, float(rng.choice([1e9, 1e10, 1e11])), int(rng.integers(1, 4)))
    for straight in (False, True):
        for all_starts in (True, False):
            got = solve_level(compute, params, cut, level, straight, all_starts)
            want = _textbook(compute, params, cut, level, straight, all_starts)
            rows = L if all_starts else 1  # [m, i, j]; one start holds the row i = 0 only
            for name, a, b in zip(("best", "split", "last_m", "used_m"), (got.best, got.split, got.last_m, got.used_m), want):
                assert np.array_equal(a, b.transpose(2, 0, 1)[:, :rows]), (name, straight, all_starts)
