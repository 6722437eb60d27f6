"""Preemption notices from each cloud's instance metadata service, delivered to a callback.

A spot VM gets a short warning before it is taken away (AWS: 2 minutes, GCP: ~30 s, Azure: at
least 30 s; a GCE GPU VM, which runs with ``onHostMaintenance: TERMINATE``, gets an hour before
host maintenance stops it). The job manager wants "you must be gone by <deadline>", so it can
evacuate or checkpoint; each watcher speaks its cloud's protocol, polls on a daemon thread with
bounded per-request timeouts, calls ``callback(deadline)`` for each *new* deadline and keeps
watching (a later notice, or a changed deadline, is delivered too) until
:meth:`PreemptionWatcher.stop`. Early warnings that set no deadline go to ``on_warning(kind, at)``
instead. The base URL is injectable for tests.

Three things a real VM needs that a test on a laptop does not show:

- The metadata endpoints are link-local; an ``HTTP(S)_PROXY`` in the environment must not see
  them (the IMDSv2 token PUT would go to the proxy and fail). Every request goes through an
  opener with an empty ``ProxyHandler``.
- A watcher that cannot reach its endpoint protects nothing, so ``warn_after`` consecutive
  failures log a WARNING (once, until it recovers) instead of DEBUG lines nobody reads.
- AWS sends a *rebalance recommendation* before (or instead of) the 2-minute interruption
  notice. It is a reason to prefer moving, not a deadline (most are never followed by an
  interruption): it goes to ``on_warning("rebalance", noticeTime)``, never to ``callback``.
- Azure's first Scheduled Events call starts the service on the VM and can take up to two
  minutes; it gets ``first_request_timeout_s`` (120 s), later calls the normal timeout.
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


def _opener() -> urllib.request.OpenerDirector:
    """An opener that never uses a proxy: the metadata service is link-local to this VM.

    Built per request, like urllib's default, so it is this line - not import order - that
    keeps a proxy set later in the environment away from the metadata service.
    """
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))

Callback = Callable[[datetime], None]
#: ``on_warning(kind, at)``: an early warning with no deadline (``"rebalance"``, ``"maintenance-migrate"``).
WarningCallback = Callable[[str, datetime], None]


class MetadataError(OSError):
    """The metadata service answered with a status the protocol does not expect."""


class PreemptionWatcher:
    """Base: ``check()`` returns the deadline of a pending preemption or None; a thread polls it.

    ``notice`` names what fired (``"interruption"``, ``"rebalance"``, ``"preempted"``...).
    """

    cloud = ""

    def __init__(self, callback: Callback, base_url: str = METADATA_URL, poll_interval_s: float = 5.0,
                 request_timeout_s: float = 2.0, clock: Callable[[], datetime] | None = None,
                 warn_after: int = 3, on_warning: WarningCallback | None = None) -> None:
        if poll_interval_s <= 0 or request_timeout_s <= 0 or warn_after < 1:
            raise ValueError("poll interval and request timeout must be positive, warn_after at least 1")
        self.callback = callback
        self.base_url = base_url.rstrip("/")
        self.poll_interval_s = poll_interval_s
        self.request_timeout_s = request_timeout_s
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self.warn_after = warn_after
        self.failures = 0
        self.notice = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: datetime | None = None
        self.on_warning = on_warning
        self.warnings: list[tuple[str, datetime]] = []

    def warn(self, kind: str, at: datetime) -> None:
        """Deliver an early warning once per (kind, time); it sets no deadline."""
        if (kind, at) in self.warnings:
            return
        self.warnings.append((kind, at))
        log.info("%s: early warning %r at %s (no deadline)", self.cloud, kind, at.isoformat())
        if self.on_warning is not None:
            self.on_warning(kind, at)

    def check(self) -> datetime | None:
        raise NotImplementedError

    def _request(self, path: str, headers: dict[str, str], method: str = "GET", timeout: float | None = None,
                 ok: tuple[int, ...] = (200,)) -> tuple[int, bytes, dict[str, str]]:
        """(status, body, headers); a status outside ``ok`` raises :class:`MetadataError`."""
        request = urllib.request.Request(self.base_url + path, headers=headers, method=method)
        try:
            with _opener().open(request, timeout=timeout or self.request_timeout_s) as response:
                status, body, answer = int(response.status), response.read(), dict(response.headers.items())
        except urllib.error.HTTPError as exc:
            status, body, answer = int(exc.code), b"", dict(exc.headers.items()) if exc.headers else {}
        if status not in ok:
            raise MetadataError(f"{method} {path.split('?')[0]} returned HTTP {status}")
        return status, body, answer

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

    def poll_once(self) -> datetime | None:
        """One poll: the deadline, or None (a failure is counted and warned about, never raised)."""
        try:
            deadline = self.check()
        except (OSError, ValueError) as exc:  # unreachable, refused, malformed: keep polling, but say so
            self.failures += 1
            if self.failures == self.warn_after:
                log.warning("%s preemption watcher: %d metadata polls failed in a row (last: %s); "
                            "spot notices may be missed", self.cloud, self.failures, exc)
            else:
                log.debug("%s metadata poll failed: %s", self.cloud, exc)
            return None
        if self.failures >= self.warn_after:
            log.warning("%s preemption watcher: metadata service reachable again", self.cloud)
        self.failures = 0
        return deadline

    def _run(self) -> None:
        """Poll until stopped; each new or changed deadline reaches ``callback`` once."""
        while not self._stop.is_set():
            deadline = self.poll_once()
            if deadline is not None and deadline != self.fired:
                self.fired = deadline
                self.callback(deadline)
            self._stop.wait(self.poll_interval_s)


class AwsSpotWatcher(PreemptionWatcher):
    """IMDSv2: PUT a session token, then GET ``spot/instance-action`` (404 = none) and
    ``events/recommendations/rebalance`` (404 = none) with it.

    A rebalance recommendation has no deadline of its own (an interruption, if one follows, comes
    with its own two-minute notice): it is an early warning (:meth:`warn`), not a deadline.
    """

    cloud = "aws"
    token_ttl_s = 21600
    interruption_notice_s = 120.0

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._token: str | None = None

    def _fetch_token(self) -> str:
        _, body, _ = self._request("/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)}, "PUT")
        return body.decode().strip()

    def _get(self, path: str) -> tuple[int, bytes]:
        if self._token is None:
            self._token = self._fetch_token()
        status, body, _ = self._request(path, {"X-aws-ec2-metadata-token": self._token}, ok=(200, 401, 404))
        if status == 401:  # token expired: a new one next poll
            self._token = None
        return status, body

    def check(self) -> datetime | None:
        status, body = self._get("/latest/meta-data/spot/instance-action")
        if status == 200:
            action = json.loads(body)
            if action.get("action") in ("terminate", "stop", "hibernate"):
                self.notice = "interruption"
                return utc(str(action["time"]))
        if status == 401:
            return None
        status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
        if status == 200:
            self.warn("rebalance", utc(str(json.loads(body)["noticeTime"])))
        return None


class GcpPreemptionWatcher(PreemptionWatcher):
    """``instance/preempted`` with ``Metadata-Flavor: Google``.

    The first GET reads the value and its ``ETag``; later GETs hang with
    ``?wait_for_change=true&last_etag=<etag>`` until the value changes (or ``timeout_sec``), so
    a flip is seen at once without a busy loop. GCP gives ~30 s from the flip to TRUE, so the
    deadline is now + ``notice_s``.

    ``instance/maintenance-event`` is read on every poll too: GPU VMs run with
    ``onHostMaintenance: TERMINATE``, so ``TERMINATE_ON_HOST_MAINTENANCE`` is a deadline
    (``maintenance_notice_s``, an hour, from when it was first seen); ``MIGRATE_ON_HOST_MAINTENANCE``
    is an early warning.
    """

    cloud = "gcp"
    notice_s = 30.0
    maintenance_notice_s = 3600.0
    path = "/computeMetadata/v1/instance/preempted"
    maintenance_path = "/computeMetadata/v1/instance/maintenance-event"

    def __init__(self, callback: Callback, base_url: str = GCP_METADATA_URL, **kwargs: object) -> None:
        super().__init__(callback, base_url, **kwargs)  # type: ignore[arg-type]
        self.etag: str | None = None
        self._preempted_at: datetime | None = None  # the deadline of this preemption, fixed when first seen
        self._maintenance_at: datetime | None = None

    def check(self) -> datetime | None:
        path, timeout = self.path, self.request_timeout_s
        if self.etag:
            wait_s = max(1, int(self.poll_interval_s))
            path += f"?wait_for_change=true&last_etag={self.etag}&timeout_sec={wait_s}"
            timeout += wait_s
        _, body, headers = self._request(path, {"Metadata-Flavor": "Google"}, timeout=timeout)
        etag = {k.lower(): v for k, v in headers.items()}.get("etag")
        if etag:
            self.etag = etag.strip()
        if body.decode().strip().upper() == "TRUE":
            self.notice = "preempted"
            if self._preempted_at is None:
                self._preempted_at = self.clock() + timedelta(seconds=self.notice_s)
            return self._preempted_at
        self._preempted_at = None
        return self._maintenance()

    def _maintenance(self) -> datetime | None:
        _, body, _ = self._request(self.maintenance_path, {"Metadata-Flavor": "Google"})
        event = body.decode().strip().upper()
        if event.startswith("TERMINATE"):
            self.notice = "maintenance-terminate"
            if self._maintenance_at is None:
                self._maintenance_at = self.clock() + timedelta(seconds=self.maintenance_notice_s)
            return self._maintenance_at
        self._maintenance_at = None
        if event.startswith("MIGRATE"):
            self.warn("maintenance-migrate", self.clock())
        return None


class AzureScheduledEventsWatcher(PreemptionWatcher):
    """Scheduled Events: a ``Preempt`` event's ``NotBefore`` is the deadline."""

    cloud = "azure"
    path = "/metadata/scheduledevents?api-version=2020-07-01"
    first_request_timeout_s = 120.0
    answered = False

    def check(self) -> datetime | None:
        timeout = None if self.answered else max(self.first_request_timeout_s, self.request_timeout_s)
        _, body, _ = self._request(self.path, {"Metadata": "true"}, timeout=timeout)
        self.answered = True
        events = json.loads(body).get("Events", [])
        for event in events:
            if event.get("EventType") == "Preempt":
                not_before = event.get("NotBefore") or ""
                parsed = email.utils.parsedate_to_datetime(not_before) if not_before else None
                self.notice = "preempt"
                return utc(parsed) if parsed else self.clock() + timedelta(seconds=30)
        return None


WATCHERS: dict[str, type[PreemptionWatcher]] = {
    "aws": AwsSpotWatcher, "gcp": GcpPreemptionWatcher, "azure": AzureScheduledEventsWatcher,
}


def watcher_for(cloud: str, callback: Callback, **kwargs: object) -> PreemptionWatcher:
    """The watcher of ``cloud`` (aliases accepted), not yet started."""
    from .records import canonical_cloud

    return WATCHERS[canonical_cloud(cloud)](callback, **kwargs)  # type: ignore[arg-type]
