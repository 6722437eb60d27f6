"""Checkpoint transfer between a local/NFS folder and s3://, gs:// or az:// with a sha256 manifest.

A migration is only as cheap as the checkpoint copy is trustworthy: a half-copied checkpoint
restored on the new instance silently corrupts training. So every copy writes/reads a
``MANIFEST.sha256.json`` (relative path -> sha256, size), uploads the manifest last (its
presence marks a complete checkpoint), and verifies every file after download before the
destination folder appears (it is assembled under a temporary name and renamed).

s3:// uses boto3 (client injectable, e.g. wrapped in botocore's Stubber). gs:// and az:// use
google-cloud-storage / azure-storage-blob, imported only when used: ``pip install
google-cloud-storage`` or ``azure-storage-blob`` (az://ACCOUNT/CONTAINER/prefix).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from orchestrator.errors import UserError

MANIFEST = "MANIFEST.sha256.json"
_CHUNK = 1 << 20


class TransferError(UserError):
    """A copy that failed or did not verify."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {p.relative_to(folder).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size} for p in files}


def verify(folder: Path, manifest: dict[str, dict[str, Any]]) -> None:
    """Raise :class:`TransferError` naming the first file that is missing or differs."""
    for rel, entry in manifest.items():
        path = folder / rel
        if not path.is_file():
            raise TransferError(f"checkpoint verify: {rel} missing after transfer")
        if path.stat().st_size != entry["size"] or sha256_file(path) != entry["sha256"]:
            raise TransferError(f"checkpoint verify: {rel} differs from its manifest (sha256 mismatch)")


class Remote(Protocol):
    """An object store prefix: list keys, put/get files."""

    def put(self, local: Path, key: str) -> None: ...
    def get(self, key: str, local: Path) -> None: ...
    def read(self, key: str) -> bytes: ...


class S3Remote:
    def __init__(self, bucket: str, prefix: str, client: Any = None) -> None:
        if client is None:
            import boto3

            client = boto3.session.Session().client("s3")
        self.bucket, self.prefix, self.client = bucket, prefix.strip("/"), client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, local: Path, key: str) -> None:
        import base64

        checksum = base64.b64encode(bytes.fromhex(sha256_file(local))).decode()
        with local.open("rb") as body:  # S3 checks ChecksumSHA256 server-side and rejects a mismatch
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body,
                                   ChecksumAlgorithm="SHA256", ChecksumSHA256=checksum)

    def read(self, key: str) -> bytes:
        body: bytes = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        return body

    def get(self, key: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(self.read(key))


class GcsRemote:
    def __init__(self, bucket: str, prefix: str, client: Any = None) -> None:
        try:
            from google.cloud import storage  # type: ignore[attr-defined]
        except ImportError:
            raise UserError("gs:// needs google-cloud-storage (pip install google-cloud-storage)") from None
        self.bucket = (client or storage.Client()).bucket(bucket)
        self.prefix = prefix.strip("/")

    def _blob(self, key: str) -> Any:
        return self.bucket.blob(f"{self.prefix}/{key}" if self.prefix else key)

    def put(self, local: Path, key: str) -> None:
        self._blob(key).upload_from_filename(str(local))

    def read(self, key: str) -> bytes:
        data: bytes = self._blob(key).download_as_bytes()
        return data

    def get(self, key: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        self._blob(key).download_to_filename(str(local))


class AzureBlobRemote:
    def __init__(self, account: str, container: str, prefix: str, client: Any = None) -> None:
        try:
            from azure.storage.blob import BlobServiceClient
        except ImportError:
            raise UserError("az:// needs azure-storage-blob (pip install azure-storage-blob)") from None
        if client is None:
            from azure.identity import DefaultAzureCredential

            client = BlobServiceClient(f"https://{account}.blob.core.windows.net", credential=DefaultAzureCredential())
        self.container = client.get_container_client(container)
        self.prefix = prefix.strip("/")

    def _name(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, local: Path, key: str) -> None:
        with local.open("rb") as body:
            self.container.upload_blob(self._name(key), body, overwrite=True)

    def read(self, key: str) -> bytes:
        data: bytes = self.container.download_blob(self._name(key)).readall()
        return data

    def get(self, key: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(self.read(key))


def remote_for(url: str, client: Any = None) -> Remote | None:
    """The remote for an object-store URL, or None for a local/NFS path. Chosen by URL scheme."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return None
    if parsed.scheme == "s3":
        return S3Remote(parsed.netloc, parsed.path, client)
    if parsed.scheme == "gs":
        return GcsRemote(parsed.netloc, parsed.path, client)
    if parsed.scheme == "az":
        container, _, prefix = parsed.path.lstrip("/").partition("/")
        if not container:
            raise UserError(f"{url}: az:// URLs are az://ACCOUNT/CONTAINER/prefix")
        return AzureBlobRemote(parsed.netloc, container, prefix, client)
    raise UserError(f"{url}: unsupported scheme {parsed.scheme!r} (use a path, s3://, gs:// or az://)")


def _local(url: str) -> Path:
    return Path(urlparse(url).path if url.startswith("file://") else url)


def copy_checkpoint(src: str, dst: str, *, src_client: Any = None, dst_client: Any = None) -> dict[str, dict[str, Any]]:
    """Copy a checkpoint folder from ``src`` to ``dst`` (each a path or URL); return its manifest.

    Remote -> remote goes through a local temporary folder. The destination is complete and
    verified when this returns; on failure a local destination is left untouched.
    """
    source, target = remote_for(src, src_client), remote_for(dst, dst_client)
    with tempfile.TemporaryDirectory(prefix="ckpt-") as scratch:
        if source is None:
            folder = _local(src)
            if not folder.is_dir():
                raise TransferError(f"{src}: checkpoint folder does not exist")
            manifest = build_manifest(folder)
        else:
            try:
                manifest = json.loads(source.read(MANIFEST))
            except (ValueError, KeyError) as exc:
                raise TransferError(f"{src}: no valid {MANIFEST} (incomplete checkpoint?): {exc}") from None
            folder = Path(scratch) / "download"
            for rel in manifest:
                source.get(rel, folder / rel)
            verify(folder, manifest)
        if target is None:
            _install_local(folder, manifest, _local(dst))
        else:
            for rel in manifest:
                target.put(folder / rel, rel)
            manifest_file = Path(scratch) / MANIFEST
            manifest_file.write_text(json.dumps(manifest, indent=1, sort_keys=True))
            target.put(manifest_file, MANIFEST)  # last: marks the checkpoint complete
    return manifest


def _install_local(folder: Path, manifest: dict[str, dict[str, Any]], dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for rel in manifest:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(folder / rel, staging / rel)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        verify(staging, manifest)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
