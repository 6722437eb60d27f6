"""Spot capacity traces for :mod:`benchmarks.spot_goodput`: Parcae's per-minute traces and availability counts.

Why apart: what a trace says (who joins, who leaves, when a notice comes) is data a replay reads; the simulated
cluster and the policies never parse a file. A node's device id is the lowest one free when it joins (ids stay
below the peak number of nodes, whatever the length of the trace), and a notice never comes before the node it
names joined.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, NoReturn

from orchestrator.core.errors import UserError


def fail(message: str) -> NoReturn:
    """Bad input: one line (the caller prints it, exit 2)."""
    raise UserError(message)


@dataclass(frozen=True)
class Event:
    """At ``t`` seconds: ``nodes`` join (``add``), leave (``remove``) or are told they will leave (``notice``,
    ``deadline``); ``shape`` events carry Parcae's (D, P) per strategy for the minute starting at ``t``."""

    t: float
    kind: str
    nodes: tuple[int, ...] = ()
    deadline: float = 0.0
    shapes: tuple[tuple[str, tuple[int, int]], ...] = ()


@dataclass(frozen=True)
class Trace:
    """Node ids ``0..nodes-1``; ``events`` sorted by time; ``minutes`` the available nodes of each minute."""

    name: str
    nodes: int
    gap_s: float
    events: tuple[Event, ...]
    minutes: tuple[frozenset[int], ...]

    @property
    def duration_s(self) -> float:
        return self.gap_s * len(self.minutes)


def parcae_trace(path: Path) -> Trace:
    """One of Parcae's ``trace_<window>.txt``: a JSON array per minute (time, add/remove/no-op, nodes, shapes)."""
    ids: dict[str, int] = {}  # the device id of each node up
    events: list[Event] = []
    minutes: list[frozenset[int]] = []
    peak = 0
    for line in path.read_text().splitlines():
        t_ms, kind, info = json.loads(line)
        t = t_ms / 1000.0
        if kind == "add":
            ids.update(zip(info["nodes"], _free_ids(ids.values(), len(info["nodes"]))))
            events.append(Event(t, "add", tuple(ids[x] for x in info["nodes"])))
        elif kind == "remove":
            events.append(Event(t, "remove", tuple(ids.pop(x) for x in info["nodes"])))
        peak = max(peak, len(ids))
        shapes = tuple((k.removesuffix("_strategy"), (int(v[0]), int(v[1]))) for k, v in info.items() if k.endswith("_strategy"))
        events.append(Event(t, "shape", shapes=shapes))
        minutes.append(frozenset(ids.values()))
    return Trace(f"{path.parent.name}/{path.stem.removeprefix('trace_')}", max(peak, 1), 60.0, tuple(events), tuple(minutes))


def availability_trace(path: Path, limit_nodes: int = 4096, limit_points: int = 10**6, seed: int = 0) -> Trace:
    """``{"metadata": {"gap_seconds": S}, "data": [count, ...]}`` (SkyPilot's spot traces): nodes that leave are drawn
    at random (seeded) among those up, a count of 0 means the run waits."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(f"--availability {path}: not a readable JSON file ({exc.__class__.__name__})")
    gap = raw.get("metadata", {}).get("gap_seconds") if isinstance(raw, dict) and isinstance(raw.get("metadata"), dict) else None
    if not isinstance(gap, (int, float)) or isinstance(gap, bool) or not 0 < gap <= 86400:
        fail(f"--availability {path}: needs metadata.gap_seconds, a number of seconds in (0, 86400]")
    data = raw.get("data")
    if not isinstance(data, list) or not data or len(data) > limit_points:
        fail(f"--availability {path}: needs data, a list of 1 to {limit_points} node counts")
    for k, c in enumerate(data):
        if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c <= limit_nodes:
            fail(f"--availability {path}: data[{k}] = {c!r} is not a node count in 0..{limit_nodes}")
    rng = random.Random(seed)  # which nodes leave: the counts do not say; spot reclaims are not in join order
    events: list[Event] = []
    minutes: list[frozenset[int]] = []
    up: list[int] = []
    for k, c in enumerate(data):
        t = k * float(gap)
        if c > len(up):
            joined = _free_ids(up, c - len(up))
            up += joined
            events.append(Event(t, "add", joined))
        elif c < len(up):
            gone = tuple(sorted(rng.sample(up, len(up) - c)))
            up = [n for n in up if n not in set(gone)]
            events.append(Event(t, "remove", gone))
        minutes.append(frozenset(up))
    return Trace(path.stem, max(max(data), 1), float(gap), tuple(events), tuple(minutes))


def _free_ids(up: Iterable[int], count: int) -> tuple[int, ...]:
    """The ``count`` lowest device ids no node up holds: ids stay below the peak number of nodes (a notice names the
    node that holds the id when it leaves; :func:`with_notices` never sends one before that node joined)."""
    taken = set(up)
    return tuple(itertools.islice((i for i in itertools.count() if i not in taken), count))


def scaled(trace: Trace, factor: int) -> Trace:
    """``factor`` copies of the trace's nodes, each copy doing what the original does (node ``i`` of copy ``k`` is
    ``k·nodes + i``): the same availability shape at ``factor``× the size."""
    if factor == 1:
        return trace
    n = trace.nodes

    def many(nodes: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(k * n + i for k in range(factor) for i in nodes)

    events = tuple(replace(e, nodes=many(e.nodes)) if e.kind != "shape" else
                   replace(e, shapes=tuple((s, (d * factor, p)) for s, (d, p) in e.shapes)) for e in trace.events)
    return Trace(f"{trace.name}x{factor}", n * factor, trace.gap_s, events,
                 tuple(frozenset(many(tuple(m))) for m in trace.minutes))


def with_notices(trace: Trace, notice_s: float) -> Trace:
    """A notice ``notice_s`` before each removal (AWS gives two minutes), but not before its nodes joined."""
    if notice_s <= 0:
        return trace
    joined: dict[int, float] = {}
    told = []
    for e in trace.events:
        if e.kind == "add":
            joined.update((n, e.t) for n in e.nodes)
        elif e.kind == "remove":
            told.append(Event(max(e.t - notice_s, *(joined.get(n, 0.0) for n in e.nodes)), "notice", e.nodes, deadline=e.t))
    return replace(trace, events=tuple(sorted((*trace.events, *told), key=lambda e: (e.t, e.kind != "notice"))))
