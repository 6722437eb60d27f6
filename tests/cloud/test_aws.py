"""AWS source: real boto3 clients under botocore's Stubber (exact request parameters), and a real
EC2 client against a loopback endpoint for the one retry layer (botocore's) and resumed paging."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs

import boto3
import pytest
from botocore.stub import Stubber

from cloud.aws import PRICING_FILTERS, AwsPriceSource, parse_price_item
from cloud.errors import CloudError
from cloud.sources import botocore_config
from cloud.store import PriceStore
from tests.cloud import fixtures_aws as fx

CREDS = {"aws_access_key_id": "AKIATESTONLY", "aws_secret_access_key": "testing-secret"}


class Clients:
    """One stubbed client per (service, region), as the source's factory."""

    def __init__(self) -> None:
        self.stubs: dict[tuple[str, str], Stubber] = {}
        self.clients: dict[tuple[str, str], Any] = {}

    def stub(self, service: str, region: str) -> Stubber:
        key = (service, region)
        if key not in self.stubs:
            self.clients[key] = boto3.client(service, region_name=region, **CREDS)  # type: ignore[call-overload]
            self.stubs[key] = Stubber(self.clients[key])
            self.stubs[key].activate()
        return self.stubs[key]

    def __call__(self, service: str, region: str) -> Any:
        self.stub(service, region)
        return self.clients[(service, region)]


@pytest.fixture
def clients() -> Iterator[Clients]:
    made = Clients()
    yield made
    for stub in made.stubs.values():
        stub.assert_no_pending_responses()
        stub.deactivate()


def pricing_filters(region: str, types: tuple[str, ...]) -> list[dict[str, str]]:
    return ([{"Type": "TERM_MATCH", "Field": "regionCode", "Value": region}]
            + [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in PRICING_FILTERS]
            + [{"Type": "ANY_OF", "Field": "instanceType", "Value": ",".join(types)}])


def script_region(clients: Clients, region: str, types: tuple[str, ...] = fx.TYPES) -> None:
    ec2 = clients.stub("ec2", region)
    ec2.add_response("describe_instance_types", fx.instance_types(types),
                     {"Filters": [{"Name": "instance-type", "Values": list(types)}]})
    ec2.add_response("describe_spot_price_history", {"SpotPriceHistory": fx.spot_items(region, types)},
                     {"InstanceTypes": list(types), "ProductDescriptions": ["Linux/UNIX"], "StartTime": fx.NOW})
    pages = fx.pricing_pages(region, types)
    pricing = clients.stub("pricing", "us-east-1")
    pricing.add_response("get_products", pages[0], {"ServiceCode": "AmazonEC2", "Filters": pricing_filters(region, types)})
    pricing.add_response("get_products", pages[1], {"ServiceCode": "AmazonEC2", "Filters": pricing_filters(region, types),
                                                    "NextToken": "pricing-p2"})


def test_regions_from_describe_regions_opt_in_region_skipped_rest_kept(clients):
    clients.stub("ec2", "us-east-1").add_response("describe_regions", fx.REGIONS, {"AllRegions": False})
    clients.stub("ec2", "ap-south-2").add_client_error("describe_instance_types", **fx.auth_failure("ap-south-2"))
    script_region(clients, "eu-west-1")  # regions are visited in sorted order
    script_region(clients, "us-east-1")
    source = AwsPriceSource(client_factory=clients)
    records = list(source.fetch(instance_types=fx.TYPES, end=fx.NOW))
    assert {r.region for r in records} == {"us-east-1", "eu-west-1"}
    assert len(source.skipped) == 1 and "ap-south-2" in source.skipped[0] and "AuthFailure" in source.skipped[0]
    east = [r for r in records if r.region == "us-east-1"]
    # on-demand: one region-wide row per type, the Pricing API's price, parsed from the nested JSON string
    od = {r.instance_type: r for r in east if not r.spot}
    assert set(od) == set(fx.TYPES) and od["p5.48xlarge"].usd_per_hour == 98.32
    assert (od["p5e.48xlarge"].gpu_type, od["p5e.48xlarge"].gpu_count) == ("H200", 8)
    assert (od["g6.xlarge"].gpu_type, od["g6.xlarge"].gpu_count) == ("L4", 1)
    assert all(r.zone == "" and r.source == "aws:pricing.get_products" for r in od.values())
    # spot: the latest price per zone (the 11:00 price of zone a lost to its 12:00 price)
    spot = [r for r in east if r.spot and r.instance_type == "p5.48xlarge"]
    assert sorted(r.zone for r in spot) == ["us-east-1a", "us-east-1b"]
    assert {r.zone: r.usd_per_hour for r in spot}["us-east-1a"] == pytest.approx(98.32 * 0.4)


@pytest.mark.parametrize("code", ["AuthFailure", "OptInRequired"])
def test_every_region_refused_is_an_error(clients, code):
    clients.stub("ec2", "ap-south-2").add_client_error("describe_instance_types", code, "region not enabled", 401)
    with pytest.raises(CloudError, match=rf"aws: fetch failed: every region refused.*{code}") as info:
        list(AwsPriceSource(client_factory=clients).fetch(["ap-south-2"], fx.TYPES, end=fx.NOW))
    assert "\n" not in str(info.value)


def test_expired_credentials_named_never_printed_and_nothing_saved(clients, tmp_path):
    cache = tmp_path / "prices.csv"
    PriceStore.empty().save(cache)
    clients.stub("ec2", "us-east-1").add_client_error(
        "describe_instance_types", "ExpiredToken", "The security token AKIATESTONLY included in the request is expired", 400)
    with pytest.raises(CloudError) as info:
        PriceStore.load(cache).refresh(AwsPriceSource(client_factory=clients), ["us-east-1"], fx.TYPES, now=fx.NOW)
    text = str(info.value)
    assert text.startswith("aws: describe_instance_types (us-east-1) failed: ExpiredToken")
    assert "AKIATESTONLY" not in text and "testing-secret" not in text
    assert len(PriceStore.load(cache)) == 0


@pytest.mark.parametrize("entry,reason", [
    ("{not json", "malformed PriceList entry"),
    (fx.price_item("p5.48xlarge", "us-east-1", "n/a"), "price is not a number: 'n/a'"),
    ('{"product": {"attributes": {}}, "terms": {}}', "malformed PriceList entry"),
])
def test_bad_price_list_entry_is_one_line(entry, reason):
    with pytest.raises(CloudError, match=reason) as info:
        parse_price_item(entry, "us-east-1")
    assert str(info.value).startswith("aws: pricing.get_products (us-east-1) failed")


def test_malformed_page_aborts_the_region_and_keeps_nothing(clients):
    types = ("p5.48xlarge",)
    ec2 = clients.stub("ec2", "us-east-1")
    ec2.add_response("describe_instance_types", fx.instance_types(types))
    ec2.add_response("describe_spot_price_history", {"SpotPriceHistory": fx.spot_items("us-east-1", types)})
    clients.stub("pricing", "us-east-1").add_response("get_products", {"PriceList": ["{truncated"]})
    with pytest.raises(CloudError, match="malformed PriceList entry"):
        list(AwsPriceSource(client_factory=clients).fetch(["us-east-1"], types, end=fx.NOW))


def test_incremental_refresh_asks_for_the_window_since_the_newest_price(clients):
    types = ("p3.8xlarge",)
    start = datetime(2026, 10, 31, tzinfo=timezone.utc)
    ec2 = clients.stub("ec2", "us-east-1")
    ec2.add_response("describe_instance_types", fx.instance_types(types))
    history = fx.spot_items("us-east-1", types)
    ec2.add_response("describe_spot_price_history", {"SpotPriceHistory": history},
                     {"InstanceTypes": list(types), "ProductDescriptions": ["Linux/UNIX"], "StartTime": start,
                      "EndTime": fx.NOW})
    clients.stub("pricing", "us-east-1").add_response("get_products", {"PriceList": []})
    records = list(AwsPriceSource(client_factory=clients).fetch(["us-east-1"], types, start, fx.NOW))
    assert len(records) == len(history)  # the whole window is kept for replay, not only the latest


def test_botocore_retries_a_throttled_page_and_pagination_resumes(loopback, monkeypatch):
    """One retry layer: botocore's standard mode; page 2 is retried, page 1 is asked for once."""
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(key, raising=False)
    asked: list[str] = []

    def route(method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        form = parse_qs(headers.get(":body", ""))
        token = form.get("NextToken", [""])[0]
        asked.append(token or "first")
        if not token:
            return 200, fx.spot_xml([("us-east-1a", "p3.8xlarge", "3.90", "2026-11-01T11:00:00.000Z")], "page2")
        if asked.count("page2") == 1:
            return 503, fx.ec2_error_xml("RequestLimitExceeded", "Request limit exceeded.")
        return 200, fx.spot_xml([("us-east-1b", "p3.8xlarge", "3.70", "2026-11-01T11:30:00.000Z")])

    server = loopback(route)
    client = boto3.client("ec2", region_name="us-east-1", endpoint_url=server.url,  # type: ignore[call-overload]
                          config=botocore_config(retries={"mode": "standard", "max_attempts": 3}), **CREDS)
    source = AwsPriceSource(client_factory=lambda service, region: client)
    items = source.spot("us-east-1", ["p3.8xlarge"], datetime(2026, 11, 1, tzinfo=timezone.utc), fx.NOW)
    assert [i["AvailabilityZone"] for i in items] == ["us-east-1a", "us-east-1b"]
    assert asked == ["first", "page2", "page2"]


def test_no_retry_loop_left_in_the_sources():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "cloud", "sources.py")).read()
    assert "retry_call" not in text and "sleep(" not in text


def test_gpu_models_as_describe_instance_types_really_answers(clients):
    """p4de answers "A100" (it is an A100-80GB), p5e/p5en answer "NVIDIA" (H200): the table wins, memory
    tells unknown types apart, and a type whose model still cannot be told is left out with a note."""
    answered = {"p4de.24xlarge": ("A100", 8, 81920), "p5e.48xlarge": ("NVIDIA", 8, 144384),
                "p5en.48xlarge": ("NVIDIA", 8, 144384), "p4x.24xlarge": ("A100", 8, 81920),
                "p9.48xlarge": ("NVIDIA", 8, 186368), "p3.8xlarge": ("V100", 4, 16384)}
    types = list(answered)
    page = {"InstanceTypes": [{"InstanceType": t, "CurrentGeneration": True,
                               "GpuInfo": {"Gpus": [{"Name": n, "Manufacturer": "NVIDIA", "Count": c, "MemoryInfo": {"SizeInMiB": m}}],
                                           "TotalGpuMemoryInMiB": c * m}} for t, (n, c, m) in answered.items()]}
    clients.stub("ec2", "us-east-1").add_response("describe_instance_types", page,
                                                  {"Filters": [{"Name": "instance-type", "Values": types}]})
    source = AwsPriceSource(client_factory=clients)
    info = source.gpu_info("us-east-1", types)
    assert info == {"p4de.24xlarge": ("A100-80GB", 8), "p5e.48xlarge": ("H200", 8), "p5en.48xlarge": ("H200", 8),
                    "p4x.24xlarge": ("A100-80GB", 8), "p3.8xlarge": ("V100", 4)}
    assert len(source.skipped) == 1 and "p9.48xlarge" in source.skipped[0] and "'NVIDIA'" in source.skipped[0]
