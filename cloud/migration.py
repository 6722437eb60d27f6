"""Migration decisions: should a running job move, and where - a pure function returning a value.

Moving is worth it only when the remaining compute saved beats everything a move costs: the
checkpoint upload (paid on the old instance), download/restart/re-planning (paid on the new one,
with no progress), egress for crossing regions or clouds, and the preemption risk of the target.
Hysteresis keeps the job from flapping between two offers whose prices cross back and forth.
The arithmetic is vectorised over all candidates (:func:`move_scores`) and shared with the
replay simulator, so the planner a job manager calls and the one the benchmark measures are the
same code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pandas as pd

from .errors import CloudInputError

from .records import Offer
from .throughput import ThroughputTable

#: Internet egress USD/GB when the checkpoint leaves a cloud; inter-region inside one cloud.
INTERNET_EGRESS = {"aws": 0.09, "gcp": 0.12, "azure": 0.087}
INTER_REGION_EGRESS = {"aws": 0.02, "gcp": 0.02, "azure": 0.02}


@dataclass(frozen=True, slots=True)
class MigrationCosts:
    """What a move costs besides compute. Times in seconds, bandwidth in Gbit/s."""

    checkpoint_gb: float = 1.0
    upload_gbps: float = 1.0
    download_gbps: float = 1.0
    restart_s: float = 300.0
    replan_s: float = 60.0
    hysteresis: float = 0.05
    min_saving_usd: float = 0.5
    checkpoint_interval_s: float = 1800.0
    charge_egress: bool = True
    preemptions_per_hour: Mapping[tuple[str, str, str, int], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("checkpoint_gb", "restart_s", "replan_s", "hysteresis", "min_saving_usd", "checkpoint_interval_s"):
            if getattr(self, name) < 0:
                raise CloudInputError(f"migration costs: {name} must be >= 0")
        if self.upload_gbps <= 0 or self.download_gbps <= 0:
            raise CloudInputError("migration costs: bandwidth must be > 0")

    @property
    def upload_h(self) -> float:
        return self.checkpoint_gb * 8 / self.upload_gbps / 3600

    @property
    def resume_h(self) -> float:
        """Hours on the new instance before it makes progress: download, restart, re-plan."""
        return (self.checkpoint_gb * 8 / self.download_gbps + self.restart_s + self.replan_s) / 3600

    def lost_h_per_preemption(self) -> float:
        return self.resume_h + self.checkpoint_interval_s / 2 / 3600


@dataclass(frozen=True, slots=True)
class KeepOffer:
    """Stay on the current offer (the controller's own "stay" is :class:`orchestrator.adapt.policies.Stay`)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move the job to ``target`` through a checkpoint: a migration, not the controller's two-worker move."""

    target: Offer
    reason: str
    expected_saving_usd: float

    def __post_init__(self) -> None:
        if self.expected_saving_usd < 0:
            raise CloudInputError("a move must be expected to save money")


@dataclass(frozen=True, slots=True)
class MigrationSkipped:
    """A move the prices called for but that is not taken: the prices it rests on are older than
    the limit (``age_s`` > ``max_age_s``). The job records it (``migration_skipped``) and trains on;
    ``refresh`` says what would make the prices current again."""

    reason: str
    age_s: float
    max_age_s: float
    target: Offer
    refresh: str = "orchestrator prices refresh --cloud CLOUD (or --skypilot CATALOG)"


MigrationDecision = KeepOffer | Migrate

#: Default age limit of prices that may drive an automatic move: SkyPilot's CI rebuilds its catalog
#: every 7 hours; a day leaves room for one missed refresh and still refuses a months-old snapshot.
DEFAULT_MAX_PRICE_AGE_S = 24 * 3600.0


def prices_age_s(decision: Migrate, current: Offer, now: datetime) -> float | None:
    """Age of the oldest price a move rests on (the current offer's and the target's); None: unknown."""
    ages = [current.age_s(now), decision.target.age_s(now)]
    return None if None in ages else max(a for a in ages if a is not None)


def check_fresh(decision: Migrate, current: Offer, now: datetime,
                max_age_s: float = DEFAULT_MAX_PRICE_AGE_S) -> Migrate | MigrationSkipped:
    """``decision``, unless the move rests on prices older than ``max_age_s`` (or of unknown age):
    then a :class:`MigrationSkipped` saying how old they are. Forced moves (the current offer is
    gone) are not the caller's to skip and should not be passed here."""
    if not math.isfinite(max_age_s) or max_age_s < 0:
        raise CloudInputError(f"price age limit must be a finite number of seconds >= 0, got {max_age_s}")
    age = prices_age_s(decision, current, now)
    if age is not None and age <= max_age_s:
        return decision
    shown = "unknown" if age is None else f"{age:.0f} s"
    return MigrationSkipped(f"skipped: prices too old (age {shown} > limit {max_age_s:.0f} s); "
                            f"would have moved to {decision.target.label()}",
                            float("inf") if age is None else round(age, 3), max_age_s, decision.target,
                            f"orchestrator prices refresh --cloud {decision.target.cloud}")


def egress_usd_per_gb(src_cloud: np.ndarray, src_region: np.ndarray, dst_cloud: np.ndarray, dst_region: np.ndarray) -> np.ndarray:
    """Per-candidate egress rate for moving a checkpoint from (src) to each (dst)."""
    internet = np.array([INTERNET_EGRESS.get(str(c), 0.09) for c in src_cloud])
    inter = np.array([INTER_REGION_EGRESS.get(str(c), 0.02) for c in src_cloud])
    return np.where(src_cloud != dst_cloud, internet, np.where(src_region != dst_region, inter, 0.0))


def move_scores(
    remaining: float,
    throughput: np.ndarray,
    price: np.ndarray,
    current: int,
    egress_per_gb: np.ndarray,
    risk_per_hour: np.ndarray,
    costs: MigrationCosts,
    lost_h: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """Expected total USD to finish ``remaining`` samples on each candidate (moving there), and
    the expected cost of staying. Unavailable candidates (NaN price, zero throughput) get +inf.

    Preemption risk inflates run time: each preemption loses ``lost_h_per_preemption`` hours,
    so the expected hours are ``h / (1 - rate * lost)`` (capped when the risk is absurd).
    ``lost_h``: hours lost per preemption per candidate (default ``costs.lost_h_per_preemption()``
    for all), e.g. with each offer's own time to obtain it again.
    """
    lost = costs.lost_h_per_preemption() if lost_h is None else lost_h
    with np.errstate(divide="ignore", invalid="ignore"):
        hours = remaining / (throughput * 3600.0)
        slowdown = 1.0 / np.clip(1.0 - risk_per_hour * lost, 0.05, 1.0)
        run = hours * slowdown * price
        # The upload is paid on the current instance; when it is gone (forced move, NaN price) the
        # upload happens within the notice and costs nothing extra, and must not poison every
        # candidate's score with NaN.
        upload = costs.upload_h * price[current] if np.isfinite(price[current]) else 0.0
        move = run + costs.resume_h * price + upload + egress_per_gb * costs.checkpoint_gb
    move = np.where(np.isfinite(move) & (throughput > 0), move, np.inf)
    stay = float(run[current]) if np.isfinite(run[current]) and throughput[current] > 0 else np.inf
    move[current] = stay
    return move, stay


def choose(move: np.ndarray, stay: float, current: int, costs: MigrationCosts) -> tuple[int, float]:
    """Index of the best target (``current`` = stay) and its expected saving, with hysteresis."""
    best = int(np.argmin(move))
    if not np.isfinite(stay):
        if not np.isfinite(move[best]):
            raise CloudInputError("no offer can run this job: every candidate lacks a price or a throughput")
        return best, 0.0  # forced: the current offer is gone
    saving = stay - float(move[best])
    if best != current and saving > max(costs.min_saving_usd, costs.hysteresis * stay):
        return best, saving
    return current, 0.0


def plan_migration(
    current: Offer,
    offers: pd.DataFrame,
    throughputs: ThroughputTable,
    model: str,
    remaining_samples: float,
    costs: MigrationCosts = MigrationCosts(),
) -> MigrationDecision:
    """KeepOffer or Migrate for a running job, given the latest prices (``PriceStore.latest(now)``).

    The current offer must appear in ``offers``; if it does not (its price is gone, i.e. it is no
    longer offered), the best target is returned as a forced move.
    """
    if remaining_samples <= 0:
        return KeepOffer("job finished")
    table = offers[(offers.gpu_count > 0) & (offers.usd_per_hour > 0)].reset_index(drop=True)
    key = (table.cloud == current.cloud) & (table.region == current.region) & (table.zone == current.zone) \
        & (table.instance_type == current.instance_type) & (table.spot == current.spot) \
        & (table.gpu_count == current.gpu_count) & (table.gpu_type == current.gpu_type) \
        & (table.get("instances", pd.Series(1, index=table.index)).fillna(1) == current.instances)
    if not key.any():
        table = pd.concat([table, pd.DataFrame([{**_offer_row(current), "usd_per_hour": np.nan}])], ignore_index=True)
        key = pd.Series([False] * (len(table) - 1) + [True])
    idx = int(np.flatnonzero(key.to_numpy())[0])
    tput = throughputs.column(model, table.gpu_type, table.gpu_count)
    risk = risk_vector(table, costs)
    egress = egress_usd_per_gb(np.full(len(table), current.cloud), np.full(len(table), current.region),
                               table.cloud.to_numpy(), table.region.to_numpy()) if costs.charge_egress else np.zeros(len(table))
    move, stay = move_scores(remaining_samples, tput, table.usd_per_hour.to_numpy(float), idx, egress, risk, costs)
    best, saving = choose(move, stay, idx, costs)
    if best == idx:
        return KeepOffer(f"no target saves more than max(${costs.min_saving_usd:g}, {costs.hysteresis:.0%}) of ${stay:.2f}")
    target = table.iloc[best]
    seen = target.get("observed_at")
    offer = Offer(str(target.cloud), str(target.region), str(target.zone), str(target.instance_type),
                  str(target.gpu_type), int(target.gpu_count), bool(target.spot), float(target.usd_per_hour),
                  None if seen is None or pd.isna(seen) else pd.Timestamp(seen).to_pydatetime(),
                  int(target.get("instances", 1) if not pd.isna(target.get("instances", 1)) else 1))
    if not np.isfinite(stay):
        return Migrate(offer, "current offer is no longer available", 0.0)
    return Migrate(offer, f"expected ${move[best]:.2f} to finish there vs ${stay:.2f} here, migration costs included",
                round(saving, 4))


def risk_vector(table: pd.DataFrame, costs: MigrationCosts) -> np.ndarray:
    """Preemptions/hour per candidate from observed availability; on-demand offers have none."""
    rates = costs.preemptions_per_hour
    values = [
        rates.get((str(r["cloud"]), str(r["zone"] or r["region"]), str(r["gpu_type"]), int(r["gpu_count"])), 0.0)
        if r["spot"] else 0.0
        for r in table.to_dict("records")
    ]
    return np.asarray(values, dtype=np.float64)


def _offer_row(offer: Offer) -> dict[str, object]:
    return {"cloud": offer.cloud, "region": offer.region, "zone": offer.zone, "instance_type": offer.instance_type,
            "gpu_type": offer.gpu_type, "gpu_count": offer.gpu_count, "spot": offer.spot, "usd_per_hour": offer.usd_per_hour,
            "instances": offer.instances}
