"""Planning time and memory of ``auto`` against cluster size, 4 → 1024 GPUs (issues 28 and 42).

    python benchmarks/planner_scale.py [--sizes 4,8,...] [--profiles a,b] [--nets 100/25,600/100]
                                       [--memories 32,80] [--reference PATH] [--out FILE]

Each point is the contract command itself, ``orchestrator plan --profile P --gpus G --servers
G/8 --intra-gbps I --inter-gbps E --memory-gib MEM --microbatches 64 --algorithm auto --json``, in a
fresh process (so sizes share no caches): wall time and peak RSS of the whole process (imports
included, what a user waits for), the JSON's ``planning_time_s``, and the CPU seconds of the
process (a loaded shared machine distorts them less than wall time). Profiles:

* ``opt30`` — ``benchmarks/profiles/opt30-like-100.json``: a 100-block OPT-30B-like chain (49
  decoder layers as attention + FFN blocks, embedding, head; per-layer figures of one A100-class
  GPU, micro-batch 1 × 2048 tokens), the contract's profile; ``gpt13`` — its GPT-13B-like sibling;
* ``bert48`` — DAPPLE's measured BERT-48 profile (``../shared``, skipped when absent), a real LLM;
* ``vgg19`` — DAPPLE's measured VGG-19 profile (``../shared``), a CNN;
* ``randK`` (K = 0, 1, ...) — a seeded random 100-block transformer-like profile (:func:`random_profile`:
  an embedding, 98 layers, a head; layer time, parameter and stash sizes drawn over an order of magnitude,
  equal layers or jittered ones, a heavy embedding and head or a light one), written to a temporary file;
  ``family`` = ``rand0..rand{FAMILY-1}``;
* ``issue42`` — issue 42's profile: 98 equal layers of 0.81 GB parameters and 0.6 GB stash per micro-batch.

``--reference`` points at another checkout (e.g. ``git archive`` of the commit before) whose
``auto`` runs the same command for the before/after columns, with ``--ref-timeout`` seconds. The
table ends with the worst point (wall and peak RSS) of each profile.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.core.profile import Block, Profile  # noqa: E402

SHARED = next((p for p in (ROOT.parent / "shared", ROOT.parents[1] / "shared") if p.exists()), ROOT.parent / "shared") / "profiles" / "dapple" / "profiling_results"
"""``../shared`` of the project root (or of a worktree's parent folder)."""
PROFILES = {
    "opt30": ROOT / "benchmarks" / "profiles" / "opt30-like-100.json",
    "gpt13": ROOT / "benchmarks" / "profiles" / "gpt13-like-100.json",
    "bert48": SHARED / "bert-48-pbs-2.txt",
    "vgg19": SHARED / "vgg-19-pbs-32.txt",
}
FAMILY = 6
"""Random profiles in the ``family`` sweep (``rand0`` .. ``rand5``)."""


def random_profile(seed: int) -> Profile:
    """A 100-block transformer-like profile: an embedding, 98 layers, a head (seeded).

    Per profile, a layer's forward time (2–20 ms), parameters (0.15–1.5 GB) and stash per micro-batch
    (0.1–1 GB) are drawn log-uniformly over an order of magnitude; the layers are equal (as in a
    real decoder stack) or each jittered by up to 2× either way; the embedding and head are heavy
    (2–6 layers' parameters, a vocabulary-sized head that computes like 0.5–2 layers) or light."""
    rng = np.random.default_rng(4200 + seed)

    def logu(lo: float, hi: float) -> float:
        return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))

    t0, p0, s0 = logu(2e-3, 2e-2), logu(1.5e8, 1.5e9), logu(1e8, 1e9)
    act = s0 / logu(8, 24)  # one hidden state crosses a boundary; a layer stashes several
    jitter = bool(rng.integers(2))
    heavy = bool(rng.integers(2))

    def j() -> float:
        return logu(0.5, 2.0) if jitter else 1.0

    def block(name: str, t: float, params: float, stash: float) -> Block:
        return Block(name, t, 2 * t, act, params, stash, t)

    emb_p, head_p = (logu(2, 6) * p0, logu(2, 6) * p0) if heavy else (0.3 * p0, 0.3 * p0)
    head_t = logu(0.5, 2.0) * t0 if heavy else 0.2 * t0
    blocks = [block("embed", 0.1 * t0, emb_p, act)]
    blocks += [block(f"layer{i}", t0 * j(), p0 * j(), s0 * j()) for i in range(98)]
    blocks.append(block("head", head_t, head_p, act))
    kind = f"{'jittered' if jitter else 'equal'} layers, {'heavy' if heavy else 'light'} embedding/head"
    return Profile(f"rand{seed}", tuple(blocks), input_bytes=16384.0, source=f"benchmarks/planner_scale.py random_profile({seed}): {kind}")


def issue42_profile() -> Profile:
    """Issue 42's profile: 98 equal layers of 0.81 GB parameters and 0.6 GB stash, an embedding and a head."""
    act = 29360128.0
    blocks = [Block("embed", 0.002, 0.004, act, 720699392.0, act, 0.002)]
    blocks += [Block(f"layer{i}", 0.012, 0.024, act, 0.81e9, 0.6e9, 0.012) for i in range(98)]
    blocks.append(Block("head", 0.003, 0.006, act, 720699392.0, act, 0.003))
    return Profile("issue42", tuple(blocks), input_bytes=16384.0, source="issue 42")


def profile_path(name: str, tmp: Path) -> Path:
    """The file of a named profile (random ones are written to ``tmp``)."""
    if name in PROFILES:
        return PROFILES[name]
    if name == "issue42" or (name.startswith("rand") and name[4:].isdigit()):
        path = tmp / f"{name}.json"
        (issue42_profile() if name == "issue42" else random_profile(int(name[4:]))).save(path)
        return path
    return Path(name)


CHILD = "import resource, sys\nfrom orchestrator.cli.commands import main\ncode = main(sys.argv[1:])\n" \
        "r = resource.getrusage(resource.RUSAGE_SELF)\nprint('RUSAGE', r.ru_maxrss, r.ru_utime + r.ru_stime, file=sys.stderr)\nsys.exit(code)\n"


def run(root: Path, profile: Path, n: int, net: str, mem: float, timeout: float) -> dict[str, Any]:
    """One contract command in a fresh process under ``root``'s code."""
    intra, inter = net.split("/")
    args = ["plan", "--profile", str(profile), "--gpus", str(n), "--servers", str(max(1, n // 8)), "--intra-gbps", intra,
            "--inter-gbps", inter, "--memory-gib", f"{mem:g}", "--microbatches", "64", "--algorithm", "auto", "--json"]
    env = dict(os.environ, PYTHONPATH=str(root))
    t = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "wall_s": timeout}
    res: dict[str, Any] = {"wall_s": time.perf_counter() - t, "rc": out.returncode}
    for line in out.stderr.splitlines():
        if line.startswith("RUSAGE"):
            _, rss, cpu = line.split()
            res.update(rss_mb=int(rss) / 1024, cpu_s=float(cpu))
        elif line.startswith("error:"):
            res["error"] = line
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode == 0 and lines:
        d = json.loads(lines[-1])
        depth = d["num_stages"] // max(1, d.get("virtual_chunks", 1))
        res.update(status="plan", iteration_s=d["iteration_time_s"], planning_s=d["planning_time_s"], plan=d["algorithm"],
                   shape=f"{depth}x{len(d['stages'][0]['devices'])} {d['schedule']}" + (f" s{d['sliced_microbatches']}" if d["sliced_microbatches"] else ""))
    elif out.returncode == 2:
        res["status"] = "refused"
    else:
        res["status"] = "failed"
        res["error"] = out.stderr[-300:]
    return res


def cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not run | | |"
    if r["status"] == "timeout":
        return f"> {r['wall_s']:.0f} s (stopped) | | |"
    if r["status"] == "failed":
        return f"failed | | | {r.get('error', '')[:60]}"
    head = f"{r['wall_s']:.2f} / {r.get('cpu_s', 0):.2f} s | {r.get('rss_mb', 0):.0f} MB"
    if r["status"] == "refused":
        return f"{head} | refused | {r.get('error', '')[7:120]}"
    return f"{head} | {r['iteration_s'] * 1e3:.1f} ms | {r['plan']} ({r['shape']})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,8,16,32,48,64,96,128,256,512,1024")
    ap.add_argument("--profiles", default="opt30,bert48,vgg19")
    ap.add_argument("--nets", default="100/25,600/100", help="intra/inter-server Gb/s pairs")
    ap.add_argument("--memories", default="32,80", help="GiB per GPU")
    ap.add_argument("--reference", help="another checkout whose auto gives the 'before' columns")
    ap.add_argument("--ref-timeout", type=float, default=120.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", help="append the markdown table to this file")
    args = ap.parse_args(argv)
    rows = ["| profile | net Gb/s | GiB | GPUs | wall / CPU | peak RSS | simulated iteration | plan | before: wall / CPU | before: RSS | before: iteration | before: plan | after / before |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    names = [n for name in args.profiles.split(",") for n in ([f"rand{k}" for k in range(FAMILY)] if name == "family" else [name])]
    worst: dict[str, dict[str, tuple[float, str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pname in names:
            path = profile_path(pname, Path(tmp))
            if not path.exists():
                print(f"skipping {pname}: {path} is absent", file=sys.stderr)
                continue
            for net in args.nets.split(","):
                for mem in (float(m) for m in args.memories.split(",")):
                    for n in (int(x) for x in args.sizes.split(",")):
                        if n > 8 and n % 8:
                            continue
                        new = run(ROOT, path, n, net, mem, args.timeout)
                        ref = run(Path(args.reference), path, n, net, mem, args.ref_timeout) if args.reference else None
                        where = f"{n} GPUs, {mem:g} GiB, {net}"
                        mine = worst.setdefault(pname, {"wall_s": (0.0, ""), "rss_mb": (0.0, "")})
                        for key in mine:
                            mine[key] = max(mine[key], (float(new.get(key, 0.0)), where))
                        ratio = f"{new['iteration_s'] / ref['iteration_s']:.4f}" if ref and new.get("status") == ref.get("status") == "plan" else ""
                        rows.append(f"| {pname} | {net} | {mem:g} | {n} | {cell(new)} | {cell(ref)} | {ratio} |")
                        print(rows[-1], flush=True)
    summary = ["| profile | worst wall | at | worst peak RSS | at |", "|---|---|---|---|---|"]
    summary += [f"| {name} | {w['wall_s'][0]:.2f} s | {w['wall_s'][1]} | {w['rss_mb'][0]:.0f} MB | {w['rss_mb'][1]} |" for name, w in worst.items()]
    text = "\n".join(rows) + "\n\nworst point per profile:\n\n" + "\n".join(summary) + "\n"
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
