"""AWS price source: on-demand list prices from the Pricing API, spot prices from EC2.

- Regions come from ``describe_regions`` (the ones this account may use), unless given.
- On-demand: ``pricing.get_products`` (the Pricing API lives in us-east-1) filtered to the rows a
  training job pays for - Linux, shared tenancy, no pre-installed software, ``capacitystatus``
  Used (the other capacity statuses are reservation bookkeeping rows with the same price keys).
  Each ``PriceList`` entry is a JSON *string* holding ``product.attributes`` and the nested
  ``terms.OnDemand.<offer>.priceDimensions.<rate>.pricePerUnit.USD``.
- Spot: ``describe_spot_price_history``. A first refresh asks for the price in effect now, which
  EC2 answers with the latest price per availability zone; an incremental refresh asks for the
  window since the newest price held.
- GPU model and count come from ``describe_instance_types``; the static table in
  :mod:`cloud.records` is only the fallback.

Every call goes through a botocore paginator on a client configured with botocore's standard
retry mode, so a throttled page is retried by botocore and pagination resumes from that page.
A region that refuses us (an opt-in region: ``AuthFailure``/``OptInRequired``) is reported in
``skipped`` and the other regions are still returned; a region that fails half-way yields none of
its records, so nothing half-fetched reaches the store.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from .errors import CloudError
from .records import INSTANCE_GPUS, PriceRecord, normalize_gpu, utc
from .sources import botocore_config, call, short

log = logging.getLogger(__name__)
HOME_REGION = "us-east-1"  # describe_regions and the Pricing API endpoint
PRICING_FILTERS: tuple[tuple[str, str], ...] = (
    ("operatingSystem", "Linux"), ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"),
)
#: Errors that concern the whole account (never one region): raised, not skipped.
CREDENTIAL_CODES = frozenset({
    "ExpiredToken", "ExpiredTokenException", "RequestExpired", "InvalidClientTokenId", "SignatureDoesNotMatch",
    "UnrecognizedClientException", "InvalidAccessKeyId",
})
#: Errors that mean "this region is not open to this account".
REGION_CODES = frozenset({"AuthFailure", "OptInRequired", "UnauthorizedOperation", "Blocked"})

ClientFactory = Callable[[str, str], Any]


def classify(exc: BaseException) -> str | None:
    """One-line reason for a boto3/botocore failure (credentials named, never printed)."""
    from botocore import exceptions as bex

    if isinstance(exc, (bex.NoCredentialsError, bex.PartialCredentialsError)):
        return "no AWS credentials found by the standard chain (AWS_PROFILE, AWS_ACCESS_KEY_ID, ~/.aws, instance role)"
    if isinstance(exc, bex.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in CREDENTIAL_CODES:
            return f"{code}: the AWS credentials of the standard chain are expired or invalid; refresh them"
        if status == 429 or status >= 500:
            return f"{code or 'HTTP ' + str(status)}: still failing after botocore's retries"
        return f"{code or 'HTTP ' + str(status)}: {' '.join(str(error.get('Message', '')).split())[:200]}"
    if isinstance(exc, bex.BotoCoreError):
        return short(exc)
    return None


def _is_region_refusal(exc: CloudError) -> bool:
    return exc.reason.split(":", 1)[0] in REGION_CODES


class AwsPriceSource:
    """On-demand and spot prices of GPU instance types, region by region.

    ``client_factory(service, region)`` returns a boto3 client (tests pass clients wrapped in
    botocore's Stubber, or pointed at a loopback server); the default is a client of the standard
    credential chain with :func:`cloud.sources.botocore_config`.
    """

    name = "aws"

    def __init__(
        self,
        client_factory: ClientFactory | None = None,
        product_description: str = "Linux/UNIX",
        window: timedelta = timedelta(days=7),
    ) -> None:
        self._client_factory = client_factory or _default_client
        self.product_description = product_description
        self.window = window
        self.skipped: list[str] = []

    def _pages(self, service: str, region: str, operation: str, about: str = "", **kwargs: Any) -> list[dict[str, Any]]:
        """Every page of ``operation`` (botocore retries each page; a failure names ``about``)."""
        client = self._client_factory(service, region)
        paginator = client.get_paginator(operation)
        where = f"{'pricing.' if service == 'pricing' else ''}{operation} ({about or region})"
        pages: list[dict[str, Any]] = call(lambda: list(paginator.paginate(**kwargs)), cloud="aws",
                                           call=where, classify=classify)
        return pages

    def regions(self) -> list[str]:
        """Regions this account can use (opt-in regions only once opted in)."""
        client = self._client_factory("ec2", HOME_REGION)
        answer = call(lambda: client.describe_regions(AllRegions=False), cloud="aws", call="describe_regions",
                      classify=classify)
        return sorted(str(r["RegionName"]) for r in answer.get("Regions", []))

    def gpu_info(self, region: str, instance_types: Sequence[str]) -> dict[str, tuple[str, int]]:
        """instance type -> (GPU model, GPU count) from describe_instance_types, corrected.

        The API's GPU ``Name`` is not a model a user can ask for: it answers "A100" for p4de (an
        A100-80GB) and "NVIDIA" for p5e/p5en (H200). The instance table wins where it knows the type
        (as SkyPilot's fetcher does); otherwise the GPU memory tells the 80 GB A100 and the H200
        apart; a type whose model still cannot be told is left out with a note in ``skipped``.
        """
        kwargs: dict[str, Any] = {}
        if instance_types:
            kwargs["Filters"] = [{"Name": "instance-type", "Values": list(instance_types)}]
        info: dict[str, tuple[str, int]] = {}
        for page in self._pages("ec2", region, "describe_instance_types", **kwargs):
            for item in page.get("InstanceTypes", []):
                gpus = item.get("GpuInfo", {}).get("Gpus", [])
                count = sum(int(g.get("Count", 0)) for g in gpus)
                if not count:
                    continue
                itype = str(item["InstanceType"])
                model = INSTANCE_GPUS["aws"].get(itype, (gpu_model(gpus[0]), count))[0]
                if model in GENERIC_GPU_NAMES:
                    self.skipped.append(f"aws: {itype} ({region}): GPU model not told by describe_instance_types "
                                        f"(Name {gpus[0].get('Name')!r}); add it to cloud.records.INSTANCE_GPUS")
                    continue
                info[itype] = (model, count)
        return info

    def on_demand(self, region: str, instance_types: Sequence[str]) -> dict[str, float]:
        """instance type -> on-demand USD/hour from the Pricing API."""
        filters = [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": region}]
        filters += [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in PRICING_FILTERS]
        if instance_types:
            filters.append({"Type": "ANY_OF", "Field": "instanceType", "Value": ",".join(instance_types)})
        pages = self._pages("pricing", HOME_REGION, "get_products", region, ServiceCode="AmazonEC2", Filters=filters)
        prices: dict[str, float] = {}
        for page in pages:
            for entry in page.get("PriceList", []):
                itype, price = parse_price_item(entry, region)
                if itype and price > 0:
                    prices[itype] = price
        return prices

    def spot(self, region: str, instance_types: Sequence[str], start: datetime | None, end: datetime) -> list[dict[str, Any]]:
        """SpotPriceHistory items; with no ``start``, the latest price per zone and type only."""
        kwargs: dict[str, Any] = {"InstanceTypes": list(instance_types), "ProductDescriptions": [self.product_description]}
        kwargs.update({"StartTime": start, "EndTime": end} if start else {"StartTime": end})
        items = [i for page in self._pages("ec2", region, "describe_spot_price_history", **kwargs)
                 for i in page.get("SpotPriceHistory", [])]
        if start is None:
            latest: dict[tuple[str, str], dict[str, Any]] = {}
            for item in items:
                key = (str(item["AvailabilityZone"]), str(item["InstanceType"]))
                if key not in latest or _stamp(item) > _stamp(latest[key]):
                    latest[key] = item
            items = list(latest.values())
        return items

    def fetch_region(
        self, region: str, instance_types: Sequence[str], start: datetime | None, end: datetime
    ) -> list[PriceRecord]:
        """All records of one region, or a :class:`CloudError` (never a partial list)."""
        gpus = self.gpu_info(region, instance_types)
        gpus.update({t: g for t, g in INSTANCE_GPUS["aws"].items() if t in instance_types or t in gpus})
        out: list[PriceRecord] = []
        for item in self.spot(region, instance_types, start, end):
            itype = str(item["InstanceType"])
            gpu, count = gpus.get(itype, ("", 0))
            if count:
                out.append(PriceRecord(
                    timestamp=_stamp(item), cloud="aws", region=region, zone=str(item["AvailabilityZone"]),
                    instance_type=itype, gpu_type=gpu, gpu_count=count, spot=True,
                    usd_per_hour=_price(f"describe_spot_price_history ({region})", item.get("SpotPrice")),
                    source="aws:describe_spot_price_history"))
        for itype, price in sorted(self.on_demand(region, instance_types).items()):
            gpu, count = gpus.get(itype, ("", 0))
            if count:
                out.append(PriceRecord(
                    timestamp=end, cloud="aws", region=region, zone="", instance_type=itype, gpu_type=gpu,
                    gpu_count=count, spot=False, usd_per_hour=price, source="aws:pricing.get_products"))
        return out

    def fetch(
        self,
        regions: Sequence[str] = (),
        instance_types: Sequence[str] = (),
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> Iterator[PriceRecord]:
        end_t = utc(end) if end else datetime.now(timezone.utc)
        start_t = utc(start) if start else None
        types = tuple(instance_types) or tuple(INSTANCE_GPUS["aws"])
        wanted = list(regions) or self.regions()
        done = 0
        for region in wanted:
            try:
                records = self.fetch_region(region, types, start_t, end_t)
            except CloudError as exc:
                if not _is_region_refusal(exc):
                    raise
                self.skipped.append(str(exc))
                log.warning("skipping region: %s", exc)
                continue
            done += 1
            yield from records
        if wanted and not done:
            raise CloudError("aws", "fetch", f"every region refused the request ({self.skipped[0]})")


def parse_price_item(entry: str | Mapping[str, Any], region: str) -> tuple[str, float]:
    """(instance type, USD/hour) of one ``PriceList`` entry; CloudError when malformed."""
    where = f"pricing.get_products ({region})"
    try:
        item = json.loads(entry) if isinstance(entry, str) else entry
        attributes = item["product"]["attributes"]
        itype = str(attributes["instanceType"])
        terms = item["terms"]["OnDemand"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CloudError("aws", where, f"malformed PriceList entry ({short(exc)})") from None
    prices = [
        _price(where, dim.get("pricePerUnit", {}).get("USD"))
        for term in terms.values() for dim in term.get("priceDimensions", {}).values()
        if str(dim.get("unit", "")).lower() in ("hrs", "hours")
    ]
    return itype, max(prices, default=0.0)


def _price(where: str, value: object) -> float:
    try:
        price = float(str(value))
    except ValueError:
        price = math.nan
    if not math.isfinite(price) or price < 0:
        raise CloudError("aws", where, f"price is not a number: {str(value)[:40]!r}")
    return price


#: GPU names that are a vendor, not a model (p5e/p5en answer "NVIDIA").
GENERIC_GPU_NAMES = frozenset({"NVIDIA", "", "GPU"})


def gpu_model(gpu: Mapping[str, Any]) -> str:
    """The model of one ``GpuInfo.Gpus`` entry: its name, told apart by memory where the name is
    ambiguous (an "A100" with 80 GB is an A100-80GB; an unnamed 141 GB NVIDIA part is an H200)."""
    name = normalize_gpu(str(gpu.get("Name", "")))
    mib = int(gpu.get("MemoryInfo", {}).get("SizeInMiB", 0) or 0)
    if name == "A100" and mib >= 80 * 1024:
        return "A100-80GB"
    if name in GENERIC_GPU_NAMES and 140 * 1024 <= mib <= 144 * 1024:
        return "H200"
    return name


def _stamp(item: Mapping[str, Any]) -> datetime:
    value = item["Timestamp"]
    return utc(value if isinstance(value, datetime) else str(value))


def _default_client(service: str, region: str) -> Any:
    import boto3

    return boto3.session.Session().client(service, region_name=region, config=botocore_config())  # type: ignore[call-overload]
