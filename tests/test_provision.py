"""Provisioners: ``local`` (two real, separate Ray clusters on this machine), ``existing`` (an address,
nothing started or stopped) and ``ray-up`` (Ray's cluster launcher, with a recording stub ``ray`` on
PATH: no cloud, no credentials; the YAML it is handed is checked against Ray's own schema)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

from cloud.records import Offer
from orchestrator.supervise.launch import validate_config
from orchestrator.supervise.local import LocalProvisioner, cluster_processes, listening, session_of, session_processes
from orchestrator.supervise.provision import ClusterHandle, ExistingProvisioner, ProvisionError, auth_headers
from orchestrator.supervise.rayup import RayUpProvisioner

STUB = """#!{python}
# A stand-in for the `ray` CLI: records each call; `dashboard --port P` serves /api/version like a tunnel would.
import json, os, sys
log = os.environ["RAY_STUB_LOG"]
with open(log, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
cmd = sys.argv[1]
if cmd == "up":
    if os.environ.get("RAY_STUB_FAIL_UP") and os.environ["RAY_STUB_FAIL_UP"] in open(sys.argv[-1]).read():
        print("InsufficientInstanceCapacity: no capacity in that zone", file=sys.stderr)
        sys.exit(1)
    import shutil
    shutil.copy(sys.argv[-1], sys.argv[-1] + ".seen")
elif cmd == "get-head-ip":
    print("10.1.2.3")
elif cmd == "dashboard":
    import http.server
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/api/version" else 404)
            self.end_headers()
            self.wfile.write(b'{{"ray_version": "{version}", "version": "4"}}')
        def do_POST(self):  # not a Job API: a head whose Job API refuses the driver
            self.send_response(404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""

AWS = Offer("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, True, 3.67)
GCP = Offer("gcp", "us-central1", "us-central1-b", "n1-standard-16", "V100", 4, True, 2.9)


@pytest.fixture
def ray_stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    exe = folder / "ray"
    import ray

    exe.write_text(STUB.format(python=sys.executable, version=ray.__version__))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RAY_STUB_LOG", str(tmp_path / "calls.jsonl"))
    return tmp_path / "calls.jsonl"


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_ray_up_provisions_through_the_launcher_and_tears_down(ray_stub: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    prov = RayUpProvisioner({AWS.label(): AWS}, tmp_path / "clusters",
                            {"aws": {"subnet_id": "subnet-0abc", "security_group_ids": ["sg-1"]}}, tunnel_timeout_s=60)
    handle = prov.provision(AWS.label(), "r1-c1")
    assert handle.gcs_address == "10.1.2.3:6379" and handle.dashboard_url.startswith("http://127.0.0.1:")
    assert prov.alive(handle)
    seen = yaml.safe_load(Path(handle.workdir + ".seen").read_text())  # what `ray up` was given
    validate_config(seen)  # Ray's own schema
    node = seen["available_node_types"]["gpu_worker"]["node_config"]
    assert node["SubnetIds"] == ["subnet-0abc"] and node["SecurityGroupIds"] == ["sg-1"]
    assert node["InstanceMarketOptions"]["MarketType"] == "spot"
    assert "0.0.0.0" not in Path(handle.workdir).read_text()  # the Job API stays on the head's loopback
    prov.teardown(handle)
    assert not prov.alive(handle)
    names = [c[0] for c in calls(ray_stub)]
    assert names == ["up", "get-head-ip", "dashboard", "down"]
    assert calls(ray_stub)[-1] == ["down", "-y", handle.workdir]


def test_ray_up_failures_name_the_offer(ray_stub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_STUB_FAIL_UP", "p3.8xlarge")
    prov = RayUpProvisioner({AWS.label(): AWS, GCP.label(): GCP}, tmp_path / "clusters")
    with pytest.raises(ProvisionError, match=r"aws/us-east-1a/p3.8xlarge \(spot\): `ray up` failed \(1\): InsufficientInstanceCapacity"):
        prov.provision(AWS.label(), "r1-c1")
    for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GCLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ProvisionError, match="no GCP project"):  # never a placeholder: refused before `ray up`
        prov.provision(GCP.label(), "r1-c2")
    assert [c[0] for c in calls(ray_stub)] == ["up"]
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "acme-training-42")
    handle = prov.provision(GCP.label(), "r1-c3")
    assert yaml.safe_load(Path(handle.workdir).read_text())["provider"]["project_id"] == "acme-training-42"
    prov.teardown(handle)


def outside_session(handle: ClusterHandle) -> list[int]:
    """The cluster's processes (found by its temp dir) that run outside its session, each read once:
    comparing two scans of /proc raced with Ray starting or ending workers between them."""
    return [pid for pid in cluster_processes(handle) if session_of(pid) not in (None, handle.session)]


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_two_local_clusters_are_separate_and_stop_by_their_own_pids() -> None:
    prov = LocalProvisioner(cpus=1)
    a = prov.provision("local/a/cpu-1 (spot)", "t-a")
    try:
        b = prov.provision("local/b/cpu-1 (spot)", "t-b")
        try:
            assert a.gcs_address != b.gcs_address and a.dashboard_url != b.dashboard_url
            assert a.session != b.session and not set(a.pids) & set(b.pids)
            assert a.gcs_address.startswith("127.0.0.1:") and len(a.workdir or "") < 20
            assert prov.alive(a) and prov.alive(b)
            assert a.session and not outside_session(a)  # none of its processes left the session
            # token authentication: the Job API refuses a caller without the cluster's token
            from orchestrator.supervise.provision import dashboard_answers
            assert not dashboard_answers(a.dashboard_url)
            # with the token it answers (retried: a loaded machine may take a while to serve it)
            assert any(dashboard_answers(a.dashboard_url, 15.0, auth_headers(a)) for _ in range(3))
            oct_mode = stat.S_IMODE(os.stat(a.extra["auth_token_path"]).st_mode)
            assert oct_mode == 0o600
            existing = ExistingProvisioner(b.gcs_address, b.dashboard_url, b.extra["auth_token_path"])
            same = existing.provision("existing", "t-e")
            assert same.gcs_address == b.gcs_address
            prov.teardown(a)
            assert not session_processes(a.session or 0) and not cluster_processes(a) and not listening(a.gcs_address)
            assert prov.alive(b)  # the other cluster is untouched
            existing.teardown(same)  # nothing to do: not ours
            assert prov.alive(b)
        finally:
            prov.teardown(b)
        assert not session_processes(b.session or 0) and not cluster_processes(b) and not listening(b.gcs_address)
    finally:
        prov.teardown(a)


def test_existing_refuses_an_address_that_does_not_answer() -> None:
    from orchestrator.supervise.local import free_port

    prov = ExistingProvisioner(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ProvisionError, match="does not answer"):
        prov.provision("existing", "x")


def test_cluster_handle_round_trips_through_json() -> None:
    handle = ClusterHandle("r-c1", "local", "local/a/cpu-4 (spot)", "127.0.0.1:1", "http://127.0.0.1:2", (3, 4), 3,
                           "/tmp/rp-x", {"auth_token_path": "/tmp/rp-x/auth_token"})
    assert ClusterHandle.from_json(json.loads(json.dumps(handle.to_json()))) == handle


def test_orchestrator_run_on_ray_up_fails_over_and_tears_down_each_offer(ray_stub: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole ``--provider ray-up`` path through the stub: each offer is brought up (``ray up``,
    head ip, SSH tunnel), its Job API refuses the driver, so it is torn down (``ray down``) and the
    next offer tried; with none left, exit 2 naming the offers tried."""
    from orchestrator.cli.commands import main

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    code = main(["run", "--provider", "ray-up", "--gpu", "V100", "--devices", "4", "--cloud", "aws", "--max-offers", "2",
                 "--storage", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--", "tests/supervisor_driver.py"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: no offer could be provisioned (tried:")
    names = [c[0] for c in calls(ray_stub)]
    assert names == ["up", "get-head-ip", "dashboard", "down"] * 2
    ups = [c[-1] for c in calls(ray_stub) if c[0] == "up"]
    assert len(set(ups)) == 2  # two offers, one YAML each
    for path in ups:
        validate_config(yaml.safe_load(Path(path).read_text()))
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["event"] == "provision_failed"]
    assert len(failed) == 2 and all("Job API refused the driver" in e["reason"] for e in failed)
    assert len([e for e in events if e["event"] == "cluster_down"]) == 2


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_port_taken_after_it_was_chosen_is_chosen_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free ports are chosen before Ray binds them; another Ray instance starting beside can take one in between
    (`ray start` then exits: "make sure the same port is not used by multiple components"). The start is retried
    with fresh ports instead of the offer being reported unprovisionable. The first try here is given one port for
    two components, which Ray refuses with that message at once (a port held by another process makes Ray wait
    for its GCS first: the same retry, 40 s later)."""
    from orchestrator.supervise import local

    real = local.free_port
    dup = real()
    calls = iter(range(1000))
    monkeypatch.setattr(local, "free_port", lambda: dup if next(calls) < 2 else real())  # GCS and node manager
    prov = LocalProvisioner(cpus=1)
    handle = prov.provision("local/a/cpu-1 (spot)", "t-port")
    try:
        assert prov.alive(handle) and not handle.gcs_address.endswith(f":{dup}")
    finally:
        prov.teardown(handle)
