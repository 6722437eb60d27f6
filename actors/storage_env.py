"""Where the storage layer's credentials and endpoints come from, and how SDK errors read.

Split from :mod:`actors.storage` because it is the one part that knows each cloud's conventions:
the environment variables a user already has (``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``,
``STORAGE_EMULATOR_HOST``, ``AZURE_STORAGE_*``), the checks that turn "no credentials" into a
named variable instead of s3fs/gcsfs silently going anonymous (after which every private object
looks missing), and the classification of each SDK's exceptions into one line. Secrets are only
passed to the SDKs, never put into a message.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
from typing import Any

from orchestrator.core.errors import UserError

PROTOCOLS = {"file": "file", "s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "az", "abfs": "abfs", "abfss": "abfs"}
SUPPORTED = "a local path, file://, s3://, gs://, az:// or abfs://"


class StorageError(UserError):
    """A storage location that cannot be used: bad scheme, unreachable, no credentials, missing object."""


class StorageUnreachable(StorageError):
    """The store did not answer (connection refused or dropped, a timeout): an outage a job rides out for a
    while (:func:`actors.storage.retried`); a command says it in one line."""


class StorageFull(StorageError):
    """No room for a write (no space left, a quota, a file-size limit): one line naming the location and the bytes
    it needed."""


class StorageFailed(RuntimeError):
    """A job's checkpoint the store did not take: unreachable past ``RunConfig.storage_retry_s``, or full.
    Infrastructure, not the user's input and not a worker's death: a driver exits :data:`EXIT_STORAGE` with this one
    line, and a supervisor relaunches the run (from its newest committed checkpoint) without blaming the offer."""


EXIT_STORAGE = 74  # EX_IOERR
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
               "ClientConnectorError", "ServerDisconnectedError", "ServiceRequestError", "ConnectionError", "ConnectError"}


def scheme(location: str | os.PathLike[str]) -> str:
    """The URI scheme, '' for a plain local path."""
    text = os.fspath(location)
    head, sep, _ = text.partition("://")
    return head.lower() if sep and head.isascii() and head.replace("+", "").isalnum() else ""


def options(protocol: str, text: str) -> dict[str, Any]:
    """Endpoints and credentials from the environment; short connect timeouts so an unreachable
    endpoint is reported in seconds, not after minutes of retries."""
    env = os.environ
    if protocol == "s3":
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        opts: dict[str, Any] = {"use_listings_cache": False,
                                "config_kwargs": {"connect_timeout": 5, "retries": {"max_attempts": 2, "mode": "standard"}}}
        if endpoint:
            opts["endpoint_url"] = endpoint
        if not _aws_credentials(*(env.get(k) for k in _AWS_ENV)):
            raise StorageError(f"{text}: {credentials_hint(protocol)}")
        return opts
    if protocol == "gcs":
        opts = {"use_listings_cache": False}
        emulator = env.get("STORAGE_EMULATOR_HOST")
        if emulator:
            opts["endpoint_url"] = emulator if "://" in emulator else f"http://{emulator}"
            opts["token"] = "anon"
        elif not _google_credentials(env.get("GOOGLE_APPLICATION_CREDENTIALS"), env.get("CLOUDSDK_CONFIG")):
            raise StorageError(f"{text}: {credentials_hint(protocol)}")
        return opts
    opts = {"use_listings_cache": False}
    if env.get("AZURE_STORAGE_CONNECTION_STRING"):
        opts["connection_string"] = env["AZURE_STORAGE_CONNECTION_STRING"]
    elif env.get("AZURE_STORAGE_ACCOUNT_NAME"):
        opts["account_name"] = env["AZURE_STORAGE_ACCOUNT_NAME"]
        if not (env.get("AZURE_STORAGE_ACCOUNT_KEY") or env.get("AZURE_STORAGE_SAS_TOKEN")):
            opts["anon"] = False  # Azure AD credentials (DefaultAzureCredential)
    else:
        raise StorageError(f"{text}: {credentials_hint(protocol)}")
    return opts


_AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
            "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_EC2_METADATA_DISABLED",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE")


@functools.lru_cache(maxsize=8)
def _aws_credentials(*env: str | None) -> bool:
    """Whether botocore's chain finds credentials (asked once per environment): s3fs would
    otherwise fall back to unsigned requests and report every object as missing."""
    import botocore.session

    try:
        return botocore.session.get_session().get_credentials() is not None
    except Exception:  # noqa: BLE001 - a broken profile is "no usable credentials"
        return False


@functools.lru_cache(maxsize=8)
def _google_credentials(*env: str | None) -> bool:
    """Whether google-auth finds credentials (gcsfs would otherwise go anonymous, and every
    private object would look missing)."""
    try:
        import google.auth

        google.auth.default()
    except Exception:  # noqa: BLE001 - DefaultCredentialsError, a malformed key file, ...
        return False
    return True


def credentials_hint(protocol: str) -> str:
    return {
        "s3": "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)",
        "gcs": "no Google credentials: set GOOGLE_APPLICATION_CREDENTIALS (or STORAGE_EMULATOR_HOST)",
    }.get(protocol, "no Azure storage credentials: set AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_NAME")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def classify(location: str | os.PathLike[str], exc: BaseException) -> str:
    names = {cls.__name__ for cls in type(exc).__mro__}
    protocol = PROTOCOLS.get(scheme(location), "file")
    if names & {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError", "ClientAuthenticationError",
                "CredentialUnavailableError"}:
        return credentials_hint(protocol)
    if unreachable(exc):
        return f"storage endpoint unreachable ({_endpoint(protocol)})"
    if isinstance(exc, OSError) and exc.errno in FULL:
        return "no space left" if exc.errno == errno.ENOSPC else exc.strerror or "no space left"
    if isinstance(exc, IsADirectoryError):
        return "it is a directory"
    if isinstance(exc, NotADirectoryError):
        return "a parent is not a directory"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {first_line(exc)}"


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the store did not answer (rather than refused the request)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & UNREACHABLE) or (
        isinstance(exc, OSError) and exc.errno in (errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH))


def full(location: str | os.PathLike[str], action: str, exc: OSError, need: int | None) -> StorageFull:
    """The one line of a write that found no room: the location, the bytes it needed and those free (local)."""
    text = os.fspath(location)
    free = ""
    if scheme(text) in ("", "file"):
        try:
            free = f", {shutil.disk_usage(os.path.dirname(os.path.abspath(text.split('://', 1)[-1])) or '.').free} bytes free"
        except OSError:
            pass
    needs = f"needs {need} bytes" if need is not None else "needs more room"
    return StorageFull(f"{text}: cannot {action}: {exc.strerror or 'no space left'} ({needs}{free})")


def _endpoint(protocol: str) -> str:
    env = os.environ
    if protocol == "s3":
        return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "AWS S3"
    if protocol == "gcs":
        return env.get("STORAGE_EMULATOR_HOST") or "Google Cloud Storage"
    return "Azure Blob Storage"
