"""The price record schema and the static facts about GPU instance types.

Everything above the price sources (store, policies, migration, replay) speaks one schema, so a
policy never needs to know which cloud or which file a price came from. The instance table is
data, not code: a source that cannot tell the GPU model of an instance type (an AWS spot-price
trace, an Azure daily CSV) looks it up here.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone

from .errors import CloudInputError

CLOUDS: tuple[str, ...] = ("aws", "gcp", "azure")
CLOUD_ALIASES: dict[str, str] = {
    "aws": "aws", "amazon": "aws", "ec2": "aws",
    "gcp": "gcp", "google": "gcp", "gce": "gcp",
    "azure": "azure", "az": "azure", "microsoft": "azure",
}

#: Columns of every price frame, in order. ``spot`` is a bool; ``timestamp`` (when the price took
#: effect) and ``observed_at`` (when we read it: a refresh, a trace, the snapshot's compile date)
#: are tz-aware UTC. ``source`` says where a row came from; an ``estimate:`` source marks a value
#: nobody observed (see :func:`is_estimate`).
SCHEMA: tuple[str, ...] = (
    "timestamp", "cloud", "region", "zone", "instance_type", "gpu_type", "gpu_count",
    "spot", "usd_per_hour", "source", "observed_at",
)
ESTIMATE_PREFIX = "estimate:"
#: A price series is identified by these columns; a row is one observation of that series.
OFFER_KEY: tuple[str, ...] = ("cloud", "region", "zone", "instance_type", "spot")

# instance type -> (gpu model, gpu count). Public spec sheets of each cloud.
INSTANCE_GPUS: dict[str, dict[str, tuple[str, int]]] = {
    "aws": {
        "p2.xlarge": ("K80", 1), "p2.8xlarge": ("K80", 8), "p2.16xlarge": ("K80", 16),
        "p3.2xlarge": ("V100", 1), "p3.8xlarge": ("V100", 4), "p3.16xlarge": ("V100", 8),
        "p3dn.24xlarge": ("V100", 8), "p4d.24xlarge": ("A100", 8), "p5.48xlarge": ("H100", 8),
        "g4dn.xlarge": ("T4", 1), "g4dn.2xlarge": ("T4", 1), "g4dn.12xlarge": ("T4", 4),
        "g4dn.metal": ("T4", 8), "g5.xlarge": ("A10G", 1), "g5.2xlarge": ("A10G", 1),
        "g5.12xlarge": ("A10G", 4), "g5.48xlarge": ("A10G", 8), "p4de.24xlarge": ("A100-80GB", 8),
        "p5e.48xlarge": ("H200", 8), "p5en.48xlarge": ("H200", 8), "g6.xlarge": ("L4", 1),
        "g6.12xlarge": ("L4", 4), "g6.48xlarge": ("L4", 8), "g6e.xlarge": ("L40S", 1), "g6e.12xlarge": ("L40S", 4),
    },
    # Names exactly as the Azure API spells them (``Standard_`` prefix); lookups accept both.
    "azure": {f"Standard_{k}": v for k, v in {
        "NC6s_v3": ("V100", 1), "NC12s_v3": ("V100", 2), "NC24s_v3": ("V100", 4), "NC24rs_v3": ("V100", 4),
        "NC4as_T4_v3": ("T4", 1), "NC8as_T4_v3": ("T4", 1), "NC16as_T4_v3": ("T4", 1), "NC64as_T4_v3": ("T4", 4),
        "ND96asr_v4": ("A100", 8), "ND96amsr_A100_v4": ("A100-80GB", 8), "NC24ads_A100_v4": ("A100-80GB", 1),
        "NC48ads_A100_v4": ("A100-80GB", 2), "NC96ads_A100_v4": ("A100-80GB", 4), "ND96isr_H100_v5": ("H100", 8),
        "NC40ads_H100_v5": ("H100", 1), "NC80adis_H100_v5": ("H100", 2), "ND96isr_H200_v5": ("H200", 8),
        # retired sizes, kept so the 2020 training_on_a_dime traces still import
        "NC6": ("K80", 1), "NC12": ("K80", 2), "NC24": ("K80", 4), "NC24r": ("K80", 4),
        "NC6s_v2": ("P100", 1), "NC12s_v2": ("P100", 2), "NC24s_v2": ("P100", 4), "NC24rs_v2": ("P100", 4),
    }.items()},
    # GCP types with GPUs built in (N1 hosts carry attached GPUs and are priced per request).
    "gcp": {
        **{f"a2-highgpu-{n}g": ("A100", n) for n in (1, 2, 4, 8)}, "a2-megagpu-16g": ("A100", 16),
        **{f"a2-ultragpu-{n}g": ("A100-80GB", n) for n in (1, 2, 4, 8)},
        **{f"a3-highgpu-{n}g": ("H100", n) for n in (1, 2, 4, 8)}, "a3-megagpu-8g": ("H100", 8),
        "a3-edgegpu-8g": ("H100", 8), "a3-ultragpu-8g": ("H200", 8),
        # G2: one L4 up to 16 vCPUs and on g2-standard-32; 2, 4, 8 on the 24, 48, 96 vCPU types
        **{f"g2-standard-{v}": ("L4", n) for v, n in ((4, 1), (8, 1), (12, 1), (16, 1), (32, 1), (24, 2),
                                                       (48, 4), (96, 8))},
    },
}

# A10 (Azure's NVadsA10_v5) and A10G (AWS's g5) are different parts: no alias between them.
_GPU_ALIASES = {"A100-SXM4-40GB": "A100", "A100-40GB": "A100", "A100-SXM4-80GB": "A100-80GB", "A100-80G": "A100-80GB"}


def normalize_gpu(name: str) -> str:
    """Canonical GPU model name: ``nvidia-tesla-v100``, ``Tesla V100``, ``v100`` -> ``V100``.

    Clouds spell the same part differently; policies compare GPU types across clouds, so they
    must meet on one spelling.
    """
    text = str(name).strip().upper().replace("_", "-")
    text = re.sub(r"^(NVIDIA[- ])?(TESLA[- ])?", "", text).strip(" -")
    text = text.replace(" ", "-")
    return _GPU_ALIASES.get(text, text)


def normalize_azure_size(name: str) -> str:
    """``NC6s_v3`` / ``NC6s v3`` / ``standard_NC6s_v3`` -> ``Standard_NC6s_v3``, the API's spelling.

    Azure's APIs, its price sheets and every catalog name sizes ``Standard_...``; older traces
    (training_on_a_dime's daily CSVs) drop the prefix, so both spellings are accepted.
    """
    text = str(name).strip()
    text = re.sub(r"^standard_", "", text, flags=re.I)
    return "Standard_" + text.replace(" ", "_") if text else ""


def is_estimate(source: str) -> bool:
    """True for rows nobody observed (``estimate: 30% of on-demand ...``): outputs must say so."""
    return str(source).startswith(ESTIMATE_PREFIX)


def canonical_cloud(name: str) -> str:
    """Resolve a cloud name or alias, or fail with a "did you mean" suggestion."""
    key = str(name).strip().lower()
    if key in CLOUD_ALIASES:
        return CLOUD_ALIASES[key]
    raise CloudInputError(f"unknown cloud {name!r}{did_you_mean(key, CLOUD_ALIASES)}")


def did_you_mean(word: str, choices: object) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, or ``""`` when nothing is close."""
    options = [str(c) for c in choices]  # type: ignore[attr-defined]
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(sorted(options)[:12])})"


def instance_gpus(cloud: str, instance_type: str) -> tuple[str, int]:
    """GPU model and count of a known instance type; :class:`CloudInputError` with a suggestion if unknown."""
    table = INSTANCE_GPUS[canonical_cloud(cloud)]
    key = normalize_azure_size(instance_type) if cloud == "azure" else instance_type
    if key in table:
        return table[key]
    raise CloudInputError(f"unknown {cloud} instance type {instance_type!r}{did_you_mean(key, table)}")


def utc(value: datetime | str) -> datetime:
    """Parse/convert to an aware UTC datetime; naive values are taken as UTC."""
    stamp = datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) else value
    return stamp.replace(tzinfo=timezone.utc) if stamp.tzinfo is None else stamp.astimezone(timezone.utc)


@dataclass(frozen=True, slots=True)
class PriceRecord:
    """One observed price of one offer (the unit every source yields)."""

    timestamp: datetime
    cloud: str
    region: str
    zone: str
    instance_type: str
    gpu_type: str
    gpu_count: int
    spot: bool
    usd_per_hour: float
    source: str
    observed_at: datetime | None = None  # None: the same as ``timestamp``

    def __post_init__(self) -> None:
        if self.cloud not in CLOUDS:
            raise CloudInputError(f"price record: unknown cloud {self.cloud!r}{did_you_mean(self.cloud, CLOUDS)}")
        if not self.instance_type:
            raise CloudInputError("price record: empty instance_type")
        if self.gpu_count < 0:
            raise CloudInputError(f"price record {self.instance_type}: negative gpu_count {self.gpu_count}")
        if not math.isfinite(self.usd_per_hour) or self.usd_per_hour < 0:
            raise CloudInputError(f"price record {self.instance_type}: bad price {self.usd_per_hour!r}")
        if self.timestamp.tzinfo is None:
            object.__setattr__(self, "timestamp", utc(self.timestamp))
        object.__setattr__(self, "observed_at", utc(self.observed_at) if self.observed_at else self.timestamp)

    def as_row(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in SCHEMA}


@dataclass(frozen=True, slots=True)
class Offer:
    """A place a job can run: one instance type in one zone, spot or on-demand, at a price. ``instances`` > 1: a
    fleet of that many identical instances placed as one cluster of as many nodes (how spot training is usually
    bought: Parcae's 32 x p3.2xlarge); ``gpu_count`` and ``usd_per_hour`` are then the fleet's totals."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    gpu_type: str
    gpu_count: int
    spot: bool
    usd_per_hour: float
    observed_at: datetime | None = None
    """When this price was read (a refresh, an import, a trace line); None: unknown. Decisions
    report it and refuse to move automatically on a price older than their limit."""
    instances: int = 1

    def __post_init__(self) -> None:
        if self.observed_at is not None:
            object.__setattr__(self, "observed_at", utc(self.observed_at))
        if self.gpu_count <= 0:
            raise CloudInputError(f"offer {self.instance_type}: needs at least one GPU")
        if self.instances < 1 or self.gpu_count % self.instances:
            raise CloudInputError(f"offer {self.instance_type}: {self.gpu_count} GPUs do not split over {self.instances} instances")
        if not math.isfinite(self.usd_per_hour) or self.usd_per_hour <= 0:
            raise CloudInputError(f"offer {self.instance_type}: bad price {self.usd_per_hour!r}")

    @property
    def key(self) -> tuple[str, str, str, str, bool]:
        return (self.cloud, self.region, self.zone, self.instance_type, self.spot)

    def age_s(self, now: datetime) -> float | None:
        """Seconds since this price was read, or None when nobody knows when it was."""
        return None if self.observed_at is None else max(0.0, (utc(now) - self.observed_at).total_seconds())

    def as_event(self) -> dict[str, object]:
        """The offer as an event-log field (``job_started``'s ``offer``)."""
        return {"cloud": self.cloud, "region": self.region, "zone": self.zone, "instance_type": self.instance_type,
                "gpu_type": self.gpu_type, "gpu_count": self.gpu_count, "spot": self.spot,
                "usd_per_hour": self.usd_per_hour, "instances": self.instances,
                "observed_at": self.observed_at.isoformat() if self.observed_at else None}

    def label(self) -> str:
        kind = "spot" if self.spot else "on-demand"
        fleet = f"{self.instances}x " if self.instances > 1 else ""
        return f"{self.cloud}/{self.zone or self.region}/{fleet}{self.instance_type} ({kind})"
