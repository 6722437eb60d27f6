"""What a job tells the outside world: a JSONL event log, Ray dashboard metrics, and plots.

Every state change of a job (start, iteration, move, checkpoint, preemption notice, migration,
restart) is one JSON object per line with a wall-clock timestamp, so a run can be replayed,
grepped, or loaded into pandas (``pandas.read_json(path, lines=True)``). Secrets never enter an
event: :func:`redact` replaces credential-looking keys *and* values (nested lists and dicts, exception
text) before anything is written.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from orchestrator.core.errors import UserError
from orchestrator.core.files import read_text
from orchestrator.core.timeline import save_figure

_SECRET_KEY = re.compile(r"(secret|password|passwd|token|credential|access[_-]?key|account[_-]?key|api[_-]?key|private[_-]?key|sas|signature|auth)", re.I)
_SECRET_WORD = r"(?:[A-Za-z0-9_.-]*(?:secret|password|passwd|token|credential|access[_-]?key|account[_-]?key|api[_-]?key|private[_-]?key|signature|auth)[A-Za-z0-9_.-]*|sig|sas|se?cret)"
_SECRET_TEXT = [
    (re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]+", re.I), r"\1 ***"),
    # key=value, key: value, "key": "value" (query strings, connection strings, repr of dicts, CLI flags)
    (re.compile(rf"""({_SECRET_WORD}["']?\s*[=:]\s*["']?)([^\s"'&;,)}}\]]+)""", re.I), r"\1***"),
    (re.compile(rf"(--{_SECRET_WORD}[ =])(\S+)", re.I), r"\1***"),
    (re.compile(r"\b((?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16})\b"), "***"),  # AWS key ids
    (re.compile(r"(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]*[/+])(?=[A-Za-z0-9/+]*[a-z])(?=[A-Za-z0-9/+]*[A-Z])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"), "***"),  # AWS secret keys
    (re.compile(r"([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@", re.I), r"\1***@"),  # user:password@ in URLs
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)", re.S), "***"),
]
_MIN_ENV_SECRET = 8
_ENV_SECRET = re.compile(r"(secret|password|passwd|token|credential|(^|_)key($|_)|sas|auth|connection_string)", re.I)


def _env_secrets() -> list[str]:
    """Values of this process's credential-looking environment variables (long enough to be specific)."""
    return sorted((v for k, v in os.environ.items() if _ENV_SECRET.search(k) and len(v) >= _MIN_ENV_SECRET), key=len, reverse=True)


def redact_text(text: str, secrets: Sequence[str] | None = None) -> str:
    """``text`` with credential-looking pieces replaced by ``***``: ``key=value`` pairs with a secret
    key name, AWS key ids and secret keys, bearer tokens, ``user:password@`` in URLs, PEM private
    keys, and the literal value of any credential environment variable (an exception message from
    an SDK may quote one)."""
    for value in _env_secrets() if secrets is None else secrets:
        text = text.replace(value, "***")
    for pattern, replacement in _SECRET_TEXT:
        text = pattern.sub(replacement, text)
    return text


def redact(payload: Any, _secrets: Sequence[str] | None = None) -> Any:
    """A copy of ``payload`` safe to write: credential-looking keys become ``"***"`` and every string
    value (in nested dicts, lists and tuples too, exception text included) goes through
    :func:`redact_text`. Exceptions are written as ``"Type: message"``, redacted."""
    secrets = _env_secrets() if _secrets is None else _secrets
    if isinstance(payload, Mapping):
        return {key: "***" if _SECRET_KEY.search(str(key)) else redact(value, secrets) for key, value in payload.items()}
    if isinstance(payload, (list, tuple, set, frozenset)):
        return [redact(v, secrets) for v in payload]
    if isinstance(payload, BaseException):
        return redact_text(f"{type(payload).__name__}: {payload}", secrets)
    if isinstance(payload, (str, os.PathLike)):
        return redact_text(os.fspath(payload) if not isinstance(payload, str) else payload, secrets)
    return payload


@dataclass
class EventLog:
    """Append-only JSONL log; each line is flushed and fsynced so a crash loses at most the last event."""

    path: Path
    clock: Callable[[], float] = time.time
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"time": self.clock(), "event": event, **redact(fields)}
        line = json.dumps(record, default=_jsonable)
        with self._lock, open(self.path, "a") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return record

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        records = []
        for lineno, line in enumerate(read_text(self.path, "event log").splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise UserError(f"event log {self.path}:{lineno}: invalid JSON ({exc.msg})") from None
        return records


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    return str(value)


class RayMetrics:
    """Throughput, bubble fraction and cost rate as Ray metrics, shown on the Ray dashboard.

    Created lazily and only when Ray is initialized, so planning-only use never imports Ray's
    metrics agent.
    """

    def __init__(self, job: str) -> None:
        from ray.util.metrics import Counter, Gauge

        tags = ("job",)
        self._tags = {"job": job}
        self.throughput = Gauge("raypipe_samples_per_second", "training throughput", tag_keys=tags)
        self.bubble = Gauge("raypipe_bubble_fraction", "mean pipeline bubble fraction", tag_keys=tags)
        self.cost_rate = Gauge("raypipe_usd_per_hour", "current compute cost rate", tag_keys=tags)
        self.iterations = Counter("raypipe_iterations", "completed iterations", tag_keys=tags)
        self.moves = Counter("raypipe_moves", "controller moves and migrations", tag_keys=tags)

    def record_iteration(self, samples_per_s: float, bubble_fraction: float, usd_per_hour: float | None = None) -> None:
        self.throughput.set(samples_per_s, tags=self._tags)
        self.bubble.set(bubble_fraction, tags=self._tags)
        if usd_per_hour is not None:
            self.cost_rate.set(usd_per_hour, tags=self._tags)
        self.iterations.inc(1.0, tags=self._tags)

    def record_move(self) -> None:
        self.moves.inc(1.0, tags=self._tags)


def plot_throughput(
    iterations: Sequence[int],
    samples_per_s: Sequence[float],
    events: Iterable[tuple[int, str]],
    path: str | Path,
    title: str = "throughput",
) -> Path:
    """Throughput per iteration with vertical markers for controller and job events."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(list(iterations), list(samples_per_s), marker=".", linewidth=1)
    ymax = max(samples_per_s) if samples_per_s else 1.0
    for it, label in events:
        ax.axvline(it, color="#C44E52", linestyle="--", linewidth=0.8)
        ax.text(it, ymax * 1.02, label, rotation=90, fontsize=7, va="bottom", ha="right")
    ax.set_xlabel("iteration")
    ax.set_ylabel("samples / s")
    ax.set_title(title)
    ax.set_ylim(0, ymax * 1.35)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_prices(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    chosen: Sequence[tuple[float, str]],
    path: str | Path,
    title: str = "spot prices and chosen placement",
) -> Path:
    """Price traces (hours, $/h per placement) with the chosen placement over time highlighted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    for name, (hours, prices) in series.items():
        ax.step(list(hours), list(prices), where="post", linewidth=1, label=name)
    for hour, name in chosen:
        ax.axvline(hour, color="black", linestyle=":", linewidth=0.8)
        ax.text(hour, ax.get_ylim()[1], f" → {name}", rotation=90, fontsize=7, va="top")
    ax.set_xlabel("hours")
    ax.set_ylabel("USD / hour")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return save_figure(fig, path)
