"""GCP price source: Compute Engine catalog (google-cloud-compute) + Cloud Billing Catalog prices.

On GCP a GPU is not an instance type: it is attached to a host VM (N1 for K80/P100/V100/T4) or
bundled into an accelerator-optimized type (A2 for A100). The Billing Catalog prices GPUs, vCPUs
and RAM separately, per region, with ``usageType`` ``OnDemand`` or ``Preemptible`` (spot). We
price each (zone, GPU, count) as the GPUs plus the cheapest host VM in that zone able to carry
them, so GCP offers compare directly with AWS/Azure instances.

The Billing Catalog is read through its REST endpoint (``base_url`` injectable), with the
credentials of ``google.auth.default()`` unless a session is given.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pandas as pd

from .records import PriceRecord, normalize_gpu, utc
from .sources import CloudError, http_status_verdict, retry_call

COMPUTE_SERVICE_ID = "6F81-5844-456A"  # "Compute Engine" in the Cloud Billing Catalog
BILLING_URL = "https://cloudbilling.googleapis.com"
#: Most vCPUs an N1 host may have per attached GPU (GCP GPU docs); used to pick legal hosts.
N1_MAX_VCPUS_PER_GPU: dict[str, int] = {"K80": 8, "P100": 16, "V100": 12, "T4": 24, "P4": 24}
#: GPUs that come bundled in an accelerator-optimized family rather than attached to N1.
BUNDLED_FAMILY: dict[str, str] = {"A100": "a2-highgpu", "A100-80GB": "a2-ultragpu", "L4": "g2-standard", "H100": "a3-highgpu"}


def classify(exc: BaseException) -> str | None:
    from google.api_core import exceptions as gex
    from google.auth import exceptions as aex

    if isinstance(exc, aex.DefaultCredentialsError):
        return "no GCP credentials found by google.auth.default() (gcloud auth application-default login)"
    if isinstance(exc, (gex.TooManyRequests, gex.ServiceUnavailable, gex.InternalServerError, gex.GatewayTimeout)):
        return "transient"
    if isinstance(exc, gex.GoogleAPICallError):
        return http_status_verdict(int(exc.code or 0) or None, str(exc.message))
    import requests

    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return "transient"
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return http_status_verdict(exc.response.status_code, exc.response.text)
    return None


def gpu_from_accelerator(name: str) -> str:
    """``nvidia-tesla-v100`` -> ``V100``; ``nvidia-a100-80gb`` -> ``A100-80GB``."""
    return normalize_gpu(name)


def host_options(gpu: str, count: int, hosts: pd.DataFrame, zone: str, min_vcpus_per_gpu: int = 1) -> pd.DataFrame:
    """Host VMs in ``zone`` that can carry ``count`` x ``gpu`` (columns instance_type, vcpus, price...).

    N1-attached GPUs allow N1 hosts with ``count * min_vcpus_per_gpu <= vCPUs <= limit``; bundled
    GPUs (A100, L4, H100) need the matching family's type whose built-in GPU count equals ``count``.
    """
    in_zone = hosts[hosts.zone == zone] if "zone" in hosts and zone else hosts
    family = BUNDLED_FAMILY.get(gpu)
    if family:
        pattern = f"{family}-{count}g" if family != "g2-standard" else f"g2-standard-{4 * count}"
        return in_zone[in_zone.instance_type == pattern]
    limit = min(96, N1_MAX_VCPUS_PER_GPU.get(gpu, 12) * count)
    n1 = in_zone[in_zone.instance_type.str.startswith("n1-")]
    return n1[(n1.vcpus >= count * min_vcpus_per_gpu) & (n1.vcpus <= limit)]


@dataclass(frozen=True, slots=True)
class _Rates:
    """Per-region unit prices read from the Billing Catalog: (kind, region, spot) -> USD/h."""

    table: Mapping[tuple[str, str, bool], float]

    def get(self, kind: str, region: str, spot: bool) -> float | None:
        return self.table.get((kind, region, spot))


_SKU_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gpu:", re.compile(r"Nvidia (?:Tesla )?([A-Z0-9]+(?: 80GB)?) GPU", re.I)),
    ("n1-core", re.compile(r"N1 Predefined Instance Core", re.I)),
    ("n1-ram", re.compile(r"N1 Predefined Instance Ram", re.I)),
    ("a2-core", re.compile(r"A2 Instance Core", re.I)),
    ("a2-ram", re.compile(r"A2 Instance Ram", re.I)),
)


def parse_skus(skus: Sequence[Mapping[str, Any]]) -> _Rates:
    """Unit prices from raw Billing Catalog SKU objects (their real JSON shape)."""
    table: dict[tuple[str, str, bool], float] = {}
    for sku in skus:
        category = sku.get("category", {})
        usage = category.get("usageType", "")
        if usage not in ("OnDemand", "Preemptible"):
            continue  # commitments
        description = str(sku.get("description", ""))
        kind = None
        for name, pattern in _SKU_PATTERNS:
            match = pattern.search(description)
            if match:
                kind = name + normalize_gpu(match.group(1).replace(" ", "-")) if name == "gpu:" else name
                break
        if kind is None or "Commitment" in description or "Sole Tenancy" in description:
            continue
        infos = sku.get("pricingInfo") or []
        if not infos:
            continue
        rates = infos[-1].get("pricingExpression", {}).get("tieredRates") or []
        if not rates:
            continue
        money = rates[-1].get("unitPrice", {})
        price = float(money.get("units", 0) or 0) + float(money.get("nanos", 0) or 0) / 1e9
        for region in sku.get("serviceRegions", []):
            table[(kind, region, usage == "Preemptible")] = price
    return _Rates(table)


class GcpPriceSource:
    """GPU prices per zone from the Compute and Billing APIs.

    ``compute_options`` go to every google-cloud-compute client (tests pass ``credentials`` and a
    loopback ``client_options``); ``session`` is a ``requests.Session`` for the Billing Catalog.
    """

    name = "gcp"

    def __init__(
        self,
        project: str | None = None,
        compute_options: Mapping[str, Any] | None = None,
        session: Any = None,
        billing_url: str = BILLING_URL,
        sleep: Callable[[float], None] | None = None,
        counts: Sequence[int] = (1, 2, 4, 8),
    ) -> None:
        self._project = project
        self._compute_options = dict(compute_options or {})
        self._session = session
        self.billing_url = billing_url.rstrip("/")
        self._retry_kw: dict[str, Any] = {"sleep": sleep} if sleep else {}
        self.counts = tuple(counts)

    def _call(self, call: str, fn: Callable[[], Any]) -> Any:
        return retry_call(fn, cloud="gcp", call=call, classify=classify, **self._retry_kw)

    def _project_id(self) -> str:
        if self._project:
            return self._project
        import google.auth

        _, project = self._call("google.auth.default", google.auth.default)
        if not project:
            raise CloudError("gcp", "google.auth.default", "no project configured (pass --project or set GOOGLE_CLOUD_PROJECT)")
        self._project = str(project)
        return self._project

    def accelerators(self) -> pd.DataFrame:
        """zone, gpu_type, max_cards for every accelerator type (aggregated over zones)."""
        from google.cloud import compute_v1

        client = compute_v1.AcceleratorTypesClient(transport="rest", **self._compute_options)
        pages = self._call("acceleratorTypes.aggregatedList",
                           lambda: list(client.aggregated_list(project=self._project_id())))
        rows = [
            {"zone": scope.split("/")[-1], "gpu_type": gpu_from_accelerator(acc.name),
             "max_cards": int(acc.maximum_cards_per_instance)}
            for scope, scoped in pages for acc in scoped.accelerator_types
        ]
        return pd.DataFrame(rows, columns=["zone", "gpu_type", "max_cards"])

    def machine_types(self) -> pd.DataFrame:
        """zone, instance_type, vcpus, memory_gb of N1/A2/G2 machine types."""
        from google.cloud import compute_v1

        client = compute_v1.MachineTypesClient(transport="rest", **self._compute_options)
        pages = self._call("machineTypes.aggregatedList",
                           lambda: list(client.aggregated_list(project=self._project_id())))
        rows = [
            {"zone": scope.split("/")[-1], "instance_type": mt.name, "vcpus": int(mt.guest_cpus),
             "memory_gb": mt.memory_mb / 1024}
            for scope, scoped in pages for mt in scoped.machine_types
            if mt.name.startswith(("n1-", "a2-", "g2-", "a3-"))
        ]
        return pd.DataFrame(rows, columns=["zone", "instance_type", "vcpus", "memory_gb"])

    def skus(self) -> list[dict[str, Any]]:
        """All Compute Engine SKUs, following ``nextPageToken``."""
        session = self._session or self._authorized_session()
        url = f"{self.billing_url}/v1/services/{COMPUTE_SERVICE_ID}/skus"
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            params = {"currencyCode": "USD", "pageSize": "5000", **({"pageToken": token} if token else {})}

            def get(params: dict[str, str] = params) -> dict[str, Any]:
                response = session.get(url, params=params, timeout=60)
                response.raise_for_status()
                payload: dict[str, Any] = response.json()
                return payload

            page = self._call("cloudbilling.services.skus.list", get)
            out.extend(page.get("skus", []))
            token = page.get("nextPageToken", "")
            if not token:
                return out

    def _authorized_session(self) -> Any:
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        scopes = ["https://www.googleapis.com/auth/cloud-billing.readonly"]
        credentials, _ = self._call("google.auth.default", lambda: google.auth.default(scopes=scopes))
        return AuthorizedSession(credentials)

    def fetch(
        self,
        regions: Sequence[str] = (),
        instance_types: Sequence[str] = (),
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> Iterator[PriceRecord]:
        """Catalog prices now (the catalog has no history; ``start`` is ignored)."""
        when = utc(end) if end else datetime.now(timezone.utc)
        rates = parse_skus(self.skus())
        hosts = self.machine_types()
        hosts["region"] = hosts.zone.str.rsplit("-", n=1).str[0]
        accels = self.accelerators()
        for acc in accels.to_dict("records"):
            zone, gpu_type, max_cards = str(acc["zone"]), str(acc["gpu_type"]), int(acc["max_cards"])
            region = zone.rsplit("-", 1)[0]
            if regions and region not in regions:
                continue
            for spot in (True, False):
                gpu_rate = rates.get(f"gpu:{gpu_type}", region, spot)
                if gpu_rate is None:
                    continue
                zone_hosts = hosts[hosts.zone == zone].copy()
                zone_hosts["price"] = [
                    _host_price(str(h["instance_type"]), float(h["vcpus"]), float(h["memory_gb"]), region, spot, rates)
                    for h in zone_hosts.to_dict("records")
                ]
                zone_hosts = zone_hosts.dropna(subset=["price"])
                for count in self.counts:
                    if count > max_cards:
                        continue
                    options = host_options(gpu_type, count, zone_hosts, zone)
                    if instance_types:
                        options = options[options.instance_type.isin(instance_types)]
                    if options.empty:
                        continue
                    best = options.iloc[int(options.price.to_numpy().argmin())]
                    yield PriceRecord(
                        timestamp=when, cloud="gcp", region=region, zone=zone,
                        instance_type=str(best.instance_type), gpu_type=gpu_type, gpu_count=count,
                        spot=spot, usd_per_hour=round(float(best.price) + gpu_rate * count, 6),
                        source="gcp:cloudbilling+compute",
                    )


def _host_price(name: str, vcpus: float, memory_gb: float, region: str, spot: bool, rates: _Rates) -> float | None:
    family = "a2" if name.startswith("a2-") else "n1" if name.startswith("n1-") else None
    if family is None:
        return None
    core, ram = rates.get(f"{family}-core", region, spot), rates.get(f"{family}-ram", region, spot)
    if core is None or ram is None:
        return None
    return vcpus * core + memory_gb * ram
