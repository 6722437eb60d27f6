"""Cloud preemption watchers on every node of the job, not only beside the driver.

A spot notice appears in the metadata service of the VM that is going away, and the driver
usually runs elsewhere (the head node). So one lightweight actor (no CPU reserved) is pinned to
each node that runs stage actors; it runs the cloud's watcher (:mod:`cloud.preemption`) and keeps
the deadline it saw. The job's loop polls them between iterations (:meth:`NoticeWatchers.poll`, one
short round trip) and turns each deadline into a notice for the devices on that node.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable

import ray


class _Watcher:
    """Ray actor: the cloud watcher of this node, and the newest deadline it reported."""

    def __init__(self, cloud: str, options: dict[str, Any]) -> None:
        from cloud.preemption import watcher_for

        self.deadline: float | None = None
        self.watcher = watcher_for(cloud, self._seen, **options).start()

    def _seen(self, deadline_utc: datetime) -> None:
        self.deadline = deadline_utc.timestamp()

    def take(self) -> float | None:
        deadline, self.deadline = self.deadline, None
        return deadline

    def stop(self) -> None:
        self.watcher.stop()


class NoticeWatchers:
    """One watcher actor per node in ``node_ids`` (hard node affinity, zero CPUs)."""

    def __init__(self, cloud: str, node_ids: Iterable[str], **options: Any) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._cloud, self._options = cloud, options
        self._remote: Any = ray.remote(_Watcher)
        self._affinity = NodeAffinitySchedulingStrategy
        self.actors: dict[str, Any] = {}
        self.watch(node_ids)

    def watch(self, node_ids: Iterable[str]) -> None:
        """A watcher on each of ``node_ids`` not watched yet (nodes that joined the job later)."""
        for node in sorted(set(node_ids) - set(self.actors)):
            self.actors[node] = self._remote.options(num_cpus=0, scheduling_strategy=self._affinity(node, soft=False)) \
                .remote(self._cloud, self._options)

    def poll(self, timeout_s: float = 2.0) -> list[tuple[str, float]]:
        """``(node_id, deadline as Unix seconds)`` for each node whose watcher saw a notice since
        the last poll; a watcher that does not answer in time is asked again next poll."""
        refs = {actor.take.remote(): node for node, actor in self.actors.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        out = []
        for ref in ready:
            try:
                deadline = ray.get(ref)
            except ray.exceptions.RayError:  # its node is gone: the loss itself will be seen
                continue
            if deadline is not None:
                out.append((refs[ref], float(deadline)))
        return sorted(out)

    def stop(self) -> None:
        for actor in self.actors.values():
            try:
                ray.get(actor.stop.remote(), timeout=5.0)
            except Exception:  # noqa: BLE001 - already gone
                pass
            ray.kill(actor, no_restart=True)
        self.actors = {}
