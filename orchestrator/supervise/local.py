"""``local``: a real, separate Ray cluster on this machine, one per offer.

Several Ray instances share this machine (other users', other tests', a second cluster of the
same run during a migration), so each local cluster has:

- its own ports for every service Ray opens (GCS, node manager, object manager, dashboard and its
  agent, metrics export, runtime-env agent, Ray client server, and a worker port range), chosen free
  when it starts, announced on 127.0.0.1 (--node-ip-address);
- its own short temp dir (Unix socket paths are limited to about 107 bytes, and Ray nests its
  sockets several folders deep);
- its own CPU count;
- its own authentication token (Ray's token authentication, ``RAY_AUTH_MODE=token``): a fresh token
  in a 0600 file in its temp dir, which its processes and the supervisor's Job API client read;
- the Job API (dashboard) bound to 127.0.0.1. Ray 2.60's gRPC servers (GCS, raylet, object
  manager) bind every interface whatever ``--node-ip-address`` says, and Ray offers no option to
  narrow them; on those, the cluster's token is what keeps others out;
- its own session: ``ray start --head --block`` runs as the leader of a new session, and every Ray
  process of the cluster inherits that session id. Teardown ends exactly those processes, by id;
  never a machine-wide ``ray stop``, which would end everybody's clusters.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.supervise.provision import ClusterHandle, ProvisionError, auth_headers, dashboard_answers

HOST = "127.0.0.1"
WORKER_PORTS = 64
"""Worker processes (stage actors, the driver's helpers) each take a port from this range."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def listening(address: str) -> bool:
    """Whether something accepts connections at ``host:port``."""
    host, port = address.rsplit(":", 1)
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, int(port))) == 0


def _worker_range(count: int = WORKER_PORTS) -> tuple[int, int]:
    """A block of ``count`` consecutive ports none of which is taken now (below the ephemeral range)."""
    for _ in range(200):
        base = random.randrange(20000, 30000 - count)
        if not any(listening(f"{HOST}:{p}") for p in range(base, base + count, 8)):
            return base, base + count - 1
    raise ProvisionError("no free block of worker ports between 20000 and 30000")


def session_of(pid: int) -> int | None:
    """The session id of a live process (from ``/proc/PID/stat``); None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    # after the command: state ppid pgrp session ...; a zombie no longer runs anything
    return None if fields[0] == "Z" else int(fields[3])


def session_processes(session: int) -> list[int]:
    """Pids of live processes whose session id is ``session``."""
    return sorted(int(e) for e in os.listdir("/proc") if e.isdigit() and session_of(int(e)) == session)


def cluster_processes(handle: ClusterHandle) -> list[int]:
    """The cluster's processes: its session's, and any whose command line names its own temp dir
    (unique to this cluster: a safety net for a process that left the session)."""
    found = set(session_processes(handle.session)) if handle.session else set()
    needles = [n.encode() for n in (handle.workdir,) if n and Path(n).name.startswith("rp-")]
    for entry in os.listdir("/proc") if needles else ():
        if not entry.isdigit() or int(entry) in found:
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if any(n + b"/" in cmdline or n + b"\0" in cmdline or cmdline.endswith(n) for n in needles):
            found.add(int(entry))
    return sorted(found)


def _ray_exe() -> str:
    beside = Path(sys.executable).parent / "ray"
    exe = str(beside) if beside.exists() else shutil.which("ray")
    if exe is None:
        raise ProvisionError("local: the `ray` command is not installed (ray[default])")
    return exe


PORT_ATTEMPTS = 3


class _PortTaken(ProvisionError):
    """``ray start`` refused a port it was given: another process took it after it was chosen."""


class LocalProvisioner:
    """Each offer a separate local Ray cluster with ``cpus`` CPUs (see the module docstring)."""

    name = "local"

    def __init__(self, cpus: int = 4, start_timeout_s: float = 180.0, env: dict[str, str] | None = None) -> None:
        self.cpus = cpus
        self.start_timeout_s = start_timeout_s
        self.env = env

    def provision(self, offer: str, cluster_id: str) -> ClusterHandle:
        """Start the cluster; again with fresh ports (up to ``PORT_ATTEMPTS`` times) when ``ray start`` found
        one of the ports it was given taken: free ports are chosen before Ray binds them, and another Ray
        instance starting on the same machine can take one in between (seen in a suite run beside a demo)."""
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return self._start(offer, cluster_id)
            except _PortTaken:
                pass
        return self._start(offer, cluster_id)  # the last refusal is reported as it is (a ProvisionError)

    def _start(self, offer: str, cluster_id: str) -> ClusterHandle:
        workdir = tempfile.mkdtemp(prefix="rp-", dir="/tmp")  # short: Ray's socket paths live under it
        ports = {name: free_port() for name in ("port", "node-manager-port", "object-manager-port", "dashboard-port",
                                                "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                "metrics-export-port", "runtime-env-agent-port", "ray-client-server-port")}
        low, high = _worker_range()
        cmd = [_ray_exe(), "start", "--head", "--block", "--node-ip-address", HOST, "--dashboard-host", HOST,
               "--include-dashboard", "true", "--num-cpus", str(self.cpus), "--num-gpus", "0", "--temp-dir", workdir,
               "--min-worker-port", str(low), "--max-worker-port", str(high), "--disable-usage-stats",
               *[f"--{name}={port}" for name, port in ports.items()]]
        env = dict(self.env if self.env is not None else os.environ)
        env.pop("RAY_ADDRESS", None)  # `ray start --head` must not join another cluster
        env.pop("RAY_AUTH_TOKEN", None)
        token_path = Path(workdir) / "auth_token"
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle_file:
            handle_file.write(secrets.token_hex(32))
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path))
        log = open(Path(workdir) / "ray-start.log", "wb")
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, cwd=workdir)
        finally:
            log.close()
        handle = ClusterHandle(cluster_id, self.name, offer, f"{HOST}:{ports['port']}",
                               f"http://{HOST}:{ports['dashboard-port']}", (proc.pid,), proc.pid, workdir,
                               {"auth_token_path": str(token_path)})
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                reason = _last_line(Path(workdir) / "ray-start.log")
                self.teardown(handle)
                # someone else holds one of its ports (ours are gone after teardown), or Ray says so
                taken = any(listening(f"{HOST}:{p}") for p in ports.values()) or "used by multiple components" in reason
                raise (_PortTaken if taken else ProvisionError)(f"{offer}: `ray start` exited with {proc.returncode}: {reason}")
            if listening(handle.gcs_address) and dashboard_answers(handle.dashboard_url, 2.0, auth_headers(handle)):
                return ClusterHandle(**{**handle.__dict__, "pids": tuple(session_processes(proc.pid))})
            time.sleep(1.0)
        self.teardown(handle)
        raise ProvisionError(f"{offer}: the local cluster did not answer within {self.start_timeout_s:.0f} s")

    def alive(self, handle: ClusterHandle) -> bool:
        return bool(cluster_processes(handle)) and listening(handle.gcs_address)

    def kill(self, handle: ClusterHandle) -> None:
        """The rehearsal of a lost cluster: SIGKILL to each of its processes, nothing else."""
        self._signal_all(handle, signal.SIGKILL, 0.0)

    def teardown(self, handle: ClusterHandle) -> None:
        """SIGTERM to each process of the cluster's session, SIGKILL to what is left after 5 s;
        then its temp dir. Processes of other sessions (other clusters) are never signalled."""
        self._signal_all(handle, signal.SIGTERM, 5.0)
        self._signal_all(handle, signal.SIGKILL, 5.0)
        if handle.workdir and Path(handle.workdir).name.startswith("rp-"):
            shutil.rmtree(handle.workdir, ignore_errors=True)
        _forget_current(handle.gcs_address)

    @staticmethod
    def _signal_all(handle: ClusterHandle, sig: int, wait_s: float) -> None:
        """``sig`` once to every process of the cluster, and to any that appears while waiting (a raylet
        may start a worker between the scan and its own signal), until none is left or ``wait_s``."""
        deadline = time.monotonic() + wait_s
        signalled: set[int] = set()
        while True:
            left = cluster_processes(handle)
            for pid in set(left) - signalled:
                signalled.add(pid)
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            _reap(handle.session)
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        _reap(handle.session)


def _reap(session: int | None) -> None:
    """Collect the exit status of the cluster's leader when it is our child (else it stays a zombie)."""
    if not session:
        return
    try:
        os.waitpid(session, os.WNOHANG)
    except ChildProcessError:
        pass


def _forget_current(address: str) -> None:
    """Ray records the last started cluster in /tmp/ray/ray_current_cluster, where a later
    address-less ``ray.init()`` would look; never leave it pointing at a cluster that is gone."""
    current = Path("/tmp/ray/ray_current_cluster")
    try:
        if current.read_text().strip() == address:
            current.unlink()
    except OSError:
        pass


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no output"
    return lines[-1][:300] if lines else "no output"
