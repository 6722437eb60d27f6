"""The set of Ray actors behind a pipeline: creation, placement, rendezvous and failure triage.

A :class:`WorkerGroup` outlives plans: ``configure`` re-partitions the same processes for a new
plan (the process group is rebuilt, the model blocks re-created), which is what re-planning and
restoring under another plan need, and what keeps the test suite from paying the actor start-up
cost (seconds per process) for every plan it checks.

Placement (:mod:`actors.placement`; the processes: :class:`actors.processes.WorkerProcesses`, which the group
owns and which alone owns the actors, their slots and which are dead): worker
``i`` is pinned to slot ``i`` — a GPU or a CPU slot of one named node — with a hard node
affinity, so device ``i`` of the cluster model the plan was made for is the device that runs it. Every worker reports where it actually runs at start
(``identities``) and a worker on the wrong node or accelerator is refused with one line; a slot
that cannot be had (its node lacks the resources) is one line naming the device and what the
node has free, instead of a wait for ever. Without GPUs workers ask for a small CPU fraction,
so several share a laptop's cores (torch threads are divided in the worker).

Failure triage: every remote call goes through :meth:`WorkerGroup.gather`, which waits with a
deadline (:func:`actors.group_calls.collect`) and converts a dead actor into :class:`PipelineActorError`
naming device and stages. When one worker dies its peers fail a little later (their receives time
out or see a closed socket); the death is the root cause, so it is reported in preference to their
errors. A user's mistake raised in a worker (a bad checkpoint, bad data) comes back as the one-line
:class:`UserError` it is. The group alone decides what a failure means for its state: which worker
is dead, and whether its process group is ``broken`` (the next :meth:`configure` restarts every
process).

Live re-partitioning: ``configure(..., members=, slots=)`` pins device ``d`` to actor slot
``slots[d]`` and makes every alive ``member`` (not only the plan's devices) a process-group rank,
so :meth:`WorkerGroup.move` can later give blocks to any member — and drop a dead one — while all
other processes keep running with their state. The process group is rebuilt only when the
membership changes (a death or a join); a change of blocks or replicas among members reuses it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from actors.placement import Slot, discover, probe_pairs
from actors.ray_session import ensure_ray
from actors.gpu import NcclFacts, in_place_hazard, recv_lookahead
from actors import group_calls
from actors.group_calls import PipelineActorError, last_line
from actors.metrics import MoveReply
from actors.processes import WorkerProcesses
from actors.stage_worker import StageWorker
from actors.storage_env import StorageFailed
from actors.user_code import UserCodeError
from actors.job_spec import JobSpec
from actors import waits
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.schedule.lowering import lower
from orchestrator.schedule.nccl import CommLayout, check_hang_free

R = TypeVar("R")


class WorkerGroup:
    """``size`` stage workers; worker ``i`` runs the plan's ``i``-th device (sorted by id)."""

    def __init__(self, size: int, use_gpu: bool | None = None, cpus_per_worker: float = 0.01,
                 slots: Sequence[Slot] | None = None, start_timeout_s: float = 300.0) -> None:
        if not ray.is_initialized():
            ensure_ray()
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if use_gpu is None:
            if 0 < gpus < size:  # a GPU cluster too small for the plan: never fall back to CPU silently
                raise UserError(f"the plan needs {size} GPUs (one per stage worker) but the Ray cluster has {gpus}")
            use_gpu = gpus >= size
        elif use_gpu and gpus < size:
            raise UserError(f"the plan needs {size} GPUs (one per stage worker) but the Ray cluster has {gpus}")
        kind = "gpu" if use_gpu else "cpu"
        slots = list(slots) if slots is not None else discover(kind, local_slots=size)[:size]
        if len(slots) < size:
            raise UserError(f"the plan needs {size} devices but the Ray cluster offers {len(slots)} {kind} slot(s)")
        if any(s.kind != kind for s in slots):
            raise UserError(f"a {kind} job was given {sorted({s.kind for s in slots})} slots")
        self.plan: Plan | None = None
        self.spec: JobSpec | None = None
        self.rank_of: dict[int, int] = {}  # device -> process-group rank (members only)
        self.slot_of: dict[int, int] = {}  # device -> worker slot (index into the processes)
        self.broken = False  # the process group is unusable after a failure: the next configure restarts everyone
        self.processes = WorkerProcesses(slots, use_gpu, cpus_per_worker, start_timeout_s)

    # ----- the processes (read-only views; WorkerProcesses owns them) -----
    @property
    def size(self) -> int:
        return self.processes.size

    @property
    def use_gpu(self) -> bool:
        return self.processes.use_gpu

    @property
    def identities(self) -> list[dict[str, Any]]:
        return self.processes.identities

    @property
    def dead(self) -> frozenset[int]:
        """Worker slots known to have died."""
        return frozenset(self.processes.dead)

    def in_place_hazard(self) -> str | None:
        """Why recovery in place cannot be made safe on the workers' NCCL (:func:`actors.gpu.in_place_hazard`), or
        ``None`` (gloo, or a safe NCCL); the oldest install among the workers decides."""
        if not self.use_gpu:
            return None
        seen = [i.get("nccl") for i in self.identities]
        hazards = [in_place_hazard("nccl", f if isinstance(f, NcclFacts) else None) for f in seen]
        return next((h for h in hazards if h is not None), None)

    def node_of(self, device: int) -> str:
        """The Ray node id of ``device``'s worker slot (where it was placed)."""
        return self.processes.slots[self.slot_of.get(device, device)].node_id

    def node_lost_slots(self) -> set[int]:
        return self.processes.node_lost_slots()

    def unreachable_slots(self) -> set[int]:
        return self.processes.unreachable_slots()

    def restart(self) -> None:
        """Every worker in a fresh process (see :meth:`WorkerProcesses.restart`): the process group is usable again."""
        self.processes.restart()
        self.broken = False

    def respawn(self, slots: Sequence[int]) -> None:
        self.processes.respawn(slots)

    def extend(self, slots: Sequence[Slot]) -> list[int]:
        return self.processes.extend(slots)

    def started(self, timeout_s: float = 0.0) -> tuple[list[int], list[tuple[int, str]]]:
        return self.processes.started(timeout_s)

    def shutdown(self) -> None:
        self.processes.kill()

    def hung(self, devices: Sequence[int], timeout_s: float = 10.0) -> list[int]:
        """Of ``devices`` (blocked past a deadline), those that are hung themselves: making no progress in an action
        that does not wait for a peer (the others wait for them). Asked on each worker's probe thread; a worker
        that cannot answer counts as hung. When every one waits for another (a wedged collective), all are."""
        refs = {d: self.actor_of(d).progress.remote() for d in devices}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        culprits = []
        for d, ref in refs.items():
            try:
                state = ray.get(ref, timeout=0) if ref in ready else None
            except (RayActorError, RayTaskError, GetTimeoutError):
                state = None
            if state is None or not state.waiting:
                culprits.append(d)
        return culprits or list(devices)

    def kill_worker(self, device: int) -> None:
        """Fault injection from the driver side (tests): hard-kill one worker."""
        ray.kill(self.actor_of(device), no_restart=True)
        self.processes.mark_dead(self.slot_of[device])

    # ----- plan -----
    def configure(self, spec: JobSpec, plan: Plan, timeout_s: float = 300.0, members: Sequence[int] | None = None,
                  slots: Mapping[int, int] | None = None, keep_copies: bool = False) -> list[dict[str, Any]]:
        """Point workers at ``plan`` and join them in one process group (fresh blocks from the seed).

        Default: the first ``len(plan.devices)`` workers, in device order. ``members`` (a superset
        of the plan's devices) makes idle alive devices ranks too; ``slots`` pins each device to
        an actor slot so a device keeps its process across plans (what live moves rely on).
        ``keep_copies``: the workers keep their host copies of block state (:meth:`reform` restores from them).
        """
        devices = sorted(set(plan.devices) | set(members or ()))
        if slots is None:  # device i is slot i (the cluster model's order) when the group has it
            slots = {d: d for d in devices} if devices[-1] < self.size else {d: i for i, d in enumerate(devices)}
        if len(devices) > self.size or any(not 0 <= slots[d] < self.size for d in devices):
            raise UserError(f"plan needs {len(devices)} workers but the group has {self.size}")
        if self.broken:
            self.restart()
        up = {n["NodeID"] for n in ray.nodes() if n.get("Alive")} if any(slots[d] in self.dead for d in devices) else set()
        respawnable = sorted(slots[d] for d in devices if slots[d] in self.dead and self.processes.slots[slots[d]].node_id in up)
        if respawnable:  # a fresh configuration of a pool that lost workers (recovered in place before): new processes
            self.respawn(respawnable)
        if any(slots[d] in self.dead for d in devices):
            raise UserError(f"device(s) {sorted(d for d in devices if slots[d] in self.dead)} have no live worker")
        self._check_nccl(spec, plan)
        self.plan, self.spec = plan, spec
        self.rank_of = {d: i for i, d in enumerate(devices)}
        self.slot_of = {d: slots[d] for d in devices}
        first = self.actor_of(devices[0])
        host, port = waits.get(first.endpoint.remote(), first, self._name(devices[0]), "with its process-group endpoint", timeout_s)
        refs = [self.actor_of(d).configure.remote(spec, plan.to_dict(), d, self.rank_of, host, port, keep_copies) for d in devices]
        used = set(self.slot_of.values())
        idle = [a.shutdown.remote() for i, a in enumerate(self.processes.actors) if i not in used and i not in self.dead]
        out = self.gather(refs, "setup", timeout_s, devices)
        try:
            ray.get(idle, timeout=timeout_s)
        except RayActorError:
            pass  # an idle worker that died is nobody's loss
        return out

    def know_devices(self, devices: Sequence[int]) -> None:
        """Devices the caller counts on that the group has not placed yet (idle ones that joined, not members of
        the process group) run on their own slot: device ``d`` is worker slot ``d``."""
        for d in devices:
            self.slot_of.setdefault(d, d)

    def deaths_known(self) -> None:
        """The caller knows which workers died and configures the survivors next: the group is not broken any more,
        so :meth:`configure` keeps the survivors' processes instead of restarting every worker."""
        self.broken = False

    def reform(self, spec: JobSpec, plan: Plan, survivors: Sequence[int], timeout_s: float = 300.0) -> list[dict[str, Any]]:
        """After a death without notice: configure ``plan`` on the surviving workers in their own processes.

        Why not :meth:`configure` as after any failure: that restarts every process of a broken group, which costs
        seconds per process and all their memory. Here the survivors aborted their communicators when their
        iteration failed (:meth:`actors.stage_worker.StageWorker.abort`), so a new process group among them forms
        as for a newcomer, each device keeps its actor slot, and every survivor is a member (the devices ``plan``
        leaves idle too, so growth and moves can use them). Blocks come fresh from the seed: the caller restores
        the state (:meth:`orchestrator.train.runtime.PipelineRuntime.recover_in_place`)."""
        gone = [d for d in survivors if self.slot_of.get(d, d) in self.dead]
        if gone:
            raise UserError(f"device(s) {gone} have no live worker")
        slots = {d: self.slot_of.get(d, d) for d in survivors}
        self.broken = False
        return self.configure(spec, plan, timeout_s, members=survivors, slots=slots, keep_copies=True)

    def call_each(self, method: Callable[..., R], args_of: Mapping[int, tuple[Any, ...]], what: str = "",
                  timeout_s: float = 600.0) -> list[R]:
        """Call ``method`` on each device of ``args_of`` with its own arguments, in parallel; results in that order."""
        refs, targets = self.submit_each(method, args_of)
        return self.gather(refs, what or method.__name__, timeout_s, targets)

    def submit_each(self, method: Any, args_of: Mapping[int, tuple[Any, ...]]) -> tuple[list[Any], list[int]]:
        """Start ``method`` on each device of ``args_of`` with its own arguments without waiting (as :meth:`submit`);
        an object ref among the arguments is that call's result once it exists (Ray resolves it first). ``method``
        is typed loosely for the methods of a concurrency group (``ray.method`` types them as Ray's own wrapper)."""
        targets = list(args_of)
        return [getattr(self.actor_of(d), method.__name__).remote(*args_of[d]) for d in targets], targets

    def move(self, plan: Plan, transfers: Sequence[tuple[int, int, int, int]], members: Sequence[int] | None = None,
             timeout_s: float = 300.0, step: int = 0) -> list[MoveReply]:
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
        rejoin = new_members != sorted(old_members) or self.broken  # after a failure the communicators were aborted
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
        # Alive but no longer a member: it leaves the old group while the members re-join, not after. Under NCCL the
        # members' re-join destroys the old communicators, which may wait for every old rank, the leaver included.
        left = {d: self.actor_of(d).shutdown.remote() for d in leaving}
        out = self.gather(refs, "live move", timeout_s, new_members)
        for d, ref in left.items():
            try:
                ray.get(ref, timeout=timeout_s)
            except RayActorError:
                self.processes.mark_dead(self.slot_of[d])
        self.broken = False
        return out

    def probe(self, seconds_of: Any = None, links: bool = True,
              timeout_s: float = 300.0) -> tuple[list[float], dict[tuple[int, int], tuple[float, float]]]:
        """Every worker's probe seconds and, with ``links``, ``{(a, b): (latency_s, bytes_per_s)}``
        for the pairs :func:`actors.placement.probe_pairs` picks (before any plan is configured)."""
        actors = self.processes.actors
        everyone = list(range(len(actors)))
        self.slot_of = {d: d for d in everyone}
        seconds = self.gather([a.probe_speed.remote(seconds_of) for a in actors], "speed probe", timeout_s, everyone)
        measured: dict[tuple[int, int], tuple[float, float]] = {}
        if links and len(actors) > 1:
            rank_of = {d: d for d in everyone}
            host, port = ray.get(actors[0].endpoint.remote(), timeout=timeout_s)
            self.gather([a.probe_join.remote(host, port, rank_of, d) for d, a in enumerate(actors)], "link probe setup",
                        timeout_s, everyone)
            pairs = probe_pairs(self.processes.slots)
            for found in self.gather([a.probe_links.remote(pairs, rank_of) for a in actors], "link probe", timeout_s, everyone):
                measured.update(found)
        return [float(s) for s in seconds], measured

    # ----- calls and triage (waiting: actors/group_calls.py; the consequences for the group's state: here) -----
    def actor_of(self, device: int) -> Any:
        return self.processes.actor(self.slot_of[device])

    def plan_devices(self) -> list[int]:
        return sorted(self.plan.devices) if self.plan is not None else sorted(self.rank_of)

    def call(self, method: Callable[..., R], *args: Any, devices: Sequence[int] | None = None, what: str = "",
             timeout_s: float = 600.0) -> list[R]:
        """Call ``method`` (a :class:`~actors.stage_worker.StageWorker` method, named by reference: ``StageWorker.status``,
        so that the name is checked and the reply typed) on the workers of ``devices`` (default: the plan's devices)
        in parallel."""
        refs, targets = self.submit(method, *args, devices=devices)
        return self.gather(refs, what or method.__name__, timeout_s, targets)

    def submit(self, method: Callable[..., Any], *args: Any, devices: Sequence[int] | None = None) -> tuple[list[Any], list[int]]:
        """Start ``method`` on the workers of ``devices`` without waiting: ``(refs, devices)`` for
        :meth:`gather` (or :meth:`discard`). Workers run one call at a time (``max_concurrency=1``)
        in submission order, so a call submitted while an earlier one runs waits behind it."""
        targets = list(devices) if devices is not None else self.plan_devices()
        return [getattr(self.actor_of(d), method.__name__).remote(*args) for d in targets], targets

    def gather(self, refs: list[Any], what: str, timeout_s: float, devices: Sequence[int] | None = None) -> list[Any]:
        """The results of ``refs`` (one per device, default the members), or the failure, triaged (module docstring)."""
        devs = list(devices) if devices is not None else sorted(self.rank_of)
        got = group_calls.collect(refs, devs, timeout_s)
        if got.died is not None:
            dev, exc = got.died
            self.broken = True
            if dev in self.slot_of:
                self.processes.mark_dead(self.slot_of[dev])
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PipelineActorError(f"{self._name(dev)} died during {what}: {detail}", dev, self._stages(dev), died=True) from None
        if got.failure is not None:
            dev, err = got.failure
            if got.pending or got.superseded:  # peers blocked or failed (on the failed one): the process group is unusable
                self.broken = True
            if isinstance(err, StorageFailed):  # the store, not this worker: nothing to recover (the job ends on it)
                raise err.with_traceback(None) from None
            if isinstance(err, UserError):  # a user mistake (bad checkpoint, bad data): say it plainly, keep its type and trace
                trace = str(getattr(err, "trace", "") or "")
                if isinstance(err, RayTaskError):
                    raise (UserCodeError(str(err), trace) if trace else UserError(str(err))) from None
                raise err.with_traceback(None) from None
            self.broken = True
            raise PipelineActorError(f"{what} failed on {self._name(dev)}: {type(err).__name__}: {last_line(err)}",
                                     dev, self._stages(dev)) from err
        if got.pending:
            self.broken = True
            names = ", ".join(self._name(d) for d in got.pending)
            raise PipelineActorError(f"{what} timed out after {timeout_s:.0f}s waiting for {names}", got.pending[0],
                                     pending=got.pending)
        return [got.results[d] for d in devs]

    def discard(self, refs: Sequence[Any], grace_s: float = 2.0) -> None:
        """Drop submitted calls whose results are no longer wanted (an earlier call failed). Nothing is cancelled
        (see :mod:`actors.group_calls`); if any of them ran, or may still run, those workers' state is unknown and
        the group is marked broken, so the next :meth:`configure` starts fresh processes. A group already broken is
        restarted anyway: nothing to wait for."""
        if not self.broken and refs and group_calls.ran_after_failure(refs, grace_s):
            self.broken = True

    def release(self, devices: Sequence[int], timeout_s: float = 10.0) -> None:
        """NCCL: free the workers of ``devices`` from waits on a dead peer (:meth:`StageWorker.release`, on each
        worker's probe thread); their iterations then fail as on gloo. Nothing on CPU workers (see there)."""
        if not self.use_gpu:
            return
        refs = [self.actor_of(d).release.remote() for d in devices if self.slot_of.get(d, d) not in self.processes.dead]
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)

    def unresponsive(self, devices: Sequence[int], timeout_s: float) -> set[int]:
        """Devices among ``devices`` whose worker is dead or does not answer within ``timeout_s`` (marked dead).

        After a death the survivors finish (fail) the interrupted iteration first — each worker
        runs one call at a time — so ``timeout_s`` should exceed the per-operation timeout. A
        node that went away takes all its workers; only the first error names one of them.
        """
        gone = {d for d in devices if self.slot_of.get(d, d) in self.processes.dead}
        asked = {self.processes.actor(self.slot_of.get(d, d)).status.remote(): d for d in devices if d not in gone}
        gone |= group_calls.unanswered(asked, timeout_s) if asked else set()
        for d in gone:
            self.processes.mark_dead(self.slot_of.get(d, d))
        return gone

    def _stages(self, device: int) -> list[int]:
        return self.plan.stages_of_device(device) if self.plan is not None else []

    def _name(self, device: int) -> str:
        if self.plan is None:
            return f"device {device}"
        stages = self._stages(device)
        blocks = ", ".join(f"[{self.plan.stages[j].first},{self.plan.stages[j].last})" for j in stages)
        return f"stage {'/'.join(map(str, stages))} (device {device}, blocks {blocks})"

    def _check_nccl(self, spec: JobSpec, plan: Plan) -> None:
        """Proof, with the posting rule the workers will use, that ``plan`` cannot hang under
        NCCL's rules (milliseconds; see orchestrator/schedule/nccl.py)."""
        check_hang_free(lower(plan), CommLayout(links="directed", recv_lookahead=recv_lookahead(spec.recv_lookahead, self.use_gpu)))


__all__ = ["GetTimeoutError", "PipelineActorError", "WorkerGroup"]
