"""``make demo``: the whole story on this machine, one chapter per capability.

Chapter 1 (planning): profile a small real transformer here, plan it for a simulated 8-GPU,
2-server cluster with every planner, print the comparison and write the timelines.
Later chapters (training on Ray, adaptive moves, spot migration) run when their parts exist.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from actors.reference import ReferenceTrainer, max_difference
from cloud.importers import load_snapshot
from cloud.migration import MigrationCosts
from cloud.records import Offer, is_estimate
from orchestrator.cluster import flat
from orchestrator.elastic import ModelSpec, TrainerSession, local_launcher, plan_for, simulated_throughputs, snapshot_policy
from orchestrator.job import JobConfig, JobManager, Placement
from orchestrator.controller.controller import ControllerConfig
from orchestrator.controller.faults import FaultSchedule, Slowdown
from orchestrator.launch import LaunchTarget
from orchestrator.live import RayPipeline, run_adaptive
from orchestrator.models import example_batch, loss_fn, tiny_transformer
from orchestrator.plan import straight_plan
from orchestrator.observability import EventLog, RayMetrics, plot_throughput
from orchestrator.simulator import simulate

from orchestrator.cluster import Cluster, two_level
from orchestrator.errors import UserError
from orchestrator.planners.base import PlannerOptions, PlanResult, available, run_planner
from orchestrator.profile import Profile
from orchestrator.timeline import spans_from_events, write_chrome_trace, write_gantt_png

DEMO_MODEL = {"n_layers": 8, "d_model": 128, "n_heads": 4, "seq_len": 64, "vocab": 256, "sub_layer_blocks": True}


def _banner(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def profile_demo_model(microbatch_size: int = 8) -> Profile:
    from orchestrator.profiler import profile_example

    torch.set_num_threads(1)  # small kernels: one thread times stably on a shared machine
    return profile_example("tiny_transformer", microbatch_size, model_kwargs=DEMO_MODEL, warmup=2, repeats=5)


def compare_planners(profile: Profile, cluster: Cluster, microbatches: int) -> list[PlanResult]:
    results: list[PlanResult] = []
    options = PlannerOptions(num_microbatches=microbatches)
    print(f"{'planner':<12}{'stages':>7}{'iter ms':>10}{'÷ bound':>9}{'bubble':>8}{'plan ms':>9}  plan")
    for name in available():
        try:
            r = run_planner(name, profile, cluster, options)
        except UserError as exc:
            print(f"{name:<12}  skipped: {exc}")
            continue
        results.append(r)
        bubble = sum(r.sim.bubble_fraction.values()) / max(1, len(r.sim.bubble_fraction))
        print(
            f"{name:<12}{len(r.plan.stages):>7}{r.iteration_time_s * 1e3:>10.3f}"
            f"{r.iteration_time_s / r.lower_bound_s:>9.3f}{bubble:>8.2f}{r.planning_time_s * 1e3:>9.2f}  {r.plan.describe()}"
        )
    return results


def chapter_planning(out: Path) -> PlanResult:
    _banner("1. profile a real model here, plan it for 8 GPUs on 2 servers")
    t0 = time.perf_counter()
    profile = profile_demo_model()
    profile.save(out / "profile.json")
    print(
        f"profiled {profile.name}: {profile.num_blocks} blocks (attention/FFN sub-layers), "
        f"{profile.total_compute_s * 1e3:.2f} ms fwd+bwd per micro-batch of {profile.microbatch_size} "
        f"on {profile.source.removeprefix('profiled on ')} in {time.perf_counter() - t0:.1f} s"
    )
    # A simulated cluster: two servers of 4 GPUs, NVLink-class inside, 10 Gb/s between.
    cluster = two_level(2, 4, intra_gbps=100.0, inter_gbps=10.0, memory_bytes=16 * 2**30)
    results = compare_planners(profile, cluster, microbatches=16)
    best = min(results, key=lambda r: r.iteration_time_s)
    spans = spans_from_events(best.sim.events)
    write_chrome_trace(spans, out / "simulated_timeline.json", f"simulated {best.algorithm}")
    write_gantt_png(spans, out / "simulated_timeline.png", f"simulated: {best.algorithm} {best.plan.describe()}")
    print(f"best: {best.algorithm}; timeline -> {out / 'simulated_timeline.json'} (open in ui.perfetto.dev) and .png")
    return best


def demo_model(microbatches: int = 8, rows: int = 64) -> ModelSpec:
    """The demo's model and data, as picklable factories every actor rebuilds identically."""
    kw = {k: v for k, v in DEMO_MODEL.items() if k != "sub_layer_blocks"}
    return ModelSpec(
        partial(tiny_transformer, sub_layer_blocks=True, **kw),  # type: ignore[arg-type]
        loss_fn("tiny_transformer"),
        # SGD with momentum: float32 pipelined == single-process to allclose. (Adam divides by
        # sqrt(v); on parameters whose true gradient is zero it amplifies summation-order noise.)
        partial(torch.optim.SGD, lr=0.05, momentum=0.9),
        partial(example_batch, "tiny_transformer", rows, **kw),
        num_microbatches=microbatches,
    )


def chapter_training(out: Path, profile: Profile, model: ModelSpec, healthy: int, slowed: int) -> tuple[TrainerSession, Any]:
    """4 stage actors train; at iteration ``healthy`` device 1 slows 2x and the controller reacts."""
    _banner("2. train on 4 stage actors on the local Ray instance")
    cluster = flat(4, 100.0)
    plan = plan_for(profile, cluster, model.num_microbatches, planner="pipedream")
    session = TrainerSession(model, plan, None, start=False)
    print(f"plan: {plan.describe()}")
    pipe = RayPipeline(session.trainer, cluster, FaultSchedule(), profile)
    run = run_adaptive(pipe, ControllerConfig(straight=True), healthy + slowed, [Slowdown(1, 2.0, healthy)])
    tput = run.samples_per_s
    losses = [session.trainer.history[s] for s in sorted(session.trainer.history)]
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; {statistics.median(tput[1:healthy]):.0f} samples/s while healthy")

    _banner(f"3. device 1 slows 2x at iteration {healthy}: the controller moves blocks between two workers")
    for e in run.events:
        if e.kind != "decision" or "switch" in e.detail:
            print(f"  step {e.step:>3} {e.kind:<10} {e.detail}" + (f" ({e.seconds * 1e3:.0f} ms)" if e.seconds else ""))
    moves = [i for i, r in enumerate(run.records) if r.action in ("move", "path-move")]
    first_move = next((i for i in moves if i >= healthy), None)
    during = tput[healthy:first_move + 1] if first_move is not None else tput[healthy:]
    after = tput[first_move + 1:] if first_move is not None else []
    print(f"throughput: before {statistics.median(tput[1:healthy]):.0f}, slowed {statistics.median(during):.0f}, "
          f"after the move {statistics.median(after) if after else float('nan'):.0f} samples/s; plan now {run.plans[-1]}")
    print("  (4 actors share 2 CPU cores here: the injected slowdown sleeps, which frees CPU for the other stages,\n"
          "   so 'slowed' understates what a slow GPU does to a one-GPU-per-stage pipeline)")
    plot_throughput(list(range(len(tput))), tput, [(e.step, e.kind) for e in run.events if e.kind in ("slowdown", "move", "path-move")],
                    out / "throughput.png", "throughput with a 2x slowdown and the controller's move")
    fit = session.trainer.fit(1)
    fit.write_timeline(out / "measured_timeline.json")
    sim = simulate(session.trainer.plan, profile, cluster)
    write_chrome_trace(spans_from_events(sim.events), out / "predicted_timeline.json", "simulated")
    print(f"throughput plot -> {out / 'throughput.png'}; measured timeline -> {out / 'measured_timeline.json'} "
          f"beside the predicted one ({fit.mean_iteration_s * 1e3:.0f} ms measured vs {sim.iteration_s * 1e3:.0f} ms predicted)")
    return session, run


def chapter_preemption(out: Path, profile: Profile, model: ModelSpec, session: TrainerSession, more_steps: int) -> dict[str, Any]:
    _banner("4. spot preemption notice -> checkpoint -> migration decision -> restart on 3 stages")
    offers = load_snapshot()
    # The job's constraint: at least 4 GPUs of V100 class or better (memory for the stages).
    offers = offers[(offers.gpu_count >= 4) & offers.gpu_type.isin(["V100", "A100", "A100-80GB", "H100"])]
    start = offers[(offers.gpu_type == "V100") & offers.spot & (offers.gpu_count == 4)].sort_values("usd_per_hour").iloc[0]
    current = Offer(str(start.cloud), str(start.region), str(start.zone), str(start.instance_type), "V100", 4, True, float(start.usd_per_hour))
    gpus = sorted({(str(g), int(c)) for g, c in zip(offers.gpu_type, offers.gpu_count)})
    table = simulated_throughputs(profile, gpus, model.num_microbatches)
    samples_per_step = float(model.data_fn(0)[0].shape[0])
    policy = snapshot_policy(offers, table, "job", total_samples=5e8, samples_per_step=samples_per_step,
                             costs=MigrationCosts(checkpoint_gb=0.01))

    def factory(placement: Placement, resume: Path | None) -> TrainerSession:
        assert placement.cluster is not None
        plan = plan_for(profile, placement.cluster, model.num_microbatches)
        return TrainerSession(model, plan, resume)

    total = session.step + more_steps
    config = JobConfig(name="demo", total_steps=total, checkpoint_dir=out / "checkpoints", checkpoint_every=0)
    events = EventLog(out / "events.jsonl")
    # The local machine stands in for the target cloud; it "gets" 3 GPUs of the 4 asked for.
    manager = JobManager(config, Placement(LaunchTarget("local"), 4, current, flat(4, 100.0)), factory,
                         local_launcher(capacity=3), policy, events, metrics=RayMetrics("demo"))
    estimated = " (an estimated spot price: the bundled snapshot has no observed one)" if is_estimate(str(start.source)) else ""
    print(f"running on {current.label()} at ${current.usd_per_hour:.3f}/h{estimated}; a 2-minute notice arrives at step {session.step}")
    manager.notify_preemption(manager.clock() + 120.0, "injected AWS-style 2-minute notice")
    report = manager.run(session=session)
    for e in report.events:
        if e["event"] in ("preemption_notice", "checkpoint", "migration_decision", "target_up", "resumed"):
            detail = {k: v for k, v in e.items() if k not in ("ts", "event", "state", "cost_usd")}
            print(f"  {e['event']:<20} {json.dumps(detail)[:150]}")
    return {"report": report, "events": out / "events.jsonl", "current": current}


def check_exactness(model: ModelSpec, checkpoint: Path, steps: int) -> float:
    """Max |Δ| between the job's final weights and uninterrupted single-process training."""
    reference = ReferenceTrainer(model.model_factory, model.loss_fn, model.optimizer_factory, model.data_fn, model.num_microbatches, seed=model.seed)
    reference.train(steps)
    final = TrainerSession(model, straight_plan([0, len(reference.blocks)], model.num_microbatches), checkpoint)
    try:
        return max_difference(final.trainer.state_dicts(), reference.state_dicts())
    finally:
        final.close()


def run_demo(out: Path) -> int:
    import ray

    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # a re-run must not resume from an old run
    t0 = time.perf_counter()
    chapter_planning(out)
    profile = Profile.from_dict(json.loads((out / "profile.json").read_text()))
    model = demo_model()
    profile = Profile(profile.name, profile.blocks, profile.microbatch_size, profile.input_bytes, profile.source)
    ray.init(ignore_reinit_error=True, log_to_driver=False, include_dashboard=False, num_cpus=4)
    try:
        session, _ = chapter_training(out, profile, model, healthy=8, slowed=12)
        story = chapter_preemption(out, profile, model, session, more_steps=6)
        report = story["report"]
        _banner("summary")
        final_ckpt = latest_checkpoint(out / "checkpoints")
        diff = check_exactness(model, final_ckpt, report.steps)
        resumed = next(e for e in report.events if e["event"] == "resumed")
        print(f"steps {report.steps}; placements: {' -> '.join(report.placements)}; migrations {report.migrations}; "
              f"lost steps {resumed['lost_steps']}; cost ${report.cost_usd:.4f} for {report.wall_s:.1f} s")
        print(f"final weights vs uninterrupted single-process training: max |diff| = {diff:.2e} "
              f"({'allclose: exact' if diff < 1e-6 else 'NOT EXACT'})")
        print(f"events -> {story['events']}")
    finally:
        ray.shutdown()
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f} s; outputs in {out}/")
    return 0


def latest_checkpoint(root: Path) -> Path:
    from actors import checkpoint as ckpt

    found = ckpt.latest(root)
    if found is None:
        raise UserError(f"no complete checkpoint under {root}")
    return found
