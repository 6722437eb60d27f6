"""Watchers against loopback metadata servers, with a dead proxy in the environment: every test
here would fail if the watchers let urllib route link-local requests through HTTP(S)_PROXY."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from cloud.preemption import AwsSpotWatcher, AzureScheduledEventsWatcher, GcpPreemptionWatcher, watcher_for


@pytest.fixture(autouse=True)
def dead_proxy(monkeypatch):
    """A proxy that refuses every connection, for every scheme, and nothing exempted."""
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(key, "http://127.0.0.1:9")
    for key in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(key, raising=False)


def collect():
    got: list[datetime] = []
    event = threading.Event()

    def callback(deadline: datetime) -> None:
        got.append(deadline)
        event.set()

    return got, event, callback


def test_aws_imdsv2_token_then_instance_action(loopback):
    state = {"polls": 0}

    def route(method, path, headers):
        if method == "PUT" and path == "/latest/api/token":
            assert headers["x-aws-ec2-metadata-token-ttl-seconds"]
            return 200, "TOKEN123"
        assert headers.get("x-aws-ec2-metadata-token") == "TOKEN123"
        if path.endswith("/rebalance"):
            return 404, "Not Found"
        state["polls"] += 1
        if state["polls"] < 3:
            return 404, "Not Found"
        return 200, {"action": "terminate", "time": "2024-06-01T08:22:00Z"}

    server = loopback(route)
    got, event, callback = collect()
    with AwsSpotWatcher(callback, base_url=server.url, poll_interval_s=0.02) as watcher:
        assert event.wait(5)
    assert got == [datetime(2024, 6, 1, 8, 22, tzinfo=timezone.utc)] and not watcher.running
    assert watcher.notice == "interruption"
    assert sum(1 for m, p, h in server.requests if m == "PUT") == 1


def test_aws_rebalance_is_an_early_warning_not_a_deadline_and_the_watcher_keeps_watching(loopback):
    """A rebalance recommendation goes to on_warning (once); the interruption that follows later is
    still delivered as a deadline, because the watcher does not stop at its first notice."""
    now = datetime(2026, 11, 1, 8, 0, tzinfo=timezone.utc)
    state = {"instance_action": 0}

    def route(method, path, headers):
        if method == "PUT":
            return 200, "T"
        if path.endswith("/rebalance"):
            return 200, {"noticeTime": "2026-11-01T07:59:30Z"}
        state["instance_action"] += 1
        if state["instance_action"] < 6:
            return 404, "Not Found"
        return 200, {"action": "terminate", "time": "2026-11-01T08:02:00Z"}

    server = loopback(route)
    got, event, callback = collect()
    warnings: list[tuple[str, datetime]] = []
    with AwsSpotWatcher(callback, base_url=server.url, poll_interval_s=0.02, clock=lambda: now,
                        on_warning=lambda kind, at: warnings.append((kind, at))) as watcher:
        assert event.wait(5)
        polls = state["instance_action"]
        while state["instance_action"] < polls + 3:  # still polling after the notice
            time.sleep(0.01)
    assert warnings == [("rebalance", datetime(2026, 11, 1, 7, 59, 30, tzinfo=timezone.utc))]
    assert got == [datetime(2026, 11, 1, 8, 2, tzinfo=timezone.utc)]  # one deadline, not repeated per poll
    assert watcher.notice == "interruption"


def test_a_changed_deadline_is_delivered_again(loopback):
    times = iter(["2026-11-01T08:02:00Z"] * 3 + ["2026-11-01T08:05:00Z"] * 1000)

    def route(method, path, headers):
        if method == "PUT":
            return 200, "T"
        if path.endswith("/rebalance"):
            return 404, ""
        return 200, {"action": "stop", "time": next(times)}

    server = loopback(route)
    got: list[datetime] = []
    two = threading.Event()

    def callback(deadline: datetime) -> None:
        got.append(deadline)
        if len(got) == 2:
            two.set()

    with AwsSpotWatcher(callback, base_url=server.url, poll_interval_s=0.02):
        assert two.wait(5)
    assert got == [datetime(2026, 11, 1, 8, 2, tzinfo=timezone.utc), datetime(2026, 11, 1, 8, 5, tzinfo=timezone.utc)]


def test_gce_host_maintenance_terminate_is_a_deadline_migrate_a_warning(loopback):
    events = iter(["NONE", "MIGRATE_ON_HOST_MAINTENANCE"] + ["TERMINATE_ON_HOST_MAINTENANCE"] * 1000)

    def route(method, path, headers):
        assert headers.get("metadata-flavor") == "Google"
        if path.startswith("/computeMetadata/v1/instance/maintenance-event"):
            return 200, next(events)
        return 200, "FALSE", {"ETag": "e1"}

    server = loopback(route)
    got, event, callback = collect()
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    warnings: list[tuple[str, datetime]] = []
    with GcpPreemptionWatcher(callback, base_url=server.url, poll_interval_s=0.02, clock=lambda: now,
                              on_warning=lambda kind, at: warnings.append((kind, at))) as watcher:
        assert event.wait(10)
    assert got == [now + timedelta(hours=1)] and watcher.notice == "maintenance-terminate"
    assert warnings == [("maintenance-migrate", now)]


def test_azure_first_scheduled_events_call_may_be_slow(loopback):
    """The first call starts the service and may take up to two minutes: it is not cut off at the
    normal request timeout (0.2 s here; the server takes 1 s the first time)."""
    calls = {"n": 0}

    def route(method, path, headers):
        calls["n"] += 1
        if calls["n"] == 1:
            time.sleep(1.0)
        return 200, {"DocumentIncarnation": 1, "Events": [{"EventId": "1", "EventType": "Preempt",
                                                            "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}]}

    server = loopback(route)
    got, event, callback = collect()
    watcher = AzureScheduledEventsWatcher(callback, base_url=server.url, poll_interval_s=0.02, request_timeout_s=0.2)
    assert watcher.poll_once() == datetime(2016, 9, 19, 18, 29, 47, tzinfo=timezone.utc) and watcher.failures == 0


def test_gcp_reads_the_etag_then_waits_for_change_with_it(loopback):
    flips = {"n": 0}

    def route(method, path, headers):
        assert headers.get("metadata-flavor") == "Google"
        if path.startswith("/computeMetadata/v1/instance/maintenance-event"):
            return 200, "NONE"
        flips["n"] += 1
        etag = f"etag{flips['n']}"
        return 200, "TRUE" if flips["n"] >= 3 else "FALSE", {"ETag": etag}

    server = loopback(route)
    got, event, callback = collect()
    now = datetime(2024, 1, 1, tzinfo=timezone.utc)
    with GcpPreemptionWatcher(callback, base_url=server.url, poll_interval_s=0.02, clock=lambda: now):
        assert event.wait(5)
    assert got == [now + timedelta(seconds=30)]
    paths = [p for _, p, _ in server.requests if "maintenance-event" not in p]
    assert paths[0] == "/computeMetadata/v1/instance/preempted"  # first read: value + ETag
    assert "wait_for_change=true" in paths[1] and "last_etag=etag1" in paths[1]
    assert "last_etag=etag2" in paths[2]


def test_azure_scheduled_events_preempt(loopback):
    def route(method, path, headers):
        assert headers.get("metadata") == "true" and "api-version=2020-07-01" in path
        return 200, {"DocumentIncarnation": 2, "Events": [
            {"EventId": "1", "EventType": "Freeze", "NotBefore": ""},
            {"EventId": "2", "EventType": "Preempt", "ResourceType": "VirtualMachine", "Resources": ["vm1"],
             "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}]}

    server = loopback(route)
    got, event, callback = collect()
    watcher = watcher_for("az", callback, base_url=server.url, poll_interval_s=0.02).start()
    assert event.wait(5)
    watcher.stop()
    assert got == [datetime(2016, 9, 19, 18, 29, 47, tzinfo=timezone.utc)]


def test_no_notice_means_no_callback_and_stop_is_prompt(loopback):
    server = loopback(lambda m, p, h: (200, {"DocumentIncarnation": 1, "Events": []}))
    got, event, callback = collect()
    watcher = AzureScheduledEventsWatcher(callback, base_url=server.url, poll_interval_s=0.05).start()
    waited = 0
    while len(server.requests) < 3 and waited < 1000:  # three polls, however loaded the machine
        time.sleep(0.01)
        waited += 1
    watcher.stop(timeout_s=5.0)
    assert not watcher.running and got == []  # stopped within stop()'s join, with no notice delivered
    assert len(server.requests) >= 3 and watcher.failures == 0


def test_repeated_failures_warn_once_then_recovery_is_logged(loopback, caplog):
    state = {"n": 0}

    def route(method, path, headers):
        state["n"] += 1
        return (500, "oops") if state["n"] <= 4 else (200, {"Events": []})

    server = loopback(route)
    watcher = AzureScheduledEventsWatcher(lambda d: None, base_url=server.url, warn_after=3)
    with caplog.at_level(logging.DEBUG, logger="cloud.preemption"):
        for _ in range(6):
            assert watcher.poll_once() is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "3 metadata polls failed in a row" in warnings[0] and "HTTP 500" in warnings[0]
    assert "reachable again" in warnings[1] and watcher.failures == 0


def test_unreachable_metadata_keeps_polling_and_warns(caplog):
    got, event, callback = collect()
    watcher = AwsSpotWatcher(callback, base_url="http://127.0.0.1:9", poll_interval_s=0.02, request_timeout_s=0.2,
                             warn_after=2)
    with caplog.at_level(logging.WARNING, logger="cloud.preemption"):
        watcher.start()
        deadline = time.monotonic() + 5
        while watcher.failures < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watcher.running
        watcher.stop()
    assert not watcher.running and got == []
    assert any("spot notices may be missed" in r.getMessage() for r in caplog.records)
