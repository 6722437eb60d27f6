"""A live move destroys the process groups it replaces (issue #29): the global-norm group and the
tied weights' groups of the old plan, which each hold an NCCL communicator (GPU memory and a
stream) for as long as they live. Two real worker processes on gloo, a few live moves; the number
of process groups each holds must not grow (it grew by two per move: the tied and the norm group).
``benchmarks/gpu_check.sh`` measures the GPU memory side of the same on a GPU.
"""

from __future__ import annotations

import multiprocessing as mp
from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("transformers")
from transformers import GPT2Config  # noqa: E402

from actors.job_spec import JobSpec  # noqa: E402
from actors.stage_worker import StageWorker  # noqa: E402
from actors.training import TrainingOptions  # noqa: E402
from actors.transport import free_endpoint  # noqa: E402
from orchestrator.core.plan import straight_plan  # noqa: E402
from orchestrator.profiling import hf  # noqa: E402

MOVES = 4
CONFIG = GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=16, n_positions=4, bos_token_id=0, eos_token_id=0)


def _spec() -> JobSpec:
    return JobSpec(partial(hf.causal_lm_blocks, CONFIG), hf.lm_loss, partial(torch.optim.SGD, lr=0.1),
                   partial(hf.token_batch, 16, 4, 2), seed=1, pg_timeout_s=60.0, threads=1,
                   training=TrainingOptions(max_grad_norm=1.0))


def _worker(device: int, host: str, port: int, out: Any) -> None:
    try:
        plan = straight_plan([0, 2, 4], 1).to_dict()  # the tied embedding on both devices
        worker = StageWorker()
        worker.configure(_spec(), plan, device, {0: 0, 1: 1}, host, port)
        worker.run_iteration(0)
        counts = [len(dist.distributed_c10d._world.pg_map)]
        for move in range(MOVES):
            worker.live_move(plan, {0: 0, 1: 1}, None, [], [])
            counts.append(len(dist.distributed_c10d._world.pg_map))
        worker.shutdown()
        out.put((device, counts))
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails with it
        out.put((device, repr(exc)))


def test_live_moves_do_not_accumulate_process_groups() -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    host, port = free_endpoint()
    procs = [ctx.Process(target=_worker, args=(d, host, port, out)) for d in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=300) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    for device, counts in results.items():
        assert isinstance(counts, list), f"device {device}: {counts}"
        # the default group, one link group per direction, the norm group, the tied group
        assert counts[0] == 5, counts
        assert set(counts) == {counts[0]}, f"device {device} holds more process groups after each move: {counts}"
