"""The CUDA/NCCL path on real GPUs (skipped on machines without them).

``gpu``: one GPU — device selection, CUDA-event timing, bf16 gradient buckets on NCCL, a one-stage
job exact against single-process training on the same GPU (in process and through Ray).
``gpu2``: two or more GPUs (NCCL refuses two ranks on one GPU) — two stages whose activations
exceed NCCL's internal buffers (the size at which crossing sends on one communicator would hang)
under 1F1B, GPipe and interleaved 1F1B, exact against single-process training; a killed peer is
an error or a restart, never a hang.
"""

from __future__ import annotations

import os
import socket
from functools import partial
from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from actors.execution import Executor
from actors.reference import ReferenceTrainer, allclose, max_difference
from actors.job_spec import JobSpec
from actors.transport import select_device
from orchestrator.core.plan import Plan, ScheduleKind, Stage, interleave, straight_plan
from orchestrator.schedule import lower

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
gpu2 = pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs (NCCL refuses two ranks on one GPU)")

WIDTH = 2048
ROWS = 5120  # 5120 x 2048 fp32 = 40 MiB per batch: each of 4 micro-batches sends 10 MiB (> NCCL's buffers)


def wide_mlp(blocks: int = 4, width: int = WIDTH) -> list[nn.Module]:
    return [nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(blocks)]


def wide_batch(step: int, rows: int = ROWS, width: int = WIDTH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, target)


SGD = partial(torch.optim.SGD, lr=0.01, momentum=0.9)


@pytest.fixture
def nccl_world_of_one() -> Iterator[torch.device]:
    device = select_device()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, True)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    try:
        yield device
    finally:
        dist.destroy_process_group()


@gpu
@pytest.mark.gpu
def test_select_device_makes_the_assigned_gpu_current() -> None:
    device = select_device()
    assert device.type == "cuda" and torch.cuda.current_device() == device.index


@gpu
@pytest.mark.gpu
def test_one_stage_on_gpu_is_exact_and_timed_with_cuda_events() -> None:
    device = select_device()
    plan = straight_plan([0, 4], 4, ScheduleKind.ONE_F_ONE_B)
    torch.manual_seed(0)
    blocks = wide_mlp()
    modules = {b: m.to(device) for b, m in enumerate(blocks)}
    optimizers = {b: SGD(m.parameters()) for b, m in modules.items()}
    spec = JobSpec(wide_mlp, mse, SGD, partial(wide_batch, rows=256))
    boundary = [((WIDTH,), torch.float32)] * 5
    ex = Executor(spec, plan, 0, {0: 0}, lower(plan).programs[0], modules, optimizers, {}, boundary, 256, device)
    reports = [ex.run(step) for step in range(3)]
    reference = ReferenceTrainer.for_plan(plan, wide_mlp, mse, SGD, partial(wide_batch, rows=256), device=device)
    ref_losses = reference.train(3)
    got = {b: {k: v.detach().cpu() for k, v in m.state_dict().items()} for b, m in modules.items()}
    assert max_difference(got, reference.state_dicts()) == 0.0  # same GPU, same kernels, same order: bit-exact
    assert [r["loss"] for r in reports] == pytest.approx(ref_losses, rel=1e-6)
    spans = reports[-1]["spans"]
    assert spans and all(0.0 <= start <= end for _, _, start, end in spans)
    assert all(a[3] <= b[2] + 1e-6 for a, b in zip(spans, spans[1:]))  # one stream: spans in program order
    assert reports[-1]["memory_metric"] == "cuda_max_memory_allocated" and reports[-1]["peak_memory_bytes"] > 0


@gpu
@pytest.mark.gpu
def test_bf16_and_fp32_gradients_all_reduce_in_their_own_buckets(nccl_world_of_one: torch.device) -> None:
    block = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).to(torch.bfloat16)).to(nccl_world_of_one)
    for p in block.parameters():
        p.grad = torch.full_like(p, 0.25)
    plan = Plan((Stage(0, 1, (0, 1)),), 1)
    spec = JobSpec(wide_mlp, mse, SGD, wide_batch)
    ex = Executor(spec, plan, 0, {0: 0, 1: 1}, lower(plan).programs[0], {0: block}, {}, {(0, 1): dist.group.WORLD},
                  [((8,), torch.float32)] * 2, 4, nccl_world_of_one)
    ex.clock.start()
    ex._all_reduce(lower(plan).programs[0][0], 0)
    torch.cuda.synchronize()
    for p in block.parameters():
        assert p.grad is not None and p.grad.dtype == p.dtype and torch.equal(p.grad, torch.full_like(p, 0.25))


@gpu
@pytest.mark.gpu
@pytest.mark.ray
def test_one_stage_job_through_ray_on_a_gpu(ray_gpu: Any) -> None:
    from orchestrator.train.trainer import PipelineTrainer

    plan = straight_plan([0, 4], 4)
    data = partial(wide_batch, rows=256)
    trainer = PipelineTrainer(wide_mlp, mse, SGD, data, 4, plan=plan, use_gpu=True)
    try:
        result = trainer.fit(2)
        reference = ReferenceTrainer.for_plan(plan, wide_mlp, mse, SGD, data, device="cuda")
        ref_losses = reference.train(2)
        assert allclose(trainer.state_dicts(), reference.state_dicts(), rtol=1e-5, atol=1e-6)
        assert list(result.losses.values()) == pytest.approx(ref_losses, rel=1e-5)
    finally:
        trainer.shutdown()


PLANS_2GPU = {
    "1f1b": straight_plan([0, 2, 4], 4, ScheduleKind.ONE_F_ONE_B),
    "gpipe": straight_plan([0, 2, 4], 4, ScheduleKind.GPIPE),
    "interleaved": interleave(straight_plan([0, 2, 4], 4), 2),
}


@gpu2
@pytest.mark.gpu2
@pytest.mark.ray
@pytest.mark.parametrize("name", list(PLANS_2GPU))
def test_two_stages_with_large_activations_are_exact(ray_gpu: Any, name: str) -> None:
    from orchestrator.train.trainer import PipelineTrainer

    plan = PLANS_2GPU[name]
    trainer = PipelineTrainer(wide_mlp, mse, SGD, wide_batch, plan.num_microbatches, plan=plan, use_gpu=True)
    try:
        result = trainer.fit(2)
        reference = ReferenceTrainer.for_plan(plan, wide_mlp, mse, SGD, wide_batch, device="cuda")
        ref_losses = reference.train(2)
        got, want = trainer.state_dicts(), reference.state_dicts()
        assert allclose(got, want, rtol=1e-4, atol=1e-5), f"max |diff| {max_difference(got, want):.3g}"
        assert list(result.losses.values()) == pytest.approx(ref_losses, rel=1e-4)
    finally:
        trainer.shutdown()


@gpu2
@pytest.mark.gpu2
@pytest.mark.ray
def test_killed_peer_is_recovered_not_hung(ray_gpu: Any, tmp_path: Any) -> None:
    from orchestrator.train.trainer import PipelineTrainer

    plan = PLANS_2GPU["1f1b"]
    from actors.injection import arm_kills

    trainer = arm_kills(PipelineTrainer(wide_mlp, mse, SGD, wide_batch, plan.num_microbatches, plan=plan, use_gpu=True,
                                        checkpoint_dir=tmp_path, checkpoint_every=1, max_failures=1, pg_timeout_s=60), {(2, 1)})
    try:
        result = trainer.fit(4)
        assert len(result.losses) == 4 and result.restarts == 1
    finally:
        trainer.shutdown()


@pytest.fixture(scope="module")
def ray_gpu() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        ray.init(address="local", num_gpus=GPUS, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield ray
    if started:
        ray.shutdown()


@gpu
@pytest.mark.gpu
def test_deferred_snapshot_on_gpu_copies_on_a_side_stream_into_pinned_memory() -> None:
    """The asynchronous checkpoint's copy of a GPU block: taken while the next forward and backward run, it holds
    the state of the moment it was asked for, in pinned host memory, and the next checkpoint reuses those buffers."""
    from actors.snapshot import deferred_snapshot

    device = select_device()
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.BatchNorm1d(WIDTH)).to(device)
    opt = torch.optim.Adam(block.parameters(), lr=0.1)
    x = torch.randn(256, WIDTH, device=device)
    for _ in range(2):
        block(x).sum().backward()
        opt.step()
        opt.zero_grad()
        want = {k: v.detach().cpu().clone() for k, v in block.state_dict().items()}
        take = deferred_snapshot(0, block, opt)
        block(x).sum().backward()  # queued on the compute stream while the copy runs on its own
        snap = take()
        opt.step()
        opt.zero_grad()
        assert all(torch.equal(snap["model"][k], want[k]) for k in want)
        assert snap["model"]["0.weight"].is_pinned() and snap["optimizer"]["state"][0]["exp_avg"].is_pinned()
    again = deferred_snapshot(0, block, opt, into=snap)()
    assert again["model"]["0.weight"].data_ptr() == snap["model"]["0.weight"].data_ptr()
