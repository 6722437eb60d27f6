"""The monitor: turn noisy per-iteration metrics into the cost model the controller plans on.

Observations update the model; the model drives decisions. Two kinds of quantities are tracked:

- **device speed**: the compute a device *should* have done this iteration at speed 1 (from the
  profile and the plan) divided by the compute seconds it reported. This is AutoPipe-Hu's rule:
  keep the per-block time ratios from profiling and rescale them by each worker's last observed
  speed — the profile is never edited, the cluster's speeds are.
- **link bandwidth**: bytes sent / send seconds on each directed link in use.

Each quantity is a :class:`Track`: an exponentially weighted mean in log space (noise is
multiplicative) and a *reference*, the value the model currently uses. The model changes only when
the smoothed value leaves the reference by more than ``enter`` for ``persist`` consecutive
iterations, each raw sample being out of band on the same side too (so one outlier that drags
the mean does not count twice); the pending count resets only once the smoothed value or a sample
comes back within ``exit`` — hysteresis, so a value hovering near the threshold cannot flap. On a confirmed change the
reference jumps to the mean of the last ``persist`` raw observations (the old history describes
the old world), and the smoothing restarts there. While nothing is pending, the level is then
refined to the median of every sample since it was set, so the model sharpens with time and a
"change" that was a burst of noise is walked back (reported as a change only beyond the band).

**The band follows the measured noise.** A fixed ``enter`` is right on a quiet machine and wrong
on a loaded one: four actors sharing two cores report speeds that swing by ±25% from one
iteration to the next (``tests/data/noise_traces``), so a 15% band confirms "changes" that are
only noise and the controller chases them. Each track therefore also estimates its own noise
from its recent raw samples — robustly, from the median absolute first difference, so that one
real step in the window hardly moves it — and the band is widened to ``noise_z`` standard
deviations of the *smoothed* value when that is wider than ``enter``. A real step of a factor of
two (0.69 in log) still clears the band while the noise is below about 0.35.

**Common mode is not a device's change.** Actors that share a machine's cores slow down and speed
up together whenever something else (another job, another engineer's build) takes the CPU: in
the recorded traces most of a device's per-iteration swing is shared by every device. The best
partition depends on the devices' speeds *relative to each other*; a load that scales them all
alike does not change it (only compute against communication, a second-order effect). So each
iteration's common mode — the median deviation of the observed devices from the model — goes
into one cluster-wide ``level`` track, and each device's track follows its speed relative to it
(a device's believed speed is ``exp(level + relative)``). The relative tracks are quieter, so
their bands are narrower and a real step of one device stands out sooner; a burst of load that
hits every device is no device's change; and when one device slows and the CPU it frees speeds
the others up, the slowed one carries the change. A change of the level updates the model (the
next decision uses it) but is not reported as a change.

A new track (a device's speed against its nominal prior, a link on first sight) first *learns*
its level: its reference is the median of its first five samples, so one noisy first sample does
not become the model. Links the job does not use are never observed. So a shared-network change (all inter-node links
go from 10 to 100 Gb/s) is not missed on unused links, each link class (intra-/inter-node) carries
the geometric-mean ratio of its observed links to nominal, applied to its unobserved links.

Everything here is a pure function of frozen values: ``observe(state, metrics, ...)`` returns a
new state and the list of changes, so a test can replay any metric sequence.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import Plan
from orchestrator.core.profile import Profile
from orchestrator.schedule.ir import unit_fraction, units_of
from orchestrator.adapt.handle import IterationMetrics, Link


@dataclass(frozen=True, kw_only=True)
class MonitorConfig:
    alpha: float = 0.5
    """EWMA weight of the newest observation (in log space)."""
    enter: float = 0.15
    """Relative deviation (as |log ratio|) of the smoothed value from the model that counts."""
    exit: float = 0.05
    """Deviation below which a pending change is forgotten (hysteresis: exit < enter)."""
    persist: int = 3
    """Consecutive out-of-band iterations needed to confirm a change."""
    persist_up: int = 5
    """The same for a rise (a device or link that got faster). The two mistakes do not cost the
    same: moving work off a device whose slowdown then ends loses a little balance, moving work
    onto a device whose speed-up then ends makes it the bottleneck. And on shared cores speed-ups
    are the transient kind: when another job's load drops, one actor may get a whole core for a
    few iterations (seen live: one of four actors 2.5x faster than the others for three
    iterations, then back), while a co-located job that slows a device stays for a while."""
    noise_z: float = 3.0
    """The band is at least this many standard deviations of the smoothed value's noise (0: off)."""
    noise_window: int = 24
    """Raw samples kept per track to estimate its noise and refine its level."""
    refine: bool = True
    """Refine a level with the samples since it was set (see the module docstring)."""
    common_mode: bool = True
    """Factor each iteration's common change of every observed device's speed (the median
    deviation: load that slows all actors of a shared machine alike) out of the device tracks
    into one cluster-wide level (see the module docstring)."""

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        if not 0 <= self.exit < self.enter:
            raise ValueError("need 0 <= exit < enter")
        if self.persist < 1 or self.persist_up < 1:
            raise ValueError("persist and persist_up must be >= 1")
        if self.noise_z < 0 or self.noise_window < max(self.persist, self.persist_up, 2):
            raise ValueError("noise_z must be >= 0 and noise_window >= max(persist, persist_up, 2)")

    def band(self, noise: float) -> float:
        """The change-detection threshold (log distance) for a track whose raw samples have
        log standard deviation ``noise``: ``enter``, or ``noise_z`` deviations of the EWMA."""
        return max(self.enter, self.noise_z * noise * math.sqrt(self.alpha / (2.0 - self.alpha)))


@dataclass(frozen=True, slots=True)
class Track:
    """One smoothed quantity; all values are natural logs."""

    ref: float
    smooth: float
    pending: int = 0
    recent: tuple[float, ...] = ()
    """The last ``noise_window`` raw observations, oldest first."""
    since: int = 0
    """Observations since the level was last set (learning or a confirmed change)."""
    reported: float | None = None
    """The level last reported as a change (``None``: ``ref``). Refinement moves ``ref`` a
    little at a time; a level that has drifted a band away from what was last reported is
    reported, so a change that arrives through refinement is not missed for arriving slowly."""

    silent: bool = False
    """Learning a new baseline without reporting it (see :func:`relearn`)."""

    @property
    def base(self) -> float:
        return self.ref if self.reported is None else self.reported

    def noise(self) -> float:
        return log_noise(self.recent)


LEARNING = 5
"""Samples a track needs before its noise is known and the band rule applies."""


def log_noise(logs: Sequence[float]) -> float:
    """Robust standard deviation of the noise on a series of log values: median |first difference|
    / (0.6745·√2), which one real step in the series hardly moves; 0 for fewer than five values
    (too few to tell noise from anything)."""
    if len(logs) < LEARNING:
        return 0.0
    diffs = sorted(abs(b - a) for a, b in zip(logs, logs[1:]))
    return diffs[len(diffs) // 2] / (0.6745 * math.sqrt(2.0))


def update_track(track: Track, value: float, cfg: MonitorConfig) -> tuple[Track, bool]:
    """Fold one raw observation in; returns the new track and whether a change was confirmed.

    The first samples of a track teach it its level: until it has seen ``LEARNING`` of them the
    reference is their median (one noisy first sample must not become the model, as it would by
    jumping to it) and a change is reported whenever that median moves by more than ``enter``."""
    return update_log(track, math.log(value), cfg)


def update_log(track: Track, lv: float, cfg: MonitorConfig) -> tuple[Track, bool]:
    """:func:`update_track` of an observation already in log space."""
    if len(track.recent) < LEARNING:
        recent = track.recent + (lv,)
        level = statistics.median(recent)
        changed = abs(level - track.base) > cfg.enter
        if track.silent:
            return Track(level, level, 0, recent, len(recent), level, True), False
        return Track(level, level, 0, recent, len(recent), level if changed else track.reported), changed
    smooth = (1 - cfg.alpha) * track.smooth + cfg.alpha * lv
    band = cfg.band(track.noise())  # the noise known before this sample: a step cannot widen its own band
    recent = (track.recent + (lv,))[-cfg.noise_window :]
    dev, raw = smooth - track.ref, lv - track.ref
    if abs(dev) > band and abs(raw) > band and dev * raw > 0:
        pending = track.pending + 1  # both the trend and this very sample are out of band
    elif abs(dev) < cfg.exit or abs(raw) < cfg.exit:
        pending = 0  # back near the model: forget
    else:
        pending = track.pending
    need = cfg.persist_up if dev > 0 else cfg.persist
    if pending >= need:
        last = recent[-need:]
        level = sum(last) / len(last)
        return Track(level, level, 0, recent, need, level), True
    since = track.since + 1
    if cfg.refine and pending == 0 and since > cfg.persist:
        # Refine the level with every sample since it was set (their median): a level confirmed
        # from ``persist`` noisy samples is only a first estimate, and a confirmed "change" that
        # was a burst of noise is walked back as the samples come in. Reported once the level is
        # a band away from the level last reported.
        level = statistics.median(recent[-min(since, len(recent)) :])
        changed = abs(level - track.base) > band
        return Track(level, smooth, 0, recent, since, level if changed else track.reported), changed
    return Track(track.ref, smooth, pending, recent, since, track.reported), False


@dataclass(frozen=True)
class Beliefs:
    """Beliefs after some iterations. Mappings are never mutated; updates build new ones."""

    speeds: Mapping[int, Track] = field(default_factory=dict)
    """Each device's log speed relative to ``level`` (its absolute log speed without common mode)."""
    links: Mapping[Link, Track] = field(default_factory=dict)
    alive: frozenset[int] = frozenset()
    level: Track = Track(0.0, 0.0)
    """The cluster-wide log-speed level: what load common to every device adds (nominal: 0)."""

    def speed(self, d: int) -> float:
        """Device ``d``'s believed speed (level and relative speed together)."""
        return math.exp(self.level.ref + self.speeds[d].ref)


@dataclass(frozen=True)
class Observation:
    state: Beliefs
    speed_changes: tuple[int, ...] = ()
    link_changes: tuple[Link, ...] = ()
    appeared: tuple[int, ...] = ()
    disappeared: tuple[int, ...] = ()
    common_log: float = 0.0
    """This iteration's cluster-wide log speed (the level plus its common deviation; 0 when not
    observed or ``common_mode`` is off): what the machine's load did to every device at once."""

    @property
    def model_changed(self) -> bool:
        return bool(self.speed_changes or self.link_changes)

    @property
    def membership_changed(self) -> bool:
        return bool(self.appeared or self.disappeared)


def initial_state(nominal: Cluster, alive: tuple[int, ...]) -> Beliefs:
    """Prior beliefs: the nominal speeds, no observed links."""
    speeds = {d: Track(math.log(nominal.devices[d].speed), math.log(nominal.devices[d].speed)) for d in range(nominal.size)}
    return Beliefs(speeds, {}, frozenset(alive))


def expected_compute(plan: Plan, profile: Profile) -> dict[int, float]:
    """Seconds of forward+backward each device of ``plan`` does per iteration at speed 1."""
    units = sum(unit_fraction(p) for _, p in units_of(plan))
    out: dict[int, float] = {}
    for s in plan.stages:
        per_dev = profile.compute_time(s.first, s.last) * units / s.replicas
        for d in s.devices:
            out[d] = out.get(d, 0.0) + per_dev
    return out


def observe(state: Beliefs, metrics: IterationMetrics, profile: Profile, alive: tuple[int, ...],
            cfg: MonitorConfig) -> Observation:
    """Fold one iteration's metrics and the current membership into the beliefs."""
    now = frozenset(alive)
    appeared = tuple(sorted(now - state.alive))
    disappeared = tuple(sorted(state.alive - now))
    if not metrics.completed:
        return Observation(replace(state, alive=now), appeared=appeared, disappeared=disappeared)
    speeds = dict(state.speeds)
    logs: dict[int, float] = {}
    for d, expect in expected_compute(metrics.plan, profile).items():
        seen = metrics.compute_s.get(d)
        if seen and seen > 0 and expect > 0:
            logs[d] = math.log(expect / seen)
    # This iteration's common mode: the median deviation of the observed devices from what the
    # model believes (one device's own step hardly moves the median of several).
    level = state.level
    deviation = {d: lv - level.ref - (speeds[d].ref if d in speeds else 0.0) for d, lv in logs.items()}
    common = statistics.median(deviation.values()) if cfg.common_mode and len(logs) >= 2 else 0.0
    if logs and cfg.common_mode:
        level, _ = update_log(level, level.ref + common, cfg)
    speed_changes = []
    for d, dev in deviation.items():
        track = speeds.get(d) or Track(0.0, 0.0)
        speeds[d], changed = update_log(track, track.ref + dev - common, cfg)
        if changed:
            speed_changes.append(d)
    links = dict(state.links)
    link_changes = []
    for link, nbytes in metrics.link_bytes.items():
        secs = metrics.link_s.get(link, 0.0)
        if nbytes <= 0 or secs <= 0:
            continue
        bw = nbytes / secs
        seen_track = links.get(link)
        if seen_track is None:
            # First sight of a link: adopt it (the nominal figure was only a guess).
            links[link] = Track(math.log(bw), math.log(bw), 0, (math.log(bw),))
            link_changes.append(link)
            continue
        links[link], changed = update_track(seen_track, bw, cfg)
        if changed:
            link_changes.append(link)
    new_state = Beliefs(speeds, links, now, level)
    common_log = state.level.ref + common if logs and cfg.common_mode else 0.0
    return Observation(new_state, tuple(speed_changes), tuple(link_changes), appeared, disappeared, common_log)


def relearn(state: Beliefs, devices: Sequence[int]) -> Beliefs:
    """The devices whose work a move changed learn their speed again, silently: what a device
    is observed to do depends a little on *which* blocks it runs (a block the profile times
    apart from how the runtime runs it — the model's first block computes no input gradient —
    its share of the links' traffic, on shared cores how busy its neighbours are), so its level
    after a move is a new baseline, not a change; reported as one it would start the next move,
    and the controller would chase its own moves. Their model speed is the median of their samples
    on the new work so far; the controller decides nothing on it until ``LEARNING`` samples are in
    (:func:`relearning`). Every link learns again the same way: what a link is observed to carry
    in what time depends on when its receiver gets to the data, which a move changes for the
    whole pipeline (live, a link between two devices the move did not touch was confirmed as
    changed two iterations after it, and a 2.5% phantom move followed)."""
    if not devices:
        return state
    speeds = dict(state.speeds)
    for d in devices:
        if d in speeds:
            speeds[d] = Track(speeds[d].ref, speeds[d].ref, silent=True)
    links = {k: Track(t.ref, t.ref, silent=True) for k, t in state.links.items()}
    return replace(state, speeds=speeds, links=links)


def settled_links(state: Beliefs) -> frozenset[Link]:
    """Links whose level is learned (past ``LEARNING`` samples, not re-learning): a change of one
    of these is a change of the world; a link's first samples only teach its level."""
    return frozenset(k for k, t in state.links.items() if len(t.recent) >= LEARNING and not t.silent)


def relearning(state: Beliefs, devices: Sequence[int]) -> tuple[int, ...]:
    """Those of ``devices`` still learning their speed on new work after a move (fewer than
    ``LEARNING`` samples since :func:`relearn`): their belief rests on one or two samples of
    blocks whose profile error it has not yet absorbed, so a decision on it would chase the move."""
    return tuple(d for d in devices if d in state.speeds and state.speeds[d].silent and len(state.speeds[d].recent) < LEARNING)


def speed_error(state: Beliefs, devices: Sequence[int]) -> float:
    """The largest standard error (log) of the believed relative speeds of ``devices``: a track's
    noise over the square root of the samples its level rests on. A level just learned or just
    confirmed from a few noisy samples is uncertain by about that much, so a plan's predicted
    gain smaller than this is a guess (the arbiter's noise floor takes it into account)."""
    out = 0.0
    for d in devices:
        track = state.speeds.get(d)
        if track is not None and len(track.recent) >= LEARNING:
            out = max(out, track.noise() / math.sqrt(max(1, min(track.since, len(track.recent)))))
    return out


def model_cluster(state: Beliefs, nominal: Cluster) -> Cluster:
    """The cluster the controller plans on: believed speeds and bandwidths, nominal ids.

    A device never timed (idle since it joined; one re-learning after a move keeps its belief) is believed as fast, relative to its nominal
    figure, as the timed devices are relative to theirs (the median ratio): the nominal figures
    share the profile's scale, which the timed devices already corrected — as for unused links."""
    timed = sorted(math.log(state.speed(d)) - math.log(nominal.devices[d].speed) for d, t in state.speeds.items() if t.recent or t.silent)
    prior = math.exp(statistics.median(timed)) if timed else 1.0
    speeds = [state.speed(d) if d in state.speeds and (state.speeds[d].recent or state.speeds[d].silent) else nominal.devices[d].speed * prior
              for d in range(nominal.size)]
    bw = np.array(nominal.bandwidth, dtype=np.float64)
    np.fill_diagonal(bw, 0.0)
    node = [dev.node for dev in nominal.devices]
    ratios: dict[bool, list[float]] = {True: [], False: []}
    for (a, b), track in state.links.items():
        nominal_bw = nominal.link(a, b)
        ratios[node[a] == node[b]].append(track.ref - math.log(nominal_bw))
    scale = {k: math.exp(sum(v) / len(v)) if v else 1.0 for k, v in ratios.items()}
    same = np.array([[node[a] == node[b] for b in range(nominal.size)] for a in range(nominal.size)])
    bw = np.where(same, bw * scale[True], bw * scale[False])
    for (a, b), track in state.links.items():
        bw[a, b] = math.exp(track.ref)
    np.fill_diagonal(bw, 0.0)
    return nominal.with_speeds(speeds).with_bandwidth(bw)
