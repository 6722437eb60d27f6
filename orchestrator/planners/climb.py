"""The structures one move away from a plan's: what ``auto`` climbs through where it cannot walk them all.

``auto`` walks every structure of an instance when the space (one structure per device-symmetry
class, :mod:`exhaustive`) is small enough. When every device differs — measured speeds and
per-link bandwidths make every GPU unique — 10 blocks on 8 devices already list 1.1·10^8 structures
and the walk is skipped; the literature planners' answers were then up to 15% slower than the
optimum (issue 28). Hill-climbing from the best timed plans closes that gap: each round offers the
structures one move away from the best plan not yet climbed from, and ``auto`` times them with the
same bounds as everything else.

The moves on a straight structure are the controller's two-worker moves (:mod:`moves`: shift a
cut, swap two groups, move a replica, grow onto an idle device, merge, fuse, split) plus the
*exchange* of two devices (a device of one group for an idle one or one of another group), which
is two moves for the controller but one step here: it lets a slow device leave a heavy stage
without changing any group's size. They are ranked by the cost model's estimate
(:class:`CostModel`, the same one the controller ranks by, vectorized over all O(L²) of them) and
only the ``width`` best distinct ones are kept and timed, which bounds a round's timing at any
block count.

On an interleaved structure (``p`` device groups, ``p·v`` chunks) the moves are: shift one chunk
cut by a block, swap two groups, exchange two devices; they are ranked by ``rank`` (``auto``'s
cheapest bound), since the cost model only knows straight pipelines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from orchestrator.core.cluster import Cluster
from orchestrator.core.plan import Stage
from orchestrator.core.profile import Profile
from orchestrator.costmodel.estimate import CostModel, Layout
from orchestrator.planners.moves import Candidates

Structure = tuple[Stage, ...]


def _exchanges(groups: Sequence[tuple[int, ...]], num_devices: int) -> list[list[tuple[int, ...]]]:
    """Every group list with one device of a group exchanged for an idle device or one of a later group."""
    used = {d for g in groups for d in g}
    idle = [d for d in range(num_devices) if d not in used]
    out = []
    for i, g in enumerate(groups):
        for d in g:
            kept = tuple(x for x in g if x != d)
            for e in idle:
                gg = list(groups)
                gg[i] = kept + (e,)
                out.append(gg)
            for j in range(i + 1, len(groups)):
                for e in groups[j]:
                    gg = list(groups)
                    gg[i], gg[j] = kept + (e,), tuple(x for x in groups[j] if x != e) + (d,)
                    out.append(gg)
    return out


class Neighbours:
    """``neighbours(stages)``: at most ``width`` structures one move from ``stages``, best-ranked first."""

    def __init__(self, profile: Profile, cluster: Cluster, num_microbatches: int, straight: bool, max_stages: int, width: int,
                 rank: Callable[[Structure], float]) -> None:
        self.model = CostModel(profile, cluster, num_microbatches, check_memory=False)
        self.n, self.straight, self.max_stages, self.width, self.rank = cluster.size, straight, max_stages, width, rank
        self.considered = 0  # neighbours ranked so far (what the caller's budget counts)

    def __call__(self, stages: Structure) -> list[Structure]:
        groups = list(dict.fromkeys(s.devices for s in stages))
        if len(groups) < len(stages):
            return self._interleaved(stages, groups)
        lay = Layout(tuple(s.first for s in stages) + (stages[-1].last,), tuple(groups))
        cands = Candidates(lay, range(self.n), self.straight, self.model)
        swaps = [Layout(lay.cuts, tuple(gg)) for gg in _exchanges(groups, self.n)]
        self.considered += len(cands) + len(swaps)
        times = np.concatenate([cands.estimate()[0] if len(cands) else np.zeros(0), self.model.estimate(swaps).time_s if swaps else np.zeros(0)])
        out: list[Structure] = []
        for k in np.argsort(times, kind="stable"):  # only the best-ranked become objects
            m = cands.move(int(k)).layout if k < len(cands) else swaps[int(k) - len(cands)]
            if len(m.groups) <= self.max_stages:
                st = tuple(Stage(m.cuts[i], m.cuts[i + 1], tuple(sorted(g))) for i, g in enumerate(m.groups))
                if st not in out:  # an exchange of two one-device groups is also a swap
                    out.append(st)
                    if len(out) == self.width:
                        break
        return out

    def _interleaved(self, stages: Structure, groups: list[tuple[int, ...]]) -> list[Structure]:
        p = len(groups)
        cuts = [s.first for s in stages] + [stages[-1].last]
        options: list[tuple[list[int], list[tuple[int, ...]]]] = []
        for i in range(1, len(cuts) - 1):
            for c in (cuts[i] - 1, cuts[i] + 1):
                if cuts[i - 1] < c < cuts[i + 1]:
                    options.append((cuts[:i] + [c] + cuts[i + 1:], groups))
        for i in range(p):
            for j in range(i + 1, p):
                gg = list(groups)
                gg[i], gg[j] = groups[j], groups[i]
                options.append((cuts, gg))
        options += [(cuts, gg) for gg in _exchanges(groups, self.n)]
        out = list(dict.fromkeys(tuple(Stage(cc[k], cc[k + 1], tuple(sorted(gg[k % p]))) for k in range(len(cc) - 1)) for cc, gg in options))
        self.considered += len(out)
        return sorted(out, key=self.rank)[: self.width]
