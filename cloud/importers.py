"""Importers: turn price files of three known formats into the store schema, detecting the format.

(a) training_on_a_dime traces - AWS ``describe-spot-price-history`` JSON per region/type, Azure
    daily CSVs (one column per VM size), GCP spin-up logs;
(b) SkyPilot catalog ``vms.csv`` (GCP GPUs are rows without an instance type, priced here with
    the cheapest host VM that can carry them);
(c) our own schema CSV (``pricing_data/gpu_prices.csv`` and the store cache).

A single bad file is a :class:`CloudInputError` naming the file; a folder imports every file it
recognises and fails only when it recognises none.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pandas as pd

from .errors import CloudInputError

from .records import INSTANCE_GPUS, SCHEMA, normalize_azure_size, normalize_gpu, utc
from .store import normalize

SNAPSHOT = Path(__file__).resolve().parents[1] / "pricing_data" / "gpu_prices.csv"
AZURE_TRACE_REGIONS = {"us_east": "eastus", "us_north_central": "northcentralus", "us_south_central": "southcentralus"}
_GCP_LINE = re.compile(r"Zone: (\S+), GPU type: (\S+), Number of GPUs: (\d+), Price per hour: \$([\d.]+)")
_STAMP_IN_NAME = re.compile(r"(\d{4}-\d{2}-\d{2}T[\d:.]+Z?)")


def load_snapshot(path: Path | str | None = None) -> pd.DataFrame:
    """The bundled price snapshot (or any schema CSV)."""
    return load_schema_csv(Path(path) if path else SNAPSHOT)


def load_schema_csv(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path, keep_default_na=False, dtype={"zone": str, "region": str})
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, EOFError, ValueError, zlib.error) as exc:
        raise CloudInputError(f"{path}: unreadable price CSV ({_first_line(exc)})") from None
    return normalize(frame, str(path))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


AWS_SPOT_FIELDS = ("AvailabilityZone", "InstanceType", "SpotPrice", "Timestamp")


def read_json(path: Path, what: str) -> object:
    """A JSON file's value, or one CloudInputError line (bytes that are not UTF-8, bad syntax,
    nesting too deep for the parser, a duplicate key)."""
    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as exc:
        raise CloudInputError(f"{path}: not {what} (not UTF-8 text: byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise CloudInputError(f"{path}: not {what} (bad JSON at line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise CloudInputError(f"{path}: not {what} (JSON nested too deeply)") from None
    except OSError as exc:
        raise CloudInputError(f"{path}: unreadable ({exc.strerror or exc})") from None
    except CloudInputError as exc:  # a duplicate key, found by the hook below
        raise CloudInputError(f"{path}: not {what} ({exc})") from None


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise CloudInputError(f"duplicate JSON key {key!r} (the last would silently win)")
        out[key] = value
    return out


def load_aws_spot_json(path: Path) -> pd.DataFrame:
    """One ``describe-spot-price-history`` output; GPU facts from the instance table.

    The shape is checked record by record (a list where a record belongs, a record without
    ``SpotPrice``, a number where a zone name belongs): one line naming the file and the record.
    """
    what = "a describe-spot-price-history JSON"
    payload = read_json(path, what)
    if not isinstance(payload, dict) or not isinstance(payload.get("SpotPriceHistory"), list):
        raise CloudInputError(f"{path}: not {what} (needs an object with a SpotPriceHistory list)")
    items = payload["SpotPriceHistory"]
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise CloudInputError(f"{path}: SpotPriceHistory[{i}] is a {type(item).__name__}, not a record")
        missing = [k for k in AWS_SPOT_FIELDS if k not in item]
        if missing:
            raise CloudInputError(f"{path}: SpotPriceHistory[{i}] lacks {', '.join(missing)}")
        bad = [k for k in AWS_SPOT_FIELDS if not isinstance(item[k], str)]
        if bad:
            raise CloudInputError(f"{path}: SpotPriceHistory[{i}].{bad[0]} is a {type(item[bad[0]]).__name__}, not a string")
    if not items:
        return normalize(pd.DataFrame(columns=list(SCHEMA)), str(path))
    raw = pd.DataFrame([{k: item[k] for k in AWS_SPOT_FIELDS} for item in items])
    gpus = raw.InstanceType.map(lambda t: INSTANCE_GPUS["aws"].get(t, ("", 0)))
    frame = pd.DataFrame({
        "timestamp": raw.Timestamp, "cloud": "aws",
        "region": raw.AvailabilityZone.str.rstrip("abcdefghijklmnopqrstuvwxyz"),
        "zone": raw.AvailabilityZone, "instance_type": raw.InstanceType,
        "gpu_type": gpus.str[0], "gpu_count": gpus.str[1], "spot": True,
        "usd_per_hour": raw.SpotPrice, "source": f"training_on_a_dime:{path.name}",
    })
    return normalize(frame[frame.gpu_count > 0], str(path))


def load_azure_daily_csv(path: Path) -> pd.DataFrame:
    """Azure daily spot CSV: Date + one "$price" column per VM size; empty = not offered."""
    try:
        raw = pd.read_csv(path, dtype=str)
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as exc:
        raise CloudInputError(f"{path}: unreadable CSV ({_first_line(exc)})") from None
    region = AZURE_TRACE_REGIONS.get(path.stem, path.stem.replace("_", ""))
    long = raw.melt(id_vars=["Date"], var_name="size", value_name="price").dropna(subset=["price"])
    long["size"] = long["size"].map(normalize_azure_size)
    unknown = sorted(set(long["size"]) - set(INSTANCE_GPUS["azure"]))
    if unknown:
        raise CloudInputError(f"{path}: unknown Azure VM size {unknown[0]!r}")
    gpus = long["size"].map(INSTANCE_GPUS["azure"])
    try:
        prices = long.price.str.replace("$", "", regex=False).str.replace(",", "", regex=False).astype(float)
        stamps = pd.to_datetime(long.Date, format="%m/%d/%Y", utc=True)
    except ValueError as exc:
        raise CloudInputError(f"{path}: bad value ({exc})") from None
    frame = pd.DataFrame({
        "timestamp": stamps, "cloud": "azure", "region": region, "zone": "", "instance_type": long["size"],
        "gpu_type": gpus.str[0], "gpu_count": gpus.str[1], "spot": True, "usd_per_hour": prices,
        "source": f"training_on_a_dime:{path.name}",
    })
    return normalize(frame, str(path))


def load_gcp_spinup(path: Path) -> pd.DataFrame:
    """GCP spin-up log: one line per preemptible VM that could be created (price is computed)."""
    match = _STAMP_IN_NAME.search(path.name)
    if not match:
        raise CloudInputError(f"{path}: GCP spin-up log name must carry its ISO timestamp")
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as exc:
        raise CloudInputError(f"{path}: unreadable GCP spin-up log ({type(exc).__name__})") from None
    for line in text.splitlines():
        m = _GCP_LINE.search(line)
        if m:
            zone, gpu, count, price = m.groups()
            rows.append({
                "timestamp": match.group(1), "cloud": "gcp", "region": zone.rsplit("-", 1)[0], "zone": zone,
                "instance_type": "n1-standard-8", "gpu_type": normalize_gpu(gpu), "gpu_count": int(count),
                "spot": True, "usd_per_hour": float(price), "source": f"training_on_a_dime:{path.name}",
            })
    return normalize(pd.DataFrame(rows, columns=list(SCHEMA)), str(path))


def load_skypilot(path: Path, cloud: str | None = None, observed_at: datetime | None = None) -> pd.DataFrame:
    """A SkyPilot ``vms.csv``; one schema row per (instance, zone, on-demand|spot).

    The catalog has no time per row: every row is stamped ``observed_at`` (default: the file's
    modification time, which a download sets to the server's ``Last-Modified``).
    """
    try:
        raw = pd.read_csv(path)
        return _skypilot_rows(path, raw, cloud, observed_at)
    except CloudInputError:
        raise
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CloudInputError(f"{path}: not a usable SkyPilot vms.csv ({_first_line(exc)})") from None


def _skypilot_rows(path: Path, raw: pd.DataFrame, cloud: str | None, observed_at: datetime | None) -> pd.DataFrame:
    from .gcp import host_options

    need = {"InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "SpotPrice", "Region"}
    if not need <= set(raw.columns):
        raise CloudInputError(f"{path}: not a SkyPilot vms.csv (missing {', '.join(sorted(need - set(raw.columns)))})")
    cloud = cloud or _guess_cloud(path, raw)
    if "AvailabilityZone" not in raw.columns:
        raw["AvailabilityZone"] = ""
    for column in ("AvailabilityZone", "InstanceType", "AcceleratorName"):  # text columns, empty when missing
        raw[column] = raw[column].astype(object).where(raw[column].notna(), "").astype(str)
    if cloud == "gcp":
        gpu_rows = raw[(raw.InstanceType == "") & (raw.AcceleratorName != "")]
        hosts = raw[(raw.InstanceType != "") & (raw.AcceleratorName == "")].rename(
            columns={"InstanceType": "instance_type", "vCPUs": "vcpus", "MemoryGiB": "memory_gb", "AvailabilityZone": "zone"})
        combined = []
        for g in gpu_rows.to_dict("records"):
            gpu, count = normalize_gpu(str(g["AcceleratorName"])), int(g["AcceleratorCount"])
            options = host_options(gpu, count, hosts, str(g["AvailabilityZone"]))
            for column in ("Price", "SpotPrice"):
                priced = options.dropna(subset=[column])
                if priced.empty or pd.isna(g[column]):
                    continue
                host = priced.iloc[int(priced[column].to_numpy().argmin())]
                total = float(host[column]) + float(g[column])
                combined.append({"Region": g["Region"], "AcceleratorName": gpu, "AcceleratorCount": count,
                                 "InstanceType": host["instance_type"], "AvailabilityZone": g["AvailabilityZone"],
                                 "Price": total if column == "Price" else float("nan"),
                                 "SpotPrice": total if column == "SpotPrice" else float("nan")})
        raw = pd.concat([raw[(raw.InstanceType != "") & (raw.AcceleratorName != "")], pd.DataFrame(combined)],
                        ignore_index=True)
    raw = raw[(raw.AcceleratorName != "") & (raw.InstanceType != "")]
    for column in ("Price", "SpotPrice", "AcceleratorCount"):
        raw[column] = pd.to_numeric(raw[column], errors="raise")
    stamp = pd.Timestamp(utc(observed_at)) if observed_at else pd.Timestamp(path.stat().st_mtime, unit="s", tz="UTC")
    frames = []
    for column, spot in (("Price", False), ("SpotPrice", True)):
        part = raw.dropna(subset=[column])
        frames.append(pd.DataFrame({
            "timestamp": stamp, "cloud": cloud, "region": part.Region, "zone": part.AvailabilityZone,
            "instance_type": part.InstanceType.map(normalize_azure_size) if cloud == "azure" else part.InstanceType,
            "gpu_type": part.AcceleratorName.map(normalize_gpu), "gpu_count": part.AcceleratorCount.astype(float).astype(int),
            "spot": spot, "usd_per_hour": part[column], "source": f"skypilot:{path}", "observed_at": stamp,
        }, columns=list(SCHEMA)))
    return normalize(pd.concat(frames, ignore_index=True), str(path))


def _guess_cloud(path: Path, raw: pd.DataFrame) -> str:
    for part in reversed(path.parts[:-1]):
        if part.lower() in ("aws", "gcp", "azure"):
            return part.lower()
    region = str(raw.Region.dropna().iloc[0]) if raw.Region.notna().any() else ""
    if re.fullmatch(r"[a-z]{2}-[a-z]+-\d", region):
        return "aws"
    if re.fullmatch(r"[a-z]+-[a-z]+\d", region):
        return "gcp"
    if re.fullmatch(r"[a-z]+\d?", region):
        return "azure"
    raise CloudInputError(f"{path}: cannot tell which cloud this SkyPilot catalog is for (put it under aws/, gcp/ or azure/)")


def _stamped(loader: Callable[[Path], pd.DataFrame], observed_at: datetime | None) -> Callable[[Path], pd.DataFrame]:
    if loader is load_skypilot and observed_at is not None:
        return lambda p: load_skypilot(p, observed_at=observed_at)
    return loader


def _cloud_in_url(url: str) -> str | None:
    parts = [part.lower() for part in url.split("?")[0].split("/")]
    found = [part for part in parts if part in ("aws", "gcp", "azure")]
    return found[-1] if found else None


def detect(path: Path) -> Callable[[Path], pd.DataFrame] | None:
    """The loader for one file, from its content, or None when it is not a price file."""
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix == ".json":
        head = path.read_text(errors="replace")[:400]
        return load_aws_spot_json if "SpotPriceHistory" in head else None
    if suffix == ".out":
        return load_gcp_spinup if _STAMP_IN_NAME.search(path.name) else None
    if suffix in (".csv", ".csv.gz"):
        try:
            header = list(pd.read_csv(path, nrows=0).columns)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError):
            return None
        if "usd_per_hour" in header:
            return load_schema_csv
        if "InstanceType" in header and "Price" in header:
            return load_skypilot
        if header[:1] == ["Date"] and len(header) > 1:
            return load_azure_daily_csv
    return None


def load_any(path: Path | str, observed_at: datetime | None = None) -> pd.DataFrame:
    """Load a price file or a folder of them (any mix of the three formats) into the schema.

    ``observed_at`` stamps the rows of files that carry no time of their own (SkyPilot catalogs;
    default: each file's modification time). An ``http(s)://`` address is downloaded first
    (:func:`cloud.remote.download`; a SkyPilot catalog URL).
    """
    if isinstance(path, str) and path.startswith(("http://", "https://")):
        from .remote import download

        local, modified = download(path)
        try:
            return load_skypilot(local, _cloud_in_url(path), observed_at or modified)
        finally:
            local.unlink(missing_ok=True)
    p = Path(path)
    if not p.exists():
        raise CloudInputError(f"{p}: no such price file or folder")
    if p.is_file():
        loader = detect(p)
        if loader is None:
            raise CloudInputError(f"{p}: not a recognised price file (AWS spot JSON, Azure daily CSV, SkyPilot vms.csv or price CSV)")
        return _stamped(loader, observed_at)(p)
    if not p.is_dir():
        raise CloudInputError(f"{p}: not a regular file or folder (a FIFO or device is never read)")
    frames = []
    for file in sorted(q for q in p.rglob("*") if q.is_file() and "availability" not in q.parts):
        loader = detect(file)
        if loader is not None:
            frames.append(_stamped(loader, observed_at)(file))
    frames = [f for f in frames if len(f)]
    if not frames:
        raise CloudInputError(f"{p}: no price files found in this folder")
    return normalize(pd.concat(frames, ignore_index=True), str(p))
