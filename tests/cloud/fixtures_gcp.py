"""GCP responses shaped like the real REST JSON of Compute Engine and the Cloud Billing Catalog.

What the real answers contain: A3 (H100, H100 Mega, H200) and G2 (L4) machine types, accelerator
types past end of support (K80) and virtual-workstation variants, an accelerator we do not know,
a zone with ``NO_RESULTS_ON_PAGE``, catalog descriptions such as "Nvidia H100 80GB GPU attached
to Spot Preemptible VMs running in Americas" and "H200 141GB GPU running in Americas", commitment
and sole-tenancy SKUs, and a catalog split over pages.
"""

from __future__ import annotations

import zlib
from typing import Any

ZONE, ZONE_H200 = "us-central1-a", "us-east4-c"


def _acc(name: str, zone: str, cards: int, deprecated: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "compute#acceleratorType", "name": name, "zone": zone, "maximumCardsPerInstance": cards,
                           "description": name}
    if deprecated:
        out["deprecated"] = {"state": deprecated}
    return out


ACCELERATORS = {"kind": "compute#acceleratorTypeAggregatedList", "items": {
    f"zones/{ZONE}": {"acceleratorTypes": [
        _acc("nvidia-tesla-v100", ZONE, 8), _acc("nvidia-tesla-t4", ZONE, 4), _acc("nvidia-tesla-t4-vws", ZONE, 4),
        _acc("nvidia-tesla-k80", ZONE, 8, "DEPRECATED"), _acc("nvidia-l4", ZONE, 8), _acc("nvidia-h100-80gb", ZONE, 8),
        _acc("nvidia-h100-mega-80gb", ZONE, 8), _acc("nvidia-b300", ZONE, 8)]},
    f"zones/{ZONE_H200}": {"acceleratorTypes": [_acc("nvidia-h200-141gb", ZONE_H200, 8)]},
    "zones/europe-west4-b": {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope"}},
}}


def _mt(name: str, zone: str, vcpus: int, memory_gb: float) -> dict[str, Any]:
    return {"kind": "compute#machineType", "name": name, "zone": zone, "guestCpus": vcpus, "memoryMb": int(memory_gb * 1024)}


MACHINES = {"kind": "compute#machineTypeAggregatedList", "items": {
    f"zones/{ZONE}": {"machineTypes": [
        _mt("n1-standard-1", ZONE, 1, 3.75), _mt("n1-standard-8", ZONE, 8, 30), _mt("n1-standard-32", ZONE, 32, 120),
        _mt("g2-standard-4", ZONE, 4, 16), _mt("g2-standard-8", ZONE, 8, 32), _mt("g2-standard-24", ZONE, 24, 96),
        _mt("g2-standard-48", ZONE, 48, 192), _mt("g2-standard-96", ZONE, 96, 384),
        _mt("a3-highgpu-8g", ZONE, 208, 1872), _mt("a3-megagpu-8g", ZONE, 208, 1872), _mt("e2-small", ZONE, 2, 2),
        # Spot / Flex-start only: GCP takes no on-demand request for these shapes
        _mt("a3-highgpu-1g", ZONE, 26, 234), _mt("a3-highgpu-2g", ZONE, 52, 468)]},
    f"zones/{ZONE_H200}": {"machineTypes": [_mt("a3-ultragpu-8g", ZONE_H200, 224, 2952), _mt("n1-standard-8", ZONE_H200, 8, 30)]},
}}


def sku(description: str, usage: str, usd: float, regions: tuple[str, ...] = ("us-central1", "us-east4"),
        unit: str = "h") -> dict[str, Any]:
    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    return {"name": f"services/6F81-5844-456A/skus/{zlib.crc32(description.encode()):08X}", "skuId": "0000-0000-0000",
            "description": description,
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute", "resourceGroup": "GPU",
                         "usageType": usage},
            "serviceRegions": list(regions),
            "pricingInfo": [{"effectiveTime": "2026-10-01T00:00:00Z", "pricingExpression": {
                "usageUnit": unit, "displayQuantity": 1, "baseUnit": "s", "baseUnitConversionFactor": 3600,
                "tieredRates": [{"startUsageAmount": 0, "unitPrice": {"currencyCode": "USD", "units": str(units),
                                                                       "nanos": nanos}}]}}]}


GPU_SKUS = [
    sku("Nvidia Tesla V100 GPU running in Americas", "OnDemand", 2.48),
    sku("Nvidia Tesla V100 GPU attached to Spot Preemptible VMs running in Americas", "Preemptible", 0.74),
    sku("Nvidia Tesla T4 GPU running in Americas", "OnDemand", 0.35),
    sku("Nvidia Tesla T4 Virtual Workstation GPU running in Americas", "OnDemand", 0.55),
    sku("Nvidia Tesla K80 GPU running in Americas", "OnDemand", 0.45),
    sku("Nvidia L4 GPU running in Americas", "OnDemand", 0.5600),
    sku("Nvidia L4 GPU attached to Spot Preemptible VMs running in Americas", "Preemptible", 0.2240),
    sku("Nvidia H100 80GB GPU running in Americas", "OnDemand", 9.7960),
    sku("Nvidia H100 80GB GPU attached to Spot Preemptible VMs running in Americas", "Preemptible", 2.2500),
    sku("Nvidia H100 80GB Mega GPU running in Americas", "OnDemand", 10.2100),
    # a GPU variant this code does not know: reported in ``skipped``, never silently dropped
    sku("Nvidia H100 80GB Plus GPU running in Americas", "OnDemand", 11.0600),
    sku("H200 141GB GPU running in Americas", "OnDemand", 10.8500),
    sku("Commitment v1: Nvidia H100 80GB GPU in Americas for 1 Year", "Commit1Yr", 6.17),
    sku("DWS Defined Duration Nvidia H100 80GB GPU running in Americas", "OnDemand", 5.10),
]
HOST_SKUS = [
    sku("N1 Predefined Instance Core running in Americas", "OnDemand", 0.031611),
    sku("N1 Predefined Instance Ram running in Americas", "OnDemand", 0.004237, unit="GiBy.h"),
    sku("Spot Preemptible N1 Predefined Instance Core running in Americas", "Preemptible", 0.006655),
    sku("Spot Preemptible N1 Predefined Instance Ram running in Americas", "Preemptible", 0.000892, unit="GiBy.h"),
    sku("G2 Instance Core running in Americas", "OnDemand", 0.024988),
    sku("G2 Instance Ram running in Americas", "OnDemand", 0.002927, unit="GiBy.h"),
    sku("Spot Preemptible G2 Instance Core running in Americas", "Preemptible", 0.009995),
    sku("Spot Preemptible G2 Instance Ram running in Americas", "Preemptible", 0.001171, unit="GiBy.h"),
    sku("A3 Instance Core running in Americas", "OnDemand", 0.029316),
    sku("A3 Instance Ram running in Americas", "OnDemand", 0.002567, unit="GiBy.h"),
    sku("Spot Preemptible A3 Instance Core running in Americas", "Preemptible", 0.011726),
    sku("Spot Preemptible A3 Instance Ram running in Americas", "Preemptible", 0.001027, unit="GiBy.h"),
    sku("A3 Ultra Instance Core running in Americas", "OnDemand", 0.031000),
    sku("A3 Ultra Instance Ram running in Americas", "OnDemand", 0.002700, unit="GiBy.h"),
    sku("Sole Tenancy Instance Core running in Americas", "OnDemand", 0.0347),
]
SKU_PAGES = [
    {"skus": GPU_SKUS[:7], "nextPageToken": "p2"},
    {"skus": GPU_SKUS[7:], "nextPageToken": "p3"},
    {"skus": HOST_SKUS, "nextPageToken": ""},
]
