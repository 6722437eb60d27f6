"""Real object-store servers on 127.0.0.1, started by the tests themselves.

- S3: moto's server mode (``ThreadedMotoServer``, from PyPI), a real HTTP S3 API in a thread;
- Azure Blob: Azurite (npm package, installed by ``make test`` under ``.venv/node``), a subprocess;
- GCS: ``gcp-storage-emulator`` (PyPI), a real HTTP JSON API in a thread.

Each fixture yields a fresh bucket/container URI and points the cloud's usual environment variables
(``AWS_ENDPOINT_URL``, ``AZURE_STORAGE_CONNECTION_STRING``, ``STORAGE_EMULATOR_HOST``) at the server,
so the code under test goes through exactly the path a user's credentials would take. A server that
cannot start skips its tests with the reason; nothing is mocked. :class:`Forwarder` puts a TCP hop the caller
cuts and restores in front of one (a real outage: connections refused, live ones dropped).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
AZURITE = ROOT / ".venv" / "node" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's documented development account (public, the same in every installation).
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        pytest.skip(f"moto[server] is not installed ({exc})")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://<fresh bucket>`` on the local moto server, reached through AWS_ENDPOINT_URL."""
    import boto3

    for name, value in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    bucket = f"raypipe-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}"


def s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture(scope="session")
def azurite_connection(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = AZURITE if AZURITE.exists() else shutil.which("azurite-blob")
    node = shutil.which("node")
    if exe is None or node is None:
        pytest.skip("Azurite is not installed (make test installs it with npm; npm/node not found or install failed)")
    port = free_port()
    folder = tmp_path_factory.mktemp("azurite")
    proc = subprocess.Popen([str(exe), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(folder),
                             "--silent", "--skipApiVersionCheck", "--loose"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if not _wait_port(port, 30):
            proc.kill()
            err = proc.communicate(timeout=5)[1].decode(errors="replace").strip().splitlines()
            pytest.skip(f"Azurite did not start on 127.0.0.1:{port} ({err[-1] if err else 'no output'})")
        yield (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
               f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def az_container(azurite_connection: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``az://<fresh container>`` on Azurite, reached through AZURE_STORAGE_CONNECTION_STRING."""
    from azure.storage.blob import BlobServiceClient

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection)
    name = f"raypipe-{uuid.uuid4().hex[:12]}"
    BlobServiceClient.from_connection_string(azurite_connection).create_container(name)
    return f"az://{name}"


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    try:
        from gcp_storage_emulator.server import create_server
    except ImportError as exc:
        pytest.skip(f"gcp-storage-emulator is not installed ({exc})")
    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    if not _wait_port(port, 15):
        pytest.skip(f"the GCS emulator did not start on 127.0.0.1:{port}")
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def gcs_bucket(gcs_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``gs://<fresh bucket>`` on the local emulator, reached through STORAGE_EMULATOR_HOST."""
    import requests

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)
    name = f"raypipe-{uuid.uuid4().hex[:12]}"
    reply = requests.post(f"{gcs_endpoint}/storage/v1/b", params={"project": "test"}, json={"name": name}, timeout=10)
    if reply.status_code >= 300:
        pytest.skip(f"the GCS emulator refused to create a bucket ({reply.status_code})")
    return f"gs://{name}"


def environment_without(*prefixes: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


class Forwarder:
    """127.0.0.1:PORT -> the target; ``cut`` refuses new connections and drops live ones, ``restore`` serves again."""

    def __init__(self, target: str) -> None:
        host, port = target.split("://", 1)[1].split(":")
        self.target = (host, int(port))
        self.port = 0
        self.up = threading.Event()
        self.conns: list[socket.socket] = []
        self.listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.port = self.listener.getsockname()[1]
        self.up.set()
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def cut(self) -> None:
        self.up.clear()
        assert self.listener is not None
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept: the port stops listening
        except OSError:
            pass
        self.listener.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)  # a pooled keep-alive connection dies too, as in a real outage
            except OSError:
                pass
            c.close()
        self.conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while self.up.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass
