"""The price-source interface, the registry of clouds, and the retry rule all sources share.

Each cloud lives in its own module (``cloud.aws``, ``cloud.gcp``, ``cloud.azure``) and is only
imported when asked for by name, so importing :mod:`cloud` never pulls an SDK or touches the
network. Credentials are whatever each SDK's standard chain finds; this code never reads, prints
or stores them.
"""

from __future__ import annotations

import importlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Protocol, TypeVar, runtime_checkable

from orchestrator.errors import UserError

from .records import CLOUD_ALIASES, PriceRecord, canonical_cloud

log = logging.getLogger(__name__)
T = TypeVar("T")


class CloudError(UserError):
    """A permanent failure talking to a cloud: names the cloud, the call and the reason."""

    def __init__(self, cloud: str, call: str, reason: str) -> None:
        super().__init__(f"{cloud}: {call} failed: {reason}")
        self.cloud, self.call, self.reason = cloud, call, reason


class TransientError(Exception):
    """Raised by a source's classifier for errors worth retrying (throttling, 5xx, timeouts)."""


@runtime_checkable
class PriceSource(Protocol):
    """What every cloud module provides.

    ``fetch`` yields spot and on-demand prices of GPU instances in ``regions`` (all known GPU
    regions when empty) observed in ``[start, end]``; on-demand list prices carry the time they
    were read. Sources may yield more than asked (a catalog has no time filter); the store
    de-duplicates.
    """

    name: str

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


def retry_call(
    fn: Callable[[], T],
    *,
    cloud: str,
    call: str,
    classify: Callable[[BaseException], str | None],
    attempts: int = 5,
    base_delay_s: float = 0.5,
    max_delay_s: float = 20.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``fn``; retry transient failures with exponential backoff and jitter.

    ``classify(exc)`` returns ``"transient"`` to retry, a reason string for a permanent failure
    (raised as :class:`CloudError`), or ``None`` to let the exception through untouched (a bug).
    The last transient failure also becomes a :class:`CloudError`, so callers see one kind of
    error naming the cloud and the call.
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except CloudError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below
            verdict = classify(exc)
            if verdict is None:
                raise
            if verdict != "transient":
                raise CloudError(cloud, call, verdict) from None
            if attempt == attempts:
                raise CloudError(cloud, call, f"still failing after {attempts} attempts: {_short(exc)}") from None
            delay = min(max_delay_s, base_delay_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
            log.info("%s %s: transient error (%s), retry %d in %.1fs", cloud, call, _short(exc), attempt, delay)
            sleep(delay)
    raise AssertionError("unreachable")


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def http_status_verdict(status: int | None, message: str) -> str:
    """Shared HTTP classification: 429/5xx/timeouts retry, 401/403 name credentials, else permanent."""
    if status is None or status == 429 or status >= 500:
        return "transient"
    if status in (401, 403):
        return f"not authorized (HTTP {status}): check the credentials of the standard chain ({message[:120]})"
    return f"HTTP {status}: {message[:200]}"


__all__ = [
    "CLOUD_ALIASES", "CloudError", "PriceSource", "TransientError", "available_sources",
    "get_source", "http_status_verdict", "retry_call",
]
