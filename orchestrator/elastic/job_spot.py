"""The spot side of :class:`~orchestrator.elastic.job_loop.ElasticJob` (the job as a
:class:`~orchestrator.elastic.job_view.JobView`).

- :func:`spot_decision`: the cloud module's migration planner asked between iterations (and on
  a preemption) over a :class:`PriceView` of the catalog; replayed price changes update it.
- :func:`relocate`: checkpoint → migration → restore, carrying out a migration that pays or a
  preemption that cannot be evacuated.
- :func:`simulated_throughputs`: this model's samples/s on each (GPU type, count) of a catalog,
  planned and simulated, which the migration planner ranks offers by.
- :func:`profile_model`: the model timed here, block by block (what the cost model, the
  controller and evacuation reason about).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from orchestrator.core.errors import UserError
from orchestrator.core.profile import Profile
from orchestrator.train.loop import every
from orchestrator.elastic.price_view import PriceView

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from cloud.migration import Migrate, MigrationSkipped
    from cloud.throughput import ThroughputTable
    from orchestrator.elastic.evacuation import Notice
    from orchestrator.elastic.job_config import TrainConfig
    from orchestrator.elastic.job_view import JobView


def build_price_view(job: "JobView", stamp_now: "datetime | None" = None) -> PriceView:
    """The job's view of the price catalog (it plans the model for every GPU type of the catalog, so the job
    builds it once, on first use: :meth:`~orchestrator.elastic.job_loop.ElasticJob.price_view`).

    Only the latest observation of each offer counts (an old cheap row of an offer that is
    expensive now never wins). ``stamp_now``: a rehearsal's price file is stamped as read at that
    time (``observed_at``) when the view is built, so replayed prices count as fresh.
    """
    from cloud.importers import load_any, load_snapshot
    from cloud.store import latest_rows, offer_of, with_fleets

    spot = job.spot
    offers = with_fleets(latest_rows(load_any(spot.catalog) if spot.catalog else load_snapshot()), job.scaling.devices)
    if stamp_now is not None:
        import pandas as pd

        offers = offers.assign(observed_at=pd.Timestamp(stamp_now))
    # a pipeline needs devices to spread over: targets with at least two GPUs (or the job's count)
    offers = offers[(offers.gpu_count >= min(2, job.scaling.devices)) & (offers.usd_per_hour > 0)].reset_index(drop=True)
    current = spot.offer
    if isinstance(current, str):  # a label (the supervisor's RAYPIPE_OFFER): the newest row of that offer
        label = current
        named = [o for o in (offer_of(r) for r in offers.to_dict("records")) if o.label() == label]
        if not named:
            raise UserError(f"SpotConfig.offer: no offer {label!r} in the price catalog")
        current = named[-1]
    if current is None:
        rows = offers[offers.spot & (offers.gpu_count == job.scaling.devices)].sort_values("usd_per_hour", kind="stable")
        if rows.empty:
            raise UserError(f"the price catalog has no spot offer with {job.scaling.devices} GPUs (one instance or a fleet) to start from")
        current = offer_of(rows.iloc[0])
    gpus = {(str(g), int(c)) for g, c in zip(offers.gpu_type, offers.gpu_count)}
    return PriceView(offers, current, simulated_throughputs(job.profile, gpus, job.train.num_microbatches))


def spot_decision(job: "JobView", step: int, preempted: bool = False, max_price_age_s: float | None = None,
                  now: "datetime | None" = None,
                  preemption_rates: "Mapping[tuple[str, str, str, int], float] | None" = None,
                  ) -> "Migrate | MigrationSkipped | None":
    """The migration planner between iterations (when due, or forced by a preemption): a
    :class:`cloud.migration.Migrate` that pays, else None. Replayed price changes apply first.

    With ``max_price_age_s``, an automatic (not ``preempted``) move resting on prices older than
    that at ``now`` (default: the wall clock) is not taken: a
    :class:`cloud.migration.MigrationSkipped` comes back instead, for the loop to record as
    ``migration_skipped`` (its ``reason``, ``age_s``) before training on. A forced move is never
    skipped (its offer is gone); the age is in its ``migration_decision`` event either way.

    ``preemption_rates``: preemptions per hour per (cloud, zone or region, GPU type, count), e.g.
    :meth:`cloud.availability.AvailabilityModel.rates` of the logs plus what this job observed; a
    spot target's expected cost then counts its preemptions (the availability-aware policy).
    """
    from datetime import timezone
    from datetime import datetime as _dt

    from cloud.migration import MigrationCosts, Migrate, check_fresh, plan_migration

    spot = job.spot
    changes = [f for at, f in spot.price_events if at == step]
    due = preempted or bool(changes) or every(spot.migration_check_every, step)
    if not due:
        return None
    view = job.price_view()
    cur = view.current
    for factor in changes:
        cur = view.reprice_current(factor)
        job.emit("price_change", step=step, offer=cur.label(), usd_per_hour=round(cur.usd_per_hour, 4), factor=factor)
    rows = float(job.train.data_fn(0)[0].shape[0])
    remaining = max(1.0, job.target_steps - step) * rows * spot.horizon_scale
    table = view.offers[~view.is_current()] if preempted else view.offers
    costs = MigrationCosts(checkpoint_gb=spot.checkpoint_gb, preemptions_per_hour=dict(preemption_rates or {}))
    decision = plan_migration(cur, table, view.throughputs, "job", remaining, costs)
    at = now or _dt.now(timezone.utc)
    age = cur.age_s(at)
    job.emit("migration_decision", step=step, forced=preempted, decision=type(decision).__name__, reason=decision.reason,
             prices_age_s=None if age is None else round(age, 1))
    if not isinstance(decision, Migrate):
        return None
    if max_price_age_s is not None and not preempted:
        return check_fresh(decision, cur, at, max_price_age_s)
    return decision


def relocate(job: "JobView", decision: "Migrate | None", forced: bool, reason: str, notice: "Notice | None" = None,
             iteration_s: float = 0.0) -> None:
    """Checkpoint, then leave this placement: the one path for preemptions that cannot be evacuated
    and for migrations that pay (``decision``: a :class:`cloud.migration.Migrate` or None).

    A job cannot move itself to another cluster: a supervised job (``RunConfig.cluster``) commits,
    records the request and stops (:class:`MigrationRequested`), and its supervisor provisions the
    target and resumes the run there. An unsupervised one records a migration that would pay and
    trains on; a placement it must leave it leaves for the survivors of this cluster (or the same
    devices afresh), from the checkpoint — event ``relocated``, never a pretended migration."""
    import time

    from orchestrator.adapt.policies import planner_plan

    runtime = job.runtime
    doomed = set(notice.devices) if notice is not None else set()
    survivors = sorted(job.alive - doomed)
    if not forced and not job.run.supervised:
        assert decision is not None, "an unforced relocation is a migration that pays"
        job.emit("migration_recommended", reason=reason, step=runtime.step, target=decision.target.label(),
                 detail=decision.reason + "; run under `orchestrator run` for the supervisor to carry it out")
        return
    t0 = time.perf_counter()
    before = runtime.step
    source: str | Any = None
    left = notice.deadline - job.clock() if notice is not None else float("inf")
    room = left >= job.checkpoint_s + job.spot.margin_s
    if room:
        source = job.checkpoint_now("preemption" if forced else "migration")
    if source is None:
        source = runtime.latest()
        job.emit("notice_too_short", seconds_left=round(left, 3), fallback=str(source) if source else "start")
    if forced and job.spot.enabled:
        from cloud.migration import Migrate

        found = spot_decision(job, runtime.step, preempted=True)  # a forced move is never skipped for stale prices
        decision = found if isinstance(found, Migrate) else None
    if job.run.supervised and (decision is not None or not survivors):
        target = decision.target.label() if decision is not None else job.price_view().current.label()
        job.request_migration(reason, target, getattr(decision, "reason", "this placement is going away"), commit=room)
    devices = tuple(survivors or range(job.growth.placed))  # this cluster: the survivors, or the same devices afresh
    job.emit("relocated", reason=reason, forced=forced, step=before, devices=list(devices),
             detail=("no supervisor to move the run to " + decision.target.label()) if decision is not None else "restart in place")
    plan = planner_plan(job.profile, job.cluster, devices, runtime.plan, job.scaling.planner, straight=job.scaling.straight)
    job.commit_pending()
    job.restart_on(plan, source, devices)
    resumed = runtime.step
    stall = time.perf_counter() - t0
    job.emit("resumed", step=resumed, lost_steps=before - resumed, plan=plan.describe(), checkpoint=str(source) if source else None)
    if notice is not None:
        job.emit("preemption_handled", mode="restart", reason=reason, lost_steps=before - resumed, stall_s=round(stall, 4),
                 iteration_s=round(iteration_s, 4), moves=[], step=resumed, plan=plan.describe())


# Training speed relative to a V100 (fp32/mixed, typical transformer training; public benchmark
# ratios, rounded). Used only where no measured profile for that GPU exists.
GPU_RELATIVE_SPEED = {"K80": 0.22, "P100": 0.6, "T4": 0.45, "V100": 1.0, "A10G": 0.85, "L4": 0.75,
                      "A100": 2.2, "A100-80GB": 2.4, "H100": 4.0}


def simulated_throughputs(profile: Profile, gpus: Iterable[tuple[str, int]], num_microbatches: int, model: str = "job",
                          intra_gbps: float = 100.0, planner: str = "pipedream") -> "ThroughputTable":
    """Samples/s of ``profile``'s model on each (GPU type, count), planned and simulated, not
    guessed, so the migration planner ranks offers for the job at hand."""
    from cloud.records import normalize_gpu
    from cloud.throughput import ThroughputTable
    from orchestrator.core.cluster import flat
    from orchestrator.planners.base import PlannerOptions, run_planner

    table: dict[tuple[str, str, int], float] = {}
    samples = profile.microbatch_size * num_microbatches
    for gpu, count in set(gpus):
        speed = GPU_RELATIVE_SPEED.get(normalize_gpu(gpu))
        if speed is None or count < 1:
            continue
        cluster = flat(count, intra_gbps, speeds=[speed] * count)
        result = run_planner(planner, profile, cluster, PlannerOptions(num_microbatches=num_microbatches, check_memory=False))
        table[(model, gpu, count)] = samples / result.iteration_time_s
    return ThroughputTable(table)


def profile_model(train: "TrainConfig", workers: int) -> Profile:
    """The model's blocks timed on one micro-batch here, as one of the job's ``workers`` CPU workers
    computes (the cost model rescales by observed speeds)."""
    from actors.job_spec import cpu_threads
    from orchestrator.adapt.live import profile_like_workers

    return profile_like_workers(train.model_factory, train.data_fn, train.num_microbatches, train.seed, cpu_threads(0, workers),
                                warmup=1, repeats=3)
