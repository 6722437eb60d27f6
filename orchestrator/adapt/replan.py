"""Full re-plans for the controller's slow path and restart option, computed once per detected
change and, where possible, ahead of time in a background thread.

Why beside the controller and not in it: the controller is a state machine that decides what to
do between iterations; *how* a re-plan is cached, reused across models that differ only within
the monitor's resolution, and computed while the next iteration runs is bookkeeping it should not
carry. :class:`Replanner` keeps that bookkeeping, and its answers are a pure function of what
is asked (the same as calling :func:`full_replan`): only where the time is spent changes.

- The *raw* answer is the planner's (e.g. PipeDream's DP); for a speed-agnostic planner it is
  reused across speed-only changes. The *polished* answer adds the walk of two-worker moves on the
  believed model (:func:`polish_plan`) and is reused while every speed and bandwidth stays within
  ``reuse_tol`` (log distance) of the model it was computed on.
- :meth:`Replanner.prepare` starts the raw answer for a newly believed model in the background
  (stale, not yet started jobs are dropped); a decision that needs it waits only for what is left.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence, TypeVar

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import Plan
from orchestrator.core.profile import Profile
from orchestrator.adapt.policies import SPEED_AGNOSTIC_PLANNERS, planner_plan, polish_plan
from orchestrator.adapt.simcache import SimCache

_Key = tuple[object, ...]
_KEEP = 8  # entries kept per cache, most recent first


class Replanner:
    def __init__(self, profile: Profile, algorithm: str, reuse_tol: float, sims: SimCache) -> None:
        self.profile, self.algorithm, self.reuse_tol, self._sims = profile, algorithm, reuse_tol, sims
        self._polished: list[tuple[_Key, _ModelSig, Plan]] = []
        self._raw: list[tuple[_Key, _ModelSig, Plan | Future[Plan]]] = []  # raw ones may be running
        self._pool: ThreadPoolExecutor | None = None

    def replan(self, model: Cluster, alive: tuple[int, ...], plan: Plan, straight: bool) -> Plan:
        """The polished full re-plan of ``model`` on ``alive`` (``plan`` gives M and the schedule)."""
        key, sig = self._key(alive, plan, straight), _ModelSig.of(model)
        target = _lookup(self._polished, key, sig, self.reuse_tol)
        if target is None:
            raw = self._raw_plan(key, self._raw_sig(sig), model, alive, plan, straight)
            target = polish_plan(raw, self.profile, model, alive, straight, lambda p: self._sims.iteration_s(p, model))
            self._polished = [(key, sig, target)] + self._polished[: _KEEP - 1]
        return target

    def prepare(self, model: Cluster, alive: tuple[int, ...], plan: Plan, straights: Sequence[bool], background: bool) -> None:
        """Make sure a raw answer for each ``straight`` flag exists or is being computed — now, or
        (``background``) in the planning thread so that it runs while the next iteration does."""
        if not alive:
            return
        sig = self._raw_sig(_ModelSig.of(model))
        for straight in straights:
            key = self._key(alive, plan, straight)
            if not background:
                self._raw_plan(key, sig, model, alive, plan, straight)
                continue
            found = _lookup(self._raw, key, sig, self.reuse_tol)
            if found is not None and not (isinstance(found, Future) and found.cancelled()):
                continue
            # jobs for older models that have not started yet are stale: drop them
            self._raw = [(k, s, v) for k, s, v in self._raw if not (isinstance(v, Future) and (v.cancelled() or v.cancel()))]
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replan-ahead")
            fut = self._pool.submit(planner_plan, self.profile, model, alive, plan, self.algorithm, straight)
            self._raw = [(key, sig, fut)] + self._raw[: _KEEP - 1]

    def close(self) -> None:
        """Stop the background thread (pending work is dropped)."""
        for _, _, value in self._raw:
            if isinstance(value, Future):
                value.cancel()
        self._raw = [(k, s, v) for k, s, v in self._raw if not isinstance(v, Future)]
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    @property
    def raw_answers(self) -> int:
        """Raw answers cached or under way (for tests and logs)."""
        return len(self._raw)

    def _key(self, alive: tuple[int, ...], plan: Plan, straight: bool) -> _Key:
        return (self.algorithm, straight, tuple(sorted(alive)), plan.num_microbatches, plan.schedule)

    def _raw_sig(self, sig: "_ModelSig") -> "_ModelSig":
        return sig.without_speeds() if self.algorithm in SPEED_AGNOSTIC_PLANNERS else sig

    def _raw_plan(self, key: _Key, sig: "_ModelSig", model: Cluster, alive: tuple[int, ...], plan: Plan, straight: bool) -> Plan:
        for k, (key_k, sig_k, value) in enumerate(self._raw):
            if key_k == key and sig_k.close(sig, self.reuse_tol) and not (isinstance(value, Future) and value.cancelled()):
                if isinstance(value, Future):
                    value = value.result()  # started by prepare(background=True): wait for what is left
                self._raw.pop(k)
                self._raw.insert(0, (key_k, sig_k, value))
                return value
        raw = planner_plan(self.profile, model, alive, plan, self.algorithm, straight)
        self._raw = [(key, sig, raw)] + self._raw[: _KEEP - 1]
        return raw


_T = TypeVar("_T")


def _lookup(entries: list[tuple[_Key, "_ModelSig", _T]], key: _Key, sig: "_ModelSig", tol: float) -> _T | None:
    """The most recent entry for ``key`` whose model is within ``tol`` of ``sig`` (moved to the front)."""
    for k, (key_k, sig_k, value) in enumerate(entries):
        if key_k == key and sig_k.close(sig, tol):
            entries.insert(0, entries.pop(k))
            return value
    return None


@dataclass(frozen=True)
class _ModelSig:
    """A believed cluster as what full re-planning reads: log speeds and log bandwidths (compared
    with a tolerance) and the rest (topology, memory, latency; compared exactly)."""

    log_speeds: tuple[float, ...]
    log_bandwidth: tuple[float, ...]  # off-diagonal links; -inf where there is none
    exact: tuple[object, ...]

    @classmethod
    def of(cls, c: Cluster) -> "_ModelSig":
        n = c.size
        bw = [float(c.bandwidth[a, b]) for a in range(n) for b in range(n) if a != b]
        return cls(tuple(math.log(d.speed) for d in c.devices), tuple(math.log(x) if x > 0 else -math.inf for x in bw),
                   (tuple((d.id, d.node, d.memory_bytes, d.kind) for d in c.devices), c.latency_s))

    def without_speeds(self) -> "_ModelSig":
        return _ModelSig((), self.log_bandwidth, self.exact)

    def close(self, other: "_ModelSig", tol: float) -> bool:
        if self.exact != other.exact:
            return False
        pairs = zip(self.log_speeds + self.log_bandwidth, other.log_speeds + other.log_bandwidth)
        return all(a == b or abs(a - b) <= tol for a, b in pairs)
