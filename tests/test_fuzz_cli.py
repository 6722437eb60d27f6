"""Property-based fuzzing of every CLI subcommand and every loader (hypothesis, bounded examples).

The contract for any input: exit code 0 or 2, never a traceback, and on exit 2 one line on stderr
and no file created, changed or removed. Examples are few per test (the whole file runs in well
under a minute on two cores) and derandomized, so CI is repeatable; the strategies mix valid
values with the ones that broke things before (NaN, inf, negatives, booleans, huge counts,
strings, nested junk, binary bytes, special output paths).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import UserError
from tests.fuzz_helpers import check_contract, run_cli, snapshot, write_good_profile

FUZZ = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
FEW = settings(FUZZ, max_examples=12)

NUMBERS = st.one_of(
    st.integers(-5, 10), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 2.7, -1, 1e308, 1e-320, float("nan"), float("inf")]),
)
JUNK = st.one_of(NUMBERS, st.booleans(), st.none(), st.text(max_size=8), st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
VALUE = st.one_of(NUMBERS, NUMBERS, JUNK)


def _workdir() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="raypipe-fuzz-")


def _special(root: Path) -> dict[str, str]:
    """Output targets that must be refused (or, for 'new', accepted)."""
    (root / "adir").mkdir(exist_ok=True)
    if not (root / "link.json").is_symlink():
        (root / "link.json").symlink_to(root / "profile.json")
    if not (root / "fifo").exists():
        os.mkfifo(root / "fifo")
    device = "fifo"  # a private device node when root; never /dev/null itself (a regression would replace it)
    if os.geteuid() == 0:
        if not (root / "mynull").exists():
            os.mknod(root / "mynull", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        device = "mynull"
    return {
        "new": "out/new.json", "dir": "adir", "link": "link.json", "fifo": "fifo", "under-file": "profile.json/x.json",
        "proc": "/proc/x.json", "device": device, "empty": "",
    }


def _contract(argv: list[str], root: Path) -> Any:
    before = snapshot(root)
    run = run_cli(argv, root)
    check_contract(run, before, snapshot(root), argv)
    return run


# ----- loaders through the CLI -----
BLOCK = st.fixed_dictionaries(
    {"name": st.one_of(st.text(max_size=4), JUNK)},
    optional={"forward_s": VALUE, "backward_s": VALUE, "activation_bytes": VALUE, "param_bytes": VALUE, "stash_bytes": VALUE, "extra": JUNK},
)
GOOD_BLOCK = st.fixed_dictionaries({"name": st.just("b"), "forward_s": VALUE, "backward_s": VALUE, "activation_bytes": VALUE, "param_bytes": VALUE})
PROFILE = st.fixed_dictionaries(
    {"format": st.sampled_from(["raypipe-profile", "raypipe-profile", "nope"]),
     "blocks": st.one_of(st.lists(st.one_of(GOOD_BLOCK, BLOCK, JUNK), max_size=5), JUNK)},
    optional={"microbatch_size": VALUE, "input_bytes": VALUE, "name": JUNK},
)


@FUZZ
@given(profile=PROFILE, microbatches=st.sampled_from(["1", "4", "0", "-3", "1e3", "999999999999"]))
def test_fuzz_profile_json(profile: dict[str, Any], microbatches: str) -> None:
    with _workdir() as tmp:
        root = Path(tmp)
        (root / "p.json").write_text(json.dumps(profile))
        _contract(["plan", "--profile", "p.json", "--gpus", "2", "--inter-gbps", "10", "--microbatches", microbatches, "--out", "o.json"], root)


GRAPH_LINE = st.one_of(
    st.builds(lambda i, op, f, b, a, p: f"node{i} -- {op} -- forward_compute_time={f}, backward_compute_time={b}, activation_size={a}, parameter_size={p}",
              st.integers(0, 4), st.sampled_from(["Input0", "Linear", "ReLU", ""]), *(st.one_of(st.sampled_from(["1.0", "0", "-1", "nan", "inf", "1e400", "[1;2]", "x"]), st.floats().map(str)) for _ in range(4))),
    st.builds(lambda a, b: f"node{a} -- node{b}", st.integers(0, 5), st.integers(0, 5)),
    st.text(max_size=30),
)


@FUZZ
@given(lines=st.lists(GRAPH_LINE, max_size=8))
def test_fuzz_graph_txt(lines: list[str]) -> None:
    with _workdir() as tmp:
        root = Path(tmp)
        (root / "graph.txt").write_text("\n".join(lines))
        _contract(["plan", "--profile", "graph.txt", "--gpus", "2", "--inter-gbps", "10", "--microbatches", "2"], root)


DEVICE = st.one_of(st.fixed_dictionaries({}, optional={"speed": VALUE, "memory_bytes": VALUE, "node": JUNK, "id": VALUE, "kind": JUNK}), JUNK)
CLUSTER = st.one_of(
    st.fixed_dictionaries({"devices": st.one_of(st.lists(DEVICE, min_size=1, max_size=3), JUNK)},
                          optional={"bandwidth_gbps": st.one_of(st.lists(st.lists(VALUE, max_size=3), max_size=3), JUNK),
                                    "bandwidth_bytes_per_s": JUNK, "message_latency_s": VALUE}),
    st.fixed_dictionaries({"servers": VALUE}, optional={"gpus_per_server": VALUE, "intra_gbps": VALUE, "inter_gbps": VALUE, "memory_bytes": VALUE}),
    JUNK,
)


@FUZZ
@given(cluster=CLUSTER)
def test_fuzz_cluster_json(cluster: Any) -> None:
    with _workdir() as tmp:
        root = Path(tmp)
        write_good_profile(root / "profile.json")
        (root / "c.json").write_text(json.dumps(cluster))
        _contract(["plan", "--profile", "profile.json", "--cluster", "c.json", "--microbatches", "2", "--out", "o.json"], root)


STAGE = st.one_of(st.fixed_dictionaries({"blocks": st.one_of(st.lists(VALUE, max_size=3), st.tuples(st.integers(-1, 7), st.integers(-1, 7)).map(list)),
                                         "devices": st.one_of(st.lists(st.one_of(st.integers(-1, 3), VALUE), max_size=3), JUNK)}), JUNK)
PLAN = st.fixed_dictionaries(
    {"stages": st.one_of(st.lists(STAGE, max_size=4), JUNK)},
    optional={"num_microbatches": st.one_of(st.integers(-2, 8), VALUE), "schedule": st.one_of(st.sampled_from(["1f1b", "gpipe", "interleaved", "x"]), JUNK),
              "sliced_microbatches": VALUE, "cluster": CLUSTER},
)


@FUZZ
@given(plan=PLAN)
def test_fuzz_plan_json(plan: dict[str, Any]) -> None:
    with _workdir() as tmp:
        root = Path(tmp)
        write_good_profile(root / "profile.json")
        (root / "plan.json").write_text(json.dumps(plan))
        _contract(["simulate", "--profile", "profile.json", "--plan", "plan.json", "--gpus", "4", "--inter-gbps", "10", "--trace", "t.json"], root)


@FEW
@given(data=st.binary(max_size=64), which=st.sampled_from(["profile", "cluster", "plan", "catalog", "trace", "throughputs"]))
def test_fuzz_binary_and_non_utf8_files(data: bytes, which: str) -> None:
    with _workdir() as tmp:
        root = Path(tmp)
        write_good_profile(root / "profile.json")
        (root / "f.bin").write_bytes(b"\xff\xfe" + data)
        argv = {
            "profile": ["plan", "--profile", "f.bin", "--gpus", "2", "--inter-gbps", "1", "--microbatches", "2"],
            "cluster": ["plan", "--profile", "profile.json", "--cluster", "f.bin", "--microbatches", "2"],
            "plan": ["simulate", "--profile", "profile.json", "--plan", "f.bin", "--gpus", "2", "--inter-gbps", "1"],
            "catalog": ["prices", "show", "--catalog", "f.bin"],
            "trace": ["cost-sim", "--trace", "f.bin", "--throughputs", "f.bin"],
            "throughputs": ["cost-sim", "--trace", "f.bin", "--throughputs", "f.bin", "--days", "1"],
        }[which]
        _contract(argv, root)


PRICE_CSV = st.lists(st.lists(st.one_of(st.sampled_from(["aws", "gcp", "V100", "us-east-1", "p3.2xlarge", "1", "0.9", "-1", "nan", "True", "2024-01-01"]), st.text(max_size=5)), min_size=1, max_size=8), max_size=5)
HEADERS = ["cloud,region,zone,instance_type,gpu_type,gpu_count,usd_per_hour,spot,timestamp", "InstanceType,SpotPrice,Timestamp,AvailabilityZone", "x,y", ""]


@FEW
@given(header=st.sampled_from(HEADERS), rows=PRICE_CSV, command=st.sampled_from(["show", "cheapest", "cost-sim"]))
def test_fuzz_price_files(header: str, rows: list[list[str]], command: str) -> None:
    with _workdir() as tmp:
        root = Path(tmp)
        (root / "prices.csv").write_text("\n".join([header] + [",".join(r) for r in rows]))
        (root / "tp.csv").write_text("model,gpu_type,gpu_count,throughput\nm,V100,1,abc\n")
        argv = {
            "show": ["prices", "show", "--catalog", "prices.csv", "--json"],
            "cheapest": ["prices", "cheapest", "--catalog", "prices.csv", "--gpu", "V100", "--count", "1"],
            "cost-sim": ["cost-sim", "--trace", "prices.csv", "--throughputs", "tp.csv", "--days", "1"],
        }[command]
        _contract(argv, root)


# ----- flags of every subcommand -----
FLAG_VALUE = st.one_of(st.sampled_from(["0", "-1", "1", "2", "3", "nan", "inf", "-inf", "1e9", "1e308", "2.5", "x", "", "4,x", "1,2"]), st.integers(-3, 10).map(str))
PLAN_FLAGS = ["--gpus", "--servers", "--intra-gbps", "--inter-gbps", "--memory-gib", "--microbatches", "--max-stages", "--algorithm", "--schedule"]


@FUZZ
@given(values=st.dictionaries(st.sampled_from(PLAN_FLAGS), FLAG_VALUE, max_size=5),
       switches=st.sets(st.sampled_from(["--json", "--straight", "--interleave", "--ignore-memory"])),
       outs=st.dictionaries(st.sampled_from(["--out", "--trace", "--png"]), st.sampled_from(["new", "dir", "link", "fifo", "under-file", "proc", "device", "empty"]), max_size=2))
def test_fuzz_plan_flags(values: dict[str, str], switches: set[str], outs: dict[str, str]) -> None:
    with _workdir() as tmp:
        root = Path(tmp)
        write_good_profile(root / "profile.json")
        targets = _special(root)
        argv = ["plan", "--profile", "profile.json", "--gpus", "2", "--inter-gbps", "10", "--microbatches", "2"]
        for flag, value in values.items():
            argv += [f"{flag}={value}"]
        argv += sorted(switches)
        for flag, kind in outs.items():
            argv += [f"{flag}={targets[kind]}"]
        _contract(argv, root)


@FEW
@given(values=st.dictionaries(st.sampled_from(["--microbatch-size", "--repeats", "--input-shape", "--factory", "--model"]), FLAG_VALUE, max_size=3),
       out=st.sampled_from(["dir", "link", "fifo", "under-file", "proc", "device", "empty"]))
def test_fuzz_profile_flags_refused_before_profiling(values: dict[str, str], out: str) -> None:
    # every --out here is refused, so no example pays for a real profiling run
    with _workdir() as tmp:
        root = Path(tmp)
        write_good_profile(root / "profile.json")
        argv = ["profile", f"--out={_special(root)[out]}"] + [f"{k}={v}" for k, v in values.items()]
        run = _contract(argv, root)
        assert run.code == 2


@FEW
@given(flags=st.dictionaries(st.sampled_from(["--days", "--checkpoint-gb", "--model", "--start", "--limit", "--count", "--gpu", "--cloud"]), FLAG_VALUE, max_size=3),
       command=st.sampled_from(["cost-sim", "prices show", "prices cheapest", "prices refresh"]))
def test_fuzz_cloud_flags(flags: dict[str, str], command: str) -> None:
    with _workdir() as tmp:
        root = Path(tmp)
        argv = command.split()
        if command == "cost-sim":
            argv += ["--trace", "missing.csv", "--throughputs", "missing.json"]
        if command == "prices refresh":  # never a real cloud: only names that must be refused before any network call
            flags = dict(flags, **{"--cloud": flags.get("--cloud", "x") + "-nope"})
        argv += [f"{k}={v}" for k, v in flags.items() if not (command.startswith("prices") and k in ("--days", "--checkpoint-gb", "--model", "--start"))]
        _contract(argv, root)


@FEW
@given(argv=st.lists(st.one_of(st.sampled_from(["plan", "simulate", "profile", "demo", "checkpoint", "verify", "copy", "prices", "cost-sim", "--out", "--json", "-h", "--nope"]), st.text(max_size=6)), max_size=5))
def test_fuzz_argv_soup(argv: list[str]) -> None:
    if "demo" in argv and not any(a.startswith("-") for a in argv):
        argv = argv + ["--out", "profile.json"]  # never run the real demo here: an out path that is a file is refused
    with _workdir() as tmp:
        root = Path(tmp)
        write_good_profile(root / "profile.json")
        _contract(argv, root)


# ----- loaders called directly -----
@FUZZ
@given(payload=st.one_of(PROFILE, CLUSTER, PLAN, JUNK))
def test_fuzz_loaders_raise_only_user_errors(payload: Any) -> None:
    from orchestrator.core import cluster as cl
    from orchestrator.core.plan import Plan
    from orchestrator.core.profile import Profile

    loaders: list[Callable[[Any], Any]] = [Profile.from_dict, cl.from_dict, Plan.from_dict]
    for load in loaders:
        try:
            load(payload)
        except UserError as exc:
            assert "\n" not in str(exc)


@FUZZ
@given(lines=st.lists(GRAPH_LINE, max_size=8))
def test_fuzz_graph_loader_raises_only_user_errors(lines: list[str]) -> None:
    from orchestrator.core.profile_loader import parse_graph_txt

    try:
        parse_graph_txt("\n".join(lines), "fuzz")
    except UserError as exc:
        assert "\n" not in str(exc)


@FEW
@given(header=st.sampled_from(HEADERS), rows=PRICE_CSV, suffix=st.sampled_from([".csv", ".json", ".txt"]))
def test_fuzz_price_importers_raise_only_cloud_errors(header: str, rows: list[list[str]], suffix: str) -> None:
    from cloud.errors import CloudError
    from cloud.importers import load_any

    with _workdir() as tmp:
        path = Path(tmp) / f"prices{suffix}"
        path.write_text("\n".join([header] + [",".join(r) for r in rows]))
        try:
            load_any(path)
        except CloudError as exc:
            assert "\n" not in str(exc)


def test_checkpoint_verify_on_junk_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "step_00000001").mkdir()
    (tmp_path / "step_00000001" / "manifest.json").write_bytes(b"\xff\x00junk")
    for target in ("step_00000001", "missing", "."):
        _contract(["checkpoint", "verify", target], tmp_path)


@pytest.mark.parametrize("out", ["file", "link", "fifo", "under-file", "proc", "device", "empty"])
def test_demo_refuses_a_bad_output_folder(tmp_path: Path, out: str) -> None:
    write_good_profile(tmp_path / "profile.json")
    target = "profile.json" if out == "file" else _special(tmp_path)[out]
    assert _contract(["demo", "--out", target], tmp_path).code == 2
