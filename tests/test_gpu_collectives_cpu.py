"""Every tensor the step hooks give a collective lives on the stage's device, in one reduction
per step, with no host read or host->device copy on the way — checked without a GPU.

How, honestly, on a machine with only a CPU: the stage computes on ``meta``, a device other
than the default one (``cpu``) — the role CUDA plays on a GPU worker, where the default device
is the host. A tensor made without a device, or moved with ``.cpu()``, ends on the wrong device
and :class:`DeviceCheckingGroup` refuses it, as ``ProcessGroupNCCL`` refuses a host tensor
("No backend type associated with device type cpu": issue #29's fp16 and clipping crashes).
``meta`` tensors have no values, so any host read (``.item()``, ``.cpu()``) raises too: the
device work of a step running through proves it has none. Numbers are checked on CPU against
torch's own ``clip_grad_norm_`` and ``GradScaler`` (bitwise), and across processes by the Ray
tests in ``tests/test_training_features.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from actors.tied import TiedGrads, tie_table, untie
from actors.training import LossScale, NormLayout, Scaler, StepHooks, TrainingOptions, norm_contributors
from orchestrator.core.plan import straight_plan

STAGE = torch.device("meta")


class DeviceCheckingGroup:
    """The reduce of a process group of one that refuses what NCCL refuses: a tensor on another
    device than the worker computes on. Counts the collectives (the sum over one rank is the
    tensor itself, so nothing else is done)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.calls = device, 0

    def __call__(self, tensor: Tensor, group: Any) -> None:
        if tensor.device != self.device:
            raise RuntimeError(f"No backend type associated with device type {tensor.device.type} "
                               f"(the worker computes on {self.device})")
        self.calls += 1


class CopyCounter(TorchDispatchMode):
    """Counts device-to-device copies (``.to``, ``copy_`` between devices) dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func._overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.copy_):
            devices = {a.device for a in args if isinstance(a, Tensor)} | ({kwargs["device"]} if kwargs.get("device") else set())
            self.copies += len(devices) > 1
        return func(*args, **kwargs)


def _blocks(device: torch.device) -> list[nn.Module]:
    torch.manual_seed(0)
    blocks: list[nn.Module] = [nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), nn.Linear(4, 4).to(torch.bfloat16), nn.Linear(4, 4)]
    return [b.to(device) for b in blocks]


def _with_grads(blocks: list[nn.Module], value: float = 0.5) -> None:
    for b in blocks:
        for p in b.parameters():
            p.grad = torch.full_like(p, value)


def _hooks(device: int, plan: Any, blocks: list[nn.Module], options: TrainingOptions, check: DeviceCheckingGroup,
           tied: Any = None) -> StepHooks:
    modules = {b: blocks[b] for j in plan.stages_of_device(device) for b in range(plan.stages[j].first, plan.stages[j].last)}
    every = [p for m in modules.values() for p in m.parameters()]
    return StepHooks(options, tied, norm_contributors(plan, device, modules), every, object(), {}, plan, STAGE,
                     NormLayout.of(blocks), reduce=check)


FP16_CLIP = TrainingOptions(max_grad_norm=0.5, loss_scale=LossScale(init_scale=1024.0))


@pytest.mark.parametrize("device", [0, 1, 2])
def test_loss_scaling_and_clipping_give_the_collective_only_stage_device_tensors_once_per_step(device: int) -> None:
    """Device 2 is the second replica of stage 1: it contributes no norms (the crash of a replica's
    host zero in the NCCL all-reduce) and still joins the one reduction."""
    plan = straight_plan([0, 1, 3], 1, devices=[(0,), (1, 2)])
    blocks = _blocks(STAGE)
    _with_grads(blocks)
    check = DeviceCheckingGroup(STAGE)
    hooks = _hooks(device, plan, blocks, FP16_CLIP, check)
    with CopyCounter() as counter:
        found = hooks.prepare(0)
    assert check.calls == 1  # the overflow flag and every norm cross in one all-reduce
    assert found is not None and found.device == STAGE and hooks.scaler is not None and hooks.scaler.scale.device == STAGE
    assert counter.copies == 0  # nothing crossed devices (no .cpu(), no host scalar brought over)


def test_clipping_alone_reads_nothing_on_the_host() -> None:
    plan = straight_plan([0, 1, 3], 1)
    blocks = _blocks(STAGE)
    _with_grads(blocks)
    check = DeviceCheckingGroup(STAGE)
    hooks = _hooks(1, plan, blocks, TrainingOptions(max_grad_norm=0.5), check)
    assert hooks.before(0) is True  # meta has no values: a host read would raise here
    assert check.calls == 1


def test_the_loss_scale_multiplies_without_a_copy() -> None:
    scaler = Scaler(LossScale(), STAGE)
    loss = torch.ones((), device=STAGE)
    with CopyCounter() as counter:
        out = scaler.scale_loss(loss)
    assert out.device == STAGE and counter.copies == 0


def test_tied_gradients_are_summed_on_the_stage_device() -> None:
    """A non-contributing holder (a second replica) adds zeros made on the parameters' device."""
    emb, head = nn.Embedding(5, 4).to(STAGE), nn.Linear(4, 5, bias=False).to(STAGE)
    untie(head, "weight", emb, "weight", "wte")
    head.weight = nn.Parameter(torch.empty_like(emb.weight))  # materialized copy
    setattr(head.weight, "_raypipe_tie", getattr(emb.weight, "_raypipe_tie").__class__("wte", "weight", emb))
    table = tie_table([emb, head])
    check = DeviceCheckingGroup(STAGE)
    tied = TiedGrads(table, {"wte": [0, 1]}, 1, set(), {1: head}, {"wte": object()}, reduce=check)
    tied.before_step(0)
    assert check.calls == 1 and head.weight.grad is not None and head.weight.grad.device == STAGE


def test_a_host_tensor_in_the_collective_is_refused() -> None:
    """The wrapper is sharp: the old flag (a host zero) is refused the way NCCL refused it."""
    check = DeviceCheckingGroup(STAGE)
    with pytest.raises(RuntimeError, match="device type cpu"):
        check(torch.zeros(()), None)


# ----- numbers: bitwise what torch does in one process -----
def test_global_norm_and_unscaling_equal_torch_bitwise_with_mixed_dtypes() -> None:
    """Two stages' norms meet at their clip_grad_norm_ slots (fp32 and bf16 norms grouped as torch
    groups them); the result is torch's clip_grad_norm_ after GradScaler.unscale_, bit for bit."""
    blocks = _blocks(torch.device("cpu"))
    torch.manual_seed(1)
    for b in blocks:
        for p in b.parameters():
            p.grad = torch.randn_like(p) * 700
    stock = [p.grad.clone() for b in blocks for p in b.parameters()]  # type: ignore[union-attr]
    plan = straight_plan([0, 2, 3], 1)
    halves = [_hooks_cpu(d, plan, blocks) for d in (0, 1)]
    vectors = [h.contribution(0) for h in halves]
    assert vectors[0] is not None and vectors[1] is not None
    total = vectors[0] + vectors[1]  # what the all-reduce sums: one non-zero per slot
    for h in halves:
        h.finish(total.clone())
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # creates its scale, as the scaled loss does
    params = [nn.Parameter(torch.zeros_like(g)) for g in stock]
    for p, g in zip(params, stock):
        p.grad = g.clone()
    opt = torch.optim.SGD(params, lr=0.0)
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(params, 0.5)
    got = [p.grad for b in blocks for p in b.parameters()]
    assert all(torch.equal(g, p.grad) for g, p in zip(got, params))


def _hooks_cpu(device: int, plan: Any, blocks: list[nn.Module]) -> StepHooks:
    modules = {b: blocks[b] for j in plan.stages_of_device(device) for b in range(plan.stages[j].first, plan.stages[j].last)}
    every = [p for m in modules.values() for p in m.parameters()]
    return StepHooks(FP16_CLIP, None, norm_contributors(plan, device, modules), every, None, {}, plan, torch.device("cpu"),
                     NormLayout.of(blocks))
