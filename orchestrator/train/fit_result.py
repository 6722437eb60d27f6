"""What :meth:`PipelineTrainer.fit` and :meth:`ElasticJob.fit` return, and an iteration in flight.

Apart from the trainer so that the trainer module stays about the trainer's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.metrics import MeasuredIteration
from orchestrator.core.plan import Plan
from orchestrator.core.timeline import write_chrome_trace


@dataclass
class FitResult:
    """What ``fit`` did: per-step loss and measured metrics, restarts and checkpoints written."""

    steps: list[int]
    """The steps this ``fit`` trained (the indices of ``losses``)."""
    losses: list[float]
    metrics: list[MeasuredIteration]
    plan: Plan
    restarts: int = 0
    checkpoints: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    device_nodes: dict[int, str] = field(default_factory=dict)  # device -> Ray node id its actor runs on

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else float("nan")

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
    """What one ``fit`` did: the step reached, losses per step, the plan at the end, events and counts."""

    step: int
    """The step training reached (steps done), as ``runtime.step``: ``fit(N)`` trains to step ``N``."""
    losses: dict[int, float]
    plan: Plan
    events: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    moves: int = 0
    restarts: int = 0

    @property
    def final_loss(self) -> float:
        return self.losses[max(self.losses)] if self.losses else float("nan")


__all__ = ["FitResult", "InFlight", "JobResult"]
