"""The supervisor: its state, the merged event log, the price rehearsal's decision, bad input, and
(on real local Ray clusters, with a scripted driver that speaks the job's protocol) a migration, a
lost cluster relaunched elsewhere, a user error reported once, and its own restart adopting the run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cloud.importers import load_any
from cloud.migration import KeepOffer, Migrate, plan_migration
from cloud.throughput import ThroughputTable
from orchestrator.cli.commands import main
from orchestrator.supervise.local import listening, session_processes
from orchestrator.supervise.offers import PRICE_FACTOR, local_offers, write_price_file
from orchestrator.supervise.state import StateStore, SupervisorState, merged_events

ROOT = Path(__file__).resolve().parents[1]


def test_merged_events_order_every_segment_by_time(tmp_path: Path) -> None:
    folder = tmp_path / "events"
    folder.mkdir()
    (folder / "2026-01-01T000000Z-a.jsonl").write_text(
        '{"event": "job_started", "time": "2026-01-01T00:00:01.000000Z"}\n'
        '{"event": "migration_requested", "time": "2026-01-01T00:00:05.000000Z"}\n')
    (folder / "2026-01-01T000006Z-b.jsonl").write_text(
        '{"event": "job_started", "time": "2026-01-01T00:00:06.000000Z"}\n{"event": "cut')  # being written
    (folder / "supervisor-x.jsonl").write_text(
        '{"event": "cluster_up", "time": "2026-01-01T00:00:00.500000Z"}\n'
        '{"event": "migration", "time": "2026-01-01T00:00:07.000000Z"}\n')
    names = [e["event"] for e in merged_events(str(tmp_path))]
    assert names == ["cluster_up", "job_started", "migration_requested", "job_started", "migration"]
    assert main(["events", str(tmp_path)]) == 0
    assert main(["events", str(tmp_path / "nothing")]) == 2


def test_the_price_rehearsal_makes_the_cost_model_move(tmp_path: Path) -> None:
    """``--price-change-at``: the current local offer's price times PRICE_FACTOR; the migration
    planner the job asks (on the price file the supervisor writes) then picks the other cluster."""
    offers = local_offers(2, 4)
    table = load_any(write_price_file(offers, tmp_path / "prices.csv"))
    assert len(table) == 2 and set(table.zone) == {"a", "b"}
    current = offers[0]
    throughputs = ThroughputTable({("job", "V100", 4): 100.0})
    remaining = 64 * 14 * 1e4  # rows x steps left x the job's horizon scale
    from cloud.migration import KeepOffer
    assert isinstance(plan_migration(current, table, throughputs, "job", remaining), KeepOffer)  # equal prices: stay
    raised = table.copy()
    raised.loc[raised.zone == "a", "usd_per_hour"] *= PRICE_FACTOR
    current = replace(current, usd_per_hour=current.usd_per_hour * PRICE_FACTOR)
    decision = plan_migration(current, raised, throughputs, "job", remaining)
    assert isinstance(decision, Migrate) and decision.target.label() == offers[1].label()


def test_state_round_trips_and_a_live_owner_holds_the_run(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path))
    state = SupervisorState(run_id="r1", host=socket.gethostname(), pid=os.getppid(), failed_offers={"x": 1.0})
    saved = store.save(state)
    loaded = store.load()
    assert loaded == saved and loaded.failed_offers == {"x": 1.0}
    assert loaded.owned_by_other(time.time())
    assert not loaded.owned_by_other(time.time() + 3600)  # no heartbeat for an hour
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not SupervisorState(run_id="r1", host=socket.gethostname(), pid=dead.pid, heartbeat=time.time()).owned_by_other(time.time())
    assert state.blocked("x", 100.0, 600.0) and not state.blocked("x", 1000.0, 600.0) and not state.blocked("y", 0, 600)


def test_a_second_supervisor_refuses_a_run_with_a_live_owner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = StateStore(str(tmp_path / "run"))
    store.save(SupervisorState(run_id="r1", host=socket.gethostname(), pid=os.getppid()))
    before = (tmp_path / "run" / "supervisor.json").read_bytes()
    code = main(["run", "--storage", str(tmp_path / "run"), "--", "tests/supervisor_driver.py"])
    err = capsys.readouterr().err
    assert code == 2 and "already supervised" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "run" / "supervisor.json").read_bytes() == before
    assert not (tmp_path / "run" / "events").exists()


@pytest.mark.parametrize("argv, message", [
    (["run", "--storage", "S"], "give the driver after --"),
    (["run", "--storage", "S", "--", "nowhere.py"], "no such Python file"),
    (["run", "--storage", "ftp://x/y", "--", "tests/supervisor_driver.py"], "unknown scheme"),
    (["run", "--storage", "S", "--provider", "existing", "--address", "h:1", "--kill-cluster-at", "3", "--",
      "tests/supervisor_driver.py"], "rehearsal for --provider local only"),
    (["run", "--storage", "S", "--clusters", "1", "--price-change-at", "3", "--", "tests/supervisor_driver.py"], "--clusters must be >= 2"),
    (["run", "--storage", "S", "--price-change-at", "0", "--", "tests/supervisor_driver.py"], "must be >= 1"),
    (["run", "--storage", "S", "--provider", "ray-up", "--gpu", "Z80", "--", "tests/supervisor_driver.py"], "no spot offer"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    argv = [str(tmp_path / "s") if a == "S" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "s").exists()  # nothing half-written


# ----- on real local clusters, with the scripted driver -----
def supervise(tmp_path: Path, *flags: str, driver: tuple[str, ...] = (), timeout: float = 540) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "orchestrator", "run", "--storage", str(tmp_path / "run"), "--out", str(tmp_path / "out"),
           "--cpus", "1", *flags, "--", "tests/supervisor_driver.py", "--step-s", "0.2", *driver]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    path = tmp_path / "out" / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return proc, events


def of(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_price_change_moves_the_run_to_another_cluster_and_stops_the_first(tmp_path: Path) -> None:
    proc, events = supervise(tmp_path, "--price-change-at", "4", driver=("--steps", "7"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done 7 steps" in proc.stdout  # the driver's output, streamed
    (move,) = of(events, "migration")
    assert move["reason"] == "price" and move["step"] == 4 and move["from_cluster"] != move["to_cluster"]
    started = {e["cluster"]: e for e in of(events, "job_started")}
    assert started[move["from_cluster"]]["resumed_from"] is None and started[move["to_cluster"]]["resumed_from"] == 4
    assert started[move["from_cluster"]]["price_events"] == f"4:{PRICE_FACTOR:g}"
    assert started[move["to_cluster"]]["price_events"] is None  # the new job is past the rehearsal
    down = {e["cluster"]: e["address"] for e in of(events, "cluster_down")}
    assert set(down) == {move["from_cluster"], move["to_cluster"]}
    order = [e["event"] for e in events]
    # the old cluster goes only after the new job said it resumed
    assert order.index("job_started", order.index("migration_requested")) < order.index("cluster_down")
    assert not any(listening(address) for address in down.values())
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "finished"


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_killed_cluster_is_relaunched_elsewhere_from_the_last_commit(tmp_path: Path) -> None:
    proc, events = supervise(tmp_path, "--kill-cluster-at", "5", driver=("--steps", "30", "--checkpoint-every", "3"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (lost,) = of(events, "cluster_lost")
    assert lost["last_committed"] and lost["last_committed"] >= 3
    after = [e for e in of(events, "job_started") if e["cluster"] != lost["cluster"]]
    assert len(after) == 1 and after[0]["resumed_from"] == lost["last_committed"]
    offers = {e["cluster"]: e["offer"] for e in of(events, "cluster_up")}
    assert offers[after[0]["cluster"]] != offers[lost["cluster"]]  # the lost offer is blocked for a while
    assert not any(listening(e["address"]) for e in of(events, "cluster_down"))


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_user_error_is_reported_once_and_not_relaunched(tmp_path: Path) -> None:
    proc, events = supervise(tmp_path, driver=("--steps", "6", "--fail-at", "2"))
    assert proc.returncode == 2
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "not relaunched" in err[0] and "a user mistake in the driver" in err[0]
    assert len(of(events, "job_submitted")) == 1 and not of(events, "cluster_lost")
    assert not any(listening(e["address"]) for e in of(events, "cluster_down"))


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_supervisor_killed_mid_migration_is_restarted_adopts_the_target_and_tears_the_source_down(tmp_path: Path) -> None:
    """``kill -9`` of ``orchestrator run`` right after its ``job_submitted`` on a price move's target: its state names
    both clusters, so the same command again adopts the target's job and tears the source down."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "orchestrator", "run", "--storage", str(tmp_path / "run"), "--cpus", "1", "--price-change-at", "3",
           "--", "tests/supervisor_driver.py", "--steps", "20", "--step-s", "0.5"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    assert first.stdout is not None
    submitted = 0
    for line in first.stdout:  # the supervisor's own lines, as it says them
        submitted += line.startswith("[supervisor] job_submitted")
        if submitted == 2:  # the target's job: the source is still up (torn down only once the target resumed)
            first.send_signal(signal.SIGKILL)
            break
    first.wait()
    assert submitted == 2
    owned = StateStore(str(tmp_path / "run")).load()
    assert owned is not None and len(owned.owned) == 2 and owned.cluster == owned.owned[1]
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert second.returncode == 0, second.stderr[-2000:]
    events = merged_events(str(tmp_path / "run"))
    (adopted,) = of(events, "adopted")
    (source,) = [e for e in of(events, "cluster_up") if e["cluster"] != adopted["cluster"]]
    assert [e["cluster"] for e in of(events, "cluster_released")] == [source["cluster"]]
    assert len(of(events, "job_submitted")) == 2 and len(of(events, "job_started")) == 2  # never a third copy
    assert [e["resumed_from"] for e in of(events, "job_started")] == [None, 3]
    assert not session_processes(source["session"]) and not listening(source["address"])
    assert json.loads((tmp_path / "run" / "run.json").read_text())["steps_done"] == 20
    assert StateStore(str(tmp_path / "run")).load().owned == ()  # type: ignore[union-attr]


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_ctrl_c_on_orchestrator_run_stops_the_run_and_tears_its_cluster_down(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "orchestrator", "run", "--storage", str(tmp_path / "run"), "--cpus", "1", "--clusters", "1",
           "--", "tests/supervisor_driver.py", "--steps", "1000", "--step-s", "0.3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    record = tmp_path / "run" / "run.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (record.exists() and (json.loads(record.read_text() or "{}").get("steps_done") or 0) >= 3):
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "stopping the run" in out and json.loads(record.read_text())["status"] == "stopped"
    events = merged_events(str(tmp_path / "run"))
    assert len(of(events, "run_stopped")) == 1 and not of(events, "run_finished") and not of(events, "cluster_lost")
    assert not any(listening(e["address"]) for e in of(events, "cluster_down")) and of(events, "cluster_down")


class Refusing:
    """A provider whose every offer is refused (quota, credentials): the supervisor's failover path."""

    name = "refusing"

    def __init__(self) -> None:
        self.asked: list[str] = []

    def provision(self, offer: str, cluster_id: str) -> Any:
        from orchestrator.supervise.provision import ProvisionError

        self.asked.append(offer)
        raise ProvisionError(f"{offer}: quota exceeded for this instance type")

    def alive(self, handle: Any) -> bool:
        return False

    def teardown(self, handle: Any) -> None:
        raise AssertionError("nothing was provisioned")

    def kill(self, handle: Any) -> None:
        raise AssertionError("nothing was provisioned")


def test_failed_offers_are_failed_over_and_none_left_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.supervise.supervisor import Supervisor, SupervisorConfig

    offers = local_offers(3, 1)
    provider = Refusing()
    config = SupervisorConfig(driver=("tests/supervisor_driver.py",), storage=str(tmp_path / "run"), offers=tuple(offers),
                              out=tmp_path / "out")
    assert Supervisor(config, provider).run() == 2
    assert provider.asked == [o.label() for o in offers]  # cheapest first, each once
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(o.label() in err[0] for o in offers)
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    assert [e["offer"] for e in of(events, "provision_failed")] == provider.asked
    assert all("quota exceeded" in e["reason"] for e in of(events, "provision_failed"))
    state = StateStore(str(tmp_path / "run")).load()
    assert state is not None and set(state.failed_offers) == set(provider.asked)  # remembered, with their time
    # a second run within the block time tries none of them again
    again = Refusing()
    assert Supervisor(config, again).run() == 2 and again.asked == []
