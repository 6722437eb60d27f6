"""The devices a job may use and the bandwidth between every pair of them.

Bandwidth is a full matrix (bytes/s), not a two-level tree: SPP and the controller need arbitrary,
measured, asymmetric links. A zero entry means "no direct link"; traffic between such a pair is
routed over the widest path (the max-bottleneck path), which is what a store-and-forward relay
through other hosts would achieve. A topology with a pair that no path connects is rejected.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from orchestrator.core import limits
from orchestrator.core.errors import UserError
from orchestrator.core.ray_local import LOCAL_SYSTEM_CONFIG
from orchestrator.core.files import read_json

GBPS = 1e9 / 8  # bytes per second in one gigabit per second
DEVICE_KINDS = ("gpu", "cpu")  # what the runtime places stages on
FORMAT_VERSIONS = (1,)  # a cluster file without "version" is 1
MATRIX_FIELDS = ("format", "version", "devices", "bandwidth_bytes_per_s", "bandwidth_gbps", "message_latency_s")
TWO_LEVEL_FIELDS = ("format", "version", "servers", "gpus_per_server", "intra_gbps", "inter_gbps", "memory_bytes")
DEVICE_FIELDS = ("id", "node", "speed", "memory_bytes", "kind")
REPORT_FIELDS = ("device", "node_id", "accelerator", "speed_source", "actual_device", "device_name")
"""What ``orchestrator cluster --json`` reports per device beside the model's fields (read as the node: ``node_id``)."""
DEFAULT_MEMORY = 32 * 2**30


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator. ``speed`` is relative to the device the profile was measured on."""

    id: int
    node: str
    speed: float = 1.0
    memory_bytes: float = DEFAULT_MEMORY
    kind: str = "gpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", limits.count(self.id, "device", "id", minimum=0))
        where = f"device {self.id}"
        limits.text(self.node, where, "node")
        limits.choice(limits.text(self.kind, where, "kind"), where, "kind", DEVICE_KINDS)
        object.__setattr__(self, "speed", limits.number(self.speed, where, "speed", positive=True, maximum=1e6))
        object.__setattr__(self, "memory_bytes", limits.number(self.memory_bytes, where, "memory_bytes", positive=True, maximum=limits.MAX_BYTES))


@dataclass(frozen=True, eq=False)
class Cluster:
    """Devices (ids 0..n-1 in order) and the effective point-to-point bandwidth between them."""

    devices: tuple[Device, ...]
    bandwidth: np.ndarray  # [n, n] bytes/s as given; 0 = no direct link
    latency_s: float = 0.0
    """Fixed cost of one point-to-point message (seconds): NCCL ~10-30 µs, gloo over TCP ~0.3-1 ms."""
    effective: np.ndarray = field(init=False, repr=False)  # widest-path bandwidth, inf on the diagonal
    _speeds: np.ndarray = field(init=False, repr=False)
    _memories: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        devices = tuple(self.devices)
        object.__setattr__(self, "devices", devices)
        n = len(devices)
        if n == 0:
            raise UserError("cluster has no devices")
        limits.devices(n)
        for i, d in enumerate(devices):
            if d.id != i:
                raise UserError(f"device ids must be 0..{n - 1} in order; position {i} has id {d.id}")
        bw = np.array(self.bandwidth, dtype=np.float64, copy=True)
        if bw.shape != (n, n):
            raise UserError(f"bandwidth matrix must be {n}x{n}, got {bw.shape}")
        off = ~np.eye(n, dtype=bool)
        if np.any(~np.isfinite(bw[off])) or np.any(bw[off] < 0):
            raise UserError("bandwidth must be finite and non-negative (0 = no direct link)")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise UserError(f"message latency must be a finite number >= 0, got {self.latency_s}")
        bw[~off] = np.inf
        bw.flags.writeable = False
        object.__setattr__(self, "bandwidth", bw)
        eff = _widest_paths(bw)
        if np.any(eff[off] <= 0):
            i, j = np.argwhere((eff <= 0) & off)[0]
            raise UserError(f"topology is not connected: no path from device {i} to device {j}")
        eff.flags.writeable = False
        object.__setattr__(self, "effective", eff)
        # per-device arrays built once, read-only (planners read them 10^4 times on a 1024-GPU cluster)
        for name, values in (("_speeds", [d.speed for d in devices]), ("_memories", [d.memory_bytes for d in devices])):
            arr = np.array(values)
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)

    @property
    def size(self) -> int:
        return len(self.devices)

    @property
    def speeds(self) -> np.ndarray:
        """Relative speed per device (read-only)."""
        return self._speeds

    @property
    def memories(self) -> np.ndarray:
        """Bytes of memory per device (read-only)."""
        return self._memories

    def nodes(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for d in self.devices:
            out.setdefault(d.node, []).append(d.id)
        return out

    def link(self, src: int, dst: int) -> float:
        """Effective bytes/s from ``src`` to ``dst`` (inf for a device to itself)."""
        return float(self.effective[src, dst])

    def ring_bandwidth(self, group: Sequence[int]) -> float:
        """Slowest link of the ring through ``group`` in the given order (inf for one device)."""
        if len(group) < 2:
            return math.inf
        g = list(group)
        return float(min(self.effective[g[i], g[(i + 1) % len(g)]] for i in range(len(g))))

    def subset(self, ids: Sequence[int]) -> "Cluster":
        """The cluster restricted to ``ids``, renumbered 0..k-1 (used after losing devices)."""
        ids = list(ids)
        devs = tuple(Device(k, self.devices[i].node, self.devices[i].speed, self.devices[i].memory_bytes, self.devices[i].kind) for k, i in enumerate(ids))
        bw = np.array(self.bandwidth)[np.ix_(ids, ids)]
        np.fill_diagonal(bw, 0.0)
        return Cluster(devs, bw, self.latency_s)

    def with_speeds(self, speeds: Sequence[float]) -> "Cluster":
        devs = tuple(Device(d.id, d.node, float(s), d.memory_bytes, d.kind) for d, s in zip(self.devices, speeds))
        bw = np.array(self.bandwidth)
        np.fill_diagonal(bw, 0.0)
        return Cluster(devs, bw, self.latency_s)

    def with_bandwidth(self, bandwidth: np.ndarray) -> "Cluster":
        bw = np.array(bandwidth, dtype=np.float64)
        np.fill_diagonal(bw, 0.0)
        return Cluster(self.devices, bw, self.latency_s)

    def with_latency(self, latency_s: float) -> "Cluster":
        bw = np.array(self.bandwidth)
        np.fill_diagonal(bw, 0.0)
        return Cluster(self.devices, bw, latency_s)

    def to_dict(self) -> dict[str, Any]:
        bw = np.array(self.bandwidth)
        np.fill_diagonal(bw, 0.0)
        return {
            "format": "raypipe-cluster",
            "devices": [
                {"id": d.id, "node": d.node, "speed": d.speed, "memory_bytes": d.memory_bytes, "kind": d.kind}
                for d in self.devices
            ],
            "bandwidth_bytes_per_s": bw.tolist(),
            "message_latency_s": self.latency_s,
        }


def _widest_paths(bw: np.ndarray) -> np.ndarray:
    """All-pairs max-bottleneck path bandwidth (Floyd–Warshall on (max, min)), vectorized per pivot."""
    eff = bw.copy()
    for k in range(eff.shape[0]):
        eff = np.maximum(eff, np.minimum(eff[:, k : k + 1], eff[k : k + 1, :]))
    return eff


# ----- builders -----

def flat(num_devices: int, gbps: float, memory_bytes: float = DEFAULT_MEMORY, speeds: Iterable[float] | None = None) -> Cluster:
    """Every device on its own node, every pair linked at ``gbps``."""
    if not (gbps > 0 and math.isfinite(gbps)):
        raise UserError(f"bandwidth must be a positive number of Gb/s, got {gbps}")
    return two_level(num_devices, 1, gbps, gbps, memory_bytes, speeds)


def two_level(
    servers: int,
    gpus_per_server: int,
    intra_gbps: float,
    inter_gbps: float,
    memory_bytes: float = DEFAULT_MEMORY,
    speeds: Iterable[float] | None = None,
) -> Cluster:
    """``servers`` × ``gpus_per_server`` devices; fast links inside a server, slower between."""
    if servers < 1 or gpus_per_server < 1:
        raise UserError("need at least one server and one GPU per server")
    limits.devices(servers * gpus_per_server)
    for label, value in (("intra-server", intra_gbps), ("inter-server", inter_gbps)):
        if not (value > 0 and math.isfinite(value)):
            raise UserError(f"{label} bandwidth must be a positive number of Gb/s, got {value}")
    n = servers * gpus_per_server
    speed_list = list(speeds) if speeds is not None else [1.0] * n
    if len(speed_list) != n:
        raise UserError(f"got {len(speed_list)} speeds for {n} devices")
    node_of = np.arange(n) // gpus_per_server
    same = node_of[:, None] == node_of[None, :]
    bw = np.where(same, intra_gbps * GBPS, inter_gbps * GBPS).astype(np.float64)
    np.fill_diagonal(bw, 0.0)
    devs = tuple(Device(i, f"node{node_of[i]}", float(speed_list[i]), memory_bytes) for i in range(n))
    return Cluster(devs, bw)


def heterogeneous_servers(
    gpus_per_server: Sequence[int],
    intra_gbps: Sequence[float],
    inter_gbps: float | np.ndarray,
    memory_bytes: float = DEFAULT_MEMORY,
) -> Cluster:
    """Servers with their own GPU counts and intra-server bandwidths (SPP's trace-driven setting).

    ``inter_gbps`` is either one number or a servers × servers matrix of Gb/s.
    """
    limits.devices(sum(int(g) for g in gpus_per_server))
    node_of = np.repeat(np.arange(len(gpus_per_server)), gpus_per_server)
    n = len(node_of)
    inter = np.broadcast_to(np.asarray(inter_gbps, dtype=np.float64), (len(gpus_per_server),) * 2)
    bw = inter[node_of[:, None], node_of[None, :]] * GBPS
    intra = np.asarray(intra_gbps, dtype=np.float64)[node_of]
    same = node_of[:, None] == node_of[None, :]
    bw = np.where(same, intra[:, None] * GBPS, bw)
    np.fill_diagonal(bw, 0.0)
    devs = tuple(Device(i, f"node{node_of[i]}", 1.0, memory_bytes) for i in range(n))
    return Cluster(devs, bw)


def from_dict(data: Any, origin: str = "cluster") -> Cluster:
    """Our JSON spec: ``{"devices": [...], "bandwidth_bytes_per_s" | "bandwidth_gbps": [[...]]}``.

    Instead of a matrix, ``{"servers": S, "gpus_per_server": G, "intra_gbps": X, "inter_gbps": Y}``
    builds a two-level cluster.
    """
    if not isinstance(data, dict):
        raise UserError(f"{origin}: cluster spec must be a JSON object")
    kind = data.get("format")
    if kind is not None and kind != "raypipe-cluster":
        shown = f"a {kind} file" if isinstance(kind, str) and kind.startswith("raypipe-") else f"format {limits._show(kind)}"
        raise UserError(f"{origin}: is {shown}, not a cluster (\"format\": \"raypipe-cluster\")")
    try:
        limits.version(data, "", FORMAT_VERSIONS, default=1)
        limits.known_fields(data, TWO_LEVEL_FIELDS if "servers" in data else MATRIX_FIELDS, "")
        if "bandwidth_bytes_per_s" in data and "bandwidth_gbps" in data:
            raise UserError("give \"bandwidth_bytes_per_s\" or \"bandwidth_gbps\", not both")
        if "servers" in data:
            if "inter_gbps" not in data:
                raise UserError("a two-level spec needs \"inter_gbps\"")
            return two_level(
                limits.count(data["servers"], "two-level spec", "servers", maximum=limits.MAX_DEVICES),
                limits.count(data.get("gpus_per_server", 1), "two-level spec", "gpus_per_server", maximum=limits.MAX_DEVICES),
                limits.number(data.get("intra_gbps", data["inter_gbps"]), "two-level spec", "intra_gbps", positive=True),
                limits.number(data["inter_gbps"], "two-level spec", "inter_gbps", positive=True),
                limits.number(data.get("memory_bytes", DEFAULT_MEMORY), "two-level spec", "memory_bytes", positive=True, maximum=limits.MAX_BYTES),
            )
        raw = data.get("devices")
        if not isinstance(raw, list):
            raise UserError(f"\"devices\" must be a list of device objects, got {type(raw).__name__}")
        limits.devices(len(raw))
        devices = []
        for i, d in enumerate(raw):
            if not isinstance(d, dict):
                raise UserError(f"device {i} must be an object like {{\"speed\": 1.0}}, got {limits._show(d)}")
            limits.known_fields(d, DEVICE_FIELDS + REPORT_FIELDS, f"device {i}")
            if "device" in d and limits.count(d["device"], f"device {i}", "device", minimum=0) != i:
                raise UserError(f"device {i}: \"device\" is {d['device']}, not its position {i}")
            node: Any = d["node"] if "node" in d else d.get("node_id", f"node{i}")
            devices.append(Device(d.get("id", i), node, d.get("speed", 1.0), d.get("memory_bytes", DEFAULT_MEMORY), d.get("kind", "gpu")))
        key = "bandwidth_bytes_per_s" if "bandwidth_bytes_per_s" in data else "bandwidth_gbps"
        bw = _matrix(data.get(key), len(devices), key) * (1.0 if key == "bandwidth_bytes_per_s" else GBPS)
        latency = limits.number(data.get("message_latency_s", 0.0), "spec", "message_latency_s", maximum=3600.0)
        return Cluster(tuple(devices), bw, latency)
    except UserError as exc:
        raise UserError(f"{origin}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{origin}: malformed cluster spec ({type(exc).__name__}: {exc})") from None


def _matrix(rows: Any, n: int, key: str) -> np.ndarray:
    """An n×n list of lists of numbers, checked entry by entry (``true`` or ``"10"`` are not bandwidths)."""
    if not isinstance(rows, list) or len(rows) != n:
        raise UserError(f"\"{key}\" must be a {n}x{n} list of lists (one row per device)")
    out = np.zeros((n, n), dtype=np.float64)
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != n:
            raise UserError(f"\"{key}\" row {i} must be a list of {n} numbers")
        for j, value in enumerate(row):
            out[i, j] = 0.0 if i == j else limits.number(value, f"link {i}->{j}", key, maximum=limits.MAX_BYTES)
    return out


def load_cluster(path: str | Path) -> Cluster:
    p = Path(path)
    data = read_json(p, "cluster")
    return from_dict(data, origin=f"cluster {p}")


def from_ray(intra_gbps: float = 100.0, inter_gbps: float = 10.0, memory_bytes: float | None = None) -> Cluster:
    """The live Ray cluster: one device per GPU (or per node's CPU worker slot when there are no GPUs).

    Ray does not measure bandwidth, so links get the given nominal figures until the controller
    replaces them with observations.
    """
    import ray

    if not ray.is_initialized():
        where = os.environ.get("RAY_ADDRESS") or "local"
        ray.init(address=where, ignore_reinit_error=True, log_to_driver=False,
                 _system_config=LOCAL_SYSTEM_CONFIG if where == "local" else None)
    devices: list[Device] = []
    node_of: list[int] = []
    for k, node in enumerate(n for n in ray.nodes() if n.get("Alive")):
        res = node.get("Resources", {})
        gpus = int(res.get("GPU", 0))
        count = gpus if gpus > 0 else max(1, int(res.get("CPU", 1)))
        mem = memory_bytes or (float(res.get("memory", DEFAULT_MEMORY)) / max(count, 1))
        for _ in range(count):
            devices.append(Device(len(devices), node.get("NodeID", f"node{k}")[:12], 1.0, mem, "gpu" if gpus else "cpu"))
            node_of.append(k)
    arr = np.array(node_of)
    same = arr[:, None] == arr[None, :]
    bw = np.where(same, intra_gbps * GBPS, inter_gbps * GBPS).astype(np.float64)
    np.fill_diagonal(bw, 0.0)
    return Cluster(tuple(devices), bw)
