"""Replay placement policies over prices *and* availability: each policy pays for the preemptions it
would have suffered and for its migrations.

The availability logs say, per (cloud, zone, GPU type, count), when capacity could be had and when
a running instance was taken away. A policy running on a spot offer is preempted when the logs'
instance of that offer was; it then has to find an offer that is obtainable at that time (or wait)
and pays the restart. Prices come from the price trace on the same grid; on-demand offers (the
bundled snapshot's list prices) are never preempted. A replay runs only where prices and
availability overlap (a window per cloud); every result says which window it used.

The availability-aware policy chooses by expected cost to finish (= expected samples per dollar),
counting each offer's preemption rate and time to obtain learned *online* (only from log lines
before the replay's clock, :class:`cloud.availability.AvailabilityModel`) and a deadline; it uses
the same :func:`cloud.migration.move_scores` as the live planner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from .availability import UNWATCHED, AvailabilityModel, Key, observed_truth
from .errors import CloudInputError
from .migration import MigrationCosts, choose, egress_usd_per_gb, move_scores
from .replay import FREE_MOVES, ReplayPolicy, advance, candidate_mask
from .store import SERIES_KEY, PriceStore
from .throughput import ThroughputTable

#: Seconds of warning before a spot instance is taken (AWS interruption notice; GCP and Azure's).
NOTICE_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
STEP = "10min"


@dataclass(frozen=True, slots=True)
class Window:
    """Where one cloud's prices and availability logs overlap."""

    cloud: str
    start: pd.Timestamp
    end: pd.Timestamp

    def label(self) -> str:
        return f"{self.cloud} {self.start:%Y-%m-%dT%H:%M}Z..{self.end:%Y-%m-%dT%H:%M}Z"


def windows(prices: PriceStore, events: pd.DataFrame) -> list[Window]:
    """One window per cloud with both spot prices and availability events; none: one-line error."""
    spot = prices.frame[prices.frame.spot]
    found, spans = [], []
    for cloud in sorted(set(events.cloud)):
        ev, pr = events[events.cloud == cloud], spot[spot.cloud == cloud]
        span = f"{cloud}: availability {ev['at'].min():%Y-%m-%d}..{ev['at'].max():%Y-%m-%d}"
        if pr.empty:
            spans.append(f"{span}, no spot prices")
            continue
        spans.append(f"{span}, prices {pr.timestamp.min():%Y-%m-%d}..{pr.timestamp.max():%Y-%m-%d}")
        start, end = max(ev["at"].min(), pr.timestamp.min()), min(ev["at"].max(), pr.timestamp.max())
        if end - start >= pd.Timedelta("1h"):
            found.append(Window(cloud, start.ceil(STEP), end.floor(STEP)))
    if not found:
        raise CloudInputError(f"no overlap between prices and availability ({'; '.join(spans)})")
    return found


@dataclass(frozen=True)
class Market:
    """A window's offers on a grid: prices, whether each could be obtained, when each was preempted."""

    window: Window
    times: pd.DatetimeIndex
    meta: pd.DataFrame
    prices: np.ndarray
    obtainable: np.ndarray
    preempted: np.ndarray
    events: pd.DataFrame
    left_out: tuple[str, ...]
    step_h: float = field(default=1 / 6)

    @classmethod
    def build(cls, window: Window, prices: PriceStore, on_demand: PriceStore, events: pd.DataFrame) -> Market:
        times = pd.date_range(window.start, window.end, freq=STEP)
        spot = PriceStore(prices.frame[(prices.frame.cloud == window.cloud) & prices.frame.spot])
        ev = events[events.cloud == window.cloud]
        inside = ev[(ev["at"] >= window.start - UNWATCHED) & (ev["at"] <= window.end)]  # watched during the window
        watched = {(str(c), str(z), str(g), int(n)) for c, z, g, n in
                   zip(inside.cloud, inside.zone, inside.gpu_type, inside.gpu_count) if z}
        grid = spot.grid(STEP, start=window.start, end=window.end).reindex(times)
        meta = pd.DataFrame(list(grid.columns), columns=SERIES_KEY)
        keys = _keys(meta)
        keep = np.array([k in watched for k in keys], dtype=bool) & np.isfinite(grid.to_numpy(float)).any(axis=0)
        left = [f"{r['cloud']}/{r['zone'] or r['region']}/{r['instance_type']} {r['gpu_count']}x{r['gpu_type']} (spot): "
                "not watched by the availability logs in this window" for r, k in zip(meta.to_dict("records"), keep) if not k]
        priced = {k for k, ok in zip(keys, keep) if ok}
        left += [f"{c}/{z} {n}x{g} (spot): watched, but no price in this window" for c, z, g, n in sorted(watched - priced)]
        meta, spot_prices = meta[keep].reset_index(drop=True), grid.to_numpy(float)[:, keep]
        keys = [k for k, ok in zip(keys, keep) if ok]
        ok_now, hit = observed_truth(ev, times, keys)
        od = on_demand.latest()
        od = od[(od.cloud == window.cloud) & ~od.spot & od.gpu_type.isin(sorted(set(meta.gpu_type)))]
        od_meta = od.loc[:, SERIES_KEY].reset_index(drop=True)
        n = len(times)
        return cls(window, times, pd.concat([meta, od_meta], ignore_index=True),
                   np.hstack([spot_prices, np.tile(od.usd_per_hour.to_numpy(float), (n, 1))]),
                   np.hstack([ok_now.to_numpy(bool), np.ones((n, len(od)), dtype=bool)]),
                   np.hstack([hit.to_numpy(bool), np.zeros((n, len(od)), dtype=bool)]),
                   ev, tuple(left), pd.Timedelta(STEP).total_seconds() / 3600)

    def keys(self) -> list[Key]:
        return _keys(self.meta)


def _keys(meta: pd.DataFrame) -> list[Key]:
    return [(str(c), str(z), str(g), int(n)) for c, z, g, n in zip(meta.cloud, meta.zone, meta.gpu_type, meta.gpu_count)]


@dataclass(frozen=True, slots=True)
class AvailabilityResult:
    policy: str
    window: str
    cost_usd: float
    hours: float
    preemptions: int
    migrations: int
    completed: bool
    samples_done: float
    placements: tuple[str, ...]


class _Models:
    """Availability models by clock, built once per decision time and shared by every policy and
    model of one replay (the estimate at a clock does not depend on who asks)."""

    def __init__(self, events: pd.DataFrame) -> None:
        self.events = events
        self.built: dict[pd.Timestamp, AvailabilityModel] = {}

    def at(self, clock: pd.Timestamp) -> AvailabilityModel:
        if clock not in self.built:
            self.built[clock] = AvailabilityModel(self.events, clock)
        return self.built[clock]


def expected_scores(market: Market, step: int, cur: int, remaining: float, tput: np.ndarray, row: np.ndarray,
                    costs: MigrationCosts, models: _Models | None, deadline_h: float | None, elapsed_h: float,
                    ) -> tuple[np.ndarray, float]:
    """Expected USD to finish on each candidate (``cur`` = stay; -1: not placed): ``move_scores``
    with each spot offer's learned preemption rate and hours lost per preemption (its time to
    obtain plus the restart), candidates not obtainable now or expected past the deadline at +inf."""
    n = len(row)
    risk, lost = np.zeros(n), np.full(n, costs.lost_h_per_preemption())
    if models is not None:
        model = models.at(market.times[step])
        for j, key in enumerate(market.keys()):
            est = model.get(key) if bool(market.meta.spot.iloc[j]) else None
            if est is not None:
                risk[j], lost[j] = est.rate_per_h, est.time_to_obtain_h + costs.lost_h_per_preemption()
            elif bool(market.meta.spot.iloc[j]):
                risk[j] = model.prior_preemptions / model.prior_hours
    egress = np.zeros(n)
    if cur >= 0 and costs.charge_egress:
        clouds, regions = market.meta.cloud.to_numpy(), market.meta.region.to_numpy()
        egress = egress_usd_per_gb(np.full(n, clouds[cur]), np.full(n, regions[cur]), clouds, regions)
    priced = np.where(market.obtainable[step] | (np.arange(n) == cur), row, np.nan)
    # not placed: score against a place that is gone (no upload to pay, staying is impossible)
    here = cur if cur >= 0 else n
    ext = (lambda a, v: a if cur >= 0 else np.append(a, v))
    scores, stay = move_scores(remaining, ext(tput, 0.0), ext(priced, np.nan), here, ext(egress, 0.0), ext(risk, 0.0),
                               costs, ext(lost, 0.0))
    scores = scores[:n]
    if deadline_h is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            hours = remaining / (tput * 3600) / np.clip(1 - risk * lost, 0.05, 1) + costs.resume_h
        late = elapsed_h + hours > deadline_h
        if (~late & np.isfinite(scores)).any():
            scores = np.where(late, np.inf, scores)
            stay = stay if cur < 0 or not late[cur] else np.inf
    return scores, stay


def replay_available(market: Market, policy: ReplayPolicy, throughputs: ThroughputTable, model: str, samples: float,
                     models: _Models | None = None, deadline_h: float | None = None) -> AvailabilityResult:
    """One job of ``samples`` under ``policy`` from the window's start; ``models``: the policy is
    availability-aware (learns rates online); ``deadline_h``: it must expect to finish by then."""
    mask = candidate_mask(market.meta, policy)
    tput = np.where(mask, throughputs.column(model, market.meta.gpu_type, market.meta.gpu_count), 0.0)
    if not (tput > 0).any():
        raise CloudInputError(f"policy {policy.name}: no candidate offer can run {model!r} in {market.window.label()}")
    prices = np.where(mask & (tput > 0), market.prices, np.nan)
    costs, dt, n = policy.costs, market.step_h, len(market.times)
    every = max(1, round(policy.decide_every_h / dt))
    notice = NOTICE_S.get(market.window.cloud, 30.0)
    checkpoint_s = costs.checkpoint_gb * 8 / costs.upload_gbps
    cur, busy, remaining, cost, elapsed = -1, 0.0, float(samples), 0.0, 0.0
    preemptions, migrations, since_ckpt_h, placed_at = 0, 0, 0.0, 0
    path: list[str] = []
    step = 0
    while remaining > 0 and step < n:
        row = prices[step]
        if cur >= 0 and market.preempted[step, cur]:
            preemptions += 1
            if notice < checkpoint_s + 5.0:  # no time to checkpoint: back to the last periodic one
                remaining += since_ckpt_h * tput[cur] * 3600
            cur, busy, since_ckpt_h = -1, 0.0, 0.0
        if cur < 0:
            cur = _place(market, step, row, tput, remaining, policy, costs, models, deadline_h, elapsed)
            if cur < 0:
                step, elapsed = step + 1, elapsed + dt
                continue
            busy, placed_at = costs.resume_h, step
            path.append(_label(market.meta, cur))
        elif policy.dynamic and busy == 0 and (step - placed_at) % every == 0 and step > placed_at:
            scores, stay = expected_scores(market, step, cur, remaining, tput, row, costs, models, deadline_h, elapsed) \
                if models is not None else _price_scores(market, step, cur, remaining, tput, row, costs)
            target, _ = choose(scores, stay, cur, costs)
            if target != cur and np.isfinite(scores[target]):
                cost, elapsed = cost + costs.upload_h * row[cur], elapsed + costs.upload_h
                cur, busy, placed_at, migrations = target, costs.resume_h, step, migrations + 1
                path.append(_label(market.meta, cur))
        spent, took, busy, remaining, trained = advance(dt, busy, float(row[cur]), remaining, tput[cur] * 3600)
        cost, elapsed = cost + spent, elapsed + took
        if trained > 0:
            since_ckpt_h += trained
            if since_ckpt_h * 3600 >= costs.checkpoint_interval_s:
                since_ckpt_h = 0.0
        step += 1
    return AvailabilityResult(policy.name, market.window.label(), float(cost), float(elapsed), int(preemptions),
                              int(migrations), bool(remaining <= 0), float(samples - max(remaining, 0.0)), tuple(path))


def _place(market: Market, step: int, row: np.ndarray, tput: np.ndarray, remaining: float, policy: ReplayPolicy,
           costs: MigrationCosts, models: _Models | None, deadline_h: float | None, elapsed: float) -> int:
    ok = market.obtainable[step] & np.isfinite(row) & (tput > 0)
    if not ok.any():
        return -1
    if models is not None:
        scores, _ = expected_scores(market, step, -1, remaining, tput, row, costs, models, deadline_h, elapsed)
        scores = np.where(ok, scores, np.inf)
        return int(np.argmin(scores)) if np.isfinite(scores).any() else -1
    if policy.initial == "cheapest_price":
        return int(np.argmin(np.where(ok, row, np.inf)))
    value = np.where(ok, tput / np.where(ok, row, 1.0), -np.inf)
    best = value.max()
    return int(np.argmax(np.where(value >= best * (1 - 1e-9), tput, -np.inf)))  # ties: the fastest


def _price_scores(market: Market, step: int, cur: int, remaining: float, tput: np.ndarray, row: np.ndarray,
                  costs: MigrationCosts) -> tuple[np.ndarray, float]:
    """A price-only policy's view (no preemption risk), restricted to what can be obtained now."""
    n = len(row)
    clouds, regions = market.meta.cloud.to_numpy(), market.meta.region.to_numpy()
    egress = egress_usd_per_gb(np.full(n, clouds[cur]), np.full(n, regions[cur]), clouds, regions) \
        if costs.charge_egress else np.zeros(n)
    priced = np.where(market.obtainable[step] | (np.arange(n) == cur), row, np.nan)
    return move_scores(remaining, tput, priced, cur, egress, np.zeros(n), costs)


def _label(meta: pd.DataFrame, i: int) -> str:
    r = meta.iloc[i]
    return f"{r.cloud}/{r.zone or r.region}/{r.instance_type}/{'spot' if r.spot else 'on-demand'}"


def availability_policies(checkpoint_gb: float = 1.0) -> list[ReplayPolicy]:
    """on-demand, cheapest spot now, the thesis's ladder (``standard_policies``), and the
    availability-aware policy (spot and on-demand candidates; deadline and rates in the replay)."""
    from .replay import standard_policies

    every = ("aws", "azure", "gcp")
    costs = MigrationCosts(checkpoint_gb=checkpoint_gb)
    ladder = [replace(p, clouds=every) if p.name != "baseline" else replace(p, clouds=every) for p in standard_policies(checkpoint_gb)]
    return [
        ReplayPolicy("on-demand", clouds=every, max_gpus=16, spot=False),
        ReplayPolicy("cheapest-spot", clouds=every, max_gpus=16, initial="cheapest_price"),
        *ladder,
        ReplayPolicy("availability-aware", clouds=every, max_gpus=16, spot=None, dynamic=True, costs=costs),
    ]


AWARE = "availability-aware"
ON_DEMAND = "on-demand"


def replay_models(markets: Sequence[Market], policies: Sequence[ReplayPolicy], throughputs: ThroughputTable,
                  models: Sequence[str], samples_of: dict[str, float], deadline_factor: float = 1.2) -> list[dict[str, object]]:
    """Every (window, model, policy) as a row; the aware policy's deadline is ``deadline_factor``
    times the on-demand completion time of the same window and model."""
    rows: list[dict[str, object]] = []
    for market in markets:
        learned = _Models(market.events)
        for model in models:
            base: AvailabilityResult | None = None
            for policy in policies:
                aware = policy.name == AWARE
                deadline = deadline_factor * base.hours if aware and base is not None and base.completed else None
                r = replay_available(market, policy, throughputs, model, samples_of[model], learned if aware else None, deadline)
                if policy.name == ON_DEMAND:
                    base = r
                rows.append({"model": model, "policy": r.policy, "window": r.window, "cost_usd": round(r.cost_usd, 2),
                             "hours": round(r.hours, 2), "preemptions": r.preemptions, "migrations": r.migrations,
                             "completed": r.completed, "samples": round(samples_of[model]),
                             "usd_per_ksample": round(1000 * r.cost_usd / r.samples_done, 4) if r.samples_done else None,
                             "placements": list(r.placements)[:6], "left_out": list(market.left_out)})
    return rows


__all__ = ["AWARE", "FREE_MOVES", "Market", "ON_DEMAND", "Window", "availability_policies", "replay_available",
           "replay_models", "windows"]
