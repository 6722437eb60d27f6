"""A storage outage is ridden out where the writes are only hints: the job's event segment and the run record's
progress keep training going while the object store is unreachable and catch up when it is back. The store is moto's
S3 server behind a TCP forwarder the test cuts and restores (a real outage: connections refused)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.servers import Forwarder, s3_endpoint  # noqa: F401  # the session's moto server


@pytest.fixture
def flaky_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Forwarder]]:  # noqa: F811
    import uuid

    import boto3

    forwarder = Forwarder(s3_endpoint)
    for name, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{forwarder.port}", "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    bucket = f"raypipe-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    yield f"s3://{bucket}", forwarder
    if not forwarder.up.is_set():
        forwarder.restore()


def test_event_segments_and_progress_ride_out_an_outage_and_catch_up(flaky_bucket: tuple[str, Forwarder], tmp_path: Path) -> None:
    from actors import storage
    from orchestrator.elastic import run_record as rr
    from orchestrator.elastic.run import RunState, SegmentLog, open_run
    from tests.helpers import uniform_profile

    root, forwarder = flaky_bucket
    segment = SegmentLog(root, "job.jsonl")
    segment.append({"event": "job_started"}, force=True)
    opened = open_run(f"{root}/run", uniform_profile(4, fwd=0.01, bwd=0.02, act=1e6, params=1e6), 4, 0, "sgd", "auto", None, None)
    state = RunState(f"{root}/run", opened, None)
    state.started(0)
    forwarder.cut()
    try:
        segment.append({"event": "checkpoint_committed", "step": 3}, force=True)  # buffered, not raised
        assert state.progress(3, lambda: rr.Live(10)) is False  # a hint: no error, no stop seen
        with pytest.raises(storage.StorageError):
            segment.flush()  # asked for explicitly (the job's end): the outage is said
    finally:
        forwarder.restore()
    segment.append({"event": "job_finished"}, force=True)  # back: every buffered line goes up
    lines = [json.loads(x)["event"] for x in storage.read_bytes(storage.join(root, "events", "job.jsonl")).decode().splitlines()]
    assert lines == ["job_started", "checkpoint_committed", "job_finished"]
    import time

    time.sleep(1.1)  # the next beat (progress is written at most once a second)
    state.progress(5, lambda: rr.Live(10))
    assert rr.read(f"{root}/run").steps_done == 5  # type: ignore[union-attr]


def test_a_checkpoint_write_is_done_again_through_an_outage_within_the_bound_and_fails_past_it(
        flaky_bucket: tuple[str, Forwarder]) -> None:
    import time

    import torch

    from actors import checkpoint as ckpt
    from actors import storage

    root, forwarder = flaky_bucket
    payload = {"block": 0, "model": {"w": torch.arange(6.0)}, "optimizer": None, "shapes": {"w": [6]}}
    forwarder.cut()
    threading.Timer(1.5, forwarder.restore).start()  # back while the write retries
    t0 = time.monotonic()
    entry = ckpt.write_payload(f"{root}/step_1", payload, 1, "r1", retry_s=60.0)
    assert time.monotonic() - t0 >= 1.0  # it waited for the store, and wrote
    assert storage.digest(f"{root}/step_1/{entry['file']}") == (entry["sha256"], entry["bytes"])
    forwarder.cut()
    with pytest.raises(storage.StorageFailed, match=r"unreachable.*gave up after 1 s") as failed:
        ckpt.write_payload(f"{root}/step_2", payload, 2, "r1", retry_s=1.0)
    assert not isinstance(failed.value, storage.UserError) and "\n" not in str(failed.value)  # infrastructure, one line


def test_the_supervisor_keeps_its_state_and_events_through_an_outage(flaky_bucket: tuple[str, Forwarder]) -> None:
    from actors import storage
    from orchestrator.supervise.state import EventSegment, StateStore, SupervisorState

    root, forwarder = flaky_bucket
    store, segment = StateStore(root), EventSegment(root, echo=False)
    forwarder.cut()
    segment.emit("cluster_up", cluster="c1")  # a hint: kept, not raised
    threading.Timer(1.5, forwarder.restore).start()
    store.save(SupervisorState(run_id="r1", clusters_made=1))  # what it owns: written once the store is back
    assert store.load() == SupervisorState(run_id="r1", clusters_made=1, heartbeat=store.load().heartbeat)  # type: ignore[union-attr]
    segment.emit("job_submitted", cluster="c1")
    lines = [json.loads(x)["event"] for x in storage.read_bytes(segment.location).decode().splitlines()]
    assert lines == ["cluster_up", "job_submitted"]
