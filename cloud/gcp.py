"""GCP price source: Compute Engine (google-cloud-compute) + Cloud Billing Catalog (google-cloud-billing).

On GCP a GPU is attached to a host VM or built into an accelerator-optimized type, and the
Billing Catalog prices GPUs, vCPUs and RAM separately per region (``usageType`` ``OnDemand`` or
``Preemptible`` = spot). Each (zone, GPU, count) offer is priced as the GPUs plus the cheapest
legal host in that zone, each host family with its own core and RAM SKUs:

- N1 carries T4, V100, P100 and P4 (vCPUs per GPU bounded, see :data:`N1_MAX_VCPUS_PER_GPU`);
- A2 has A100 built in (a2-highgpu / a2-megagpu; a2-ultragpu for A100 80GB);
- A3 has H100 (a3-highgpu, a3-megagpu, a3-edgegpu) and H200 (a3-ultragpu);
- G2 has L4 (g2-standard-8 carries one L4; 24/48/96 vCPUs carry 2/4/8).

Accelerators past end of support (K80) and names we cannot map are skipped; unknown names are
listed in ``skipped`` so a new GPU shows up as a one-line note rather than a wrong price.

Both clients page themselves and retry each page with google-api-core's Retry
(:func:`cloud.sources.google_retry`), so a failing page is retried and paging resumes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pandas as pd

from .errors import CloudError
from .records import INSTANCE_GPUS, PriceRecord, utc
from .sources import call, google_retry, short

COMPUTE_SERVICE_ID = "6F81-5844-456A"  # "Compute Engine" in the Cloud Billing Catalog
#: Most vCPUs an N1 host may have per attached GPU (GCP GPU docs); used to pick legal hosts.
N1_MAX_VCPUS_PER_GPU: dict[str, int] = {"P100": 16, "V100": 12, "T4": 24, "P4": 24}
#: vCPUs per attached GPU of the N1 host a user would pick: as many as the matching AWS instance
#: gives each GPU (p3.2xlarge: 8 per V100; g4dn.xlarge: 4 per T4). The cheapest *legal* host (1 vCPU
#: per V100) makes GCP look cheaper than AWS for a machine nobody trains on. Standard shapes only
#: (3.75 GB per vCPU), as the AWS instances carry. Configurable per source.
N1_VCPUS_PER_GPU: dict[str, int] = {"P100": 8, "V100": 8, "T4": 4, "P4": 4}
N1_MIN_GB_PER_VCPU = 3.75
#: Machine types GCP offers only as Spot or Flex-start, never on demand.
SPOT_ONLY: frozenset[str] = frozenset({"a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g"})
#: acceleratorType name -> (GPU model, catalog SKU key). Only these are priced.
ACCELERATORS: dict[str, tuple[str, str]] = {
    "nvidia-tesla-t4": ("T4", "T4"), "nvidia-tesla-v100": ("V100", "V100"), "nvidia-tesla-p100": ("P100", "P100"),
    "nvidia-tesla-p4": ("P4", "P4"), "nvidia-tesla-a100": ("A100", "A100"), "nvidia-a100-80gb": ("A100-80GB", "A100-80GB"),
    "nvidia-l4": ("L4", "L4"), "nvidia-h100-80gb": ("H100", "H100-80GB"), "nvidia-h100-mega-80gb": ("H100", "H100-80GB-MEGA"),
    "nvidia-h200-141gb": ("H200", "H200-141GB"),
}
#: End of support: never offered even when a zone still lists them.
DEPRECATED: frozenset[str] = frozenset({"nvidia-tesla-k80"})
#: Virtual-workstation variants carry a licence; the job does not want them.
_VWS = re.compile(r"-vws$")
_GPU_SKU = re.compile(
    r"^(?:Spot Preemptible )?(?:Nvidia )?(?:Tesla )?(?P<model>[A-Z]\d+[A-Z]?)(?P<mega0> Mega)?(?: (?P<mem>\d+GB))?(?P<mega> Mega)? GPU "
    r"(?:attached to Spot Preemptible VMs )?running in ", re.I)
_HOST_SKU = re.compile(
    r"^(?:Spot Preemptible )?(?P<family>N1 Predefined|A2|A3 ?Ultra|A3 ?Mega|A3 ?Edge|A3|G2) Instance (?P<kind>Core|Ram) "
    r"running in ", re.I)


def host_family(instance_type: str) -> str:
    """Catalog family of a machine type: ``n1``, ``a2``, ``a3``, ``a3ultra``, ``a3mega``, ``a3edge``, ``g2``."""
    prefix = instance_type.split("-")[0]
    if prefix == "a3":
        sub = instance_type.split("-")[1] if "-" in instance_type else ""
        return {"ultragpu": "a3ultra", "megagpu": "a3mega", "edgegpu": "a3edge"}.get(sub, "a3")
    return prefix


def host_options(gpu: str, count: int, hosts: pd.DataFrame, zone: str, min_vcpus_per_gpu: int | None = None) -> pd.DataFrame:
    """Host VMs in ``zone`` that can carry ``count`` x ``gpu`` (``hosts`` has instance_type, vcpus...).

    Built-in GPUs (A100, H100, H200, L4) need a machine type whose built-in GPUs are exactly
    ``count`` x ``gpu``; N1-attached GPUs allow N1 hosts with
    ``count * min_vcpus_per_gpu <= vCPUs <= N1_MAX_VCPUS_PER_GPU[gpu] * count`` (default minimum:
    :data:`N1_VCPUS_PER_GPU`, a host sized as a user would) and at least
    :data:`N1_MIN_GB_PER_VCPU` of memory per vCPU where ``hosts`` says (a ``memory_gb`` column).
    """
    in_zone = hosts[hosts.zone == zone] if "zone" in hosts and zone else hosts
    if gpu in N1_MAX_VCPUS_PER_GPU:
        least = N1_VCPUS_PER_GPU.get(gpu, 1) if min_vcpus_per_gpu is None else min_vcpus_per_gpu
        limit = min(96, N1_MAX_VCPUS_PER_GPU[gpu] * count)
        n1 = in_zone[in_zone.instance_type.str.startswith("n1-")]
        fits = (n1.vcpus >= count * least) & (n1.vcpus <= limit)
        if "memory_gb" in n1:
            fits &= n1.memory_gb >= n1.vcpus * N1_MIN_GB_PER_VCPU - 1e-6
        return n1[fits]
    built_in = {t for t, g in INSTANCE_GPUS["gcp"].items() if g == (gpu, count)}
    return in_zone[in_zone.instance_type.isin(built_in)]


@dataclass(frozen=True, slots=True)
class Rates:
    """Per-region unit prices read from the Billing Catalog: (kind, region, spot) -> USD/h (RAM: per GiB h)."""

    table: Mapping[tuple[str, str, bool], float]
    unmatched: tuple[str, ...] = ()
    """GPU SKU descriptions not understood (a new variant such as "H100 80GB Plus GPU"): reported in
    ``skipped``, never silently dropped."""

    def get(self, kind: str, region: str, spot: bool) -> float | None:
        return self.table.get((kind, region, spot))


def sku_kind(description: str) -> str | None:
    """``gpu:H100-80GB``, ``a3-core``, ``n1-ram``... for a catalog description, else None."""
    gpu = _GPU_SKU.match(description)
    if gpu:
        key = gpu["model"].upper() + (f"-{gpu['mem'].upper()}" if gpu["mem"] else "") + ("-MEGA" if gpu["mega"] or gpu["mega0"] else "")
        return f"gpu:{key}"
    host = _HOST_SKU.match(description)
    if host:
        family = host["family"].lower().replace(" predefined", "").replace(" ", "")
        return f"{family}-{host['kind'].lower()}"
    return None


def parse_skus(skus: Sequence[Mapping[str, Any]]) -> Rates:
    """Unit prices from Billing Catalog SKUs in their JSON shape (commitments, DWS, sole tenancy ignored)."""
    table: dict[tuple[str, str, bool], float] = {}
    unmatched: set[str] = set()
    for sku in skus:
        usage = sku.get("category", {}).get("usageType", "")
        if usage not in ("OnDemand", "Preemptible"):
            continue
        text = str(sku.get("description", ""))
        kind = sku_kind(text)
        infos = sku.get("pricingInfo") or []
        if kind is None and _LOOKS_LIKE_GPU.search(text) and not _NOT_A_VM_GPU.search(text):
            unmatched.add(text)
        if kind is None or not infos:
            continue
        rates = infos[-1].get("pricingExpression", {}).get("tieredRates") or []
        if not rates:
            continue
        money = rates[-1].get("unitPrice", {})
        try:
            price = float(money.get("units", 0) or 0) + float(money.get("nanos", 0) or 0) / 1e9
        except (TypeError, ValueError):
            raise CloudError("gcp", "cloudbilling.services.skus.list",
                             f"price of {sku.get('skuId', '?')} is not a number: {money!r}"[:200]) from None
        for region in sku.get("serviceRegions", []):
            table[(kind, str(region), usage == "Preemptible")] = price
    return Rates(table, tuple(sorted(unmatched)))


_LOOKS_LIKE_GPU = re.compile(r"\bGPU\b.*running in ", re.I)
_NOT_A_VM_GPU = re.compile(r"Virtual Workstation|Commitment|DWS|Sole Tenancy|Reserved", re.I)


def classify(exc: BaseException) -> str | None:
    """One-line reason for a google-auth / google-api-core / proto failure (credentials never printed)."""
    from google.api_core import exceptions as gex
    from google.auth import exceptions as aex
    from google.protobuf.json_format import ParseError

    if isinstance(exc, aex.DefaultCredentialsError):
        return "no GCP credentials found by google.auth.default() (GOOGLE_APPLICATION_CREDENTIALS or gcloud auth application-default login)"
    if isinstance(exc, aex.RefreshError):
        return "the GCP credentials could not be refreshed (expired or revoked): run gcloud auth application-default login"
    if isinstance(exc, gex.RetryError):
        return f"still failing after google-api-core's retries: {short(exc.cause) if exc.cause else short(exc)}"
    if isinstance(exc, gex.GoogleAPICallError):
        status = int(exc.code or 0)
        message = re.sub(r"^[A-Z]+ \S+: ", "", " ".join(str(exc.message).split()))  # drop "GET <url>: "
        if status in (401, 403):
            return f"not authorized (HTTP {status}): check the credentials of google.auth.default() ({message[:120]})"
        return f"HTTP {status}: {message[:200]}"
    if isinstance(exc, (ParseError, json.JSONDecodeError, KeyError)):
        return f"malformed page ({short(exc)})"
    return None


class GcpPriceSource:
    """GPU prices per zone from the Compute and Billing Catalog APIs.

    ``client_options`` and ``credentials`` go to every client (tests pass anonymous credentials
    and a loopback ``api_endpoint``); the default is ``google.auth.default()`` and Google's endpoints.
    """

    name = "gcp"

    def __init__(
        self,
        project: str | None = None,
        credentials: Any = None,
        client_options: Mapping[str, Any] | None = None,
        counts: Sequence[int] = (1, 2, 4, 8),
        retry_deadline_s: float = 120.0,
    ) -> None:
        self._project = project
        self._client_kw: dict[str, Any] = {"transport": "rest"}
        if credentials is not None:
            self._client_kw["credentials"] = credentials
        if client_options:
            self._client_kw["client_options"] = dict(client_options)
        self.counts = tuple(counts)
        self._retry = google_retry(retry_deadline_s)
        self.skipped: list[str] = []

    def _call(self, what: str, fn: Any) -> Any:
        return call(fn, cloud="gcp", call=what, classify=classify)

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
        """zone, accelerator, gpu_type, sku, max_cards of every priced accelerator type."""
        from google.cloud import compute_v1

        client = compute_v1.AcceleratorTypesClient(**self._client_kw)
        pages = self._call("acceleratorTypes.aggregatedList",
                           lambda: list(client.aggregated_list(project=self._project_id(), retry=self._retry)))
        rows, unknown = [], set()
        for scope, scoped in pages:
            for acc in scoped.accelerator_types:
                name = str(acc.name)
                deprecated = acc.deprecated.state if "deprecated" in acc else ""
                if name in DEPRECATED or _VWS.search(name) or deprecated in ("DEPRECATED", "OBSOLETE", "DELETED"):
                    continue
                if name not in ACCELERATORS:
                    unknown.add(name)
                    continue
                gpu, sku = ACCELERATORS[name]
                rows.append({"zone": scope.split("/")[-1], "accelerator": name, "gpu_type": gpu, "sku": sku,
                             "max_cards": int(acc.maximum_cards_per_instance)})
        self.skipped += [f"gcp: acceleratorTypes.aggregatedList: unknown accelerator {n!r} not priced" for n in sorted(unknown)]
        return pd.DataFrame(rows, columns=["zone", "accelerator", "gpu_type", "sku", "max_cards"])

    def machine_types(self) -> pd.DataFrame:
        """zone, instance_type, vcpus, memory_gb of the N1/A2/A3/G2 machine types."""
        from google.cloud import compute_v1

        client = compute_v1.MachineTypesClient(**self._client_kw)
        pages = self._call("machineTypes.aggregatedList",
                           lambda: list(client.aggregated_list(project=self._project_id(), retry=self._retry)))
        rows = [
            {"zone": scope.split("/")[-1], "instance_type": mt.name, "vcpus": int(mt.guest_cpus),
             "memory_gb": mt.memory_mb / 1024}
            for scope, scoped in pages for mt in scoped.machine_types
            if mt.name.startswith("n1-") or mt.name in INSTANCE_GPUS["gcp"]
        ]
        return pd.DataFrame(rows, columns=["zone", "instance_type", "vcpus", "memory_gb"])

    def skus(self) -> list[dict[str, Any]]:
        """All Compute Engine SKUs in their JSON shape, through google-cloud-billing's pager."""
        from google.cloud import billing_v1

        def read() -> list[dict[str, Any]]:
            client = billing_v1.CloudCatalogClient(**self._client_kw)
            pager = client.list_skus(request={"parent": f"services/{COMPUTE_SERVICE_ID}", "currency_code": "USD",
                                              "page_size": 5000}, retry=self._retry)
            return [json.loads(billing_v1.Sku.to_json(sku)) for sku in pager]

        skus: list[dict[str, Any]] = self._call("cloudbilling.services.skus.list", read)
        return skus

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
        self.skipped.extend(f"gcp: cloudbilling.services.skus.list: GPU SKU {d!r} not understood: not priced"
                            for d in rates.unmatched)
        hosts = self.machine_types()
        accels = self.accelerators()
        records: list[PriceRecord] = []
        for acc in accels.to_dict("records"):
            zone, gpu, sku, max_cards = str(acc["zone"]), str(acc["gpu_type"]), str(acc["sku"]), int(acc["max_cards"])
            region = zone.rsplit("-", 1)[0]
            if regions and region not in regions:
                continue
            for spot in (True, False):
                gpu_rate = rates.get(f"gpu:{sku}", region, spot)
                if gpu_rate is None:
                    continue
                zone_hosts = hosts[hosts.zone == zone].copy()
                zone_hosts["price"] = [_host_price(str(h["instance_type"]), float(h["vcpus"]), float(h["memory_gb"]),
                                                   region, spot, rates) for h in zone_hosts.to_dict("records")]
                zone_hosts = zone_hosts.dropna(subset=["price"])
                for count in self.counts:
                    options = host_options(gpu, count, zone_hosts, zone) if count <= max_cards else zone_hosts[:0]
                    # the Mega H100 is its own accelerator (and SKU) and comes only on a3-megagpu
                    options = options[options.instance_type.str.startswith("a3-megagpu") == sku.endswith("-MEGA")]
                    if not spot:  # a3-highgpu-1g/2g/4g: Spot or Flex-start only
                        options = options[~options.instance_type.isin(SPOT_ONLY)]
                    if instance_types:
                        options = options[options.instance_type.isin(instance_types)]
                    if options.empty:
                        continue
                    best = options.iloc[int(options.price.to_numpy().argmin())]
                    records.append(PriceRecord(
                        timestamp=when, cloud="gcp", region=region, zone=zone, instance_type=str(best.instance_type),
                        gpu_type=gpu, gpu_count=count, spot=spot,
                        usd_per_hour=round(float(best.price) + gpu_rate * count, 6), source="gcp:cloudbilling+compute"))
        yield from records


def _host_price(name: str, vcpus: float, memory_gb: float, region: str, spot: bool, rates: Rates) -> float | None:
    family = host_family(name)
    core = rates.get(f"{family}-core", region, spot)
    ram = rates.get(f"{family}-ram", region, spot)
    if (core is None or ram is None) and family.startswith("a3"):
        core, ram = rates.get("a3-core", region, spot), rates.get("a3-ram", region, spot)
    if core is None or ram is None:
        return None
    return vcpus * core + memory_gb * ram
