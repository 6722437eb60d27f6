"""Plans the job has run since the last confirmed change, judged by what they measured.

Why: the cost model predicts a plan from the profile's per-block times rescaled by each device's
believed speed. A device's speed is learned from the blocks it runs, so an error of the profile
on those blocks lands in the device's speed and moves with the device, not with the blocks. Two
identical devices that swap a cheap and an expensive stage then swap beliefs too, and the model
predicts the swap back as a gain — every time. Seen live (four identical actors, profile off by
15% between two stages): the controller swapped devices 0 and 2 back and forth on 13 iterations
in a row, each time predicting 4% gain (benchmarks/results/adaptive.md, live section). A plan the
job has already run under today's conditions needs no prediction: its iteration times are known.

So the controller keeps, for each layout it ran since the last confirmed change (speeds or
membership: the old measurements describe another world), the iteration times with the
machine-wide load factored out (the same residuals as the arbiter's noise floor), skipping each
layout's first iteration after a switch (a new plan's first iteration also does one-off work).
An option whose destination was measured, judged from a current plan that was measured too, is
predicted from the two measurements — pessimistically by one standard error of their
difference, so that a plan left behind has to be *clearly* better in measurement to be chosen
again (the arbiter's noise floor then applies on top, as for any option).

The same measurements check each move afterwards (:meth:`Tried.realized`): the controller
compares the gain it predicted with the gain the move delivered, and a model that missed by
``e`` is not trusted with predicted gains below about ``e`` next time (its noise floor).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from orchestrator.costmodel.estimate import Layout
from orchestrator.adapt.policies import Option


@dataclass(frozen=True)
class Tried:
    """Residual log iteration times per layout since the last confirmed change (oldest first)."""

    times: Mapping[Layout, tuple[float, ...]] = field(default_factory=dict)
    last: Layout | None = None
    """The layout of the previous completed iteration (its first iteration is not recorded)."""

    def record(self, layout: Layout, residual: float, window: int) -> "Tried":
        if layout != self.last:
            return replace(self, last=layout)
        times = dict(self.times)
        times[layout] = (times.get(layout, ()) + (residual,))[-window:]
        return Tried(times, layout)

    def forget(self) -> "Tried":
        """After a confirmed change: what was measured describes another world."""
        return Tried({}, self.last)

    def realized(self, before: Layout, after: Layout, samples: int = 3) -> tuple[float, float] | None:
        """The measured log change of the iteration time from ``before`` to ``after`` and its
        standard error in units of the residuals' noise (``None`` until ``after`` has ``samples``
        iterations and ``before`` at least one)."""
        old, new = self.times.get(before, ()), self.times.get(after, ())
        if not old or len(new) < samples:
            return None
        return statistics.fmean(new) - statistics.fmean(old), math.sqrt(1 / len(old) + 1 / len(new))

    def judge(self, current: Layout, current_s: float, options: Sequence[Option], noise: float) -> list[Option]:
        """``options`` with each measured destination's prediction replaced by the measurement
        (relative to the current plan's, on the model's scale ``current_s``), less one standard
        error (``noise``: the residuals' log standard deviation)."""
        now = self.times.get(current, ())
        if not now:
            return list(options)
        out = []
        for o in options:
            seen = self.times.get(Layout.of(o.steps[-1]), ()) if o.kind == "move" else ()
            if seen and Layout.of(o.steps[-1]) != current:
                diff = statistics.fmean(seen) - statistics.fmean(now) + noise * math.sqrt(1 / len(seen) + 1 / len(now))
                o = replace(o, predicted_s=current_s * math.exp(diff), label=f"{o.label}, measured")
            out.append(o)
        return out


@dataclass(frozen=True)
class Check:
    """A move made on the controller's own initiative, to be checked against what it delivered:
    from layout ``before`` to ``after``, predicted to change the iteration time by ``predicted``
    (log). Why: the model can be wrong in ways no noise estimate sees (see the module docstring);
    live, four identical devices were swapped on every iteration, each swap predicted at 4% and
    delivering nothing."""

    before: Layout
    after: Layout
    predicted: float

    def read(self, tried: Tried, noise: float) -> tuple[bool, float | None]:
        """(done, model error): not done until ``after`` has run a few iterations; then the miss
        between realized and predicted gain, read as one draw of the model's error
        (E|x| = σ·√(2/π)), capped at the predicted gain (a model that promised a gain g and
        delivered none is not trusted with gains up to g) — or ``None`` when the move measurably
        lost (``noise``: the residuals' log standard deviation): then the world changed under it
        (a change that arrives while the moved devices re-learn becomes their baseline unseen)
        or the move was wrong, and the measured times (:meth:`Tried.judge`) take the job back;
        neither reads as the model's error on the gains it predicts."""
        seen = tried.realized(self.before, self.after)
        if seen is None:
            return False, None
        realized, se = seen
        if realized > 2 * se * noise:
            return True, None
        return True, min(abs(realized - self.predicted), abs(self.predicted)) * math.sqrt(math.pi / 2)
