"""Input files and streams, each kind of issue 29's hostile inputs as its own regression case.

Every case: exit 2, one line on stderr, no traceback, nothing in the folder created, changed or
removed (``tests.fuzz_helpers.check_contract``). The cases that could hang (a FIFO as an input) or
that need a real file descriptor (``> /dev/full``) run as real processes under a time limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz_helpers import check_contract, run_cli, snapshot, write_good_profile

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["plan", "--profile", "good.json", "--gpus", "2", "--inter-gbps", "10", "--microbatches", "4"]
BLOCK = {"name": "b", "forward_s": 0.001, "backward_s": 0.002, "activation_bytes": 1e6, "param_bytes": 1e6}
GOOD_PLAN = {"format": "raypipe-plan", "stages": [{"blocks": [0, 3], "devices": [0]}, {"blocks": [3, 6], "devices": [1]}],
             "num_microbatches": 4}
CLUSTER = {"devices": [{"speed": 1.0}, {"speed": 1.0}], "bandwidth_gbps": [[0, 10], [10, 0]]}


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    write_good_profile(tmp_path / "good.json")
    (tmp_path / "plan.json").write_text(json.dumps(GOOD_PLAN))
    (tmp_path / "cluster.json").write_text(json.dumps(CLUSTER))
    return tmp_path


def refused(argv: list[str], root: Path, message: str) -> str:
    before = snapshot(root)
    run = run_cli(argv, root)
    check_contract(run, before, snapshot(root), argv)
    assert run.code == 2, run.out
    assert message in run.err, run.err
    return run.err


def process(argv: list[str], cwd: Path, stdout: Any = subprocess.PIPE, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "orchestrator", *argv], cwd=cwd, stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=timeout, env=env)


def simulate(profile: str = "good.json", plan: str = "plan.json") -> list[str]:
    return ["simulate", "--profile", profile, "--plan", plan, "--gpus", "2", "--inter-gbps", "1"]


# ----- inputs must be regular files; a FIFO never blocks -----
@pytest.mark.parametrize("flag", ["--profile", "--plan", "--cluster"])
def test_a_fifo_as_input_is_refused_at_once(work: Path, flag: str) -> None:
    os.mkfifo(work / "fifo")
    argv = {"--profile": simulate(profile="fifo"), "--plan": simulate(plan="fifo"),
            "--cluster": ["simulate", "--profile", "good.json", "--plan", "plan.json", "--cluster", "fifo"]}[flag]
    before = snapshot(work)
    proc = process(argv, work, timeout=120)  # before: blocked forever waiting for a writer
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is a FIFO; an input must be a regular file" in proc.stderr
    assert snapshot(work) == before


@pytest.mark.parametrize("target, message", [("/dev/zero", "is a device"), (".", "is a directory"), ("missing.json", "No such file")])
def test_other_non_regular_inputs(work: Path, target: str, message: str) -> None:
    refused(simulate(profile=target), work, message)


def test_a_symlink_to_a_regular_input_is_fine(work: Path) -> None:
    (work / "alias.json").symlink_to(work / "good.json")
    assert run_cli(simulate(profile="alias.json"), work).code == 0


# ----- an output that is also an input -----
@pytest.mark.parametrize("argv", [
    PLAN + ["--trace", "good.json"],
    PLAN + ["--out", "good.json"],
    simulate() + ["--trace", "plan.json"],
    simulate() + ["--png", "good.json"],
    ["simulate", "--profile", "good.json", "--plan", "plan.json", "--cluster", "cluster.json", "--trace", "cluster.json"],
])
def test_an_output_that_is_an_input_is_refused(work: Path, argv: list[str]) -> None:
    refused(argv, work, "input")


def test_the_same_input_through_a_link_is_still_refused(work: Path) -> None:
    (work / "alias.json").symlink_to(work / "good.json")
    refused(PLAN + ["--trace", "alias.json"], work, "")


def test_the_python_api_may_save_a_profile_where_it_read_it(work: Path) -> None:
    from orchestrator.core.profile_loader import load_profile

    load_profile(work / "good.json").save(work / "good.json")  # outside a command nothing is remembered


# ----- duplicate keys, unknown fields, versions, format kinds, contradictions -----
def _profile(**top: Any) -> str:
    return json.dumps({"format": "raypipe-profile", "blocks": [dict(BLOCK), dict(BLOCK, name="c")], **top})


CASES = [
    ("profile: duplicate key", "p.json", '{"format": "raypipe-profile", "blocks": [], "blocks": []}', "key 'blocks' appears twice"),
    ("profile: duplicate key in a block", "p.json",
     '{"format": "raypipe-profile", "blocks": [{"name": "a", "forward_s": 1, "forward_s": 2, "backward_s": 1, '
     '"activation_bytes": 1, "param_bytes": 1}]}', "key 'forward_s' appears twice"),
    ("profile: misspelt field", "p.json", _profile(microbatch_sise=4), "did you mean 'microbatch_size'"),
    ("profile: misspelt block field", "p.json",
     json.dumps({"format": "raypipe-profile", "blocks": [dict(BLOCK, activaton_bytes=1)]}), "did you mean 'activation_bytes'"),
    ("profile: future version", "p.json", _profile(version=2), "unsupported format version 2"),
    ("profile: version a string", "p.json", _profile(version="1"), "unsupported format version '1'"),
    ("profile: negative weight_s", "p.json",
     json.dumps({"format": "raypipe-profile", "blocks": [dict(BLOCK, weight_s=-1)]}), "weight_s must be >= 0"),
    ("profile: a plan file", "p.json", json.dumps(GOOD_PLAN | {"format": "raypipe-plan"}), "is a raypipe-plan file, not a profile"),
]


@pytest.mark.parametrize("what, name, text, message", CASES, ids=[c[0] for c in CASES])
def test_profile_files_are_strict(work: Path, what: str, name: str, text: str, message: str) -> None:
    (work / name).write_text(text)
    refused(simulate(profile=name), work, message)


def _plan(**change: Any) -> str:
    return json.dumps({**GOOD_PLAN, **change})


PLAN_CASES = [
    ("duplicate key", '{"stages": [{"blocks": [0, 6], "devices": [0]}], "num_microbatches": 4, "num_microbatches": 8}',
     "key 'num_microbatches' appears twice"),
    ("misspelt stage field", _plan(stages=[{"blocks": [0, 6], "devcies": [0], "devices": [0]}]), "did you mean 'devices'"),
    ("misspelt top field", _plan(num_microbatch=4), "did you mean 'num_microbatches'"),
    ("future version", _plan(version=7), "unsupported format version 7"),
    ("a profile file", _profile(), "is a raypipe-profile file, not a plan"),
    ("a cluster file", json.dumps({"format": "raypipe-cluster", **CLUSTER}), "is a raypipe-cluster file, not a plan"),
    ("num_stages contradicts", _plan(num_stages=3), "\"num_stages\" is 3 but the stages make 2"),
    ("virtual_chunks contradicts", _plan(virtual_chunks=2), "\"virtual_chunks\" is 2 but the stages make 1"),
    ("algorithm not a string", _plan(algorithm=["x"]), "algorithm must be a string"),
]


@pytest.mark.parametrize("what, text, message", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_plan_files_are_strict(work: Path, what: str, text: str, message: str) -> None:
    (work / "bad.json").write_text(text)
    refused(simulate(plan="bad.json"), work, message)


CLUSTER_CASES = [
    ("duplicate key", '{"devices": [{"speed": 1, "speed": 2}, {}], "bandwidth_gbps": [[0, 1], [1, 0]]}', "key 'speed' appears twice"),
    ("misspelt device field", json.dumps({**CLUSTER, "devices": [{"sped": 1.0}, {}]}), "did you mean 'speed'"),
    ("misspelt top field", json.dumps({**CLUSTER, "message_latency": 0.001}), "did you mean 'message_latency_s'"),
    ("unknown device kind", json.dumps({**CLUSTER, "devices": [{"kind": "tpu"}, {}]}), "unknown kind 'tpu'"),
    ("both bandwidth keys", json.dumps({**CLUSTER, "bandwidth_bytes_per_s": [[0, 1], [1, 0]]}), "not both"),
    ("future version", json.dumps({**CLUSTER, "version": 2}), "unsupported format version 2"),
    ("a plan file", json.dumps(GOOD_PLAN), "is a raypipe-plan file, not a cluster"),
]


@pytest.mark.parametrize("what, text, message", CLUSTER_CASES, ids=[c[0] for c in CLUSTER_CASES])
def test_cluster_files_are_strict(work: Path, what: str, text: str, message: str) -> None:
    (work / "bad.json").write_text(text)
    refused(PLAN[:3] + ["--cluster", "bad.json", "--microbatches", "4"], work, message)


def test_files_the_project_wrote_still_load(work: Path) -> None:
    """Every file the commands write is read back by the strict loaders: plan --out (with its result fields and
    cluster), a profile, ``cluster --json``-style reports (node_id, accelerator, ...)."""
    assert run_cli(PLAN + ["--out", "written.json"], work).code == 0
    assert run_cli(simulate(plan="written.json"), work).code == 0
    assert run_cli(["simulate", "--profile", "good.json", "--plan", "written.json"], work).code == 0  # its own cluster
    report = {"devices": [{"device": i, "node_id": f"abc{i}", "kind": "cpu", "accelerator": "", "speed": 1.0,
                           "speed_source": "probe", "memory_bytes": 2.0**30, "actual_device": "cpu", "device_name": "x"}
                          for i in range(2)], "bandwidth_gbps": [[0, 5], [5, 0]], "message_latency_s": 0.0001}
    (work / "found.json").write_text(json.dumps(report))
    assert run_cli(PLAN[:3] + ["--cluster", "found.json", "--microbatches", "4"], work).code == 0
    legacy = json.loads((work / "good.json").read_text())
    legacy.pop("version")  # written before versions were recorded
    (work / "legacy.json").write_text(json.dumps(legacy))
    assert run_cli(simulate(profile="legacy.json"), work).code == 0


# ----- flags -----
@pytest.mark.parametrize("extra", [["--gpus", "2"], ["--inter-gbps", "5"], ["--memory-gib", "16"]])
def test_cluster_flags_and_a_cluster_file_are_not_mixed(work: Path, extra: list[str]) -> None:
    refused(["simulate", "--profile", "good.json", "--plan", "plan.json", "--cluster", "cluster.json", *extra], work, "not both")


@pytest.mark.parametrize("slots, message", [("0", "must be >= 1"), ("100000", "above the limit 64"), ("-3", "must be >= 1")])
def test_cluster_slots_are_bounded_before_anything_starts(work: Path, slots: str, message: str) -> None:
    refused(["cluster", "--slots", slots], work, message)


# ----- streams and endpoints -----
@pytest.mark.parametrize("argv", [PLAN, PLAN + ["--json"], ["checkpoint", "verify", "nothing"]])
def test_stdout_that_cannot_be_written_is_one_line(work: Path, argv: list[str]) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        proc = process(argv, work, stdout=full)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert "cannot write to standard output: No space left on device" in proc.stderr or "no checkpoint" in proc.stderr


def test_an_unreachable_gs_endpoint_is_one_line_soon(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.servers import free_port

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    t0 = time.monotonic()
    err = refused(["checkpoint", "verify", "gs://bucket/run"], work, "storage endpoint unreachable (http://127.0.0.1:")
    assert "gs://bucket/run" in err
    assert time.monotonic() - t0 < 60  # before: 44 s of retries and a 49-line traceback; now one connect
