"""What :meth:`PipelineTrainer.fit` and :meth:`ElasticJob.fit` return (one type), and an iteration in flight.

Apart from the trainer so that the trainer module stays about the trainer's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.metrics import MeasuredIteration
from orchestrator.core.plan import Plan
from orchestrator.core.timeline import write_chrome_trace


@dataclass(frozen=True)
class InFlight:
    """A submitted iteration: its step, the workers' result refs and when it was submitted."""

    step: int
    refs: list[Any]
    devices: list[int]
    submitted: float
    count: int = 1
    """Consecutive steps the call runs back to back (the workers' ``run_iterations``)."""


@dataclass
class JobResult:
    """What one ``fit`` did — :meth:`ElasticJob.fit <orchestrator.elastic.job_loop.ElasticJob.fit>` and
    :meth:`PipelineTrainer.fit <orchestrator.train.trainer.PipelineTrainer.fit>` alike: the step reached,
    the loss of every step it trained, the plan at the end, events and counts, and the measured iterations."""

    step: int
    """The step training reached (steps done), as ``runtime.step``: ``fit(N)`` trains to step ``N``."""
    losses: dict[int, float]
    """Step index -> loss, for the steps this ``fit`` trained."""
    plan: Plan
    events: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    moves: int = 0
    restarts: int = 0
    metrics: list[MeasuredIteration] = field(default_factory=list)
    """The measured iterations of this ``fit``, in order (at most the last :data:`KEPT_METRICS`)."""
    checkpoints: list[str] = field(default_factory=list)
    """Where the checkpoints this ``fit`` wrote went."""
    device_nodes: dict[int, str] = field(default_factory=dict)  # device -> Ray node id its actor runs on

    @property
    def final_loss(self) -> float:
        return self.losses[max(self.losses)] if self.losses else float("nan")

    @property
    def mean_iteration_s(self) -> float:
        """Mean wall time per iteration, skipping the first (warm-up) when there are several."""
        times = [m.iteration_s for m in self.metrics]
        times = times[1:] if len(times) > 2 else times
        return sum(times) / len(times) if times else float("nan")

    def write_timeline(self, path: str | Path, index: int = -1) -> Path:
        """The measured iteration ``index`` as a Chrome trace (same format as the simulator's)."""
        names = {d: f"device {d} @ node {node[:8]}" for d, node in self.device_nodes.items()}
        return write_chrome_trace(self.metrics[index].timeline(), path, process="measured", names=names)


KEPT_METRICS = 1024
"""A result keeps the measured iterations of at most this many steps (each holds every action's span)."""


__all__ = ["InFlight", "JobResult", "KEPT_METRICS"]
