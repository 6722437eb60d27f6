"""Spot availability: what the thesis's availability logs (and a job's own notices) say about an offer.

Why: a spot offer preempted every hour is not the bargain its price says. The logs
(``logs/{aws,gcp}/availability/*.out`` of training_on_a_dime) record, per (cloud, zone, GPU type,
GPU count), when an instance came up, when creating one failed and when a running one was taken
away. From them we learn, per offer, a **preemption rate** (a Gamma posterior over preemptions per
hour of exposure, so an offer watched for ten minutes is not "never preempted") and a
**time to obtain** (how long the offer stays unobtainable after it is lost), only from events before
a given clock, so a replay never peeks at its own future.

The same :class:`AvailabilityModel` takes a job's own observations (:meth:`with_events`: a
notice, a loss, a failed creation), so the policy a job asks and the one the replay measures learn
from the same kind of event.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .errors import CloudInputError
from .records import normalize_gpu

#: One availability key: (cloud, zone, GPU type, GPU count). A zone-less AWS failure has zone "".
Key = tuple[str, str, str, int]
EVENT_COLUMNS = ("at", "cloud", "zone", "gpu_type", "gpu_count", "kind", "where")
KINDS = ("up", "preempted", "failed")
#: The logs poll every 10-15 minutes; a key not seen for longer than this is no longer watched.
UNWATCHED = pd.Timedelta("1h")

_STAMP = r"\[(\d{4}-\d{2}-\d{2}T[\d:.]+Z)\] "
_CREATED = re.compile(_STAMP + r"Created instance (\S+) with (\d+) GPU\(s\) of type (\S+) in zone (\S+)$")
_RUNNING = re.compile(_STAMP + r"Instance (\S+) running in zone (\S+)$")
_NOT_RUNNING = re.compile(_STAMP + r"Instance (\S+) not running in zone (\S+)$")
_FAILED_NAMED = re.compile(_STAMP + r"Instance (\S+) creation failed$")
_FAILED_TYPED = re.compile(_STAMP + r"Instance with (\d+) GPU\(s\) of type (\S+) creation failed$")
_DELETED = re.compile(_STAMP + r"Successfully deleted instance (\S+)$")


def _cloud_of(path: Path, zone: str) -> str:
    for part in reversed(path.parts[:-1]):
        if part.lower() in ("aws", "gcp", "azure"):
            return part.lower()
    return "aws" if re.fullmatch(r"[a-z]{2}-[a-z]+-\d[a-z]", zone) else "gcp"


def parse_log(path: Path) -> pd.DataFrame:
    """One availability log as events (``EVENT_COLUMNS``); a line that is none of the six known
    kinds is a :class:`CloudInputError` naming the file and the line.

    ``up``: an instance of the key is running (created, or seen running). ``preempted``: one that
    was running is not any more. ``failed``: creating one failed (AWS's lines name no zone: ``zone``
    is "" and the failure counts for every zone of that GPU type and count).
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CloudInputError(f"{path}: unreadable availability log ({type(exc).__name__})") from None
    names: dict[str, tuple[str, str, int]] = {}  # instance name -> (zone, gpu, count); GCP reuses names per config
    for line in lines:
        m = _CREATED.match(line.strip())
        if m:
            names[m.group(2)] = (m.group(5), normalize_gpu(m.group(4).replace("nvidia-tesla-", "")), int(m.group(3)))
    rows: list[tuple[object, ...]] = []
    running: dict[str, bool] = {}
    for number, raw in enumerate(lines, start=1):
        line, where = raw.strip(), f"{path}:{number}"
        if not line:
            continue
        if m := _CREATED.match(line):
            zone, gpu, count = names[m.group(2)]
            running[m.group(2)] = True
            rows.append((m.group(1), zone, gpu, count, "up", where))
        elif m := _RUNNING.match(line):
            known = names.get(m.group(2))
            if known is not None:
                running[m.group(2)] = True
                rows.append((m.group(1), known[0], known[1], known[2], "up", where))
        elif m := _NOT_RUNNING.match(line):
            known = names.get(m.group(2))
            if known is not None and running.get(m.group(2)):
                rows.append((m.group(1), known[0], known[1], known[2], "preempted", where))
            running[m.group(2)] = False
        elif m := _FAILED_NAMED.match(line):
            known = names.get(m.group(2))
            if known is not None:
                rows.append((m.group(1), known[0], known[1], known[2], "failed", where))
            running[m.group(2)] = False
        elif m := _FAILED_TYPED.match(line):
            rows.append((m.group(1), "", normalize_gpu(m.group(3).replace("nvidia-tesla-", "")), int(m.group(2)), "failed", where))
        elif _DELETED.match(line):
            continue
        else:
            raise CloudInputError(f"{where}: not an availability log line: {line[:80]!r}")
    frame = pd.DataFrame(rows, columns=["at", "zone", "gpu_type", "gpu_count", "kind", "where"])
    if frame.empty:
        return empty_events()
    cloud = _cloud_of(path, str(frame.zone[frame.zone != ""].iloc[0]) if (frame.zone != "").any() else "")
    frame.insert(1, "cloud", cloud)
    frame["at"] = pd.to_datetime(frame["at"], utc=True)
    return frame.loc[:, list(EVENT_COLUMNS)]


def empty_events() -> pd.DataFrame:
    frame = pd.DataFrame({c: [] for c in EVENT_COLUMNS})
    frame["at"] = pd.to_datetime(frame["at"], utc=True)
    return frame


def load_availability(path: Path | str) -> pd.DataFrame:
    """A log file, or every ``*.out`` under an ``availability`` folder below ``path``, as events."""
    p = Path(path)
    if not p.exists():
        raise CloudInputError(f"{p}: no such availability log or folder")
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(q for q in p.rglob("*.out") if q.is_file() and "availability" in q.parts)
    else:
        raise CloudInputError(f"{p}: not a regular file or folder")
    if not files:
        raise CloudInputError(f"{p}: no availability logs (*.out under an availability/ folder)")
    frames = [f for f in (parse_log(q) for q in files) if len(f)]
    if not frames:
        raise CloudInputError(f"{p}: the availability logs hold no event")
    return pd.concat(frames, ignore_index=True).sort_values("at", kind="stable").reset_index(drop=True)


@dataclass(frozen=True, slots=True)
class OfferAvailability:
    """What is known of one key at a clock: preemptions per hour (posterior mean and standard
    deviation), hours watched, and the expected hours to obtain it again after losing it."""

    key: Key
    preemptions: int
    exposure_h: float
    rate_per_h: float
    rate_sd_per_h: float
    time_to_obtain_h: float
    obtainable: bool


@dataclass(frozen=True)
class AvailabilityModel:
    """Per-key estimates learned from events strictly before ``clock``.

    Preemption rate: Gamma(``prior_preemptions`` + k, ``prior_hours`` + exposure) — the prior is one
    preemption per ``prior_hours / prior_preemptions`` hours, weighed like that many hours of
    watching. Time to obtain: the mean of observed outages (lost or failed until up again), shrunk
    towards ``prior_obtain_h`` with the weight of one outage.
    """

    events: pd.DataFrame
    clock: pd.Timestamp
    prior_preemptions: float = 0.5
    prior_hours: float = 12.0
    prior_obtain_h: float = 0.5
    estimates: Mapping[Key, OfferAvailability] = field(init=False)

    def __post_init__(self) -> None:
        if self.prior_preemptions <= 0 or self.prior_hours <= 0 or self.prior_obtain_h < 0:
            raise CloudInputError("availability prior: preemptions and hours must be > 0")
        seen = self.events[self.events["at"] < self.clock]
        object.__setattr__(self, "estimates", {k: self._estimate(k, g) for k, g in _by_key(seen).items()})

    def _estimate(self, key: Key, rows: pd.DataFrame) -> OfferAvailability:
        up_since: pd.Timestamp | None = None
        down_since: pd.Timestamp | None = None
        exposure, outages, k = 0.0, [], 0
        last_up: pd.Timestamp | None = None
        for at, kind in zip(rows["at"], rows["kind"]):
            if kind == "up":
                if down_since is not None:
                    outages.append((at - down_since).total_seconds() / 3600)
                    down_since = None
                if up_since is None:
                    up_since = at
                last_up = at
            else:
                if up_since is not None and kind == "preempted":
                    exposure += (at - up_since).total_seconds() / 3600
                    k += 1
                up_since = None
                down_since = at if down_since is None else down_since
        if up_since is not None and last_up is not None:  # watched up to its last sighting, not beyond
            exposure += (last_up - up_since).total_seconds() / 3600
        a, b = self.prior_preemptions + k, self.prior_hours + exposure
        obtain = (sum(outages) + self.prior_obtain_h) / (len(outages) + 1)
        return OfferAvailability(key, k, round(exposure, 3), a / b, math.sqrt(a) / b, obtain, down_since is None)

    def get(self, key: Key) -> OfferAvailability | None:
        """The estimate of ``key``; a zone's own estimate, else the zone-less one (AWS failures)."""
        return self.estimates.get(key) or self.estimates.get((key[0], "", key[2], key[3]))

    def with_events(self, more: pd.DataFrame | Iterable[tuple[object, ...]], clock: pd.Timestamp) -> AvailabilityModel:
        """This model plus a job's own observations (rows of ``EVENT_COLUMNS``), at a later clock."""
        extra = more if isinstance(more, pd.DataFrame) else pd.DataFrame(list(more), columns=list(EVENT_COLUMNS))
        extra = extra.assign(at=pd.to_datetime(extra["at"], utc=True))
        both = pd.concat([self.events, extra], ignore_index=True).sort_values("at", kind="stable")
        return AvailabilityModel(both, clock, self.prior_preemptions, self.prior_hours, self.prior_obtain_h)

    def rates(self) -> dict[Key, float]:
        """Posterior mean preemptions per hour per key (``MigrationCosts.preemptions_per_hour``)."""
        return {k: e.rate_per_h for k, e in self.estimates.items()}


def _by_key(events: pd.DataFrame) -> dict[Key, pd.DataFrame]:
    out: dict[Key, pd.DataFrame] = {}
    for name, rows in events.groupby(["cloud", "zone", "gpu_type", "gpu_count"], sort=True):
        cloud, zone, gpu, count = name  # type: ignore[misc]
        out[(str(cloud), str(zone), str(gpu), int(str(count)))] = rows
    return out


def observed_truth(events: pd.DataFrame, times: pd.DatetimeIndex, keys: list[Key]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What happened, for a replay: ``obtainable[t, key]`` (the key's latest event at or before each
    time is ``up``; a zone-less failure counts for the zones of its GPU type and count that are
    not up) and ``preempted[t, key]`` (a preemption in ``(times[t-1], times[t]]``)."""
    obtainable = pd.DataFrame(False, index=times, columns=range(len(keys)))
    preempted = pd.DataFrame(False, index=times, columns=range(len(keys)))
    for j, key in enumerate(keys):
        own = events[(events.cloud == key[0]) & (events.zone == key[1]) & (events.gpu_type == key[2]) & (events.gpu_count == key[3])]
        zoneless = events[(events.cloud == key[0]) & (events.zone == "") & (events.gpu_type == key[2]) & (events.gpu_count == key[3])]
        state = pd.concat([own, zoneless]).sort_values("at", kind="stable")
        if state.empty:
            continue
        up = pd.Series((state.kind == "up").to_numpy(), index=pd.DatetimeIndex(state["at"]))
        up = up[~up.index.duplicated(keep="last")]
        seen = up.reindex(up.index.union(times)).ffill().reindex(times).fillna(False).astype(bool).to_numpy()
        # a key nobody watched for an hour is not known to be obtainable
        obtainable[j] = seen & (times <= up.index.max() + UNWATCHED)
        hits = own["at"][own.kind == "preempted"]
        slot = times.searchsorted(pd.DatetimeIndex(hits), side="left")
        for s in slot[slot < len(times)]:
            preempted.iat[int(s), j] = True
    return obtainable, preempted
