"""``ray-up``: a cloud cluster per offer through Ray's cluster launcher.

The offer becomes a :class:`~orchestrator.supervise.launch.ClusterSpec` with the user's project,
subscription and network (from ``--cloud-config`` or the usual environment, never a placeholder),
its validated YAML is written under ``workdir``, and ``ray up -y`` starts it. The supervisor then
reaches the head's Job API only through an SSH tunnel (``ray dashboard YAML --port P``: the head's
dashboard listens on its own 127.0.0.1, never on the internet). Teardown ends the tunnel and runs
``ray down -y``. Every step is the ``ray`` executable on PATH (tests put a recording stub there).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cloud.records import Offer
from orchestrator.core.errors import UserError
from orchestrator.supervise.local import free_port
from orchestrator.supervise.provision import ClusterHandle, ProvisionError, dashboard_answers


def ray_command() -> str:
    """``ray`` on PATH first (what the user runs by hand), else the one beside this interpreter."""
    found = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    if not Path(found).exists():
        raise UserError("the `ray` command is not installed (pip install 'ray[default]'); --provider ray-up needs it")
    return found


class RayUpProvisioner:
    """See the module docstring."""

    name = "ray-up"

    def __init__(self, offers: dict[str, Offer], workdir: Path, cloud_config: dict[str, Any] | None = None,
                 up_timeout_s: float = 1800.0, tunnel_timeout_s: float = 120.0) -> None:
        self.offers = offers
        self.workdir = Path(workdir)
        self.cloud_config = cloud_config or {}
        self.up_timeout_s = up_timeout_s
        self.tunnel_timeout_s = tunnel_timeout_s

    def _run(self, offer: str, args: list[str], timeout_s: float) -> str:
        try:
            proc = subprocess.run([ray_command(), *args], capture_output=True, text=True, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ProvisionError(f"{offer}: `ray {args[0]}` did not finish within {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            tail = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()][-1:] or ["no output"]
            raise ProvisionError(f"{offer}: `ray {args[0]}` failed ({proc.returncode}): {tail[0][:300]}")
        return proc.stdout

    def provision(self, offer: str, cluster_id: str) -> ClusterHandle:
        from orchestrator.supervise.launch import spec_for_offer, write_cluster_yaml

        if offer not in self.offers:
            raise ProvisionError(f"{offer}: not an offer of this run")
        try:
            spec = spec_for_offer(self.offers[offer], f"raypipe-{cluster_id}".lower()[:40], self.cloud_config)
            yaml_path = write_cluster_yaml(spec, self.workdir / f"{cluster_id}.yaml")
        except UserError as exc:  # missing project/subscription: this offer cannot be had, say why
            raise ProvisionError(f"{offer}: {exc}") from None
        self._run(offer, ["up", "-y", "--no-config-cache", str(yaml_path)], self.up_timeout_s)
        handle = ClusterHandle(cluster_id, self.name, offer, "", "", workdir=str(yaml_path))
        try:
            head = self._run(offer, ["get-head-ip", str(yaml_path)], 120.0).strip().splitlines()[-1].strip()
            port = free_port()
            log = open(self.workdir / f"{cluster_id}-tunnel.log", "wb")
            try:
                tunnel = subprocess.Popen([ray_command(), "dashboard", "--port", str(port), str(yaml_path)], stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            finally:
                log.close()
            handle = ClusterHandle(cluster_id, self.name, offer, f"{head}:6379", f"http://127.0.0.1:{port}", (tunnel.pid,),
                                   workdir=str(yaml_path))
            deadline = time.monotonic() + self.tunnel_timeout_s
            while not dashboard_answers(handle.dashboard_url, 2.0):
                if tunnel.poll() is not None or time.monotonic() > deadline:
                    raise ProvisionError(f"{offer}: no Job API through the SSH tunnel to {head} (see {log.name})")
                time.sleep(1.0)
        except ProvisionError:
            self.teardown(handle)
            raise
        return handle

    def alive(self, handle: ClusterHandle) -> bool:
        return all(_running(p) for p in handle.pids) and dashboard_answers(handle.dashboard_url)

    def teardown(self, handle: ClusterHandle) -> None:
        for pid in handle.pids:  # the tunnel: our own process
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        if handle.workdir:
            self._run(handle.offer, ["down", "-y", handle.workdir], self.up_timeout_s)

    def kill(self, handle: ClusterHandle) -> None:
        raise UserError("--kill-cluster-at is a rehearsal for --provider local only")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # our child that exited: a zombie until reaped
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True
