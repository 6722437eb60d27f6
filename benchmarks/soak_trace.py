"""The soak's ``--trace`` schedule: losses and joins of two spot offers from the thesis's availability logs.

Why real logs: the seeded soak draws one fault every ``--every`` steps, evenly; real spot capacity comes and goes in
bursts (a zone loses all its instances within minutes, then nothing for hours). The logs of training_on_a_dime
(``logs/{aws,gcp}/availability/*.out``, read by :func:`cloud.availability.load_availability`) say, per offer
(cloud, zone, GPU type, GPU count), when an instance ran, was taken away without notice, or could not be had.

Each of the soak's two worker nodes stands for one offer — the two offers preempted most often — and follows it: a
``preempted`` event removes the node (a loss without notice), the next ``up`` event of that offer adds a node back (a
join). The window from the first to the last such event is compressed onto the run's steps, and each event lands at
the chunk boundary (a multiple of ``every``) after it: the soak acts between chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd


@dataclass(frozen=True)
class TraceEvent:
    """At step ``step``: the worker node standing for offer ``slot`` (0 or 1) is lost (``loss``) or added (``join``);
    ``offer`` names it, ``at`` is the log's time."""

    step: int
    kind: str
    slot: int
    offer: str
    at: str


def offers(events: pd.DataFrame, count: int = 2) -> list[tuple[str, str, str, int]]:
    """The ``count`` offers with the most preemptions (ties: the earlier first preemption)."""
    lost = events[events.kind == "preempted"]
    ranked = lost.groupby(["cloud", "zone", "gpu_type", "gpu_count"]).at.agg(["count", "min"]).reset_index()
    ranked = ranked.sort_values(["count", "min"], ascending=[False, True], kind="stable")
    return [(str(r.cloud), str(r.zone), str(r.gpu_type), int(r.gpu_count)) for r in ranked.head(count).itertuples()]


def transitions(events: pd.DataFrame, keys: Sequence[tuple[str, str, str, int]]) -> list[tuple[pd.Timestamp, str, int]]:
    """``(time, "loss" | "join", slot)``: each offer's preemptions, and its first ``up`` after each (one node per
    offer: a second loss before the node came back is no change)."""
    out: list[tuple[pd.Timestamp, str, int]] = []
    for slot, key in enumerate(keys):
        rows = events[(events.cloud == key[0]) & (events.zone == key[1]) & (events.gpu_type == key[2]) & (events.gpu_count == key[3])]
        present = True
        for row in rows.sort_values("at", kind="stable").itertuples():
            if row.kind == "preempted" and present:
                out.append((row.at, "loss", slot))
                present = False
            elif row.kind == "up" and not present:
                out.append((row.at, "join", slot))
                present = True
    return sorted(out, key=lambda t: (t[0], t[2]))


def trace_schedule(events: pd.DataFrame, steps: int, every: int) -> list[TraceEvent]:
    """The two offers' first losses and joins, about one per chunk (the logs hold hundreds over days: the window is
    the first that many), their times compressed onto the chunk boundaries ``every .. steps - every``. The soak acts
    between chunks, so each chunk replays its net effect per node: lost if it was lost in it, then back if it ended up."""
    keys = offers(events)
    bounds = max(1, steps // every - 1)  # boundaries every, 2*every, ..., strictly before the end
    found = transitions(events, keys)[:bounds]
    if not found:
        return []
    first, last = found[0][0], found[-1][0]
    span = max((last - first).total_seconds(), 1.0)
    names = [f"{c}/{z or '-'}/{g}x{n}" for c, z, g, n in keys]
    chunks: dict[tuple[int, int], list[tuple[pd.Timestamp, str]]] = {}
    for t, kind, slot in found:
        step = every * (1 + min(bounds - 1, int((t - first).total_seconds() / span * bounds)))
        chunks.setdefault((step, slot), []).append((t, kind))
    out: list[TraceEvent] = []
    for (step, slot), changes in chunks.items():  # the chunk's net effect: lost if ever lost, back if back at its end
        lost = [t for t, kind in changes if kind == "loss"]
        if lost:
            out.append(TraceEvent(step, "loss", slot, names[slot], lost[0].isoformat()))
        if changes[-1][1] == "join":
            out.append(TraceEvent(step, "join", slot, names[slot], changes[-1][0].isoformat()))
    return sorted(out, key=lambda e: (e.step, e.kind != "loss", e.slot))


def compression(events: Sequence[TraceEvent], steps: int, iteration_s: float) -> float:
    """How many times faster than the log the run replays it (log seconds per run second, at ``iteration_s``)."""
    if len(events) < 2:
        return 1.0
    span = (pd.Timestamp(events[-1].at) - pd.Timestamp(events[0].at)).total_seconds()
    return span / max(steps * iteration_s, 1e-9)
