"""The checks of ``benchmarks/gpu_check.sh`` that drive the product's own stage worker and runtime (issue #39 item 5).

Why apart from :mod:`benchmarks.gpu_check`: those check single parts (the step hooks, a snapshot, a group); these run
the code a job runs — :class:`actors.stage_worker.StageWorker` in this process through ``configure``, iterations,
``abort``, host copies and ``live_move``, and :class:`orchestrator.train.runtime.PipelineRuntime` for live moves —
against the single-process reference (:class:`actors.reference.ReferenceTrainer`). Each check forms its own world
(a stage worker's ``configure`` replaces this process's default group) and leaves none behind. One device: NCCL
refuses two ranks on one GPU, so everything in process is a world of one; the moves across two workers run on CPU.
"""

from __future__ import annotations

import gc
import linecache
import warnings
from dataclasses import replace
from functools import partial
from typing import Any, Callable

import torch
import torch.distributed as dist
from transformers import GPT2Config

from actors.job_spec import JobSpec
from actors.reference import ReferenceTrainer, max_difference
from actors.stage_worker import StageWorker
from actors.training import LossScale, TrainingOptions, autocast_blocks
from actors.transport import free_endpoint
from orchestrator.core.plan import Plan, ScheduleKind, interleave, straight_plan
from orchestrator.profiling import hf
from orchestrator.profiling.models import example_batch, loss_fn, mlp

VOCAB, SEQ, ROWS, MB, STEPS = 64, 8, 8, 4, 5
GPT2 = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # blocks: tied embedding, 2 layers, tied head
DATA = partial(hf.token_batch, VOCAB, SEQ, ROWS)
ADAMW = partial(torch.optim.AdamW, lr=1e-2)
SGD = partial(torch.optim.SGD, lr=0.05, momentum=0.9)
WIDTHS = (8, 16, 16, 16, 4)  # the soak's MLP, four blocks


def _worker(device: torch.device, spec: JobSpec, plan: Plan, keep_copies: bool = False) -> StageWorker:
    """A stage worker of ``plan`` in this process, rank 0 of a world of one (a fresh store: its own endpoint)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    worker = StageWorker()
    host, port = free_endpoint()
    worker.configure(spec, plan.to_dict(), 0, {0: 0}, host, port, keep_copies)
    return worker


def _against_reference(worker: StageWorker, spec: JobSpec, plan: Plan, steps: int, device: torch.device) -> float:
    """Max |dW| between ``worker``'s blocks and the reference trained ``steps`` steps (its loss scale must agree)."""
    reference = ReferenceTrainer.for_plan(plan, spec.model_factory, spec.loss_fn, spec.optimizer_factory, spec.data_fn, spec.seed,
                                          device, spec.training)
    reference.train(steps)
    scaler = worker.hooks.scaler if worker.hooks is not None else None
    assert scaler is None or float(scaler.scale) == reference.scale, f"loss scale {float(scaler.scale)} != the reference's {reference.scale}"
    return max_difference({b: {k: v.cpu() for k, v in sd.items()} for b, sd in reference.state_dicts().items()}, worker.state_dicts())


def check_stage_worker(device: torch.device, group: object) -> str:
    """Interleaved virtual stages (two on this device, recomputed) and ZB-H1, a tied embedding, fp16 autocast with loss
    scaling and clipping (and bf16 with clipping): a stage worker's iterations against the reference, to 1e-5."""
    interleaved = interleave(straight_plan([0, 4], MB), 2)
    interleaved = replace(interleaved, stages=tuple(replace(s, recompute=True) for s in interleaved.stages))
    plans = {"interleaved+recompute": interleaved, "zb-h1": straight_plan([0, 4], MB, ScheduleKind.ZB_H1)}
    # a scale that overflows now and then: steps skipped everywhere and the scale backed off, grown after two good steps
    fp16 = TrainingOptions(max_grad_norm=0.05, loss_scale=LossScale(init_scale=2.0 ** 20, growth_interval=2))
    cases = [(torch.float16, fp16, 1e-5), (torch.bfloat16, TrainingOptions(max_grad_norm=0.05), 1e-5)]
    worst: dict[str, float] = {}
    scales: set[float] = set()
    for name, plan in plans.items():
        for dtype, options, tolerance in cases:
            spec = JobSpec(autocast_blocks(partial(hf.causal_lm_blocks, GPT2), dtype), hf.lm_loss, ADAMW, DATA, seed=1,
                           pg_timeout_s=60.0, threads=1, training=options)
            worker = _worker(device, spec, plan)
            try:
                for step in range(STEPS):
                    worker.run_iteration(step)
                diff = _against_reference(worker, spec, plan, STEPS, device)
                if worker.hooks is not None and worker.hooks.scaler is not None:
                    scales.add(float(worker.hooks.scaler.scale))
            finally:
                worker.shutdown()
            label = f"{name} {str(dtype).removeprefix('torch.')}"
            assert diff <= tolerance, f"{label}: max |dW| {diff:.2e} > {tolerance:.0e} against the reference"
            worst[label] = diff
    assert scales and max(scales) < 2.0 ** 20, f"the fp16 runs never overflowed (scales {sorted(scales)}): the skip went untested"
    return (f"{STEPS} steps each (fp16: steps skipped on overflow, final scale {sorted(scales)}), max |dW| against the reference: "
            + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))


INTENDED_SYNCS = ("the one host sync", "the step's one host read")
"""Markers of the lines where the executor reads the device on purpose (actors/execution.py, actors/training.py)."""


def check_sync_audit(device: torch.device, group: object) -> str:
    """``torch.cuda.set_sync_debug_mode("warn")`` around a stage worker's iterations (fp16, loss scaling, clipping,
    tied weights): every synchronizing operation must be one of the intended ones, marked in the source."""
    spec = JobSpec(autocast_blocks(partial(hf.causal_lm_blocks, GPT2), torch.float16), hf.lm_loss, ADAMW, DATA, seed=1,
                   pg_timeout_s=60.0, threads=1,
                   training=TrainingOptions(max_grad_norm=0.05, loss_scale=LossScale(init_scale=2.0 ** 8)))
    worker = _worker(device, spec, interleave(straight_plan([0, 4], MB), 2))
    try:
        worker.run_iteration(0)  # the first one sets things up (allocations, kernels): not audited
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for step in range(1, 1 + STEPS):
                    worker.run_iteration(step)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        worker.shutdown()
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    stray = sorted({f"{w.filename}:{w.lineno}" for w in syncs if not any(m in linecache.getline(w.filename, w.lineno) for m in INTENDED_SYNCS)})
    assert not stray, f"{len(stray)} unintended synchronizing call site(s): {', '.join(stray[:4])}"
    return f"{len(syncs)} synchronizing operations in {STEPS} iterations, each an intended one"


def _mlp_spec(options: TrainingOptions | None = None) -> JobSpec:
    return JobSpec(partial(mlp, WIDTHS), loss_fn("mlp"), SGD, partial(example_batch, "mlp", 12, widths=WIDTHS), seed=0,
                   pg_timeout_s=60.0, threads=1, training=options or TrainingOptions())


def check_abort_reform(device: torch.device, group: object) -> str:
    """In one process, twice: iterations, an in-memory snapshot, a new world formed as a recovery's re-form does
    (``configure`` keeping the host copies), the state restored from the copy, more iterations. The first time the
    communicators were aborted first (a survivor that failed its iteration); the second time the old world is still
    up (a death between iterations) and the re-form aborts it rather than destroying it. Exact against six
    uninterrupted reference steps."""
    spec, plan = _mlp_spec(), straight_plan([0, 4], MB)
    worker = _worker(device, spec, plan)
    restored: list[dict[str, int]] = []
    try:
        for at, aborted in ((2, True), (4, False)):
            for step in range(at - 2, at):
                worker.run_iteration(step)
            worker.snapshot_copies(at)
            worker.run_iteration(at)  # its optimizer step waits for the copy of the state at step `at`: then lost
            if aborted:
                worker.abort()
                assert worker.aborted and not dist.is_initialized(), "abort left a process group"
            host, port = free_endpoint()
            worker.configure(spec, plan.to_dict(), 0, {0: 0}, host, port, True)  # as WorkerGroup.reform: keep the copies
            restored.append(worker.restore_copies(at, {}, None, None))
        for step in range(4, 6):
            worker.run_iteration(step)
        diff = _against_reference(worker, spec, plan, 6, device)
    finally:
        worker.shutdown()
    assert diff <= 1e-5, f"max |dW| {diff:.2e} after abort, re-form and restore"
    assert all(r["own"] == 4 for r in restored), restored
    return f"abort, re-form, restore, iterate, then re-form over a live world; max |dW| {diff:.1e} after 6 steps"


def check_snapshot_overlap(device: torch.device, group: object) -> str:
    """An in-memory snapshot taken while the next iteration runs (the product's path: host copies in the background,
    the optimizer step waits for them): the time that step blocks (its ``copy_wait`` span; CUDA events on a GPU, the
    host clock on CPU) beside the iteration's, and the copy equal to the state it was asked for."""
    widths = (256,) * 5
    spec = replace(_mlp_spec(), model_factory=partial(mlp, widths), data_fn=partial(example_batch, "mlp", 64, widths=widths),
                   optimizer_factory=ADAMW)
    plan = straight_plan([0, 4], MB)
    worker = _worker(device, spec, plan)
    blocking: list[float] = []
    steps: list[float] = []
    try:
        worker.run_iteration(0)
        for step in range(1, 4):
            want = worker.state_dicts()
            worker.snapshot_copies(step)
            report = worker.run_iteration(step)
            blocking.append(sum(e - s for _, kind, s, e in report["spans"] if kind == "copy_wait"))
            steps.append(float(report["iteration_s"]))
            for b, sd in want.items():  # against what a recovery in place restores from
                got = worker.checkpoints.copies.get(step, b)
                bad = [k for k, v in sd.items() if got is None or not torch.equal(v, got["model"][k].cpu())]
                assert not bad, f"step {step}: the snapshot of block {b} differs from the state it was asked for: {bad}"
        held = worker.host_copies().nbytes
    finally:
        worker.shutdown()
    clock = "CUDA events" if device.type == "cuda" else "host clock"
    share = sum(blocking) / max(sum(steps), 1e-9)
    return (f"3 snapshots of {int(held) / 2**20:.1f} MiB held, exact; the step blocked {1e3 * sum(blocking) / 3:.2f} ms of "
            f"{1e3 * sum(steps) / 3:.1f} ms per iteration ({100 * share:.0f}%, {clock})")


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def check_live_moves(device: torch.device, group: object, ray_up: Callable[[torch.device], None]) -> str:
    """Twenty live moves through the runtime's primitive (:meth:`PipelineRuntime.move_live`, what ElasticJob calls),
    one iteration after each, exact against the reference; memory must not grow with the moves (from move 5 to 20:
    the workers' resident memory on CPU, the device's used memory on a GPU). On CPU two workers hand a block back
    and forth; on one GPU the one worker switches between a straight and an interleaved plan (no second rank)."""
    from orchestrator.train.runtime import PipelineRuntime

    ray_up(device)
    spec = _mlp_spec()
    if device.type == "cuda":
        plans = [straight_plan([0, 4], MB), interleave(straight_plan([0, 4], MB), 2)]
        transfers: list[list[tuple[int, int, int, int]]] = [[], []]
    else:
        plans = [straight_plan([0, 2, 4], MB), straight_plan([0, 3, 4], MB)]
        transfers = [[(0, 1, 2, 3)], [(1, 0, 2, 3)]]  # to plans[0]: block 2 goes back to device 1; to plans[1]: to device 0
    members = sorted(plans[0].devices)
    runtime = PipelineRuntime(spec.model_factory, spec.loss_fn, spec.optimizer_factory, spec.data_fn, MB, plan=plans[0],
                              use_gpu=device.type == "cuda", pg_timeout_s=60.0, validate=False)
    used: list[int] = []
    try:
        runtime.start(members=members, slots={d: d for d in members})
        pids = [d.pid for d in runtime.devices()]
        runtime.complete_step(runtime.submit_step())
        for move in range(1, 21):
            to = move % 2
            runtime.move_live(plans[to], transfers[to], members)
            runtime.complete_step(runtime.submit_step())
            if move in (5, 20):
                gc.collect()
                if device.type == "cuda":
                    free, total = torch.cuda.mem_get_info()
                    used.append(total - free)
                else:
                    used.append(sum(_rss_kib(p) for p in pids) * 1024)
        reference = ReferenceTrainer.for_plan(plans[0], spec.model_factory, spec.loss_fn, spec.optimizer_factory, spec.data_fn, spec.seed)
        reference.train(runtime.step)
        diff = max_difference(reference.state_dicts(), runtime.state_dicts())
    finally:
        runtime.shutdown()
    grown = used[1] - used[0]
    what = "device memory used" if device.type == "cuda" else "workers' resident memory"
    assert diff <= 1e-5, f"max |dW| {diff:.2e} after 20 live moves"
    assert grown <= max(0.05 * used[0], 32 << 20), f"{what} grew {grown / 2**20:+.1f} MiB from move 5 to 20"
    return f"20 live moves, 21 steps, max |dW| {diff:.1e}; {what} {grown / 2**20:+.1f} MiB from move 5 to 20"


def ray_checks(ray_up: Callable[[torch.device], None]) -> list[tuple[str, Callable[[torch.device, object], str], bool]]:
    """The checks that run workers in Ray (``ray_up(device)`` starts the script's own Ray instance first)."""
    return [("live-moves-20", lambda d, g: check_live_moves(d, g, ray_up), False)]


CHECKS: list[tuple[str, Callable[[torch.device, Any], str], bool]] = [  # name, check, needs CUDA
    ("stage-worker-interleaved", check_stage_worker, False),
    ("sync-audit", check_sync_audit, True),
    ("abort-reform", check_abort_reform, False),
    ("snapshot-overlap", check_snapshot_overlap, False),
]

__all__ = ["CHECKS", "ray_checks"]
