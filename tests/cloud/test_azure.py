"""Azure source: the real azure-mgmt-compute client and azure-core pipeline against a loopback server."""

from __future__ import annotations

from typing import Any

import pytest
from azure.core.credentials import AccessToken

from cloud.azure import AzurePriceSource, gpu_model
from cloud.errors import CloudError
from tests.cloud import fixtures_azure as fx

FAST_RETRY = {"retry_total": 3, "retry_backoff_factor": 0.01}


class Token:
    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("test-token", 2**31)


def serve(loopback: Any, second_page: Any = None, fail_second_once: bool = False) -> tuple[Any, list[str]]:
    holder: dict[str, Any] = {}
    asked: list[str] = []

    def route(method: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
        if "/skus" in path:
            assert headers.get("authorization") == "Bearer test-token"
            return 200, fx.RESOURCE_SKUS
        pages = fx.pages(holder["url"])
        second = "skip=100" in path
        asked.append("second" if second else "first")
        if second and fail_second_once and asked.count("second") == 1:
            return 503, {"error": "busy"}
        if second:
            return 200, pages[1] if second_page is None else second_page
        return 200, pages[0]

    server = loopback(route)
    holder["url"] = server.url
    return server, asked


def source(server: Any, subscription: str | None = "sub") -> AzurePriceSource:
    return AzurePriceSource(subscription_id=subscription, credential=Token(), base_url=server.url,
                            retail_url=server.url + "/api/retail/prices", retry=FAST_RETRY)


def test_names_filters_and_models_from_resource_skus(loopback):
    server, asked = serve(loopback, fail_second_once=True)
    src = source(server)
    records = list(src.fetch(["eastus"]))
    got = sorted((r.instance_type, r.gpu_type, r.gpu_count, r.spot, r.usd_per_hour) for r in records)
    assert got == [
        ("Standard_NC24ads_A100_v4", "A100-80GB", 1, False, 3.673),
        ("Standard_NC6s_v3", "V100", 1, False, 3.06),
        ("Standard_NC6s_v3", "V100", 1, True, 0.3052),
        ("Standard_ND96isr_H100_v5", "H100", 8, False, 98.32),
        ("Standard_ND96isr_H100_v5", "H100", 8, True, 39.33),
        ("Standard_NV36ads_A10_v5", "A10", 1, False, 3.2),  # an A10, not AWS's A10G
    ]  # no Windows, Cloud Services, Low Priority, zero-price, restricted, non-GPU or fractional-GPU rows
    assert src.skipped == ["azure: resource_skus.list (eastus): unknown GPU family of Standard_NX12s_v9 not priced",
                           "azure: Standard_NV6ads_A10_v5 (eastus) has 1/6 of an A10, not a whole GPU: left out"]
    # azure-core retried page 2 once; page 1 was never asked for again
    assert asked == ["first", "second", "second"]


def test_without_subscription_static_counts_and_both_spellings(loopback):
    server, _ = serve(loopback)
    records = list(source(server, None).fetch(["eastus"], ["NC24s_v3", "Standard_NC6s_v3"]))
    assert sorted({r.instance_type for r in records}) == ["Standard_NC24s_v3", "Standard_NC6s_v3"]
    assert {r.gpu_count for r in records if r.instance_type == "Standard_NC24s_v3"} == {4}


@pytest.mark.parametrize("size,model", [
    ("Standard_NC6s_v3", "V100"), ("NC24rs_v3", "V100"), ("Standard_NC12s_v2", "P100"), ("NC6", "K80"),
    ("Standard_ND40rs_v2", "V100"), ("Standard_ND96asr_v4", "A100"), ("Standard_ND96amsr_A100_v4", "A100-80GB"),
    ("Standard_NC40ads_H100_v5", "H100"), ("Standard_ND96isr_H200_v5", "H200"), ("Standard_NC64as_T4_v3", "T4"),
    ("Standard_NX12s_v9", None),
])
def test_gpu_model_from_the_size_family(size, model):
    assert gpu_model(size) == model


@pytest.mark.parametrize("page,reason", [
    ({"Items": [fx.meter("Standard_NC6s_v3", "NC6s v3", "n/a", "Virtual Machines NCSv3 Series")], "NextPageLink": None},
     r"price of Standard_NC6s_v3 is not a number: 'n/a'"),
    ("<html>gateway</html>", "malformed page"),
    ({"Count": 0}, "malformed page"),
])
def test_bad_second_page_is_one_line_and_yields_nothing(loopback, page, reason):
    server, _ = serve(loopback, second_page=page)
    got: list[Any] = []
    with pytest.raises(CloudError, match=rf"azure: retail prices GET \(eastus\) failed: {reason}") as info:
        got.extend(source(server).fetch(["eastus"]))
    assert got == [] and "\n" not in str(info.value)


def test_refused_credentials_are_named_not_printed(loopback):
    server = loopback(lambda m, p, h: (401, {"error": {"code": "ExpiredAuthenticationToken",
                                                        "message": "token test-token expired"}}))
    with pytest.raises(CloudError, match=r"azure: resource_skus.list \(eastus\) failed: not authorized") as info:
        source(server).gpu_sizes("eastus")
    assert "test-token" not in str(info.value)
