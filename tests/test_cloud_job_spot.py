"""The job's spot decisions over a price catalog (``build_price_view`` / ``spot_decision``), without Ray:
only the latest observation of an offer counts, the current offer carries when its price was read,
a move on prices older than the limit comes back as ``MigrationSkipped``, and learned preemption
rates keep a job off a cheap offer that is taken away every hour."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from cloud.migration import Migrate, MigrationSkipped
from cloud.records import PriceRecord
from cloud.store import PriceStore
from orchestrator.elastic.job_config import ScalingConfig, SpotConfig
from orchestrator.elastic.job_spot import PriceView, build_price_view, spot_decision
from tests.helpers import uniform_profile

NOW = datetime(2026, 11, 26, 12, tzinfo=timezone.utc)


@dataclass
class Job:
    """The attributes of a JobView these two functions read, and an event log they write."""

    spot: SpotConfig
    scaling: ScalingConfig = field(default_factory=lambda: ScalingConfig(devices=2))
    profile: Any = field(default_factory=lambda: uniform_profile(4, fwd=0.01, bwd=0.02, act=1e6, params=1e6))
    train: Any = field(default_factory=lambda: SimpleNamespace(num_microbatches=4, data_fn=lambda i: (np.zeros((8, 4)), None)))
    target_steps: int = 100
    prices: Any = None
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))

    def price_view(self) -> PriceView:  # built once, as the job does
        if self.prices is None:
            self.prices = build_price_view(self)  # type: ignore[arg-type]
        return self.prices


def rec(zone: str, itype: str, count: int, price: float, days_ago: float) -> PriceRecord:
    t = NOW - timedelta(days=days_ago)
    return PriceRecord(t, "aws", "us-east-1", zone, itype, "V100", count, True, price, "test", t)


def catalog(tmp_path: Path, records: list[PriceRecord]) -> str:
    path = tmp_path / "prices.csv"
    PriceStore.from_records(records).save(path)
    return str(path)


def test_an_old_cheap_row_of_an_offer_that_is_expensive_now_never_wins(tmp_path):
    rows = [rec("us-east-1a", "p3.8xlarge", 2, 2.0, 0.1),  # where the job runs (2 GPUs)
            rec("us-east-1b", "p3.16xlarge", 8, 0.5, 60), rec("us-east-1b", "p3.16xlarge", 8, 80.0, 0.1)]
    job = Job(SpotConfig(catalog=catalog(tmp_path, rows), migration_check_every=1))
    view = job.price_view()
    assert len(view.offers) == 2 and view.offers[view.offers.gpu_count == 8].usd_per_hour.tolist() == [80.0]
    assert view.current.instance_type == "p3.8xlarge" and view.current.observed_at == NOW - timedelta(days=0.1)
    assert view.current.as_event()["observed_at"] == (NOW - timedelta(days=0.1)).isoformat()
    assert spot_decision(job, 1, now=NOW) is None
    kinds = [k for k, _ in job.events]
    assert kinds == ["migration_decision"] and job.events[0][1]["decision"] == "KeepOffer"
    assert job.events[0][1]["prices_age_s"] == 8640.0


def test_a_move_on_old_prices_is_skipped_with_their_age(tmp_path):
    rows = [rec("us-east-1a", "p3.8xlarge", 2, 6.0, 2), rec("us-east-1b", "p3.16xlarge", 8, 1.0, 2)]
    path = catalog(tmp_path, rows)
    moved = spot_decision(Job(SpotConfig(catalog=path, migration_check_every=1)), 1, now=NOW)
    assert isinstance(moved, Migrate) and moved.target.instance_type == "p3.16xlarge"
    job = Job(SpotConfig(catalog=path, migration_check_every=1))
    skipped = spot_decision(job, 1, max_price_age_s=86400.0, now=NOW)
    assert isinstance(skipped, MigrationSkipped) and skipped.age_s == 2 * 86400.0
    assert skipped.reason.startswith("skipped: prices too old (age 172800 s") and skipped.target.instance_type == "p3.16xlarge"
    # fresh enough for a longer limit; a forced move (preemption) is never skipped
    assert isinstance(spot_decision(Job(SpotConfig(catalog=path, migration_check_every=1)), 1,
                                    max_price_age_s=3 * 86400.0, now=NOW), Migrate)
    forced = spot_decision(Job(SpotConfig(catalog=path, migration_check_every=1)), 1, preempted=True,
                           max_price_age_s=60.0, now=NOW)
    assert isinstance(forced, Migrate)


def test_learned_preemption_rates_keep_the_job_off_an_offer_taken_every_hour(tmp_path):
    rows = [rec("us-east-1a", "p3.8xlarge", 2, 6.0, 0.01), rec("us-east-1b", "p3.16xlarge", 8, 4.0, 0.01)]
    path = catalog(tmp_path, rows)
    assert isinstance(spot_decision(Job(SpotConfig(catalog=path, migration_check_every=1)), 1, now=NOW), Migrate)
    rates = {("aws", "us-east-1b", "V100", 8): 3.0}  # three preemptions an hour there
    assert spot_decision(Job(SpotConfig(catalog=path, migration_check_every=1)), 1, now=NOW, preemption_rates=rates) is None


def test_a_job_of_four_devices_starts_on_a_fleet_of_four_one_gpu_instances_priced_four_times(tmp_path):
    rows = [rec("us-east-1a", "p3.2xlarge", 1, 0.5, 30), rec("us-east-1a", "p3.2xlarge", 1, 1.2, 0.1),  # newest: 1.2
            rec("us-east-1b", "p3.2xlarge", 1, 0.9, 0.1)]
    job = Job(SpotConfig(catalog=catalog(tmp_path, rows)), scaling=ScalingConfig(devices=4))
    current = job.price_view().current
    assert (current.zone, current.instances, current.gpu_count) == ("us-east-1b", 4, 4)
    assert current.usd_per_hour == 4 * 0.9 and current.as_event()["instances"] == 4
    assert current.label() == "aws/us-east-1b/4x p3.2xlarge (spot)"
    fleets = job.price_view().offers
    assert sorted(fleets[fleets.instances == 4].usd_per_hour.round(6)) == [3.6, 4.8]  # one fleet per offer, newest prices
