"""Availability logs, the online preemption estimates, and the replay that makes policies pay for
preemptions (a committed excerpt of the thesis's logs: tests/cloud/data/availability_excerpt)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cloud.availability import AvailabilityModel, load_availability, observed_truth, parse_log
from cloud.cli import main
from cloud.errors import CloudInputError
from cloud.records import PriceRecord
from cloud.replay import ReplayPolicy
from cloud.replay_availability import Market, availability_policies, replay_available, replay_models, windows
from cloud.store import PriceStore
from cloud.throughput import ThroughputTable

EXCERPT = Path(__file__).parent / "data" / "availability_excerpt"
GCP_LOG = EXCERPT / "gcp" / "availability" / "persistent_2020-03-01.out"
TPUT = ThroughputTable({("job", "V100", 1): 1.0, ("job", "K80", 1): 0.3, ("job", "P100", 1): 0.5})


def test_excerpt_parses_into_up_preempted_failed():
    events = load_availability(EXCERPT)
    kinds = events.groupby(["cloud", "kind"]).size().to_dict()
    assert kinds[("gcp", "preempted")] > 10 and kinds[("gcp", "up")] > 100 and kinds[("aws", "failed")] > 0
    assert set(events.cloud) == {"aws", "gcp"} and events["at"].is_monotonic_increasing
    # instance names are bound to the (zone, GPU, count) they were created with
    first = events[(events.cloud == "gcp")].iloc[0]
    assert (first.zone, first.gpu_type, first.gpu_count, first.kind) == ("us-west1-b", "V100", 1, "up")
    # AWS failures name no zone: they count for every zone of that GPU type and count
    assert set(events[(events.cloud == "aws") & (events.kind == "failed")].zone) == {""}


def test_a_bad_log_line_names_the_file_and_line(tmp_path):
    bad = tmp_path / "gcp" / "availability" / "x.out"
    bad.parent.mkdir(parents=True)
    lines = GCP_LOG.read_text().splitlines()[:5]
    bad.write_text("\n".join([*lines[:3], "[2020-03-01T10:13:07.000Z] Instance instance3 exploded", *lines[3:]]) + "\n")
    with pytest.raises(CloudInputError, match=r"x\.out:4: not an availability log line") as info:
        parse_log(bad)
    assert "\n" not in str(info.value)
    (tmp_path / "t.json").write_text("{}")
    assert main(["cost-sim", "--trace", str(tmp_path), "--availability", str(tmp_path),
                 "--throughputs", str(tmp_path / "t.json")]) == 2


def test_estimates_are_online_and_carry_uncertainty():
    events = load_availability(EXCERPT)
    clock = pd.Timestamp("2020-03-01T15:00Z")
    model = AvailabilityModel(events, clock)
    # lines after the clock change nothing: a replay never peeks at its own future
    assert AvailabilityModel(events[events["at"] < clock], clock).estimates == model.estimates
    east = model.get(("gcp", "us-east1-c", "K80", 1))
    west = model.get(("gcp", "us-west1-b", "V100", 1))
    assert east is not None and west is not None
    assert east.preemptions > west.preemptions and east.rate_per_h > west.rate_per_h
    later = AvailabilityModel(events, pd.Timestamp("2020-03-01T19:00Z")).get(("gcp", "us-west1-b", "V100", 1))
    assert later is not None and later.exposure_h > west.exposure_h
    assert later.rate_sd_per_h < west.rate_sd_per_h  # more watching, less doubt
    # nothing watched yet: the prior, not "never preempted"
    blind = AvailabilityModel(events, pd.Timestamp("2020-03-01T10:00Z"))
    assert blind.get(("gcp", "us-west1-b", "V100", 1)) is None and blind.prior_preemptions / blind.prior_hours > 0


def test_a_job_s_own_observations_update_the_estimate():
    events = load_availability(EXCERPT)
    clock = pd.Timestamp("2020-03-01T15:00Z")
    model = AvailabilityModel(events, clock)
    key = ("gcp", "us-west1-b", "V100", 1)
    before = model.get(key)
    own = [(clock + pd.Timedelta(minutes=m), "gcp", "us-west1-b", "V100", 1, kind, "job")
           for m, kind in ((1, "up"), (20, "preempted"), (30, "up"), (50, "preempted"))]
    after = model.with_events(own, clock + pd.Timedelta(hours=1)).get(key)
    assert before is not None and after is not None and after.preemptions == before.preemptions + 2


def _prices(events: pd.DataFrame, cloud: str, price: dict[str, float]) -> PriceStore:
    """Spot prices for every watched key, flat over the log's span (the replay's price side)."""
    keys = events[(events.cloud == cloud) & (events.zone != "")].drop_duplicates(["zone", "gpu_type", "gpu_count"])
    start = events["at"].min().floor("h").to_pydatetime()
    recs = [PriceRecord(start + timedelta(hours=h), cloud, str(r.zone)[:-2], str(r.zone), "n1-standard-8", str(r.gpu_type),
                        int(r.gpu_count), True, price[str(r.gpu_type)] * int(r.gpu_count), "test")
            for r in keys.itertuples() for h in (0, 12)]
    return PriceStore.from_records(recs)


def test_no_overlap_between_prices_and_availability_is_one_line():
    events = load_availability(EXCERPT)
    old = PriceStore.from_records([PriceRecord(datetime(2019, 1, 1, tzinfo=timezone.utc), "gcp", "us-west1", "us-west1-b",
                                               "n1-standard-8", "V100", 1, True, 0.8, "test")])
    with pytest.raises(CloudInputError, match="no overlap between prices and availability") as info:
        windows(old, events)
    assert "\n" not in str(info.value)


def test_replay_charges_preemptions_and_the_aware_policy_avoids_them():
    events = load_availability(EXCERPT)
    events = events[events.cloud == "gcp"]
    prices = _prices(events, "gcp", {"V100": 0.85, "K80": 0.10, "P100": 0.50})
    od = PriceStore.from_records([PriceRecord(datetime(2020, 3, 1, tzinfo=timezone.utc), "gcp", "us-central1", "us-central1-a",
                                              "n1-standard-8", "V100", 1, False, 2.86, "test")])
    (window,) = windows(prices, events)
    market = Market.build(window, prices, od, events)
    assert market.meta.spot.sum() >= 5 and (~market.meta.spot).sum() == 1
    ok, hit = observed_truth(events, market.times, market.keys()[:-1])
    assert hit.to_numpy().sum() > 0 and ok.to_numpy().any()
    samples = 3 * 3600 * 1.0  # three hours of one V100
    price_only = replay_available(market, ReplayPolicy("price-only", clouds=("gcp",), initial="cheapest_price"), TPUT, "job", samples)
    assert price_only.placements[0].endswith("/spot") and price_only.preemptions == len(price_only.placements) - 1 - price_only.migrations
    on_demand = replay_available(market, ReplayPolicy("on-demand", clouds=("gcp",), spot=False), TPUT, "job", samples)
    assert on_demand.completed and on_demand.preemptions == 0 and on_demand.hours == pytest.approx(3 + 368 / 3600, abs=0.2)
    rows = replay_models([market], availability_policies(), TPUT, ["job"], {"job": samples})
    by = {r["policy"]: r for r in rows}
    assert {"on-demand", "availability-aware", "cheapest-spot", "ours (migration costs)"} <= set(by)
    assert all(set(r) >= {"model", "policy", "cost_usd", "hours", "preemptions", "migrations", "completed", "window"} for r in rows)
    assert sum(int(r["preemptions"]) for r in rows) > 0  # the price-only policies pay for preemptions
    aware = by["availability-aware"]
    assert aware["completed"] and float(aware["hours"]) <= 1.2 * float(by["on-demand"]["hours"]) + 1e-9
    assert float(aware["cost_usd"]) < float(by["on-demand"]["cost_usd"])


def test_cost_sim_availability_cli_rows(tmp_path, capsys):
    events = load_availability(EXCERPT)
    trace = tmp_path / "prices.csv"
    _prices(events[events.cloud == "gcp"], "gcp", {"V100": 0.85, "K80": 0.10, "P100": 0.50}).save(trace)
    tput = tmp_path / "t.json"
    tput.write_text(json.dumps({"v100": {"job": {"null": 1.0}}, "k80": {"job": {"null": 0.3}}, "p100": {"job": {"null": 0.5}}}))
    assert main(["cost-sim", "--trace", str(trace), "--availability", str(EXCERPT), "--throughputs", str(tput),
                 "--model", "job", "--days", "0.1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["policy"] for r in rows} >= {"on-demand", "availability-aware"}
    for r in rows:
        assert isinstance(r["completed"], bool) and isinstance(r["preemptions"], int) and r["window"].startswith("gcp ")
        assert r["model"] == "job" and r["cost_usd"] >= 0 and r["hours"] >= 0 and r["migrations"] >= 0


def test_a_notice_too_short_for_the_checkpoint_costs_the_work_since_the_last_one():
    """GCP gives 30 s: a checkpoint that takes 800 s to upload cannot be written in it, so each
    preemption rolls back to the last periodic checkpoint (the same run with a fast upload loses nothing)."""
    from cloud.migration import MigrationCosts

    events = load_availability(EXCERPT)
    events = events[events.cloud == "gcp"]
    prices = _prices(events, "gcp", {"V100": 0.85, "K80": 0.10, "P100": 0.50})
    (window,) = windows(prices, events)
    market = Market.build(window, prices, PriceStore.empty(), events)
    policy = ReplayPolicy("price-only", clouds=("gcp",), initial="cheapest_price")
    fast = replay_available(market, policy, TPUT, "job", 4 * 3600 * 0.3)
    slow_costs = MigrationCosts(upload_gbps=0.01, checkpoint_interval_s=3600)
    slow = replay_available(market, ReplayPolicy("price-only", clouds=("gcp",), initial="cheapest_price", costs=slow_costs),
                            TPUT, "job", 4 * 3600 * 0.3)
    assert fast.preemptions > 0 and slow.placements[0] == fast.placements[0]
    assert slow.hours > fast.hours or slow.samples_done < fast.samples_done
