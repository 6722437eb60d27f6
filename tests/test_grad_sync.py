"""Gradient sync of replicated stages (actors/grad_sync.py): buckets start during the last backward, in one order,
the gradients are views of buffers allocated once (no flat copy per step), and the sums are the old ones.

In a process world of one (the sum over one replica is the gradient itself), so what is checked is where and when
the all-reduces start and what the parameters end up with; the sums over real replicas are checked against the
single-process reference by tests/test_runtime.py (every replicated plan there, ZB-H1 included) and beside
DistributedDataParallel, bitwise, by benchmarks/grad_sync.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import actors.grad_sync as grad_sync
from actors.backward_split import backward_input
from actors.execution import Executor
from actors.grad_sync import GradSync, bucket_order
from actors.job_spec import JobSpec
from actors.transport import stage_rows
from orchestrator.core.plan import Plan, ScheduleKind, Stage
from orchestrator.schedule import Kind, lower
from orchestrator.schedule.nccl import gradient_launch_points



@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every bucket handed to ``dist.all_reduce`` by the gradient sync, in call order."""
    seen: list[torch.Tensor] = []
    real = grad_sync.dist.all_reduce

    def spy(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append(tensor)
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(grad_sync.dist, "all_reduce", spy)
    return seen


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))


def test_buckets_follow_ddps_rule() -> None:
    """Reverse order, a small first bucket, then buckets of about ``cap`` bytes; frozen parameters left out."""
    model = _mlp()
    model[0].bias.requires_grad_(False)
    params = list(model.parameters())
    buckets = bucket_order(params, cap=(64 * 64 + 64) * 4, first=8 * 64 * 4)
    assert [p for b in buckets for p in b] == [p for p in params[::-1] if p.requires_grad]
    assert [len(b) for b in buckets] == [2, 2, 1]  # bias + 8x64 reach `first`; then a 64x64 layer per cap


def test_buckets_start_during_the_last_backward_into_views_allocated_once(world_of_one: None,
                                                                          launches: list[torch.Tensor]) -> None:
    model, twin = _mlp(), _mlp()
    sync = GradSync(model.parameters(), dist.group.WORLD, cap=64 * 64 * 4, first=1)
    assert len(sync.buckets) == 3
    x = torch.randn(6, 64)
    buffers = [f.data_ptr() for f in sync.flat]
    for step in range(2):
        sync.attach()
        for mb in range(3):
            rows = x[2 * mb:2 * mb + 2]
            if mb == 2:
                sync.arm()
            model(rows).square().sum().backward()
            twin(rows).square().sum().backward()
            sync.disarm()
            if mb < 2:
                assert launches == []  # nothing starts before the last backward
        assert len(launches) == len(sync.buckets)  # every bucket started inside the last backward
        sync.finish()
        assert [f.data_ptr() for f in sync.flat] == buffers  # the same buffers every step
        for p, q in zip(model.parameters(), twin.parameters()):
            assert p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad)
            k, view = sync.where[id(p)]
            assert p.grad.data_ptr() == view.data_ptr() and view.untyped_storage().data_ptr() == buffers[k]
        for p, q in zip(model.parameters(), twin.parameters()):
            p.grad = q.grad = None
        launches.clear()


def test_a_split_weight_pass_reports_each_parameter_once_and_bitwise_as_the_whole(world_of_one: None) -> None:
    model, twin = _mlp(), _mlp()
    x = torch.randn(4, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    grad = torch.randn(4, 8)
    _, pending = backward_input(model(x), grad, x, list(model.parameters()), lambda o, g: torch.autograd.backward(o, g))
    ready: list[nn.Parameter] = []
    pending.run(list(model.parameters()), lambda o, g: torch.autograd.backward(o, g), ready.append)
    twin(x2).backward(grad)
    assert sorted(map(id, ready)) == sorted(map(id, model.parameters()))
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), twin.parameters()))


@pytest.mark.parametrize("kind", [ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1])
def test_the_executor_starts_buckets_in_the_last_backward_and_steps_on_the_sums(world_of_one: None, kind: ScheduleKind,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage replicated on devices 0 and 1, run by device 0 alone: its weights after two steps are those of
    plain accumulation over its own rows (the sum over a world of one), and every all-reduce started while the
    stage's last backward ran, not at the ALL_REDUCE action."""
    rows, M = 8, 2
    plan = Plan((Stage(0, 1, (0, 1)),), M, kind)
    program = lower(plan).programs[0]
    (last, _), = gradient_launch_points(program).items()
    assert program[last].kind.grads_weights and program[last + 1].kind is Kind.ALL_REDUCE

    def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step)
        return torch.randn(rows, 64, generator=g), torch.randn(rows, 8, generator=g)

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(out, y)

    block, twin = _mlp(), _mlp()
    opt, twin_opt = torch.optim.SGD(block.parameters(), lr=0.1), torch.optim.SGD(twin.parameters(), lr=0.1)
    spec = JobSpec(_unused, loss, _unused, data)
    ex = Executor(spec, plan, 0, {0: 0, 1: 1}, program, {0: block}, {0: opt}, {(0, 1): dist.group.WORLD},
                  [((64,), torch.float32), ((8,), torch.float32)], rows, torch.device("cpu"))
    at: list[int] = []
    real = grad_sync.dist.all_reduce
    monkeypatch.setattr(grad_sync.dist, "all_reduce", lambda *a, **k: at.append(ex.at) or real(*a, **k))
    for step in range(2):
        ex.run(step)
        x, y = data(step)
        for mb in range(M):
            lo, hi = stage_rows(plan, rows, 0, 0, (mb, 0))
            (loss(twin(x[lo:hi]), y[lo:hi]) * ((hi - lo) / rows)).backward()
        twin_opt.step()
        twin_opt.zero_grad(set_to_none=True)
    assert at and set(at) == {last}
    assert all(torch.equal(p, q) for p, q in zip(block.parameters(), twin.parameters()))
    assert not any(p._post_accumulate_grad_hooks for p in block.parameters())  # disarmed after the backward


def _unused(*_: object) -> None:
    raise AssertionError("not called")
