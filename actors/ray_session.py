"""The one way the project joins Ray: ``RAY_ADDRESS`` when set, else a fresh local instance.

Why not a bare ``ray.init()``: with no address Ray connects to *any* Ray instance it finds running
on the machine (``/tmp/ray/ray_current_cluster``, or a GCS process it detects) — another user's,
another test's, or a cluster the supervisor started for another segment of the run — and the job's
actors then wait for resources that cluster does not have. An explicit ``address="local"`` starts
this process's own instance.

A local instance runs its workers at the driver's priority (:data:`~orchestrator.core.ray_local.LOCAL_SYSTEM_CONFIG`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from orchestrator.core.ray_local import LOCAL_SYSTEM_CONFIG


def address() -> str:
    """The Ray address a driver joins: ``RAY_ADDRESS`` (as under ``ray job submit``), else ``local``."""
    return os.environ.get("RAY_ADDRESS") or "local"


def ensure_ray(**kwargs: Any) -> bool:
    """``ray.init`` at :func:`address` unless Ray is up already; returns whether this call started it.
    ``kwargs`` (``num_cpus``, ``include_dashboard``, ...) apply to a local instance only."""
    import ray

    if ray.is_initialized():
        return False
    where = address()
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}  # a driver's stderr is its own: one line per user error
    options = {**quiet, "_system_config": LOCAL_SYSTEM_CONFIG, **kwargs} if where == "local" \
        else {**quiet, "log_to_driver": kwargs.get("log_to_driver", False)}
    ray.init(address=where, ignore_reinit_error=True, **options)
    return True


__all__ = ["LOCAL_SYSTEM_CONFIG", "address", "ensure_ray"]
