"""Turning the workers' per-iteration reports into one measured timeline and link statistics.

Each worker times its actions against its own ``perf_counter`` origin and reports the wall-clock
time of that origin (``t0_wall``); aligning origins puts every device on one time axis (exact on
one node, NTP-accurate across nodes). A transfer is seen from both ends: the sender knows when it
posted ``isend``, the receiver when it posted ``irecv`` and when the data was complete. The
transfer span is ``[max(send posted, recv posted), recv complete]``, which is the time the bytes
could have been moving; it upper-bounds the wire time, so the derived bandwidth is a lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping, Sequence

from orchestrator.schedule.ir import Kind, parse_action
from orchestrator.core.timeline import Span


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    label: str
    bytes: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass(frozen=True)
class WorkerStatus:
    """One worker's answer to :meth:`actors.stage_worker.StageWorker.status` (it is alive and answers)."""

    device: int
    completed_step: int
    blocks: tuple[int, ...]
    """The blocks it holds."""
    pid: int
    left_at: float | None
    """Wall clock when it last began to leave the job's process group (``None``: never)."""


@dataclass(frozen=True)
class WorkerProgress:
    """Where one worker is (:meth:`actors.stage_worker.StageWorker.progress`, for hang triage): the step and action
    running (``None`` between iterations or before it has a plan) and whether that action waits for other workers."""

    device: int
    step: int | None
    at: int | None
    waiting: bool


@dataclass(frozen=True)
class HeldCopies:
    """What one worker holds for a recovery in place (:meth:`actors.stage_worker.StageWorker.host_copies`)."""

    steps: dict[int, list[int]]
    """step -> the blocks it holds a copy of at that step (own, checkpoint or neighbour's)."""
    nbytes: int
    """Bytes of state in those copies."""


@dataclass(frozen=True)
class MoveReply:
    """One worker's side of a live move (:meth:`actors.stage_worker.StageWorker.live_move`)."""

    device: int
    bytes_sent: int
    bytes_received: int
    blocks: tuple[int, ...]
    """The blocks it holds after the move."""
    rejoined: bool
    """The process group was formed anew (the members changed)."""
    groups_created: int
    group_s: float
    transfer_s: float
    pid: int
    finished_at: float
    """Wall-clock time it finished (``time.time()``)."""


@dataclass
class MeasuredIteration:
    """One iteration as measured: per-device spans, transfers, bubbles and memory."""

    step: int
    iteration_s: float
    loss: float
    spans: list[Span] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    busy_s: dict[int, float] = field(default_factory=dict)
    bubble_s: dict[int, float] = field(default_factory=dict)
    peak_memory_bytes: dict[int, int] = field(default_factory=dict)
    memory_metric: str = ""
    maxrss_bytes: dict[int, int] = field(default_factory=dict)
    cpu_s: dict[int, float] = field(default_factory=dict)  # main-thread CPU seconds of the iteration, per device
    span_s: float = 0.0  # the iteration's length on the actors' aligned timeline (what bubble_s is measured against)
    device_s: dict[int, float] = field(default_factory=dict)  # each device's own first-to-last-action time
    wait_s: dict[int, float] = field(default_factory=dict)  # time each device was blocked on receives
    actions: dict[int, int] = field(default_factory=dict)  # program length per device
    rows: int = 0  # samples in the step's batch (0: not reported)
    lr: float | None = None  # the first block optimizer's learning rate during the step

    @property
    def overhead_s(self) -> dict[int, float]:
        """Per device: its own iteration time neither computing nor blocked on a receive, i.e. the
        runtime's per-action work (handlers, posting sends and receives, bookkeeping) and the
        scheduler's delays. Divided by ``actions`` it is the per-action overhead term of the cost
        model (``benchmarks/runtime_quick.py``)."""
        return {d: max(0.0, t - self.busy_s.get(d, 0.0) - self.wait_s.get(d, 0.0)) for d, t in self.device_s.items()}

    @property
    def bubble_fraction(self) -> dict[int, float]:
        """Idle share of each device's iteration, on the actors' own timeline (``span_s``).

        Not divided by the driver's ``iteration_s``: with pipelined dispatch that is the time between
        two completions, a different time base from the bubbles, and the ratio could leave [0, 1].
        """
        base = self.span_s if self.span_s > 0 else self.iteration_s
        return {d: b / base if base > 0 else 0.0 for d, b in self.bubble_s.items()}

    def link_bandwidth(self) -> dict[tuple[int, int], float]:
        """Observed bytes/second per directed link (a lower bound, see module docstring)."""
        acc: dict[tuple[int, int], list[float]] = {}
        for t in self.transfers:
            tot = acc.setdefault((t.src, t.dst), [0.0, 0.0])
            tot[0] += t.bytes
            tot[1] += t.seconds
        return {link: (b / s if s > 0 else float("inf")) for link, (b, s) in acc.items()}

    def timeline(self) -> list[Span]:
        """Compute spans plus transfer spans on their links, for :mod:`orchestrator.core.timeline`."""
        return self.spans + [Span(t.src, t.label, "transfer", t.start, t.end, (t.src, t.dst)) for t in self.transfers]

    def summary(self) -> dict[str, Any]:
        fr = self.bubble_fraction
        return {
            "step": self.step, "loss": self.loss, "iteration_s": self.iteration_s,
            "mean_bubble_fraction": sum(fr.values()) / len(fr) if fr else 0.0,
            "max_peak_memory_bytes": max(self.peak_memory_bytes.values(), default=0),
            "bytes_sent": sum(t.bytes for t in self.transfers),
        }


@lru_cache(maxsize=65536)  # the same labels recur every iteration; parsing them is most of combine()
def _transfer_key(label: str, device: int, sending: bool) -> tuple[str, int, int, int, int, int]:
    a = parse_action(label)
    forward = a.kind in (Kind.SEND_F, Kind.RECV_F)
    if sending:
        return ("F" if forward else "B", a.stage, a.microbatch, a.part, device, a.peer)
    stage = a.stage - 1 if forward else a.stage + 1
    return ("F" if forward else "B", stage, a.microbatch, a.part, a.peer, device)


def combine(reports: Sequence[Mapping[str, Any]], wall_s: float | None = None) -> MeasuredIteration:
    """Merge the workers' reports of one iteration (see :meth:`actors.execution.Executor.run`)."""
    origin = min(float(r["t0_wall"]) for r in reports)
    offset = {int(r["device"]): float(r["t0_wall"]) - origin for r in reports}
    spans: list[Span] = []
    posted: dict[tuple[str, int, int, int, int, int], float] = {}
    for r in reports:
        d, off = int(r["device"]), offset[int(r["device"])]
        spans += [Span(d, label, kind, s + off, e + off) for label, kind, s, e in r["spans"]]
        for label, _peer, _nbytes, post in r["sends"]:
            posted[_transfer_key(label, d, True)] = post + off
    transfers = []
    for r in reports:
        d, off = int(r["device"]), offset[int(r["device"])]
        for label, _peer, nbytes, post, _wait, done in r["recvs"]:
            key = _transfer_key(label, d, False)
            start = max(post + off, posted.get(key, post + off))
            transfers.append(Transfer(key[4], d, label, int(nbytes), start, max(start, done + off)))
    iteration = max(float(r["iteration_s"]) + offset[int(r["device"])] for r in reports)
    losses = [float(r["loss"]) for r in reports if r.get("loss") is not None]
    rates = sorted(tuple(r["lr"]) for r in reports if r.get("lr") is not None)
    rows = [int(r["rows"]) for r in reports if r.get("rows") is not None]
    return MeasuredIteration(
        step=int(reports[0]["step"]),
        iteration_s=wall_s if wall_s is not None else iteration,
        loss=sum(losses),
        spans=spans,
        transfers=transfers,
        busy_s={int(r["device"]): float(r["busy_s"]) for r in reports},
        bubble_s={int(r["device"]): max(0.0, iteration - float(r["busy_s"])) for r in reports},
        peak_memory_bytes={int(r["device"]): int(r["peak_memory_bytes"]) for r in reports},
        memory_metric=str(reports[0]["memory_metric"]),
        maxrss_bytes={int(r["device"]): int(r["maxrss_bytes"]) for r in reports},
        cpu_s={int(r["device"]): float(r["cpu_s"]) for r in reports if "cpu_s" in r},
        span_s=iteration,
        device_s={int(r["device"]): float(r["iteration_s"]) for r in reports},
        wait_s={int(r["device"]): float(r["wait_s"]) for r in reports if "wait_s" in r},
        actions={int(r["device"]): int(r["actions"]) for r in reports if "actions" in r},
        rows=rows[0] if rows else 0,
        lr=float(rates[0][1]) if rates else None,
    )


def combine_run(runs: Sequence[Sequence[Mapping[str, Any]]], wall_s: float) -> list[MeasuredIteration]:
    """Per-step metrics of one run of consecutive steps (``runs[device][i]``: that device's report
    of the run's ``i``-th step). ``wall_s``, the driver's time for the whole run, is split: every
    step after the first gets the time between its completion and the previous one's on the
    workers' clocks (completion: the last device to finish), the first gets the rest."""
    n = len(runs[0])
    ends = [max(float(r[i]["t0_wall"]) + float(r[i]["iteration_s"]) for r in runs) for i in range(n)]
    later = [max(0.0, b - a) for a, b in zip(ends, ends[1:])]
    first = max(wall_s - sum(later), 0.0)
    return [combine([r[i] for r in runs], w) for i, w in enumerate([first, *later])]
