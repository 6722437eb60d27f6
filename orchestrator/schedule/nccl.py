"""NCCL's rules, replayed: proof on CPU that a lowered schedule cannot hang on GPUs.

Gloo matches point-to-point messages by tag in background threads and forgives almost any
order; NCCL does not. This module replays a device's program the way the GPU runtime issues it
(:mod:`actors.execution`) under the rules of ``ProcessGroupNCCL`` and reports the first hang it
finds, with the validator's device × step grid. The rules modelled:

* **Streams.** Each communicator has one CUDA stream per rank; its operations run in the order
  the host enqueued them, each starting only after the previous one finished. Compute runs in
  program order on the rank's compute stream.
* **Enqueue dependency.** Enqueuing a send, a receive or a collective makes its stream wait for
  everything already enqueued on the compute stream (torch's ``syncStream``); ``work.wait()``
  makes the compute stream wait for that operation.
* **Matching.** Point-to-point operations pair up in order per (sender, receiver) on a
  communicator; tags are ignored. A collective completes once every member started it.
* **Buffer-size-dependent completion.** A send of at most ``eager_bytes`` completes without its
  receiver (NCCL's internal buffer takes it); a larger one completes only when the matching
  receive has started, and a receive only when its send has started.
* **Blocking host syncs.** A host sync (``torch.cuda.synchronize()``, ``.item()``) stops the host
  from enqueuing anything further until all enqueued work has finished.

:class:`CommLayout` describes how a runtime lays its operations onto communicators. The
runtime's layout is :data:`RUNTIME_LAYOUT`: one communicator per *directed* link, so forward
activations and backward gradients between two neighbours never share a stream and can never
meet head to head, whatever the order of the two directions in the program. ``links="pair"``
(torch's default, one communicator per unordered rank pair carrying both directions) is kept
for tests that show the model is sharp: it hangs the 1F1B steady state even with receives
posted at their own position.

The receive-posting rule (:func:`recv_post_points`) is the runtime's own: the executor calls it
to decide which receives to post before which action, so what is proved here is what runs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

from orchestrator.core.plan import Plan
from orchestrator.schedule.ir import Action, Kind, Schedule
from orchestrator.schedule.validate import ScheduleError, render_grid

_RECV = (Kind.RECV_F, Kind.RECV_B)
_SEND = (Kind.SEND_F, Kind.SEND_B)


@dataclass(frozen=True)
class CommLayout:
    """How a runtime issues communication (see module docstring for each rule)."""

    links: str = "directed"  # "directed": a communicator per directed link; "pair": per unordered pair
    recv_lookahead: int = 1  # receives are posted this many program actions early (1: at their own action)
    eager_bytes: int = 0  # sends up to this size complete without their receiver (0: every send rendezvous)
    host_sync_compute: bool = False  # a host sync before and after every compute action (a naive timer)
    serialised: bool = False  # CUDA_DEVICE_MAX_CONNECTIONS=1: every stream of a device feeds one hardware queue
    step_host_sync: bool = False  # a host read after the step collectives (fp16 loss scaling's overflow flag)

    def __post_init__(self) -> None:
        if self.links not in ("directed", "pair"):
            raise ValueError(f"links must be 'directed' or 'pair', not {self.links!r}")
        if self.recv_lookahead < 1:
            raise ValueError("recv_lookahead must be at least 1")


RUNTIME_LAYOUT = CommLayout(links="directed", recv_lookahead=8)


def recv_post_points(program: Sequence[Action], lookahead: int) -> list[tuple[int, ...]]:
    """For each action index ``i``, the receive indices to post just before running it.

    A receive at index ``r`` is posted before action ``max(0, r - lookahead + 1)``, i.e. every
    receive whose index is below ``i + lookahead`` has been posted when action ``i`` runs.
    """
    out: list[tuple[int, ...]] = [()] * len(program)
    recv_at = [i for i, a in enumerate(program) if a.kind in _RECV]
    nxt = 0
    for i in range(len(program)):
        start = nxt
        while nxt < len(recv_at) and recv_at[nxt] < i + lookahead:
            nxt += 1
        out[i] = tuple(recv_at[start:nxt])
    return out


def gradient_launch_points(program: Sequence[Action]) -> dict[int, int]:
    """For each replicated stage, the index of the action during which its gradient all-reduces start -> the stage.

    It is the stage's last weight-gradient action (``B`` or ``W``) before its ``ALL_REDUCE``: the buckets start as
    their gradients become final in it (:mod:`actors.grad_sync`), and the ``ALL_REDUCE`` action only waits.
    """
    out: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, a in enumerate(program):
        if a.kind.grads_weights:
            last[a.stage] = i
        elif a.kind is Kind.ALL_REDUCE and a.stage in last:
            out[last[a.stage]] = a.stage
    return out


# Operation kinds of the replay.
_COMPUTE, _WAIT, _SEND_OP, _RECV_OP, _COLL = range(5)


@dataclass
class _Op:
    kind: int
    device: int
    index: int  # program index of the action it comes from (for the error grid)
    stream: tuple[int, tuple]  # (device, stream key)
    dep: int = 0  # compute-stream ops of this device that must finish first (comm ops)
    match: tuple = ()  # p2p: (src, dst, nth); collective: (group, nth)
    waits_for: int = -1  # _WAIT: the op id awaited
    nbytes: int = 1 << 62
    started: bool = False
    done: bool = False


def check_hang_free(schedule: Schedule, layout: CommLayout = RUNTIME_LAYOUT,
           message_bytes: Callable[[Action], int] | None = None, step_groups: Sequence[tuple[int, ...]] = ()) -> None:
    """Raise :class:`ScheduleError` if ``schedule`` can hang under NCCL's rules and ``layout``.

    ``message_bytes(action)`` gives a send's size (default: larger than any buffer, the worst case:
    an eager send only ever finishes earlier, which cannot create a hang). ``step_groups``: the
    collectives of the optimizer step (:func:`step_groups`), all-reduced in this order by each
    member before its first STEP action, each on its own communicator.
    """
    ops: list[_Op] = []
    hosts: dict[int, list[tuple[str, int]]] = {}  # device -> host items: ("op", id) | ("sync", 0)
    by_match: dict[tuple, int] = {}
    plan = schedule.plan
    for dev, program in sorted(schedule.programs.items()):
        items: list[tuple[str, int]] = []
        compute_count = 0
        sent: dict[tuple[int, int], int] = defaultdict(int)
        received: dict[tuple[int, int], int] = defaultdict(int)
        reduced: dict[tuple, int] = defaultdict(int)
        posted: dict[int, int] = {}
        send_ops: list[int] = []

        def add(op: _Op) -> int:
            ops.append(op)
            items.append(("op", len(ops) - 1))
            return len(ops) - 1

        def link_stream(src: int, dst: int) -> tuple:
            return ("L", src, dst) if layout.links == "directed" else ("P", min(src, dst), max(src, dst))

        def post(r: int) -> None:
            a = program[r]
            src, dst = a.peer, dev
            nth = received[(src, dst)]
            received[(src, dst)] += 1
            op_id = add(_Op(_RECV_OP, dev, r, (dev, link_stream(src, dst)), compute_count, ("p2p", src, dst, nth)))
            by_match[("recv", src, dst, nth)] = op_id
            posted[r] = op_id

        def compute(i: int) -> None:
            nonlocal compute_count
            if layout.host_sync_compute:
                items.append(("sync", 0))
            add(_Op(_COMPUTE, dev, i, (dev, ("C",))))
            compute_count += 1
            if layout.host_sync_compute:
                items.append(("sync", 0))

        def wait(i: int, op_id: int) -> None:
            nonlocal compute_count
            add(_Op(_WAIT, dev, i, (dev, ("C",)), waits_for=op_id))
            compute_count += 1

        def reduce_grads(i: int, stage: int) -> int:
            group = plan.stages[stage].devices
            nth = reduced[group]
            reduced[group] += 1
            return add(_Op(_COLL, dev, i, (dev, ("G",) + tuple(group)), compute_count, ("coll", group, nth)))

        post_before = recv_post_points(program, layout.recv_lookahead)
        launch = gradient_launch_points(program)
        reducing: dict[int, int] = {}  # stage -> its gradient all-reduce, started during its last backward
        stepped = False
        for i, a in enumerate(program):
            for r in post_before[i]:
                post(r)
            if a.kind is Kind.STEP and not stepped:  # StepHooks.before: tied sums, then the norm/flag all-reduce
                stepped = True
                for g in step_groups:
                    if dev in g:
                        nth = reduced[("S",) + g]
                        reduced[("S",) + g] += 1
                        op_id = add(_Op(_COLL, dev, i, (dev, ("S",) + g), compute_count, ("coll", ("S",) + g, nth)))
                        wait(i, op_id)
                if layout.step_host_sync:
                    items.append(("sync", 0))
            if a.kind.is_compute or a.kind is Kind.STEP:
                compute(i)
                if i in launch:  # the buckets start as the backward finishes them: after its compute
                    reducing[a.stage] = reduce_grads(i, a.stage)
            elif a.kind in _RECV:
                wait(i, posted.pop(i))
            elif a.kind in _SEND:
                src, dst = dev, a.peer
                nth = sent[(src, dst)]
                sent[(src, dst)] += 1
                size = message_bytes(a) if message_bytes is not None else 1 << 62
                op_id = add(_Op(_SEND_OP, dev, i, (dev, link_stream(src, dst)), compute_count, ("p2p", src, dst, nth), nbytes=size))
                by_match[("send", src, dst, nth)] = op_id
                send_ops.append(op_id)
            elif a.kind is Kind.ALL_REDUCE:  # the compute stream waits for the stage's buckets
                started = reducing.pop(a.stage, None)
                wait(i, reduce_grads(i, a.stage) if started is None else started)
        for op_id in send_ops:  # the end of the iteration waits for every send
            wait(len(program), op_id)
        items.append(("sync", 0))
        hosts[dev] = items
    if layout.serialised:  # one hardware queue per device: every op runs in its host's enqueue order
        for op in ops:
            op.stream = (op.device, ("Q",))
    _run(schedule, ops, hosts, by_match, layout)


def _run(schedule: Schedule, ops: list[_Op], hosts: dict[int, list[tuple[str, int]]],
         by_match: dict[tuple, int], layout: CommLayout) -> None:
    """Advance every host and stream as far as the rules allow; what cannot finish is a hang."""
    streams: dict[tuple[int, tuple], list[int]] = defaultdict(list)
    compute_done: dict[int, int] = defaultdict(int)
    unfinished: dict[int, int] = defaultdict(int)  # device -> enqueued ops not yet done
    members: dict[tuple, list[int]] = defaultdict(list)
    for op_id, op in enumerate(ops):
        if op.kind == _COLL:
            members[op.match].append(op_id)
    host_at = {d: 0 for d in hosts}
    head: dict[tuple[int, tuple], int] = defaultdict(int)  # stream -> index of its first unfinished op

    def finished(op: _Op) -> bool:
        if op.kind == _COMPUTE:
            return True
        if op.kind == _WAIT:
            return ops[op.waits_for].done
        if op.kind == _COLL:
            return all(ops[m].started for m in members[op.match])
        if op.kind == _SEND_OP and op.nbytes <= layout.eager_bytes:
            return True
        _, src, dst, nth = op.match
        other = by_match.get(("recv" if op.kind == _SEND_OP else "send", src, dst, nth))
        return other is not None and ops[other].started

    progress = True
    while progress:
        progress = False
        for dev, items in hosts.items():  # a host enqueues until a sync finds unfinished work
            while host_at[dev] < len(items):
                what, op_id = items[host_at[dev]]
                if what == "sync":
                    if unfinished[dev]:
                        break
                else:
                    streams[ops[op_id].stream].append(op_id)
                    unfinished[dev] += 1
                host_at[dev] += 1
                progress = True
        for key, queue in streams.items():
            while head[key] < len(queue):
                op = ops[queue[head[key]]]
                if not op.started:
                    if op.kind in (_SEND_OP, _RECV_OP, _COLL) and compute_done[op.device] < op.dep:
                        break
                    op.started = True
                    progress = True
                if not finished(op):
                    break
                op.done = True
                unfinished[op.device] -= 1
                if ops[queue[head[key]]].kind in (_COMPUTE, _WAIT):
                    compute_done[op.device] += 1
                head[key] += 1
                progress = True
    stuck = sorted((ops[q[head[k]]] for k, q in streams.items() if head[k] < len(q)), key=lambda o: (o.device, o.index))
    blocked_hosts = [d for d, items in hosts.items() if host_at[d] < len(items)]
    if not stuck and not blocked_hosts:
        return
    lines = [f"device {o.device}: {_describe(schedule, o)}" for o in stuck[:8]]
    if stuck:
        where = (stuck[0].device, min(stuck[0].index, max(0, len(schedule.programs[stuck[0].device]) - 1)))
    else:
        where = (blocked_hosts[0], 0)
    raise ScheduleError(
        f"hangs under NCCL's rules ({layout.links} communicators, receives posted {layout.recv_lookahead} action(s) ahead): "
        + "; ".join(lines) + f"\n{render_grid(schedule, where)}"
    )


def _describe(schedule: Schedule, op: _Op) -> str:
    program = schedule.programs[op.device]
    action = str(program[op.index]) if op.index < len(program) else "end of iteration"
    what = {_COMPUTE: "compute", _WAIT: "waits", _SEND_OP: "send", _RECV_OP: "receive", _COLL: "all-reduce"}[op.kind]
    state = "started, waiting for its peer" if op.started else "not started"
    return f"{what} {action} ({state})"


def directed_links(schedule: Schedule) -> list[tuple[int, int]]:
    """Every ``(sender, receiver)`` device pair that carries a message in ``schedule``, sorted."""
    return sorted({(dev, a.peer) for dev, program in schedule.programs.items() for a in program if a.kind in _SEND})


def step_groups(plan: Plan, tied_holders: Sequence[Sequence[int]] = (), norm: bool = True) -> list[tuple[int, ...]]:
    """The optimizer step's collectives in the order every worker issues them
    (:class:`actors.training.StepHooks`): one all-reduce per tied weight over the devices holding
    a copy (keys sorted), then ONE over all the plan's devices for the norms and the overflow flag
    (with clipping or loss scaling). Groups of one device need no communication."""
    out = [tuple(sorted(h)) for h in tied_holders if len(set(h)) > 1]
    if norm and len(plan.devices) > 1:
        out.append(tuple(sorted(plan.devices)))
    return out


def check_ordered_blocking(ops: Sequence[tuple[int, ...]], devices: Sequence[int]) -> None:
    """Warm-up and live-move transfers: every device walks one global list of *blocking*
    operations (a send/receive pair ``(src, dst)`` or a collective over its members) and takes
    part in those naming it (:func:`actors.transport.warm_up`, ``StageWorker.live_move``).
    Each blocks its host until every member started it; raise :class:`ScheduleError` if some
    device can never finish its part (it cannot when all walk the same order: the earliest
    unfinished operation always has all its members at it)."""
    at = {d: 0 for d in devices}
    mine = {d: [i for i, op in enumerate(ops) if d in op] for d in devices}
    progress = True
    while progress:
        progress = False
        for i, op in enumerate(ops):
            members = set(op)
            if all(at[m] < len(mine[m]) and mine[m][at[m]] == i for m in members):
                for m in members:
                    at[m] += 1
                progress = True
    stuck = {d: ops[mine[d][at[d]]] for d in devices if at[d] < len(mine[d])}
    if stuck:
        raise ScheduleError("blocking operations hang under NCCL's rules: " +
                            "; ".join(f"device {d} waits in {op}" for d, op in sorted(stuck.items())))
