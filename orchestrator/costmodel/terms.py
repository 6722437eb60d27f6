"""The cost terms, written once: every model of time and memory in the project is built on these.

The simulator (the one interpreter of the lowered schedule), its group-level mode, the planners'
fast scorers and dynamic programs, the controller's vectorized estimate and the price of a live
move all call these functions instead of writing a formula again, so a change of the cost model is
one edit here and every consumer agrees (tests check that the fast scorers reproduce the
simulator). Each term takes plain numbers or numpy arrays — the same function, elementwise — so a
dynamic program over thousands of candidates and a per-action interpreter share one definition.
The argument order of every product is fixed here, so scalar and vectorized calls round alike.

Nothing here knows a :class:`~orchestrator.core.plan.Plan` or a schedule order: only the quantities
(seconds of work, bytes, bandwidths, counts) a term depends on, and, at the end, the same terms
between device groups of a :class:`~orchestrator.core.cluster.Cluster` (replicas split a micro-batch's
rows, so a boundary's messages run per overlapping replica pair and the slowest pair decides).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence, TypeVar, Union, overload

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import ScheduleKind

Num = Union[float, np.ndarray]
N = TypeVar("N", float, np.ndarray)

DEFAULT_STATE_FACTOR = 4.0
"""Memory per parameter byte held by a training stage: weights, gradients and two Adam moments."""

SHIPPED_STATE_FACTOR = 3.0
"""Bytes shipped per parameter byte when a block changes owner: weights + two Adam moments.
Gradients are not shipped: moves happen between iterations, after the optimizer step."""


# ----- time -----------------------------------------------------------------------------------
def compute_time(work_s: N, speed: Num, replicas: Num = 1.0) -> N:
    """Seconds of ``work_s`` (profiled at speed 1) on ``replicas`` devices of relative ``speed``
    that split the rows of every unit: a stage is paced by its slowest replica."""
    return work_s / (speed * replicas)  # type: ignore[return-value]


def transfer_time(nbytes: N, seconds_per_byte: Num, latency_s: float = 0.0) -> N:
    """One point-to-point message: per-message latency plus bytes at ``seconds_per_byte`` (the
    inverse of a link's bandwidth, or a replicated boundary's slowest pair share, see
    :func:`pair_costs`)."""
    return latency_s + nbytes * seconds_per_byte  # type: ignore[return-value]


@overload
def all_reduce_time(replicas: int, nbytes: float, ring_bandwidth: float) -> float: ...
@overload
def all_reduce_time(replicas: Num, nbytes: Num, ring_bandwidth: Num) -> Num: ...
def all_reduce_time(replicas: Num, nbytes: Num, ring_bandwidth: Num) -> Num:
    """Ring all-reduce of ``nbytes`` over ``replicas`` devices: 2(k−1)/k · bytes / the ring's
    slowest link; 0 for one replica. Arrays broadcast; where the bandwidth is NaN (no such
    group) the result is NaN for k > 1, and 0 for k = 1."""
    if not isinstance(replicas, np.ndarray) and not isinstance(nbytes, np.ndarray) and not isinstance(ring_bandwidth, np.ndarray):
        k = float(replicas)  # type: ignore[arg-type]
        return 0.0 if k < 2 else 2.0 * (k - 1) / k * nbytes / ring_bandwidth  # type: ignore[operator]
    k_arr = np.asarray(replicas, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(k_arr > 1, 2.0 * (k_arr - 1) / k_arr, 0.0) * nbytes
        if out.shape == np.broadcast_shapes(out.shape, np.shape(ring_bandwidth)):
            out /= ring_bandwidth  # in place: the planners' tables can be large
        else:
            out = out / ring_bandwidth
    return out


def shipped_bytes(param_bytes: N, factor: float = SHIPPED_STATE_FACTOR) -> N:
    """Bytes a block's new owner receives when it moves (weights and optimizer state)."""
    return param_bytes * factor  # type: ignore[return-value]


# ----- memory ---------------------------------------------------------------------------------
def in_flight(schedule: ScheduleKind, stage: N, num_stages: int, num_units: int) -> N:
    """Units whose activations stage ``stage`` of a straight ``num_stages``-stage pipeline holds
    at its peak: GPipe all of them; 1F1B ``S − s`` (its warm-up); ZB-H1 up to ``S`` on every stage
    (activations live until the deferred weight pass). Interleaved plans are not straight: their
    peak is the simulator's."""
    if schedule is ScheduleKind.GPIPE:
        return np.full(np.shape(stage), num_units) if isinstance(stage, np.ndarray) else num_units  # type: ignore[return-value]
    if schedule is ScheduleKind.ZB_H1:
        full = min(num_stages, num_units)
        return np.full(np.shape(stage), full) if isinstance(stage, np.ndarray) else full  # type: ignore[return-value]
    return np.minimum(num_stages - stage, num_units)  # type: ignore[return-value]


def static_bytes(param_bytes: N, state_factor: float = DEFAULT_STATE_FACTOR) -> N:
    """What a stage holds whatever the schedule: its weights, gradients and optimizer state."""
    return param_bytes * state_factor  # type: ignore[return-value]


def stash_bytes(per_unit_bytes: N, units: Num, replicas: Num = 1.0) -> N:
    """Activations one replica keeps for ``units`` units in flight (replicas split the rows)."""
    return units * per_unit_bytes / replicas  # type: ignore[return-value]


def stage_memory(param_bytes: N, per_unit_stash: N, units: Num, replicas: Num = 1.0, state_factor: float = DEFAULT_STATE_FACTOR) -> N:
    """Peak bytes on one replica of a stage: static state plus the stash of ``units`` in flight."""
    return static_bytes(param_bytes, state_factor) + stash_bytes(per_unit_stash, units, replicas)  # type: ignore[return-value]


def fits_memory(need_bytes: N, capacity_bytes: Num) -> N:
    """Whether a peak fits a device (the one comparison; arrays give a boolean array)."""
    return need_bytes <= capacity_bytes  # type: ignore[return-value]


# ----- between device groups of a cluster -------------------------------------------------------
@lru_cache(maxsize=4096)
def row_shares(ra: int, rb: int) -> np.ndarray:
    """[ra, rb] fraction of a micro-batch's rows replica a of one stage hands replica b of the next."""
    # ir.overlap of ir.row_share ranges, vectorized (same float operations, same values)
    a = np.arange(ra + 1) / ra
    b = np.arange(rb + 1) / rb
    out = np.maximum(0.0, np.minimum(a[1:, None], b[None, 1:]) - np.maximum(a[:-1, None], b[None, :-1]))
    out[out <= 1e-12] = 0.0
    out.flags.writeable = False
    return out


def pair_costs(cluster: Cluster, src: Sequence[int], dst: Sequence[int]) -> np.ndarray:
    """[len(src), len(dst)] seconds per boundary byte of each replica pair (0 where rows do not
    overlap, and between a device and itself: no message)."""
    links = cluster.effective[np.asarray(src, dtype=np.intp)[:, None], np.asarray(dst, dtype=np.intp)[None, :]]  # np.ix_'s rows, a third of its cost
    return row_shares(len(src), len(dst)) / links


@dataclass(frozen=True)
class PairStats:
    """What the group mode and the bounds need of one directed boundary between device groups."""

    top: float  # slowest replica pair, seconds per byte (0: no message at all)
    first: float  # the cheapest receiver's slowest incoming pair (-1: some receiver gets no message)
    uniform: bool  # every receiver's slowest incoming pair is the boundary's slowest


@lru_cache(maxsize=8192)
def pair_stats(cluster: Cluster, src: tuple[int, ...], dst: tuple[int, ...]) -> PairStats:
    """Cached per (cluster, groups): planners score many structures over the same groups."""
    c = pair_costs(cluster, src, dst)
    per_recv = c.max(axis=0)
    top = float(per_recv.max())
    first = float(per_recv.min()) if bool(np.all(per_recv > 0)) else -1.0
    return PairStats(top, first, bool(np.all(per_recv >= top * (1 - 1e-12))))


def seconds_per_byte(cluster: Cluster, src: Sequence[int], dst: Sequence[int]) -> float:
    """Seconds per boundary byte between two device groups: replicas exchange overlapping row
    shares in parallel on their own links, so the slowest pair decides (0 without groups)."""
    if not src or not dst:
        return 0.0
    return float(np.max(pair_costs(cluster, src, dst)))  # pair_stats(...).top, without its other statistics


def boundary_time(cluster: Cluster, src: Sequence[int], dst: Sequence[int], nbytes: float) -> float:
    """One unit's message across a boundary between device groups (:func:`transfer_time` at the
    slowest pair's rate; the simulator sends a message per overlapping pair, even an empty one)."""
    if not src or not dst:
        return 0.0
    return transfer_time(nbytes, seconds_per_byte(cluster, src, dst), cluster.latency_s)


@lru_cache(maxsize=8192)
def _ring(cluster: Cluster, group: tuple[int, ...]) -> float:
    return cluster.ring_bandwidth(group)


def group_all_reduce(cluster: Cluster, group: Sequence[int], param_bytes: float) -> float:
    """Ring all-reduce of a stage's gradients over its replicas (:func:`all_reduce_time` on the
    group's ring, the bandwidth cached per group)."""
    if len(group) < 2:
        return 0.0
    return all_reduce_time(len(group), param_bytes, _ring(cluster, tuple(group)))
