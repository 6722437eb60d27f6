"""The stage workers' processes: started where their slots say, restarted, respawned, and added while a job runs.

Owned by :class:`actors.group.WorkerGroup` (which owns the plan, the process group's membership and the calls):
this object alone owns the actors, their slots, where each reported it runs, and which are dead. Worker ``i`` is
started on slot ``i`` with a hard node affinity (:mod:`actors.placement`), reports where it actually runs, and is
refused with one line if that is not its slot; a slot that cannot be had is one line naming the device and what its
node has free, instead of a wait for ever. A broken process group is restarted whole; dead workers can be respawned
in place (a replaced node); capacity that joins gets workers in new slots (:meth:`WorkerProcesses.extend`) without
stopping anyone — they are checked as they come up (:meth:`WorkerProcesses.started`).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from actors import waits
from actors.group_calls import last_line
from actors.placement import Slot, actor_options, check_identity
from actors.stage_worker import StageWorker
from orchestrator.core.errors import UserError

PROBE = {"probe": 1, "copies": 1}
"""Concurrency groups of their own beside the worker's one call at a time (``max_concurrency=1``): ``probe`` for
:meth:`StageWorker.progress`, which answers while an iteration is blocked (hang triage); ``copies`` for the
in-memory snapshots' neighbour copies, sent and kept while the next iteration trains."""


class WorkerProcesses:
    """One Ray actor per slot (see the module docstring); ``actors[i]`` is ``None`` where slot ``i``'s node is gone."""

    def __init__(self, slots: Sequence[Slot], use_gpu: bool, cpus_per_worker: float, start_timeout_s: float) -> None:
        self.slots = list(slots)
        self.use_gpu, self.cpus_per_worker, self.start_timeout_s = use_gpu, cpus_per_worker, start_timeout_s
        self.actors: list[Any] = []
        self.identities: list[dict[str, Any]] = []  # where each worker actually runs (reported at start)
        self.dead: set[int] = set()  # slots whose worker is known to have died
        self._starting: dict[Any, tuple[int, float]] = {}  # identity call -> (slot, since) of workers extend started
        self._start()

    @property
    def size(self) -> int:
        return len(self.slots)

    def actor(self, slot: int) -> Any:
        return self.actors[slot]

    def mark_dead(self, slot: int) -> None:
        self.dead.add(slot)

    def node_lost_slots(self) -> set[int]:
        """Slots whose node has left the cluster: no worker can be (re)started there."""
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        return {i for i, slot in enumerate(self.slots) if slot.node_id not in alive}

    def unreachable_slots(self) -> set[int]:
        """Slots known dead or whose node has left the cluster (a removed or failed node takes every worker on it;
        the first error names only one of them)."""
        return set(self.dead) | self.node_lost_slots()

    def _start(self, skip: Sequence[int] = ()) -> None:
        """A worker on every slot but those in ``skip`` (slots whose node is gone: dead, with no actor)."""
        remote = ray.remote(concurrency_groups=PROBE)(StageWorker)  # type: ignore[call-overload]
        self.actors = [None if i in skip else remote.options(max_concurrency=1, **actor_options(s, self.cpus_per_worker)).remote()  # type: ignore[attr-defined]
                       for i, s in enumerate(self.slots)]
        self.dead = set(skip)
        self._starting = {}
        live = [i for i in range(len(self.actors)) if i not in self.dead]
        found = dict(zip(live, self._await(live))) if live else {}
        self.identities = [found.get(i, {}) for i in range(len(self.actors))]

    def _await(self, indices: list[int]) -> list[dict[str, Any]]:
        """Wait for the workers at ``indices`` to start and check each runs where its slot says."""
        refs = {self.actors[i].identity.remote(): i for i in indices}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=waits.stretched(self.start_timeout_s))
        if pending:
            stuck = sorted(refs[r] for r in pending)
            self.kill(indices)
            free = {n["NodeID"]: n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")}
            slot = self.slots[stuck[0]]
            raise UserError(
                f"device(s) {stuck} did not start within {self.start_timeout_s:.0f}s: device {stuck[0]} needs "
                f"{'a GPU' if slot.kind == 'gpu' else 'a CPU share'} on node {slot.node_id[:12]}, which "
                + ("is gone" if slot.node_id not in free else f"has {ray.available_resources().get('GPU' if slot.kind == 'gpu' else 'CPU', 0):g} free in the cluster"))
        seen = {refs[r]: self._get_start(r, refs[r], indices) for r in ready}
        for i, found in seen.items():
            try:
                check_identity(i, self.slots[i], found)
            except UserError:
                self.kill(indices)
                raise
        return [seen[i] for i in indices]

    def _get_start(self, ref: Any, index: int, indices: list[int]) -> dict[str, Any]:
        try:
            return dict(ray.get(ref))
        except (RayActorError, RayTaskError) as exc:
            self.kill(indices)
            raise UserError(f"device {index}'s worker failed to start on node {self.slots[index].node_id[:12]}: "
                            f"{last_line(exc)}") from None

    def restart(self) -> None:
        """Kill every worker (a broken process group cannot be repaired in place) and start fresh ones, except on
        slots whose node has left the cluster: a hard node affinity to a removed node can never be scheduled
        (Ray raises ``ActorUnschedulableError``), so those slots stay dead and a plan must do without them."""
        lost = self.node_lost_slots()
        self.kill()
        self._start(sorted(lost))

    def kill(self, indices: Sequence[int] | None = None) -> None:
        """Kill the workers at ``indices`` (default: all of them, and forget them)."""
        for i, actor in enumerate(self.actors):
            if actor is None or (indices is not None and i not in indices):
                continue
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is fine
                pass
        if indices is None or len(indices) == len(self.actors):
            self.actors = []

    def respawn(self, slots: Sequence[int]) -> None:
        """Start fresh processes in dead ``slots`` (a replaced node; tests restoring a shared pool)."""
        remote = ray.remote(concurrency_groups=PROBE)(StageWorker)  # type: ignore[call-overload]
        fresh = [i for i in slots if i in self.dead]
        for i in fresh:
            self.actors[i] = remote.options(max_concurrency=1, **actor_options(self.slots[i], self.cpus_per_worker)).remote()  # type: ignore[attr-defined]
            self.dead.discard(i)
        for i, found in zip(fresh, self._await(fresh)):
            self.identities[i] = found

    def extend(self, slots: Sequence[Slot]) -> list[int]:
        """Start workers on ``slots`` (capacity that joined: a new node's devices) as new actor
        slots after the existing ones, without waiting for them (an actor start takes seconds,
        which training need not wait for); returns their indices. Nobody else is touched, and
        a worker joins the process group only at a live move that makes it a member, once
        :meth:`started` has reported it up."""
        kind = "gpu" if self.use_gpu else "cpu"
        if any(s.kind != kind for s in slots):
            raise UserError(f"a {kind} job was given {sorted({s.kind for s in slots})} slots")
        first = len(self.actors)
        remote = ray.remote(concurrency_groups=PROBE)(StageWorker)  # type: ignore[call-overload]
        self.slots += list(slots)
        self.actors += [remote.options(max_concurrency=1, **actor_options(s, self.cpus_per_worker)).remote()  # type: ignore[attr-defined]
                        for s in slots]
        self.identities += [{} for _ in slots]
        fresh = list(range(first, len(self.actors)))
        since = time.monotonic()
        self._starting.update({self.actors[i].identity.remote(): (i, since) for i in fresh})
        return fresh

    def started(self, timeout_s: float = 0.0) -> tuple[list[int], list[tuple[int, str]]]:
        """Workers from :meth:`extend` that came up since the last call, each checked to run where
        its slot says, and those that failed or did not start in time, with why (marked dead)."""
        if not self._starting:
            return [], []
        ready, _ = ray.wait(list(self._starting), num_returns=len(self._starting), timeout=timeout_s)
        up: list[int] = []
        failed: list[tuple[int, str]] = []
        for ref in ready:
            i, _ = self._starting.pop(ref)
            try:
                seen = dict(ray.get(ref))
                check_identity(i, self.slots[i], seen)
            except (RayActorError, RayTaskError, UserError) as exc:
                failed.append((i, last_line(exc)))
                continue
            self.identities[i] = seen
            up.append(i)
        late = waits.stretched(self.start_timeout_s)
        for ref, (i, since) in list(self._starting.items()):
            if time.monotonic() - since > late:
                del self._starting[ref]
                failed.append((i, f"no start within {self.start_timeout_s:.0f}s on node {self.slots[i].node_id[:12]}"))
        for i, _ in failed:
            self.kill([i])
            self.dead.add(i)
        return up, failed
