"""Downloading a public price catalog (SkyPilot's ``vms.csv`` files) to a temporary file.

Why here and not in a price source: a catalog is a file somebody else keeps current (SkyPilot's CI
rebuilds it every 7 hours), so a user without cloud credentials still gets current spot prices;
it is imported like any local file. The server's ``Last-Modified`` is when its prices were read,
so it becomes the rows' ``observed_at``.
"""

from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.request
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path

from .errors import CloudInputError

#: A SkyPilot vms.csv is a few MB; anything far larger is not a price catalog.
MAX_CATALOG_BYTES = 256 * 2**20
TIMEOUT_S = 30.0


def download(url: str, timeout_s: float = TIMEOUT_S) -> tuple[Path, datetime]:
    """``url`` into a temporary ``.csv`` file (the caller deletes it) and when the server last
    changed it (now when it does not say). One CloudInputError line on any failure."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:  # noqa: S310 - http(s) only, checked by caller
            modified = _last_modified(answer.headers.get("Last-Modified"))
            fd, name = tempfile.mkstemp(prefix="raypipe-catalog-", suffix=".csv")
            size = 0
            with os.fdopen(fd, "wb") as out:
                while chunk := answer.read(1 << 20):
                    size += len(chunk)
                    if size > MAX_CATALOG_BYTES:
                        out.close()
                        Path(name).unlink(missing_ok=True)
                        raise CloudInputError(f"{url}: more than {MAX_CATALOG_BYTES >> 20} MiB; not a price catalog")
                    out.write(chunk)
    except urllib.error.HTTPError as exc:
        raise CloudInputError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        if isinstance(exc, CloudInputError):
            raise
        reason = getattr(exc, "reason", exc)
        raise CloudInputError(f"{url}: cannot download ({' '.join(str(reason).split())[:160]})") from None
    return Path(name), modified


def _last_modified(header: str | None) -> datetime:
    if header:
        try:
            stamp = parsedate_to_datetime(header)
            return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)
        except (TypeError, ValueError):
            pass
    return datetime.now(timezone.utc)
