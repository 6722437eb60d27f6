"""The CLI: JSON output contract and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.commands import main
from tests.helpers import random_profile


@pytest.fixture()
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "p.json"
    random_profile(12, 3).save(path)
    return path


def test_plan_json_contract(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--profile", str(profile_file), "--gpus", "8", "--servers", "2", "--intra-gbps", "100",
               "--inter-gbps", "10", "--algorithm", "pipedream", "--microbatches", "8", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("algorithm", "num_stages", "stages", "iteration_time_s", "bottleneck_s", "lower_bound_s", "planning_time_s"):
        assert key in out
    assert out["num_stages"] == len(out["stages"])
    assert out["stages"][0]["blocks"][0] == 0 and out["stages"][-1]["blocks"][1] == 12
    assert out["iteration_time_s"] >= out["lower_bound_s"] > 0


def test_plan_then_simulate_with_trace(profile_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    assert main(["plan", "--profile", str(profile_file), "--gpus", "4", "--inter-gbps", "10", "--algorithm", "even",
                 "--microbatches", "4", "--out", str(plan)]) == 0
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    capsys.readouterr()
    assert main(["simulate", "--profile", str(profile_file), "--plan", str(plan), "--trace", str(trace), "--png", str(png), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    saved = json.loads(plan.read_text())
    assert summary["iteration_s"] == pytest.approx(saved["iteration_time_s"])
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" and e["name"].endswith("F0") for e in events)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "--profile", "/nonexistent.json", "--gpus", "2", "--inter-gbps", "10", "--microbatches", "2"], "cannot read profile"),
        (["plan", "--profile", "{p}", "--gpus", "2", "--inter-gbps", "10", "--microbatches", "2", "--algorithm", "nope"], "unknown algorithm"),
        (["plan", "--profile", "{p}", "--gpus", "2", "--inter-gbps", "0", "--microbatches", "2"], "bandwidth must be"),
        (["plan", "--profile", "{p}", "--gpus", "2", "--inter-gbps", "-3", "--microbatches", "2"], "bandwidth must be"),
        (["plan", "--profile", "{p}", "--gpus", "4", "--inter-gbps", "10", "--microbatches", "2", "--max-stages", "9"], "stages"),
        (["plan", "--profile", "{p}", "--gpus", "2", "--inter-gbps", "10", "--microbatches", "2", "--memory-gib", "0.001"], "does not fit"),
        (["plan", "--profile", "{bad}", "--gpus", "2", "--inter-gbps", "10", "--microbatches", "2"], "profile"),
        (["plan", "--profile", "{p}", "--cluster", "{disc}", "--microbatches", "2"], "not connected"),
        (["plan", "--profile", "{p}"], "required"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv: list[str], message: str, profile_file: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "raypipe-profile", "blocks": [{"name": "a", "forward_s": "x"}]}')
    disc = tmp_path / "disc.json"
    disc.write_text(json.dumps({"devices": [{}, {}, {}], "bandwidth_gbps": [[0, 1, 0], [1, 0, 0], [0, 0, 0]]}))
    argv = [a.format(p=profile_file, bad=bad, disc=disc) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "orchestrator", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert message in lines[0]


def test_plan_does_not_import_pandas(profile_file: Path) -> None:
    """``plan`` parses without the cloud commands, whose module imports pandas (≈ 0.6 s, 35 MB per call);
    the cloud commands and the top-level help still have them."""
    code = ("import sys; from orchestrator.cli.commands import main, build_parser; "
            f"rc = main(['plan', '--profile', {str(profile_file)!r}, '--gpus', '2', '--inter-gbps', '10', "
            "'--algorithm', 'even', '--microbatches', '2', '--json']); "
            "print(rc, 'pandas' in sys.modules, 'prices' in build_parser(['--help'])._subparsers._group_actions[0].choices)")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": ""}, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 False True"
