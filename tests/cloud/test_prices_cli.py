"""The price store's merge rules and what ``prices`` prints about where prices came from."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone

import pandas as pd
import pytest

from cloud import sources
from cloud.cli import main
from cloud.errors import CloudError
from cloud.importers import load_snapshot
from cloud.records import PriceRecord, is_estimate
from cloud.store import PriceStore

NOW = datetime(2026, 11, 22, 12, tzinfo=timezone.utc)


class ListSource:
    """A PriceSource over given records; ``fail_after`` raises mid-iteration like a bad page would."""

    def __init__(self, name: str, records: list[PriceRecord], fail_after: int | None = None) -> None:
        self.name, self.records, self.fail_after = name, records, fail_after
        self.skipped: list[str] = ["aws: describe_instance_types (ap-south-2) failed: AuthFailure: not enabled"]

    def fetch(self, regions: Sequence[str] = (), instance_types: Sequence[str] = (),
              start: datetime | None = None, end: datetime | None = None) -> Iterator[PriceRecord]:
        for i, record in enumerate(self.records):
            if self.fail_after is not None and i == self.fail_after:
                raise CloudError(self.name, "pricing.get_products (us-east-1)", "malformed PriceList entry")
            yield record


def aws_spot(zone: str, price: float, hour: int = 10) -> PriceRecord:
    return PriceRecord(NOW.replace(hour=hour), "aws", "us-east-1", zone, "p3.2xlarge", "V100", 1, True, price,
                       "aws:describe_spot_price_history")


def test_refresh_replaces_only_its_own_cloud_and_stamps_observed_at():
    snapshot = PriceStore(load_snapshot())
    refreshed = snapshot.refresh(ListSource("aws", [aws_spot("us-east-1a", 0.95), aws_spot("us-east-1b", 0.91)]),
                                 now=NOW)
    def others(store: PriceStore) -> pd.DataFrame:
        rows = store.frame[store.frame.cloud != "aws"]
        return rows.sort_values(list(rows.columns)).reset_index(drop=True)

    pd.testing.assert_frame_equal(others(refreshed), others(snapshot))
    new = refreshed.frame[refreshed.frame.source == "aws:describe_spot_price_history"]
    assert len(new) == 2 and (new.observed_at == pd.Timestamp(NOW)).all()
    assert (new.timestamp < new.observed_at).all()  # when the price took effect vs when we read it


def test_a_source_failing_half_way_saves_nothing(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "prices.csv.gz"
    PriceStore.from_records([aws_spot("us-east-1a", 1.0, 1)]).save(cache)
    before = cache.read_bytes()
    bad = ListSource("aws", [aws_spot("us-east-1a", 0.9), aws_spot("us-east-1b", 0.8)], fail_after=1)
    monkeypatch.setattr(sources, "get_source", lambda name, **kw: bad)
    assert main(["prices", "refresh", "--cloud", "aws", "--cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert err == "error: aws: pricing.get_products (us-east-1) failed: malformed PriceList entry\n"
    assert cache.read_bytes() == before


def test_refresh_reports_skipped_regions_and_saves_the_rest(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "prices.csv.gz"
    monkeypatch.setattr(sources, "get_source", lambda name, **kw: ListSource("aws", [aws_spot("us-east-1a", 0.9)]))
    assert main(["prices", "refresh", "--cloud", "aws", "--cache", str(cache)]) == 0
    out = capsys.readouterr()
    assert "warning: skipped aws: describe_instance_types (ap-south-2) failed: AuthFailure" in out.err
    assert len(PriceStore.load(cache)) == 1


@pytest.fixture
def aws_only_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "raypipe" / "prices.csv.gz"
    PriceStore.empty().refresh(ListSource("aws", [aws_spot("us-east-1a", 0.95)]), now=NOW).save(cache)
    return cache


def test_cheapest_with_a_cache_still_compares_every_cloud_and_says_what(aws_only_cache, capsys):
    assert main(["prices", "cheapest", "--gpu", "V100", "--count", "1", "--spot", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["cloud"] for r in rows} == {"aws", "gcp", "azure"}
    aws = [r for r in rows if r["cloud"] == "aws"]
    # the refreshed cloud's rows replaced its snapshot rows; the others are the snapshot's estimates
    assert [(r["zone"], r["source"], r["estimate"]) for r in aws] == [("us-east-1a", "aws:describe_spot_price_history", False)]
    assert aws[0]["observed_at"].startswith("2026-11-22")
    assert all(r["estimate"] and r["source"].startswith("estimate:") and r["observed_at"].startswith("2024-06-01")
               for r in rows if r["cloud"] != "aws")

    assert main(["prices", "cheapest", "--gpu", "V100", "--count", "1", "--spot"]) == 0
    text = capsys.readouterr().out
    assert "estimate" in text.splitlines()[0] and "observed" in text.splitlines()[0]
    footer = text[text.index("compared "):]
    assert "aws: 1 rows, observed 2026-11-22, source aws:describe_spot_price_history" in footer
    assert "gcp: " in footer and "ESTIMATE 2024-06-01" in footer


def test_bundled_snapshot_marks_every_spot_row_as_estimate_and_has_no_k80_on_gcp():
    snap = load_snapshot()
    assert set(snap.cloud) == {"aws", "gcp", "azure"}
    assert snap[snap.spot].source.map(is_estimate).all()
    assert snap[snap.spot].source.str.contains(r"estimate: \d+% of on-demand").all()
    assert not snap[~snap.spot].source.map(is_estimate).any() and snap[~snap.spot].source.str.startswith("https://").all()
    assert (snap.observed_at == pd.Timestamp("2024-06-01", tz="UTC")).all()
    assert snap[(snap.cloud == "gcp") & (snap.gpu_type == "K80")].empty
    assert snap[snap.cloud == "azure"].instance_type.str.startswith("Standard_").all()
    pivot = snap.pivot_table(index=["cloud", "region", "instance_type", "gpu_type", "gpu_count"], columns="spot",
                             values="usd_per_hour")
    assert (pivot[True] < pivot[False]).all()


def test_old_cache_without_observed_at_still_loads(tmp_path):
    path = tmp_path / "old.csv"
    path.write_text("timestamp,cloud,region,zone,instance_type,gpu_type,gpu_count,spot,usd_per_hour,source\n"
                    "2020-03-01T00:00:00Z,azure,eastus,,NC6s_v3,V100,1,True,0.5,old\n")
    frame = PriceStore.load(path).frame
    assert frame.observed_at.iloc[0] == frame.timestamp.iloc[0] and frame.instance_type.iloc[0] == "Standard_NC6s_v3"
