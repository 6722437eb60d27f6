"""The price-source interface, the registry of clouds, and the one retry layer: each SDK's own.

Each cloud lives in its own module (``cloud.aws``, ``cloud.gcp``, ``cloud.azure``) and is only
imported when asked for by name, so importing :mod:`cloud` never pulls an SDK or touches the
network. Credentials are whatever each SDK's standard chain finds; this code never reads, prints
or stores them.

Why no retry loop here: botocore, google-api-core and azure-core already retry throttling, 5xx
and dropped connections per request (per *page* when paging), so a loop around a whole paginated
call would multiply their attempts and restart pagination from page 1. The SDKs are configured
once below (:func:`botocore_config`, :func:`google_retry`, :data:`AZURE_RETRY`); :func:`call`
only turns what is left - a permanent error, or a transient one the SDK gave up on - into one
:class:`~cloud.errors.CloudError` line.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar, runtime_checkable

from .errors import CloudError
from .records import CLOUD_ALIASES, PriceRecord, canonical_cloud

T = TypeVar("T")

#: Attempts per request (first try included) for every SDK; a page is one request.
MAX_ATTEMPTS = 5
#: azure-core RetryPolicy settings (keyword arguments of any azure client or PipelineClient).
AZURE_RETRY: dict[str, Any] = {"retry_total": MAX_ATTEMPTS - 1, "retry_backoff_factor": 0.5, "retry_backoff_max": 20}


def botocore_config(**overrides: Any) -> Any:
    """botocore's ``standard`` retry mode (throttling, 5xx, connection errors; jittered backoff)."""
    from botocore.config import Config

    options: dict[str, Any] = {
        "retries": {"mode": "standard", "max_attempts": MAX_ATTEMPTS},
        "connect_timeout": 10, "read_timeout": 60,
    }
    options.update(overrides)
    return Config(**options)


def google_retry(deadline_s: float = 120.0) -> Any:
    """google-api-core's Retry on transient errors (429, 500, 503, connection resets)."""
    from google.api_core import retry as gretry

    return gretry.Retry(predicate=gretry.if_transient_error, initial=0.5, maximum=20.0, multiplier=2.0,
                        timeout=deadline_s)


@runtime_checkable
class PriceSource(Protocol):
    """What every cloud module provides.

    ``fetch`` yields spot and on-demand prices of GPU instances in ``regions`` (all the cloud's
    regions when empty) observed in ``[start, end]``. A region that refuses the caller (an opt-in
    region, a disabled API) is skipped and described in ``skipped``; every other failure raises
    :class:`CloudError` before any record of the failing region is yielded.
    """

    name: str
    skipped: list[str]

    def fetch(
        self,
        regions: Sequence[str] = (),
        instance_types: Sequence[str] = (),
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> Iterable[PriceRecord]: ...


# name -> "module:factory"; data, not string-built dispatch.
_REGISTRY: dict[str, str] = {
    "aws": "cloud.aws:AwsPriceSource",
    "gcp": "cloud.gcp:GcpPriceSource",
    "azure": "cloud.azure:AzurePriceSource",
}


def available_sources() -> list[str]:
    return sorted(_REGISTRY)


def get_source(name: str, **options: object) -> PriceSource:
    """Build the price source of cloud ``name`` (aliases accepted: ``amazon``, ``google``, ``az``...)."""
    cloud = canonical_cloud(name)
    module_name, factory_name = _REGISTRY[cloud].split(":")
    factory = getattr(importlib.import_module(module_name), factory_name)
    source: PriceSource = factory(**options)
    return source


def call(
    fn: Callable[[], T],
    *,
    cloud: str,
    call: str,
    classify: Callable[[BaseException], str | None],
) -> T:
    """Run ``fn`` once (the SDK inside retries); a classified failure becomes :class:`CloudError`.

    ``classify(exc)`` returns a reason string, or ``None`` to let the exception through untouched
    (a bug in our code keeps its traceback).
    """
    try:
        return fn()
    except CloudError:
        raise
    except Exception as exc:  # noqa: BLE001 - classified below
        reason = classify(exc)
        if reason is None:
            raise
        raise CloudError(cloud, call, reason) from None


def short(exc: BaseException) -> str:
    """``Type: first line`` of an exception, at most 200 characters."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def http_status_verdict(status: int | None, message: str) -> str:
    """Reason for an HTTP failure the SDK did not (or could no longer) retry."""
    first = " ".join(str(message).split())[:200]
    if status in (401, 403):
        return f"not authorized (HTTP {status}): check the credentials of the standard chain ({first[:120]})"
    if status is None:
        return f"no answer: {first}"
    if status == 429 or status >= 500:
        return f"still failing after {MAX_ATTEMPTS} attempts (HTTP {status}): {first}"
    return f"HTTP {status}: {first}"


__all__ = [
    "AZURE_RETRY", "CLOUD_ALIASES", "CloudError", "MAX_ATTEMPTS", "PriceSource", "available_sources",
    "botocore_config", "call", "get_source", "google_retry", "http_status_verdict", "short",
]
