"""GCP source: the real google-cloud-compute and google-cloud-billing clients against a loopback server."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from google.auth.credentials import AnonymousCredentials

from cloud.errors import CloudError
from cloud.gcp import GcpPriceSource, sku_kind
from cloud.records import PriceRecord
from tests.cloud import fixtures_gcp as fx


def route_with(pages: list[Any], asked: list[str], fail_once: str | None = None) -> Any:
    failed: set[str] = set()

    def route(method: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
        if "acceleratorTypes" in path:
            return 200, fx.ACCELERATORS
        if "machineTypes" in path:
            return 200, fx.MACHINES
        if "/skus" in path:
            token = parse_qs(urlparse(path).query).get("pageToken", [""])[0]
            asked.append(token or "first")
            if token == fail_once and token not in failed:
                failed.add(token)
                return 503, {"error": {"code": 503, "message": "backend unavailable", "status": "UNAVAILABLE"}}
            return 200, pages[{"": 0, "p2": 1, "p3": 2}[token]]
        return 404, {"error": {"code": 404, "message": "not found"}}
    return route


def source_for(url: str) -> GcpPriceSource:
    return GcpPriceSource(project="proj", credentials=AnonymousCredentials(), client_options={"api_endpoint": url},
                          retry_deadline_s=20)


def by_key(records: list[PriceRecord]) -> dict[tuple[str, str, int, bool], PriceRecord]:
    """The cheapest record per (zone, GPU, count, spot)."""
    out: dict[tuple[str, str, int, bool], PriceRecord] = {}
    for r in sorted(records, key=lambda r: -r.usd_per_hour):
        out[(r.zone, r.gpu_type, r.gpu_count, r.spot)] = r
    return out


def test_host_family_per_accelerator_and_catalog_names(loopback):
    asked: list[str] = []
    server = loopback(route_with(fx.SKU_PAGES, asked))
    source = source_for(server.url)
    records = list(source.fetch())
    got = by_key(records)
    zone = fx.ZONE
    # H100 on A3 (never on N1): 208 vCPUs and 1872 GiB of A3 core/RAM plus 8 GPUs
    h100 = got[(zone, "H100", 8, False)]
    assert h100.instance_type == "a3-highgpu-8g"
    assert h100.usd_per_hour == pytest.approx(208 * 0.029316 + 1872 * 0.002567 + 8 * 9.796)
    assert got[(zone, "H100", 8, True)].usd_per_hour == pytest.approx(208 * 0.011726 + 1872 * 0.001027 + 8 * 2.25)
    assert not any(r.instance_type.startswith("n1-") for k, r in got.items() if k[1] in ("H100", "H200", "L4"))
    # L4 on G2: one L4 on the cheapest 1-L4 type, two only on g2-standard-24
    assert got[(zone, "L4", 1, False)].instance_type == "g2-standard-4"
    assert got[(zone, "L4", 2, False)].instance_type == "g2-standard-24"
    assert got[(zone, "L4", 1, True)].usd_per_hour == pytest.approx(4 * 0.009995 + 16 * 0.001171 + 0.224)
    # H200 on A3 Ultra, priced from "H200 141GB GPU running in Americas"
    h200 = got[(fx.ZONE_H200, "H200", 8, False)]
    assert h200.instance_type == "a3-ultragpu-8g"
    assert h200.usd_per_hour == pytest.approx(224 * 0.031 + 2952 * 0.0027 + 8 * 10.85)
    # V100 on N1, on the host a user would take (8 vCPUs per V100, like AWS p3), never the 1-vCPU legal minimum;
    # 2 V100s need 16..24 vCPUs: no such host in this zone, so no offer
    assert got[(zone, "V100", 1, False)].instance_type == "n1-standard-8"
    assert (zone, "V100", 2, False) not in got
    # a3-highgpu-1g/2g are Spot (or Flex-start) only: no on-demand offer
    assert got[(zone, "H100", 1, True)].instance_type == "a3-highgpu-1g" and (zone, "H100", 1, False) not in got
    assert got[(zone, "H100", 2, True)].instance_type == "a3-highgpu-2g" and (zone, "H100", 2, False) not in got
    # deprecated K80, the virtual-workstation T4 and an unknown accelerator are never offered
    assert {k[1] for k in got} == {"H100", "H200", "L4", "V100", "T4"}
    assert source.skipped == [
        "gcp: cloudbilling.services.skus.list: GPU SKU 'Nvidia H100 80GB Plus GPU running in Americas' not understood: not priced",
        "gcp: acceleratorTypes.aggregatedList: unknown accelerator 'nvidia-b300' not priced"]
    # T4 has no spot SKU in this catalog: on-demand only; a Mega H100 only on a3-megagpu
    assert not any(k[1] == "T4" and k[3] for k in got)
    mega = [r for r in records if r.instance_type == "a3-megagpu-8g" and not r.spot]
    assert len(mega) == 1 and mega[0].usd_per_hour == pytest.approx(208 * 0.029316 + 1872 * 0.002567 + 8 * 10.21)
    assert asked == ["first", "p2", "p3"]


@pytest.mark.parametrize("description,kind", [
    ("Nvidia H100 80GB GPU attached to Spot Preemptible VMs running in Americas", "gpu:H100-80GB"),
    ("H200 141GB GPU running in Americas", "gpu:H200-141GB"),
    ("Nvidia Tesla A100 GPU running in Belgium", "gpu:A100"),
    ("Nvidia A100 80GB GPU running in Americas", "gpu:A100-80GB"),
    ("Nvidia H100 80GB Mega GPU running in Americas", "gpu:H100-80GB-MEGA"),
    ("Nvidia H100 Mega 80GB GPU running in Americas", "gpu:H100-80GB-MEGA"),
    ("Nvidia H100 80GB Plus GPU running in Americas", None),
    ("Spot Preemptible G2 Instance Ram running in Americas", "g2-ram"),
    ("N1 Predefined Instance Core running in Americas", "n1-core"),
    ("Commitment v1: Nvidia H100 80GB GPU in Americas for 1 Year", None),
    ("DWS Defined Duration Nvidia H100 80GB GPU running in Americas", None),
    ("Nvidia Tesla T4 Virtual Workstation GPU running in Americas", None),
])
def test_catalog_descriptions(description, kind):
    assert sku_kind(description) == kind


def test_a_failing_page_is_retried_by_google_api_core_and_paging_resumes(loopback):
    asked: list[str] = []
    server = loopback(route_with(fx.SKU_PAGES, asked, fail_once="p2"))
    skus = source_for(server.url).skus()
    assert len(skus) == sum(len(p["skus"]) for p in fx.SKU_PAGES)
    assert asked == ["first", "p2", "p2", "p3"]


@pytest.mark.parametrize("page,reason", [
    ("{ this is not json", "malformed page"),
    ({"skus": [{**fx.GPU_SKUS[0], "pricingInfo": [{"pricingExpression": {"tieredRates": [
        {"unitPrice": {"units": "two", "nanos": 0}}]}}]}]}, "malformed page"),
])
def test_malformed_page_or_price_is_one_line(loopback, page, reason):
    server = loopback(route_with([page, page, page], []))
    with pytest.raises(CloudError, match=f"gcp: cloudbilling.services.skus.list failed: {reason}") as info:
        list(source_for(server.url).fetch())
    assert "\n" not in str(info.value)


def test_http_403_names_call_and_credentials(loopback):
    server = loopback(lambda m, p, h: (403, {"error": {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"}}))
    with pytest.raises(CloudError, match=r"gcp: cloudbilling.services.skus.list failed: not authorized \(HTTP 403\)"):
        source_for(server.url).skus()


def test_credentials_are_named_never_printed():
    from google.auth import exceptions as aex

    from cloud.gcp import classify

    missing = classify(aex.DefaultCredentialsError("File /home/u/key.json was not found"))
    expired = classify(aex.RefreshError("invalid_grant: token ya29.SECRET-TOKEN expired"))
    assert missing is not None and "GOOGLE_APPLICATION_CREDENTIALS" in missing and "key.json" not in missing
    assert expired is not None and "could not be refreshed" in expired and "ya29" not in expired
