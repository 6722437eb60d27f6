"""Preemption notices, one owner: what arrived, from where, and the evacuated devices that have yet to leave.

Notices come from outside the loop's thread (``ElasticJob.notify``: a user's code, a test), from the cloud watchers
on the job's nodes and Ray's drain requests (polled every ``SpotConfig.ray_drain_poll_s``), and from the rehearsal
(``SpotConfig.notices``: after a given step). The job's notice policy asks :meth:`Notices.due` between iterations
and carries out what it returns: the evacuated devices leave the process group before their deadline
(:class:`~orchestrator.elastic.actions.Leave`), each notice is handled (:class:`~orchestrator.elastic.actions.Preempt`).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Collection, Sequence

from actors.placement import WorkerPlace
from orchestrator.core.plan import Plan
from orchestrator.elastic.actions import JobAction, Leave, Preempt
from orchestrator.elastic.evacuation import Notice

if TYPE_CHECKING:
    from orchestrator.elastic.job_config import SpotConfig


class Notices:
    def __init__(self, spot: "SpotConfig", clock: Callable[[], float]) -> None:
        self.spot, self.clock = spot, clock
        self._lock = threading.Lock()
        self._inbox: list[Notice] = []
        self._fired: set[int] = set()  # rehearsed notices already delivered
        self._drained: set[str] = set()  # Ray nodes whose drain request was already turned into a notice
        self._polled = 0.0
        self._watchers: Any = None  # orchestrator.elastic.notice_watchers.NoticeWatchers while fit runs with spot.watch
        self.leaving: Notice | None = None
        """Evacuated devices still members of the process group, idle: they leave it before their deadline or at
        the next re-formation, not during the evacuation's stall."""

    def notify(self, devices: tuple[int, ...], seconds_left: float, source: str = "injected") -> None:
        """A notice for ``devices`` with ``seconds_left`` (any thread)."""
        with self._lock:
            self._inbox.append(Notice(tuple(devices), self.clock() + seconds_left, source))

    @property
    def waiting(self) -> bool:
        """A notice arrived that no policy has seen yet."""
        return bool(self._inbox)

    def due(self, step: int, plan: Plan, alive: Collection[int], places: Callable[[], Sequence[WorkerPlace]]) -> list[JobAction]:
        """After ``step``: the evacuated devices' leave when their deadline is near, then every notice that arrived
        (polled from the watchers and Ray, rehearsed ones due by now: the middle stage's device unless named)."""
        actions: list[JobAction] = []
        if self.leaving is not None and self.clock() >= self.leaving.deadline - self.spot.margin_s:
            actions.append(Leave(self.leaving))
        self._poll(alive, places)
        for k, n in enumerate(self.spot.notices):
            if n.at_step <= step and k not in self._fired:  # a drained step may have passed at_step
                self._fired.add(k)
                doomed = plan.stages[len(plan.stages) // 2].devices[:1] if n.devices is None else n.devices or tuple(sorted(alive))
                self.notify(doomed, n.seconds, "rehearsal")
        with self._lock:
            notices, self._inbox = self._inbox, []
        return actions + [Preempt(n) for n in notices]

    def evacuated(self, notice: Notice) -> None:
        """``notice``'s devices handed their blocks over and stay idle members until they leave."""
        self.leaving = notice

    def left(self) -> None:
        """The process group was formed anew without the evacuated devices (they left, or a recovery replaced it)."""
        self.leaving = None

    def watch(self, nodes: Collection[str]) -> None:
        """One cloud watcher on each of ``nodes`` while ``fit`` runs (``SpotConfig.watch``)."""
        from orchestrator.elastic.notice_watchers import NoticeWatchers

        assert self.spot.watch is not None
        self._watchers = NoticeWatchers(self.spot.watch, set(nodes))

    def stop_watching(self) -> None:
        if self._watchers is not None:
            self._watchers.stop()
            self._watchers = None

    def _poll(self, alive: Collection[int], places: Callable[[], Sequence[WorkerPlace]]) -> None:
        """Notices from outside, every ``ray_drain_poll_s``: the cloud watchers on the job's nodes and Ray's drain
        requests (once per node), for the devices on those nodes (a notice for the driver's node alone is one for the
        whole job: the driver goes with it)."""
        every = self.spot.ray_drain_poll_s
        now = time.monotonic()
        if not every or now - self._polled < every:
            return
        self._polled = now
        from orchestrator.elastic.drain import drain_notices, draining_nodes

        where = places()
        if self._watchers is not None:
            self._watchers.watch(d.node_id for d in where)  # nodes that joined since fit started
            for node, deadline in self._watchers.poll():
                here = tuple(d.device for d in where if d.node_id == node and d.device in alive)
                self.notify(here or tuple(sorted(alive)), deadline - time.time(), f"{self.spot.watch} notice on node {node[:12]}")
        draining = {n: d for n, d in draining_nodes().items() if n not in self._drained}
        if draining:
            for devices, left, source in drain_notices(draining, where):
                self.notify(tuple(d for d in devices if d in alive), left, source)
            self._drained |= set(draining)


__all__ = ["Notices"]
