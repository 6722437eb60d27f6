"""``make demo``: the whole story on this machine.

Chapter 1 (planning): profile a small real transformer here, plan it for a simulated 8-GPU,
2-server cluster with every planner, print the comparison and write the timelines.
Chapter 2 (one elastic job, :class:`~orchestrator.elastic.job_loop.ElasticJob`): 4 stage actors train
while a 2x slowdown makes the controller move blocks live, a preemption notice on one device is
evacuated live, a replayed spot price change makes a migration pay, and a later notice for the
whole placement (no room anywhere in it) goes checkpoint → migration → restore; the final
weights are compared with uninterrupted single-process training.
Chapter 3 (a run that outlives its cluster, :mod:`orchestrator.supervise`): the supervisor starts
two real, separate local Ray clusters as two offers, runs ``examples/elastic_gpt.py`` on A with
checkpoints in a local S3 server (moto, as the tests start it), replays a price rise on A; the
job commits and asks to move, the supervisor brings B up, resubmits, waits until the job resumed
there from the committed step, and only then stops A's processes; the driver's final weights are
compared with uninterrupted single-process training.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import torch

from orchestrator.adapt.faults import FaultSchedule, Slowdown
from orchestrator.elastic.job_config import AdaptConfig, InjectedNotice, RunConfig, ScalingConfig, SpotConfig, TrainConfig
from orchestrator.elastic.job_loop import ElasticJob
from orchestrator.profiling.models import example_batch, loss_fn, tiny_transformer
from orchestrator.elastic.observability import plot_throughput

from orchestrator.core.cluster import Cluster, two_level
from actors.ray_session import LOCAL_SYSTEM_CONFIG
from orchestrator.core.errors import UserError
from orchestrator.planners.base import PlannerOptions, PlanResult, available, run_planner
from orchestrator.core.profile import Profile
from orchestrator.core.timeline import spans_from_events, write_chrome_trace, write_gantt_png

DEMO_MODEL = {"n_layers": 8, "d_model": 128, "n_heads": 4, "seq_len": 64, "vocab": 256, "sub_layer_blocks": True}


def _banner(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def profile_demo_model(microbatch_size: int = 8) -> Profile:
    from orchestrator.profiling.profiler import profile_example

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


def demo_train(microbatches: int = 8, rows: int = 32) -> TrainConfig:
    """The demo's model and data, as picklable factories every actor rebuilds identically."""
    kw = {k: v for k, v in DEMO_MODEL.items() if k != "sub_layer_blocks"}
    return TrainConfig(
        model_factory=partial(tiny_transformer, sub_layer_blocks=True, **kw),  # type: ignore[arg-type]
        loss_fn=loss_fn("tiny_transformer"),
        # SGD with momentum: float32 pipelined == single-process to allclose. (Adam divides by
        # sqrt(v); on parameters whose true gradient is zero it amplifies summation-order noise.)
        optimizer_factory=partial(torch.optim.SGD, lr=0.05, momentum=0.9),
        data_fn=partial(example_batch, "tiny_transformer", rows, **kw),
        num_microbatches=microbatches,
    )


STORY = ("adapt", "preemption_notice", "preemption_handled", "evacuation_refused", "price_change", "migration_decision",
         "migration_recommended", "migration_skipped", "relocated", "checkpoint", "resumed", "recovered")


def chapter_job(out: Path, steps: int = 26) -> float:
    """One job, one loop: slowdown → live moves; notice → live evacuation; price → a migration that
    would pay, recommended (a job cannot leave its cluster by itself: chapter 3's supervisor moves
    it); whole-placement notice → checkpoint → restart on fresh workers → restore. Returns max |Δ|."""
    _banner("2. one elastic job on 4 stage actors: slowdown, notice, price change, notice for everything")
    job = ElasticJob(
        demo_train(),
        ScalingConfig(devices=4, planner="even"),
        RunConfig(storage=str(out / "checkpoints"), events=out / "events.jsonl", checkpoint_every=8),
        AdaptConfig(faults=FaultSchedule((Slowdown(1, 2.0, 3),))),  # device 1 computes 2x slower from step 3
        SpotConfig(notices=(InjectedNotice(9, 120.0),  # an AWS-style 2-minute notice for the middle stage's device
                            InjectedNotice(20, 30.0, ())),  # later: the whole placement goes
                   price_events=((14, 3.0),)),  # the spot price of the current offer triples
    )
    with job:
        result = job.fit(steps)
        for e in result.events:
            if e["event"] in STORY:
                detail = {k: v for k, v in e.items() if k not in ("time", "event")}
                print(f"  {e['event']:<20} {json.dumps(detail)[:160]}")
        rows = float(job.train.data_fn(0)[0].shape[0])
        tput = [rows / t for t in job.iteration_s if t > 0]
        marks = [(i, "slowdown") for i in (3,)] + [(e.get("step", 0), e["event"]) for e in result.events
                                                    if e["event"] in ("adapt", "preemption_handled", "migration_recommended", "relocated")]
        plot_throughput(list(range(len(tput))), tput, marks, out / "throughput.png", "one elastic job: samples/s per iteration")
        if job.last_metrics is not None:
            write_chrome_trace(job.last_metrics.timeline(), out / "measured_timeline.json", process="measured")
        diff = job.max_abs_diff()
    handled = [e for e in result.events if e["event"] == "preemption_handled"]
    summary = ", ".join(f"{e['mode']} (lost {e['lost_steps']}, stall {e['stall_s']:.2f} s)" for e in handled)
    print(f"steps {result.step}; live moves {result.moves}; restarts {result.restarts}; preemptions: {summary}")
    print(f"final weights vs uninterrupted single-process training: max |diff| = {diff:.2e} "
          f"({'allclose: exact' if diff < 1e-5 else 'NOT EXACT'})")
    print(f"events -> {out / 'events.jsonl'}; throughput plot -> {out / 'throughput.png'}")
    return diff


SUPERVISED_STEPS = 12
PRICE_RISE_AT = 6


def chapter_supervisor(out: Path) -> float:
    """A real migration between two local Ray clusters; returns the driver's max |Δ| (inf if absent)."""
    import re
    import sys

    from orchestrator.supervise.local import LocalProvisioner, listening, session_processes
    from orchestrator.supervise.offers import local_offers
    from orchestrator.supervise.state import merged_events
    from orchestrator.supervise.supervisor import Supervisor, SupervisorConfig

    _banner("3. a run that outlives its cluster: price rise on cluster A -> the supervisor moves it to B")
    root = Path(__file__).resolve().parents[2]
    with _s3_server() as env:
        offers = local_offers(2, 4)
        print(f"offers: {', '.join(o.label() for o in offers)} (each a separate local Ray cluster); "
              f"storage s3://ckpt/demo on a local S3 server (moto); price of the current one rises after step {PRICE_RISE_AT}")
        config = SupervisorConfig(driver=("examples/elastic_gpt.py", "--steps", str(SUPERVISED_STEPS), "--checkpoint-every", "4",
                                          "--verify"),
                                  storage="s3://ckpt/demo", offers=tuple(offers), working_dir=str(root), out=out / "supervised",
                                  price_change_at=PRICE_RISE_AT, poll_s=0.5)
        driver_out = _Tee(sys.stdout, "    | ")
        code = Supervisor(config, LocalProvisioner(cpus=4, env=env), out=driver_out).run()
        events = merged_events(config.storage)
    story = ("cluster_up", "job_started", "migration_requested", "migration", "cluster_down", "run_finished")
    for e in events:
        if e["event"] in story:
            detail = {k: v for k, v in e.items() if k in ("cluster", "offer", "address", "resumed_from", "step", "target",
                                                          "from_cluster", "to_cluster", "reason", "steps_done", "usd_job",
                                                          "usd_total", "usd_per_million_samples")}
            print(f"  {e['event']:<20} {json.dumps(detail)[:160]}")
    up = {e["cluster"]: e for e in events if e["event"] == "cluster_up"}
    moves = [e for e in events if e["event"] == "migration"]
    for m in moves:
        a = up.get(m["from_cluster"], {})
        left = session_processes(int(a.get("session") or 0)) if a.get("session") else []
        print(f"cluster {m['from_cluster']} after the move: {len(left)} processes left, "
              f"GCS {a.get('address')} {'still listening' if a.get('address') and listening(a['address']) else 'closed'}")
    found = re.findall(r"max_abs_diff=([0-9.e+-]+)", driver_out.getvalue())
    diff = float(found[-1]) if found else float("inf")
    print(f"supervisor exit {code}; migrations {len(moves)}; final weights vs uninterrupted single-process training: "
          f"max |diff| = {diff:.2e} ({'allclose: exact' if diff < 1e-5 else 'NOT EXACT'})")
    print(f"merged event log -> {out / 'supervised' / 'events.jsonl'}")
    return diff if code == 0 and moves else float("inf")


class _Tee:
    """A text stream for the driver's streamed output: echoed indented, and kept for its last lines."""

    def __init__(self, stream: Any, prefix: str) -> None:
        self.stream, self.prefix, self.kept = stream, prefix, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        self.stream.write(text if text == "\n" else self.prefix + text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def getvalue(self) -> str:
        return self.kept.getvalue()


@contextlib.contextmanager
def _s3_server() -> Iterator[dict[str, str]]:
    """moto's S3 server on 127.0.0.1 (a dev dependency ``make demo`` installs) with bucket ``ckpt``;
    yields the environment the supervisor and both clusters use to reach it."""
    import logging
    import os

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the server's per-request lines

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # moto's fixed test credentials: this server accepts any, and nothing real is reachable with them
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in (*env, "AWS_PROFILE", "AWS_ENDPOINT_URL_S3")}
    try:
        for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
            os.environ.pop(k, None)
        os.environ.update(env)
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="ckpt")
        yield dict(os.environ)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def run_demo(out: Path) -> int:
    import ray

    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # a re-run must not resume from an old run
    (out / "events.jsonl").unlink(missing_ok=True)
    t0 = time.perf_counter()
    chapter_planning(out)
    ray.init(address="local", ignore_reinit_error=True, log_to_driver=False, include_dashboard=False, num_cpus=4,
             _system_config=LOCAL_SYSTEM_CONFIG)
    try:
        diff = chapter_job(out)
    finally:
        ray.shutdown()
    moved = chapter_supervisor(out)
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f} s; outputs in {out}/")
    return 0 if diff < 1e-5 and moved < 1e-5 else 1
