"""Throughput per (model, GPU type, GPU count), and cost-normalized throughput (samples per dollar).

The thesis' point is that price alone picks the wrong GPU: a K80 at a fifth of a V100's price is
a bargain for A3C and a waste for ResNet-50. So every policy ranks offers by throughput per
dollar, which needs this table. Entries come from the user (CSV/JSON) or from the thesis'
measured single-GPU throughputs (``oracle_throughputs.json``); counts not measured are
extrapolated from one GPU with a stated scaling efficiency.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import CloudInputError

from .records import did_you_mean, normalize_gpu


@dataclass(frozen=True)
class ThroughputTable:
    """Samples (or steps) per second of ``model`` on ``count`` x ``gpu``.

    ``scaling_efficiency`` is applied per GPU beyond the first when a count is extrapolated:
    ``t(n) = t(1) * n * eff`` (``eff=1`` is linear scaling, the thesis' assumption for
    data-parallel jobs on one multi-GPU instance).
    """

    table: Mapping[tuple[str, str, int], float]
    scaling_efficiency: float = 1.0
    models: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not 0 < self.scaling_efficiency <= 1:
            raise CloudInputError(f"scaling efficiency must be in (0, 1], got {self.scaling_efficiency}")
        clean: dict[tuple[str, str, int], float] = {}
        for (model, gpu, count), value in self.table.items():
            if not str(model).strip() or not normalize_gpu(str(gpu)):
                raise CloudInputError(f"throughput entry {model!r} on {gpu!r}: empty model or GPU name")
            if count <= 0 or not np.isfinite(value) or value < 0:
                raise CloudInputError(f"throughput of {model} on {count}x{gpu}: bad value {value!r}")
            clean[(str(model), normalize_gpu(gpu), int(count))] = float(value)
        object.__setattr__(self, "table", clean)
        object.__setattr__(self, "models", tuple(sorted({m for m, _, _ in clean})))

    def get(self, model: str, gpu: str, count: int) -> float:
        """Throughput, or 0.0 when the model was never measured on this GPU type."""
        gpu = normalize_gpu(gpu)
        exact = self.table.get((model, gpu, count))
        if exact is not None:
            return exact
        single = self.table.get((model, gpu, 1))
        if single is None:
            return 0.0
        return single * count * (self.scaling_efficiency if count > 1 else 1.0)

    def check_model(self, model: str) -> str:
        if model not in self.models:
            raise CloudInputError(f"no throughput for model {model!r}{did_you_mean(model, self.models)}")
        return model

    def column(self, model: str, gpu_types: pd.Series, counts: pd.Series) -> np.ndarray:
        """Vectorised :meth:`get` for a frame of offers."""
        self.check_model(model)
        return np.array([self.get(model, g, int(c)) for g, c in zip(gpu_types, counts)], dtype=float)

    @classmethod
    def from_oracle_json(cls, path: Path | str, scaling_efficiency: float = 1.0) -> ThroughputTable:
        """The thesis' ``oracle_throughputs.json``: gpu -> job -> {"null": isolated throughput, ...}.

        The shape is checked level by level; a value that is not a number (a string, a bool, a
        list, null) is named with its path, not coerced.
        """
        from .importers import read_json

        payload = read_json(Path(path), "an oracle throughput JSON")
        if not isinstance(payload, dict):
            raise CloudInputError(f"{path}: not an oracle throughput JSON (top level is a {type(payload).__name__}, not an object of GPU types)")
        table: dict[tuple[str, str, int], float] = {}
        for gpu, jobs in payload.items():
            if not isinstance(jobs, dict):
                raise CloudInputError(f"{path}: [{gpu!r}] is a {type(jobs).__name__}, not an object of jobs")
            for job, value in jobs.items():
                if not isinstance(value, dict) or "null" not in value:
                    raise CloudInputError(f"{path}: [{gpu!r}][{job!r}] needs an object with a \"null\" throughput")
                number = value["null"]
                if isinstance(number, bool) or not isinstance(number, (int, float)):
                    raise CloudInputError(f"{path}: [{gpu!r}][{job!r}][\"null\"] is a {type(number).__name__}, not a number")
                table[(job, gpu, 1)] = float(number)
        return cls(table, scaling_efficiency)

    @classmethod
    def from_csv(cls, path: Path | str, scaling_efficiency: float = 1.0) -> ThroughputTable:
        """A CSV with columns ``model, gpu_type, gpu_count, throughput``."""
        try:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
        except (OSError, pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
            raise CloudInputError(f"{path}: unreadable throughput CSV ({type(exc).__name__})") from None
        need = ["model", "gpu_type", "gpu_count", "throughput"]
        missing = [c for c in need if c not in frame.columns]
        if missing:
            raise CloudInputError(f"{path}: need columns model, gpu_type, gpu_count, throughput (missing {', '.join(missing)})")
        table: dict[tuple[str, str, int], float] = {}
        for line, (m, g, c, t) in enumerate(zip(frame.model, frame.gpu_type, frame.gpu_count, frame.throughput), start=2):
            try:
                count, value = int(c), float(t)
            except ValueError:
                raise CloudInputError(f"{path}: line {line}: gpu_count {c!r} / throughput {t!r} are not numbers") from None
            table[(m, g, count)] = value
        return cls(table, scaling_efficiency)

    @classmethod
    def load(cls, path: Path | str, scaling_efficiency: float = 1.0) -> ThroughputTable:
        p = Path(path)
        if not p.exists():
            raise CloudInputError(f"{p}: no such throughput file")
        if not p.is_file():
            raise CloudInputError(f"{p}: not a regular file (a folder, FIFO or device is never read)")
        if p.suffix == ".json":
            return cls.from_oracle_json(p, scaling_efficiency)
        return cls.from_csv(p, scaling_efficiency)


def cost_normalized(offers: pd.DataFrame, throughputs: ThroughputTable, model: str) -> pd.DataFrame:
    """Offers with ``throughput`` and ``samples_per_dollar`` columns, best value first.

    Offers the model cannot run on (no measured throughput) are dropped.
    """
    out = offers.copy()
    out["throughput"] = throughputs.column(model, out.gpu_type, out.gpu_count)
    out = out[(out.throughput > 0) & (out.usd_per_hour > 0)]
    out["samples_per_dollar"] = out.throughput * 3600.0 / out.usd_per_hour
    return out.sort_values(["samples_per_dollar", "usd_per_hour"], ascending=[False, True], kind="stable")
