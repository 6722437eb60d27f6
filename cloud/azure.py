"""Azure price source: GPU sizes from azure-mgmt-compute ``resource_skus``, prices from the
public Retail Prices API.

The Retail Prices API needs no credentials; it pages with ``NextPageLink``. Spot meters are named
"<size> Spot" (and older "Low Priority" ones are skipped); Windows products are skipped because a
training job runs Linux and Windows meters carry the licence. ``resource_skus`` (which does need
credentials, from azure-identity's ``DefaultAzureCredential``) says which GPU sizes a region
offers and in which zones; without a subscription we fall back to the static size table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from .records import INSTANCE_GPUS, PriceRecord, normalize_azure_size, utc
from .sources import CloudError, http_status_verdict, retry_call

RETAIL_URL = "https://prices.azure.com/api/retail/prices"
DEFAULT_REGIONS: tuple[str, ...] = ("eastus", "westus2", "southcentralus", "northcentralus", "westeurope")


def classify(exc: BaseException) -> str | None:
    import requests
    from azure.core import exceptions as aze

    if isinstance(exc, aze.ClientAuthenticationError):
        return f"not authorized: check the credentials of DefaultAzureCredential ({str(exc.message)[:120]})"
    if isinstance(exc, aze.HttpResponseError):
        return http_status_verdict(exc.status_code, str(exc.message))
    if isinstance(exc, (aze.ServiceRequestError, aze.ServiceResponseError)):
        return "transient"
    if type(exc).__name__ == "CredentialUnavailableError":
        return "no Azure credentials found by DefaultAzureCredential (az login, env or managed identity)"
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return "transient"
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return http_status_verdict(exc.response.status_code, exc.response.text)
    return None


def is_linux_vm_meter(item: Mapping[str, Any]) -> bool:
    """A pay-as-you-go Linux VM meter (spot or regular), not Windows, Low Priority or reserved."""
    return (
        item.get("type") == "Consumption"
        and item.get("serviceName") == "Virtual Machines"
        and not str(item.get("productName", "")).endswith("Windows")
        and "Low Priority" not in str(item.get("meterName", ""))
        and str(item.get("unitOfMeasure", "")) == "1 Hour"
    )


class AzurePriceSource:
    """Retail prices of GPU VM sizes, filtered by ``resource_skus`` when a subscription is known."""

    name = "azure"

    def __init__(
        self,
        subscription_id: str | None = None,
        credential: Any = None,
        base_url: str | None = None,
        retail_url: str = RETAIL_URL,
        session: Any = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.subscription_id = subscription_id
        self._credential = credential
        self._base_url = base_url
        self.retail_url = retail_url
        self._session = session
        self._retry_kw: dict[str, Any] = {"sleep": sleep} if sleep else {}

    def _call(self, call: str, fn: Callable[[], Any]) -> Any:
        return retry_call(fn, cloud="azure", call=call, classify=classify, **self._retry_kw)

    def gpu_sizes(self, region: str) -> dict[str, tuple[int, list[str]]]:
        """size (``NC6s_v3``) -> (GPU count, zones) for GPU VM sizes offered in ``region``."""
        from azure.mgmt.compute import ComputeManagementClient

        if not self.subscription_id:
            raise CloudError("azure", "resource_skus.list", "no subscription id (pass --subscription or set AZURE_SUBSCRIPTION_ID)")
        credential = self._credential
        if credential is None:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        kwargs: dict[str, Any] = {"base_url": self._base_url} if self._base_url else {}
        client = ComputeManagementClient(credential, self.subscription_id, **kwargs)
        list_kw: dict[str, Any] = {"filter": f"location eq '{region}'"}
        if self._base_url and self._base_url.startswith(("http://127.0.0.1", "http://localhost")):
            list_kw["enforce_https"] = False  # loopback test server only
        skus = self._call("resource_skus.list", lambda: list(client.resource_skus.list(**list_kw)))
        sizes: dict[str, tuple[int, list[str]]] = {}
        for sku in skus:
            if sku.resource_type != "virtualMachines":
                continue
            caps = {c.name: c.value for c in (sku.capabilities or [])}
            gpus = int(float(caps.get("GPUs", 0) or 0))
            restricted = any(r.type == "Location" for r in (sku.restrictions or []))
            if gpus <= 0 or restricted:
                continue
            zones = [z for info in (sku.location_info or []) if info.location.lower() == region for z in (info.zones or [])]
            sizes[normalize_azure_size(str(sku.name))] = (gpus, sorted(zones))
        return sizes

    def retail_items(self, region: str) -> list[dict[str, Any]]:
        """All VM retail meters of one region, following ``NextPageLink``."""
        import requests

        session = self._session or requests.Session()
        query = f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and priceType eq 'Consumption'"
        url: str | None = self.retail_url
        params: dict[str, str] | None = {"$filter": query, "currencyCode": "USD"}
        items: list[dict[str, Any]] = []
        while url:
            def get(url: str = url, params: dict[str, str] | None = params) -> dict[str, Any]:
                response = session.get(url, params=params, timeout=60)
                response.raise_for_status()
                payload: dict[str, Any] = response.json()
                return payload

            page = self._call("retail prices GET", get)
            items.extend(page.get("Items", []))
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
            for item in self.retail_items(region):
                if not is_linux_vm_meter(item):
                    continue
                size = normalize_azure_size(str(item.get("armSkuName", "")))
                if wanted and size not in wanted:
                    continue
                gpu = INSTANCE_GPUS["azure"].get(size)
                if gpu is None or (sizes is not None and size not in sizes):
                    continue
                count = sizes[size][0] if sizes is not None else gpu[1]
                yield PriceRecord(
                    timestamp=when, cloud="azure", region=region, zone="", instance_type=size,
                    gpu_type=gpu[0], gpu_count=count, spot=str(item.get("meterName", "")).endswith(" Spot"),
                    usd_per_hour=float(item["retailPrice"]), source="azure:retail-prices",
                )
