"""Hostile-input battery for the command line: how many bad inputs get the promised treatment.

Every case runs ``python -m orchestrator ...`` as a real process in a fresh folder holding the
usual fixtures (a valid profile, a folder, a symlink, a FIFO, a device node when root, a binary
file), under a memory cap (``RLIMIT_AS``, 4 GiB) and a time limit, and passes only if it exits 2
with exactly one line on stderr, no traceback, and the folder (and any named device) unchanged.
A case that exhausts the cap or the time counts as a failure (that is what the user saw).

    .venv/bin/python benchmarks/bad_input.py                      # this checkout
    .venv/bin/python benchmarks/bad_input.py --tree /tmp/before   # another checkout (e.g. git archive of an older commit)
    .venv/bin/python benchmarks/bad_input.py --compare /tmp/before --write benchmarks/results/bad_input.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fuzz_helpers import snapshot  # noqa: E402 - the suite's "nothing written" check, shared

MEMORY_CAP = 4 * 2**30
TIME_LIMIT_S = 40.0
BLOCK = {"name": "b", "forward_s": 0.001, "backward_s": 0.002, "activation_bytes": 1e6, "param_bytes": 1e6}
PLAN = ["plan", "--profile", "good.json", "--gpus", "4", "--inter-gbps", "10", "--microbatches", "8"]
DIME = ROOT.parent / "shared" / "pricing_traces" / "training_on_a_dime"  # read in place when present
TRACE = [str(DIME), "--throughputs", str(DIME / "notebooks" / "oracle_throughputs.json")] if DIME.exists() else ["x.csv", "--throughputs", "y.csv"]
GOOD_PLAN = {"stages": [{"blocks": [0, 3], "devices": [0]}, {"blocks": [3, 6], "devices": [1]}], "num_microbatches": 4}


@dataclass(frozen=True)
class Case:
    category: str
    name: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()  # extra files: (name, text); text "@bytes:<hex>" for binary
    stdout: str = ""  # "full": standard output is /dev/full (a disk with no space left)
    env: tuple[tuple[str, str], ...] = ()  # extra environment variables


def _profile(**fields: Any) -> str:
    blocks = [dict(BLOCK), dict(BLOCK, name="c")]
    top: dict[str, Any] = {"format": "raypipe-profile", "blocks": blocks}
    for key, value in fields.items():
        if key.startswith("block_"):
            blocks[0][key[6:]] = value
        else:
            top[key] = value
    return json.dumps(top, allow_nan=True).replace('"__NaN__"', "NaN").replace('"__Inf__"', "Infinity")


def cases() -> list[Case]:
    out: list[Case] = []
    add = lambda cat, name, argv, files=(), **kw: out.append(Case(cat, name, tuple(argv), tuple(files), **kw))  # noqa: E731
    # --- outputs ---
    targets = {"dir": "adir", "link": "link.json", "fifo": "fifo", "device": "mynull", "under-file": "good.json/x.json",
               "proc": "/proc/x.json", "empty": ""}  # never /dev/null itself: the old code replaced it (as root)
    commands = {
        "plan --out": PLAN + ["--out"], "plan --trace": PLAN + ["--trace"], "plan --png": PLAN + ["--png"],
        "simulate --trace": ["simulate", "--profile", "good.json", "--plan", "plan.json", "--gpus", "2", "--inter-gbps", "1", "--trace"],
        "simulate --png": ["simulate", "--profile", "good.json", "--plan", "plan.json", "--gpus", "2", "--inter-gbps", "1", "--png"],
        "profile --out": ["profile", "--model", "mlp", "--microbatch-size", "2", "--repeats", "1", "--out"],
    }
    for cmd, argv in commands.items():
        for kind, target in targets.items():
            add("output path", f"{cmd} {kind}", argv + [target])
    add("output path", "plan --out good + --png /proc (all or none)", PLAN + ["--out", "a.json", "--png", "/proc/g.png"])
    add("output path", "plan --out good + --trace dir (all or none)", PLAN + ["--out", "a.json", "--trace", "adir"])
    add("output path", "plan same file twice", PLAN + ["--out", "a.json", "--trace", "a.json"])
    add("output path", "demo --out is a file", ["demo", "--out", "good.json"])
    add("output path", "demo --out under a file", ["demo", "--out", "good.json/d"])
    add("output path", "demo --out /proc", ["demo", "--out", "/proc/d"])
    # --- decoding / unreadable inputs ---
    binary = "@bytes:" + bytes([0x7B, 0x80, 0x81, 0xFE, 0xFF, 0x00, 0x41]).hex()
    latin1 = "@bytes:" + '{"name": "caf\xe9"}'.encode("latin-1").hex()
    for label, content in (("binary", binary), ("latin-1", latin1)):
        add("decoding", f"--profile {label}", ["plan", "--profile", "f.bin", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"], [("f.bin", content)])
        add("decoding", f"simulate --plan {label}", ["simulate", "--profile", "good.json", "--plan", "f.bin", "--gpus", "2", "--inter-gbps", "1"], [("f.bin", content)])
        add("decoding", f"--cluster {label}", ["plan", "--profile", "good.json", "--cluster", "f.bin", "--microbatches", "2"], [("f.bin", content)])
        add("decoding", f"prices --catalog {label}", ["prices", "show", "--catalog", "f.bin"], [("f.bin", content)])
        add("decoding", f"cost-sim --throughputs {label}", ["cost-sim", "--trace", "f.bin", "--throughputs", "f.bin", "--days", "1"], [("f.bin", content)])
        add("decoding", f"graph.txt {label}", ["plan", "--profile", "graph.txt", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"], [("graph.txt", content)])
    add("decoding", "--profile /dev/zero", ["plan", "--profile", "/dev/zero", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"])
    add("decoding", "--profile is a folder", ["plan", "--profile", "adir", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"])
    add("decoding", "--plan is a folder", ["simulate", "--profile", "good.json", "--plan", "adir", "--gpus", "2", "--inter-gbps", "1"])
    add("decoding", "--cluster missing", ["plan", "--profile", "good.json", "--cluster", "nope.json", "--microbatches", "2"])
    # --- bounds ---
    for m in ("1000000000", "100000", "-1", "0"):
        add("bounds", f"--microbatches {m}", PLAN[:-1] + [m])
    for g in ("100000", "5000", "0", "-4"):
        add("bounds", f"--gpus {g}", ["plan", "--profile", "good.json", "--gpus", g, "--inter-gbps", "10", "--microbatches", "4"])
    for flag in ("--inter-gbps", "--intra-gbps", "--memory-gib"):
        for v in ("nan", "inf", "-1", "0"):
            add("bounds", f"{flag} {v}", ["plan", "--profile", "good.json", "--gpus", "4", "--servers", "2", "--inter-gbps", "10", "--microbatches", "4", flag, v])
    for d in ("1e9", "nan", "inf", "-1", "0"):
        add("bounds", f"cost-sim --days {d}", ["cost-sim", "--trace", *TRACE, "--days", d])
    for g in ("nan", "-1"):
        add("bounds", f"cost-sim --checkpoint-gb {g}", ["cost-sim", "--trace", *TRACE, "--checkpoint-gb", g])
    for n in (1e12, 1e7, 2.5, 0, -3, True):
        add("bounds", f"simulate num_microbatches {n}", ["simulate", "--profile", "good.json", "--plan", "p.json", "--gpus", "2", "--inter-gbps", "1"],
            [("p.json", json.dumps(dict(GOOD_PLAN, num_microbatches=n)))])
    for mbs in ("1000000000", "-1", "0"):
        add("bounds", f"profile --microbatch-size {mbs}", ["profile", "--model", "mlp", "--microbatch-size", mbs, "--out", "p.json"])
    add("bounds", "profile --repeats 0", ["profile", "--model", "mlp", "--repeats", "0", "--out", "p.json"])
    add("bounds", "profile --input-shape huge", ["profile", "--factory", "m.py:blocks", "--input-shape", "100000,100000", "--out", "p.json"])
    add("bounds", "cluster servers x gpus huge", ["plan", "--profile", "good.json", "--cluster", "c.json", "--microbatches", "2"],
        [("c.json", json.dumps({"servers": 1000, "gpus_per_server": 1000, "inter_gbps": 1}))])
    # --- profile fields ---
    values = {"NaN": "__NaN__", "Infinity": "__Inf__", "-1": -1, "true": True, "string": "x", "null": None, "1e308": 1e308, "list": [1]}
    for fld in ("forward_s", "backward_s", "activation_bytes", "param_bytes", "stash_bytes"):
        for label, v in values.items():
            add("profile fields", f"{fld}={label}", ["plan", "--profile", "p.json", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"],
                [("p.json", _profile(**{f"block_{fld}": v}))])
    for fld in ("input_bytes", "microbatch_size"):
        for label, v in list(values.items()) + ([("2.7", 2.7)] if fld == "microbatch_size" else []):
            add("profile fields", f"{fld}={label}", ["plan", "--profile", "p.json", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"],
                [("p.json", _profile(**{fld: v}))])
    zero = json.dumps({"format": "raypipe-profile", "blocks": [dict(BLOCK, forward_s=0, backward_s=0), dict(BLOCK, name="c", forward_s=0, backward_s=0)]})
    for name, text in (("all-zero compute", zero), ("no blocks", '{"format": "raypipe-profile", "blocks": []}'),
                       ("blocks not a list", '{"format": "raypipe-profile", "blocks": 3}'),
                       ("block not an object", '{"format": "raypipe-profile", "blocks": [1, 2]}'),
                       ("unknown block field", _profile(block_colour="red")), ("block name a number", _profile(block_name=7)),
                       ("missing field", '{"format": "raypipe-profile", "blocks": [{"name": "b"}]}')):
        add("profile fields", name, ["plan", "--profile", "p.json", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"], [("p.json", text)])
    # --- cluster fields ---
    clusters = {
        "devices [1,2,3,4]": {"devices": [1, 2, 3, 4]}, "speed true": {"devices": [{"speed": True}], "bandwidth_gbps": [[0]]},
        "speed 0": {"devices": [{"speed": 0}], "bandwidth_gbps": [[0]]}, "speed 'fast'": {"devices": [{"speed": "fast"}], "bandwidth_gbps": [[0]]},
        "memory -1": {"devices": [{"memory_bytes": -1}], "bandwidth_gbps": [[0]]}, "memory true": {"devices": [{"memory_bytes": True}], "bandwidth_gbps": [[0]]},
        "id 2.5": {"devices": [{"id": 2.5}], "bandwidth_gbps": [[0]]}, "node 5": {"devices": [{"node": 5}], "bandwidth_gbps": [[0]]},
        "bandwidth string": {"devices": [{}, {}], "bandwidth_gbps": [[0, "10"], ["10", 0]]},
        "bandwidth true": {"devices": [{}, {}], "bandwidth_gbps": [[0, True], [True, 0]]},
        "bandwidth negative": {"devices": [{}, {}], "bandwidth_gbps": [[0, -1], [-1, 0]]},
        "bandwidth ragged": {"devices": [{}, {}], "bandwidth_gbps": [[0, 1], [1]]},
        "bandwidth wrong size": {"devices": [{}, {}], "bandwidth_gbps": [[0]]},
        "bandwidth missing": {"devices": [{}, {}]},
        "disconnected": {"devices": [{}, {}, {}], "bandwidth_gbps": [[0, 1, 0], [1, 0, 0], [0, 0, 0]]},
        "servers 2.5": {"servers": 2.5, "inter_gbps": 1}, "servers true": {"servers": True, "inter_gbps": 1},
        "servers 0": {"servers": 0, "inter_gbps": 1}, "inter_gbps missing": {"servers": 2},
        "latency -1": {"devices": [{}], "bandwidth_gbps": [[0]], "message_latency_s": -1},
        "latency true": {"devices": [{}], "bandwidth_gbps": [[0]], "message_latency_s": True},
        "not an object": [1, 2],
    }
    for name, spec in clusters.items():
        add("cluster fields", name, ["plan", "--profile", "good.json", "--cluster", "c.json", "--microbatches", "2"], [("c.json", json.dumps(spec))])
    # --- plan fields ---
    stages_cases = {
        "blocks [2, 2.9]": [{"blocks": [0, 2], "devices": [0]}, {"blocks": [2, 2.9], "devices": [1]}],
        "device in two groups": [{"blocks": [0, 2], "devices": [0, 1]}, {"blocks": [2, 6], "devices": [1]}],
        "group reused out of order": [{"blocks": [0, 2], "devices": [0]}, {"blocks": [2, 4], "devices": [1]}, {"blocks": [4, 6], "devices": [0]}],
        "device true": [{"blocks": [0, 6], "devices": [True]}],
        "device -1": [{"blocks": [0, 6], "devices": [-1]}],
        "device 9 (beyond cluster)": [{"blocks": [0, 6], "devices": [9]}],
        "blocks beyond profile": [{"blocks": [0, 9], "devices": [0]}],
        "stage not an object": [5],
        "gap between stages": [{"blocks": [0, 2], "devices": [0]}, {"blocks": [3, 6], "devices": [1]}],
        "blocks not a pair": [{"blocks": [0], "devices": [0]}],
    }
    for name, stages in stages_cases.items():
        add("plan fields", name, ["simulate", "--profile", "good.json", "--plan", "p.json", "--gpus", "4", "--inter-gbps", "1"],
            [("p.json", json.dumps({"stages": stages, "num_microbatches": 4}))])
    for name, plan in (("stages not a list", {"stages": 3, "num_microbatches": 2}), ("no num_microbatches", {"stages": GOOD_PLAN["stages"]}),
                       ("schedule 5", dict(GOOD_PLAN, schedule=5)), ("sliced -1", dict(GOOD_PLAN, sliced_microbatches=-1)),
                       ("sliced 99", dict(GOOD_PLAN, sliced_microbatches=99)), ("not an object", [1])):
        add("plan fields", name, ["simulate", "--profile", "good.json", "--plan", "p.json", "--gpus", "4", "--inter-gbps", "1"], [("p.json", json.dumps(plan))])
    # --- graph.txt ---
    line = "node1 -- Linear -- forward_compute_time={f}, backward_compute_time=1.0, activation_size=10.0, parameter_size=5.0"
    for name, text in (("nan", line.format(f="nan")), ("negative", line.format(f="-1")), ("1e400", line.format(f="1e400")),
                       ("1e300 (sum overflows)", line.format(f="1e300") + "\n" + line.format(f="1e300").replace("node1", "node2") + "\nnode1 -- node2"),
                       ("missing field", "node1 -- Linear -- forward_compute_time=1.0"), ("cycle", line.format(f="1") + "\n" + line.format(f="1").replace("node1", "node2") + "\nnode1 -- node2\nnode2 -- node1"),
                       ("undefined node", line.format(f="1") + "\nnode1 -- node7"), ("garbage", "hello world"), ("empty", "")):
        add("graph.txt", name, ["plan", "--profile", "graph.txt", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"], [("graph.txt", text)])
    # --- flags and names ---
    for name, argv in (
        ("unknown algorithm", PLAN + ["--algorithm", "pipedraem"]), ("--max-stages 0", PLAN + ["--max-stages", "0"]),
        ("--schedule bogus", PLAN + ["--schedule", "zigzag"]), ("--gpus not divisible", ["plan", "--profile", "good.json", "--gpus", "5", "--servers", "2", "--inter-gbps", "1", "--microbatches", "2"]),
        ("--input-shape 4,x", ["profile", "--factory", "m.py:blocks", "--input-shape", "4,x", "--out", "p.json"]),
        ("factory shapes do not chain", ["profile", "--factory", "m.py:blocks", "--input-shape", "4", "--microbatch-size", "2", "--out", "p.json"]),
        ("factory missing", ["profile", "--factory", "nope.py:blocks", "--input-shape", "4", "--out", "p.json"]),
        ("unknown model", ["profile", "--model", "resnet9000", "--out", "p.json"]),
        ("prices unknown gpu", ["prices", "cheapest", "--gpu", "V1OO", "--count", "1"]), ("prices --count 0", ["prices", "cheapest", "--gpu", "V100", "--count", "0"]),
        ("prices unknown cloud", ["prices", "refresh", "--cloud", "awz"]), ("cost-sim missing trace", ["cost-sim", "--trace", "nope", "--throughputs", "nope"]),
        ("no subcommand", []), ("unknown subcommand", ["plna"]), ("plan without --profile", ["plan"]),
    ):
        add("flags", name, argv, [("m.py", "import torch.nn as nn\n\ndef blocks():\n    return [nn.Linear(4, 8), nn.ReLU(), nn.Linear(7, 2)]\n")])
    _issue_29(add)
    return out


def _issue_29(add: Any) -> None:
    """The kinds issue 29 found: inputs that are not regular files, outputs that are inputs, loose schemas,
    stdout that cannot be written, an unreachable endpoint. (``cluster --slots`` is tested in
    ``tests/test_bad_input_files.py`` only: on older code ``--slots 0`` starts a Ray instance, which a
    time limit would orphan.)"""
    sim = ["simulate", "--profile", "good.json", "--plan", "plan.json", "--gpus", "2", "--inter-gbps", "1"]
    plan = ["plan", "--profile", "good.json", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"]
    # --- inputs that are not regular files (a FIFO used to block forever) ---
    add("input kind", "--profile fifo", ["plan", "--profile", "fifo", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"])
    add("input kind", "simulate --plan fifo", sim[:4] + ["fifo"] + sim[5:])
    add("input kind", "--cluster fifo", ["plan", "--profile", "good.json", "--cluster", "fifo", "--microbatches", "2"])
    add("input kind", "--profile device", ["plan", "--profile", "mynull" if os.geteuid() == 0 else "/dev/null", "--gpus", "2",
                                           "--inter-gbps", "1", "--microbatches", "2"])
    # --- an output that is also an input ---
    add("output is input", "plan --trace = --profile", plan + ["--trace", "good.json"])
    add("output is input", "plan --out = --profile", plan + ["--out", "good.json"])
    add("output is input", "plan --png = --profile (link)", plan + ["--png", "link.json"])
    add("output is input", "simulate --trace = --plan", sim + ["--trace", "plan.json"])
    add("output is input", "simulate --png = --profile", sim + ["--png", "good.json"])
    # --- strict schemas ---
    stage_typo = {"stages": [{"blocks": [0, 3], "devcies": [1], "devices": [0]}, {"blocks": [3, 6], "devices": [1]}], "num_microbatches": 4}
    bad_plans = {
        "plan: misspelt stage field": json.dumps(stage_typo),
        "plan: misspelt field": json.dumps(dict(GOOD_PLAN, num_microbatch=8)),
        "plan: duplicate key": '{"stages": [{"blocks": [0, 6], "devices": [0]}], "num_microbatches": 4, "num_microbatches": 64}',
        "plan: version 9": json.dumps(dict(GOOD_PLAN, version=9)),
        "plan: num_stages contradicts": json.dumps(dict(GOOD_PLAN, num_stages=5)),
        "plan: virtual_chunks contradicts": json.dumps(dict(GOOD_PLAN, virtual_chunks=4)),
        "plan: a profile given as plan": _profile(),
    }
    for name, text in bad_plans.items():
        add("strict schema", name, sim[:4] + ["p.json"] + sim[5:], [("p.json", text)])
    bad_profiles = {
        "profile: misspelt field": _profile(microbatch_sise=4),
        "profile: duplicate key": _profile().replace('"blocks": [', '"name": "x", "name": "y", "blocks": [', 1),
        "profile: version 2": _profile(version=2),
        "profile: negative weight_s": _profile(block_weight_s=-1),
        "profile: a plan given as profile": json.dumps(dict(GOOD_PLAN, format="raypipe-plan")),
    }
    for name, text in bad_profiles.items():
        add("strict schema", name, ["plan", "--profile", "p.json", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"],
            [("p.json", text)])
    two = {"devices": [{}, {}], "bandwidth_gbps": [[0, 1], [1, 0]]}
    bad_clusters = {
        "cluster: misspelt device field": dict(two, devices=[{"sped": 2.0}, {}]),
        "cluster: unknown device kind": dict(two, devices=[{"kind": "tpu"}, {}]),
        "cluster: version 3": dict(two, version=3),
        "cluster: both bandwidth keys": dict(two, bandwidth_bytes_per_s=[[0, 1], [1, 0]]),
    }
    for name, spec in bad_clusters.items():
        add("strict schema", name, ["plan", "--profile", "good.json", "--cluster", "c.json", "--microbatches", "2"],
            [("c.json", json.dumps(spec))])
    add("strict schema", "cluster: duplicate key", ["plan", "--profile", "good.json", "--cluster", "c.json", "--microbatches", "2"],
        [("c.json", '{"devices": [{"speed": 1, "speed": 9}, {}], "bandwidth_gbps": [[0, 1], [1, 0]]}')])
    add("flags", "--gpus with --cluster", ["plan", "--profile", "good.json", "--gpus", "8", "--cluster", "c.json", "--microbatches", "2"],
        [("c.json", json.dumps(two))])
    # --- streams and endpoints ---
    add("stdout", "plan > /dev/full", plan, stdout="full")
    add("stdout", "plan --json > /dev/full", plan + ["--json"], stdout="full")
    add("stdout", "simulate > /dev/full", sim, stdout="full")
    add("endpoint", "checkpoint verify gs:// unreachable", ["checkpoint", "verify", "gs://bucket/run"],
        env=(("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9"),))


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _fixtures(root: Path, case: Case) -> None:
    (root / "good.json").write_text(json.dumps({"format": "raypipe-profile", "name": "good", "microbatch_size": 4,
                                                 "blocks": [dict(BLOCK, name=f"b{i}") for i in range(6)]}))
    (root / "plan.json").write_text(json.dumps(GOOD_PLAN))
    (root / "adir").mkdir()
    (root / "link.json").symlink_to(root / "good.json")
    os.mkfifo(root / "fifo")
    if os.geteuid() == 0:
        os.mknod(root / "mynull", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    for name, text in case.files:
        if text.startswith("@bytes:"):
            (root / name).write_bytes(bytes.fromhex(text[7:]))
        else:
            (root / name).write_text(text)


def run_case(case: Case, tree: Path) -> tuple[bool, str]:
    """(passed, why) for one case run against the code in ``tree``."""
    with tempfile.TemporaryDirectory(prefix="raypipe-bad-") as tmp:
        root = Path(tmp)
        _fixtures(root, case)
        before = snapshot(root)
        env = dict(os.environ, PYTHONPATH=str(tree), MPLBACKEND="Agg", RAY_DISABLE_IMPORT_WARNING="1", **dict(case.env))
        env.pop("AWS_ACCESS_KEY_ID", None)
        try:
            with open("/dev/full" if case.stdout == "full" else os.devnull, "w") as full:
                proc = subprocess.run([sys.executable, "-m", "orchestrator", *case.argv], cwd=root, env=env,
                                      stdout=full if case.stdout == "full" else subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, errors="replace", timeout=TIME_LIMIT_S, preexec_fn=_limits, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False, f"ran past {TIME_LIMIT_S:.0f} s"
        after = snapshot(root)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        if "Traceback" in proc.stderr:
            return False, f"traceback ({lines[-1][:80] if lines else ''})"
        if proc.returncode != 2:
            return False, f"exit {proc.returncode}" + (f" ({lines[-1][:80]})" if lines else "")
        if len(lines) != 1:
            return False, f"{len(lines)} lines on stderr"
        if before != after:
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            return False, f"wrote {changed[:3]}"
        return True, lines[0][:160]


def run_all(tree: Path, jobs: int) -> list[tuple[Case, bool, str]]:
    all_cases = cases()
    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(lambda c: run_case(c, tree), all_cases))
    return [(c, ok, why) for c, (ok, why) in zip(all_cases, results)]


def _table(before: list[tuple[Case, bool, str]] | None, after: list[tuple[Case, bool, str]]) -> str:
    cats: dict[str, list[int]] = {}
    for i, (case, ok, _) in enumerate(after):
        cats.setdefault(case.category, []).append(i)
    rows = ["| category | cases | before | after |", "|---|---:|---:|---:|"]
    for cat, idx in cats.items():
        b = sum(before[i][1] for i in idx) if before else "-"
        rows.append(f"| {cat} | {len(idx)} | {b} | {sum(after[i][1] for i in idx)} |")
    total_b = sum(r[1] for r in before) if before else "-"
    rows.append(f"| **all** | **{len(after)}** | **{total_b}** | **{sum(r[1] for r in after)}** |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout whose code is tested (default: this one)")
    parser.add_argument("--compare", type=Path, help="an older checkout to run the same battery against first")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--write", type=Path, help="write the markdown table here")
    args = parser.parse_args()
    t = time.perf_counter()
    before = run_all(args.compare, args.jobs) if args.compare else None
    after = run_all(args.tree, args.jobs)
    wall = time.perf_counter() - t
    n = len(after)
    lines = [f"# Hostile-input battery (`benchmarks/bad_input.py`)", "",
             f"{n} bad command lines, each run as a real `python -m orchestrator` process in a fresh folder under a "
             f"{MEMORY_CAP // 2**30} GiB address-space cap and a {TIME_LIMIT_S:.0f} s limit. A case passes when it exits 2 "
             "with exactly one line on stderr, no traceback, and nothing in the folder (or the named device) created, "
             "changed or removed. Checkpoint cases are in `tests/test_checkpoint_format.py` and "
             "`tests/test_checkpoint_places.py`; user-code (`data_fn`, `loss_fn`, factories) cases in "
             "`tests/test_bad_input_user_code.py`; the Python configs' cases in `tests/test_bad_input_configs.py`.", ""]
    if before is not None:
        lines.append(f"**Before** ({args.compare}): {sum(r[1] for r in before)} of {n}. **After** (this tree): {sum(r[1] for r in after)} of {n}.")
        lines.append("")
    else:
        lines.append(f"{sum(r[1] for r in after)} of {n} pass.")
        lines.append("")
    lines += [_table(before, after), "", f"Wall time {wall:.0f} s with {args.jobs} parallel cases.", "", "## Cases that do not pass (after)", ""]
    failing = [(c, why) for c, ok, why in after if not ok]
    lines += [f"- {c.category}: {c.name}: {why}" for c, why in failing] or ["none"]
    if before is not None:
        lines += ["", "## How each case failed before", ""]
        lines += [f"- {c.category}: {c.name}: {why}" for c, ok, why in before if not ok]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
