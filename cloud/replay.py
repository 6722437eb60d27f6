"""Replay a placement policy over a historical price trace: total cost, migrations, completion time.

The trace becomes one dense matrix (time steps x offers, forward-filled by ``PriceStore.grid``);
each step is a few numpy operations over all offers, so a 3-month hourly trace replays in
milliseconds. The same :func:`cloud.migration.move_scores` decides here and in the live planner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .errors import CloudInputError

from .migration import MigrationCosts, choose, egress_usd_per_gb, move_scores, risk_vector
from .records import normalize_gpu
from .store import SERIES_KEY, PriceStore
from .throughput import ThroughputTable

FREE_MOVES = MigrationCosts(checkpoint_gb=0.0, restart_s=0.0, replan_s=0.0, hysteresis=0.0, min_saving_usd=0.0,
                            checkpoint_interval_s=0.0, charge_egress=False)


@dataclass(frozen=True)
class Trace:
    """Prices on a regular grid: ``prices[t, m]`` USD/h (NaN = not offered), offers in ``meta``."""

    times: pd.DatetimeIndex
    prices: np.ndarray
    meta: pd.DataFrame
    step_h: float

    @classmethod
    def from_store(cls, store: PriceStore, freq: str = "1h") -> Trace:
        grid = store.grid(freq)
        meta = pd.DataFrame(list(grid.columns), columns=SERIES_KEY)
        return cls(pd.DatetimeIndex(grid.index), grid.to_numpy(float), meta, pd.Timedelta(freq).total_seconds() / 3600)


@dataclass(frozen=True, slots=True)
class ReplayPolicy:
    """Which offers a policy may use and how it re-decides.

    ``initial``: ``"cheapest_price"`` takes the lowest $/h among candidates (the baseline), and
    ``"best_value"`` the most samples per dollar. ``dynamic`` re-decides every
    ``decide_every_h`` hours with ``costs`` (use :data:`FREE_MOVES` for an idealised mover).
    A policy that is not dynamic still moves when its offer disappears from the trace.
    """

    name: str
    clouds: tuple[str, ...] = ("aws",)
    gpu_types: tuple[str, ...] = ()
    max_gpus: int = 1
    spot: bool | None = True
    """Spot offers, on-demand ones (False) or both (None)."""
    initial: str = "best_value"
    dynamic: bool = False
    costs: MigrationCosts = field(default_factory=MigrationCosts)
    decide_every_h: float = 1.0

    def __post_init__(self) -> None:
        if self.initial not in ("cheapest_price", "best_value"):
            raise CloudInputError(f"policy {self.name}: unknown initial rule {self.initial!r}")
        if self.max_gpus < 1 or self.decide_every_h <= 0:
            raise CloudInputError(f"policy {self.name}: max_gpus >= 1 and decide_every_h > 0 required")


@dataclass(frozen=True, slots=True)
class ReplayResult:
    policy: str
    cost_usd: float
    hours: float
    migrations: int
    finished: bool
    placements: tuple[str, ...]


def candidate_mask(meta: pd.DataFrame, policy: ReplayPolicy) -> np.ndarray:
    mask = meta.cloud.isin(policy.clouds) & (meta.gpu_count <= policy.max_gpus)
    if policy.spot is not None:
        mask &= meta.spot == policy.spot
    if policy.gpu_types:
        mask &= meta.gpu_type.isin([normalize_gpu(g) for g in policy.gpu_types])
    return mask.to_numpy()


def replay_job(
    trace: Trace, policy: ReplayPolicy, throughputs: ThroughputTable, model: str, samples: float,
    start: pd.Timestamp | str | None = None,
) -> ReplayResult:
    """Run one job of ``samples`` from ``start`` under ``policy``; beyond the trace the last prices hold."""
    mask = candidate_mask(trace.meta, policy)
    tput = np.where(mask, throughputs.column(model, trace.meta.gpu_type, trace.meta.gpu_count), 0.0)
    if not (tput > 0).any():
        raise CloudInputError(f"policy {policy.name}: no candidate offer can run {model!r}")
    prices = np.where(mask & (tput > 0), trace.prices, np.nan)
    if start is None:
        live = np.isfinite(prices).any(axis=1)
        t0 = int(np.argmax(live)) if live.any() else len(prices)
    else:
        t0 = int(trace.times.searchsorted(_utc(start)))
    if t0 >= len(trace.times):
        raise CloudInputError(f"start {start} is after the end of the trace")
    costs = policy.costs
    risk = risk_vector(trace.meta, costs)
    clouds, regions = trace.meta.cloud.to_numpy(), trace.meta.region.to_numpy()
    every = max(1, round(policy.decide_every_h / trace.step_h))
    dt = trace.step_h

    cur = _initial(prices[t0], tput, policy.initial)
    remaining, cost, busy, elapsed, migrations = float(samples), 0.0, 0.0, 0.0, 0
    path = [_label(trace.meta, cur)]
    step = t0
    while remaining > 0:
        row = prices[min(step, len(prices) - 1)]
        gone = not np.isfinite(row[cur])
        if gone or (policy.dynamic and (step - t0) % every == 0 and step > t0 and busy == 0):
            egress = egress_usd_per_gb(np.full(len(row), clouds[cur]), np.full(len(row), regions[cur]), clouds, regions) \
                if costs.charge_egress else np.zeros(len(row))
            scores, stay = move_scores(remaining, tput, np.nan_to_num(row, nan=np.inf) if gone else row, cur,
                                       egress, risk, costs)
            if gone:
                stay = np.inf
                scores[cur] = np.inf
            target, _ = choose(scores, stay, cur, costs)
            if target != cur and np.isfinite(scores[target]):
                if not gone:
                    cost += costs.upload_h * row[cur]
                    elapsed += costs.upload_h
                else:
                    remaining += tput[cur] * 3600 * costs.checkpoint_interval_s / 7200  # work since last checkpoint
                cur, busy, migrations = target, costs.resume_h, migrations + 1
                path.append(_label(trace.meta, cur))
            elif gone:
                raise CloudInputError(f"policy {policy.name}: no offer left at {trace.times[min(step, len(prices) - 1)]}")
        spent, took, busy, remaining, _ = advance(dt, busy, float(row[cur]), remaining, tput[cur] * 3600)
        cost, elapsed = cost + spent, elapsed + took
        step += 1
    return ReplayResult(policy.name, cost, elapsed, migrations, step <= len(prices), tuple(path))


def advance(dt: float, busy: float, price: float, remaining: float, samples_per_h: float) -> tuple[float, float, float, float, float]:
    """One replay step of ``dt`` hours on one offer at ``price`` $/h: first what is left of a restart
    (``busy`` hours), then training on the ``remaining`` samples. The one rule both replays (prices
    only, prices and availability) charge time by. Returns (cost, hours, busy left, samples left,
    hours trained)."""
    cost = hours = 0.0
    left = dt
    if busy > 0:
        used = min(busy, left)
        cost, busy, left, hours = cost + used * price, busy - used, left - used, hours + used
    trained = 0.0
    if left > 0:
        need = remaining / samples_per_h
        trained = min(left, need)
        cost, hours = cost + trained * price, hours + trained
        remaining = 0.0 if trained >= need else remaining - trained * samples_per_h
    return cost, hours, busy, remaining, trained


def _utc(value: pd.Timestamp | str) -> pd.Timestamp:
    try:
        stamp = pd.Timestamp(value)
    except ValueError:
        raise CloudInputError(f"bad start time {value!r}") from None
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def common_start(trace: Trace, policies: Sequence[ReplayPolicy]) -> pd.Timestamp:
    """The first grid time at which every policy has a candidate priced and the trace covers at
    least 90% of the offers it ever prices (a trace often starts with only a few series)."""
    priced = np.isfinite(trace.prices).sum(axis=1)
    live = priced >= 0.9 * priced.max()
    for policy in policies:
        live &= np.isfinite(np.where(candidate_mask(trace.meta, policy), trace.prices, np.nan)).any(axis=1)
    if not live.any():
        raise CloudInputError("the trace has no time at which every policy has an offer")
    return pd.Timestamp(trace.times[int(np.argmax(live))])


def _initial(row: np.ndarray, tput: np.ndarray, rule: str) -> int:
    ok = np.isfinite(row) & (tput > 0)
    if not ok.any():
        raise CloudInputError("no candidate offer is available at the start time")
    if rule == "cheapest_price":
        return int(np.argmin(np.where(ok, row, np.inf)))
    return int(np.argmax(np.where(ok, tput / np.where(ok, row, 1.0), -np.inf)))


def _label(meta: pd.DataFrame, i: int) -> str:
    r = meta.iloc[i]
    return f"{r.cloud}/{r.zone or r.region}/{r.instance_type}"


def replay_many(
    trace: Trace, policies: Sequence[ReplayPolicy], throughputs: ThroughputTable, model: str, samples: float,
    starts: Sequence[pd.Timestamp],
) -> pd.DataFrame:
    """Every policy from every start: one row per (policy, start)."""
    rows = []
    for start in starts:
        for policy in policies:
            r = replay_job(trace, policy, throughputs, model, samples, start)
            rows.append({"policy": r.policy, "start": start, "cost_usd": r.cost_usd, "hours": r.hours,
                         "migrations": r.migrations, "finished": r.finished})
    return pd.DataFrame(rows)


def standard_policies(checkpoint_gb: float = 1.0, clouds: tuple[str, ...] = ("aws", "azure", "gcp")) -> list[ReplayPolicy]:
    """The thesis' ladder (fig. 6.5/6.6): each rung adds one freedom to the one before.

    baseline (cheapest 1xV100 spot on AWS at start, kept) -> any GPU type by samples per dollar
    -> multi-GPU instances -> other clouds -> re-choosing every hour for free -> the same with
    migration costs charged (checkpoint transfer, restart, egress) and hysteresis.
    """
    every = ("aws",) + tuple(c for c in clouds if c != "aws")
    return [
        ReplayPolicy("baseline", gpu_types=("V100",), initial="cheapest_price"),
        ReplayPolicy("gpu-type"),
        ReplayPolicy("multi-gpu", max_gpus=16),
        ReplayPolicy("multi-cloud", clouds=every, max_gpus=16),
        ReplayPolicy("dynamic (free moves)", clouds=every, max_gpus=16, dynamic=True, costs=FREE_MOVES),
        ReplayPolicy("ours (migration costs)", clouds=every, max_gpus=16, dynamic=True,
                     costs=MigrationCosts(checkpoint_gb=checkpoint_gb)),
    ]
