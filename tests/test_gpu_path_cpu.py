"""The GPU path's pieces that can be checked without a GPU: dtype buckets, host copies of
live-move state, device selection, and a boundary dtype change caught before it reaches NCCL."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from actors.execution import Executor
from actors.grad_sync import bucket_order
from actors.job_spec import JobSpec
from actors.checkpoint import host_copy
from actors.transport import local_cuda_index, select_device
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan, ScheduleKind, Stage, straight_plan
from orchestrator.schedule import lower



def _mixed_block() -> nn.Module:
    block = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    block[1].to(torch.bfloat16)
    return block


def test_gradient_buckets_keep_each_dtype_together_in_reverse_order() -> None:
    params = list(_mixed_block().parameters())
    buckets = bucket_order(params)
    assert [{p.dtype for p in b} for b in buckets] == [{torch.bfloat16}, {torch.float32}]
    assert [p for b in buckets for p in b] == params[::-1]  # backward makes the last gradients first


def test_all_reduce_of_a_mixed_dtype_stage_keeps_gradient_dtypes(world_of_one: None) -> None:
    """One flat buffer would promote bf16 to fp32 and ``p.grad = g`` would then fail."""
    block = _mixed_block()
    plan = Plan((Stage(0, 1, (0, 1)),), 1)  # one stage replicated on two devices (only device 0 here)
    for p in block.parameters():
        p.grad = torch.full_like(p, 0.5)
    spec = JobSpec(_unused, _unused, _unused, _unused)
    ex = Executor(spec, plan, 0, {0: 0, 1: 1}, lower(plan).programs[0], {0: block}, {}, {(0, 1): dist.group.WORLD},
                  [((4,), torch.float32)] * 2, 4, torch.device("cpu"))
    ex._all_reduce(lower(plan).programs[0][0], 0)
    assert [(label, kind) for label, kind, _, _ in ex.spans] == [(ex.tables.labels[0], "all_reduce")]
    for p in block.parameters():
        assert p.grad is not None and p.grad.dtype == p.dtype
        assert torch.equal(p.grad, torch.full_like(p, 0.5))  # a world of one: the sum is itself


def test_live_move_payload_is_copied_to_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor of the hand-over payload goes through ``.cpu()`` (on a GPU worker that is the
    copy that keeps CUDA tensors out of the pickled object collective); the spy counts them."""
    module = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(module.parameters())
    module(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    payload = {0: (module.state_dict(), optimizer.state_dict())}
    tensors = [module.weight, module.bias] + [t for st in optimizer.state_dict()["state"].values() for t in st.values()]
    moved: list[torch.Tensor] = []
    real_cpu = torch.Tensor.cpu

    def spy(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        moved.append(self)
        return real_cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", spy)
    copied: Any = host_copy(payload, copy=False)
    assert len(moved) == len(tensors)
    weights, state = copied[0]
    assert torch.equal(weights["weight"], module.weight.detach())
    assert isinstance(state["param_groups"], list) and set(state["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}


def test_select_device_without_a_gpu_is_the_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; tests/test_gpu.py covers it")
    assert select_device() == torch.device("cpu")


def test_a_boundary_that_changes_dtype_is_one_clear_error() -> None:
    """On NCCL the receiver's buffer is sized from the probe; a different dtype would corrupt or hang."""
    plan = straight_plan([0, 1, 2], 1, ScheduleKind.GPIPE)
    schedule = lower(plan)
    data = partial(_batch, rows=2)
    spec = JobSpec(_unused, lambda out, y: out.float().sum(), _unused, data, recv_lookahead=1)
    doubled = nn.Sequential(nn.Linear(3, 3)).to(torch.float64)  # emits float64 where the probe said float32
    ex = Executor(spec, plan, 0, {0: 0, 1: 1}, schedule.programs[0], {0: _Cast(doubled)}, {}, {},
                  [((3,), torch.float32)] * 3, 2, torch.device("cpu"))
    with pytest.raises(UserError, match=r"stage 0 on device 0 sends float64 \[3\] per row to device 1.*float32 \[3\]"):
        ex.run(0)


class _Cast(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.double())


def _batch(step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(rows, 3), torch.zeros(rows, 3)


def _unused(*_: object) -> None:
    raise AssertionError("not called")


@pytest.mark.parametrize("ids, visible, count, want", [
    (["2"], "2,3", 2, 0),  # Ray's masking: position in the list
    (["3"], "2,3", 2, 1),
    (["1"], None, 4, 1),  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: the physical index
    (["GPU-8f2c1d9e-0000-1111-2222-333344445555"], "GPU-aaaa,GPU-8f2c1d9e-0000-1111-2222-333344445555", 2, 1),
    (["MIG-5b1c"], "MIG-5b1c", 1, 0),
    ([], "GPU-aaaa", 1, 0),  # outside Ray: the current device
])
def test_local_cuda_index_maps_indices_and_uuids(ids: list[str], visible: str | None, count: int, want: int) -> None:
    assert local_cuda_index(ids, visible, count) == want


@pytest.mark.parametrize("ids, visible, count, message", [
    (["GPU-8f2c"], "GPU-aaaa", 1, r"Ray assigned GPU 'GPU-8f2c' but CUDA_VISIBLE_DEVICES='GPU-aaaa' does not list it"),
    (["3"], "0,1", 2, r"sees 2 CUDA device"),
])
def test_local_cuda_index_refuses_what_it_cannot_map_in_one_line(ids: list[str], visible: str, count: int, message: str) -> None:
    with pytest.raises(RuntimeError, match=message) as err:
        local_cuda_index(ids, visible, count)
    assert "\n" not in str(err.value)
