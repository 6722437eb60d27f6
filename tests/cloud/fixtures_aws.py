"""AWS responses shaped like the real ones (botocore's parsed form), shared by tests and benchmarks/cost_policies.py.

What real answers contain and earlier fixtures did not: H100 (p5), H200 (p5e), L4 (g6) types, an
opt-in region that answers ``AuthFailure``, Pricing API ``PriceList`` entries as nested JSON
*strings* (several per page, paged), and the price of one type in several zones.
"""

from __future__ import annotations

import json
import zlib
from datetime import datetime, timezone
from typing import Any

NOW = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)
REGIONS = {"Regions": [
    {"RegionName": "us-east-1", "Endpoint": "ec2.us-east-1.amazonaws.com", "OptInStatus": "opt-in-not-required"},
    {"RegionName": "eu-west-1", "Endpoint": "ec2.eu-west-1.amazonaws.com", "OptInStatus": "opt-in-not-required"},
    {"RegionName": "ap-south-2", "Endpoint": "ec2.ap-south-2.amazonaws.com", "OptInStatus": "opted-in"},
]}
# instance type -> (GPU name as describe_instance_types spells it, count, MiB per GPU)
GPU_TYPES: dict[str, tuple[str, int, int]] = {
    "p5.48xlarge": ("H100", 8, 81920), "p5e.48xlarge": ("H200", 8, 144384), "g6.xlarge": ("L4", 1, 22888),
    "g6.12xlarge": ("L4", 4, 22888), "p3.8xlarge": ("V100", 4, 16384),
}
TYPES = tuple(GPU_TYPES)
ON_DEMAND = {"p5.48xlarge": "98.3200000000", "p5e.48xlarge": "108.0000000000", "g6.xlarge": "0.8048000000",
             "g6.12xlarge": "4.6016000000", "p3.8xlarge": "12.2400000000"}


def instance_types(types: tuple[str, ...] = TYPES) -> dict[str, Any]:
    return {"InstanceTypes": [{
        "InstanceType": t, "CurrentGeneration": True,
        "GpuInfo": {"Gpus": [{"Name": GPU_TYPES[t][0], "Manufacturer": "NVIDIA", "Count": GPU_TYPES[t][1],
                              "MemoryInfo": {"SizeInMiB": GPU_TYPES[t][2]}}],
                    "TotalGpuMemoryInMiB": GPU_TYPES[t][1] * GPU_TYPES[t][2]},
    } for t in types]}


def price_item(itype: str, region: str, usd: str, capacity: str = "Used") -> str:
    """One ``PriceList`` entry: a JSON string, as get_products returns it."""
    sku = f"SKU{zlib.crc32(f'{itype}{region}{capacity}'.encode()):010d}"
    return json.dumps({
        "product": {"productFamily": "Compute Instance", "sku": sku, "attributes": {
            "instanceType": itype, "regionCode": region, "operatingSystem": "Linux", "tenancy": "Shared",
            "preInstalledSw": "NA", "capacitystatus": capacity, "licenseModel": "No License required",
            "gpu": str(GPU_TYPES.get(itype, ("", 0, 0))[1]), "instanceFamily": "GPU instance"}},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "offerTermCode": "JRTCKXETXF", "sku": sku, "effectiveDate": "2026-10-01T00:00:00Z", "termAttributes": {},
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs", "beginRange": "0", "endRange": "Inf", "appliesTo": [],
                "description": f"${usd} per On Demand Linux {itype} Instance Hour",
                "pricePerUnit": {"USD": usd}}}}}},
        "version": "20261001000000", "publicationDate": "2026-10-01T00:00:00Z",
    })


def pricing_pages(region: str, types: tuple[str, ...] = TYPES) -> list[dict[str, Any]]:
    """The region's on-demand rows on two pages (the paginator must follow NextToken)."""
    items = [price_item(t, region, ON_DEMAND[t]) for t in types]
    half = max(1, len(items) // 2)
    return [{"FormatVersion": "aws_v1", "PriceList": items[:half], "NextToken": "pricing-p2"},
            {"FormatVersion": "aws_v1", "PriceList": items[half:]}]


def spot_items(region: str, types: tuple[str, ...] = TYPES) -> list[dict[str, Any]]:
    """Two zones per type; zone ``a`` also carries an older price that must lose to the newer one."""
    out = []
    for i, t in enumerate(types):
        base = float(ON_DEMAND[t]) * 0.4
        for zone, hour, factor in (("a", 11, 1.1), ("a", 12, 1.0), ("b", 12, 0.9)):
            out.append({"AvailabilityZone": f"{region}{zone}", "InstanceType": t, "ProductDescription": "Linux/UNIX",
                        "SpotPrice": f"{base * factor + i * 1e-4:.6f}",
                        "Timestamp": NOW.replace(hour=hour)})
    return out


def auth_failure(region: str) -> dict[str, Any]:
    """What EC2 answers in an opt-in region the account has not enabled."""
    return {"service_error_code": "AuthFailure", "service_message": "AWS was not able to validate the provided access credentials",
            "http_status_code": 401}


def spot_xml(items: list[tuple[str, str, str, str]], next_token: str = "") -> str:
    """EC2 query-protocol XML of describe_spot_price_history (for the loopback endpoint)."""
    rows = "".join(
        f"<item><instanceType>{t}</instanceType><productDescription>Linux/UNIX</productDescription>"
        f"<spotPrice>{p}</spotPrice><timestamp>{ts}</timestamp><availabilityZone>{z}</availabilityZone></item>"
        for z, t, p, ts in items)
    token = f"<nextToken>{next_token}</nextToken>" if next_token else ""
    return (f'<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            f"<requestId>r1</requestId><spotPriceHistorySet>{rows}</spotPriceHistorySet>{token}"
            f"</DescribeSpotPriceHistoryResponse>")


def ec2_error_xml(code: str, message: str) -> str:
    return (f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
            f"<RequestID>r2</RequestID></Response>")
