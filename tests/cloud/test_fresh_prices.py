"""Fresh prices: the latest row per offer wins everywhere, ages are reported, and a move resting on
old prices is skipped (typed value), while manual commands only warn."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

from cloud.cli import main
from cloud.importers import load_any
from cloud.migration import KeepOffer, Migrate, MigrationSkipped, check_fresh, plan_migration
from cloud.records import Offer, PriceRecord
from cloud.store import PriceStore, latest_rows, offer_of
from cloud.throughput import ThroughputTable

NOW = datetime.now(timezone.utc).replace(microsecond=0)
TPUT = ThroughputTable({("job", "V100", 8): 8.0, ("job", "V100", 4): 4.0})


def row(itype: str, count: int, price: float, days_ago: float, zone: str = "us-east-1a") -> PriceRecord:
    when = NOW - timedelta(days=days_ago)
    return PriceRecord(when, "aws", "us-east-1", zone, itype, "V100", count, True, price, "test", when)


def test_an_old_cheap_row_never_beats_the_current_price():
    """Two months ago p3.16xlarge cost $1; now it costs $50. The planner sees only $50."""
    store = PriceStore.from_records([row("p3.16xlarge", 8, 1.0, 60), row("p3.16xlarge", 8, 50.0, 0),
                                     row("p3.8xlarge", 4, 4.0, 0, "us-east-1b")])
    latest = latest_rows(store.frame)
    assert len(latest) == 2 and latest[latest.instance_type == "p3.16xlarge"].usd_per_hour.tolist() == [50.0]
    current = offer_of(latest[latest.instance_type == "p3.8xlarge"].iloc[0])
    decision = plan_migration(current, latest, TPUT, "job", 1e7)
    assert isinstance(decision, KeepOffer)  # $50 for twice the speed of $4 is no saving
    # the whole history (the old bug): the $1 row would have won
    assert isinstance(plan_migration(current, store.frame, TPUT, "job", 1e7), Migrate)


def test_latest_breaks_timestamp_ties_by_the_later_read():
    t = NOW - timedelta(days=1)
    a = PriceRecord(t, "aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, True, 1.0, "old read", t)
    b = PriceRecord(t, "aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, True, 2.0, "new read", NOW)
    frame = pd.concat([PriceStore.from_records([b]).frame, PriceStore.from_records([a]).frame])
    assert latest_rows(frame).usd_per_hour.tolist() == [2.0]


def test_offer_carries_observed_at_and_its_age():
    offer = offer_of(latest_rows(PriceStore.from_records([row("p3.8xlarge", 4, 4.0, 2)]).frame).iloc[0])
    assert offer.observed_at == NOW - timedelta(days=2)
    assert offer.age_s(NOW) == pytest.approx(2 * 86400)
    event = offer.as_event()
    assert event["usd_per_hour"] == 4.0 and event["observed_at"] == (NOW - timedelta(days=2)).isoformat()
    assert Offer("aws", "r", "z", "p3.2xlarge", "V100", 1, True, 1.0).age_s(NOW) is None


@pytest.mark.parametrize("days_ago,limit_s,skipped", [(0.5, 86400.0, False), (2.0, 86400.0, True), (2.0, 3 * 86400.0, False)])
def test_a_move_on_old_prices_is_skipped_with_its_age(days_ago, limit_s, skipped):
    current = Offer("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, True, 8.0, NOW - timedelta(days=days_ago))
    target = Offer("aws", "us-east-1", "us-east-1b", "p3.16xlarge", "V100", 8, True, 4.0, NOW)
    out = check_fresh(Migrate(target, "cheaper", 10.0), current, NOW, limit_s)
    assert isinstance(out, MigrationSkipped) is skipped
    if isinstance(out, MigrationSkipped):
        assert out.age_s == pytest.approx(days_ago * 86400) and out.target == target
        assert out.reason.startswith("skipped: prices too old (age ") and "prices refresh --cloud aws" in out.refresh


def test_a_move_on_prices_of_unknown_age_is_skipped():
    current = Offer("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, True, 8.0)
    target = Offer("aws", "us-east-1", "us-east-1b", "p3.16xlarge", "V100", 8, True, 4.0, NOW)
    out = check_fresh(Migrate(target, "cheaper", 10.0), current, NOW, 86400.0)
    assert isinstance(out, MigrationSkipped) and "unknown" in out.reason


def test_prices_show_json_carries_observed_at_and_age(tmp_path, capsys):
    catalog = tmp_path / "prices.csv"
    PriceStore.from_records([row("p3.2xlarge", 1, 3.0, 3), row("p3.2xlarge", 1, 0.9, 10, "us-east-1b")]).save(catalog)
    assert main(["prices", "show", "--catalog", str(catalog), "--gpu", "V100", "--spot", "--json"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert [r["usd_per_hour"] for r in rows] == [0.9, 3.0]
    for r in rows:
        age = (datetime.now(timezone.utc) - datetime.fromisoformat(r["observed_at"])).total_seconds()
        assert abs(r["age_s"] - age) < 120
    assert "warning: 2 of 2 prices are older than 86400 s" in out.err  # a manual command warns, still answers
    assert main(["prices", "show", "--catalog", str(catalog), "--gpu", "V100", "--spot", "--json", "--max-age", "1e9"]) == 0
    assert "warning" not in capsys.readouterr().err


SKYPILOT = ("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,AvailabilityZone,SpotPrice\n"
            "p3.2xlarge,V100,1.0,8.0,61.0,3.06,us-east-1,us-east-1a,0.95\n"
            "p3.16xlarge,V100,8.0,64.0,488.0,24.48,us-east-1,us-east-1a,7.5\n")


def test_skypilot_rows_take_the_file_time_or_observed_at(tmp_path):
    path = tmp_path / "aws" / "vms.csv"
    path.parent.mkdir()
    path.write_text(SKYPILOT)
    stamp = (NOW - timedelta(hours=5)).timestamp()
    os.utime(path, (stamp, stamp))
    frame = load_any(path)
    assert (frame.observed_at == pd.Timestamp(stamp, unit="s", tz="UTC")).all() and len(frame) == 4
    given = datetime(2026, 1, 2, tzinfo=timezone.utc)
    assert (load_any(path, given).observed_at == pd.Timestamp(given)).all()


def test_prices_show_observed_at_flag_and_bad_values(tmp_path, capsys):
    path = tmp_path / "aws" / "vms.csv"
    path.parent.mkdir()
    path.write_text(SKYPILOT)
    assert main(["prices", "show", "--catalog", str(path), "--gpu", "V100", "--json", "--observed-at", "2026-01-02T00:00:00"]) == 0
    assert {r["observed_at"] for r in json.loads(capsys.readouterr().out)} == {"2026-01-02T00:00:00+00:00"}
    for bad, msg in (("yesterday", "not an ISO time"), ("2999-01-01", "in the future")):
        assert main(["prices", "show", "--catalog", str(path), "--observed-at", bad]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1


def test_skypilot_catalog_from_a_url_into_the_cache(tmp_path, loopback, capsys):
    modified = "Wed, 25 Nov 2026 06:00:00 GMT"
    server = loopback(lambda method, path, headers: (200, SKYPILOT, {"Last-Modified": modified})
                      if path.endswith("/aws/vms.csv") else (404, "no"))
    cache = tmp_path / "cache" / "prices.csv.gz"
    url = f"{server.url}/catalogs/v7/aws/vms.csv"
    assert main(["prices", "refresh", "--skypilot", url, "--cache", str(cache)]) == 0
    assert "skypilot: 4 new price records" in capsys.readouterr().out
    frame = PriceStore.load(cache).frame
    assert set(frame.cloud) == {"aws"} and (frame.observed_at == pd.Timestamp("2026-11-25T06:00:00Z")).all()
    assert main(["prices", "refresh", "--skypilot", f"{server.url}/missing.csv", "--cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert "HTTP 404" in err and err.count("\n") == 1
    assert len(PriceStore.load(cache)) == 4  # nothing half-written


def test_refresh_needs_a_cloud_or_a_catalog(tmp_path, capsys):
    assert main(["prices", "refresh", "--cache", str(tmp_path / "p.csv.gz")]) == 2
    err = capsys.readouterr().err
    assert "needs --cloud aws|gcp|azure (live APIs) or --skypilot" in err and err.count("\n") == 1
    assert not (tmp_path / "p.csv.gz").exists()
