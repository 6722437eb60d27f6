"""Write the V100 profiles of Parcae's five models (NSDI'24, public traces in ``../shared/parcae_traces``) as our JSON.

    python benchmarks/profiles/parcae/make_profiles.py gpt            # convert Parcae's measured GPT profiles (instant)
    python benchmarks/profiles/parcae/make_profiles.py bert resnet152 vgg19   # profile on this CPU, scale to a V100
    python benchmarks/profiles/parcae/make_profiles.py --calibrate    # calibrated/<model>.json: fit to Parcae's measured runs
    python benchmarks/profiles/parcae/make_profiles.py --check        # load each file, plan it on 32 V100s (no torch)

Why two sources: only Parcae's GPT entries in ``liveput/cost_cfg.py`` (JF-D/Parcae, MIT) are per-layer V100
measurements; its BERT entry is marked "not used, randomly set" and its ResNet-152 / VGG-19 entries repeat one
made-up entry per layer. Those three are profiled here with our own profiler (:func:`profile_blocks`) on the models'
standard definitions at Parcae's micro-batch sizes, and their times scaled to a V100 by the ratio of FLOPs this CPU
sustains (measured on the same run) to a V100's — see README.md beside this file for the numbers and the caveats.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.parcae_profiles import BATCHES, CALIBRATED, load_parcae_profile, parcae_profile_path  # noqa: E402
from orchestrator.core.cluster import flat  # noqa: E402
from orchestrator.core.plan import ScheduleKind, straight_plan  # noqa: E402
from orchestrator.core.profile import Block, Profile  # noqa: E402
from orchestrator.costmodel.group_sim import simulate_groups  # noqa: E402

PARCAE = "github.com/JF-D/Parcae liveput/cost_cfg.py @ efedee7e069d795cbfd6b7667312bdc12f31eb8f (MIT)"
MB = 1024 * 1024

# ----- Parcae's GPT profiles, copied verbatim from liveput/cost_cfg.py get_model_layer_costs ---------------------------
# Per (model, micro-batch): the embedding, one transformer layer (all layers alike), the final layer norm + LM head.
# Each row: (forward ms, backward ms, optimizer ms, acts bytes, params count). Parcae writes acts as "bytes / MB"
# (MiB) and params as a parameter count; times are milliseconds per micro-batch on a V100 (p3.2xlarge).
PARCAE_GPT: dict[tuple[str, int], tuple[tuple[float, float, float, float, int], ...]] = {
    ("gpt-1.5b", 1): ((0.752, 0.798, 5.655, 9420800, 82124800),
                      (6.510, 13.448, 2.117, 282034176, 30740800),
                      (11.238, 23.762, 5.656, 186392576, 82128000)),
    ("gpt-1.5b", 2): ((0.620, 1.003, 5.655, 16793600, 82124800),
                      (12.494, 26.396, 2.117, 557575606.857, 30740800),
                      (22.440, 47.589, 5.656, 373817344, 82128000)),
    ("gpt-6.7b", 1): ((0.607, 1.357, 11.852, 20971520, 214433792),
                      (31.861, 63.118, 11.131, 281550848, 201379840),
                      (28.082, 59.148, 11.852, 155721728, 214441984)),
}
# (layers, hidden, sequence) of the runs those rows come from: Parcae's own launcher,
# examples/megatron/Megatron-LM-v1.1.5-3D_parallelism/examples/spotdl.sh (gpt-6.7b: 32 layers there; liveput/model.py's
# default of 36 is that script's "gpt-7.5b"). The layer parameter counts check it: 12h^2 + 13h.
GPT_ARCH = {"gpt-1.5b": (48, 1600, 1024), "gpt-6.7b": (32, 4096, 1024)}

PARAM_BYTES = 4  # per parameter, see README: x4 (DEFAULT_STATE_FACTOR) = the 16 B of mixed-precision Adam
ACT_BYTES = 2    # fp16 hidden states cross a stage boundary (the runs use --fp16)


def gpt_profile(model: str, microbatch_size: int) -> Profile:
    """Parcae's measured rows for ``model`` as a chain: embedding, ``layers`` transformer layers, head."""
    layers, hidden, seq = GPT_ARCH[model]
    embed, layer, head = PARCAE_GPT[(model, microbatch_size)]
    assert layer[4] == 12 * hidden * hidden + 13 * hidden, f"{model}: layer params do not match hidden {hidden}"
    boundary = float(microbatch_size * seq * hidden * ACT_BYTES)

    def block(name: str, row: tuple[float, float, float, float, int], out: float) -> Block:
        fwd_ms, bwd_ms, _optimizer_ms, acts, params = row
        return Block(name, fwd_ms / 1000, bwd_ms / 1000, out, float(params * PARAM_BYTES), stash_bytes=float(acts))

    blocks = [block("embed", embed, boundary)]
    blocks += [block(f"layer{i}", layer, boundary) for i in range(layers)]
    blocks.append(block("head", head, 0.0))  # the loss: nothing crosses after it
    source = (f"{PARCAE}: {model} per-layer V100 times ({layers} layers x hidden {hidden}, seq {seq}), "
              f"micro-batch {microbatch_size}; converted by benchmarks/profiles/parcae/make_profiles.py")
    return Profile(model, tuple(blocks), microbatch_size, float(microbatch_size * seq * 8), source)


def write(profile: Profile, key: str) -> Path:
    path = parcae_profile_path(key)
    profile.save(path)
    return path


def convert_gpt() -> None:
    for key, model, mbs in (("gpt-1.5b", "gpt-1.5b", 1), ("gpt-1.5b-mbs2", "gpt-1.5b", 2), ("gpt-6.7b", "gpt-6.7b", 1)):
        print(write(gpt_profile(model, mbs), key))


def check(models: list[str], memory_gib: float = 16.0) -> None:
    """Load each file (and its calibrated twin) and plan it on 32 V100s, one per node at 10 Gb/s, with the CLI a user
    runs; beside it, the best iteration Parcae measured on 32 p3.2xlarge (any shape)."""
    for key in models:
        mbs, gbs = BATCHES[key]
        for calibrated in (False, True):
            path = parcae_profile_path(key, calibrated)
            if not path.exists():
                print(f"{key}: {path.relative_to(HERE)} not written")
                continue
            p = load_parcae_profile(key, calibrated)
            print(f"{key}{' (calibrated)' if calibrated else ''}: {p.num_blocks} blocks, {p.total_param_bytes / 1e9:.2f} GB "
                  f"params ({p.total_param_bytes / PARAM_BYTES / 1e9:.3f} B), compute {p.total_compute_s * 1000:.1f} ms per "
                  f"micro-batch of {p.microbatch_size}, {gbs // mbs} micro-batches per iteration")
            cmd = [sys.executable, "-m", "orchestrator", "plan", "--profile", str(path), "--gpus", "32", "--servers", "32",
                   "--intra-gbps", "10", "--inter-gbps", "10", "--memory-gib", str(memory_gib),
                   "--microbatches", str(gbs // mbs), "--algorithm", "auto", "--json"]
            start = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            wall = time.perf_counter() - start
            if done.returncode != 0:
                print(f"  plan failed (exit {done.returncode}, {wall:.1f} s): {done.stderr.strip()[-400:]}")
                continue
            print(f"  plan ({wall:.1f} s wall incl. start-up): {summary(json.loads(done.stdout))}")
        table = measured_table(key)
        if table:
            best = min(table, key=lambda k: table[k])
            print(f"  Parcae measured best on 32 V100s: {best} in {table[best] / 1000:.3f} s")


# ----- against Parcae's measured iteration times -----------------------------------------------------------------------
# parcae_measured.json: liveput/cost.py's CostModel.strategy_speed_throughput for each model — the iteration time (ms)
# and samples/s Parcae measured on 32 p3.2xlarge for every (data-parallel D, pipeline P) shape, which its liveput
# optimizer plans with (extracted by instantiating that CostModel at each model's micro-batch and global batch).
MEASURED = HERE / "parcae_measured.json"


def parcae_cuts(num_blocks: int, stages: int, embedding: bool) -> list[int]:
    """Parcae's own partition of a (D, P) shape (``cost_strategy.py`` ``candidate_partitions``): blocks dealt evenly,
    the remainder to the later stages, the embedding on top of the first stage's share."""
    base, rem = divmod(num_blocks - 1 if embedding else num_blocks, stages)
    part = [base] * stages
    for i in range(rem):
        part[i + 1] += 1
    part = part[::-1]
    if embedding:
        part[0] += 1
    return [sum(part[:i]) for i in range(stages + 1)]


def simulate_shape(profile: Profile, model: str, data: int, stages: int) -> float:
    """Our simulator's iteration time for Parcae's (D, P) shape: its partition, 1F1B, each replica running
    global / (micro-batch x D) micro-batches, 10 Gb/s between nodes. Our replicas split the rows of a unit, so a
    unit here is D micro-batches (the profile scaled by D): each replica computes and sends one micro-batch's."""
    mbs, gbs = BATCHES[model]
    cuts = parcae_cuts(profile.num_blocks, stages, model.startswith(("gpt", "bert")))
    plan = straight_plan(cuts, math.ceil(gbs // mbs / data), ScheduleKind.ONE_F_ONE_B,
                         [tuple(range(j * data, (j + 1) * data)) for j in range(stages)])
    return simulate_groups(plan, profile.scaled(data).with_activation_scale(data), flat(data * stages, 10.0), memory=False).iteration_s


def measured_table(model: str) -> dict[str, float] | None:
    """Parcae's measured iteration ms per "DxP" shape for ``model`` at its batch sizes, or None (gpt-1.5b-mbs2)."""
    entry = json.loads(MEASURED.read_text()).get(model)
    if entry is None or (entry["microbatch_size"], entry["global_batch_size"]) != BATCHES[model]:
        return None
    table: dict[str, float] = entry["iteration_ms"]
    return table


def measured_ratios(profile: Profile, model: str) -> list[tuple[str, float, float]]:
    """(shape, Parcae's measured s, our simulated s) for each shape Parcae measured that the profile can take."""
    table = measured_table(model) or {}
    rows = []
    for shape, ms in table.items():
        d, p = (int(v) for v in shape.split("x"))
        if p <= profile.num_blocks:
            rows.append((shape, ms / 1000, simulate_shape(profile, model, d, p)))
    return rows


def calibrate(model: str) -> Profile:
    """The profile with compute times x f, f such that the median over Parcae's measured shapes of measured /
    simulated iteration time is 1 (bisection on log f; the simulated time grows with f)."""
    base = load_parcae_profile(model)
    lo, hi = 0.05, 20.0
    for _ in range(30):
        f = math.sqrt(lo * hi)
        med = statistics.median(m / s for _, m, s in measured_ratios(base.scaled(f), model))
        lo, hi = (f, hi) if med > 1 else (lo, f)
    f = math.sqrt(lo * hi)
    rows = measured_ratios(base.scaled(f), model)
    spread = sorted(m / s for _, m, s in rows)
    source = (f"{base.source}; compute times x {f:.4f} so that our simulator matches the iteration times Parcae measured "
              f"on 32 p3.2xlarge (parcae_measured.json, median over {len(rows)} (D, P) shapes; measured/simulated "
              f"then {spread[0]:.2f}..{spread[-1]:.2f})")
    print(f"{model}: x {f:.4f}; {len(rows)} shapes, measured / simulated {spread[0]:.3f} .. {spread[-1]:.3f} "
          f"(before: median {statistics.median(m / s for _, m, s in measured_ratios(base, model)):.3f})")
    return Profile(base.name, base.scaled(f).blocks, base.microbatch_size, base.input_bytes, source)


def summary(plan: dict[str, Any]) -> str:
    shape = [f"{s['blocks'][0]}-{s['blocks'][1]}x{len(s['devices'])}" for s in plan["stages"]]
    return (f"{plan['algorithm']}, {plan['num_stages']} stages [{' '.join(shape)}] (blocks first-last x replicas), "
            f"iteration {plan['iteration_time_s']:.3f} s, planning {plan['planning_time_s']:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="gpt, bert, resnet152, vgg19")
    ap.add_argument("--check", action="store_true", help="load and plan every file")
    ap.add_argument("--calibrate", action="store_true", help="write calibrated/<model>.json for every file")
    args = ap.parse_args()
    for m in args.models:
        if m == "gpt":
            convert_gpt()
        else:
            from profile_cpu import profile_to_v100  # torch only here
            print(write(profile_to_v100(m, BATCHES[m][0]), m))
    if args.calibrate:
        CALIBRATED.mkdir(exist_ok=True)
        for m in BATCHES:
            if parcae_profile_path(m).exists() and measured_table(m) is not None:
                calibrate(m).save(parcae_profile_path(m, calibrated=True))
    if args.check:
        check(list(BATCHES))


if __name__ == "__main__":
    main()
