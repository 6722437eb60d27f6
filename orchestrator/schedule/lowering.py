"""Lower a plan's compute order into full per-device programs.

One pure pass adds, around every forward and backward, the receives it needs and the sends it
produces (a split backward's ``BI`` communicates like ``B``; its ``W`` does not); after a stage's
last weight-gradient action (``B`` or ``W``) on a device it adds the replicas' gradient all-reduce;
the optimizer step of every stage ends the iteration. Sends are asynchronous in both interpreters
(the simulator queues them on their link, the actors post ``isend``), receives block.

With replicated stages each replica holds a contiguous share of every micro-batch's rows, so a
replica talks only to the replicas of the neighbouring stage whose row shares overlap its own.
Neighbouring virtual stages on the same device hand over locally and get no send/receive.
"""

from __future__ import annotations

from orchestrator.core.plan import Plan
from orchestrator.schedule.generators import GENERATORS
from orchestrator.schedule.ir import Action, Kind, Schedule, overlap, row_share, units_of
from orchestrator.schedule.validate import validate


def peers(plan: Plan, stage: int, replica: int, other: int) -> list[tuple[int, float]]:
    """Devices of stage ``other`` whose rows overlap replica ``replica`` of ``stage``, with the overlap."""
    mine = row_share(replica, plan.stages[stage].replicas)
    group = plan.stages[other].devices
    out = []
    for j, dev in enumerate(group):
        share = overlap(mine, row_share(j, len(group)))
        if share > 1e-12:
            out.append((dev, share))
    return out


def lower(plan: Plan, check: bool = True, orders: list[list[Action]] | None = None) -> Schedule:
    """The complete schedule of ``plan`` (validated unless ``check`` is False).

    ``orders`` (one compute order per device group) replaces the generator's: any hand-written
    or foreign order (e.g. torch.distributed.pipelining's) is lowered, checked and timed alike."""
    units = units_of(plan)
    if orders is None:
        orders = GENERATORS[plan.schedule](plan, units)
    last_stage = len(plan.stages) - 1
    programs: dict[int, tuple[Action, ...]] = {}
    for r, group in enumerate(plan.device_groups):
        order = orders[r]
        last_backward: dict[int, int] = {}
        for pos, act in enumerate(order):
            if act.kind.grads_weights:
                last_backward[act.stage] = pos
        for replica, dev in enumerate(group):
            prog: list[Action] = []
            for pos, act in enumerate(order):
                j, mb, part = act.stage, act.microbatch, act.part
                if act.kind is Kind.FORWARD:
                    if j > 0:
                        prog += [Action(Kind.RECV_F, j, mb, part, src) for src, _ in peers(plan, j, replica, j - 1) if src != dev]
                    prog.append(act)
                    if j < last_stage:
                        prog += [Action(Kind.SEND_F, j, mb, part, dst) for dst, _ in peers(plan, j, replica, j + 1) if dst != dev]
                elif act.kind is Kind.BACKWARD_WEIGHT:
                    prog.append(act)
                    if last_backward.get(j) == pos and len(group) > 1:
                        prog.append(Action(Kind.ALL_REDUCE, j))
                else:
                    if j < last_stage:
                        prog += [Action(Kind.RECV_B, j, mb, part, src) for src, _ in peers(plan, j, replica, j + 1) if src != dev]
                    prog.append(act)
                    if j > 0:
                        prog += [Action(Kind.SEND_B, j, mb, part, dst) for dst, _ in peers(plan, j, replica, j - 1) if dst != dev]
                    if last_backward.get(j) == pos and len(group) > 1:
                        prog.append(Action(Kind.ALL_REDUCE, j))
            for j in sorted(plan.stages_of_device(dev), reverse=True):
                prog.append(Action(Kind.STEP, j))
            programs[dev] = tuple(prog)
    schedule = Schedule(plan, programs, tuple(units))
    if check:
        validate(schedule)
    return schedule


def forward_only(plan: Plan) -> Schedule:
    """The plan's evaluation pass: every unit forwarded once per stage replica with its sends and receives, in the
    order of the plan's own schedule less its backwards; no all-reduce, no optimizer step. Removing backwards
    keeps a deadlock-free order so (a forward waits only on forwards, which come no later than before)."""
    units = units_of(plan)
    orders = [[a for a in order if a.kind is Kind.FORWARD] for order in GENERATORS[plan.schedule](plan, units)]
    lowered = lower(plan, check=False, orders=orders)
    return Schedule(plan, {d: tuple(a for a in prog if a.kind is not Kind.STEP) for d, prog in lowered.programs.items()},
                    lowered.units)
