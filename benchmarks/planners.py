"""Every planner on every shared profile, plus SPP's trace-driven scenario and its variations.

    python benchmarks/planners.py [--quick] [--out benchmarks/results/planners.md]

Sections (all figures measured in this one run, side by side):
1. grid: every profile (PipeDream graph.txt, DAPPLE *.txt) × 4/8/16/32 GPUs × {flat 10 Gb/s,
   two-level 4 GPUs/server 100/10 Gb/s}: simulated iteration time, ratio to the lower bound,
   planning time, per planner (M = 32 micro-batches).
2. PipeDream vs the published optimizer: our vectorized DP vs a pure-Python transcription of
   ``optimizer_graph_hierarchical.py`` (benchmarks/pipedream_reference.py) on the same chain,
   16 workers (4 × 4), with the published timings of the original beside them.
3. SPP's setting (Luo et al. INFOCOM'22 §VI): BERT-24, 32 micro-batches, 8 servers × 4 GPUs, 3 servers
   with intra-server bandwidth U[96,128] Gb/s, 5 with U[160,200], inter-server U[32,40] (seed 0),
   and the variations of their figures 6–11.
4. Planning time at 48 layers × 32 GPUs (median of 3 runs; two topologies).
5. Multi-tensor cuts (``--only cuts``, printed, not written): every PipeDream graph.txt loaded by
   the current loader and by the loader at ``--before-rev`` (single-tensor cuts), the pipedream
   planner's straight bottleneck on 4/8/16 workers at 10 Gb/s against PipeDream's published
   optimizer run on the same file (benchmarks/pipedream_reference.py ``solve_graph``), and the
   planning time of ``pipedream`` and ``auto`` on the largest graphs at 32 GPUs.

Exits 0 with a message when ../shared is absent. Not run in CI.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.core.cluster import GBPS, Cluster, flat, heterogeneous_servers, two_level  # noqa: E402
from orchestrator.core.errors import UserError  # noqa: E402
from orchestrator.planners.base import PlannerOptions, run_planner  # noqa: E402
from orchestrator.core.profile import Profile  # noqa: E402
from orchestrator.core.profile_loader import load_profile  # noqa: E402

SHARED = next((p for p in (ROOT.parent / "shared", ROOT.parents[1] / "shared") if p.exists()), ROOT.parent / "shared")
PLANNERS = ["even", "params", "pipedream", "spp", "dapple", "autopipe", "2bw", "auto"]
PUBLISHED_PIPEDREAM_S = {"resnet50": 2.4, "resnet101": 7.4, "gnmt_large": 36.0}


def profiles() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for p in sorted((SHARED / "profiles").rglob("graph.txt")):
        out[p.parent.name] = p
    for p in sorted((SHARED / "profiles" / "dapple" / "profiling_results").glob("*.txt")):
        out["dapple/" + p.stem] = p
    return out


def run_all(profile: Profile, cluster: Cluster, M: int, names: list[str] = PLANNERS, **kw: Any) -> dict[str, tuple[float, float, float] | str]:
    """planner -> (iteration s, ratio to lower bound, planning s) or an error string."""
    out: dict[str, tuple[float, float, float] | str] = {}
    for name in names:
        try:
            r = run_planner(name, profile, cluster, PlannerOptions(num_microbatches=M, **kw))
            out[name] = (r.iteration_time_s, r.iteration_time_s / r.lower_bound_s, r.planning_time_s)
            if name == "auto":
                out["auto winner"] = r.plan.algorithm
        except UserError as exc:
            out[name] = "no fit" if "fit" in str(exc) else f"error: {exc}"[:40]
    return out


def fmt_row(label: str, res: dict[str, Any], names: list[str]) -> str:
    cells = []
    for n in names:
        v = res.get(n)
        if isinstance(v, tuple):
            cells.append(f"{v[0] * 1e3:.1f} ms / {v[1]:.2f}× / {v[2] * 1e3:.0f} ms")
        else:
            cells.append(str(v))
    winner = res.get("auto winner", "")
    return f"| {label} | " + " | ".join(cells) + f" | {winner} |"


def header(first: str, names: list[str]) -> list[str]:
    return [f"| {first} | " + " | ".join(names) + " | auto picked |", "|" + "---|" * (len(names) + 2)]


def spp_cluster(servers: int = 8, gpus: int = 4, inter: tuple[float, float] = (32, 40), seed: int = 0) -> Cluster:
    rng = np.random.default_rng(seed)
    n_slow = round(servers * 3 / 8)
    intra = list(rng.uniform(96, 128, n_slow)) + list(rng.uniform(160, 200, servers - n_slow))
    m = rng.uniform(*inter, size=(servers, servers))
    m = (m + m.T) / 2
    return heterogeneous_servers([gpus] * servers, intra, m)


def _ref_worker(path: str, q: Any) -> None:
    from benchmarks import pipedream_reference as ref

    prof = load_profile(path)
    t = time.perf_counter()
    v = ref.solve(prof, [(4, 100 * GBPS), (4, 10 * GBPS)])
    q.put((time.perf_counter() - t, v))


def in_process(target: Any, args: tuple[Any, ...], timeout: float) -> Any:
    """``target(*args, queue)`` in a child process; its one queued result, or None past ``timeout``."""
    q: Any = mp.Queue()
    proc = mp.Process(target=target, args=(*args, q))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.terminate()
        proc.join()
        return None
    return q.get() if not q.empty() else None


def reference_timing(path: Path, timeout: float) -> tuple[float, float] | None:
    result: tuple[float, float] | None = in_process(_ref_worker, (str(path),), timeout)
    return result


def _graph_ref_worker(path: str, workers: int, gbps: float, q: Any) -> None:
    from benchmarks import pipedream_reference as ref

    t = time.perf_counter()
    try:
        value, states = ref.solve_graph(path, [(workers, gbps * GBPS)], straight=True)
    except (IndexError, KeyError, ValueError) as exc:  # the original's parser wants tab-indented edges
        q.put(f"cannot read it ({type(exc).__name__})")
        return
    q.put((time.perf_counter() - t, value, states))


def graph_reference(path: Path, workers: int, gbps: float, timeout: float) -> tuple[float, float, int] | str | None:
    """(seconds, published optimizer's bottleneck, antichain states), why it failed, or None past ``timeout``."""
    result: tuple[float, float, int] | str | None = in_process(_graph_ref_worker, (str(path), workers, gbps), timeout)
    return result


def loader_at(rev: str) -> Any:
    """``parse_graph_txt`` of orchestrator/graph_loader.py as committed at ``rev`` (the "before")."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:orchestrator/graph_loader.py"],
                         capture_output=True, text=True, check=True).stdout
    for old in ("errors", "profile", "limits", "files"):  # the modules it imports moved into orchestrator.core since
        src = src.replace(f"orchestrator.{old} import", f"orchestrator.core.{old} import")
    mod = types.ModuleType("graph_loader_before")
    exec(compile(src, f"{rev}:graph_loader.py", "exec"), mod.__dict__)
    return mod.parse_graph_txt


def cuts_section(before_rev: str, ref_timeout: float) -> list[str]:
    """The "Multi-tensor cuts" tables (see the module docstring, item 5)."""
    old_parse = loader_at(before_rev)
    lines = ["## Multi-tensor cuts", "",
             f"Loader before (`{before_rev}`: cut only where one tensor crosses) and after (any topological prefix, the "
             "bytes of every tensor crossing). `pipedream` planner, straight pipeline, M = 1, flat 10 Gb/s (and 100 Gb/s, where compute dominates): its "
             "bottleneck (slowest stage or 2·bytes/B of a cut) against PipeDream's published optimizer "
             "(`optimizer_graph_hierarchical.py --straight_pipeline --activation_compression_ratio 1`, transcribed "
             f"in benchmarks/pipedream_reference.py) on the same file; reference cut off after {ref_timeout:.0f} s.", "",
             "| profile | nodes | blocks before / after | workers × Gb/s | bottleneck before | after | published optimizer (states, time) | after ≤ published |",
             "|---|---|---|---|---|---|---|---|"]
    graphs = profiles()
    loaded: dict[str, tuple[Profile, Profile]] = {}
    for name, path in graphs.items():
        text = path.read_text()
        try:
            before, after = old_parse(text, name=name, source=str(path)), load_profile(path)
        except UserError as exc:
            print(f"{name}: {exc}", flush=True)
            continue
        loaded[name] = (before, after)
        nodes = sum(1 for line in text.splitlines() if line.strip() and not line.startswith("\t"))
        ref: tuple[float, float, int] | str | None = None
        for workers, gbps in ((4, 10.0), (8, 10.0), (16, 10.0), (8, 100.0)):
            opts = PlannerOptions(num_microbatches=1, straight=True, check_memory=False)
            b = run_planner("pipedream", before, flat(workers, gbps), opts).objective_s
            a = run_planner("pipedream", after, flat(workers, gbps), opts).objective_s
            # The antichain DAG does not depend on the workers: past the cut-off once, always.
            if workers == 4 or isinstance(ref, tuple):
                ref = graph_reference(path, workers, gbps, ref_timeout)
            if isinstance(ref, tuple):
                ref_cell = f"{ref[1] * 1e3:.3f} ms ({ref[2]}, {ref[0]:.1f} s)"
                ok = "yes" if a is not None and a <= ref[1] * (1 + 1e-9) else "**no**"
            else:
                ref_cell, ok = ref or "did not finish", "n/a"
            lines.append(f"| {name} | {nodes} | {before.num_blocks} / {after.num_blocks} | {workers} × {gbps:.0f} | "
                         f"{(b or 0) * 1e3:.3f} ms | {(a or 0) * 1e3:.3f} ms | {ref_cell} | {ok} |")
            print(lines[-1], flush=True)
    lines += ["", "Planning time on the largest graphs, 32 GPUs, M = 32, one run each (simulated iteration time / "
              "planning time), before → after:", "",
              "| profile | topology | pipedream before | after | auto before | after |", "|---|---|---|---|---|---|"]
    for name in ("nasnetalarge", "densenet121", "inception_v3", "resnet101"):
        if name not in loaded:
            continue
        for topo, cl in (("flat 10G", flat(32, 10)), ("2-level 100/10G", two_level(8, 4, 100, 10))):
            cells = []
            for alg in ("pipedream", "auto"):
                for prof in loaded[name]:
                    res = run_all(prof, cl, 32, [alg])[alg]
                    cells.append(f"{res[0] * 1e3:.1f} ms / {res[2]:.2f} s" if isinstance(res, tuple) else str(res))
            lines.append(f"| {name} ({loaded[name][0].num_blocks} → {loaded[name][1].num_blocks} blocks) | {topo} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    return lines + [""]


def _sections(text: str) -> list[tuple[str, str]]:
    """``text`` cut at its ``## `` headings: (heading, the section's text including the heading); the part before
    the first heading has the heading ""."""
    parts: list[tuple[str, str]] = [("", "")]
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            parts.append((line.strip(), ""))
        parts[-1] = (parts[-1][0], parts[-1][1] + line)
    return parts


def merge_sections(old: str, new: str) -> str:
    """The results file with this run's sections replaced in place and every other section kept as it was.

    The file also holds sections written by hand or by other scripts (the multi-tensor cuts, the oracle and
    scaling tables, notes on changes); a run of this script must not drop them."""
    fresh = dict(_sections(new))
    kept = [(h, fresh.pop(h, body)) for h, body in _sections(old) if h]
    preamble = fresh.pop("", "") or dict(_sections(old)).get("", "")  # a run of one section keeps the file's title
    merged = preamble + "".join(body for _, body in kept) + "".join(fresh.values())
    return merged


def pipedream_section(profs: dict[str, Path], ref_timeout: float) -> list[str]:
    """Section 2: the ``pipedream`` planner's planning time (median of 5) against the pure-Python transcription of
    PipeDream's optimizer on the same chain (one run, up to ``ref_timeout``) and against the times PipeDream's
    paper reports for its own optimizer."""
    lines = ["## PipeDream: vectorized DP vs pure-Python reference (16 workers = 4 × 4, 100/10 Gb/s)", ""]
    lines += ["Ours: median planning time of 5 runs (`PlanResult.planning_time_s`); the reference and the published optimizer: one run.", ""]
    lines += ["| model | blocks | ours | reference (same chain) | speedup | published original | speedup vs published | bottleneck ours / ref |", "|---|---|---|---|---|---|---|---|"]
    for name in ("resnet50", "resnet101", "gnmt_large"):
        path = profs.get(name) or profiles().get(name)
        if path is None:
            continue
        prof = load_profile(path)
        runs = [run_planner("pipedream", prof, two_level(4, 4, 100, 10), PlannerOptions(num_microbatches=32, check_memory=False)) for _ in range(5)]
        r, ours = runs[-1], float(np.median([x.planning_time_s for x in runs]))
        ref = reference_timing(path, ref_timeout)
        pub = PUBLISHED_PIPEDREAM_S[name]
        ref_cell = f"{ref[0] * 1e3:.1f} ms" if ref else f"> {ref_timeout:.0f} s (timeout)"
        sp = f"{ref[0] / ours:.0f}×" if ref else "n/a"
        bott = f"{r.objective_s * 1e3:.3f} / {ref[1] * 1e3:.3f} ms" if ref and r.objective_s else "n/a"
        lines.append(f"| {name} | {prof.num_blocks} | {ours * 1e3:.1f} ms | {ref_cell} | {sp} | {pub} s | {pub / ours:.0f}× | {bott} |")
        print(lines[-1], flush=True)
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small subset (a few profiles, 8/32 GPUs)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "planners.md"))
    ap.add_argument("--ref-timeout", type=float, default=300.0)
    ap.add_argument("--only", choices=["all", "cuts", "pipedream"], default="all",
                    help="cuts: only section 5, printed; pipedream: only section 2, merged into --out")
    ap.add_argument("--before-rev", default="fa8506d", help="git revision of the single-tensor-cut loader")
    args = ap.parse_args(argv)
    if not (SHARED / "profiles").exists():
        print(f"benchmarks/planners.py: {SHARED} not found; nothing to benchmark")
        return 0
    if args.only == "cuts":
        print("\n".join(cuts_section(args.before_rev, args.ref_timeout)))
        return 0
    if args.only == "pipedream":
        out = Path(args.out)
        section = "\n".join(pipedream_section(profiles(), args.ref_timeout)) + "\n"
        out.write_text(merge_sections(out.read_text() if out.is_file() else "", section))
        return 0
    lines: list[str] = ["# Planner benchmark", "", "Cells: simulated iteration time / ratio to the lower bound / planning time.", ""]
    profs = profiles()
    if args.quick:
        profs = {k: v for k, v in profs.items() if k in ("resnet50", "gnmt_large", "dapple/bert-24-pbs-6", "dapple/bert-48-pbs-2")}
    gpu_counts = [8, 32] if args.quick else [4, 8, 16, 32]

    # 4. planning time at 48 layers × 32 GPUs (first: it is the headline)
    bert48 = SHARED / "profiles" / "dapple" / "profiling_results" / "bert-48-pbs-2.txt"
    if bert48.exists():
        lines += [
            "## Planning time, BERT-48 (50 blocks) on 32 GPUs, M = 32 (median planning time of 3 runs)",
            "",
            "Rows: 8 × 4 GPUs at 100/10 Gb/s, and SPP's 8 × 4 heterogeneous setting of section 3.",
            "",
        ]
        lines += header("setting", PLANNERS)
        b48 = load_profile(bert48)
        for label, cl in (("bert-48 × 32, 2-level 100/10G", two_level(8, 4, 100, 10)), ("bert-48 × 32, SPP setting", spp_cluster())):
            runs = [run_all(b48, cl, 32) for _ in range(3)]
            res = dict(runs[-1])
            for name in PLANNERS:
                cells = [r.get(name) for r in runs]
                if all(isinstance(c, tuple) for c in cells):
                    last = cells[-1]
                    assert isinstance(last, tuple)
                    res[name] = (last[0], last[1], float(np.median([c[2] for c in cells if isinstance(c, tuple)])))
            lines.append(fmt_row(label, res, PLANNERS))
            print(lines[-1], flush=True)
        lines.append("")

    # 3. SPP scenario and variations
    bert24 = SHARED / "profiles" / "dapple" / "profiling_results" / "bert-24-pbs-6.txt"
    if bert24.exists():
        b24 = load_profile(bert24)
        lines += ["## SPP trace-driven setting (BERT-24, M = 32, 8 × 4 GPUs, intra U[96,128]/U[160,200], inter U[32,40] Gb/s, seed 0)", ""]
        lines += header("variation", PLANNERS)
        rows: list[tuple[str, Profile, Cluster, int, dict[str, Any]]] = [("baseline", b24, spp_cluster(), 32, {})]
        for M in ([16, 64] if args.quick else [8, 16, 64, 128]):
            rows.append((f"M = {M} (fig. 6)", b24, spp_cluster(), M, {}))
        for lo, hi in ([(8, 10)] if args.quick else [(8, 10), (16, 20), (64, 80)]):
            rows.append((f"inter U[{lo},{hi}] Gb/s (fig. 7)", b24, spp_cluster(inter=(lo, hi)), 32, {}))
        for s, g in ([(3, 4)] if args.quick else [(6, 2), (3, 4), (1, 8)]):
            rows.append((f"{s}×{g} GPUs (fig. 8)", b24, spp_cluster(s, g), 32, {}))
        if bert48.exists():
            rows.append(("BERT-48 (fig. 9)", load_profile(bert48), spp_cluster(), 32, {}))
        for f in (2, 4):
            rows.append((f"activations ×{f} (fig. 10)", b24.with_activation_scale(f), spp_cluster(), 32, {}))
        for k in ([4] if args.quick else [2, 4, 8, 16]):
            rows.append((f"≤ {k} stages (fig. 11)", b24, spp_cluster(), 32, {"max_stages": k}))
        for label, prof, cl, M, kw in rows:
            res = run_all(prof, cl, M, **kw)
            lines.append(fmt_row(label, res, PLANNERS))
            print(lines[-1], flush=True)
        lines.append("")

    # 2. PipeDream vs the reference transcription
    lines += pipedream_section(profs, args.ref_timeout)

    # 1. grid
    lines += ["## All profiles × GPUs × topology (M = 32)", ""]
    lines += header("profile / GPUs / topology", PLANNERS)
    for pname, path in profs.items():
        prof = load_profile(path)
        for n in gpu_counts:
            for topo, cl in (("flat 10G", flat(n, 10)), ("2-level 100/10G", two_level(max(1, n // 4), min(4, n), 100, 10))):
                res = run_all(prof, cl, 32)
                lines.append(fmt_row(f"{pname} / {n} / {topo}", res, PLANNERS))
                print(lines[-1], flush=True)
    lines.append("")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(merge_sections(out.read_text() if out.is_file() else "", "\n".join(lines) + "\n"))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
