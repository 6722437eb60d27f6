import threading
import time
from datetime import datetime, timedelta, timezone

from cloud.preemption import AwsSpotWatcher, AzureScheduledEventsWatcher, GcpPreemptionWatcher, watcher_for


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
        state["polls"] += 1
        if state["polls"] < 3:
            return 404, "Not Found"
        return 200, {"action": "terminate", "time": "2024-06-01T08:22:00Z"}

    server = loopback(route)
    got, event, callback = collect()
    with AwsSpotWatcher(callback, base_url=server.url, poll_interval_s=0.02) as watcher:
        assert event.wait(5)
    assert got == [datetime(2024, 6, 1, 8, 22, tzinfo=timezone.utc)] and not watcher.running
    assert sum(1 for m, p, h in server.requests if m == "PUT") == 1


def test_gcp_preempted_flag(loopback):
    flips = {"n": 0}

    def route(method, path, headers):
        assert headers.get("metadata-flavor") == "Google" and "wait_for_change=true" in path
        flips["n"] += 1
        return 200, "TRUE" if flips["n"] >= 2 else "FALSE"

    server = loopback(route)
    got, event, callback = collect()
    now = datetime(2024, 1, 1, tzinfo=timezone.utc)
    with GcpPreemptionWatcher(callback, base_url=server.url, poll_interval_s=0.02, clock=lambda: now):
        assert event.wait(5)
    assert got == [now + timedelta(seconds=30)]


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
    time.sleep(0.3)
    began = time.perf_counter()
    watcher.stop()
    assert time.perf_counter() - began < 1.0 and not watcher.running and got == []
    assert len(server.requests) >= 3


def test_unreachable_metadata_keeps_polling_without_crash():
    got, event, callback = collect()
    watcher = AwsSpotWatcher(callback, base_url="http://127.0.0.1:9", poll_interval_s=0.02, request_timeout_s=0.2).start()
    time.sleep(0.2)
    assert watcher.running
    watcher.stop()
    assert not watcher.running and got == []
