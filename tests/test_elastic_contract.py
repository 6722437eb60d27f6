"""Issue 10's contract, checked from outside: ``examples/elastic_gpt.py`` with a rehearsed notice.

The script runs in a child process (its own Ray instance inherits ``AWS_ENDPOINT_URL`` and the
test credentials of the local moto S3 server): a notice after step 5 on one of 4 devices is
evacuated live (moves, no lost step, no restore), the final weights equal single-process
training, every checkpoint's blocks and commit marker are objects in the bucket, and
``orchestrator checkpoint verify`` accepts the location. Also: the script's size limit and its
one-line answers to bad input.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from actors import waits
from orchestrator.cli.commands import main
from tests.servers import s3_bucket, s3_client, s3_endpoint  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "elastic_gpt.py"


def run(args: list[str], timeout: float = 900, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_", "AZURE_"))}
    env.update(extra, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=waits.stretched(timeout))  # a guard, not a measurement: longer on a loaded machine


def test_example_is_at_most_40_lines_of_code() -> None:
    source = SCRIPT.read_text()
    doc = ast.get_docstring(ast.parse(source)) or ""
    body = source.replace(doc, "", 1)
    lines = [ln for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#") and ln.strip() not in ('"""', '""""""')]
    assert len(lines) <= 40, len(lines)


@pytest.mark.ray
def test_notice_is_evacuated_live_with_checkpoints_in_s3(s3_bucket: str, s3_endpoint: str, tmp_path: Path) -> None:
    root = f"{s3_bucket}/run"
    proc = run(["--steps", "12", "--inject-notice-at", "5", "--notice-s", "30", "--checkpoint-every", "4",
                "--storage", root, "--out", str(tmp_path), "--verify"],
               **{k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "job_started"
    assert sorted(d["device"] for d in events[0]["devices"]) == [0, 1, 2, 3] and all(d["node_id"] for d in events[0]["devices"])
    handled = [e for e in events if e["event"] == "preemption_handled"]
    assert len(handled) == 1 and handled[0]["mode"] == "live" and handled[0]["lost_steps"] == 0
    assert handled[0]["moves"] and all(len(p) == 2 for p in handled[0]["moves"])
    assert isinstance(handled[0]["stall_s"], float) and isinstance(handled[0]["iteration_s"], float)
    assert not [e for e in events if e["event"] == "resumed"]
    diff = re.search(r"^max_abs_diff=(\S+)$", proc.stdout, re.M)
    assert diff is not None and float(diff.group(1)) <= 1e-5, proc.stdout
    bucket, prefix = root[len("s3://"):].split("/", 1)
    keys = [o["Key"] for o in s3_client(s3_endpoint).list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    written = [e["path"] for e in events if e["event"] == "checkpoint"] + [handled[0]["insurance_checkpoint"]]
    for where in written:
        step_prefix = where[len(f"s3://{bucket}/"):]
        assert any(k.startswith(step_prefix + "/block_") for k in keys), (where, keys)
        assert any(k.startswith(step_prefix + "/") and "COMMIT" in k.upper() for k in keys), (where, keys)
    assert not list(tmp_path.glob("checkpoints"))  # nothing went to the local default
    assert main(["checkpoint", "verify", root]) == 0


SECRET = "wJalrXUtnFEMI-not-a-real-key"


@pytest.mark.parametrize("args, env, words", [
    (["--storage", "ftp://host/x"], {}, "unknown storage scheme"),
    (["--inject-notice-at", "3", "--notice-device", "9"], {}, "does not use"),
    (["--storage", "s3://bucket/x"], {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "AKIATEST",
                                      "AWS_SECRET_ACCESS_KEY": SECRET}, "unreachable"),
    (["--storage", "az://container/x"], {}, "AZURE_STORAGE_CONNECTION_STRING"),
])
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], env: dict[str, str], words: str) -> None:
    proc = run([*args, "--out", str(tmp_path)], timeout=300, **env)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert SECRET not in proc.stderr + proc.stdout  # credentials are named, never printed
