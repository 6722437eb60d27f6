import json
from datetime import datetime, timezone

import pandas as pd
import pytest

from cloud.importers import load_any, load_snapshot
from cloud.records import PriceRecord, canonical_cloud, instance_gpus, normalize_gpu
from cloud.store import PriceStore
from cloud.errors import CloudError


def rec(hour: int, price: float, zone: str = "us-east-1a", itype: str = "p3.2xlarge") -> PriceRecord:
    return PriceRecord(datetime(2020, 3, 1, hour, tzinfo=timezone.utc), "aws", "us-east-1", zone, itype, "V100", 1, True, price, "t")


def test_names_normalise_and_suggest():
    assert {normalize_gpu(x) for x in ("nvidia-tesla-v100", "Tesla V100", "v100", "NVIDIA V100")} == {"V100"}
    assert canonical_cloud("Google") == "gcp"
    with pytest.raises(CloudError, match="did you mean 'azure'"):
        canonical_cloud("azuer")
    with pytest.raises(CloudError, match="did you mean 'p3.8xlarge'"):
        instance_gpus("aws", "p3.8xlarg")
    with pytest.raises(CloudError):
        rec(0, -1.0)


def test_merge_dedups_and_latest_picks_last_price_per_offer():
    store = PriceStore.from_records([rec(1, 1.0), rec(3, 0.8), rec(2, 0.9, "us-east-1b")])
    merged = store.merge(PriceStore.from_records([rec(3, 0.8), rec(5, 1.2)]))
    assert len(merged) == 4
    at4 = merged.latest(pd.Timestamp("2020-03-01T04:00Z"))
    assert dict(zip(at4.zone, at4.usd_per_hour)) == {"us-east-1a": 0.8, "us-east-1b": 0.9}
    assert list(at4.usd_per_hour) == sorted(at4.usd_per_hour)
    assert dict(zip(merged.latest().zone, merged.latest().usd_per_hour))["us-east-1a"] == 1.2


def test_grid_forward_fills_and_is_unavailable_before_first_price():
    grid = PriceStore.from_records([rec(1, 1.0), rec(3, 0.5), rec(2, 0.9, "us-east-1b")]).grid("1h")
    a = grid.xs("us-east-1a", axis=1, level="zone").iloc[:, 0].tolist()
    b = grid.xs("us-east-1b", axis=1, level="zone").iloc[:, 0].tolist()
    assert a == [1.0, 1.0, 0.5] and pd.isna(b[0]) and b[1:] == [0.9, 0.9]


def test_cache_roundtrip_is_atomic(tmp_path):
    path = tmp_path / "c" / "prices.csv.gz"
    store = PriceStore.from_records([rec(1, 1.0), rec(2, 2.0, "us-east-1b")])
    store.save(path)
    back = PriceStore.load(path)
    pd.testing.assert_frame_equal(back.frame, store.frame)
    assert [p.name for p in path.parent.iterdir()] == ["prices.csv.gz"]


def test_trace_formats_detected(tmp_path):
    (tmp_path / "us-east-1").mkdir()
    (tmp_path / "us-east-1" / "p3.8xlarge.json").write_text(json.dumps({"NextToken": "", "SpotPriceHistory": [
        {"AvailabilityZone": "us-east-1b", "InstanceType": "p3.8xlarge", "ProductDescription": "Linux/UNIX",
         "SpotPrice": "3.67", "Timestamp": "2020-02-20T22:06:16.000Z"}]}))
    (tmp_path / "us_east.csv").write_text("Date,NC6,NC24s v3\n2/24/2020,$0.12276,\n2/25/2020,$0.13,$2.41\n")
    (tmp_path / "notes.txt").write_text("not prices")
    frame = load_any(tmp_path)
    aws = frame[frame.cloud == "aws"].iloc[0]
    assert (aws.region, aws.gpu_type, aws.gpu_count, aws.usd_per_hour) == ("us-east-1", "V100", 4, 3.67)
    azure = frame[frame.cloud == "azure"]
    assert len(azure) == 3 and set(azure.region) == {"eastus"}
    assert azure[azure.instance_type == "Standard_NC24s_v3"].gpu_count.tolist() == [4]


def test_skypilot_gcp_gpu_priced_with_a_host_sized_like_aws(tmp_path):
    gcp = tmp_path / "gcp"
    gcp.mkdir()
    (gcp / "vms.csv").write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone\n"
        "n1-standard-1,,,1,3.75,,0.0475,0.01,us-central1,us-central1-a\n"
        "n1-standard-8,,,8,30,,0.38,0.08,us-central1,us-central1-a\n"
        "n1-standard-32,,,32,120,,1.52,0.32,us-central1,us-central1-a\n"
        ",V100,1,,,,2.48,0.74,us-central1,us-central1-a\n"
        ",V100,4,,,,9.92,2.96,us-central1,us-central1-a\n"
        "a2-highgpu-1g,A100,1,12,85,,3.67,1.1,us-central1,us-central1-a\n")
    frame = load_any(gcp / "vms.csv")
    od = frame[~frame.spot].set_index(["gpu_type", "gpu_count"])
    # 8 vCPUs per V100 as on AWS p3 (not the 1-vCPU legal minimum that made GCP look cheaper than AWS)
    assert od.loc[("V100", 1)].instance_type == "n1-standard-8"
    assert od.loc[("V100", 1)].usd_per_hour == pytest.approx(2.48 + 0.38)
    assert od.loc[("V100", 4)].instance_type == "n1-standard-32"  # 4 GPUs: 32..48 vCPUs
    assert od.loc[("A100", 1)].usd_per_hour == pytest.approx(3.67)
    assert frame[frame.spot].set_index(["gpu_type", "gpu_count"]).loc[("V100", 4)].usd_per_hour == pytest.approx(2.96 + 0.32)


def test_skypilot_azure_without_zone_column(tmp_path):
    path = tmp_path / "azure" / "vms.csv"
    path.parent.mkdir()
    path.write_text("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region\n"
                    "Standard_NC6s_v3,V100,1,6,112,,3.06,0.31,eastus\nStandard_D2s_v3,,,2,8,,0.096,0.01,eastus\n")
    frame = load_any(path)
    assert set(frame.instance_type) == {"Standard_NC6s_v3"} and set(frame.zone) == {""} and set(frame.cloud) == {"azure"}


@pytest.mark.parametrize("content,match", [
    ('{"SpotPriceHistory": [{"InstanceType": "p3.2xlarge"', "not a describe-spot-price-history JSON"),
    ("Date,NC6\n2/24/2020,$abc\n", "bad value"),
    ("Date,NC7x\n2/24/2020,$0.1\n", "unknown Azure VM size 'Standard_NC7x'"),
])
def test_bad_price_files_give_one_line(tmp_path, content, match):
    path = tmp_path / ("x.json" if content.startswith("{") else "x.csv")
    path.write_text(content)
    with pytest.raises(CloudError, match=match) as info:
        load_any(path)
    assert "\n" not in str(info.value)


def test_shared_traces_import(traces):
    frame = load_any(traces / "logs")
    aws = frame[frame.cloud == "aws"].drop_duplicates(subset=["timestamp", "zone", "instance_type", "usd_per_hour"])
    assert len(aws) == 16560  # README: 16,560 unique AWS records after de-duplicating overlaps
    assert set(frame[frame.cloud == "azure"].region) == {"eastus", "northcentralus", "southcentralus"}


def test_timestamps_of_different_resolutions_fill_one_another():
    # Why: pandas parses "2026-01-01" to microseconds and a nanosecond string to nanoseconds; filling one column
    # from the other across resolutions warns now and raises in pandas' next major version.
    import warnings

    from cloud.store import SCHEMA, normalize

    row = {c: "" for c in SCHEMA} | {"timestamp": "2026-01-01 00:00:00.123456789", "cloud": "aws", "region": "us-east-1",
                                       "instance_type": "p3.2xlarge", "gpu_type": "V100", "gpu_count": "1", "spot": "true",
                                       "usd_per_hour": "0.9", "source": "test"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = normalize(pd.DataFrame([row, row | {"observed_at": "2026-01-02"}]))
    assert out["observed_at"].iloc[0] == out["timestamp"].iloc[0] == pd.Timestamp("2026-01-01 00:00:00.123456789", tz="UTC")
    assert out["observed_at"].iloc[1] == pd.Timestamp("2026-01-02", tz="UTC")
