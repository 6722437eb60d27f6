"""NCCL's rules, by design (issue #39 item 2), in what a CPU can check: the restart chosen up front where recovery in
place cannot be made safe on the installed NCCL, the warm-up's message sizes, and a live move's leaver shutting down
while the members re-join (README, GPU section: what awaits a GPU)."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import pytest
import torch

from actors.stage_worker import StageWorker
from actors import user_code
from actors.gpu import NcclFacts, in_place_hazard
from actors.tables import ProgramTables
from actors.transport import largest_buckets, link_messages
from orchestrator.adapt.policies import RecoverInPlace, Restart, on_worker_death
from orchestrator.core.plan import Plan, interleave, straight_plan
from orchestrator.profiling.models import example_batch, mlp
from orchestrator.schedule.lowering import lower

WIDTHS = (8, 24, 16, 40, 4)  # every boundary a different width: a message of the wrong boundary shows
BLOCKS = partial(mlp, WIDTHS)
DATA = partial(example_batch, "mlp", 10, widths=WIDTHS)  # 10 rows into 4 micro-batches: shares of 3 and 2 rows


@pytest.mark.parametrize(("backend", "facts", "unsafe"), [
    ("gloo", None, None),
    ("nccl", NcclFacts((2, 27, 3), True), None),
    ("nccl", NcclFacts((2, 25, 0), True), None),
    ("nccl", NcclFacts((2, 21, 5), True), "NCCL 2.21.5 < 2.25"),
    ("nccl", NcclFacts((2, 27, 3), False), "cannot build non-blocking NCCL communicators"),
    ("nccl", NcclFacts(None, False), "NCCL's version is unknown"),
])
def test_recovery_in_place_is_refused_up_front_where_nccl_cannot_abort(backend: str, facts: NcclFacts | None,
                                                                       unsafe: str | None) -> None:
    hazard = in_place_hazard(backend, facts)
    assert (hazard is None) == (unsafe is None) and (unsafe is None or unsafe in str(hazard))
    plan = straight_plan([0, 2, 4], 4, devices=[(0,), (1, 2)])
    decision = on_worker_death(1, 3, plan, [2], [0, 1, 2], in_place=True, hazard=hazard)
    if hazard is None:
        assert isinstance(decision, RecoverInPlace) and decision.survivors == (0, 1)
    else:  # the reason travels to the `recovered` event
        assert isinstance(decision, Restart) and hazard in decision.reason and decision.from_checkpoint


PLANS = {
    "replicas": straight_plan([0, 1, 3, 4], 4, devices=[(0,), (1, 2), (3,)]),
    "interleaved": interleave(straight_plan([0, 2, 4], 4), 2),
}


@pytest.mark.parametrize("name", PLANS)
def test_warm_up_sends_each_links_largest_message_and_all_reduces_the_largest_bucket(name: str) -> None:
    """The sizes both ends compute from the plan equal the largest send each sender's own program tables (what the
    executor sends) hold per link; a replica group's bucket is its stage's parameters, per dtype."""
    plan: Plan = PLANS[name]
    schedule = lower(plan)
    torch.manual_seed(0)
    blocks = BLOCKS()
    inputs, _ = DATA(0)
    boundary = user_code.probe(blocks, inputs)
    rows = int(inputs.shape[0])
    got = link_messages(plan, schedule.programs, boundary, rows)
    sent: dict[tuple[int, int], int] = {}
    for device, program in schedule.programs.items():
        rank_of = {d: i for i, d in enumerate(sorted(plan.devices))}
        tables = ProgramTables(8, plan, device, rank_of, program, {}, boundary, rows, False)
        for a, entry in zip(program, tables.info):
            if a.kind.name in ("SEND_F", "SEND_B"):
                lo, hi, (shape, _) = entry[4], entry[5], entry[9]
                sent[(device, a.peer)] = max(sent.get((device, a.peer), 0), (hi - lo) * math.prod(shape))
    assert {link: numel for link, (numel, _) in got.items()} == sent
    assert min(sent.values()) > 1  # full-size messages, not the 1-element probe of before
    for device in plan.devices:
        modules = {b: blocks[b] for j in plan.stages_of_device(device) for b in range(plan.stages[j].first, plan.stages[j].last)}
        want = {s.devices: (sum(p.numel() for b in range(s.first, s.last) for p in blocks[b].parameters()), torch.float32)
                for j, s in enumerate(plan.stages) if device in s.devices and len(s.devices) > 1}
        assert largest_buckets(plan, device, modules) == want


@pytest.mark.ray
def test_a_leaver_shuts_down_while_the_members_rejoin(worker_group: Any) -> None:
    """A live move that drops a member: the leaver begins to leave before the members' ``live_move`` calls return
    (under NCCL their re-join destroys the old communicators, which may wait for it), and training goes on."""
    from actors.job_spec import JobSpec
    from orchestrator.profiling.models import loss_fn

    spec = JobSpec(BLOCKS, loss_fn("mlp"), partial(torch.optim.SGD, lr=0.05), DATA, pg_timeout_s=60.0, threads=1)
    three = straight_plan([0, 2, 3, 4], 4)
    worker_group.configure(spec, three, members=[0, 1, 2], slots={0: 0, 1: 1, 2: 2})
    worker_group.call(StageWorker.run_iteration, 0)
    two = straight_plan([0, 2, 4], 4)
    worker_group.move(two, [(2, 1, 3, 4)], members=[0, 1, 2], step=1)  # device 2's block handed over; still a member
    worker_group.call(StageWorker.run_iteration, 1)
    reports = worker_group.move(two, [], members=[0, 1], step=2)  # then it leaves (as an evacuated device does)
    left_at = worker_group.call(StageWorker.status, devices=[2])[0].left_at
    assert left_at is not None and all(r.rejoined for r in reports)
    assert left_at < max(r.finished_at for r in reports)
    worker_group.call(StageWorker.run_iteration, 2)
