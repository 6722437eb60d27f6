"""Compute orders for each schedule kind, as pure functions of (plan) -> per-group F/B lists.

Each generator decides only the order of forward and backward units on each physical stage
(device group); :mod:`orchestrator.schedule.lowering` then adds the communication, all-reduce
and optimizer actions that follow from the plan. Adding a schedule means adding one function
to ``GENERATORS``; the simulator and the actors pick it up unchanged.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from typing import Callable

from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, ScheduleKind
from orchestrator.schedule.ir import Action, Kind

Unit = tuple[int, int]
ComputeOrder = list[Action]


@lru_cache(maxsize=1 << 16)
def _action(kind: Kind, stage: int, unit: Unit) -> Action:
    """One compute action. Actions are immutable values and every schedule shape a planner times
    (kinds × slicing counts × depths) is made of the same few thousand, so they are built once: a
    frozen dataclass costs ~0.8 µs to construct, half of generating an order (issue 42)."""
    return Action(kind, stage, unit[0], unit[1])


def _f(stage: int, unit: Unit) -> Action:
    return _action(Kind.FORWARD, stage, unit)


def _b(stage: int, unit: Unit) -> Action:
    return _action(Kind.BACKWARD, stage, unit)


def _bi(stage: int, unit: Unit) -> Action:
    return _action(Kind.BACKWARD_INPUT, stage, unit)


def _w(stage: int, unit: Unit) -> Action:
    return _action(Kind.BACKWARD_WEIGHT, stage, unit)


def gpipe(plan: Plan, units: list[Unit]) -> list[ComputeOrder]:
    """All forwards, then all backwards (GPipe): simplest, peak memory = all units in flight."""
    return [[_f(r, u) for u in units] + [_b(r, u) for u in units] for r in range(plan.num_physical_stages)]


def one_f_one_b(plan: Plan, units: list[Unit]) -> list[ComputeOrder]:
    """PipeDream-flush / DAPPLE early backward: ``p-r-1`` warm-up forwards, then alternate.

    Same iteration time as GPipe without communication, but stage r keeps at most ``p-r``
    units' activations in flight instead of all of them.
    """
    p = plan.num_physical_stages
    n = len(units)
    orders: list[ComputeOrder] = []
    for r in range(p):
        warmup = min(p - r - 1, n)
        order = [_f(r, units[k]) for k in range(warmup)]
        for i in range(n - warmup):
            order += [_f(r, units[warmup + i]), _b(r, units[i])]
        order += [_b(r, units[i]) for i in range(n - warmup, n)]
        orders.append(order)
    return orders


def interleaved(plan: Plan, units: list[Unit]) -> list[ComputeOrder]:
    """Megatron PTD-P interleaved 1F1B over ``v`` virtual chunks per device group.

    Units advance in rounds of ``p`` through all chunks, so the bubble shrinks to (p-1)/(v·M)
    of the ideal time. Megatron requires the unit count to be a multiple of ``p``; so do we.
    """
    p, v = plan.num_physical_stages, plan.virtual_chunks
    n = len(units)
    if v > 1 and n % p:
        raise UserError(f"interleaved schedule needs the micro-batch count ({n}) to be a multiple of the pipeline depth ({p})")
    total = n * v
    # The k-th forward (backward) of every group takes the same unit through the same chunk; only the
    # stage differs, chunk·p + r. Worked out once, not per group and action (a third of auto's orders).
    unit, fwd_chunk, bwd_chunk = [], [], []
    for k in range(total):
        group, within = divmod(k, p * v)
        unit.append(units[group * p + within % p])
        fwd_chunk.append(within // p * p)
        bwd_chunk.append((v - 1 - within // p) * p)

    orders: list[ComputeOrder] = []
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total) if v > 1 else min(p - r - 1, total)
        order: ComputeOrder = [_f(fwd_chunk[k] + r, unit[k]) for k in range(warmup)]
        for i in range(total - warmup):
            k = warmup + i
            order.append(_f(fwd_chunk[k] + r, unit[k]))
            order.append(_b(bwd_chunk[i] + r, unit[i]))
        order += [_b(bwd_chunk[i] + r, unit[i]) for i in range(total - warmup, total)]
        orders.append(order)
    return orders


def zb_h1(plan: Plan, units: list[Unit]) -> list[ComputeOrder]:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with split backwards.

    Every backward is split into ``BI`` (input gradient, which the previous stage waits for) and
    ``W`` (weight gradient, which nobody waits for). Stage ``r`` runs 1F1B's order with ``BI`` in
    place of ``B`` and defers its first ``r`` weight passes: after its ``k``-th ``BI`` it runs the
    oldest pending ``W`` once ``k > r``, and the ``r`` deferred ones close the iteration, where they
    fill the cool-down bubble. Input gradients thus travel back one ``W`` faster per stage, which
    cuts 1F1B's bubble to about a third when F, B and W take equal time. A unit's activations
    are held until its ``W``, so stage ``r`` keeps up to ``p`` units in flight: the peak over the
    devices is 1F1B's (its first stage's ``p``), which is the paper's "same memory as 1F1B".
    """
    p = plan.num_physical_stages
    if plan.virtual_chunks > 1:
        raise UserError("the zb-h1 schedule runs one stage per device group; it cannot be interleaved")
    n = len(units)
    orders: list[ComputeOrder] = []
    for r in range(p):
        warmup = min(p - r - 1, n)
        order = [_f(r, units[k]) for k in range(warmup)]
        pending: deque[Unit] = deque()

        def backward(i: int) -> None:
            order.append(_bi(r, units[i]))
            pending.append(units[i])
            if i + 1 > r:
                order.append(_w(r, pending.popleft()))

        for i in range(n - warmup):
            order.append(_f(r, units[warmup + i]))
            backward(i)
        for i in range(n - warmup, n):
            backward(i)
        order += [_w(r, u) for u in pending]
        orders.append(order)
    return orders


GENERATORS: dict[ScheduleKind, Callable[[Plan, list[Unit]], list[ComputeOrder]]] = {
    ScheduleKind.GPIPE: gpipe,
    ScheduleKind.ONE_F_ONE_B: one_f_one_b,
    ScheduleKind.INTERLEAVED: interleaved,
    ScheduleKind.ZB_H1: zb_h1,
}
