"""Redaction looks at values as well as keys, in nested structures and in exception text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.elastic.observability import EventLog, redact, redact_text

AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(
    "text, secret",
    [
        ("https://acct.blob.core.windows.net/c?sv=2020-08-04&sig=abcDEF%2B123xyz&se=2030", "abcDEF%2B123xyz"),
        ("DefaultEndpointsProtocol=https;AccountName=x;AccountKey=Zm9vYmFyYmF6cXV4==;EndpointSuffix=core", "Zm9vYmFyYmF6cXV4=="),
        (f"InvalidAccessKeyId: {AWS_ID} is not valid", AWS_ID),
        (f"signature mismatch for secret {AWS_SECRET}", AWS_SECRET),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc", "eyJhbGciOiJIUzI1NiJ9.e30.abc"),
        ("connect postgres://admin:hunter2@db:5432/x failed", "hunter2"),
        ("{'password': 'hunter2', 'user': 'bob'}", "hunter2"),
        ("ran with --api-key s3cr3tvalue", "s3cr3tvalue"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow"),
    ],
)
def test_secret_values_are_replaced(text: str, secret: str) -> None:
    out = redact_text(text, secrets=[])
    assert secret not in out and "***" in out


def test_harmless_values_are_kept() -> None:
    keep = {"path": "/tmp/ckpt/step_00000003", "sha256": "ab" * 32, "step": 3, "policy": "spot-cheapest", "gpu": "V100"}
    assert redact(keep, []) == keep


def test_nested_lists_dicts_and_exceptions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_KEY", "plain-env-secret-value")
    payload = {
        "attempts": [{"url": "s3://b/k?X-Amz-Signature=deadbeef42"}, ("token=abc123def",)],
        "error": RuntimeError("upload failed with key plain-env-secret-value"),
        "client_secret": "x",
    }
    out = json.dumps(redact(payload))
    for secret in ("deadbeef42", "abc123def", "plain-env-secret-value"):
        assert secret not in out
    assert json.loads(out)["client_secret"] == "***"
    assert json.loads(out)["error"].startswith("RuntimeError: upload failed")


def test_event_log_never_writes_exception_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    log = EventLog(tmp_path / "events.jsonl")
    log.emit("job_failed", error=f"ClientError: SignatureDoesNotMatch for {AWS_SECRET}", details=[{"sas": "sv=1&sig=zz"}])
    text = (tmp_path / "events.jsonl").read_text()
    assert AWS_SECRET not in text and "sig=zz" not in text and "job_failed" in text
