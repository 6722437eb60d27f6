"""Watching, stopping and listing a run from its storage: ``orchestrator status | stop | runs``.

A real driver trains in a subprocess while the commands read its storage from another process: the step grows
between two reads, a stop makes the driver commit its step and exit 0 with the run ``stopped``, a second stop is
one line and exit 2. Bad locations are one line each and write nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actors import checkpoint as ckpt
from orchestrator.elastic import run_record
from tests.fuzz_helpers import run_cli, snapshot
from tests.test_callbacks import DRIVER

ROOT = Path(__file__).resolve().parents[1]


def status(where: Path, cwd: Path) -> dict:  # type: ignore[type-arg]
    out = run_cli(["status", str(where), "--json"], cwd)
    assert out.code == 0, out.err
    return json.loads(out.out)


@pytest.mark.ray
def test_status_grows_while_the_run_trains_and_stop_ends_it_committed(tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.replace("class Boom", "class Quiet").replace("raise ValueError", "pass  #").replace("Boom()", "Quiet()"))
    run = tmp_path / "out" / "checkpoints"
    proc = subprocess.Popen([sys.executable, str(driver), "--steps", "100000", "--devices", "2", "--out", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            record = run_record.read(str(run)) if (run / "run.json").exists() else None
            if record is not None and record.live is not None and record.steps_done >= 3:
                break
            time.sleep(0.5)
        first = status(run, tmp_path)
        assert first["status"] == "running" and isinstance(first["step"], int) and first["target"] == 100000
        assert first["plan"] and first["plan"][0]["blocks"][0] == 0 and first["usd_total"] == 0.0 and first["age_s"] < 60
        assert first["samples_per_s"] > 0 and first["loss"] is not None
        later, grown_by = first, time.monotonic() + 120
        while later["step"] <= first["step"] and time.monotonic() < grown_by:  # grows, however loaded the machine
            time.sleep(1)
            later = status(run, tmp_path)
        assert later["step"] > first["step"]
        listed = run_cli(["runs", str(tmp_path), "--json"], tmp_path)
        assert listed.code == 0 and [json.loads(x)["storage"] for x in listed.out.splitlines()] == [str(run)]
        assert run_cli(["stop", str(run)], tmp_path).code == 0
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        record = run_record.read(str(run))
        assert record is not None and record.status == "stopped" and not (run / run_record.STOP).exists()
        assert ckpt.verify(ckpt.latest(run))["step"] == record.steps_done == record.last_committed  # type: ignore[arg-type]
        again = run_cli(["stop", str(run)], tmp_path)
        assert again.code == 2 and "is stopped, not running" in again.err and len(again.err.strip().splitlines()) == 1
        assert status(run, tmp_path)["status"] == "stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_status_stop_and_runs_refuse_what_holds_no_run_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.json").write_text("{not json")
    before = snapshot(tmp_path)
    for argv, says in ((["status", "empty"], "no run here"), (["stop", "empty"], "no run here"),
                       (["status", "file"], "not a folder"), (["stop", "fifo"], "not a folder"),
                       (["status", "missing"], "no such folder"), (["runs", "empty"], "no run under it"),
                       (["runs", "file"], "not a folder"), (["status", "bad"], "not valid JSON"),
                       (["status", "ftp://x/y"], "unknown storage scheme")):
        out = run_cli(argv, tmp_path)
        assert out.code == 2 and says in out.err and len(out.err.strip().splitlines()) == 1, (argv, out)
    assert snapshot(tmp_path) == before
    listed = run_cli(["runs", ".", "--json"], tmp_path)  # a damaged record is listed as such
    assert listed.code == 0 and json.loads(listed.out)["status"] == "unreadable"


def test_the_ledger_charges_the_price_in_force_from_the_start_and_counts_lost_work_apart() -> None:
    from orchestrator.elastic.ledger import Ledger

    now = [100.0]
    ledger = Ledger(before=2.0, before_lost=0.5, clock=lambda: now[0])
    now[0] += 1800  # half an hour of start-up before the first price is known
    assert ledger.accrue(4.0) == pytest.approx(2.0)  # charged at that first price from the start
    now[0] += 900
    assert ledger.accrue(8.0) == pytest.approx(3.0)  # a price change counts from when it was seen
    now[0] += 450
    ledger.lose(450)  # a recovery's stall at $8/h
    assert ledger.accrue(8.0) == pytest.approx(4.0) and ledger.total == pytest.approx(6.0)
    assert ledger.lost == pytest.approx(1.0) and ledger.before_lost == 0.5
