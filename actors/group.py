"""The set of Ray actors behind a pipeline: creation, placement, rendezvous and failure triage.

A :class:`WorkerGroup` outlives plans: ``configure`` re-partitions the same processes for a new
plan (the process group is rebuilt, the model blocks re-created), which is what re-planning and
restoring under another plan need, and what keeps the test suite from paying the actor start-up
cost (seconds per process) for every plan it checks.

Placement (:mod:`actors.placement`): worker ``i`` is pinned to slot ``i`` — a GPU or a CPU slot
of one named node — with a hard node affinity, so device ``i`` of the cluster model the plan was
made for is the device that runs it. Every worker reports where it actually runs at start
(``identities``) and a worker on the wrong node or accelerator is refused with one line; a slot
that cannot be had (its node lacks the resources) is one line naming the device and what the
node has free, instead of a wait for ever. Without GPUs workers ask for a small CPU fraction,
so several share a laptop's cores (torch threads are divided in the worker).

Failure triage (remote calls with deadlines, a dead actor named by device and stages) is the
mixin :class:`actors.group_calls.WorkerCalls`.

Live re-partitioning: ``configure(..., members=, slots=)`` pins device ``d`` to actor slot
``slots[d]`` and makes every alive ``member`` (not only the plan's devices) a process-group rank,
so :meth:`WorkerGroup.move` can later give blocks to any member — and drop a dead one — while all
other processes keep running with their state. The process group is rebuilt only when the
membership changes (a death or a join); a change of blocks or replicas among members reuses it.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from actors.placement import Slot, actor_options, check_identity, discover, probe_pairs
from actors.gpu import recv_lookahead
from actors.job_spec import JobSpec
from actors.stage_worker import StageWorker
from actors import waits
from actors.group_calls import PipelineActorError, WorkerCalls, last_line
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.schedule.lowering import lower
from orchestrator.schedule.nccl import CommLayout, check_hang_free


class WorkerGroup(WorkerCalls):
    """``size`` stage workers; worker ``i`` runs the plan's ``i``-th device (sorted by id)."""

    def __init__(self, size: int, use_gpu: bool | None = None, cpus_per_worker: float = 0.01,
                 slots: Sequence[Slot] | None = None, start_timeout_s: float = 300.0) -> None:
        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, log_to_driver=False)
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if use_gpu is None:
            if 0 < gpus < size:  # a GPU cluster too small for the plan: never fall back to CPU silently
                raise UserError(f"the plan needs {size} GPUs (one per stage worker) but the Ray cluster has {gpus}")
            use_gpu = gpus >= size
        elif use_gpu and gpus < size:
            raise UserError(f"the plan needs {size} GPUs (one per stage worker) but the Ray cluster has {gpus}")
        self.size, self.use_gpu, self.cpus_per_worker = size, use_gpu, cpus_per_worker
        kind = "gpu" if use_gpu else "cpu"
        self.slots = list(slots) if slots is not None else discover(kind, local_slots=size)[:size]
        if len(self.slots) < size:
            raise UserError(f"the plan needs {size} devices but the Ray cluster offers {len(self.slots)} {kind} slot(s)")
        if any(s.kind != kind for s in self.slots):
            raise UserError(f"a {kind} job was given {sorted({s.kind for s in self.slots})} slots")
        self.start_timeout_s = start_timeout_s
        self.identities: list[dict[str, Any]] = []  # where each worker actually runs (reported at start)
        self.actors: list[Any] = []
        self.plan: Plan | None = None
        self.spec: JobSpec | None = None
        self.rank_of: dict[int, int] = {}  # device -> process-group rank (members only)
        self.slot_of: dict[int, int] = {}  # device -> index into ``actors``
        self.dead: set[int] = set()  # actor slots known to have died
        self._starting: dict[Any, tuple[int, float]] = {}  # identity call -> (slot, since) of workers extend started
        self.broken = False
        self._start()

    def _start(self) -> None:
        remote = ray.remote(StageWorker)
        self.actors = [remote.options(max_concurrency=1, **actor_options(s, self.cpus_per_worker)).remote()  # type: ignore[attr-defined]
                       for s in self.slots]
        self.dead = set()
        self.broken = False
        self._starting = {}
        self.identities = self._await(list(range(len(self.actors))))

    def _await(self, indices: list[int]) -> list[dict[str, Any]]:
        """Wait for the workers at ``indices`` to start and check each runs where its slot says."""
        refs = {self.actors[i].identity.remote(): i for i in indices}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=waits.stretched(self.start_timeout_s))
        if pending:
            stuck = sorted(refs[r] for r in pending)
            self._kill(indices)
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
                self._kill(indices)
                raise
        return [seen[i] for i in indices]

    def _get_start(self, ref: Any, index: int, indices: list[int]) -> dict[str, Any]:
        try:
            return dict(ray.get(ref))
        except (RayActorError, RayTaskError) as exc:
            self._kill(indices)
            raise UserError(f"device {index}'s worker failed to start on node {self.slots[index].node_id[:12]}: "
                            f"{last_line(exc)}") from None

    def restart(self) -> None:
        """Kill every worker (a broken process group cannot be repaired in place) and start fresh ones."""
        self._kill()
        self._start()

    def shutdown(self) -> None:
        self._kill()

    def _kill(self, indices: Sequence[int] | None = None) -> None:
        """Kill the workers at ``indices`` (default: all of them, and forget them)."""
        for i, actor in enumerate(self.actors):
            if indices is not None and i not in indices:
                continue
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is fine
                pass
        if indices is None or len(indices) == len(self.actors):
            self.actors = []

    # ----- plan -----
    def configure(self, spec: JobSpec, plan: Plan, timeout_s: float = 300.0, members: Sequence[int] | None = None,
                  slots: Mapping[int, int] | None = None) -> list[dict[str, Any]]:
        """Point workers at ``plan`` and join them in one process group (fresh blocks from the seed).

        Default: the first ``len(plan.devices)`` workers, in device order. ``members`` (a superset
        of the plan's devices) makes idle alive devices ranks too; ``slots`` pins each device to
        an actor slot so a device keeps its process across plans (what live moves rely on).
        """
        devices = sorted(set(plan.devices) | set(members or ()))
        if slots is None:  # device i is slot i (the cluster model's order) when the group has it
            slots = {d: d for d in devices} if devices[-1] < self.size else {d: i for i, d in enumerate(devices)}
        if len(devices) > self.size or any(not 0 <= slots[d] < self.size for d in devices):
            raise UserError(f"plan needs {len(devices)} workers but the group has {self.size}")
        if self.broken:
            self.restart()
        if any(slots[d] in self.dead for d in devices):
            raise UserError(f"device(s) {sorted(d for d in devices if slots[d] in self.dead)} have no live worker")
        self._check_nccl(spec, plan)
        self.plan, self.spec = plan, spec
        self.rank_of = {d: i for i, d in enumerate(devices)}
        self.slot_of = {d: slots[d] for d in devices}
        first = self.actor_of(devices[0])
        host, port = waits.get(first.endpoint.remote(), first, self._name(devices[0]), "with its process-group endpoint", timeout_s)
        refs = [self.actor_of(d).configure.remote(spec, plan.to_dict(), d, self.rank_of, host, port) for d in devices]
        used = set(self.slot_of.values())
        idle = [a.shutdown.remote() for i, a in enumerate(self.actors) if i not in used and i not in self.dead]
        out = self.gather(refs, "setup", timeout_s, devices)
        try:
            ray.get(idle, timeout=timeout_s)
        except RayActorError:
            pass  # an idle worker that died is nobody's loss
        return out

    def move(self, plan: Plan, transfers: Sequence[tuple[int, int, int, int]], members: Sequence[int] | None = None,
             timeout_s: float = 300.0, step: int = 0) -> list[dict[str, Any]]:
        """Live switch to ``plan``: hand over ``(src, dst, first, last)`` block state worker to worker.

        Every worker keeps its process and the blocks it keeps; the process group is re-created
        only when ``members`` differs from the current members (a device died or joined), and
        replica subgroups only for replica sets that are new. A member new to the group (a
        device that joined) gets the job spec and ``step``, the next step to run. Returns the
        workers' reports.
        """
        if self.plan is None:
            raise RuntimeError("configure the group before moving")
        new_members = sorted(set(members if members is not None else self.rank_of) | set(plan.devices))
        for d in new_members:
            self.slot_of.setdefault(d, d)
        if any(self.slot_of[d] in self.dead for d in new_members):
            raise UserError(f"device(s) {sorted(d for d in new_members if self.slot_of[d] in self.dead)} have no live worker")
        old_members = set(self.rank_of)
        rejoin = new_members != sorted(old_members)
        rank_of = {d: i for i, d in enumerate(new_members)} if rejoin else dict(self.rank_of)
        lead = self.actor_of(new_members[0])
        endpoint = waits.get(lead.endpoint.remote(), lead, self._name(new_members[0]), "with its process-group endpoint",
                             timeout_s) if rejoin else None
        old_groups = set() if rejoin else {g for g in self.plan.device_groups if len(g) > 1}
        create = [g for g in plan.device_groups if len(g) > 1 and g not in old_groups]
        leaving = [d for d in self.rank_of if d not in rank_of and self.slot_of[d] not in self.dead]
        assert self.spec is not None
        self._check_nccl(self.spec, plan)
        self.plan, self.rank_of = plan, rank_of
        order = [tuple(t) for t in sorted(transfers)]
        newcomers = {d for d in new_members if d not in old_members}
        refs = [self.actor_of(d).live_move.remote(plan.to_dict(), rank_of, endpoint, order, create, d, self.spec if d in newcomers else None,
                                                  step)
                for d in new_members]
        out = self.gather(refs, "live move", timeout_s, new_members)
        for d in leaving:  # alive but no longer a member: leave the old group cleanly
            try:
                ray.get(self.actor_of(d).shutdown.remote(), timeout=timeout_s)
            except RayActorError:
                self.dead.add(self.slot_of[d])
        self.broken = False
        return out

    def respawn(self, slots: Sequence[int]) -> None:
        """Start fresh processes in dead ``slots`` (a replaced node; tests restoring a shared pool)."""
        remote = ray.remote(StageWorker)
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
        remote = ray.remote(StageWorker)
        self.slots += list(slots)
        self.actors += [remote.options(max_concurrency=1, **actor_options(s, self.cpus_per_worker)).remote()  # type: ignore[attr-defined]
                        for s in slots]
        self.identities += [{} for _ in slots]
        fresh = list(range(first, len(self.actors)))
        since = time.monotonic()
        self._starting.update({self.actors[i].identity.remote(): (i, since) for i in fresh})
        self.size = len(self.actors)
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
            self._kill([i])
            self.dead.add(i)
        return up, failed

    def probe(self, seconds_of: Any = None, links: bool = True,
              timeout_s: float = 300.0) -> tuple[list[float], dict[tuple[int, int], tuple[float, float]]]:
        """Every worker's probe seconds and, with ``links``, ``{(a, b): (latency_s, bytes_per_s)}``
        for the pairs :func:`actors.placement.probe_pairs` picks (before any plan is configured)."""
        everyone = list(range(len(self.actors)))
        self.slot_of = {d: d for d in everyone}
        seconds = self.gather([a.probe_speed.remote(seconds_of) for a in self.actors], "speed probe", timeout_s, everyone)
        measured: dict[tuple[int, int], tuple[float, float]] = {}
        if links and len(self.actors) > 1:
            rank_of = {d: d for d in everyone}
            host, port = ray.get(self.actors[0].endpoint.remote(), timeout=timeout_s)
            self.gather([a.probe_join.remote(host, port, rank_of, d) for d, a in enumerate(self.actors)], "link probe setup",
                        timeout_s, everyone)
            pairs = probe_pairs(self.slots)
            for found in self.gather([a.probe_links.remote(pairs, rank_of) for a in self.actors], "link probe", timeout_s, everyone):
                measured.update(found)
        return [float(s) for s in seconds], measured

    def _check_nccl(self, spec: JobSpec, plan: Plan) -> None:
        """Proof, with the posting rule the workers will use, that ``plan`` cannot hang under
        NCCL's rules (milliseconds; see orchestrator/schedule/nccl.py)."""
        check_hang_free(lower(plan), CommLayout(links="directed", recv_lookahead=recv_lookahead(spec.recv_lookahead, self.use_gpu)))


__all__ = ["GetTimeoutError", "PipelineActorError", "WorkerGroup"]
