"""Waiting for the stage workers' calls and telling what went wrong: the triage half of :class:`actors.group.WorkerGroup`.

Functions with no state of their own: each waits for remote calls and says what came back; the group, which owns
which workers are dead and whether its process group is still usable, draws the consequences. When one worker dies
its peers fail a little later (their receives see a closed socket, or time out); the death is the root cause, so
:func:`collect` stops at it and reports it in preference to their errors. Likewise a user's mistake (a
:class:`~orchestrator.core.errors.UserError` raised in the user's code) is preferred to the broken-link errors of
the peers whose links its worker closed (:func:`follows_a_peer`), whichever of them the driver happens to see
first; any other earlier error stays the cause.

Nothing is ever cancelled: Ray's in-order actor queue, given a cancelled call that never reached the worker, waits
30 s for its sequence number and then cancels the calls behind it (ray-project/ray#65785), which would fail the
recovery that follows. A worker whose iteration failed refuses the calls queued behind it at once instead
(:class:`~actors.transport.CommunicatorsAborted`: nothing ran).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import ray
import torch.distributed as dist
from ray.exceptions import RayActorError, RayTaskError

from actors.transport import CommunicatorsAborted
from orchestrator.core.errors import UserError

DEATH_GRACE_S = 10.0  # after a worker's error, how long to look for the death that may have caused it


class PipelineActorError(RuntimeError):
    """A stage worker died or failed; ``device`` and ``stages`` say which one."""

    def __init__(self, message: str, device: int = -1, stages: Sequence[int] = (), died: bool = False,
                 pending: Sequence[int] = (), cause: str = "", detect_s: float | None = None) -> None:
        """``pending``: the devices that had not answered at the deadline; ``cause``: ``"hang"`` when the worker
        was ended for making no progress (``detect_s``: the deadline it missed)."""
        super().__init__(message)
        self.device, self.stages, self.died = device, tuple(stages), died
        self.pending, self.cause, self.detect_s = tuple(pending), cause, detect_s


@dataclass(frozen=True)
class Gathered:
    """What came back from one call on several workers (``device -> result`` for those that answered)."""

    results: dict[int, Any]
    died: tuple[int, BaseException] | None = None  # a worker's process died: the root cause, reported first
    failure: tuple[int, BaseException] | None = None  # the first error raised inside a worker (see collect)
    pending: tuple[int, ...] = ()  # devices still running at the deadline (blocked: their process group is unusable)
    superseded: bool = False  # a peer's broken-link error came first; the user's mistake replaced it as the cause


def collect(refs: Sequence[Any], devices: Sequence[int], timeout_s: float) -> Gathered:
    """Wait for ``refs`` (one per device of ``devices``) until all answered, one died, or ``timeout_s`` passed;
    after a worker's error, at most :data:`DEATH_GRACE_S` more for the death that may have caused it."""
    pending = dict(zip(refs, devices))
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    failure: tuple[int, BaseException] | None = None
    superseded = False
    while pending:
        left = deadline - time.monotonic()
        if failure is not None:
            left = min(left, DEATH_GRACE_S)
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, left))
        if not ready:
            break
        dev = pending.pop(ready[0])
        try:
            results[dev] = ray.get(ready[0])
        except RayActorError as exc:
            return Gathered(results, died=(dev, exc), failure=failure, pending=tuple(pending.values()), superseded=superseded)
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            err = cause if isinstance(cause, BaseException) else exc
            if failure is None:
                failure = (dev, err)
            elif isinstance(err, UserError) and follows_a_peer(failure[1]):
                failure, superseded = (dev, err), True  # the user's mistake closed the links the peer failed on
    return Gathered(results, failure=failure, pending=tuple(pending.values()), superseded=superseded)


BROKEN_LINK = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
"""What gloo's error says when the rank at the other end closed its sockets (as a failing rank does:
:func:`actors.transport.abort_communicators`)."""


def follows_a_peer(err: BaseException) -> bool:
    """Whether ``err`` is what a worker raises when a *peer* gave up the iteration (its communicators aborted,
    a closed link, NCCL's abort), rather than a failure of its own."""
    if isinstance(err, (CommunicatorsAborted, dist.DistError)):
        return True
    return isinstance(err, RuntimeError) and any(s in str(err) for s in BROKEN_LINK)


def ran_after_failure(refs: Sequence[Any], grace_s: float) -> bool:
    """Whether any of ``refs`` — calls submitted behind one that failed — ran, or may still run after ``grace_s``:
    then those workers' state is unknown. A call refused by a worker whose iteration failed ran nothing, nor did
    one whose process died."""
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=grace_s)
    for ref in ready:
        try:
            ray.get(ref)
        except RayTaskError as exc:
            if not isinstance(getattr(exc, "cause", None), CommunicatorsAborted):
                return True
        except Exception:  # noqa: BLE001 - its actor died: the caller learns it from the next call
            continue
        else:
            return True
    return bool(pending)


def unanswered(status_refs: Mapping[Any, int], timeout_s: float) -> set[int]:
    """Devices whose status call (``ref -> device``) did not answer within ``timeout_s`` or whose actor died. An
    answer with an error (its failed iteration's) is an answer: the worker is alive."""
    ready, pending = ray.wait(list(status_refs), num_returns=len(status_refs), timeout=timeout_s)
    gone = {status_refs[r] for r in pending}
    for ref in ready:
        try:
            ray.get(ref)
        except RayActorError:
            gone.add(status_refs[ref])
        except Exception:  # noqa: BLE001 - it answered (with its failed task's error): alive
            pass
    return gone


def last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else ""
