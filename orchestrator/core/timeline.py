"""Timelines as Chrome/Perfetto trace JSON and PNG Gantt charts.

The simulator's predicted events and the actors' measured events use the same record shape
(device, label, kind, start, end), so one writer serves both and the two files can be opened side
by side in ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from orchestrator.core.files import figure_output, write_json_atomic, write_outputs

COLORS = {"F": "#4C72B0", "B": "#DD8452", "BI": "#E8A87C", "W": "#937860", "transfer": "#55A868", "all_reduce": "#C44E52", "step": "#8172B3"}


@dataclass(frozen=True, slots=True)
class Span:
    device: int
    label: str
    kind: str
    start: float
    end: float
    link: tuple[int, int] | None = None


def spans_from_events(events: Iterable[object]) -> list[Span]:
    """Adapt simulator events (or anything with the same attributes) to spans."""
    out = []
    for e in events:
        out.append(Span(e.device, e.label, e.kind, e.start, e.end, getattr(e, "link", None)))  # type: ignore[attr-defined]
    return out


def chrome_trace(spans: Sequence[Span], process: str = "pipeline", names: Mapping[int, str] | None = None) -> dict[str, object]:
    """Trace Event Format: compute on one thread per device, transfers on one thread per link.

    ``names``: a device's thread name (a measured trace names the node its actor ran on)."""
    events: list[dict[str, object]] = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": process}}]
    tids: dict[str, int] = {}

    def tid(name: str) -> int:
        if name not in tids:
            tids[name] = len(tids)
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tids[name], "args": {"name": name}})
        return tids[name]

    for s in sorted(spans, key=lambda s: (s.device, s.start)):
        thread = f"link {s.link[0]}->{s.link[1]}" if s.link else (names or {}).get(s.device, f"device {s.device}")
        if s.end <= s.start and s.kind == "transfer":
            continue
        events.append(
            {
                "name": s.label,
                "cat": s.kind,
                "ph": "X",
                "pid": 0,
                "tid": tid(thread),
                "ts": s.start * 1e6,
                "dur": max(0.0, s.end - s.start) * 1e6,
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(spans: Sequence[Span], path: str | Path, process: str = "pipeline",
                       names: Mapping[int, str] | None = None) -> Path:
    out = Path(path)
    write_json_atomic(out, chrome_trace(spans, process, names))
    return out


def write_gantt_png(spans: Sequence[Span], path: str | Path, title: str = "") -> Path:
    """A Gantt chart: one row per device (compute) and per active link (transfers)."""
    return save_figure(gantt_figure(spans, title), path)


def gantt_figure(spans: Sequence[Span], title: str = "") -> Any:
    """The matplotlib figure of :func:`write_gantt_png` (the caller saves and closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: dict[str, int] = {}
    for s in sorted(spans, key=lambda s: (s.link is not None, s.device, s.link or (0, 0))):
        name = f"{s.link[0]}→{s.link[1]}" if s.link else f"dev {s.device}"
        rows.setdefault(name, len(rows))
    fig, ax = plt.subplots(figsize=(12, 0.4 * len(rows) + 1.5))
    for s in spans:
        if s.end <= s.start:
            continue
        name = f"{s.link[0]}→{s.link[1]}" if s.link else f"dev {s.device}"
        ax.barh(rows[name], s.end - s.start, left=s.start, color=COLORS.get(s.kind, "#999999"), edgecolor="black", linewidth=0.2)
    ax.set_yticks(list(rows.values()), list(rows.keys()))
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS.keys()), loc="upper right", fontsize=7)
    fig.tight_layout()
    return fig


def save_figure(fig: object, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure through the one writer (:mod:`orchestrator.core.files`: checked path,
    atomic, usual permissions) and close it."""
    import matplotlib.pyplot as plt

    try:
        return write_outputs([figure_output(path, fig, "figure", dpi)])[0]
    finally:
        plt.close(fig)  # type: ignore[arg-type]
