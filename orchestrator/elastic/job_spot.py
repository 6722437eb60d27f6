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
        job.restart_on(new_plan, source, tuple(sorted(job.alive)))
        return RestartReport(time.perf_counter() - t0, before - job.trainer.step, new_plan)


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
        if isinstance(f, Kill) and f.at_iteration == k and f not in job.killed:
            stages = job.trainer.plan.stages
            device = stages[len(stages) // 2].devices[0] if f.device is None else f.device
            if device in job.trainer.plan.devices:
                job.killed.add(f)  # dies halfway through iteration k, like a crashed process
                group.call("arm_kill", k, devices=[device], what="arm kill")
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
    """What the migration planner sees: the offers (with replayed price changes applied), the
    offer the job runs on, and this model's simulated throughput on each (GPU type, count)."""

    offers: Any  # pandas.DataFrame
    current: Any  # cloud.records.Offer
    throughputs: Any  # cloud.throughput.ThroughputTable


def price_view(job: "JobState") -> PriceView:
    """Built on first use (it plans the model for every GPU type of the catalog)."""
    if job.prices is None:
        from cloud.importers import load_any, load_snapshot
        from cloud.records import Offer

        spot = job.spot
        offers = load_any(spot.catalog) if spot.catalog else load_snapshot()
        # a pipeline needs devices to spread over: targets with at least two GPUs (or the job's count)
        offers = offers[(offers.gpu_count >= min(2, job.scaling.devices)) & (offers.usd_per_hour > 0)].reset_index(drop=True)
        current = spot.offer
        if isinstance(current, str):  # a label (the supervisor's RAYPIPE_OFFER): the newest row of that offer
            label = current
            named = [Offer(str(r["cloud"]), str(r["region"]), str(r["zone"]), str(r["instance_type"]), str(r["gpu_type"]),
                           int(r["gpu_count"]), bool(r["spot"]), float(r["usd_per_hour"])) for r in offers.to_dict("records")]
            named = [o for o in named if o.label() == label]
            if not named:
                raise UserError(f"SpotConfig.offer: no offer {label!r} in the price catalog")
            current = named[-1]
        if current is None:
            rows = offers[offers.spot & (offers.gpu_count == job.scaling.devices)].sort_values("usd_per_hour")
            if rows.empty:
                raise UserError(f"the price catalog has no spot offer with {job.scaling.devices} GPUs to start from")
            r = rows.iloc[0]
            current = Offer(str(r.cloud), str(r.region), str(r.zone), str(r.instance_type), str(r.gpu_type),
                            int(r.gpu_count), True, float(r.usd_per_hour))
        gpus = {(str(g), int(c)) for g, c in zip(offers.gpu_type, offers.gpu_count)}
        job.prices = PriceView(offers, current, simulated_throughputs(job.profile, gpus, job.train.num_microbatches))
    return job.prices


def spot_decision(job: "JobState", step: int, preempted: bool = False) -> Any:
    """The migration planner between iterations (when due, or forced by a preemption): a
    :class:`cloud.migration.Migrate` that pays, else None. Replayed price changes apply first."""
    from cloud.migration import MigrationCosts, Migrate, plan_migration

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
    decision = plan_migration(cur, table, view.throughputs, "job", remaining, MigrationCosts(checkpoint_gb=spot.checkpoint_gb))
    job.emit("migration_decision", step=step, forced=preempted, decision=type(decision).__name__, reason=decision.reason)
    return decision if isinstance(decision, Migrate) else None


def relocate(job: "JobState", decision: Any, forced: bool, reason: str, notice: "Notice | None" = None,
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

    trainer = job.trainer
    doomed = set(notice.devices) if notice is not None else set()
    survivors = sorted(job.alive - doomed)
    if not forced and not job.run.supervised:
        job.emit("migration_recommended", reason=reason, step=trainer.step, target=decision.target.label(),
                 detail=decision.reason + "; run under `orchestrator run` for the supervisor to carry it out")
        return
    t0 = time.perf_counter()
    before = trainer.step
    source: str | Any = None
    left = notice.deadline - job.clock() if notice is not None else float("inf")
    room = left >= job.checkpoint_s + job.spot.margin_s
    if room:
        source = job.checkpoint_now("preemption" if forced else "migration")
    if source is None:
        source = trainer.latest()
        job.emit("notice_too_short", seconds_left=round(left, 3), fallback=str(source) if source else "start")
    if forced and job.spot.enabled:
        decision = spot_decision(job, trainer.step, preempted=True)
    if job.run.supervised and (decision is not None or not survivors):
        target = decision.target.label() if decision is not None else price_view(job).current.label()
        job.request_migration(reason, target, getattr(decision, "reason", "this placement is going away"), commit=room)
    devices = tuple(survivors or range(job.growth.placed))  # this cluster: the survivors, or the same devices afresh
    job.emit("relocated", reason=reason, forced=forced, step=before, devices=list(devices),
             detail=("no supervisor to move the run to " + decision.target.label()) if decision is not None else "restart in place")
    plan = planner_plan(job.profile, job.cluster, devices, trainer.plan, job.scaling.planner, straight=True)
    job.commit_pending()
    job.restart_on(plan, source, devices)
    resumed = trainer.step
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
