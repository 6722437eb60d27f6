"""Cost policies of thesis §6.4, as pure functions of (offers, throughputs, request) -> a decision.

``offers`` is a frame of current prices (``PriceStore.latest(at)``), so the same policy serves a
live refresh, a bundled snapshot or one instant of a historical replay. Single-job policies pick
one placement; the multi-job ones are linear programs (scipy ``linprog``/HiGHS) over
``x[j, m]`` = how many instances of offer ``m`` job ``j`` uses (fractional = time-shared).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import linprog

from .errors import CloudInputError

from .records import Offer
from .throughput import ThroughputTable, cost_normalized


@dataclass(frozen=True, slots=True)
class JobDemand:
    """A training job to place: ``samples`` of work for ``model`` (throughput table key)."""

    name: str
    model: str
    samples: float
    max_instances: float = 1.0

    def __post_init__(self) -> None:
        if self.samples <= 0 or self.max_instances <= 0:
            raise CloudInputError(f"job {self.name}: samples and max_instances must be positive")


@dataclass(frozen=True, slots=True)
class Placement:
    """One job on one offer: how long it takes and what it costs."""

    offer: Offer
    throughput: float
    hours: float
    cost_usd: float


@dataclass(frozen=True)
class Allocation:
    """LP result: ``x`` (jobs x offers) instances per job and offer, plus totals."""

    x: pd.DataFrame
    throughput: Mapping[str, float]
    usd_per_hour: float
    makespan_h: float | None = None

    @property
    def cost_usd(self) -> float | None:
        return None if self.makespan_h is None else self.usd_per_hour * self.makespan_h


def _to_offer(row: pd.Series) -> Offer:
    return Offer(str(row.cloud), str(row.region), str(row.zone), str(row.instance_type), str(row.gpu_type),
                 int(row.gpu_count), bool(row.spot), float(row.usd_per_hour))


def rank(offers: pd.DataFrame, throughputs: ThroughputTable, model: str) -> pd.DataFrame:
    """Offers by cost-normalized throughput (samples per dollar), best first."""
    ranked = cost_normalized(offers, throughputs, model)
    if ranked.empty:
        raise CloudInputError(f"no offer can run {model!r} (no throughput measured for any offered GPU)")
    return ranked


def cheapest(offers: pd.DataFrame, throughputs: ThroughputTable, job: JobDemand) -> Placement:
    """The placement with the most samples per dollar (the thesis' first policy)."""
    best = rank(offers, throughputs, job.model).iloc[0]
    hours = job.samples / best.throughput / 3600.0
    return Placement(_to_offer(best), float(best.throughput), float(hours), float(hours * best.usd_per_hour))


def min_cost_with_deadline(
    offers: pd.DataFrame, throughputs: ThroughputTable, job: JobDemand, deadline_h: float
) -> Placement:
    """Cheapest single placement that finishes within ``deadline_h``."""
    ranked = rank(offers, throughputs, job.model)
    hours = job.samples / ranked.throughput / 3600.0
    fits = ranked[hours <= deadline_h]
    if fits.empty:
        raise CloudInputError(f"job {job.name}: no offer finishes within {deadline_h:g} h (fastest needs {hours.min():.1f} h)")
    cost = hours[fits.index] * fits.usd_per_hour
    pick = int(np.argmin(cost.to_numpy()))
    best = fits.iloc[pick]
    return Placement(_to_offer(best), float(best.throughput), float(hours[fits.index[pick]]), float(cost.iloc[pick]))


def min_makespan_within_budget(
    offers: pd.DataFrame, throughputs: ThroughputTable, jobs: Sequence[JobDemand], budget_usd: float,
    quotas: Mapping[str, float] | None = None, tolerance_h: float = 0.05,
) -> Allocation:
    """Smallest makespan whose min-cost allocation fits ``budget_usd`` (binary search on the makespan).

    Feasibility is monotone: a longer makespan lowers every job's required rate, so the min-cost
    LP only gets cheaper. Each probe is one :func:`min_cost_allocation` LP.
    """
    if budget_usd <= 0:
        raise CloudInputError("budget must be positive")

    def probe(makespan_h: float) -> Allocation | None:
        rates = {j.name: j.samples / (makespan_h * 3600.0) for j in jobs}
        try:
            alloc = min_cost_allocation(offers, throughputs, jobs, rates, quotas)
        except CloudInputError:
            return None
        return alloc if alloc.usd_per_hour * makespan_h <= budget_usd else None

    hi = 1.0
    while probe(hi) is None:
        hi *= 2
        if hi > 1e6:
            raise CloudInputError(f"no allocation finishes within budget ${budget_usd:g}")
    lo = 0.0
    while hi - lo > tolerance_h:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if probe(mid) is not None else (mid, hi)
    found = probe(hi)
    assert found is not None
    return Allocation(found.x, found.throughput, found.usd_per_hour, hi)


def _lp_setup(
    offers: pd.DataFrame, throughputs: ThroughputTable, jobs: Sequence[JobDemand]
) -> tuple[pd.DataFrame, np.ndarray]:
    usable = offers[(offers.gpu_count > 0) & (offers.usd_per_hour > 0)].reset_index(drop=True)
    tput = np.vstack([throughputs.column(j.model, usable.gpu_type, usable.gpu_count) for j in jobs])
    return usable, tput


def _quota_rows(usable: pd.DataFrame, n_jobs: int, quotas: Mapping[str, float] | None) -> tuple[list[np.ndarray], list[float]]:
    """GPU quotas keyed by cloud (``aws``), region (``aws/us-east-1``) or GPU type (``V100``)."""
    rows, bounds = [], []
    for key, limit in (quotas or {}).items():
        region_key = usable.cloud + "/" + usable.region
        member = ((usable.cloud == key) | (region_key == key) | (usable.gpu_type == key)).to_numpy()
        if not member.any():
            raise CloudInputError(f"quota {key!r} matches no offer")
        rows.append(np.tile(member * usable.gpu_count.to_numpy(float), n_jobs))
        bounds.append(float(limit))
    return rows, bounds


def max_throughput_allocation(
    offers: pd.DataFrame, throughputs: ThroughputTable, jobs: Sequence[JobDemand],
    quotas: Mapping[str, float] | None = None, budget_usd_per_hour: float | None = None,
) -> Allocation:
    """Maximize the sum of each job's throughput normalized by its best single-offer throughput,
    under GPU quotas, an hourly budget and each job's ``max_instances``."""
    usable, tput = _lp_setup(offers, throughputs, jobs)
    n_j, n_m = tput.shape
    best = tput.max(axis=1, keepdims=True)
    if (best <= 0).any():
        raise CloudInputError("a job has no offer it can run on")
    c = -(tput / best).ravel()
    a_ub, b_ub = _quota_rows(usable, n_j, quotas)
    for j, job in enumerate(jobs):
        row = np.zeros(n_j * n_m)
        row[j * n_m:(j + 1) * n_m] = (tput[j] > 0).astype(float)
        a_ub.append(row)
        b_ub.append(job.max_instances)
    if budget_usd_per_hour is not None:
        a_ub.append(np.tile(usable.usd_per_hour.to_numpy(float), n_j))
        b_ub.append(budget_usd_per_hour)
    bounds = [(0, None if t > 0 else 0) for t in tput.ravel()]
    res = linprog(c, A_ub=np.vstack(a_ub), b_ub=b_ub, bounds=bounds, method="highs")
    if res.status != 0:
        raise CloudInputError(f"throughput LP failed: {res.message}")
    return _allocation(res.x, usable, tput, jobs)


def min_cost_allocation(
    offers: pd.DataFrame, throughputs: ThroughputTable, jobs: Sequence[JobDemand],
    required: Mapping[str, float], quotas: Mapping[str, float] | None = None,
) -> Allocation:
    """Minimize $/h so that job ``j`` gets at least ``required[j]`` samples/s, under quotas."""
    usable, tput = _lp_setup(offers, throughputs, jobs)
    n_j, n_m = tput.shape
    c = np.tile(usable.usd_per_hour.to_numpy(float), n_j)
    a_ub, b_ub = _quota_rows(usable, n_j, quotas)
    for j, job in enumerate(jobs):
        need = np.zeros(n_j * n_m)
        need[j * n_m:(j + 1) * n_m] = -tput[j]
        a_ub.append(need)
        b_ub.append(-float(required[job.name]))
        cap = np.zeros(n_j * n_m)
        cap[j * n_m:(j + 1) * n_m] = 1.0
        a_ub.append(cap)
        b_ub.append(job.max_instances)
    res = linprog(c, A_ub=np.vstack(a_ub), b_ub=b_ub, bounds=(0, None), method="highs")
    if res.status != 0:
        raise CloudInputError(f"min-cost LP infeasible: {res.message}")
    return _allocation(res.x, usable, tput, jobs)


def _allocation(x: np.ndarray, usable: pd.DataFrame, tput: np.ndarray, jobs: Sequence[JobDemand]) -> Allocation:
    mat = x.reshape(len(jobs), len(usable))
    mat[mat < 1e-9] = 0.0
    labels = [f"{r['cloud']}/{r['zone'] or r['region']}/{r['instance_type']}/{r['gpu_count']}x{r['gpu_type']}/"
              f"{'spot' if r['spot'] else 'od'}" for r in usable.to_dict("records")]
    frame = pd.DataFrame(mat, index=[j.name for j in jobs], columns=labels)
    rates = {j.name: float(mat[i] @ tput[i]) for i, j in enumerate(jobs)}
    return Allocation(frame, rates, float((mat * usable.usd_per_hour.to_numpy(float)).sum()))
