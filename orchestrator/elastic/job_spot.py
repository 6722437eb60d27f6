"""The glue between :class:`~orchestrator.elastic.job_loop.ElasticJob` and its policies (the job as a
:class:`~orchestrator.elastic.job_state.JobState`).

- :class:`JobHandle`: the controller's :class:`~orchestrator.adapt.handle.PipelineHandle`
  over the job. The job's loop runs the iterations; ``run_iteration`` hands the controller the
  metrics of the iteration the loop just finished (so the controller is a policy stepped between
  iterations, not a second loop), and ``apply_move`` is the job's live move.
- :func:`push_faults`: rehearsal slowdowns and link delays, as knobs on the workers.
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

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable

from actors.metrics import MeasuredIteration
from orchestrator.core.cluster import GBPS, Cluster
from orchestrator.adapt.faults import Kill, Slowdown, Throttle
from orchestrator.adapt.handle import IterationMetrics, MoveReport, RestartReport
from orchestrator.core.errors import UserError
from orchestrator.core.plan import Plan
from orchestrator.core.profile import Profile

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from cloud.migration import Migrate, MigrationSkipped
    from cloud.records import Offer
    from cloud.throughput import ThroughputTable
    from orchestrator.elastic.evacuation import Notice
    from orchestrator.elastic.job_config import TrainConfig
    from orchestrator.elastic.job_state import JobState


class JobHandle:
    """See the module docstring; mirrors :class:`orchestrator.adapt.live.RayPipeline` call for call."""

    def __init__(self, job: "JobState") -> None:
        self.job = job
        self._staged: MeasuredIteration | None = None

    def stage(self, m: MeasuredIteration) -> None:
        self._staged = m

    def current_plan(self) -> Plan:
        return self.job.trainer.plan

    def nominal_cluster(self) -> Cluster:
        return self.job.cluster

    def alive_devices(self) -> tuple[int, ...]:
        return tuple(sorted(self.job.alive))

    def run_iteration(self) -> IterationMetrics:
        from orchestrator.adapt.live import to_controller_metrics

        assert self._staged is not None, "the job's loop stages each iteration's metrics first"
        m, self._staged = self._staged, None
        return to_controller_metrics(m, self.job.trainer.step - 1, self.current_plan())

    def apply_move(self, new_plan: Plan) -> MoveReport:
        return self.job.move(new_plan)

    def restart(self, new_plan: Plan, from_checkpoint: bool) -> RestartReport:
        import time

        job = self.job
        before = job.trainer.step
        t0 = time.perf_counter()  # the downtime counts the planned checkpoint's write
        source = job.checkpoint_now("planned restart") if not from_checkpoint else job.trainer.latest()
        resumed = job.trainer.restart_on(new_plan, source, members=sorted(job.alive), slots=job.slot_map())
        job.restarts += 1
        return RestartReport(time.perf_counter() - t0, before - resumed, new_plan)


def push_faults(job: "JobState", k: int) -> None:
    """Send each plan device its slowdown factor and outgoing link delays for iteration ``k``
    (on change only), and arm the kills of iteration ``k``. Rehearsal only: CPU workers sleep,
    GPU workers refuse slowdowns."""
    faults = job.adapt.faults.faults
    if not faults:
        return
    factor: dict[int, float] = {}
    delays: dict[int, dict[int, float]] = {}
    group = job.trainer.group
    assert group is not None
    for f in faults:
        if isinstance(f, Kill) and f.at_iteration == k and f not in job.killed and f.device in job.trainer.plan.devices:
            job.killed.add(f)  # dies halfway through iteration k, like a crashed process
            group.call("arm_kill", k, devices=[f.device], what="arm kill")
        elif isinstance(f, Slowdown) and f.active(k):
            factor[f.device] = factor.get(f.device, 1.0) * f.factor
        elif isinstance(f, Throttle) and f.active(k):
            for s, d in [(f.src, f.dst)] + ([(f.dst, f.src)] if f.symmetric else []):
                if f.delay_per_byte is not None:
                    delays.setdefault(s, {})[d] = f.delay_per_byte
                else:
                    assert f.gbps is not None
                    delays.setdefault(s, {})[d] = max(0.0, 1.0 / (f.gbps * GBPS) - 1.0 / job.cluster.link(s, d))
    knobs = job.knobs
    for d in job.trainer.plan.devices:
        want = (factor.get(d, 1.0), tuple(sorted(delays.get(d, {}).items())))
        if knobs.get(d) != want:
            group.call("set_faults", want[0], dict(want[1]), devices=[d], what="set faults")
            knobs[d] = want


@dataclass
class PriceView:
    """What the migration planner sees: the latest price of every offer (replayed price changes
    applied), the offer the job runs on (with the ``observed_at`` of its price: ``current.as_event()``
    is what ``job_started`` records as ``offer``), and this model's simulated throughput on each
    (GPU type, count)."""

    offers: Any  # pandas.DataFrame: one row per offer (``cloud.store.latest_rows``)
    current: "Offer"
    throughputs: "ThroughputTable"

    def age_s(self, now: "datetime") -> float | None:
        """Age of the current offer's price at ``now`` (None: unknown)."""
        return self.current.age_s(now)


def price_view(job: "JobState", stamp_now: "datetime | None" = None) -> PriceView:
    """Built on first use (it plans the model for every GPU type of the catalog).

    Only the latest observation of each offer counts (an old cheap row of an offer that is
    expensive now never wins). ``stamp_now``: a rehearsal's price file is stamped as read at that
    time (``observed_at``) when the view is built, so replayed prices count as fresh.
    """
    if job.prices is None:
        from cloud.importers import load_any, load_snapshot
        from cloud.records import Offer  # noqa: F401 - main's offer-by-label branch builds Offers (see offer_of)
        from cloud.store import latest_rows, offer_of

        spot = job.spot
        offers = latest_rows(load_any(spot.catalog) if spot.catalog else load_snapshot())
        if stamp_now is not None:
            import pandas as pd

            offers = offers.assign(observed_at=pd.Timestamp(stamp_now))
        # a pipeline needs devices to spread over: targets with at least two GPUs (or the job's count)
        offers = offers[(offers.gpu_count >= min(2, job.scaling.devices)) & (offers.usd_per_hour > 0)].reset_index(drop=True)
        current = spot.offer
        if current is None:
            rows = offers[offers.spot & (offers.gpu_count == job.scaling.devices)].sort_values("usd_per_hour", kind="stable")
            if rows.empty:
                raise UserError(f"the price catalog has no spot offer with {job.scaling.devices} GPUs to start from")
            current = offer_of(rows.iloc[0])
        gpus = {(str(g), int(c)) for g, c in zip(offers.gpu_type, offers.gpu_count)}
        job.prices = PriceView(offers, current, simulated_throughputs(job.profile, gpus, job.train.num_microbatches))
    view: PriceView = job.prices
    return view


def spot_decision(job: "JobState", step: int, preempted: bool = False, max_price_age_s: float | None = None,
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
    due = preempted or bool(changes) or bool(spot.migration_check_every and step % spot.migration_check_every == 0)
    if not due:
        return None
    view = price_view(job)
    cur = view.current
    same = (view.offers.cloud == cur.cloud) & (view.offers.region == cur.region) & (view.offers.zone == cur.zone) \
        & (view.offers.instance_type == cur.instance_type) & (view.offers.spot == cur.spot)
    for factor in changes:
        view.offers.loc[same, "usd_per_hour"] *= factor
        view.current = cur = replace(cur, usd_per_hour=cur.usd_per_hour * factor)
        job.emit("price_change", step=step, offer=cur.label(), usd_per_hour=round(cur.usd_per_hour, 4), factor=factor)
    rows = float(job.train.data_fn(0)[0].shape[0])
    remaining = max(1.0, job.target_steps - step) * rows * spot.horizon_scale
    table = view.offers[~same] if preempted else view.offers
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


def relocate(job: "JobState", decision: Any, forced: bool, reason: str, notice: "Notice | None" = None,
         iteration_s: float = 0.0) -> None:
    """Checkpoint → migration → restore: the one path for preemptions that cannot be evacuated
    and for migrations that pay (``decision``: a :class:`cloud.migration.Migrate` or None)."""
    import time

    from orchestrator.adapt.policies import planner_plan

    trainer = job.trainer
    t0 = time.perf_counter()
    before = trainer.step
    source: str | Any = None
    left = notice.deadline - job.clock() if notice is not None else float("inf")
    if left >= job.checkpoint_s + job.spot.margin_s:
        source = job.checkpoint_now("preemption" if forced else "migration")
    if source is None:
        source = trainer.latest()
        job.emit("notice_too_short", seconds_left=round(left, 3), fallback=str(source) if source else "start")
    doomed = set(notice.devices) if notice is not None else set()
    if forced and job.spot.enabled:
        decision = spot_decision(job, trainer.step, preempted=True)
    survivors = sorted(job.alive - doomed)
    if decision is not None:  # a new placement: its devices, as many as the job's slots allow
        devices = tuple(range(min(decision.target.gpu_count, job.growth.placed)))
        job.prices.current = decision.target
        if job.spot.cloud_yaml:
            write_target_yaml(job, decision.target)
    else:  # nowhere better: continue on the survivors, or re-acquire the same kind of place
        devices = tuple(survivors or range(job.growth.placed))
    job.emit("migration", reason=reason, forced=forced, step=before, devices=list(devices),
             detail=getattr(decision, "reason", "restart in place"),
             target=decision.target.label() if decision is not None else "same placement")
    plan = planner_plan(job.profile, job.cluster, devices, trainer.plan, job.scaling.planner, straight=True)
    trainer.finish_checkpoint()
    job.alive, job.leaving = set(devices), None
    resumed = trainer.restart_on(plan, source, members=sorted(devices), slots=job.slot_map())
    job.restarts += 1
    job.iteration_s.clear()
    stall = time.perf_counter() - t0
    job.emit("resumed", step=resumed, lost_steps=before - resumed, plan=plan.describe(), checkpoint=str(source) if source else None)
    if notice is not None:
        job.emit("preemption_handled", mode="restart", reason=reason, lost_steps=before - resumed, stall_s=round(stall, 4),
                 iteration_s=round(iteration_s, 4), moves=[], step=resumed, plan=plan.describe())



def write_target_yaml(job: "JobState", offer: Any) -> None:
    """The validated Ray cluster YAML of a migration target (``ray up`` only with ``ray_up``)."""
    from pathlib import Path
    from typing import cast

    from orchestrator.elastic.launch import Cloud, ClusterSpec, ray_up, write_cluster_yaml

    assert job.spot.cloud_yaml is not None
    spec = ClusterSpec(cloud=cast(Cloud, offer.cloud), region=offer.region, zone=offer.zone or None, instance_type=offer.instance_type,
                       spot=offer.spot, gpu_type=offer.gpu_type, gpus_per_node=offer.gpu_count, project_id="my-project")
    path = write_cluster_yaml(spec, Path(job.spot.cloud_yaml) / f"{offer.cloud}-{offer.region}-{offer.instance_type}.yaml")
    ray_up(path, dry_run=not job.spot.ray_up)
    job.emit("target_yaml", target=offer.label(), devices=spec.total_gpus, directory=job.spot.cloud_yaml)


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


def profile_model(train: "TrainConfig") -> Profile:
    """The model's blocks timed on one micro-batch here (the cost model rescales by observed speeds)."""
    import torch

    from actors import user_code
    from orchestrator.profiling.profiler import profile_blocks

    torch.manual_seed(train.seed)
    blocks = user_code.blocks(train.model_factory)
    inputs, _ = user_code.batch(train.data_fn, 0)
    sample = torch.tensor_split(inputs, train.num_microbatches)[0]
    return profile_blocks(blocks, sample, "job", int(sample.shape[0]), warmup=1, repeats=3, device="cpu")
