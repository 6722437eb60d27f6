"""The provisioner protocol: a cluster for one offer, its address, its teardown.

Three providers stand behind it (``local``: a separate Ray cluster on this machine, ``existing``:
an address the user already runs, ``ray-up``: Ray's cluster launcher). To the supervisor they are
one path: ``provision`` returns a :class:`ClusterHandle`, a JSON-able frozen value that the
supervisor keeps in the run's storage, so that a restarted supervisor can ask the same provider
whether that cluster is still ``alive`` and ``teardown`` it, without the object that made it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.core.errors import UserError


class ProvisionError(Exception):
    """An offer could not be provisioned (unreachable provider, credentials, quota, timeout): one
    line naming the offer; the supervisor records it and fails over to the next-best offer."""


@dataclass(frozen=True)
class ClusterHandle:
    """A provisioned cluster, as the supervisor remembers it across its own restarts."""

    cluster_id: str
    provider: str
    offer: str
    """The offer's label (:meth:`cloud.records.Offer.label`)."""
    gcs_address: str
    """``host:port`` of the cluster's Ray GCS (what ``ray.init(address=...)`` takes)."""
    dashboard_url: str
    """Where this machine reaches the cluster's Job API (``http://127.0.0.1:PORT``; for ``ray-up``
    the local end of an SSH tunnel to the head)."""
    pids: tuple[int, ...] = ()
    """Processes on this machine that belong to the cluster (``local``: the session of its
    ``ray start``; ``ray-up``: the SSH tunnel)."""
    session: int | None = None
    """``local``: the session id every process of the cluster shares (its ``ray start``'s pid)."""
    workdir: str | None = None
    """``local``: the cluster's own temp dir; ``ray-up``: the folder of its YAML."""
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["pids"] = list(self.pids)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ClusterHandle":
        return cls(**{**data, "pids": tuple(int(p) for p in data.get("pids", ())), "extra": dict(data.get("extra") or {})})


class Provisioner(Protocol):
    """What the supervisor needs of a provider."""

    name: str

    def provision(self, offer: str, cluster_id: str) -> ClusterHandle:
        """Start (or find) a cluster for ``offer``; raise :class:`ProvisionError` if it cannot."""
        ...

    def alive(self, handle: ClusterHandle) -> bool:
        """Whether the cluster's head still answers."""
        ...

    def teardown(self, handle: ClusterHandle) -> None:
        """Release the cluster and everything this provider started for it."""
        ...

    def kill(self, handle: ClusterHandle) -> None:
        """Rehearsal of a lost cluster: end its processes abruptly (``local`` only)."""
        ...


class ExistingProvisioner:
    """A cluster the user already runs: nothing provisioned, nothing torn down."""

    name = "existing"

    def __init__(self, address: str, dashboard_url: str | None = None, token_path: str | None = None) -> None:
        if not address:
            raise UserError("--provider existing needs --address HOST:PORT (the cluster's GCS)")
        self.address = address.removeprefix("ray://")
        host = self.address.rsplit(":", 1)[0]
        self.dashboard_url = dashboard_url or f"http://{host}:8265"
        # Ray's token authentication: the token file Ray's own clients read (the path, never the token)
        default = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
        self.token_path = token_path or (str(default) if default.exists() else None)

    def provision(self, offer: str, cluster_id: str) -> ClusterHandle:
        extra = {"auth_token_path": self.token_path} if self.token_path else {}
        handle = ClusterHandle(cluster_id, self.name, offer, self.address, self.dashboard_url, extra=extra)
        if not self.alive(handle):
            raise ProvisionError(f"{offer}: the cluster at {self.dashboard_url} does not answer")
        return handle

    def alive(self, handle: ClusterHandle) -> bool:
        return dashboard_answers(handle.dashboard_url, headers=auth_headers(handle))

    def teardown(self, handle: ClusterHandle) -> None:
        return None  # not ours

    def kill(self, handle: ClusterHandle) -> None:
        raise UserError("--kill-cluster-at is a rehearsal for --provider local only")


def auth_headers(handle: ClusterHandle) -> dict[str, str]:
    """The ``Authorization`` header of the cluster's own token (``local``: a token made for that
    cluster, in a 0600 file in its temp dir); empty: Ray's client finds the user's token itself."""
    path = handle.extra.get("auth_token_path")
    if not path:
        token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
        return {"Authorization": f"Bearer {token}"} if token else {}
    try:
        token = open(path).read().strip()
    except OSError:
        return {}
    return {"Authorization": f"Bearer {token}"}


def dashboard_answers(url: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None) -> bool:
    """Whether Ray's dashboard (the Job API's server) answers its version endpoint (with the token)."""
    import urllib.error
    import urllib.request

    try:
        request = urllib.request.Request(f"{url.rstrip('/')}/api/version", headers=headers or {})
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False
