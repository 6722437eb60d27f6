"""Short measurements a stage worker makes on its own device at start: speed and links.

Why measure: the planners and the controller reason about relative device speeds and per-link
bandwidth; Ray knows neither (it knows GPU types, and :data:`PRIOR_SPEED` turns those into a
first guess only). A speed is the ratio of the same work's time on the driver (where the profile
was measured) to its time on the device, so it means exactly what ``Device.speed`` means to the
simulator. Links are timed with the transport the runtime uses (gloo or NCCL point-to-point,
blocking, in one global order so probes cannot deadlock).
"""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from actors.materialize import materialize

# Dense fp16/bf16 tensor throughput relative to a V100 (vendor figures, rounded): a prior for a
# device type the probe has not measured yet, never a substitute for the measurement.
PRIOR_SPEED = {
    "K80": 0.1, "P4": 0.2, "P100": 0.5, "T4": 0.5, "V100": 1.0, "A10G": 1.0, "L4": 1.0, "A10": 1.1,
    "L40S": 2.5, "A100": 2.5, "H100": 6.0, "H200": 6.0, "B200": 12.0,
}


def prior_speed(accelerator: str) -> float | None:
    """The table's ratio for an accelerator name such as ``A100`` or ``NVIDIA-A100-SXM4-80GB``."""
    name = accelerator.upper().replace("NVIDIA", "").replace("TESLA", "")
    for key in sorted(PRIOR_SPEED, key=len, reverse=True):
        if key in name:
            return PRIOR_SPEED[key]
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(work: Callable[[], Any], device: torch.device, repeats: int = 5) -> float:
    """Median seconds of ``work()`` after one warm-up run."""
    work()
    _sync(device)
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        work()
        _sync(device)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def matmul_work(device: torch.device, size: int = 256, count: int = 8) -> Callable[[], Any]:
    """The built-in probe when no model is given: ``count`` chained square matmuls."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)

    def work() -> Any:
        x = a
        for _ in range(count):
            x = torch.tanh(x @ b)
        return x

    return work


def builtin_seconds(device: torch.device) -> float:
    """Large enough on a GPU (a few ms) that launch overhead does not flatten the differences."""
    return timed(matmul_work(device, size=4096 if device.type == "cuda" else 256), device)


def model_seconds(model_factory: Callable[[], list[torch.nn.Module]], data_fn: Callable[[int], Any], blocks: int,
                  rows: int, device: torch.device) -> float:
    """Forward + backward of the model's first ``blocks`` blocks on ``rows`` rows of ``data_fn(0)``."""
    torch.manual_seed(0)
    modules = [materialize(m, device, 0, f"block{b}") for b, m in enumerate(list(model_factory())[:blocks])]
    inputs = data_fn(0)[0][:rows].to(device)

    def work() -> Any:
        x = inputs
        for m in modules:
            x = m(x)
        if x.is_floating_point() and x.requires_grad:
            x.float().sum().backward()
        return x

    return timed(work, device)


def model_probe(model_factory: Any, data_fn: Any, blocks: int = 3, rows: int = 8) -> Callable[[torch.device], float]:
    """A picklable probe timing a few of the model's own blocks (what the planner cares about)."""
    return partial(model_seconds, model_factory, data_fn, blocks, rows)


def ping(pairs: Sequence[tuple[int, int]], device: int, rank_of: dict[int, int], torch_device: torch.device,
         small_repeats: int = 5, large_bytes: int = 4 << 20, large_repeats: int = 3) -> dict[tuple[int, int], tuple[float, float]]:
    """Time every ``(a, b)`` pair in order: ``{(a, b): (latency_s, bytes_per_s)}`` for pairs this
    device starts. Blocking sends and receives walked in one global order cannot deadlock: the
    earliest unfinished pair always has both ends at it."""
    small = torch.zeros(1, device=torch_device)
    large = torch.zeros(max(1, large_bytes // 4), device=torch_device)
    out: dict[tuple[int, int], tuple[float, float]] = {}
    for a, b in pairs:
        if device == a:
            rtts, bulk = [], []
            for _ in range(small_repeats):
                t = time.perf_counter()
                dist.send(small, rank_of[b])
                dist.recv(small, rank_of[b])
                _sync(torch_device)  # NCCL returns at enqueue; the clock must see the data arrive
                rtts.append(time.perf_counter() - t)
            for _ in range(large_repeats):
                t = time.perf_counter()
                dist.send(large, rank_of[b])
                dist.recv(small, rank_of[b])
                _sync(torch_device)
                bulk.append(time.perf_counter() - t)
            # Minima, not medians: on a shared machine noise only ever adds time. A bulk round trip
            # is a small one plus the wire time; if noise hides the difference, the whole bulk
            # round trip bounds the wire time from above (a lower bound on the bandwidth).
            latency = min(rtts) / 2
            wire = max(min(bulk) - min(rtts), 0.05 * min(bulk))
            out[(a, b)] = (latency, large.numel() * 4 / wire)
        elif device == b:
            for _ in range(small_repeats):
                dist.recv(small, rank_of[a])
                dist.send(small, rank_of[a])
            for _ in range(large_repeats):
                dist.recv(large, rank_of[a])
                dist.send(small, rank_of[a])
            _sync(torch_device)
    return out
