"""What one GPU can prove about the CUDA/NCCL path, one verdict line per check (issue #29 item 5).

``GPU_CHECK_DEVICE=cuda`` (default when CUDA is present): every check, on ``cuda:0`` with real
NCCL groups of one. ``GPU_CHECK_DEVICE=cpu``: the checks that apply on CPU/gloo, each the CPU
twin of its CUDA check (``make test`` runs it through ``tests/test_gpu_check.py``). Each check prints one line,
``NAME ok [backend, seconds]: detail``, ``NAME FAIL [...]: error`` or ``NAME skipped (needs CUDA)``; the checks that
drive the stage worker and the runtime are in :mod:`benchmarks.gpu_check_worker`. Exit status 1 if any check fails.
Run by ``benchmarks/gpu_check.sh``; on a GPU its output goes in ``benchmarks/results/gpu.md``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from functools import partial
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from actors.gpu import EventClock
from actors.snapshot import deferred_snapshot
from actors.training import LossScale, NormLayout, StepHooks, TrainingOptions, norm_contributors
from actors.transport import destroy_groups, new_group, select_device
from orchestrator.core.plan import straight_plan

from benchmarks import gpu_check_worker as worker_checks

WIDTH, ROWS, BLOCKS = 64, 32, 4


def _blocks(device: torch.device) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()).to(device) for _ in range(BLOCKS)]


def _steps(device: torch.device, group: object, dtype: torch.dtype, scale: LossScale | None) -> str:
    """Three optimizer steps with autocast ``dtype``, clipping (and ``scale``): the step hooks over
    a real process group of one against torch's clip_grad_norm_ (+ GradScaler), bit for bit."""
    options = TrainingOptions(max_grad_norm=0.05, loss_scale=scale)
    ours, stock = _blocks(device), nn.Sequential(*_blocks(device))
    plan = straight_plan([0, BLOCKS], 1)
    modules = dict(enumerate(ours))
    hooks = StepHooks(options, None, norm_contributors(plan, 0, modules), [p for m in ours for p in m.parameters()], group,
                      {}, plan, device, NormLayout.of(ours))
    opt_ours = torch.optim.AdamW([p for m in ours for p in m.parameters()], lr=1e-2)
    opt_stock = torch.optim.AdamW(stock.parameters(), lr=1e-2)
    scaler = None if scale is None else torch.amp.GradScaler(device.type, init_scale=scale.init_scale,
                                                              growth_interval=scale.growth_interval)
    skipped = 0
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(ROWS, WIDTH, generator=g).to(device), torch.randn(ROWS, WIDTH, generator=g).to(device)
        with torch.autocast(device.type, dtype=dtype):
            out_ours, out_stock = nn.Sequential(*ours)(x), stock(x)
        loss_ours = nn.functional.mse_loss(out_ours.float(), y)
        loss_stock = nn.functional.mse_loss(out_stock.float(), y)
        (loss_ours if hooks.scaler is None else hooks.scaler.scale_loss(loss_ours)).backward()
        (loss_stock if scaler is None else scaler.scale(loss_stock)).backward()
        if hooks.before(step):
            opt_ours.step()
        else:
            skipped += 1
        if scaler is not None:
            scaler.unscale_(opt_stock)
        torch.nn.utils.clip_grad_norm_(stock.parameters(), 0.05)
        if scaler is None:
            opt_stock.step()
        else:
            scaler.step(opt_stock)
            scaler.update()
        opt_ours.zero_grad(set_to_none=True)
        opt_stock.zero_grad(set_to_none=True)
    worst = max(float((a - b).detach().abs().max()) for a, b in zip([p for m in ours for p in m.parameters()], stock.parameters()))
    assert worst == 0.0, f"max |dW| {worst:.3e} against torch's clip_grad_norm_" + (" + GradScaler" if scale else "")
    return f"max |dW| 0 against torch after 3 steps ({skipped} skipped by overflow)"


def check_fp16(device: torch.device, group: object) -> str:
    return _steps(device, group, torch.float16, LossScale(init_scale=2.0 ** 24, growth_interval=1))


def check_bf16(device: torch.device, group: object) -> str:
    return _steps(device, group, torch.bfloat16, None)


def check_snapshot(device: torch.device, group: object) -> str:
    """The deferred snapshot (on CUDA: copies on a side stream into pinned memory, ordered after
    an event on the compute stream) equals the state it was asked for while the next forward and
    backward are enqueued, and is complete before the next optimizer step may change it."""
    block = _blocks(device)[0]
    opt = torch.optim.Adam(block.parameters(), lr=0.1)
    x = torch.ones(512, WIDTH, device=device)
    block(x).sum().backward()
    opt.step()
    want = {k: v.detach().cpu().clone() for k, v in block.state_dict().items()}
    want_opt = {k: v.detach().cpu().clone() for k, v in opt.state[next(iter(block.parameters()))].items()}
    take = deferred_snapshot(0, block, opt)
    for _ in range(3):  # the next iteration's compute, overlapping the copy
        block(x).pow(2).sum().backward()
    snap = take()
    opt.step()
    diffs = [k for k, v in want.items() if not torch.equal(v, snap["model"][k].cpu())]
    assert not diffs, f"snapshot differs from the state it was asked for: {diffs}"
    assert snap["optimizer"] is not None and snap["optimizer"]["state"], "no optimizer state in the snapshot"
    got_opt = snap["optimizer"]["state"][0]
    assert all(torch.equal(v, got_opt[k].cpu()) for k, v in want_opt.items()), "optimizer state differs"
    return "the snapshot holds its step's weights and optimizer state" + (" (side stream, pinned)" if device.type == "cuda" else "")


def check_events(device: torch.device, group: object) -> str:
    clock = EventClock()
    a = torch.randn(2048, 2048, device=device)
    start = clock.mark()
    for _ in range(10):
        a = a @ a / 2048
    end = clock.mark()
    torch.cuda.synchronize()
    (span,), _, _ = clock.resolve([("mm", "F", start, end)], [], [])
    assert span[3] > span[2], span
    return f"10 matmuls timed {1e3 * (span[3] - span[2]):.2f} ms by CUDA events"


def check_group_reformations(device: torch.device, group: object) -> str:
    """20 formations of a group of one (the norm and tied groups a live move re-forms), each used
    once and destroyed: the process keeps no group and no device memory for them."""
    groups_before = len(dist.distributed_c10d._world.pg_map)
    free0 = torch.cuda.mem_get_info()[0] if device.type == "cuda" else 0
    one = 0
    for i in range(20):
        g = new_group([0], 60.0)
        t = torch.ones(1, device=device)
        dist.all_reduce(t, group=g)  # creates the communicator
        if i == 0 and device.type == "cuda":
            torch.cuda.synchronize()
            one = free0 - torch.cuda.mem_get_info()[0]
        destroy_groups([g])
    left = len(dist.distributed_c10d._world.pg_map) - groups_before
    assert left == 0, f"{left} groups left after 20 re-formations"
    if device.type != "cuda":
        return "20 group re-formations, 0 groups left"
    torch.cuda.synchronize()
    grown = free0 - torch.cuda.mem_get_info()[0]
    assert grown <= max(one, 64 << 20), f"device memory grew {grown >> 20} MiB (one communicator: {one >> 20} MiB)"
    return f"20 group re-formations, 0 groups left, device memory {grown / 2**20:+.0f} MiB (one communicator {one / 2**20:.0f} MiB)"


def _ray_up(device: torch.device) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, num_gpus=1 if device.type == "cuda" else 0, include_dashboard=False,
                 log_to_driver=False)  # its own instance, never a cluster found on the machine


def _api(plan_fixed: bool, device: torch.device) -> str:
    from orchestrator import ElasticJob, RunConfig, ScalingConfig, TrainConfig

    _ray_up(device)
    train = TrainConfig(model_factory=partial(_blocks, torch.device("cpu")), loss_fn=nn.functional.mse_loss,
                        optimizer_factory=partial(torch.optim.SGD, lr=0.05, momentum=0.9), data_fn=_data, num_microbatches=4)
    plan = straight_plan([0, BLOCKS], 4) if plan_fixed else None
    with tempfile.TemporaryDirectory() as tmp:
        scaling = ScalingConfig(devices=1, plan=plan, planner="pipedream", use_gpu=device.type == "cuda")
        with ElasticJob(train, scaling, RunConfig(storage=tmp, checkpoint_every=0, progress=False)) as job:
            result = job.fit(3)
            diff = job.max_abs_diff()
    assert diff <= 1e-5, f"max |dW| {diff:.3e} against single-process training"
    return f"3 steps, max |dW| {diff:.1e} against single-process training, final loss {result.final_loss:.4f}"


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(ROWS, WIDTH, generator=g), torch.randn(ROWS, WIDTH, generator=g)


CHECKS: list[tuple[str, Callable[[torch.device, object], str], bool]] = [  # name, check, needs CUDA
    ("fp16-loss-scale-clip", check_fp16, False),
    ("bf16-clip", check_bf16, False),
    ("side-stream-snapshot", check_snapshot, False),
    ("cuda-event-timing", check_events, True),
    ("live-move-group-reformations", check_group_reformations, False),
    *worker_checks.CHECKS,  # each forms a world of its own in this process (benchmarks/gpu_check_worker.py)
    ("api-one-stage", lambda d, g: _api(True, d), False),
    ("api-data-parallel-of-one", lambda d, g: _api(False, d), False),
    *worker_checks.ray_checks(_ray_up),
]
OWN_WORLD = {name for name, _, _ in worker_checks.CHECKS}  # checks after these find no group of this process's
IN_RAY = {"api-one-stage", "api-data-parallel-of-one", "live-moves-20"}  # their workers are other processes


def main() -> int:
    kind = os.environ.get("GPU_CHECK_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind not in ("cpu", "cuda"):
        print(f"GPU_CHECK_DEVICE must be cpu or cuda, not {kind!r}", file=sys.stderr)
        return 2
    if kind == "cuda" and not torch.cuda.is_available():
        print("GPU_CHECK_DEVICE=cuda but this machine has no CUDA device", file=sys.stderr)
        return 2
    device = select_device() if kind == "cuda" else torch.device("cpu")
    backend = "nccl" if kind == "cuda" else "gloo"
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=60))
    dist.init_process_group(backend, store=store, rank=0, world_size=1, device_id=device if kind == "cuda" else None)
    group = new_group([0], 60.0)  # a real group of one, as a stage's norm group
    _ray_up(device)  # in-memory snapshots live in Ray's object store, in this process's checks too
    failed = 0
    for name, check, needs_cuda in CHECKS:
        if needs_cuda and kind != "cuda":
            print(f"{name} skipped (needs CUDA)", flush=True)
            continue
        if name in IN_RAY and dist.is_initialized():
            dist.destroy_process_group()  # the job's workers are other processes; this one leaves its group
        t0 = time.perf_counter()
        try:
            detail = check(device, group)
            verdict = "ok"
        except Exception as exc:  # noqa: BLE001 - one verdict per check, the next check still runs
            detail, verdict = f"{type(exc).__name__}: {exc}".splitlines()[0], "FAIL"
            traceback.print_exc(file=sys.stderr)
            failed += 1
        if dist.is_initialized() and name in OWN_WORLD:
            dist.destroy_process_group()  # a failed check may leave its world behind
        print(f"{name} {verdict} [{backend}, {time.perf_counter() - t0:.1f} s]: {detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
