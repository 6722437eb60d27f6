"""One writer per run: a job holds a lease on its storage location while it lives.

Why: two drivers started on one location both trained and overwrote each other's run record and checkpoints (the
later writer won). The lease is a small record beside the run record (``STORAGE/lease.json``: owner, host, pid,
cluster, expiry) that a job takes before it writes anything and renews from a thread (start-up, restarts and long
evaluations never let it lapse). A second job refuses with one line naming the holder (:class:`RunLocked`, its own
exit code), unless the lease is free: expired, released, held by a process of this host that is gone, or held by
another cluster of a supervised run (its supervisor has moved the run on: it relaunches only what it saw die).

On a local folder a free lease is created exclusively (``O_EXCL``: of two jobs started together one gets it). Object
stores have no compare-and-swap here, so taking is write-then-confirm: after writing its record a job waits
:data:`CONFIRM_S` and reads the record back; of two jobs that wrote at about the same time only the last writer
finds its own record and proceeds (a job's check and its write are milliseconds apart, far less than the wait).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass

from actors import storage
from orchestrator.core.errors import UserError

LEASE = "lease.json"
TTL_S = 90.0
"""A lease not renewed for this long is free (a driver killed with ``kill -9`` on another host)."""
CONFIRM_S = 1.0


class RunLocked(RuntimeError):
    """Another live job holds the run's lease; drivers exit :data:`EXIT_LOCKED` with this one line."""


EXIT_LOCKED = 73  # EX_CANTCREAT: the run cannot be opened for writing now


@dataclass(frozen=True)
class Holder:
    """Who holds a run's lease, until when."""

    owner: str
    host: str
    pid: int
    cluster: str | None
    expires_at: float

    def describe(self) -> str:
        where = f"pid {self.pid} on {self.host}" + (f" (cluster {self.cluster})" if self.cluster else "")
        return f"job {self.owner}, {where}, until {time.strftime('%H:%M:%S', time.localtime(self.expires_at))}"

    def alive(self, now: float, cluster: str | None) -> bool:
        """Whether this holder still counts against a job of ``cluster`` starting now."""
        if now >= self.expires_at:
            return False
        if cluster is not None and self.cluster is not None and self.cluster != cluster:
            return False  # the supervisor moved the run to another cluster: the old job is gone or going
        return not gone(self.host, self.pid)


def gone(host: str, pid: int) -> bool:
    """Whether process ``pid`` of ``host`` is known to have ended (only this host's processes can be asked)."""
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def _read(where: str) -> Holder | None:
    try:
        fs, _ = storage.filesystem(where)
        fs.invalidate_cache()
        if not storage.exists(where):
            return None
        body = json.loads(storage.read_bytes(where, limit=1 << 16))
        return Holder(str(body["owner"]), str(body["host"]), int(body["pid"]), body.get("cluster"), float(body["expires_at"]))
    except (ValueError, KeyError, TypeError):
        return None  # a torn or foreign record holds nothing


class Lease:
    """This job's lease on ``root`` (see the module docstring): :meth:`take`, renewed until :meth:`release`."""

    def __init__(self, root: str, cluster: str | None, ttl_s: float = TTL_S) -> None:
        self.where = storage.join(root, LEASE)
        self.cluster, self.ttl_s = cluster, ttl_s
        self.me = Holder(uuid.uuid4().hex[:12], socket.gethostname(), os.getpid(), cluster, 0.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps({**asdict(self.me), "expires_at": time.time() + self.ttl_s}).encode()

    def _write(self) -> None:
        storage.write_bytes(self.where, self._body())

    def _create(self) -> bool:
        """A local lease created only if there is none (False: another job created it first)."""
        path = storage.local_path(self.where)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as handle:
            handle.write(self._body())
        return True

    def take(self) -> None:
        """Take the lease or raise :class:`RunLocked` naming its holder (nothing else is written then)."""
        held = _read(self.where)
        local, created = storage.is_local(self.where), False
        if held is None and local and not storage.exists(self.where):
            created = self._create()
            if not created:
                held = _read(self.where)  # created by another job between our look and our create
        if held is not None and held.owner != self.me.owner and held.alive(time.time(), self.cluster):
            raise RunLocked(f"{storage.parent(self.where)} is being trained by {held.describe()}; "
                            "wait for it to end, or stop it with `orchestrator stop`")
        if not created:
            self._write()
            if not local:
                time.sleep(CONFIRM_S)
        now = _read(self.where)
        if now is not None and now.owner != self.me.owner:
            raise RunLocked(f"{storage.parent(self.where)}: another job took the run at the same time ({now.describe()})")
        self._thread = threading.Thread(target=self._renew, name="raypipe-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self._write()
            except (UserError, OSError):
                pass  # a storage outage: renewed at the next beat (the lease lasts TTL_S)

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still this job's."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._thread = None
        try:
            held = _read(self.where)
            if held is not None and held.owner == self.me.owner:
                storage.remove_file(self.where)
        except (UserError, OSError):
            pass  # it expires by itself


__all__ = ["EXIT_LOCKED", "Holder", "Lease", "RunLocked", "gone"]
