"""The executor's precomputed per-action tables agree with the plan's row and tag rules.

Pure unit tests (no Ray, no process group): an :class:`actors.execution.Executor` is built for
every device of a plan and its tables are checked against each other and against the rules the
old per-action code applied on the fly. No timing here; speed is measured by benchmarks/runtime.py.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace
from typing import Any

import pytest
import torch

from actors.execution import Executor
from actors import injection
from actors.metrics import combine, combine_run
from actors.job_spec import JobSpec
from orchestrator.core.plan import Plan, ScheduleKind, interleave, straight_plan
from orchestrator.schedule.ir import Kind
from orchestrator.schedule.lowering import lower
from orchestrator.schedule.nccl import directed_links

BATCH = 11  # uneven micro-batches and replica shares
PLANS = {
    "1f1b": straight_plan([0, 4, 8], 4),
    "gpipe-sliced": replace(straight_plan([0, 3, 5, 8], 3, ScheduleKind.GPIPE), sliced_microbatches=1),
    "interleaved-local-handoff": interleave(straight_plan([0, 8], 3), 3),
    "replicas-2-3": straight_plan([0, 3, 8], 3, devices=[(0, 1), (2, 3, 4)]),
    "interleaved-replicas": interleave(straight_plan([0, 4, 8], 4, devices=[(0, 1), (2,)]), 2),
}


def _spec(lookahead: int = 8) -> JobSpec:
    def unused(*_: Any) -> Any:
        raise AssertionError("not called by the tables")

    return JobSpec(unused, unused, unused, unused, recv_lookahead=lookahead)


def executors(plan: Plan, lookahead: int = 8) -> dict[int, Executor]:
    boundary: list[tuple[tuple[int, ...], torch.dtype]] = [((4,), torch.float32)] * (plan.num_blocks + 1)
    rank_of = {d: i for i, d in enumerate(sorted(plan.devices))}
    programs = lower(plan).programs
    return {
        d: Executor(_spec(lookahead), plan, d, rank_of, programs[d], {}, {}, {}, boundary, BATCH, torch.device("cpu"))
        for d in sorted(plan.devices)
    }


@pytest.mark.parametrize("name", list(PLANS))
@pytest.mark.parametrize("lookahead", [1, 3, 8])
def test_receives_are_posted_once_and_in_the_lookahead_window(name: str, lookahead: int) -> None:
    for ex in executors(PLANS[name], lookahead).values():
        recv_at = [i for i, a in enumerate(ex.program) if a.kind in (Kind.RECV_F, Kind.RECV_B)]
        posted = [(r, i) for i, rs in enumerate(ex.tables.post_before) for r in rs]
        assert [r for r, _ in posted] == recv_at  # each once, in program order
        # the rule of the original loop: before action i, post every receive at index < i + lookahead
        assert all(i == max(0, r - lookahead + 1) for r, i in posted)


@pytest.mark.parametrize("name", list(PLANS))
def test_every_send_matches_one_receive_with_same_tag_and_rows(name: str) -> None:
    exs = executors(PLANS[name])
    sends: dict[tuple[int, int, int], int] = {}
    recvs: dict[tuple[int, int, int], int] = {}
    for d, ex in exs.items():
        for i, a in enumerate(ex.program):
            info = ex.tables.info[i]
            if a.kind in (Kind.SEND_F, Kind.SEND_B):
                _, _, any_rows, _, lo, hi, rank, msg_tag, _, _ = info
                if any_rows:
                    key = (ex.rank_of[d], rank, msg_tag)
                    assert key not in sends
                    sends[key] = hi - lo
            elif a.kind in (Kind.RECV_F, Kind.RECV_B) and info is not None:
                _, _, _, lo, hi, _, rank, msg_tag, _ = info
                key = (rank, ex.rank_of[d], msg_tag)
                assert key not in recvs
                recvs[key] = hi - lo
    assert sends == recvs
    assert bool(sends) == (len(exs) > 1)


@pytest.mark.parametrize("name", list(PLANS))
def test_received_and_local_pieces_tile_each_unit_exactly(name: str) -> None:
    for ex in executors(PLANS[name]).values():
        covered: dict[tuple[str, int, tuple[int, int]], list[tuple[int, int]]] = {}
        rows: dict[tuple[str, int, tuple[int, int]], int] = {}
        for i, a in enumerate(ex.program):
            info = ex.tables.info[i]
            if a.kind in (Kind.RECV_F, Kind.RECV_B) and info is not None:
                assembly, shape, _, lo, hi, whole, _, _, _ = info
                covered.setdefault(assembly, []).append((lo, hi))
                rows[assembly] = shape[0]
                assert whole == ((lo, hi) == (0, shape[0]))
            elif a.kind is Kind.FORWARD and a.stage > 0 or a.kind is Kind.BACKWARD and a.stage < ex.last:
                direction = "F" if a.kind is Kind.FORWARD else "B"
                pieces = ex.tables.info[i][4] if a.kind is Kind.FORWARD else ex.tables.info[i][3]
                lo, hi = ex.tables.rows(a.stage, a.unit)
                assembly = (direction, a.stage, a.unit)
                covered.setdefault(assembly, []).extend((d_lo, d_hi) for local, _, _, _, d_lo, d_hi in pieces if local)
                rows[assembly] = hi - lo
                # the pieces cover the unit's rows in order, without gaps or overlaps
                spans = [(d_lo, d_hi) for *_, d_lo, d_hi in pieces]
                assert [s for s in spans if s[1] > s[0]] == spans
                assert sum(h - lo_ for lo_, h in spans) == hi - lo
        for assembly, parts in covered.items():
            parts.sort()
            assert parts[0][0] == 0 and parts[-1][1] == rows[assembly]
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


def test_labels_and_dispatch_are_per_action() -> None:
    ex = executors(PLANS["interleaved-replicas"])[0]
    assert ex.tables.labels == [str(a) for a in ex.program]
    assert [c.__name__ for c in ex.calls] == [ex.handlers[a.kind].__name__ for a in ex.program]


def test_backward_keeps_input_grad_only_when_someone_consumes_it() -> None:
    for ex in executors(PLANS["interleaved-local-handoff"]).values():
        for i, a in enumerate(ex.program):
            if a.kind is Kind.BACKWARD:
                assert ex.tables.info[i][4] == (ex.tables.consumers.get(("B", a.stage, a.unit), 0) > 0)


class _Handle:
    """Stands for a process group: only whether something still holds it matters here."""


def test_dropping_communicators_leaves_no_handle_alive() -> None:
    """After a failed iteration the worker aborts its groups; any handle the executor still held (its
    exchange's groups and links, the per-action table that caches the links) would keep their sockets open."""
    plan = PLANS["replicas-2-3"]
    links: dict[tuple[int, int], Any] = {key: _Handle() for key in directed_links(lower(plan))}
    groups: dict[tuple[int, ...], Any] = {g: _Handle() for g in plan.device_groups if len(g) > 1}
    alive = [weakref.ref(h) for h in [*links.values(), *groups.values()]]
    boundary: list[tuple[tuple[int, ...], torch.dtype]] = [((4,), torch.float32)] * (plan.num_blocks + 1)
    rank_of = {d: i for i, d in enumerate(sorted(plan.devices))}
    ex = Executor(_spec(), plan, 0, rank_of, lower(plan).programs[0], {}, {}, groups, boundary, BATCH, torch.device("cpu"),
                  links=links)
    held = links[(0, 2)]
    assert any(len(e) > 8 and e[8] is held for e in ex.tables.info if isinstance(e, tuple))  # a send's or receive's entry
    assert ex.exchange.communicators()  # the replica group and the links
    del links, groups, held
    gc.collect()
    assert any(ref() is not None for ref in alive)  # the executor holds them
    ex.drop_communicators()
    gc.collect()
    assert all(ref() is None for ref in alive) and ex.exchange.communicators() == [] and ex.tables.info == []


def _report(device: int, cpu: float | None) -> dict[str, Any]:
    report: dict[str, Any] = {
        "device": device, "step": 0, "t0_wall": 100.0, "iteration_s": 0.5, "busy_s": 0.25, "bubble_s": 0.25,
        "spans": [(f"{device}F0", "F", 0.0, 0.1)], "loss": None, "peak_memory_bytes": 1, "memory_metric": "stash_high_water",
        "maxrss_bytes": 1,
        "sends": [("0SEND_F0@1", 1, 64, 0.1)] if device == 0 else [],
        "recvs": [("1RECV_F0@0", 0, 64, 0.05, 0.1, 0.2)] if device == 1 else [],
    }
    if cpu is not None:
        report["cpu_s"] = cpu
    return report


def test_combine_reads_cpu_time_and_tolerates_reports_without_it() -> None:
    m = combine([_report(0, 0.125), _report(1, 0.25)])
    assert m.cpu_s == {0: 0.125, 1: 0.25}
    assert [(t.src, t.dst, t.bytes) for t in m.transfers] == [(0, 1, 64)]
    assert combine([_report(0, None), _report(1, None)]).cpu_s == {}


def test_bubble_fraction_uses_the_actors_timeline_not_the_driver_wall_time() -> None:
    """With pipelined dispatch the driver's per-iteration wall time (between completions) can be
    shorter than the iteration's span on the actors' timeline; bubbles are measured on the latter."""
    shorter_wall = combine([_report(0, None), _report(1, None)], wall_s=0.2)
    assert shorter_wall.span_s == 0.5 and shorter_wall.iteration_s == 0.2
    assert shorter_wall.bubble_fraction == {0: 0.5, 1: 0.5}  # (0.5 - 0.25) / 0.5, whatever the wall time
    assert combine([_report(0, None), _report(1, None)], wall_s=0.9).bubble_fraction == {0: 0.5, 1: 0.5}


def test_overhead_is_the_devices_own_time_neither_computing_nor_waiting() -> None:
    reports = [_report(0, None), _report(1, None)]
    reports[1].update(wait_s=0.125, actions=4)
    m = combine(reports)
    assert m.device_s == {0: 0.5, 1: 0.5} and m.wait_s == {1: 0.125} and m.actions == {1: 4}
    assert m.overhead_s == {0: 0.25, 1: 0.125}  # 0.5 - 0.25 busy (- 0.125 blocked on device 1)


def test_a_run_of_steps_splits_the_drivers_time_by_the_workers_completions() -> None:
    """Steps after the first get the time between completions on the workers' clocks (the later
    device), the first gets the rest of the driver's time: the sum is the driver's time."""
    def step(device: int, i: int, start: float, length: float) -> dict[str, Any]:
        r = _report(device, None)
        r.update(step=i, t0_wall=start, iteration_s=length)
        return r

    runs = [[step(0, 0, 100.0, 0.5), step(0, 1, 100.5, 0.25), step(0, 2, 100.75, 0.5)],
            [step(1, 0, 100.0, 0.75), step(1, 1, 100.75, 0.5), step(1, 2, 101.25, 0.25)]]
    got = combine_run(runs, wall_s=2.0)
    assert [m.step for m in got] == [0, 1, 2]
    assert [m.iteration_s for m in got] == pytest.approx([1.25, 0.5, 0.25])  # ends 100.75, 101.25, 101.5


def test_fault_injection_is_opt_in_and_wraps_only_the_call_table() -> None:
    """A plain executor calls its handlers directly (its own, or its exchange's for sends and receives);
    ``install`` wraps compute and send actions (and the kill point) once, and leaves the handlers themselves alone."""
    ex = executors(PLANS["1f1b"])[0]
    plain = list(ex.calls)
    owners = [ex.exchange if a.kind in (Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B) else ex for a in ex.program]
    assert all(getattr(c, "__self__", None) is owner for c, owner in zip(plain, owners)) and not ex.injected
    injection.install(ex, injection.FaultKnobs())
    injection.install(ex, injection.FaultKnobs())  # idempotent
    wrapped = [c is not p for c, p in zip(ex.calls, plain)]
    compute = (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT)
    kill_point = next(i for i in range(len(ex.program) // 2, len(ex.program)) if ex.program[i].kind in compute)
    expect = [a.kind in (Kind.FORWARD, Kind.BACKWARD, Kind.SEND_F, Kind.SEND_B) or i == kill_point
              for i, a in enumerate(ex.program)]
    assert ex.injected and wrapped == expect
