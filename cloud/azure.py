"""Azure price source: GPU sizes from azure-mgmt-compute ``resource_skus``, prices from the public
Retail Prices API.

Names stay exactly as the API spells them (``Standard_NC6s_v3``). The GPU *count* comes from
``resource_skus``' ``GPUs`` capability and the GPU *model* from the size family (an explicit
``_A100_``/``_H100_``/``_T4_`` token in the name, else the family's generation: NCv3 = V100...),
so a new GPU size needs no code change as long as its family is known; a size with GPUs whose
family we cannot read is reported in ``skipped``, never guessed. Without a subscription the
static table of :mod:`cloud.records` supplies the counts.

Retail meters dropped: Windows (" Win" in ``productName``, which covers "... Series Windows" and
"NCCadsv5 Srs Win"), Cloud Services, Low Priority, zero prices and anything not billed per hour.

Both calls page (``NextPageLink`` / the SDK's ItemPaged) and retry each page with azure-core's
RetryPolicy (:data:`cloud.sources.AZURE_RETRY`); nothing here retries on top.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from .errors import CloudError
from .records import INSTANCE_GPUS, PriceRecord, normalize_azure_size, utc
from .sources import AZURE_RETRY, call, http_status_verdict, short

log = logging.getLogger(__name__)
RETAIL_URL = "https://prices.azure.com/api/retail/prices"
DEFAULT_REGIONS: tuple[str, ...] = ("eastus", "eastus2", "westus2", "westus3", "southcentralus", "northcentralus",
                                    "westeurope", "swedencentral")
#: GPU model named in the size (``Standard_NC24ads_A100_v4``); 80 GB parts where Azure sells only those.
_NAME_TOKEN = re.compile(r"_(A100|H100|H200|T4|A10|L4|L40S|MI300X|MI200|V620|V710)_", re.I)
_A100_80GB = re.compile(r"^Standard_(NC\d+ads_A100_v4|ND\d+amsr_A100_v4)$", re.I)
#: Families without a model token: (pattern on the size, GPU model).
_FAMILIES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^Standard_NC\d+r?s_v3$", re.I), "V100"),
    (re.compile(r"^Standard_NC\d+r?s_v2$", re.I), "P100"),
    (re.compile(r"^Standard_NC\d+r?$", re.I), "K80"),
    (re.compile(r"^Standard_ND\d+r?s_v2$", re.I), "V100"),
    (re.compile(r"^Standard_ND\d+asr_v4$", re.I), "A100"),
    (re.compile(r"^Standard_ND\d+r?s$", re.I), "P40"),
)


#: Sizes that carry a slice of one GPU (NVadsA10_v5: 1/6, 1/3, 1/2 of an A10). Priced as a whole GPU they
#: would look 2-6x cheaper per GPU than they are; a pipeline stage needs whole devices, so they are left out.
_PARTIAL = re.compile(r"^Standard_NV(6|12|18)ads_A10_v5$", re.I)
_PARTIAL_SHARE = {"6": "1/6", "12": "1/3", "18": "1/2"}


def partial_gpu(size: str) -> str | None:
    """``"1/6"`` for a size that has a fraction of one GPU, else None."""
    m = _PARTIAL.match(normalize_azure_size(size))
    return _PARTIAL_SHARE[m.group(1)] if m else None


def gpu_model(size: str) -> str | None:
    """GPU model of an Azure size from its family, or None when the family is not known."""
    name = normalize_azure_size(size)
    if _A100_80GB.match(name):
        return "A100-80GB"
    token = _NAME_TOKEN.search(name)
    if token:
        return token.group(1).upper()
    for pattern, model in _FAMILIES:
        if pattern.match(name):
            return model
    return None


def is_linux_vm_meter(item: Mapping[str, Any]) -> bool:
    """A pay-as-you-go Linux VM meter (spot or regular): not Windows, Cloud Services, Low Priority."""
    product = str(item.get("productName", ""))
    return (
        item.get("type") == "Consumption"
        and item.get("serviceName") == "Virtual Machines"
        and " Win" not in product
        and "Cloud Services" not in product
        and "Low Priority" not in str(item.get("meterName", ""))
        and str(item.get("unitOfMeasure", "")) == "1 Hour"
    )


def classify(exc: BaseException) -> str | None:
    """One-line reason for an azure-core / azure-identity failure (credentials named, never printed)."""
    from azure.core import exceptions as aze

    if type(exc).__name__ == "CredentialUnavailableError":
        return ("no Azure credentials found by DefaultAzureCredential "
                "(AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET, az login or a managed identity)")
    if isinstance(exc, aze.ClientAuthenticationError):
        return "not authorized: the credentials of DefaultAzureCredential were refused or have expired"
    if isinstance(exc, aze.DecodeError):
        return f"malformed page ({short(exc)})"
    if isinstance(exc, aze.HttpResponseError):
        return http_status_verdict(exc.status_code, str(exc.message))
    if isinstance(exc, aze.AzureError):
        return f"no answer after azure-core's retries: {short(exc)}"
    if isinstance(exc, ValueError):  # response.json() on a body that is not JSON
        return f"malformed page ({short(exc)})"
    return None


class AzurePriceSource:
    """Retail prices of GPU VM sizes, with counts from ``resource_skus`` when a subscription is known."""

    name = "azure"

    def __init__(
        self,
        subscription_id: str | None = None,
        credential: Any = None,
        base_url: str | None = None,
        retail_url: str = RETAIL_URL,
        retry: Mapping[str, Any] | None = None,
    ) -> None:
        self.subscription_id = subscription_id
        self._credential = credential
        self._base_url = base_url
        self.retail_url = retail_url
        self._retry = dict(AZURE_RETRY if retry is None else retry)
        self.skipped: list[str] = []

    def gpu_sizes(self, region: str) -> dict[str, tuple[str, int, list[str]]]:
        """size (``Standard_NC6s_v3``) -> (GPU model, count, zones) for GPU sizes open in ``region``."""
        from azure.mgmt.compute import ComputeManagementClient

        if not self.subscription_id:
            raise CloudError("azure", "resource_skus.list", "no subscription id (pass --subscription or set AZURE_SUBSCRIPTION_ID)")
        credential = self._credential
        if credential is None:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        kwargs: dict[str, Any] = {**self._retry, **({"base_url": self._base_url} if self._base_url else {})}
        client = ComputeManagementClient(credential, self.subscription_id, **kwargs)
        list_kw: dict[str, Any] = {"filter": f"location eq '{region}'"}
        if self._base_url and self._base_url.startswith(("http://127.0.0.1", "http://localhost")):
            list_kw["enforce_https"] = False  # loopback test server only
        skus = call(lambda: list(client.resource_skus.list(**list_kw)), cloud="azure",
                    call=f"resource_skus.list ({region})", classify=classify)
        sizes: dict[str, tuple[str, int, list[str]]] = {}
        for sku in skus:
            if sku.resource_type != "virtualMachines":
                continue
            caps = {c.name: c.value for c in (sku.capabilities or [])}
            try:
                gpus = int(float(caps.get("GPUs", 0) or 0))
            except ValueError:
                raise CloudError("azure", f"resource_skus.list ({region})",
                                 f"GPUs capability of {sku.name} is not a number: {caps.get('GPUs')!r}") from None
            restricted = any(r.type == "Location" for r in (sku.restrictions or []))
            if gpus <= 0 or restricted:
                continue
            name = normalize_azure_size(str(sku.name))
            model = gpu_model(name)
            share = partial_gpu(name)
            if share is not None:
                self.skipped.append(f"azure: {name} ({region}) has {share} of an {model}, not a whole GPU: left out")
                continue
            if model is None:
                self.skipped.append(f"azure: resource_skus.list ({region}): unknown GPU family of {name} not priced")
                continue
            zones = [z for info in (sku.location_info or []) if (info.location or "").lower() == region for z in (info.zones or [])]
            sizes[name] = (model, gpus, sorted(zones))
        return sizes

    def retail_items(self, region: str) -> list[dict[str, Any]]:
        """All VM retail meters of one region, following ``NextPageLink`` (each page retried by azure-core)."""
        from azure.core import PipelineClient
        from azure.core.pipeline.policies import RetryPolicy
        from azure.core.rest import HttpRequest

        client: PipelineClient[Any, Any] = PipelineClient(self.retail_url, policies=[RetryPolicy(**self._retry)])
        query = f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and priceType eq 'Consumption'"
        url: str | None = self.retail_url
        params: dict[str, str] | None = {"$filter": query, "currencyCode": "USD"}
        items: list[dict[str, Any]] = []
        while url:
            def get(url: str = url, params: dict[str, str] | None = params) -> dict[str, Any]:
                response = client.send_request(HttpRequest("GET", url, params=params))
                response.raise_for_status()
                payload = response.json()
                if not isinstance(payload, dict) or not isinstance(payload.get("Items"), list):
                    raise ValueError("no Items list in the answer")
                return payload

            page = call(get, cloud="azure", call=f"retail prices GET ({region})", classify=classify)
            items.extend(page["Items"])
            url, params = page.get("NextPageLink"), None
        return items

    def fetch(
        self,
        regions: Sequence[str] = (),
        instance_types: Sequence[str] = (),
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> Iterator[PriceRecord]:
        """Current retail prices (the API has no history; ``start`` is ignored)."""
        when = utc(end) if end else datetime.now(timezone.utc)
        wanted = {normalize_azure_size(t) for t in instance_types}
        for region in regions or DEFAULT_REGIONS:
            sizes = self.gpu_sizes(region) if self.subscription_id else None
            records: list[PriceRecord] = []
            for item in self.retail_items(region):
                if not is_linux_vm_meter(item):
                    continue
                size = normalize_azure_size(str(item.get("armSkuName", "")))
                if not size or (wanted and size not in wanted):
                    continue
                if sizes is not None:
                    if size not in sizes:
                        continue
                    gpu, count = sizes[size][0], sizes[size][1]
                else:
                    known = INSTANCE_GPUS["azure"].get(size)
                    if known is None:
                        continue
                    gpu, count = known
                price = _price(region, size, item.get("retailPrice"))
                if price <= 0:
                    continue
                records.append(PriceRecord(
                    timestamp=when, cloud="azure", region=region, zone="", instance_type=size, gpu_type=gpu,
                    gpu_count=count, spot=str(item.get("meterName", "")).endswith(" Spot"), usd_per_hour=price,
                    source="azure:retail-prices"))
            yield from records


def _price(region: str, size: str, value: object) -> float:
    try:
        price = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        price = math.nan
    if not math.isfinite(price) or price < 0:
        raise CloudError("azure", f"retail prices GET ({region})", f"price of {size} is not a number: {str(value)[:40]!r}")
    return price
