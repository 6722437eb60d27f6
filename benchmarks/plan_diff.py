"""Record every planner's plan on the benchmark rows, and compare two recordings.

    python benchmarks/plan_diff.py record /tmp/plans_before.json [--full]
    python benchmarks/plan_diff.py diff /tmp/plans_before.json /tmp/plans_after.json

A refactoring of the cost model (or of a planner) should change no plan, or only a few for a
reason one can name (a tie broken by a rounding difference). ``record`` runs every planner of
``benchmarks/planners.py`` on its rows — the SPP trace-driven setting and its variations, BERT-48 on
32 GPUs, and the profile grid (a subset unless ``--full``) — and writes, per (row, planner), the
plan (stages, devices, schedule, slicing, chunks), the simulated iteration time and the planner's
own objective. ``diff`` lists every cell whose plan or times differ (times compared to 1e-9
relative). Exits 0 with a message when ../shared is absent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.planners import PLANNERS, SHARED, profiles, spp_cluster  # noqa: E402
from orchestrator.core.cluster import Cluster, flat, two_level  # noqa: E402
from orchestrator.core.errors import UserError  # noqa: E402
from orchestrator.planners.base import PlannerOptions, run_planner  # noqa: E402
from orchestrator.core.profile import Profile  # noqa: E402
from orchestrator.core.profile_loader import load_profile  # noqa: E402

Row = tuple[str, Profile, Cluster, int, dict[str, Any]]


def rows(full: bool) -> list[Row]:
    out: list[Row] = []
    dapple_dir = SHARED / "profiles" / "dapple" / "profiling_results"
    b24_path, b48_path = dapple_dir / "bert-24-pbs-6.txt", dapple_dir / "bert-48-pbs-2.txt"
    if b48_path.exists():
        b48 = load_profile(b48_path)
        out.append(("bert-48 x 32, 2-level 100/10G", b48, two_level(8, 4, 100, 10), 32, {}))
        out.append(("bert-48 x 32, SPP setting", b48, spp_cluster(), 32, {}))
    if b24_path.exists():
        b24 = load_profile(b24_path)
        out.append(("spp baseline", b24, spp_cluster(), 32, {}))
        for M in (8, 16, 64, 128):
            out.append((f"spp M={M}", b24, spp_cluster(), M, {}))
        for lo, hi in ((8, 10), (16, 20), (64, 80)):
            out.append((f"spp inter U[{lo},{hi}]", b24, spp_cluster(inter=(lo, hi)), 32, {}))
        for s, g in ((6, 2), (3, 4), (1, 8)):
            out.append((f"spp {s}x{g} GPUs", b24, spp_cluster(s, g), 32, {}))
        for f in (2, 4):
            out.append((f"spp activations x{f}", b24.with_activation_scale(f), spp_cluster(), 32, {}))
        for k in (2, 4, 8, 16):
            out.append((f"spp <= {k} stages", b24, spp_cluster(), 32, {"max_stages": k}))
        out.append(("bert-24 straight 8 x 100G M=16", b24, flat(8, 100), 16, {"straight": True}))
    profs = profiles()
    if not full:
        profs = {k: v for k, v in profs.items() if k in ("resnet50", "gnmt_large", "vgg16", "dapple/bert-24-pbs-6", "dapple/gnmt-16-pbs-64")}
    for name, path in profs.items():
        prof = load_profile(path)
        for n in ((4, 8, 16, 32) if full else (8, 16)):
            out.append((f"{name} / {n} / flat 10G", prof, flat(n, 10), 32, {}))
            out.append((f"{name} / {n} / 2-level 100/10G", prof, two_level(max(1, n // 4), min(4, n), 100, 10), 32, {}))
    return out


def record(path: Path, full: bool) -> None:
    cells: dict[str, Any] = {}
    for label, prof, cl, M, kw in rows(full):
        for name in PLANNERS:
            t0 = time.perf_counter()
            try:
                r = run_planner(name, prof, cl, PlannerOptions(num_microbatches=M, **kw))
                plan = r.plan
                cell: dict[str, Any] = {
                    "plan": str((plan.stages, plan.num_microbatches, plan.schedule.value, plan.sliced_microbatches, plan.virtual_chunks)),
                    "algorithm": plan.algorithm,
                    "iteration_time_s": r.iteration_time_s,
                    "objective_s": r.objective_s,
                }
            except UserError as exc:
                cell = {"error": str(exc)}
            cell["wall_s"] = time.perf_counter() - t0  # indicative only: compare speed with benchmarks/planners.py side by side
            cells[f"{label} | {name}"] = cell
        print(label, flush=True)
        path.write_text(json.dumps(cells, indent=1, sort_keys=True) + "\n")  # after every row: a long run can be compared part way
    print(f"wrote {path} ({len(cells)} cells)")


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-30)
    return bool(a == b)


def diff(before: Path, after: Path, partial: bool = False) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    changed = 0
    common = set(a) & set(b) if partial else set(a) | set(b)
    for key in sorted(common):
        x, y = a.get(key), b.get(key)
        if x is None or y is None:
            print(f"{key}: only in {'after' if x is None else 'before'}")
            changed += 1
            continue
        fields = [f for f in sorted(set(x) | set(y)) if f != "wall_s" and not _close(x.get(f), y.get(f))]
        if fields:
            changed += 1
            print(f"{key}:")
            for f in fields:
                print(f"    {f}: {x.get(f)}  ->  {y.get(f)}")
    wall = [sum(c.get("wall_s", 0.0) for c in x.values()) for x in (a, b)]
    print(f"{changed} of {len(common)} cells differ (planning wall time {wall[0]:.1f} s before, {wall[1]:.1f} s after: "
          "single samples, compare speed with benchmarks/planners.py)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--full", action="store_true", help="every profile and 4-32 GPUs (slow)")
    dif = sub.add_parser("diff")
    dif.add_argument("before", type=Path)
    dif.add_argument("after", type=Path)
    dif.add_argument("--partial", action="store_true", help="compare only the cells both recordings have")
    args = ap.parse_args(argv)
    if args.cmd == "diff":
        return diff(args.before, args.after, args.partial)
    if not (SHARED / "profiles").exists():
        print(f"benchmarks/plan_diff.py: {SHARED} not found; nothing to record")
        return 0
    record(args.out, args.full)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
