"""The runtime's measurements in the controller's terms, and the profile the controller prices moves with.

:func:`to_controller_metrics` turns a measured iteration (the workers' own spans) into the controller's
:class:`~orchestrator.adapt.handle.IterationMetrics`; :func:`measured_profile` / :func:`profile_like_workers` time the
model's blocks here as one CPU worker computes, for the job's loop (:mod:`orchestrator.elastic.job_loop`).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
from torch import nn

from actors.job_spec import cpu_threads
from actors.metrics import MeasuredIteration
from orchestrator.adapt.handle import IterationMetrics, Link
from orchestrator.core.plan import Plan
from orchestrator.core.profile import Profile
from orchestrator.schedule.ir import COMPUTE_KINDS
from orchestrator.train.runtime import PipelineRuntime


def measured_profile(trainer: PipelineRuntime, warmup: int = 2, repeats: int = 5) -> Profile:
    """Profile the trainer's model on one micro-batch here (what the controller's cost model
    rescales by each device's observed speed), with as many torch threads as one of its CPU
    workers computes with. Why: the monitor reads a device's speed as profiled seconds over
    observed seconds, so a profile timed differently from how the workers run misprices every
    block, and the error lands in the believed speeds — which follow the device, not the block,
    so every move is then mispredicted. Timed with the driver's two threads on two shared cores,
    blocks of equal size came out at 2–56 ms where a one-thread worker takes 2.2 ms
    (benchmarks/results/adaptive.md, live section)."""
    spec = trainer.spec
    return profile_like_workers(spec.model_factory, spec.data_fn, trainer.num_microbatches, spec.seed,
                                cpu_threads(spec.threads, trainer.size), warmup, repeats)


def profile_like_workers(model_factory: Callable[[], list[nn.Module]], data_fn: Callable[[int], Any], num_microbatches: int,
                         seed: int, threads: int, warmup: int = 2, repeats: int = 5) -> Profile:
    """The one way the driver times the model's blocks on one micro-batch: with ``threads`` torch
    threads, as one CPU worker computes (see :func:`measured_profile` for why)."""
    from actors import user_code
    from orchestrator.profiling.profiler import profile_blocks

    torch.manual_seed(seed)
    blocks = user_code.blocks(model_factory)
    inputs, _ = user_code.batch(data_fn, 0)
    sample = torch.tensor_split(inputs, num_microbatches)[0]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return profile_blocks(blocks, sample, "live-model", int(sample.shape[0]), warmup=warmup, repeats=repeats, device="cpu")
    finally:
        torch.set_num_threads(before)


def to_controller_metrics(m: MeasuredIteration, iteration: int, plan: Plan, lost: tuple[int, ...] = (),
                          new: tuple[int, ...] = ()) -> IterationMetrics:
    """The runtime's measured iteration in the controller's terms: forward+backward span seconds
    per device (all-reduce and optimizer step excluded, as in the profile), bytes per directed
    link, and the seconds they would take at the link's fastest transfer of the iteration.

    Why the fastest transfer and not the sum of spans: a transfer's span runs until the receiver
    *finds* the data complete, so it also counts the receiver's compute (and injected slowdown)
    when the data arrived while it was busy — the sum is the bytes' time only on a link whose
    receiver always waits. Each span is an upper bound on its own wire time; the smallest per
    byte is the tightest this iteration gives. Seen live (4 actors, 131 KB per transfer):
    0.1 ms for the fastest transfer of a link and 2–68 ms for the others of the same link, whose
    sum read as 0.04–3 Gb/s — which priced a one-block move at 1 s (it stalled 80 ms) and made
    re-plans reorder devices around links that were only waiting."""
    compute: dict[int, float] = {}
    for s in m.spans:
        if s.kind in COMPUTE_KINDS:
            compute[s.device] = compute.get(s.device, 0.0) + (s.end - s.start)
    link_bytes: dict[Link, float] = {}
    per_byte: dict[Link, float] = {}
    for t in m.transfers:
        key = (t.src, t.dst)
        link_bytes[key] = link_bytes.get(key, 0.0) + t.bytes
        if t.bytes > 0 and t.seconds > 0:
            per_byte[key] = min(per_byte.get(key, math.inf), t.seconds / t.bytes)
    link_s = {key: link_bytes[key] * rate for key, rate in per_byte.items()}
    return IterationMetrics(iteration, m.iteration_s, plan, compute, link_bytes, link_s, True, lost, new)


__all__ = ["measured_profile", "profile_like_workers", "to_controller_metrics"]
