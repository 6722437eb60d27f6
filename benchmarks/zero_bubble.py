"""Zero-bubble benchmark: ZB-H1 against 1F1B, simulated and measured, and against torch's zero bubble.

1. **Simulated, issue 11's goal.** ``--algorithm pipedream --straight`` on DAPPLE's BERT-24
   profile (``bert-24-pbs-6.txt``, no measured B/W split: W is half the backward), 8 GPUs at
   100 Gb/s, M=16, once with ``--schedule 1f1b`` and once with ``--schedule zb-h1``: bubble time
   = ``bubble_fraction`` × ``iteration_time_s``; goal ZB-H1 ≤ 0.45× 1F1B (the ideal is ~0.38×).
2. **Measured on Ray actors (CPU).** The MLP of ``benchmarks/runtime.py`` cut in two stages,
   M=8, on two pairs of live stage actors: ours 1F1B and ours ZB-H1 on the same plan, single
   iterations alternating (order flipped every pair). Bubble as the runtime measures it (the
   actors' own timeline: 1 − busy / iteration, mean over devices) and as the simulator predicts it
   with a cost model measured here (per-block forward, backward and its B/W split with one torch
   thread, gloo's latency and bandwidth, the optimizer step).
3. **torch.distributed.pipelining**, the same model, cut, batch, loss and optimizer on two spawned
   processes (gloo): ``Schedule1F1B`` and ``ScheduleInterleavedZeroBubble`` with one stage per rank
   (torch's ZB1P; ``ScheduleZBVZeroBubble`` needs two stages per rank, a different partition),
   alternating with ours in the same run. torch reports no busy time, so every runner also gets the
   *compute-share* bubble, 1 − M × (profiled F + B of the slower stage) / iteration, one formula
   for all four; and torch's zero-bubble compute order, lowered and timed by our simulator on the
   same cost model, sits next to ours.

Run: ``.venv/bin/python benchmarks/zero_bubble.py [--quick]`` → ``benchmarks/results/zero_bubble.md``.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_worker_niceness", "0")  # as benchmarks/runtime.py: same niceness as torch's processes

import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.runtime import (  # noqa: E402
    BIG, Ours, TorchPipeline, gloo_link, measured_profile, predicted,
)
from orchestrator.core.cluster import GBPS, flat  # noqa: E402
from orchestrator.core.plan import Plan, ScheduleKind, straight_plan  # noqa: E402
from orchestrator.core.profile import Profile  # noqa: E402
from orchestrator.schedule import Action, lower, parse_action  # noqa: E402
from orchestrator.costmodel.simulator import SimOptions, simulate  # noqa: E402

BERT24 = Path("/work/shared/profiles/dapple/profiling_results/bert-24-pbs-6.txt")
BATCH, M, CUT, WARMUP = 256, 8, 4, 3
OUT = ROOT / "benchmarks" / "results" / "zero_bubble.md"


# ----- 1. the simulated goal -----
def simulated_goal() -> list[tuple[str, str]]:
    if not BERT24.exists():
        return [("BERT-24 goal", f"skipped: {BERT24} is absent")]
    got = {}
    for schedule in ("1f1b", "zb-h1"):
        cmd = [sys.executable, "-m", "orchestrator", "plan", "--profile", str(BERT24), "--algorithm", "pipedream", "--straight",
               "--gpus", "8", "--inter-gbps", "100", "--microbatches", "16", "--schedule", schedule, "--json"]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        got[schedule] = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, cwd=ROOT).stdout)
    rows = []
    for schedule, d in got.items():
        rows.append((f"BERT-24 pipedream --straight, 8 GPUs, 100 Gb/s, M=16, {schedule}: iteration / bubble_fraction / bubble time",
                     f"{d['iteration_time_s'] * 1e3:.1f} ms / {d['bubble_fraction']:.3f} / {d['bubble_fraction'] * d['iteration_time_s'] * 1e3:.1f} ms"))
    bubble = {k: d["bubble_fraction"] * d["iteration_time_s"] for k, d in got.items()}
    ratio = bubble["zb-h1"] / bubble["1f1b"]
    rows.append(("BERT-24: ZB-H1 bubble time / 1F1B bubble time (goal <= 0.45, ideal ~0.38)",
                 f"**{ratio:.3f}** ({'meets' if ratio <= 0.45 else 'MISSES'} the goal)"))
    peak = {k: max(d["peak_memory_bytes"].values()) / 2**30 for k, d in got.items()}
    rows.append(("BERT-24: peak memory per device, max over devices, 1F1B / ZB-H1", f"{peak['1f1b']:.2f} / {peak['zb-h1']:.2f} GiB"))
    return rows


# ----- 3. torch.distributed.pipelining's zero bubble (runtime.TorchPipeline with zero_bubble=True) -----
def torch_orders(texts: list[list[str]]) -> list[list[Action]]:
    """torch's compute actions in our IR. torch writes them as we do (``stage kind micro-batch``),
    with ``I`` for the input-gradient half we call ``BI``."""
    out = []
    for order in texts:
        acts = []
        for text in order:
            m = re.fullmatch(r"(\d+)(F|I|W|B)(\d+)", text)
            if m is None:
                raise ValueError(f"unexpected torch action {text!r}")
            stage, kind, mb = m.groups()
            acts.append(parse_action(f"{stage}{'BI' if kind == 'I' else kind}{mb}"))
        out.append(acts)
    return out


# ----- 2. ours, and the run -----
def compute_share_bubble(iteration_s: float, profile: Profile, plan: Plan) -> float:
    """1 − M × (profiled F + B of the slower stage) / iteration: one formula for every runner."""
    work = max(profile.compute_time(s.first, s.last) for s in plan.stages) * plan.num_microbatches
    return 1.0 - work / iteration_s


def main() -> None:
    try:
        import ray
    except ImportError:
        sys.exit("benchmarks/zero_bubble.py needs Ray: .venv/bin/pip install 'ray[default]'")
    from actors.group import WorkerGroup

    quick = "--quick" in sys.argv
    pairs = 10 if quick else 40
    load_before = os.getloadavg()[0]
    rows = simulated_goal()

    plans = {k: straight_plan([0, CUT, 8], M, k) for k in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1)}
    profile, step_s = measured_profile(BIG, plans[ScheduleKind.ZB_H1], BATCH)
    boundary = int(profile.boundary_bytes(CUT))
    link = gloo_link([1, boundary // 4, 1 << 20])
    latency = link[4]
    bandwidth = ((1 << 22) - boundary) / max(1e-9, link[1 << 22] - link[boundary])
    sims = {k: predicted(p, profile, latency, bandwidth, step_s) for k, p in plans.items()}

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    groups = {k: WorkerGroup(2, use_gpu=False) for k in plans}
    ours = {k: Ours(groups[k], BIG, plans[k], BATCH) for k in plans}
    theirs: dict[str, Any] = {"Schedule1F1B": TorchPipeline(BIG, CUT, M, BATCH), "ScheduleInterleavedZeroBubble": TorchPipeline(BIG, CUT, M, BATCH, zero_bubble=True)}
    torch_zb_plan = plans[ScheduleKind.ZB_H1]
    torch_sched = lower(torch_zb_plan, orders=torch_orders(theirs["ScheduleInterleavedZeroBubble"].orders))
    torch_zb_sim = simulate(torch_zb_plan, profile, flat(2, gbps=bandwidth / GBPS).with_latency(latency),
                            SimOptions(step_s_per_param_byte=step_s), schedule=torch_sched)
    runners: list[tuple[str, Any]] = [(f"ours {k.value}", ours[k].step) for k in plans] + [(f"torch {n}", t.step) for n, t in theirs.items()]
    for _ in range(WARMUP):
        for _, step in runners:
            step()
    times: dict[str, list[float]] = {name: [] for name, _ in runners}
    measured_bubble: dict[str, list[float]] = {name: [] for name, _ in runners if name.startswith("ours")}
    for i in range(pairs):
        for name, step in (runners if i % 2 == 0 else runners[::-1]):
            got = step()
            if name.startswith("ours"):
                times[name].append(got.iteration_s)
                fr = got.bubble_fraction
                measured_bubble[name].append(sum(fr.values()) / len(fr))
            else:
                times[name].append(got[0])
    for t in theirs.values():
        t.close()
    for g in groups.values():
        g.shutdown()
    ray.shutdown()

    rows.append(("machine load (1-minute load average on 2 cores) at start / end of the measured part",
                 f"{load_before:.1f} / {os.getloadavg()[0]:.1f} (above 2, every runner shares the cores with other work)"))
    rows.append(("measured model", f"mlp {BIG[0]}-{BIG[1]}x7-{BIG[-1]} (8 blocks), batch {BATCH}, M={M}, 2 stages [0,{CUT})[{CUT},8), "
                                   f"SGD, MSE, gloo on CPU, one torch thread per process; {pairs} alternating rounds after {WARMUP} warm-up"))
    wshare = profile.weight_time(CUT, 8) / max(1e-12, profile.backward_time(CUT, 8))
    rows.append(("measured cost model: F / B / W per micro-batch, stage 1 (W share of the backward)",
                 f"{profile.forward_time(CUT, 8) * 1e3:.2f} / {(profile.backward_time(CUT, 8) - profile.weight_time(CUT, 8)) * 1e3:.2f} / "
                 f"{profile.weight_time(CUT, 8) * 1e3:.2f} ms ({wshare:.2f})"))
    med = {n: statistics.median(v) for n, v in times.items()}
    for k, sim in sims.items():
        name = f"ours {k.value}"
        sim_bubble = sum(sim.bubble_fraction.values()) / len(sim.bubble_fraction)
        rows.append((f"{name}: iteration measured (median) / predicted", f"{med[name] * 1e3:.2f} / {sim.iteration_s * 1e3:.2f} ms"))
        rows.append((f"{name}: bubble fraction measured by the runtime (median) / predicted",
                     f"{statistics.median(measured_bubble[name]):.3f} / {sim_bubble:.3f}"))
    sim_bt = {k: (sum(s.bubble_fraction.values()) / 2) * s.iteration_s for k, s in sims.items()}
    meas_bt = {k: statistics.median(measured_bubble[f"ours {k.value}"]) * med[f"ours {k.value}"] for k in plans}
    z, o = ScheduleKind.ZB_H1, ScheduleKind.ONE_F_ONE_B
    rows.append(("ours: ZB-H1 bubble time / 1F1B bubble time, measured / predicted",
                 f"**{meas_bt[z] / meas_bt[o]:.2f}** / {sim_bt[z] / sim_bt[o]:.2f}"))
    rows.append(("torch's ZB order (rank 0 | rank 1)", " ".join(theirs["ScheduleInterleavedZeroBubble"].orders[0]) + " | "
                 + " ".join(theirs["ScheduleInterleavedZeroBubble"].orders[1])))
    rows.append(("our ZB-H1 order (device 0 | device 1)", " | ".join(" ".join(str(a) for a in lower(torch_zb_plan).compute_order(d)) for d in (0, 1))))
    rows.append(("torch's ZB order timed by our simulator / ours: iteration",
                 f"{torch_zb_sim.iteration_s * 1e3:.2f} / {sims[z].iteration_s * 1e3:.2f} ms"))
    side = []
    for name in times:
        plan = plans[z] if "ero" in name or "zb" in name else plans[o]
        side.append(f"{name} {med[name] * 1e3:.2f} ms, {compute_share_bubble(med[name], profile, plan):.3f}")
    rows.append(("side by side, one run: median iteration, compute-share bubble", "; ".join(side)))
    rows.append(("throughput ours ZB-H1 / torch ScheduleInterleavedZeroBubble (median per-round ratio)",
                 f"{statistics.median(t / o_ for o_, t in zip(times['ours zb-h1'], times['torch ScheduleInterleavedZeroBubble'])):.2f}"))
    rows.append(("throughput ours 1F1B / torch Schedule1F1B (median per-round ratio)",
                 f"{statistics.median(t / o_ for o_, t in zip(times['ours 1f1b'], times['torch Schedule1F1B'])):.2f}"))
    write(rows, quick)


NOTE = """\
Reading the measured rows. With two stages ZB-H1 has the least to win: stage 0's `W` is its whole
backward (no input gradient to compute) and stage 1 defers one `W`, so the simulator predicts a
smaller cut here than the third that deeper pipelines reach when F = B = W (the BERT-24 rows: 0.41).
The measured bubble is mostly runtime overhead per action and other processes on the two shared
cores (issue 15 measures bubbles 2-3x the prediction even on a quiet box; see the load row), which
no schedule removes, so the measured ratio sits closer to 1 than the predicted one and moves with
the load. torch's `ScheduleInterleavedZeroBubble` with one stage per rank builds exactly our ZB-H1
order (the two order rows), so ours and torch's differ only in their runtimes."""


def write(rows: list[tuple[str, str]], quick: bool) -> None:
    text = ["# Zero bubble (ZB-H1) against 1F1B and against torch.distributed.pipelining", "",
            f"Written by `benchmarks/zero_bubble.py{' --quick' if quick else ''}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
            "(a 2-core machine shared with other work: medians of alternating rounds).", "",
            "| what | value |", "|---|---|"]
    text += [f"| {k} | {v} |" for k, v in rows]
    text += ["", NOTE]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
