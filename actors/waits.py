"""Waiting on Ray with deadlines that stretch on a loaded machine and failures that explain themselves.

Why: on a busy 2-core box a fresh actor can take far longer than usual to import torch and answer
its first call; a fixed deadline then surfaces as a raw ``GetTimeoutError`` from deep inside the
worker group, with no word of which stage was waited for or why. Here a deadline is multiplied by
the machine's run-queue pressure (1-minute load average per core, between 1 and
:data:`MAX_STRETCH`), and an expired or failed wait becomes one :class:`StartTimeout` line naming
the stage and device and what Ray knows about the actor (its state, why it died, and the
resources the cluster has free).
"""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from orchestrator.core.errors import UserError

MAX_STRETCH = 4.0  # a deadline grows at most 4x under load: a wedged actor still fails in bounded time


class StartTimeout(UserError):
    """A worker did not come up (or died while coming up); the message says which and what Ray reports."""


def load_stretch() -> float:
    """How much slower than idle this machine is likely to be: load average per core, in [1, MAX_STRETCH]."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return 1.0
    return min(MAX_STRETCH, max(1.0, load / max(1, os.cpu_count() or 1)))


def stretched(timeout_s: float) -> float:
    """``timeout_s`` scaled by :func:`load_stretch`."""
    return timeout_s * load_stretch()


def ray_report(actor: Any) -> str:
    """What Ray says about ``actor``: state and death cause when the state API answers, and the
    cluster's free CPU/GPU (a pending actor usually waits for resources)."""
    parts: list[str] = []
    try:
        from ray.util.state import get_actor

        info = get_actor(actor._actor_id.hex(), timeout=5)
        if info is not None:
            parts.append(f"actor state {info.state}")
            cause = getattr(info, "death_cause", None)
            if cause:
                text = " ".join(str(cause).split())
                parts.append(f"death cause {text[:200]}")
    except Exception:  # noqa: BLE001 - the state API needs the dashboard; its absence is no reason to hide the rest
        pass
    try:
        free = ray.available_resources()
        total = ray.cluster_resources()
        parts.append(", ".join(f"{k} {free.get(k, 0):g}/{total.get(k, 0):g} free" for k in ("CPU", "GPU") if total.get(k)))
    except Exception:  # noqa: BLE001 - Ray itself may be going away
        pass
    return "; ".join(p for p in parts if p) or "no details available"


def get(ref: Any, actor: Any, who: str, what: str, timeout_s: float) -> Any:
    """``ray.get(ref)`` with a load-stretched deadline; a timeout or a dead actor is one StartTimeout line.

    ``who`` names the worker ("stage 1 (device 1, blocks [3,6))"), ``what`` the call ("its
    process-group endpoint")."""
    limit = stretched(timeout_s)
    try:
        return ray.get(ref, timeout=limit)
    except GetTimeoutError:
        raise StartTimeout(f"{who} did not answer {what} within {limit:.0f}s "
                           f"(machine load x{load_stretch():.1f}); Ray reports: {ray_report(actor)}") from None
    except RayActorError as exc:
        detail = " ".join(str(exc).split())[:300]
        raise StartTimeout(f"{who} died before answering {what}: {detail}; Ray reports: {ray_report(actor)}") from None
