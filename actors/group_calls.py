"""Calling the stage workers and telling what went wrong: the remote-call half of :class:`actors.group.WorkerGroup`.

Failure triage: every remote call goes through :meth:`WorkerCalls.gather`, which waits with a deadline and
converts a dead actor into :class:`PipelineActorError` naming device and stages. When one worker dies its peers
fail a little later (their receives time out or see a closed socket); the death is the root cause, so it is
reported in preference to their errors. A user's mistake raised in a worker (a bad checkpoint, bad data) comes back
as the one-line :class:`UserError` it is.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from actors.placement import Slot
from actors.transport import CommunicatorsAborted
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan


class PipelineActorError(RuntimeError):
    """A stage worker died or failed; ``device`` and ``stages`` say which one."""

    def __init__(self, message: str, device: int = -1, stages: Sequence[int] = (), died: bool = False) -> None:
        super().__init__(message)
        self.device, self.stages, self.died = device, tuple(stages), died


class WorkerCalls:
    """Mixin of :class:`actors.group.WorkerGroup`; the attributes below are set there."""

    actors: list[Any]
    slots: list[Slot]
    plan: Plan | None
    rank_of: dict[int, int]  # device -> process-group rank (members only)
    slot_of: dict[int, int]  # device -> index into ``actors``
    dead: set[int]  # actor slots known to have died
    broken: bool

    def unresponsive(self, devices: Sequence[int], timeout_s: float) -> set[int]:
        """Devices among ``devices`` whose worker is dead or does not answer within ``timeout_s``.

        After a death the survivors finish (fail) the interrupted iteration first — each worker
        runs one call at a time — so ``timeout_s`` should exceed the per-operation timeout. A
        node that went away takes all its workers; only the first error names one of them.
        """
        refs = {self.actor_of(d).status.remote(): d for d in devices if self.slot_of.get(d, d) not in self.dead}
        gone = {d for d in devices if self.slot_of.get(d, d) in self.dead}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError:
                gone.add(refs[ref])
            except Exception:  # noqa: BLE001 - it answered (with its failed task's error): alive
                pass
        gone |= {refs[r] for r in pending}
        for d in gone:
            self.dead.add(self.slot_of.get(d, d))
        return gone

    def unreachable_slots(self) -> set[int]:
        """Actor slots known dead or whose node has left the cluster (a removed or failed node
        takes every worker on it; the first error names only one of them)."""
        return set(self.dead) | self.node_lost_slots()

    def node_lost_slots(self) -> set[int]:
        """Actor slots whose node has left the cluster: no worker can be (re)started there."""
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        return {i for i, slot in enumerate(self.slots) if slot.node_id not in alive}

    def actor_of(self, device: int) -> Any:
        return self.actors[self.slot_of[device]]

    def plan_devices(self) -> list[int]:
        return sorted(self.plan.devices) if self.plan is not None else sorted(self.rank_of)

    def call(self, method: str, *args: Any, devices: Sequence[int] | None = None, what: str = "", timeout_s: float = 600.0) -> list[Any]:
        """Call ``method`` on the workers of ``devices`` (default: the plan's devices) in parallel."""
        refs, targets = self.submit(method, *args, devices=devices)
        return self.gather(refs, what or method, timeout_s, targets)

    def submit(self, method: str, *args: Any, devices: Sequence[int] | None = None) -> tuple[list[Any], list[int]]:
        """Start ``method`` on the workers of ``devices`` without waiting: ``(refs, devices)`` for
        :meth:`gather` (or :meth:`discard`). Workers run one call at a time (``max_concurrency=1``)
        in submission order, so a call submitted while an earlier one runs waits behind it."""
        targets = list(devices) if devices is not None else self.plan_devices()
        return [getattr(self.actor_of(d), method).remote(*args) for d in targets], targets

    def discard(self, refs: Sequence[Any], grace_s: float = 2.0) -> None:
        """Drop submitted calls whose results are no longer wanted (an earlier call failed).

        Nothing is cancelled: Ray's in-order actor queue, given a cancelled call that never reached the worker, waits
        30 s for its sequence number and then cancels the calls behind it (ray-project/ray#65785), which would fail
        the recovery that follows. A worker whose iteration failed refuses the calls queued behind it at once
        (:class:`~actors.transport.CommunicatorsAborted`: nothing ran). Any call that ran, or is still running after
        ``grace_s``, leaves that worker's state unknown: the group is marked broken and the next :meth:`configure`
        starts fresh processes. A group already broken is restarted anyway: nothing to wait for.
        """
        if self.broken or not refs:
            return
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=grace_s)
        for ref in ready:
            try:
                ray.get(ref)
            except RayTaskError as exc:
                if isinstance(getattr(exc, "cause", None), CommunicatorsAborted):
                    continue  # refused: state untouched
                self.broken = True
            except Exception:  # noqa: BLE001 - its actor died: the caller learns it from the next call
                pass
            else:
                self.broken = True
        if pending:
            self.broken = True

    def kill_worker(self, device: int) -> None:
        """Fault injection from the driver side (tests): hard-kill one worker."""
        ray.kill(self.actor_of(device), no_restart=True)
        self.dead.add(self.slot_of[device])

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
                if dev in self.slot_of:
                    self.dead.add(self.slot_of[dev])
                raise self._died(dev, what, exc) from None
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                failure = failure or (dev, cause if isinstance(cause, BaseException) else exc)
        if failure is not None:
            if pending:  # peers still blocked (on the failed one): the process group is unusable
                self.broken = True
            dev, err = failure
            if isinstance(err, UserError):  # a user mistake (bad checkpoint, bad data): say it plainly, keep its type
                raise (UserError(str(err)) if isinstance(err, RayTaskError) else err.with_traceback(None)) from None
            self.broken = True
            raise PipelineActorError(
                f"{what} failed on {self._name(dev)}: {type(err).__name__}: {last_line(err)}",
                dev, self._stages(dev),
            ) from err
        if pending:
            self.broken = True
            names = ", ".join(self._name(d) for d in pending.values())
            raise PipelineActorError(f"{what} timed out after {timeout_s:.0f}s waiting for {names}", next(iter(pending.values()), -1))
        return [results[d] for d in devs]

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


def last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else ""
