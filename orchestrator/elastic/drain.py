"""Ray's own warning that a node is going away: the autoscaler's drain requests, read in one place.

When Ray's autoscaler (or a KubeRay operator, or a cloud integration) decides to remove a node it
first *drains* it and may give a deadline. Ray exposes the draining nodes only through its
private state API (``ray._private.state.state.get_draining_nodes()``: node id → deadline in ms,
0 = none), so this module is the single small wrapper around it: if the API moves or fails, the
job loses this early warning (and still sees the node's loss when it happens), never crashes.

:func:`drain_notices` turns the drain table into preemption notices for the devices whose actors
run on a draining node — the same notices a cloud watcher or an injected rehearsal produces.
"""

from __future__ import annotations

import time
from typing import Iterable, Mapping

from actors.placement import WorkerPlace

DEFAULT_DRAIN_S = 120.0
"""Seconds assumed left when a drain request carries no deadline (the common spot notice)."""


def draining_nodes() -> dict[str, float | None]:
    """Node id (hex) → drain deadline (Unix seconds, None when Ray gave none); {} if unknown."""
    try:
        from ray._private.state import state

        found = state.get_draining_nodes()
    except Exception:  # noqa: BLE001 - a private API: absent, moved or failing means "no information"
        return {}
    return {str(node): (float(ms) / 1000.0 if ms else None) for node, ms in dict(found).items()}


def drain_notices(draining: Mapping[str, float | None], devices: Iterable[WorkerPlace], now: float | None = None,
                  default_s: float = DEFAULT_DRAIN_S) -> list[tuple[tuple[int, ...], float, str]]:
    """``(devices, seconds_left, source)`` per draining node that runs some of ``devices`` (as
    :meth:`PipelineRuntime.devices` reports them)."""
    now = time.time() if now is None else now
    by_node: dict[str, list[int]] = {}
    for d in devices:
        by_node.setdefault(d.node_id, []).append(d.device)
    out = []
    for node, deadline in sorted(draining.items()):
        if node in by_node:
            left = default_s if deadline is None else deadline - now
            out.append((tuple(sorted(by_node[node])), left, f"ray drain of node {node[:12]}"))
    return out
