"""The cluster model of the Ray cluster this job actually has: slots, measured speeds and links.

:func:`discover_cluster` starts one stage worker per slot (:mod:`actors.placement` pins each to
its node), lets each time a short probe on its own device and the links between them with the
runtime's transport (:mod:`actors.probe`), and builds the :class:`~orchestrator.core.cluster.Cluster`
the planners use. The same workers then run the job (``WorkerGroup.configure`` reuses them), so
the devices the plan names are the devices that were measured.

Speed is the driver's time for the probe's work over the device's time: what ``Device.speed``
means to the simulator when the profile was measured on the driver. Without a measurement the
published-ratio table is the prior (``speed_source: "table"``).
"""

from __future__ import annotations

import logging
import math
import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from actors.ray_session import LOCAL_SYSTEM_CONFIG, ensure_ray
from orchestrator.core.cluster import GBPS, Cluster, Device
from orchestrator.core.errors import UserError


@dataclass(frozen=True)
class Discovered:
    """A measured cluster model, what was measured for each device, and the workers that measured it."""

    cluster: Cluster
    devices: tuple[dict[str, Any], ...]
    group: Any  # actors.group.WorkerGroup, kept to run the job

    def to_json(self) -> dict[str, Any]:
        bw = self.cluster.bandwidth
        gbps = [[0.0 if i == j else round(float(bw[i, j]) / GBPS, 3) for j in range(len(bw))] for i in range(len(bw))]
        return {"devices": list(self.devices), "bandwidth_gbps": gbps, "message_latency_s": self.cluster.latency_s}


def discover_cluster(kind: str | None = None, local_slots: int | None = None,
                     seconds_of: Callable[[Any], float] | None = None, probe_links: bool = True,
                     fallback_gbps: tuple[float, float] = (100.0, 10.0)) -> Discovered:
    """Slots → pinned workers → probes → cluster model. ``seconds_of(torch_device)``: the probe's
    work (:func:`actors.probe.model_probe` for a model; ``None``: the built-in matmul)."""
    import torch

    from actors import probe
    from actors.group import WorkerGroup
    from actors.placement import discover

    slots = discover(kind, local_slots)
    group = WorkerGroup(len(slots), use_gpu=slots[0].kind == "gpu", slots=slots)
    try:
        seconds, links = group.probe(seconds_of, links=probe_links)
        driver = (seconds_of or probe.builtin_seconds)(torch.device("cpu"))
    except BaseException:
        group.shutdown()
        raise
    devices, reports = [], []
    for i, (slot, found, took) in enumerate(zip(slots, group.identities, seconds)):
        speed, source = (driver / took, "model" if seconds_of else "probe") if took > 0 and math.isfinite(took) else (None, "")
        if speed is None:
            prior = probe.prior_speed(slot.accelerator)
            speed, source = (prior, "table") if prior else (1.0, "default")
        memory = float(found.get("memory_bytes") or slot.memory_bytes or 1.0)
        devices.append(Device(i, slot.node_id, float(speed), memory, slot.kind))
        reports.append({"device": i, "node_id": slot.node_id, "kind": slot.kind, "accelerator": slot.accelerator,
                        "speed": round(float(speed), 4), "speed_source": source, "memory_bytes": memory,
                        "actual_device": found.get("device"), "device_name": found.get("device_name")})
    bandwidth, latency = link_matrix([s.node_id for s in slots], links, fallback_gbps)
    return Discovered(Cluster(tuple(devices), bandwidth, latency), tuple(reports), group)


def plan_on_cluster(spec: Any, num_microbatches: int, planner: str, cluster: Cluster | None,
                    use_gpu: bool | None) -> tuple[Any, Any]:
    """``(plan, workers)``: the model of ``spec`` (an :class:`actors.job_spec.JobSpec`)
    profiled here on one micro-batch and planned by ``planner``.

    Without a ``cluster``: the Ray cluster's slots with speeds measured on a few of the model's
    own blocks and links probed with the runtime's transport (:func:`discover_cluster`); those
    workers are returned to run the plan (``None`` with a given cluster)."""
    import ray
    import torch

    from actors import user_code
    from actors.probe import model_probe
    from orchestrator.planners.base import PlannerOptions, run_planner
    from orchestrator.profiling.profiler import profile_blocks

    torch.manual_seed(spec.seed)
    blocks = user_code.blocks(spec.model_factory)
    inputs, _ = user_code.batch(spec.data_fn, 0)
    sample = torch.tensor_split(inputs, num_microbatches)[0]
    profile = profile_blocks(blocks, sample, "model", int(sample.shape[0]), device="cpu")
    probed = None
    if cluster is None:
        if not ray.is_initialized():
            ensure_ray()
        kind = None if use_gpu is None else ("gpu" if use_gpu else "cpu")
        found = discover_cluster(kind, seconds_of=model_probe(spec.model_factory, spec.data_fn, rows=int(sample.shape[0])))
        cluster, probed = found.cluster, found.group
    try:
        return run_planner(planner, profile, cluster, PlannerOptions(num_microbatches=num_microbatches)).plan, probed
    except BaseException:
        if probed is not None:
            probed.shutdown()
        raise


def link_matrix(nodes: Sequence[str], measured: dict[tuple[int, int], tuple[float, float]],
                fallback_gbps: tuple[float, float]) -> tuple[np.ndarray, float]:
    """A full bytes/s matrix from the probed pairs: a pair not probed takes its node pair's
    measurement (intra-node pairs: that node's), else the nominal fallback; symmetric."""
    n = len(nodes)
    by_nodes: dict[tuple[str, str], float] = {}
    for (a, b), (_, bw) in measured.items():
        by_nodes[(nodes[a], nodes[b])] = by_nodes[(nodes[b], nodes[a])] = bw
    out = np.zeros((n, n))
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            found = measured.get((a, b)) or measured.get((b, a))
            if found:
                out[a, b] = found[1]
            else:
                nominal = (fallback_gbps[0] if nodes[a] == nodes[b] else fallback_gbps[1]) * GBPS
                out[a, b] = by_nodes.get((nodes[a], nodes[b]), nominal)
    latencies = [lat for lat, _ in measured.values()]
    return out, float(np.median(latencies)) if latencies else 0.0


def connect(address: str | None) -> bool:
    """Join the Ray cluster at ``address`` (``None``: ``RAY_ADDRESS`` or a local instance).
    Returns whether this call started Ray. An address with no cluster behind it is one line."""
    import ray

    if ray.is_initialized():
        return False
    target = address or os.environ.get("RAY_ADDRESS")
    _reachable(target)
    try:
        if target:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, logging_level=logging.ERROR)
        else:  # a fresh local instance: no dashboard to start
            ray.init(address="local", ignore_reinit_error=True, log_to_driver=False, include_dashboard=False, logging_level=logging.ERROR,
                     _system_config=LOCAL_SYSTEM_CONFIG)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        text = " ".join(str(exc).split())[:200]
        raise UserError(f"no Ray cluster reachable at {address or 'RAY_ADDRESS'}: {text}") from None
    return True


def _reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """Fail in seconds, with one line, when nothing listens at a ``host:port`` address (Ray itself
    keeps retrying its control store for minutes). Other forms (``auto``, ``local``) go to Ray."""
    if not address or address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"not a Ray address: {address!r} (expected host:port, ray://host:port, auto or local)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(f"no Ray cluster at {address}: {exc.strerror or exc}") from None
