"""A run outlives its jobs: resume, a final checkpoint, refusals, a failure budget, a stop signal,
and a supervised job asking to be moved.

Every resumed run is checked against uninterrupted single-process training to the same step
(exact), and every refusal against the files it must leave untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from actors import checkpoint as ckpt
from orchestrator import ElasticJob, RunConfig, ScalingConfig, SpotConfig, TrainConfig
from orchestrator.adapt.faults import FaultSchedule, Kill
from orchestrator.core.errors import UserError
from orchestrator.core.plan import straight_plan
from orchestrator.elastic import run_record
from orchestrator.elastic.job_config import AdaptConfig
from orchestrator.elastic.signals import JobFailed, JobStopped, MigrationRequested
from orchestrator.profiling.models import example_batch, loss_fn, mlp

WIDTHS = (8, 16, 16, 16, 16, 16, 16, 16, 4)  # 8 blocks


def train_config(widths: tuple[int, ...] = WIDTHS) -> TrainConfig:
    return TrainConfig(model_factory=partial(mlp, widths), loss_fn=loss_fn("mlp"),
                       optimizer_factory=partial(torch.optim.SGD, lr=0.05, momentum=0.9),
                       data_fn=partial(example_batch, "mlp", 11, widths=widths), num_microbatches=4)


def job(pool: Any, root: Path, devices: int = 4, plan_cuts: list[int] | None = None, **run: Any) -> ElasticJob:
    plan = straight_plan(plan_cuts or [0, 2, 4, 6, 8], 4)
    adapt = run.pop("adapt", AdaptConfig(enabled=False))
    spot = run.pop("spot", SpotConfig(enabled=False))
    widths = run.pop("widths", WIDTHS)
    callbacks = run.pop("callbacks", ())
    return ElasticJob(train_config(widths), ScalingConfig(devices=devices, plan=plan),
                      RunConfig(storage=str(root / "ckpt"), events=root / "events.jsonl", **run), adapt, spot, workers=pool,
                      callbacks=callbacks)


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def started(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "job_started"]


@pytest.mark.ray
def test_a_second_job_resumes_the_run_on_another_plan_and_ends_on_a_committed_checkpoint(worker_group: Any, tmp_path: Path) -> None:
    first = job(worker_group, tmp_path, checkpoint_every=0)  # no periodic checkpoints: only the final one
    try:
        first.fit(5)
    finally:
        first.close()
    assert [p.name for p in sorted((tmp_path / "ckpt").glob("step_*"))] == ["step_00000005"]
    second = job(worker_group, tmp_path, devices=3, plan_cuts=[0, 3, 6, 8], checkpoint_every=0)
    try:
        result = second.fit(9)
        resumed = started(result.events)[-1]
        assert resumed["resumed_from"] == 5 and resumed["step"] == 5 and resumed["run_id"] == started(result.events)[0]["run_id"]
        assert sorted(result.losses) == [5, 6, 7, 8] and second.runtime.step == 9
        assert second.max_abs_diff() <= 1e-5  # against 9 uninterrupted steps
        assert second.fit(9).step == 9 and second.fit(4).step == 9  # at or past the target: at once
    finally:
        second.close()
    assert ckpt.latest(tmp_path / "ckpt").name == "step_00000009"  # type: ignore[union-attr]
    record = run_record.read(str(tmp_path / "ckpt"))
    assert record is not None and record.status == "finished" and record.steps_done == 9 and record.last_committed == 9
    segments = sorted((tmp_path / "ckpt" / "events").glob("*.jsonl"))
    assert len(segments) == 2 and all(json.loads(s.read_text().splitlines()[0])["event"] == "job_started" for s in segments)


def test_a_location_of_another_model_or_run_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    mine = run_record.RunRecord("run-a", "0123456789abcdef", "cfg", steps_done=12, last_committed=12)
    run_record.write(str(root), mine)
    before = tree_digest(tmp_path)
    with pytest.raises(UserError, match="another model"):
        job(None, tmp_path)
    assert tree_digest(tmp_path) == before


def test_resume_modes_refuse_what_they_cannot_do(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="resume='require': no committed checkpoint"):
        job(None, tmp_path, resume="require")
    with pytest.raises(UserError, match="resume="):
        RunConfig(resume="sometimes")
    assert not (tmp_path / "events.jsonl").exists()


@pytest.mark.ray
def test_resume_never_on_a_location_holding_the_run_is_refused(worker_group: Any, tmp_path: Path) -> None:
    first = job(worker_group, tmp_path, checkpoint_every=0)
    try:
        first.fit(2)
    finally:
        first.close()
    before = tree_digest(tmp_path / "ckpt")
    with pytest.raises(UserError, match="resume='never'"):
        job(worker_group, tmp_path, resume="never")
    assert tree_digest(tmp_path / "ckpt") == before


@pytest.mark.ray
def test_deaths_beyond_the_budget_end_the_job_counted_once_with_the_newest_checkpoint_loadable(worker_group: Any, tmp_path: Path) -> None:
    kills = FaultSchedule((Kill(2, 3), Kill(None, 6)))
    j = job(worker_group, tmp_path, checkpoint_every=2, max_failures=1, adapt=AdaptConfig(enabled=False, faults=kills))
    try:
        with pytest.raises(JobFailed, match="2 worker deaths exceed max_failures=1"):
            j.fit(10)
    finally:
        j.close()
    newest = ckpt.latest(tmp_path / "ckpt")
    assert newest is not None and ckpt.verify(newest)["step"] >= 2
    record = run_record.read(str(tmp_path / "ckpt"))
    assert record is not None and record.status == "failed"


@pytest.mark.ray
def test_sigterm_stops_after_the_step_in_flight_on_a_committed_checkpoint(worker_group: Any, tmp_path: Path) -> None:
    j = job(worker_group, tmp_path, checkpoint_every=0)

    def send_when_training() -> None:  # the signal arrives while fit runs, whichever step that is
        deadline = time.monotonic() + 120
        while j.runtime.step < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send_when_training, daemon=True)
    try:
        sender.start()
        with pytest.raises(JobStopped, match="SIGTERM") as stopped:
            j.fit(100_000)
        assert stopped.value.signum == signal.SIGTERM
        step = j.runtime.step
        assert 2 <= step < 100_000
        assert ckpt.verify(ckpt.latest(tmp_path / "ckpt"))["step"] == step  # type: ignore[arg-type]
        assert run_record.read(str(tmp_path / "ckpt")).status == "stopped"  # type: ignore[union-attr]
        assert j.max_abs_diff() <= 1e-5
    finally:
        sender.join()
        j.close()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


@pytest.mark.ray
def test_a_supervised_job_asks_its_supervisor_to_migrate_when_a_price_change_pays(worker_group: Any, tmp_path: Path) -> None:
    catalog = tmp_path / "prices.csv"
    rows = [("local", "a", "a", "cluster-a", 1.0), ("local", "b", "b", "cluster-b", 1.5)]
    catalog.write_text("timestamp,cloud,region,zone,instance_type,gpu_type,gpu_count,spot,usd_per_hour,source,observed_at\n"
                       + "".join(f"2026-11-26T00:00:00Z,{c},{r},{z},{i},V100,4,True,{p},test,2026-11-26T00:00:00Z\n" for c, r, z, i, p in rows))
    spot = SpotConfig(catalog=str(catalog), offer="local/a/cluster-a (spot)", price_events=((3, 4.0),), horizon_scale=1e9)
    j = job(worker_group, tmp_path, checkpoint_every=0, cluster="A", spot=spot)
    try:
        with pytest.raises(MigrationRequested, match="cluster-b"):
            j.fit(10)
        events = j.records
    finally:
        j.close()
    asked = [e for e in events if e["event"] == "migration_requested"]
    assert len(asked) == 1 and asked[0]["step"] == 3 and asked[0]["reason"] == "price" and asked[0]["cluster"] == "A"
    assert started(events)[0]["cluster"] == "A" and started(events)[0]["resumed_from"] is None
    record = run_record.read(str(tmp_path / "ckpt"))
    assert record is not None and record.status == "migrating" and record.migration is not None
    assert record.migration.step == 3 and record.migration.target == "local/b/cluster-b (spot)" and record.last_committed == 3
    assert ckpt.verify(ckpt.latest(tmp_path / "ckpt"))["step"] == 3  # type: ignore[arg-type]


def price_file(path: Path, rows: list[tuple[str, float, str]]) -> Path:
    """Offers ``(instance type, $/h, observed_at)`` of 4 V100s in one local zone each."""
    path.write_text("timestamp,cloud,region,zone,instance_type,gpu_type,gpu_count,spot,usd_per_hour,source,observed_at\n"
                    + "".join(f"{seen},local,{name},{name},{name},V100,4,True,{usd},test,{seen}\n" for name, usd, seen in rows))
    return path


@pytest.mark.ray
def test_old_prices_never_move_the_run_and_only_the_newest_row_of_an_offer_counts(worker_group: Any, tmp_path: Path) -> None:
    old, older = "2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z"
    # cluster-b was cheap two months ago and is expensive in its newest row: it must never win on the old row
    catalog = price_file(tmp_path / "prices.csv", [("cluster-a", 2.0, old), ("cluster-b", 0.5, older), ("cluster-b", 5.0, old),
                                                     ("cluster-c", 1.0, old)])
    spot = SpotConfig(catalog=str(catalog), offer="local/cluster-a/cluster-a (spot)", migration_check_every=2, horizon_scale=1e9)
    j = job(worker_group, tmp_path, checkpoint_every=0, cluster="A", spot=spot)
    try:
        j.fit(4)  # trains on: the cheaper cluster-c is not taken on month-old prices
        events = j.records
    finally:
        j.close()
    offer = started(events)[0]["offer"]
    assert offer["instance_type"] == "cluster-a" and offer["usd_per_hour"] == 2.0 and offer["observed_at"].startswith("2026-01-02")
    skipped = [e for e in events if e["event"] == "migration_skipped"]
    assert skipped and all(e["target"] == "local/cluster-c/cluster-c (spot)" and e["age_s"] > e["max_age_s"] for e in skipped)
    assert not [e for e in events if e["event"] == "migration_requested"] and j.runtime.step == 4


def test_more_devices_than_blocks_is_one_line_before_any_worker_starts(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="devices=6 but the model has 3 blocks"):
        job(None, tmp_path, devices=6, plan_cuts=[0, 1, 2, 3], widths=(8, 16, 16, 4))


@pytest.mark.ray
def test_one_writer_per_run_a_second_job_refuses_naming_the_holder_until_the_first_closes(worker_group: Any, tmp_path: Path) -> None:
    from orchestrator.elastic.lease import LEASE, RunLocked

    first = job(worker_group, tmp_path, checkpoint_every=0)
    try:
        before = tree_digest(tmp_path / "ckpt")
        with pytest.raises(RunLocked, match=rf"being trained by job \w+, pid {os.getpid()} on "):
            job(worker_group, tmp_path, checkpoint_every=0)
        assert tree_digest(tmp_path / "ckpt") == before  # the refused job wrote nothing
        first.fit(2)
    finally:
        first.close()
    assert not (tmp_path / "ckpt" / LEASE).exists()  # released
    # a lease left by a process of this host that is gone is free at once
    (tmp_path / "ckpt" / LEASE).write_text(json.dumps({"owner": "gone", "host": os.uname().nodename, "pid": 2**22 + 12345,
                                                        "cluster": None, "expires_at": time.time() + 3600}))
    # a torn run record does not block a run whose checkpoints are fine; a damaged newer checkpoint is passed over, said
    run_id = run_record.read(str(tmp_path / "ckpt")).run_id  # type: ignore[union-attr]
    (tmp_path / "ckpt" / "run.json").write_text('{"format": "raypipe-run", "ver')
    (tmp_path / "ckpt" / "step_00000050").mkdir()
    second = job(worker_group, tmp_path, checkpoint_every=0)
    try:
        events = second.fit(3).events
        assert events[0]["event"] == "checkpoint_skipped" and events[0]["path"].endswith("step_00000050")
        assert events[1]["event"] == "run_record_rebuilt" and "not valid JSON" in events[1]["reason"]
        assert started(events)[0]["resumed_from"] == 2 and started(events)[0]["run_id"] == run_id
        assert second.max_abs_diff() <= 1e-5
    finally:
        second.close()
    assert run_record.read(str(tmp_path / "ckpt")).run_id == run_id  # type: ignore[union-attr]


def test_other_data_on_a_run_is_refused_unless_forced_and_then_recorded(tmp_path: Path) -> None:
    from orchestrator.elastic.run import open_run
    from tests.helpers import uniform_profile
    from tests.test_checkpoint_places import write_run

    root = str(tmp_path / "ckpt")
    profile = uniform_profile(4, fwd=0.01, bwd=0.02, act=1e6, params=1e6)
    first = open_run(root, profile, 4, 0, "sgd", "auto", None, None, "data-a")
    run_record.write(root, first.record)
    assert open_run(root, profile, 4, 0, "sgd", "auto", None, None, "data-b").record.data_fingerprint == "data-b"  # nothing trained
    write_run(root, 2, run_id=first.record.run_id)  # a committed checkpoint of data-a
    assert open_run(root, profile, 4, 0, "sgd", "auto", None, None, "data-a").data_changed is False
    with pytest.raises(UserError, match=r"trained on other data .*\(--resume force\)"):
        open_run(root, profile, 4, 0, "sgd", "auto", None, None, "data-b")
    forced = open_run(root, profile, 4, 0, "sgd", "force", None, None, "data-b")
    assert forced.data_changed and forced.record.data_fingerprint == "data-b" and forced.record.run_id == first.record.run_id
