"""The driver on a cluster, through Ray's Job API (:class:`ray.job_submission.JobSubmissionClient`).

The supervisor submits the user's driver with a working directory and the run's environment
variables, streams the driver's output to its own stdout as ``ray job submit`` does (a thread
tailing the job's log), and asks the job's status and exit code when deciding what happened.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.supervise.provision import ClusterHandle, ProvisionError, auth_headers

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
TRANSIENT = ("agent", "max retries exceeded", "newconnectionerror", "connection refused", "connection reset",
             "connection aborted")
"""Words of a Job API error that say "not yet" (retried while submitting), not "no"."""


class TextSink(Protocol):
    """Where the driver's streamed output goes (stdout, or a demo's tee)."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


@dataclass(frozen=True)
class JobOutcome:
    """How a submitted driver ended (``status`` one of :data:`TERMINAL`)."""

    status: str
    exit_code: int | None
    message: str


class DriverJob:
    """One submission of the driver on one cluster, and the thread that streams its output."""

    def __init__(self, handle: ClusterHandle, job_id: str, out: TextSink | None = None) -> None:
        self.handle = handle
        self.job_id = job_id
        self.out = out or sys.stdout
        self._client: Any = None
        self._stream: threading.Thread | None = None
        self._lock = threading.Lock()
        self._streamed = 0  # driver lines printed from the stream
        self._cut = False  # the stream ended early or was given up on: the rest comes from the job's full log
        self.lines: list[str] = []
        """The driver's output so far (its last lines are what a user error is reported with)."""

    def client(self) -> Any:
        from ray.job_submission import JobSubmissionClient

        if self._client is None:
            self._client = JobSubmissionClient(self.handle.dashboard_url, headers=auth_headers(self.handle))
        return self._client

    @classmethod
    def submit(cls, handle: ClusterHandle, argv: list[str], working_dir: str, env: dict[str, str], python: str,
               out: TextSink | None = None, tries: int = 80) -> "DriverJob":
        """Submit ``python argv...`` (retried while the head's job agent is still starting)."""
        import logging

        from ray.job_submission import JobSubmissionClient

        # the client's per-file packaging notes; the driver's own output is what the user reads
        for name in ("ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging", "ray.dashboard.modules.job.sdk"):
            logging.getLogger(name).setLevel(logging.WARNING)
        try:
            client = JobSubmissionClient(handle.dashboard_url, headers=auth_headers(handle))
        except Exception as exc:  # noqa: BLE001 - the SDK checks the head's version and reachability its own ways
            raise ProvisionError(f"{handle.offer}: no Job API at {handle.dashboard_url}: {' '.join(str(exc).split())[:200]}") from None
        entrypoint = " ".join(shlex.quote(a) for a in [python, *argv])
        runtime_env = {"working_dir": working_dir, "env_vars": env,
                       "excludes": [".git", ".venv", "out", "runs", "__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache"]}
        last = ""
        for _ in range(tries):
            try:
                job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
                job = cls(handle, job_id, out)
                job._client = client
                return job
            except (RuntimeError, ConnectionError, OSError) as exc:
                last = " ".join(str(exc).split())[:300]
                # the head's job agent answers some seconds after the dashboard (minutes on a saturated machine: 80
                # tries), and the dashboard may refuse a connection for a while (the SDK wraps that in a RuntimeError);
                # anything else is final
                if isinstance(exc, RuntimeError) and not any(t in last.lower() for t in TRANSIENT):
                    break
                time.sleep(3.0)
        raise ProvisionError(f"{handle.offer}: the cluster's Job API refused the driver: {last}")

    def follow(self) -> None:
        """Stream the driver's output in a background thread (daemon: it ends with the job's log)."""
        if self._stream is None:
            self._stream = threading.Thread(target=self._tail, name=f"logs-{self.job_id}", daemon=True)
            self._stream.start()

    def _tail(self) -> None:
        async def tail() -> None:
            pending = ""
            async for chunk in self.client().tail_job_logs(self.job_id):
                pending += chunk
                *lines, pending = pending.split("\n")
                for line in lines:
                    self._driver_line(line)
            if pending:
                self._driver_line(pending)

        try:
            asyncio.run(tail())
        except Exception as exc:  # noqa: BLE001 - the cluster went away mid-stream: drain reads the rest, if it can
            with self._lock:
                self._cut = True
            self._line(f"[supervisor] log stream of {self.job_id} ended: {' '.join(str(exc).split())[:200]}")

    def _driver_line(self, line: str) -> None:
        with self._lock:
            if self._cut:
                return
            self._streamed += 1
        self._line(line)

    def _line(self, line: str) -> None:
        self.lines.append(line)
        del self.lines[:-200]
        print(line, file=self.out, flush=True)

    def drain(self, timeout_s: float = 10.0) -> None:
        """Wait (a little) for the stream to print the driver's last lines; when the stream ended early (a closed
        connection) or is still behind, the lines it missed are read from the job's full log once."""
        if self._stream is None:
            return
        self._stream.join(timeout_s)
        with self._lock:
            if not (self._cut or self._stream.is_alive()):
                return
            self._cut = True  # from here on the stream prints nothing: no line twice
            done = self._streamed
        try:
            missed = str(self.client().get_job_logs(self.job_id)).splitlines()[done:]
        except Exception:  # noqa: BLE001 - the cluster is gone: what was streamed is all there is
            return
        for line in missed:
            self._line(line)

    def status(self) -> str | None:
        """The job's status, or None when the cluster does not answer."""
        try:
            return str(self.client().get_job_status(self.job_id))
        except Exception:  # noqa: BLE001 - any transport error means "no answer now"
            return None

    def outcome(self) -> JobOutcome:
        info = self.client().get_job_info(self.job_id)
        code = getattr(info, "driver_exit_code", None)
        return JobOutcome(str(info.status), None if code is None else int(code), " ".join(str(info.message or "").split())[:300])

    def stop(self) -> None:
        try:
            self.client().stop_job(self.job_id)
        except Exception:  # noqa: BLE001 - a cluster that is gone has no job to stop
            pass
