"""The set of Ray actors behind a pipeline: creation, placement, rendezvous and failure triage.

A :class:`WorkerGroup` outlives plans: ``configure`` re-partitions the same processes for a new
plan (the process group is rebuilt, the model blocks re-created), which is what re-planning and
restoring under another plan need, and what keeps the test suite from paying the actor start-up
cost (seconds per process) for every plan it checks.

Placement: with GPUs each worker asks for one GPU and the group reserves one bundle per worker
in a Ray placement group (``PACK``: neighbours on one node when they fit), so the job either gets
all its devices or waits, instead of starting half a pipeline. Without GPUs workers ask for a
small CPU fraction, so several share a laptop's cores (torch threads are divided in the worker).

Failure triage: every remote call goes through :meth:`WorkerGroup.gather`, which waits with a
deadline and converts a dead actor into :class:`PipelineActorError` naming device and stages.
When one worker dies its peers fail a little later (their receives time out or see a closed
socket); the death is the root cause, so it is reported in preference to their errors.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from actors.stage_worker import JobSpec, StageWorker
from orchestrator.errors import UserError
from orchestrator.plan import Plan


class PipelineActorError(RuntimeError):
    """A stage worker died or failed; ``device`` and ``stages`` say which one."""

    def __init__(self, message: str, device: int = -1, stages: Sequence[int] = (), died: bool = False) -> None:
        super().__init__(message)
        self.device, self.stages, self.died = device, tuple(stages), died


class WorkerGroup:
    """``size`` stage workers; worker ``i`` runs the plan's ``i``-th device (sorted by id)."""

    def __init__(self, size: int, use_gpu: bool | None = None, cpus_per_worker: float = 0.01) -> None:
        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, log_to_driver=False)
        if use_gpu is None:
            use_gpu = ray.cluster_resources().get("GPU", 0) >= size
        self.size, self.use_gpu, self.cpus_per_worker = size, use_gpu, cpus_per_worker
        self.actors: list[Any] = []
        self.pg: Any = None
        self.plan: Plan | None = None
        self.rank_of: dict[int, int] = {}
        self.broken = False
        self._start()

    def _start(self) -> None:
        remote = ray.remote(StageWorker)
        options: list[dict[str, Any]]
        if self.use_gpu:
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            self.pg = placement_group([{"GPU": 1, "CPU": 1}] * self.size, strategy="PACK")
            ray.get(self.pg.ready(), timeout=600)
            options = [
                {"num_gpus": 1, "num_cpus": 1, "scheduling_strategy": PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i)}
                for i in range(self.size)
            ]
        else:
            options = [{"num_cpus": self.cpus_per_worker} for _ in range(self.size)]
        self.actors = [remote.options(max_concurrency=1, **o).remote() for o in options]  # type: ignore[attr-defined]
        self.broken = False

    def restart(self) -> None:
        """Kill every worker (a broken process group cannot be repaired in place) and start fresh ones."""
        self._kill()
        self._start()

    def shutdown(self) -> None:
        self._kill()

    def _kill(self) -> None:
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is fine
                pass
        self.actors = []
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)
            self.pg = None

    # ----- plan -----
    def configure(self, spec: JobSpec, plan: Plan, timeout_s: float = 300.0) -> list[dict[str, Any]]:
        """Point the first ``len(plan.devices)`` workers at ``plan`` and join them in one process group."""
        devices = sorted(plan.devices)
        if len(devices) > self.size:
            raise UserError(f"plan needs {len(devices)} workers but the group has {self.size}")
        if self.broken:
            self.restart()
        self.plan = plan
        self.rank_of = {d: i for i, d in enumerate(devices)}
        host, port = ray.get(self.actors[0].endpoint.remote(), timeout=timeout_s)
        refs = [self.actors[i].configure.remote(spec, plan.to_dict(), d, self.rank_of, host, port) for i, d in enumerate(devices)]
        idle = [a.shutdown.remote() for a in self.actors[len(devices):]]
        out = self.gather(refs, "setup", timeout_s)
        ray.get(idle, timeout=timeout_s)
        return out

    def actor_of(self, device: int) -> Any:
        return self.actors[self.rank_of[device]]

    def call(self, method: str, *args: Any, devices: Sequence[int] | None = None, what: str = "", timeout_s: float = 600.0) -> list[Any]:
        """Call ``method`` on the workers of ``devices`` (default: all plan devices) in parallel."""
        targets = list(devices) if devices is not None else sorted(self.rank_of)
        refs = [getattr(self.actor_of(d), method).remote(*args) for d in targets]
        return self.gather(refs, what or method, timeout_s, targets)

    def kill_worker(self, device: int) -> None:
        """Fault injection from the driver side (tests): hard-kill one worker."""
        ray.kill(self.actor_of(device), no_restart=True)

    # ----- triage -----
    def gather(self, refs: list[Any], what: str, timeout_s: float, devices: Sequence[int] | None = None) -> list[Any]:
        devs = list(devices) if devices is not None else sorted(self.rank_of)
        pending = dict(zip(refs, devs))
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        failure: tuple[int, BaseException] | None = None
        while pending:
            left = deadline - time.monotonic()
            if failure is not None:
                left = min(left, 10.0)  # grace period: look for the death that caused this failure
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, left))
            if not ready:
                break
            ref = ready[0]
            dev = pending.pop(ref)
            try:
                results[dev] = ray.get(ref)
            except RayActorError as exc:
                self.broken = True
                self._cancel(pending)
                raise self._died(dev, what, exc) from None
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                failure = failure or (dev, cause if isinstance(cause, BaseException) else exc)
        if failure is not None:
            if pending:  # peers still blocked (on the failed one): the process group is unusable
                self.broken = True
                self._cancel(pending)
            dev, err = failure
            if isinstance(err, UserError):  # a user mistake (bad checkpoint, bad data): say it plainly
                raise UserError(str(err)) from None
            self.broken = True
            raise PipelineActorError(
                f"{what} failed on {self._name(dev)}: {type(err).__name__}: {_last_line(err)}",
                dev, self._stages(dev),
            ) from err
        if pending:
            self.broken = True
            names = ", ".join(self._name(d) for d in pending.values())
            self._cancel(pending)
            raise PipelineActorError(f"{what} timed out after {timeout_s:.0f}s waiting for {names}", next(iter(pending.values()), -1))
        return [results[d] for d in devs]

    def _cancel(self, pending: dict[Any, int]) -> None:
        for ref in pending:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - actor tasks may not be cancellable; restart kills them
                pass

    def _stages(self, device: int) -> list[int]:
        return self.plan.stages_of_device(device) if self.plan is not None else []

    def _name(self, device: int) -> str:
        if self.plan is None:
            return f"device {device}"
        stages = self._stages(device)
        blocks = ", ".join(f"[{self.plan.stages[j].first},{self.plan.stages[j].last})" for j in stages)
        return f"stage {'/'.join(map(str, stages))} (device {device}, blocks {blocks})"

    def _died(self, device: int, what: str, exc: BaseException) -> PipelineActorError:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return PipelineActorError(f"{self._name(device)} died during {what}: {detail}", device, self._stages(device), died=True)


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else ""


__all__ = ["GetTimeoutError", "PipelineActorError", "WorkerGroup"]
