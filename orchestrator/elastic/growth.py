"""Capacity gain → live growth: devices that join get stage actors, and blocks when it pays.

Signals, read between iterations: Ray's node table (:class:`actors.placement.NodeTable`: a
new node with the job's kind of device brings one slot per GPU, or per CPU), every
``ScalingConfig.node_poll_s``; and rehearsed joins (:class:`~orchestrator.adapt.faults.Join`
in ``AdaptConfig.faults``, at the iteration they name), as injected notices rehearse preemptions.

A joined device takes the next device id of the nominal cluster, up to
``ScalingConfig.max_devices`` (ids are never reused, so device ``d`` stays worker slot ``d``).
It gets a stage worker on its slot (:meth:`WorkerGroup.extend`; nobody else is touched), and
once that worker is up (training goes on meanwhile: an actor start takes seconds) it is an
alive, idle device of the job. It joins the process group
at the next live move that makes it a member: the controller's arbiter sees it appear and ranks
the two-worker moves that give it blocks (its GROW moves, and the path to a re-plan over the
grown set), switching when the predicted gain over the remaining iterations pays for the move;
an evacuation may also hand it a doomed device's blocks. At that move every surviving worker
keeps its process and its blocks, destroys its process group and joins a new one over a fresh
rendezvous with the new world size and rank map — gloo on CPUs; on GPUs the NCCL communicators
are created anew the same way (:func:`actors.transport.init_group`, bound to the device) — and
the new worker receives block state (weights and optimizer state) from its neighbour: exact, no
step lost. When the arbiter says no move pays, nothing is re-formed and the device waits idle.

One ``"capacity_added"`` event per join, written once the arbiter has decided: the devices and
their nodes, the source, and the moves made or why none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from actors.placement import NodeTable, Slot
from orchestrator.adapt.controller import StepRecord
from orchestrator.adapt.faults import Join
from orchestrator.adapt.policies import Stay, Switch
from orchestrator.core.errors import UserError

if TYPE_CHECKING:
    from orchestrator.elastic.job_view import JobView


@dataclass(frozen=True)
class Joined:
    """Devices that joined at ``step`` and are up, waiting for the arbiter's word."""

    devices: tuple[dict[str, Any], ...]
    source: str
    step: int


def check_joins(faults: Sequence[Any], devices: int, capacity: int) -> None:
    """Rehearsed joins name the next device ids in order (``devices``, ``devices + 1``, ...), within
    ``max_devices``: a device id is a worker slot, handed out once."""
    joins = sorted((f for f in faults if isinstance(f, Join)), key=lambda f: f.at_iteration)
    want = list(range(devices, devices + len(joins)))
    if [f.device for f in joins] != want or (joins and want[-1] >= capacity):
        raise UserError(f"AdaptConfig: rehearsed joins must name devices {devices}, {devices + 1}, ... in the order they join, "
                        f"below ScalingConfig.max_devices ({capacity}); got {[f.device for f in joins]}")


class Growth:
    """The job's capacity watch and its joins (see the module docstring)."""

    def __init__(self, job: "JobView") -> None:
        self.job = job
        self.placed = job.scaling.devices  # device ids below this have (had) a worker
        self.enabled = job.scaling.capacity > job.scaling.devices
        self.node_table: NodeTable | None = None
        self.polled = 0.0
        self.fired: set[Join] = set()
        self.waiting: dict[int, tuple[str, int]] = {}  # device -> (source, step): its worker is starting
        self.pending: list[Joined] = []  # up, waiting for the arbiter's word

    def poll(self, step: int) -> None:
        """Between iterations: rehearsed joins due at ``step`` and new Ray nodes become devices;
        workers started earlier that are up now become alive devices of the job."""
        job = self.job
        if not self.enabled:
            return
        for f in job.adapt.faults.faults:
            if isinstance(f, Join) and f.at_iteration <= step and f not in self.fired:
                self.fired.add(f)
                self.join([None], f"rehearsal: device {f.device} joins", step)
        if job.scaling.node_poll_s and self.node_table is None:  # the nodes there now are the job's start
            self.node_table = NodeTable(job.runtime.kind)
            self.polled = time.monotonic()
        elif self.node_table is not None and time.monotonic() - self.polled >= job.scaling.node_poll_s:
            self.polled = time.monotonic()
            _, gained = self.node_table.poll()
            if gained:
                nodes = ", ".join(sorted({s.node_id[:12] for s in gained}))
                self.join(list(gained), f"ray: node {nodes} added", step)
        if self.waiting:
            up, failed = job.runtime.workers_up(self.waiting)
            self._up(up)
            for d, why in failed:
                source, at = self.waiting.pop(d)
                job.emit("capacity_added", step=at, source=source, devices=[], decision="none", moves=[],
                         reason=f"device {d}'s worker did not start: {why}")

    def join(self, slots: Sequence[Slot | None], source: str, step: int) -> None:
        """Start a worker for each slot (``None``: a spare local slot, the rehearsal) as the next
        device ids, without waiting; each becomes an alive device once it is up."""
        job = self.job
        started = 0
        for slot in slots:
            d = self.placed
            if d >= job.scaling.capacity:
                break
            try:
                job.runtime.add_worker(d, slot)
            except UserError as exc:
                job.emit("capacity_added", step=step, source=source, devices=[], decision="none", moves=[],
                         reason=f"no worker for device {d}: {exc}")
                return
            self.placed += 1
            self.waiting[d] = (source, step)
            started += 1
        if started < len(slots):
            job.emit("capacity_added", step=step, source=source, devices=[], decision="none", moves=[], ignored=len(slots) - started,
                     reason=f"the job has its maximum of {job.scaling.capacity} devices (ScalingConfig.max_devices)")

    def _up(self, devices: list[int]) -> None:
        """Workers that came up: alive devices of the job; the arbiter is asked at the next step."""
        job = self.job
        joined: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for d in devices:
            if d not in self.waiting:
                continue
            job.device_joined(d)
            joined.setdefault(self.waiting.pop(d), []).append({"device": d, "node_id": job.runtime.node_of(d)})
        self.pending += [Joined(tuple(found), source, step) for (source, step), found in joined.items()]
        if joined and job.controller is None:
            self.decided(None, [])

    def decided(self, record: StepRecord | None, moves: list[tuple[int, int]]) -> None:
        """After a controller step (``None``: adaptation is off): the pending joins' event, once
        the arbiter has decided; ``moves``: the (from, to) hand-overs that step carried out."""
        if not self.pending:
            return
        if record is None:
            fields: dict[str, Any] = {"decision": "none", "reason": "adaptation is switched off (AdaptConfig.enabled=False): "
                                      "the new devices wait idle, for evacuations"}
        elif record.decision is None:
            return  # the controller is still warming up: it decides once it knows the iteration time
        elif isinstance(record.decision, Switch):  # live moves, or the stop-and-restart option
            fields = {"decision": "move" if record.action in ("move", "path-move") else record.action,
                      "reason": record.decision.option.label, "predicted_gain_s": round(record.decision.gain_s, 6),
                      "stall_s": round(record.action_s, 4)}
        elif isinstance(record.decision, Stay):
            fields = {"decision": "stay", "reason": record.decision.reason, "predicted_gain_s": round(record.decision.best_gain_s, 6),
                      "switch_cost_s": round(record.decision.best_cost_s, 4)}
        else:
            fields = {"decision": record.action or type(record.decision).__name__, "reason": type(record.decision).__name__}
        job = self.job
        used = set(job.runtime.plan.devices)
        for j in self.pending:
            job.emit("capacity_added", step=j.step, source=j.source, devices=list(j.devices), decided_step=job.runtime.step, moves=[list(m) for m in moves], plan=job.runtime.plan.describe(),
                     holding_blocks=[d["device"] for d in j.devices if d["device"] in used], **fields)
        self.pending.clear()

    def finish(self) -> None:
        """At the end of ``fit``: joins the arbiter never got to decide on are recorded so (a worker
        still starting stays waiting: a later ``fit`` may use it)."""
        job = self.job
        for j in self.pending:
            job.emit("capacity_added", step=j.step, source=j.source, devices=list(j.devices), decision="none",
                     moves=[], reason="the job ended before the controller decided")
        self.pending.clear()
