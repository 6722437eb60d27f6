"""Hostile inputs of the cloud layer (issue 29): throughput files, price imports and the price cache.

Every malformed-but-parseable shape gives one ``CloudInputError`` line (the CLI: ``error: ...``,
exit 2) and nothing else; property tests generate the shapes per loader, not only bad bytes.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloud.cli import main
from cloud.errors import CloudInputError
from cloud.importers import load_any
from cloud.records import normalize_gpu
from cloud.store import PriceStore
from cloud.throughput import ThroughputTable

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=12)
PRICES = "timestamp,cloud,region,zone,instance_type,gpu_type,gpu_count,spot,usd_per_hour,source,observed_at\n" \
         "2026-11-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,True,0.9,test,2026-11-01T00:00:00Z\n"


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text
    return text


def cli_fails(capsys: pytest.CaptureFixture[str], argv: list[str], match: str) -> None:
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: ") and out.err.count("\n") == 1 and match in out.err, out.err
    assert out.out == ""


# --- cost-sim throughput files -------------------------------------------------------------------

@pytest.mark.parametrize("content,match", [
    ('{"v100": {"A3C": {"null": "fast"}}}', "is a str, not a number"),
    ('{"v100": {"A3C": {"null": true}}}', "is a bool, not a number"),
    ('{"v100": {"A3C": {"null": [1.0]}}}', "is a list, not a number"),
    ('{"v100": {"A3C": 3.5}}', 'needs an object with a "null" throughput'),
    ('{"v100": ["A3C"]}', "is a list, not an object of jobs"),
    ('[{"v100": {}}]', "top level is a list"),
    ('{"v100": {"A3C": {"null": 1.0}}, "v100": {}}', "duplicate JSON key 'v100'"),
    ('{"v100": {"A3C": {"null": -1.0}}}', "bad value -1.0"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_bad_throughput_json_is_one_line(tmp_path, capsys, content, match):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(CloudInputError, match=match.replace("[", r"\[")) as info:
        ThroughputTable.load(path)
    one_line(info.value)
    cli_fails(capsys, ["cost-sim", "--trace", str(tmp_path), "--throughputs", str(path)], match)


def test_throughput_files_not_utf8_or_not_regular(tmp_path, capsys):
    for name in ("t.json", "t.csv"):
        path = tmp_path / name
        path.write_bytes(b'{"v100": {"\xff\xfe": {"null": 1}}}' if name.endswith("json") else b"model,gpu_type,gpu_count,throughput\n\xff,V100,1,2\n")
        cli_fails(capsys, ["cost-sim", "--trace", str(tmp_path), "--throughputs", str(path)], "UTF-8" if name.endswith("json") else "unreadable")
    cli_fails(capsys, ["cost-sim", "--trace", str(tmp_path), "--throughputs", str(tmp_path)], "not a regular file")


@pytest.mark.parametrize("content,match", [
    ("model,gpu_type,gpu_count,throughput\nA3C,V100,two,1.0\n", "line 2: gpu_count 'two'"),
    ("model,gpu_type\nA3C,V100\n", "missing gpu_count, throughput"),
    ("model,gpu_type,gpu_count,throughput\nA3C,V100,1,nan\n", "bad value"),
])
def test_bad_throughput_csv_is_one_line(tmp_path, content, match):
    path = tmp_path / "t.csv"
    path.write_text(content)
    with pytest.raises(CloudInputError, match=match) as info:
        ThroughputTable.load(path)
    one_line(info.value)


@PROPERTY
@given(payload=JSON)
def test_any_json_shape_is_a_table_or_one_line(tmp_path_factory, payload: Any):
    path = tmp_path_factory.mktemp("oracle") / "t.json"
    path.write_text(json.dumps(payload))
    try:
        table = ThroughputTable.load(path)
    except CloudInputError as exc:
        one_line(exc)
    else:  # accepted: every entry is a real, finite, non-negative number under gpu -> job -> "null"
        assert all(v >= 0 for v in table.table.values())


@PROPERTY
@given(gpu=st.text(max_size=5), job=st.text(max_size=5),
       value=st.one_of(st.floats(allow_nan=True), st.integers(), st.booleans(), st.none(), st.text(max_size=4), st.lists(st.integers(), max_size=2)))
def test_oracle_shaped_json_with_any_value(tmp_path_factory, gpu: str, job: str, value: Any):
    path = tmp_path_factory.mktemp("oracle") / "t.json"
    path.write_text(json.dumps({gpu: {job: {"null": value}}}))
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf") \
        and value >= 0 and normalize_gpu(gpu) != "" and job.strip() != ""  # a name that is only spaces is no name
    try:
        ThroughputTable.load(path)
        assert ok, f"accepted {value!r} for {gpu!r}/{job!r}"
    except CloudInputError as exc:
        one_line(exc)


# --- price imports (prices show --catalog) --------------------------------------------------------

RECORD = {"AvailabilityZone": "us-east-1a", "InstanceType": "p3.2xlarge", "ProductDescription": "Linux/UNIX",
          "SpotPrice": "0.918", "Timestamp": "2020-03-01T00:00:00.000Z"}


@pytest.mark.parametrize("payload,match", [
    ({"SpotPriceHistory": [[RECORD]]}, "SpotPriceHistory[0] is a list, not a record"),
    ({"SpotPriceHistory": [{"InstanceType": "p3.2xlarge"}]}, "SpotPriceHistory[0] lacks AvailabilityZone, SpotPrice, Timestamp"),
    ({"SpotPriceHistory": [{**RECORD, "SpotPrice": {"v": [1]}}]}, "SpotPriceHistory[0].SpotPrice is a dict"),
    ({"SpotPriceHistory": RECORD}, "needs an object with a SpotPriceHistory list"),
    ([{"SpotPriceHistory": [RECORD]}], "needs an object with a SpotPriceHistory list"),
    ({"SpotPriceHistory": [{**RECORD, "SpotPrice": "cheap"}]}, "bad value"),
    ({"SpotPriceHistory": [{**RECORD, "Timestamp": "soon"}]}, "bad value"),
])
def test_malformed_aws_price_json_is_one_line(tmp_path, capsys, payload, match):
    path = tmp_path / "p3.2xlarge.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(CloudInputError, match=match.replace("[", r"\[")) as info:
        load_any(path)
    one_line(info.value)
    cli_fails(capsys, ["prices", "show", "--catalog", str(path)], match)


def test_deeply_nested_and_non_utf8_price_json(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text('{"SpotPriceHistory": ' + "[" * 100_000 + "]" * 100_000 + "}")
    cli_fails(capsys, ["prices", "show", "--catalog", str(deep)], "nested too deeply")
    raw = tmp_path / "raw.json"
    raw.write_bytes(b'{"SpotPriceHistory": [{"InstanceType": "\xff"}]}')
    cli_fails(capsys, ["prices", "show", "--catalog", str(raw)], "not UTF-8")


@pytest.mark.parametrize("content,match", [
    ("InstanceType,AcceleratorName,AcceleratorCount,Price,SpotPrice,Region\np3.2xlarge,V100,one,3.06,0.9,us-east-1\n", "not a usable SkyPilot"),
    ("InstanceType,AcceleratorName,AcceleratorCount,Price,SpotPrice,Region\np3.2xlarge,V100,1,free,0.9,us-east-1\n", "not a usable SkyPilot"),
    ("InstanceType,AcceleratorName,Price\np3.2xlarge,V100,3.06\n", "not a SkyPilot vms.csv (missing AcceleratorCount"),
    (PRICES.replace("True,0.9", "maybe,0.9"), "not a boolean"),
    (PRICES.replace(",1,True", ",[1],True"), "bad value"),
    (PRICES.split("\n")[0].replace(",usd_per_hour", "") + "\n", "not a recognised price file"),
])
def test_malformed_price_csv_is_one_line(tmp_path, capsys, content, match):
    path = tmp_path / "aws" / "vms.csv"
    path.parent.mkdir()
    path.write_text(content)
    cli_fails(capsys, ["prices", "show", "--catalog", str(path)], match)


@PROPERTY
@given(items=st.lists(st.one_of(JSON, st.fixed_dictionaries({}, optional={k: st.one_of(st.just(v), JSON) for k, v in RECORD.items()})),
                      max_size=4))
def test_any_spot_history_shape_is_rows_or_one_line(tmp_path_factory, items: list[Any]):
    path = tmp_path_factory.mktemp("aws") / "p3.2xlarge.json"
    path.write_text(json.dumps({"SpotPriceHistory": items}))
    try:
        frame = load_any(path)
    except CloudInputError as exc:
        one_line(exc)
    else:
        assert len(frame) <= len(items) and (frame.usd_per_hour >= 0).all()


@PROPERTY
@given(cells=st.lists(st.text(alphabet=st.characters(blacklist_characters=",\n\r\"", blacklist_categories=("Cs",)), max_size=6),
                      min_size=11, max_size=11))
def test_any_schema_csv_row_is_rows_or_one_line(tmp_path_factory, cells: list[str]):
    path = tmp_path_factory.mktemp("csv") / "prices.csv"
    path.write_text(PRICES.split("\n")[0] + "\n" + ",".join(cells) + "\n")
    try:
        load_any(path)
    except CloudInputError as exc:
        one_line(exc)


# --- the price cache under the user's cache directory ---------------------------------------------

def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = tmp_path / "xdg" / "raypipe" / "prices.csv.gz"
    path.parent.mkdir(parents=True)
    return path


@pytest.mark.parametrize("damage", ["garbage", "truncated", "bad_zlib", "wrong_columns", "bad_values", "not_utf8"])
def test_corrupt_price_cache_is_one_line(tmp_path, monkeypatch, capsys, damage):
    cache = cache_dir(tmp_path, monkeypatch)
    good = gzip.compress(PRICES.encode())
    data = {"garbage": b"\x00\x01not gzip at all", "truncated": good[: len(good) // 2],
            "bad_zlib": good[:12] + bytes(b ^ 0x55 for b in good[12:-8]) + good[-8:],
            "wrong_columns": gzip.compress(b"a,b\n1,2\n"),
            "bad_values": gzip.compress(PRICES.replace("0.9,test", "-3,test").encode()),
            "not_utf8": gzip.compress(PRICES.replace("test", "t\xe9st").encode("latin-1"))}[damage]
    cache.write_bytes(data)
    cli_fails(capsys, ["prices", "show", "--gpu", "V100"], "price cache")
    assert cache.read_bytes() == data  # never replaced by a command that only reads it


@PROPERTY
@given(data=st.binary(max_size=200), compress=st.booleans())
def test_any_cache_bytes_are_a_store_or_one_line(tmp_path_factory, data: bytes, compress: bool):
    path = tmp_path_factory.mktemp("cache") / "prices.csv.gz"
    path.write_bytes(gzip.compress(data) if compress else data)
    try:
        PriceStore.load(path)
    except CloudInputError as exc:
        assert "price cache" in one_line(exc)


# --- more loaders: throughput CSV, SkyPilot and Azure daily CSVs, availability logs ----------------

CELL = st.text(alphabet=st.characters(blacklist_characters=",\n\r\"", blacklist_categories=("Cs",)), max_size=6)


@PROPERTY
@given(rows=st.lists(st.lists(CELL, min_size=4, max_size=4), min_size=1, max_size=3))
def test_any_throughput_csv_is_a_table_or_one_line(tmp_path_factory, rows: list[list[str]]):
    path = tmp_path_factory.mktemp("tput") / "t.csv"
    path.write_text("model,gpu_type,gpu_count,throughput\n" + "\n".join(",".join(r) for r in rows) + "\n")
    try:
        table = ThroughputTable.load(path)
    except CloudInputError as exc:
        one_line(exc)
    else:
        assert all(v >= 0 and v == v for v in table.table.values()) and all(c > 0 for _, _, c in table.table)


SKY_HEADER = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,AvailabilityZone,SpotPrice"


@PROPERTY
@given(rows=st.lists(st.lists(CELL, min_size=9, max_size=9), min_size=1, max_size=3), cloud=st.sampled_from(["aws", "gcp", "azure"]))
def test_any_skypilot_rows_are_rows_or_one_line(tmp_path_factory, rows: list[list[str]], cloud: str):
    path = tmp_path_factory.mktemp("sky") / cloud / "vms.csv"
    path.parent.mkdir()
    path.write_text(SKY_HEADER + "\n" + "\n".join(",".join(r) for r in rows) + "\n")
    try:
        frame = load_any(path)
    except CloudInputError as exc:
        one_line(exc)
    else:
        assert (frame.usd_per_hour >= 0).all() and set(frame.cloud) <= {cloud}


@PROPERTY
@given(cells=st.lists(CELL, min_size=2, max_size=2))
def test_any_azure_daily_row_is_rows_or_one_line(tmp_path_factory, cells: list[str]):
    path = tmp_path_factory.mktemp("az") / "us_east.csv"
    path.write_text("Date,NC6s v3\n" + ",".join(cells) + "\n")
    try:
        load_any(path)
    except CloudInputError as exc:
        one_line(exc)


LOG_LINE = st.one_of(
    st.text(max_size=40),
    st.builds(lambda t, n, g, z: f"[2020-03-01T10:{t:02d}:00.000Z] Created instance i{n} with {n} GPU(s) of type {g} in zone {z}",
              st.integers(0, 59), st.integers(0, 9), st.sampled_from(["v100", "k80", "nvidia-tesla-p100", "x"]),
              st.sampled_from(["us-east-1b", "us-west1-b", ""])),
    st.builds(lambda t, n, w: f"[2020-03-01T11:{t:02d}:00.000Z] Instance i{n} {w}", st.integers(0, 59), st.integers(0, 9),
              st.sampled_from(["running in zone us-east-1b", "not running in zone us-east-1b", "creation failed", "exploded"])),
)


@PROPERTY
@given(lines=st.lists(LOG_LINE, max_size=8))
def test_any_availability_log_is_events_or_one_line(tmp_path_factory, lines: list[str]):
    from cloud.availability import KINDS, load_availability

    path = tmp_path_factory.mktemp("avail") / "aws" / "availability" / "x.out"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    try:
        events = load_availability(path)
    except CloudInputError as exc:
        assert "x.out" in one_line(exc)
    else:
        assert set(events.kind) <= set(KINDS) and (events.gpu_count >= 0).all()


def test_cost_sim_availability_bad_paths_and_flags(tmp_path, capsys):
    tput = tmp_path / "t.json"
    tput.write_text('{"v100": {"job": {"null": 1.0}}}')
    base = ["cost-sim", "--trace", str(tmp_path), "--throughputs", str(tput), "--model", "job"]
    cli_fails(capsys, [*base, "--availability", str(tmp_path / "missing")], "no such availability log")
    cli_fails(capsys, [*base, "--availability", str(tmp_path)], "no availability logs")
    cli_fails(capsys, [*base, "--availability", str(tmp_path), "--deadline-factor", "nan"], "--deadline-factor")
