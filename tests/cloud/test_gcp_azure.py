"""GCP and Azure sources through their real SDK clients against a loopback server."""

from urllib.parse import parse_qs, urlparse

import pytest
import requests
from azure.core.credentials import AccessToken
from google.auth.credentials import AnonymousCredentials

from cloud.azure import AzurePriceSource
from cloud.gcp import GcpPriceSource
from cloud.sources import CloudError

ACCELS = {"kind": "compute#acceleratorTypeAggregatedList", "items": {
    "zones/us-central1-a": {"acceleratorTypes": [
        {"name": "nvidia-tesla-v100", "zone": "us-central1-a", "maximumCardsPerInstance": 8},
        {"name": "nvidia-tesla-t4", "zone": "us-central1-a", "maximumCardsPerInstance": 4}]},
    "zones/europe-west4-b": {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "none"}},
}}
MACHINES = {"kind": "compute#machineTypeAggregatedList", "items": {"zones/us-central1-a": {"machineTypes": [
    {"name": "n1-standard-1", "guestCpus": 1, "memoryMb": 3840, "zone": "us-central1-a"},
    {"name": "n1-standard-8", "guestCpus": 8, "memoryMb": 30720, "zone": "us-central1-a"},
    {"name": "e2-small", "guestCpus": 2, "memoryMb": 2048, "zone": "us-central1-a"},
]}}}


def sku(description: str, usage: str, group: str, units: str, nanos: int) -> dict:
    return {"name": f"services/6F81-5844-456A/skus/{description[:8]}", "skuId": "X", "description": description,
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute", "resourceGroup": group,
                         "usageType": usage},
            "serviceRegions": ["us-central1"],
            "pricingInfo": [{"effectiveTime": "2024-06-01T00:00:00Z", "pricingExpression": {
                "usageUnit": "h", "tieredRates": [{"startUsageAmount": 0, "unitPrice": {
                    "currencyCode": "USD", "units": units, "nanos": nanos}}]}}]}


SKU_PAGES = [
    {"skus": [sku("Nvidia Tesla V100 GPU running in Americas", "OnDemand", "GPU", "2", 480000000),
              sku("Nvidia Tesla V100 GPU attached to Spot Preemptible VMs running in Americas", "Preemptible", "GPU", "0", 740000000),
              sku("Commitment v1: Nvidia Tesla V100 GPU running in Americas for 1 Year", "Commit1Yr", "GPU", "1", 0)],
     "nextPageToken": "p2"},
    {"skus": [sku("N1 Predefined Instance Core running in Americas", "OnDemand", "N1Standard", "0", 31611000),
              sku("N1 Predefined Instance Ram running in Americas", "OnDemand", "N1Standard", "0", 4237000),
              sku("Spot Preemptible N1 Predefined Instance Core running in Americas", "Preemptible", "N1Standard", "0", 6655000),
              sku("Spot Preemptible N1 Predefined Instance Ram running in Americas", "Preemptible", "N1Standard", "0", 892000)],
     "nextPageToken": ""},
]


def gcp_route(method, path, headers):
    if "acceleratorTypes" in path:
        return 200, ACCELS
    if "machineTypes" in path:
        return 200, MACHINES
    if "/skus" in path:
        token = parse_qs(urlparse(path).query).get("pageToken", [""])[0]
        return 200, SKU_PAGES[1 if token == "p2" else 0]
    return 404, {"error": {"code": 404, "message": "not found"}}


def test_gcp_prices_gpu_with_cheapest_legal_host(loopback):
    server = loopback(gcp_route)
    source = GcpPriceSource(project="proj", session=requests.Session(), billing_url=server.url, compute_options={
        "credentials": AnonymousCredentials(), "client_options": {"api_endpoint": server.url}})
    records = list(source.fetch())
    by_key = {(r.gpu_type, r.gpu_count, r.spot): r for r in records}
    # T4 has no SKU in the catalog -> not priced; V100 counts limited by maximumCardsPerInstance (8)
    assert {k[0] for k in by_key} == {"V100"} and {k[1] for k in by_key} == {1, 2, 4, 8}
    host1 = 1 * 0.031611 + 3.75 * 0.004237  # n1-standard-1 on demand
    one = by_key[("V100", 1, False)]
    assert one.instance_type == "n1-standard-1" and one.usd_per_hour == pytest.approx(host1 + 2.48)
    spot = by_key[("V100", 1, True)]
    assert spot.usd_per_hour == pytest.approx(0.006655 + 3.75 * 0.000892 + 0.74)
    # 2 GPUs need at least 2 vCPUs: n1-standard-1 is not allowed, n1-standard-8 is
    assert by_key[("V100", 2, False)].instance_type == "n1-standard-8"
    assert any("pageToken=p2" in p for _, p, _ in server.requests)


def test_gcp_http_error_names_call(loopback):
    server = loopback(lambda m, p, h: (403, {"error": {"code": 403, "message": "denied"}}))
    source = GcpPriceSource(project="proj", session=requests.Session(), billing_url=server.url, sleep=lambda s: None)
    with pytest.raises(CloudError, match=r"gcp: cloudbilling.services.skus.list failed: not authorized \(HTTP 403\)"):
        source.skus()


class Token:
    def get_token(self, *scopes, **kwargs):
        return AccessToken("test-token", 2**31)


RESOURCE_SKUS = {"value": [
    {"resourceType": "virtualMachines", "name": "Standard_NC6s_v3", "tier": "Standard", "size": "NC6s_v3",
     "locations": ["eastus"], "locationInfo": [{"location": "eastus", "zones": ["2", "1"]}],
     "capabilities": [{"name": "GPUs", "value": "1"}, {"name": "vCPUs", "value": "6"}], "restrictions": []},
    {"resourceType": "virtualMachines", "name": "Standard_NC24s_v3", "locations": ["eastus"],
     "locationInfo": [{"location": "eastus", "zones": []}], "capabilities": [{"name": "GPUs", "value": "4"}],
     "restrictions": [{"type": "Location", "values": ["eastus"], "reasonCode": "NotAvailableForSubscription"}]},
    {"resourceType": "virtualMachines", "name": "Standard_D2s_v3", "locations": ["eastus"],
     "capabilities": [{"name": "vCPUs", "value": "2"}], "restrictions": []},
]}


def meter(size: str, meter: str, price: float, product: str = "Virtual Machines NCSv3 Series") -> dict:
    return {"currencyCode": "USD", "retailPrice": price, "unitPrice": price, "armRegionName": "eastus",
            "location": "US East", "meterName": meter, "productName": product, "skuName": meter,
            "serviceName": "Virtual Machines", "serviceFamily": "Compute", "unitOfMeasure": "1 Hour",
            "type": "Consumption", "armSkuName": size, "isPrimaryMeterRegion": True}


def azure_route(server_url):
    def route(method, path, headers):
        if "/skus" in path:
            assert headers.get("authorization") == "Bearer test-token"
            return 200, RESOURCE_SKUS
        if "page=2" in path:
            return 200, {"Items": [meter("Standard_NC6s_v3", "NC6s v3 Spot", 0.61),
                                   meter("Standard_NC24s_v3", "NC24s v3", 12.24)], "NextPageLink": None}
        return 200, {"BillingCurrency": "USD", "Items": [
            meter("Standard_NC6s_v3", "NC6s v3", 3.06),
            meter("Standard_NC6s_v3", "NC6s v3 Low Priority", 0.5),
            meter("Standard_NC6s_v3", "NC6s v3", 4.0, "Virtual Machines NCSv3 Series Windows"),
        ], "NextPageLink": f"{server_url()}/api/retail/prices?page=2"}
    return route


def test_azure_retail_prices_follow_next_page_and_filter_by_resource_skus(loopback):
    holder = {}
    server = loopback(azure_route(lambda: holder["url"]))
    holder["url"] = server.url
    source = AzurePriceSource(subscription_id="sub", credential=Token(), base_url=server.url,
                              retail_url=server.url + "/api/retail/prices")
    records = list(source.fetch(["eastus"]))
    # Windows and Low Priority meters dropped; NC24s_v3 restricted in this subscription
    assert sorted((r.instance_type, r.spot, r.usd_per_hour) for r in records) == [
        ("NC6s_v3", False, 3.06), ("NC6s_v3", True, 0.61)]
    assert source.gpu_sizes("eastus") == {"NC6s_v3": (1, ["1", "2"])}
    first = [p for m, p, h in server.requests if "retail" in p][0]
    assert "serviceName+eq+%27Virtual+Machines%27" in first or "serviceName%20eq" in first


def test_azure_without_subscription_uses_static_table(loopback):
    holder = {}
    server = loopback(azure_route(lambda: holder["url"]))
    holder["url"] = server.url
    records = list(AzurePriceSource(retail_url=server.url + "/api/retail/prices").fetch(["eastus"]))
    assert ("NC24s_v3", False) in {(r.instance_type, r.spot) for r in records}
    assert {r.gpu_count for r in records if r.instance_type == "NC24s_v3"} == {4}
