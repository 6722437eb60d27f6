"""Preemption notices from each cloud's instance metadata service, delivered to a callback.

A spot VM gets a short warning before it is taken away (AWS: 2 minutes, GCP: ~30 s, Azure: at
least 30 s). The job manager wants one thing: "you must be gone by <deadline>", so it can write
a checkpoint and ask the migration planner where to go. Each watcher speaks its cloud's protocol,
polls on a daemon thread with bounded per-request timeouts, calls the callback once, and stops
cleanly on :meth:`PreemptionWatcher.stop`. The base URL is injectable for tests.
"""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from .records import utc

log = logging.getLogger(__name__)
METADATA_URL = "http://169.254.169.254"
GCP_METADATA_URL = "http://metadata.google.internal"

Callback = Callable[[datetime], None]


class PreemptionWatcher:
    """Base: ``check()`` returns the deadline of a pending preemption or None; a thread polls it."""

    cloud = ""

    def __init__(self, callback: Callback, base_url: str = METADATA_URL, poll_interval_s: float = 5.0,
                 request_timeout_s: float = 2.0, clock: Callable[[], datetime] | None = None) -> None:
        if poll_interval_s <= 0 or request_timeout_s <= 0:
            raise ValueError("poll interval and request timeout must be positive")
        self.callback = callback
        self.base_url = base_url.rstrip("/")
        self.poll_interval_s = poll_interval_s
        self.request_timeout_s = request_timeout_s
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: datetime | None = None

    def check(self) -> datetime | None:
        raise NotImplementedError

    def _request(self, path: str, headers: dict[str, str], method: str = "GET",
                 timeout: float | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.base_url + path, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.request_timeout_s) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), b""

    def start(self) -> PreemptionWatcher:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"preemption-{self.cloud}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> PreemptionWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                deadline = self.check()
            except (OSError, ValueError) as exc:  # metadata server hiccup: keep polling
                log.debug("%s metadata poll failed: %s", self.cloud, exc)
                deadline = None
            if deadline is not None:
                self.fired = deadline
                self.callback(deadline)
                return
            self._stop.wait(self.poll_interval_s)


class AwsSpotWatcher(PreemptionWatcher):
    """IMDSv2 ``spot/instance-action``: PUT a session token, then GET with it; 404 = no notice."""

    cloud = "aws"
    token_ttl_s = 21600

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._token: str | None = None

    def _fetch_token(self) -> str:
        status, body = self._request("/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)}, "PUT")
        if status != 200:
            raise OSError(f"IMDSv2 token request returned HTTP {status}")
        return body.decode().strip()

    def check(self) -> datetime | None:
        if self._token is None:
            self._token = self._fetch_token()
        status, body = self._request("/latest/meta-data/spot/instance-action", {"X-aws-ec2-metadata-token": self._token})
        if status == 401:  # token expired: get a new one next poll
            self._token = None
            return None
        if status != 200:
            return None
        action = json.loads(body)
        if action.get("action") not in ("terminate", "stop", "hibernate"):
            return None
        return utc(str(action["time"]))


class GcpPreemptionWatcher(PreemptionWatcher):
    """``instance/preempted`` with ``Metadata-Flavor: Google``; hanging GET ``?wait_for_change=true``.

    GCP gives ~30 s from the flip to TRUE, so the deadline is now + ``notice_s``.
    """

    cloud = "gcp"
    notice_s = 30.0

    def __init__(self, callback: Callback, base_url: str = GCP_METADATA_URL, **kwargs: object) -> None:
        super().__init__(callback, base_url, **kwargs)  # type: ignore[arg-type]
        self._etag: str | None = None

    def check(self) -> datetime | None:
        path = "/computeMetadata/v1/instance/preempted?wait_for_change=true&timeout_sec=" + str(max(1, int(self.poll_interval_s)))
        if self._etag:
            path += f"&last_etag={self._etag}"
        status, body = self._request(path, {"Metadata-Flavor": "Google"},
                                     timeout=self.request_timeout_s + self.poll_interval_s)
        if status != 200:
            return None
        if body.decode().strip().upper() == "TRUE":
            return self.clock() + timedelta(seconds=self.notice_s)
        return None


class AzureScheduledEventsWatcher(PreemptionWatcher):
    """Scheduled Events: a ``Preempt`` event's ``NotBefore`` is the deadline."""

    cloud = "azure"
    path = "/metadata/scheduledevents?api-version=2020-07-01"

    def check(self) -> datetime | None:
        status, body = self._request(self.path, {"Metadata": "true"})
        if status != 200:
            return None
        events = json.loads(body).get("Events", [])
        for event in events:
            if event.get("EventType") == "Preempt":
                not_before = event.get("NotBefore") or ""
                parsed = email.utils.parsedate_to_datetime(not_before) if not_before else None
                return utc(parsed) if parsed else self.clock() + timedelta(seconds=30)
        return None


WATCHERS: dict[str, type[PreemptionWatcher]] = {
    "aws": AwsSpotWatcher, "gcp": GcpPreemptionWatcher, "azure": AzureScheduledEventsWatcher,
}


def watcher_for(cloud: str, callback: Callback, **kwargs: object) -> PreemptionWatcher:
    """The watcher of ``cloud`` (aliases accepted), not yet started."""
    from .records import canonical_cloud

    return WATCHERS[canonical_cloud(cloud)](callback, **kwargs)  # type: ignore[arg-type]
