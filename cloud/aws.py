"""AWS price source: EC2 spot price history plus on-demand list prices from the bundled snapshot.

Spot prices come from ``describe_spot_price_history`` through its paginator (a single call stops
at 1000 records - the training_on_a_dime trace of us-east-1/p2.xlarge shows exactly that
truncation). GPU model, count and memory come from ``describe_instance_types`` so a new instance
type needs no code change; the static table in :mod:`cloud.records` is only the fallback.
On-demand prices are AWS list prices that change rarely, so a bundled table is enough (the
Pricing API is optional and not used).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from .records import INSTANCE_GPUS, PriceRecord, normalize_gpu, utc
from .sources import CloudError, retry_call

DEFAULT_REGIONS: tuple[str, ...] = ("us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1")
TRANSIENT_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError", "InternalFailure",
    "ServiceUnavailable", "Unavailable", "RequestTimeout", "SlowDown",
})


def classify(exc: BaseException) -> str | None:
    """Map a boto3/botocore exception to transient / a permanent reason / ``None`` (not ours)."""
    from botocore import exceptions as bex

    if isinstance(exc, (bex.NoCredentialsError, bex.PartialCredentialsError)):
        return "no AWS credentials found by the standard chain (env, ~/.aws, instance role)"
    if isinstance(exc, (bex.EndpointConnectionError, bex.ConnectTimeoutError, bex.ReadTimeoutError)):
        return "transient"
    if isinstance(exc, bex.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in TRANSIENT_CODES or status >= 500:
            return "transient"
        return f"{code or 'HTTP ' + str(status)}: {str(error.get('Message', ''))[:200]}"
    if isinstance(exc, bex.BotoCoreError):
        return f"{type(exc).__name__}: {exc}"
    return None


class AwsPriceSource:
    """Spot history and GPU facts from EC2, per region.

    ``client_factory(region)`` returns an EC2 client; tests pass one wrapped in botocore's
    Stubber. The default uses ``boto3.Session().client("ec2", region_name=region)`` and hence the
    standard credential chain.
    """

    name = "aws"

    def __init__(
        self,
        client_factory: Callable[[str], Any] | None = None,
        product_description: str = "Linux/UNIX",
        zones: Sequence[str] = (),
        window: timedelta = timedelta(days=7),
        sleep: Callable[[float], None] | None = None,
        on_demand: Callable[[], Iterable[PriceRecord]] | None = None,
    ) -> None:
        self._client_factory = client_factory or _default_client
        self.product_description = product_description
        self.zones = tuple(zones)
        self.window = window
        self._retry_kw: dict[str, Any] = {"sleep": sleep} if sleep else {}
        self._on_demand = on_demand

    def _call(self, call: str, fn: Callable[[], Any]) -> Any:
        return retry_call(fn, cloud="aws", call=call, classify=classify, **self._retry_kw)

    def gpu_info(self, region: str, instance_types: Sequence[str]) -> dict[str, tuple[str, int, int]]:
        """instance type -> (GPU model, GPU count, total GPU memory MiB) from describe_instance_types."""
        client = self._client_factory(region)
        paginator = client.get_paginator("describe_instance_types")
        kwargs: dict[str, Any] = {}
        if instance_types:
            kwargs["Filters"] = [{"Name": "instance-type", "Values": list(instance_types)}]
        pages = self._call("describe_instance_types", lambda: list(paginator.paginate(**kwargs)))
        info: dict[str, tuple[str, int, int]] = {}
        for page in pages:
            for item in page.get("InstanceTypes", []):
                gpus = item.get("GpuInfo", {}).get("Gpus", [])
                if not gpus:
                    continue
                count = sum(int(g.get("Count", 0)) for g in gpus)
                memory = int(item["GpuInfo"].get("TotalGpuMemoryInMiB", 0))
                info[item["InstanceType"]] = (normalize_gpu(gpus[0]["Name"]), count, memory)
        return info

    def spot_history(
        self, region: str, instance_types: Sequence[str], start: datetime, end: datetime
    ) -> list[dict[str, Any]]:
        """Raw SpotPriceHistory items of one region (all pages, per requested zone)."""
        client = self._client_factory(region)
        items: list[dict[str, Any]] = []
        for zone in self.zones or (None,):
            kwargs: dict[str, Any] = {
                "InstanceTypes": list(instance_types),
                "ProductDescriptions": [self.product_description],
                "StartTime": start,
                "EndTime": end,
            }
            if zone is not None:
                if not zone.startswith(region):
                    continue
                kwargs["AvailabilityZone"] = zone
            paginator = client.get_paginator("describe_spot_price_history")
            pages = self._call("describe_spot_price_history", lambda: list(paginator.paginate(**kwargs)))
            for page in pages:
                items.extend(page.get("SpotPriceHistory", []))
        return items

    def fetch(
        self,
        regions: Sequence[str] = (),
        instance_types: Sequence[str] = (),
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> Iterator[PriceRecord]:
        end_t = utc(end) if end else datetime.now(timezone.utc)
        start_t = utc(start) if start else end_t - self.window
        types = tuple(instance_types) or tuple(INSTANCE_GPUS["aws"])
        for region in regions or DEFAULT_REGIONS:
            gpus = self.gpu_info(region, types)
            for item in self.spot_history(region, types, start_t, end_t):
                itype = item["InstanceType"]
                gpu, count = _gpu_of(itype, gpus)
                if count == 0:
                    continue
                stamp = item["Timestamp"]
                yield PriceRecord(
                    timestamp=utc(stamp if isinstance(stamp, datetime) else str(stamp)),
                    cloud="aws", region=region, zone=item["AvailabilityZone"],
                    instance_type=itype, gpu_type=gpu, gpu_count=count, spot=True,
                    usd_per_hour=float(item["SpotPrice"]), source="aws:describe_spot_price_history",
                )
            yield from self._on_demand_records(region, types, end_t)

    def _on_demand_records(self, region: str, types: Sequence[str], when: datetime) -> Iterator[PriceRecord]:
        if self._on_demand is not None:
            rows: Iterable[PriceRecord] = self._on_demand()
        else:
            from .importers import load_snapshot

            frame = load_snapshot()
            rows = (
                PriceRecord(**{**r, "timestamp": when})  # type: ignore[arg-type]
                for r in frame[(frame.cloud == "aws") & ~frame.spot].to_dict("records")
            )
        for rec in rows:
            if rec.region == region and rec.instance_type in types and not rec.spot:
                yield rec


def _gpu_of(itype: str, gpus: dict[str, tuple[str, int, int]]) -> tuple[str, int]:
    if itype in gpus:
        return gpus[itype][0], gpus[itype][1]
    return INSTANCE_GPUS["aws"].get(itype, ("", 0))


def _default_client(region: str) -> Any:
    try:
        import boto3
    except ImportError as exc:  # pragma: no cover - boto3 is a dependency
        raise CloudError("aws", "import boto3", str(exc)) from None
    return boto3.session.Session().client("ec2", region_name=region)
