"""Trackers as callbacks: per-step scalars written with the tracker's own library.

``ElasticJob(..., callbacks=[orchestrator.sinks.TensorBoard("runs/tb")])`` (or ``--tensorboard DIR`` on a driver
built with :func:`~orchestrator.cli.driver_args.add_job_arguments`) writes, by step: ``train/loss``,
``train/lr``, ``train/samples_per_s``, ``eval/loss`` (at each evaluation), ``run/moves``, ``run/recoveries``,
``run/stall_s`` (seconds of recoveries so far), ``cost/usd_per_hour`` and ``cost/usd_total``. The writer is made on
the driver when the run starts (a sink is configuration until then) and flushed at every evaluation and when the run
ends, however it ends. A missing library is one line naming what to install.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.errors import UserError
from orchestrator.elastic.callbacks import Callback, StartInfo, StepInfo

FLUSH_EVENTS = ("eval", "stopped", "job_finished", "job_failed", "user_error", "migration_requested")


class TensorBoard(Callback):
    """TensorBoard event files under ``log_dir`` (``torch.utils.tensorboard.SummaryWriter``)."""

    def __init__(self, log_dir: str) -> None:
        try:
            import tensorboard  # noqa: F401  # SummaryWriter's own dependency
        except ImportError:
            raise UserError("the TensorBoard sink needs the tensorboard package: pip install tensorboard") from None
        self.log_dir = str(log_dir)
        self._writer: Any = None
        self._stall_s = 0.0

    def on_start(self, info: StartInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if self._writer is None:
            self._writer = SummaryWriter(self.log_dir, flush_secs=10)

    def on_step_end(self, info: StepInfo) -> None:
        w = self._writer
        w.add_scalar("train/loss", info.loss, info.step)
        if info.lr is not None:
            w.add_scalar("train/lr", info.lr, info.step)
        w.add_scalar("train/samples_per_s", info.samples_per_s, info.step)
        w.add_scalar("run/moves", info.moves, info.step)
        w.add_scalar("run/recoveries", info.failures, info.step)
        w.add_scalar("run/stall_s", self._stall_s, info.step)
        if info.usd_per_hour is not None:
            w.add_scalar("cost/usd_per_hour", info.usd_per_hour, info.step)
        if info.usd_total is not None:
            w.add_scalar("cost/usd_total", info.usd_total, info.step)
        return None

    def on_event(self, event: dict[str, Any]) -> None:
        name = event.get("event")
        if name == "recovered":
            self._stall_s += float(event.get("stall_s") or 0.0)
        if self._writer is None:
            return
        if name == "eval":
            self._writer.add_scalar("eval/loss", float(event["loss"]), int(event["step"]))
        if name in FLUSH_EVENTS:
            self._writer.flush()

    def on_end(self, result: Any) -> None:
        if self._writer is not None:
            self._writer.flush()


__all__ = ["TensorBoard"]
