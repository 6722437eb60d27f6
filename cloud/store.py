"""The price store: every price any source ever gave us, as one pandas frame with one schema.

Why a frame and not objects: policies and the replay simulator ask "latest price of every offer at
time t" and "price of every offer on an hourly grid" - a groupby and a pivot+ffill, not loops.
The store is immutable: ``merge``/``refresh`` return a new store, so a policy can never see a
table change under it. The on-disk cache is the same CSV the importers read, written atomically.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from .errors import CloudInputError

from .records import OFFER_KEY, SCHEMA, Offer, PriceRecord, is_estimate, normalize_azure_size, utc
from .sources import PriceSource

SERIES_KEY: list[str] = [*OFFER_KEY[:4], "gpu_type", "gpu_count", "spot"]


def default_cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "raypipe" / "prices.csv.gz"


RESOLUTIONS = ("s", "ms", "us", "ns")
"""pandas' datetime resolutions, coarsest first."""


def empty_frame() -> pd.DataFrame:
    return normalize(pd.DataFrame({c: [] for c in SCHEMA}))


def normalize(frame: pd.DataFrame, origin: str = "price table") -> pd.DataFrame:
    """Coerce to the schema (column order, dtypes, UTC timestamps) or raise one-line CloudInputError."""
    if "observed_at" not in frame.columns and "timestamp" in frame.columns:
        frame = frame.assign(observed_at=frame["timestamp"])  # caches written before the column existed
    missing = [c for c in SCHEMA if c not in frame.columns]
    if missing:
        raise CloudInputError(f"{origin}: missing columns {', '.join(missing)}")
    out = frame.loc[:, list(SCHEMA)].copy()
    try:
        out["timestamp"] = pd.to_datetime(out["timestamp"], utc=True, format="mixed")
        out["observed_at"] = pd.to_datetime(out["observed_at"].replace("", None), utc=True, format="mixed")
        # strings parse to the resolution they carry (s, us, ns): one dtype before filling one from the other
        finer = max(out["timestamp"].dt.unit, out["observed_at"].dt.unit, key=RESOLUTIONS.index)
        out["timestamp"] = out["timestamp"].dt.as_unit(finer)  # out of range at ns: a ValueError, one line below
        out["observed_at"] = out["observed_at"].dt.as_unit(finer).fillna(out["timestamp"])
        out["usd_per_hour"] = pd.to_numeric(out["usd_per_hour"]).astype(float)
        out["gpu_count"] = pd.to_numeric(out["gpu_count"]).astype(int)
    except (ValueError, TypeError) as exc:
        raise CloudInputError(f"{origin}: bad value ({str(exc).splitlines()[0][:160]})") from None
    if out["spot"].dtype != bool:
        out["spot"] = out["spot"].map(_as_bool)
    for col in ("cloud", "region", "zone", "instance_type", "gpu_type", "source"):
        out[col] = out[col].fillna("").astype(str)
    azure = out.cloud == "azure"
    if azure.any():  # one spelling (the API's, ``Standard_NC6s_v3``) whatever the file used
        out.loc[azure, "instance_type"] = out.loc[azure, "instance_type"].map(normalize_azure_size)
    if (out.usd_per_hour < 0).any():
        raise CloudInputError(f"{origin}: negative price")
    return out.reset_index(drop=True)


def _as_bool(value: object) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "spot"):
        return True
    if text in ("false", "0", "no", "on-demand", "ondemand", ""):
        return False
    raise CloudInputError(f"spot column: not a boolean: {value!r}")


def write_frame_atomic(frame: pd.DataFrame, path: Path) -> None:
    """CSV (gzip when the name ends .gz) under a temporary name, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        frame.to_csv(tmp, index=False, compression="gzip" if path.suffix == ".gz" else None)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def offer_of(row: Mapping[Any, Any] | pd.Series) -> Offer:
    """One row of a price frame as an :class:`Offer` (with its ``observed_at``)."""
    seen = row["observed_at"]
    instances = row.get("instances", 1)
    return Offer(str(row["cloud"]), str(row["region"]), str(row["zone"]), str(row["instance_type"]),
                 str(row["gpu_type"]), int(row["gpu_count"]), bool(row["spot"]), float(row["usd_per_hour"]),
                 None if seen is None or pd.isna(seen) else pd.Timestamp(seen).to_pydatetime(),
                 1 if instances is None or pd.isna(instances) else int(instances))


def with_fleets(rows: pd.DataFrame, gpus: int) -> pd.DataFrame:
    """``rows`` (one per offer) and, for each instance type with fewer GPUs than ``gpus`` that divides it, the
    fleet of ``gpus / gpu_count`` such instances as an offer of its own (``instances``; ``gpu_count`` and
    ``usd_per_hour`` the fleet's totals). Why: a job of 4 devices can run on 4 x p3.2xlarge as well as on one
    p3.8xlarge, and spot capacity is mostly bought that way; the migration planner weighs both alike."""
    singles = rows.assign(instances=1)
    small = singles[(singles.gpu_count < gpus) & (gpus % singles.gpu_count == 0)]
    count = gpus // small.gpu_count
    fleets = small.assign(instances=count, gpu_count=gpus, usd_per_hour=small.usd_per_hour * count)
    return pd.concat([singles, fleets], ignore_index=True)


def latest_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The latest row of every offer in ``frame`` (any price frame; normalised first).

    Every decision goes through here: a catalog holding several observations of one offer (a
    trace, a cache refreshed twice, a re-import) must not let an old cheap row win.
    """
    return PriceStore(frame).latest()


def ages_s(observed_at: pd.Series, now: datetime) -> pd.Series:
    """Seconds between each ``observed_at`` and ``now`` (never negative)."""
    return ((pd.Timestamp(utc(now)) - observed_at).dt.total_seconds()).clip(lower=0.0)


@dataclass(frozen=True)
class PriceStore:
    """An immutable table of price observations (see :data:`cloud.records.SCHEMA`)."""

    frame: pd.DataFrame

    def __post_init__(self) -> None:
        object.__setattr__(self, "frame", normalize(self.frame))

    @classmethod
    def empty(cls) -> PriceStore:
        return cls(empty_frame())

    @classmethod
    def from_records(cls, records: Iterable[PriceRecord]) -> PriceStore:
        rows = [r.as_row() for r in records]
        return cls(pd.DataFrame(rows) if rows else empty_frame())

    @classmethod
    def load(cls, path: Path | str) -> PriceStore:
        """Read a cache/snapshot CSV; a missing file is an empty store."""
        p = Path(path)
        if not p.exists():
            return cls.empty()
        if not p.is_file():
            raise CloudInputError(f"{p}: price cache is not a regular file")
        try:
            return cls(normalize(pd.read_csv(p, keep_default_na=False, dtype={"zone": str, "region": str}), str(p)))
        except CloudInputError as exc:
            raise CloudInputError(f"corrupt price cache: {exc}; delete it or run `orchestrator prices refresh`") from None
        except (pd.errors.ParserError, UnicodeDecodeError, EOFError, OSError, ValueError, zlib.error) as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:120]
            raise CloudInputError(f"{p}: corrupt price cache ({type(exc).__name__}: {first}); delete it or run "
                                  "`orchestrator prices refresh`") from None

    def save(self, path: Path | str) -> None:
        write_frame_atomic(self.frame, Path(path))

    def __len__(self) -> int:
        return len(self.frame)

    def merge(self, other: pd.DataFrame | PriceStore) -> PriceStore:
        """Union of both tables; an observation seen twice (overlapping traces) is kept once."""
        more = other.frame if isinstance(other, PriceStore) else normalize(other)
        parts = [f for f in (self.frame, more) if len(f)]
        if not parts:
            return self
        both = pd.concat(parts, ignore_index=True)
        both = both.drop_duplicates(subset=["timestamp", *SERIES_KEY], keep="last")
        return PriceStore(both.sort_values(["timestamp", *SERIES_KEY], kind="stable"))

    def clouds(self) -> set[str]:
        return set(self.frame.cloud)

    def without_cloud(self, cloud: str) -> PriceStore:
        return PriceStore(self.frame[self.frame.cloud != cloud])

    def refresh(
        self,
        source: PriceSource,
        regions: Sequence[str] = (),
        instance_types: Sequence[str] = (),
        now: datetime | None = None,
    ) -> PriceStore:
        """Fetch what is newer than what we hold for ``source``'s cloud; other clouds' rows are untouched.

        Everything is fetched before anything is merged, so a source that fails half-way leaves the
        store (and the cache the caller saves) as it was. Fetched rows are stamped ``observed_at=now``.
        """
        now_t = utc(now) if now else datetime.now(timezone.utc)
        mine = self.frame[self.frame.cloud == source.name]
        start = mine.timestamp.max().to_pydatetime() if len(mine) else None
        fetched = PriceStore.from_records(list(source.fetch(regions, instance_types, start, now_t)))
        stamped = fetched.frame.assign(observed_at=pd.Timestamp(now_t))
        return self.without_cloud(source.name).merge(PriceStore(mine).merge(stamped))

    def overlay(self, base: PriceStore) -> PriceStore:
        """This store, plus ``base``'s rows of every cloud this store has no rows of.

        The bundled snapshot under a cache: refreshing one cloud replaces that cloud's snapshot
        rows and keeps the others, so ``prices cheapest`` still compares all three clouds.
        """
        held = self.clouds()
        return self.merge(base.frame[~base.frame.cloud.isin(sorted(held))])

    def provenance(self) -> list[str]:
        """One line per (cloud, source): how many rows, ESTIMATE or observed, and when observed.

        Estimates that differ only in their fraction (``estimate: 30% of on-demand ...``) share a
        line that gives the range of fractions.
        """
        f = self.frame
        if f.empty:
            return []
        pct = f.source.str.extract(r"^estimate: (\d+)% ", expand=False)
        label = f.source.where(pct.isna(), f.source.str.replace(r"^estimate: \d+% ", "estimate: {pct} ", regex=True))
        lines = []
        for (cloud, text), rows in f.assign(label=label, pct=pct).groupby(["cloud", "label"], sort=True):
            first, last = rows.observed_at.min(), rows.observed_at.max()
            when = f"{first:%Y-%m-%d}" if first.date() == last.date() else f"{first:%Y-%m-%d}..{last:%Y-%m-%d}"
            if is_estimate(str(text)):
                values = sorted({int(v) for v in rows.pct.dropna()})
                span = f"{values[0]}%" if len(values) == 1 else f"{values[0]}-{values[-1]}%"
                lines.append(f"{cloud}: {len(rows)} rows, ESTIMATE {when}, source {str(text).replace('{pct}', span)}")
            else:
                lines.append(f"{cloud}: {len(rows)} rows, observed {when}, source {text}")
        return lines

    def select(
        self,
        gpu: str | None = None,
        count: int | None = None,
        spot: bool | None = None,
        clouds: Sequence[str] = (),
    ) -> PriceStore:
        f = self.frame
        mask = pd.Series(True, index=f.index)
        if gpu is not None:
            from .records import normalize_gpu

            mask &= f.gpu_type == normalize_gpu(gpu)
        if count is not None:
            mask &= f.gpu_count == count
        if spot is not None:
            mask &= f.spot == spot
        if clouds:
            mask &= f.cloud.isin(list(clouds))
        return PriceStore(f[mask])

    def latest(self, at: datetime | pd.Timestamp | None = None) -> pd.DataFrame:
        """Last known price of every offer at ``at`` (all time when None), sorted by price."""
        f = self.frame
        if at is not None:
            f = f[f.timestamp <= pd.Timestamp(at)]
        if f.empty:
            return f
        # ties on ``timestamp`` (a catalog re-imported, a snapshot re-stamped) go to the later read
        last = f.sort_values(["timestamp", "observed_at"], kind="stable").groupby(SERIES_KEY, sort=False).tail(1)
        return last.sort_values(["usd_per_hour", *SERIES_KEY], kind="stable").reset_index(drop=True)

    def offers(self, at: datetime | pd.Timestamp | None = None) -> list[Offer]:
        """:func:`latest` as :class:`Offer` values (rows with no GPU or a zero price dropped)."""
        rows = self.latest(at)
        rows = rows[(rows.gpu_count > 0) & (rows.usd_per_hour > 0)]
        return [offer_of(r) for r in rows.to_dict("records")]

    def grid(self, freq: str = "1h", start: datetime | None = None, end: datetime | None = None) -> pd.DataFrame:
        """Price of every series on a regular time grid (rows: times, columns: series; NaN = unknown).

        A spot price holds until its next change, so values are forward-filled from each series'
        first observation; before it, the offer is treated as unavailable.
        """
        f = self.frame
        if f.empty:
            raise CloudInputError("price store is empty")
        lo = pd.Timestamp(start) if start is not None else f.timestamp.min()
        hi = pd.Timestamp(end) if end is not None else f.timestamp.max()
        index = pd.date_range(lo.floor(freq), hi.ceil(freq), freq=freq)
        wide = f.pivot_table(index="timestamp", columns=SERIES_KEY, values="usd_per_hour", aggfunc="last")
        merged = wide.reindex(wide.index.union(index)).sort_index().ffill()
        return merged.reindex(index)
