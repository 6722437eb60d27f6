"""Trackers as callbacks: per-step scalars written with the tracker's own library.

``ElasticJob(..., callbacks=[orchestrator.sinks.TensorBoard("runs/tb")])`` (or ``--tensorboard DIR``,
``--mlflow URI``, ``--wandb-offline DIR`` on a driver built with
:func:`~orchestrator.cli.driver_args.add_job_arguments`) writes, by step: ``train/loss``, ``train/lr``,
``train/samples_per_s``, ``eval/loss`` (at each evaluation), ``run/moves``, ``run/recoveries``, ``run/stall_s``
(seconds of recoveries so far), ``cost/usd_per_hour`` and ``cost/usd_total``. :class:`Sink` owns that set and when
it is written; each tracker says only how (open, write, flush, end). A sink is configuration until the run starts:
its writer is made on the driver in ``on_start``, flushed at every evaluation and when the run ends, however it
ends. A missing library is one line naming what to install.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import time
from typing import Any, Literal

from orchestrator.core.errors import UserError
from orchestrator.train.callbacks import Callback, StartInfo, StepInfo

FLUSH_EVENTS = ("eval", "stopped", "job_finished", "job_failed", "user_error", "migration_requested")
Status = Literal["FINISHED", "FAILED", "KILLED"]


def _need(module: str, sink: str, install: str) -> None:
    """One line naming what to install when ``module`` is missing (found without importing it: importing a tracker
    takes a second, and a sink is made while the driver parses its flags)."""
    if importlib.util.find_spec(module) is None:
        raise UserError(f"the {sink} sink needs the {module} package: pip install {install}")


def scalars(info: StepInfo, stall_s: float) -> dict[str, float]:
    """The scalars of one step, by the tracker's name (a value the job does not know is left out)."""
    values: dict[str, float | None] = {
        "train/loss": info.loss, "train/lr": info.lr, "train/samples_per_s": info.samples_per_s,
        "run/moves": info.moves, "run/recoveries": info.failures, "run/stall_s": stall_s,
        "cost/usd_per_hour": info.usd_per_hour, "cost/usd_total": info.usd_total}
    return {k: float(v) for k, v in values.items() if v is not None}


def _ident(run_id: str) -> str:
    """The run id as a tracker's id: W&B ids and MLflow filter strings take letters, digits, ``_ . -``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)


class Sink(Callback):
    """The scalars every tracker writes, and when (see the module docstring); a tracker overrides the four hooks."""

    def __init__(self) -> None:
        self._stall_s = 0.0
        self._opened = False

    # ----- what a tracker says: how -----
    def open(self, info: StartInfo) -> None:
        """Make the writer (on the driver, when the run starts)."""

    def write(self, values: dict[str, float], step: int) -> None:
        """Record ``values`` at ``step``."""

    def flush(self) -> None:
        """Make what was written readable now."""

    def end(self, status: Status) -> None:
        """The fit ended: returned (``FINISHED``), on an error (``FAILED``) or stopped by a signal or for a
        migration, to be resumed (``KILLED``); a later ``fit`` opens again."""

    # ----- the callback: when -----
    def on_start(self, info: StartInfo) -> None:
        if not self._opened:
            self.open(info)
            self._opened = True

    def on_step_end(self, info: StepInfo) -> None:
        self.write(scalars(info, self._stall_s), info.step)
        return None

    def on_event(self, event: dict[str, Any]) -> None:
        name = event.get("event")
        if name == "recovered":
            self._stall_s += float(event.get("stall_s") or 0.0)
        if not self._opened:
            return
        if name == "eval":
            self.write({"eval/loss": float(event["loss"])}, int(event["step"]))
        if name in FLUSH_EVENTS:
            self.flush()
        if name in ("job_failed", "user_error"):
            self._end("FAILED")
        elif name == "migration_requested" or (name == "stopped" and "signal" in event):  # fit raises, to resume later
            self._end("KILLED")

    def on_end(self, result: Any) -> None:
        if self._opened:
            self.flush()
            self._end("FINISHED")

    def _end(self, status: Status) -> None:
        self._opened = False
        self.end(status)


class TensorBoard(Sink):
    """TensorBoard event files under ``log_dir`` (``torch.utils.tensorboard.SummaryWriter``)."""

    def __init__(self, log_dir: str) -> None:
        _need("tensorboard", "TensorBoard", "tensorboard")  # SummaryWriter's own dependency
        super().__init__()
        self.log_dir = str(log_dir)
        self._writer: Any = None

    def open(self, info: StartInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if self._writer is None:
            self._writer = SummaryWriter(self.log_dir, flush_secs=10)

    def write(self, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self._writer.add_scalar(name, value, step)

    def flush(self) -> None:
        self._writer.flush()


class MLflow(Sink):
    """An MLflow run in ``experiment`` at ``tracking_uri`` (``mlflow.MlflowClient``): a local store is
    ``sqlite:///PATH.db``, a server ``http://HOST:5000``. The job's run is one MLflow run, tagged
    ``raypipe.run_id``: a resumed job logs on into it. Its status is ``FINISHED`` when a ``fit`` returns, ``FAILED``
    when the run fails, ``KILLED`` when a signal or a migration stops the job (until a resumed job reopens it)."""

    RUN_TAG = "raypipe.run_id"

    def __init__(self, tracking_uri: str, experiment: str = "raypipe") -> None:
        _need("mlflow", "MLflow", "mlflow-skinny")
        uri = str(tracking_uri)
        scheme = uri.split(":", 1)[0] if ":" in uri else ""
        if (scheme in ("", "file") or len(scheme) == 1) and not os.environ.get("MLFLOW_ALLOW_FILE_STORE"):
            raise UserError(f"MLflow tracking URI {uri!r}: MLflow 3 keeps a local store in a database, not in a folder "
                            "(its file store is retired): use sqlite:///PATH/mlflow.db")
        if scheme == "sqlite" and not all(importlib.util.find_spec(m) for m in ("sqlalchemy", "alembic")):
            raise UserError("the MLflow sink's sqlite store needs the sqlalchemy and alembic packages: pip install sqlalchemy alembic")
        super().__init__()
        self.tracking_uri, self.experiment = uri, str(experiment)
        self._client: Any = None
        self._run: str | None = None

    def open(self, info: StartInfo) -> None:
        from mlflow import MlflowClient

        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "creating tables": not an error
        client = self._client = MlflowClient(self.tracking_uri)
        found = client.get_experiment_by_name(self.experiment)
        experiment = found.experiment_id if found is not None else client.create_experiment(self.experiment)
        ident = _ident(info.run_id)
        runs = client.search_runs([experiment], f"tags.`{self.RUN_TAG}` = '{ident}'", max_results=1)
        if runs:
            self._run = runs[0].info.run_id
            client.update_run(self._run, status="RUNNING")
        else:
            self._run = client.create_run(experiment, run_name=ident, tags={self.RUN_TAG: ident}).info.run_id

    def write(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self._run, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def end(self, status: Status) -> None:
        self._client.set_terminated(self._run, status)


class WandB(Sink):
    """A Weights & Biases run in ``project`` with its files under ``dir`` (``wandb.init``), ``mode="offline"``
    (upload later with ``wandb sync DIR/wandb/offline-run-*``) or ``"online"``. Its id is the job's run id, so a
    resumed job continues the same W&B run. Nothing of W&B's goes to stdout or stderr (its console capture is off),
    and it samples no system metrics: the driver is not where the stage actors run."""

    MODES = ("offline", "online")

    def __init__(self, project: str, dir: str, mode: Literal["offline", "online"] = "offline") -> None:  # noqa: A002 - wandb.init's name
        _need("wandb", "W&B", "wandb")
        if mode not in self.MODES:
            raise UserError(f"WandB: mode {mode!r} is not one of {', '.join(self.MODES)}")
        super().__init__()
        self.project, self.dir, self.mode = str(project), str(dir), mode
        self._run: Any = None

    def open(self, info: StartInfo) -> None:
        import wandb

        os.makedirs(self.dir, exist_ok=True)
        settings = wandb.Settings(console="off", silent=True, disable_git=True, x_disable_stats=True)
        self._run = wandb.init(project=self.project, dir=self.dir, mode=self.mode, id=_ident(info.run_id), name=info.run_id,
                               resume="allow", settings=settings)

    def write(self, values: dict[str, float], step: int) -> None:
        self._run.log(values, step=step)

    def end(self, status: Status) -> None:
        self._run.finish(exit_code=1 if status == "FAILED" else 0)
        self._run = None


__all__ = ["MLflow", "Sink", "TensorBoard", "WandB", "scalars"]
