"""``prices`` and ``cost-sim`` subcommands; registered on the orchestrator's CLI by ``add_parsers``.

Also runnable alone (``python -m cloud.cli prices cheapest ...``) through :func:`main`, which
turns a :class:`~cloud.errors.CloudError` into one ``error: ...`` line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from .errors import CloudError, CloudInputError
from .migration import DEFAULT_MAX_PRICE_AGE_S

from .records import CLOUDS, canonical_cloud, did_you_mean, is_estimate, normalize_gpu, utc

MAX_COST_SIM_DAYS = 3650.0  # ten years of one-V100 work: 87,600 hourly steps per policy, seconds to replay

OUTPUT_COLUMNS = ["cloud", "region", "zone", "instance_type", "gpu_type", "gpu_count", "usd_per_hour", "spot"]
TEXT_COLUMNS = [*OUTPUT_COLUMNS, "estimate", "observed"]
DEFAULT_MAX_AGE_S = DEFAULT_MAX_PRICE_AGE_S
THESIS_MODELS = ("ResNet-50 (batch size 64)", "Transformer (batch size 64)", "A3C", "CycleGAN", "ResNet-18 (batch size 64)")


def add_parsers(subparsers: Any) -> None:
    """Register ``prices`` and ``cost-sim`` on an argparse subparsers object."""
    prices = subparsers.add_parser("prices", help="GPU prices across AWS, GCP and Azure")
    actions = prices.add_subparsers(dest="prices_action", required=True)

    refresh = actions.add_parser("refresh", help="fetch new prices from a cloud (or a SkyPilot catalog) into the cache")
    refresh.add_argument("--cloud", help="aws, gcp or azure (the live API; required unless --skypilot)")
    refresh.add_argument("--skypilot", action="append", default=[], metavar="FILE_OR_URL",
                         help="import a SkyPilot vms.csv catalog instead of asking a cloud (repeatable; no credentials needed)")
    refresh.add_argument("--observed-at", help="ISO time the --skypilot prices were read (default: the file's modification time)")
    refresh.add_argument("--region", action="append", default=[], help="repeatable; default: the cloud's GPU regions")
    refresh.add_argument("--instance-type", action="append", default=[])
    refresh.add_argument("--project", help="GCP project (default: google.auth.default())")
    refresh.add_argument("--subscription", help="Azure subscription id (for resource_skus)")
    refresh.add_argument("--cache", type=Path, help="price cache file (default: ~/.cache/raypipe/prices.csv.gz)")
    refresh.set_defaults(func=cmd_refresh)

    for name, helptext in (("show", "list latest prices"), ("cheapest", "cheapest offers for a GPU request")):
        p = actions.add_parser(name, help=helptext)
        p.add_argument("--catalog", help="price file, folder or SkyPilot catalog URL; default: cache, else bundled")
        p.add_argument("--observed-at", help="ISO time the catalog's prices were read, for files without a time per row")
        p.add_argument("--max-age", type=float, default=None, metavar="SECONDS",
                       help=f"warn about prices older than this (default {DEFAULT_MAX_AGE_S:.0f} s)")
        p.add_argument("--gpu", required=name == "cheapest", help="GPU model, e.g. V100, A100, T4")
        p.add_argument("--count", type=int, required=name == "cheapest", help="GPUs per instance")
        p.add_argument("--spot", action="store_true", help="spot/preemptible prices (default: on-demand)")
        p.add_argument("--cloud", action="append", default=[], help="restrict to a cloud (repeatable)")
        p.add_argument("--instance-type", help="restrict to one instance type")
        p.add_argument("--limit", type=int, default=20)
        p.add_argument("--json", action="store_true", help="print a JSON list")
        p.set_defaults(func=cmd_show)

    sim = subparsers.add_parser("cost-sim", help="replay cost policies over a price trace")
    sim.add_argument("--trace", type=Path, required=True, help="price trace file or folder")
    sim.add_argument("--throughputs", type=Path, required=True, help="oracle_throughputs.json or model,gpu_type,gpu_count,throughput CSV")
    sim.add_argument("--model", action="append", default=[], help="model name (repeatable; default: the thesis' five)")
    sim.add_argument("--days", type=float, default=4.0, help="job length on one V100 (default 4 days)")
    sim.add_argument("--start", help="ISO start time (default: first time every policy has an offer)")
    sim.add_argument("--checkpoint-gb", type=float, default=1.0)
    sim.add_argument("--availability", type=Path, help="availability logs (file or folder): replay preemptions too, "
                     "where prices and availability overlap, with on-demand list prices from the bundled snapshot")
    sim.add_argument("--deadline-factor", type=float, default=1.2,
                     help="with --availability: the aware policy must expect to finish within this times on-demand's time")
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(func=cmd_cost_sim)


def load_catalog(path: str | Path | None, observed_at: str | None = None) -> pd.DataFrame:
    """``--catalog``, else the cache over the bundled snapshot (clouds never refreshed keep their snapshot rows)."""
    from .importers import load_any, load_snapshot
    from .store import PriceStore, default_cache_path

    if path is not None:
        return load_any(path if str(path).startswith(("http://", "https://")) else Path(path), parse_time(observed_at))
    snapshot = PriceStore(load_snapshot())
    cache = default_cache_path()
    return PriceStore.load(cache).overlay(snapshot).frame if cache.exists() else snapshot.frame


def parse_time(text: str | None) -> datetime | None:
    """``--observed-at``: an ISO time (naive = UTC), not in the future."""
    if text is None:
        return None
    try:
        stamp = utc(text)
    except ValueError:
        raise CloudInputError(f"--observed-at: not an ISO time: {text!r}") from None
    if stamp > datetime.now(timezone.utc):
        raise CloudInputError(f"--observed-at {text} is in the future")
    return stamp


def cmd_refresh(args: argparse.Namespace) -> int:
    from .sources import get_source
    from .store import PriceStore, default_cache_path

    if args.skypilot:
        return refresh_from_skypilot(args)
    if args.cloud is None:
        raise CloudInputError("prices refresh needs --cloud aws|gcp|azure (live APIs) or --skypilot FILE_OR_URL")
    cloud = canonical_cloud(args.cloud)
    options: dict[str, Any] = {}
    if cloud == "gcp" and args.project:
        options["project"] = args.project
    if cloud == "azure" and args.subscription:
        options["subscription_id"] = args.subscription
    cache = args.cache or default_cache_path()
    _check_cache_path(cache)
    store = PriceStore.load(cache)
    source = get_source(cloud, **options)
    updated = store.refresh(source, args.region, args.instance_type)  # all fetched before anything is saved
    for note in source.skipped:
        print(f"warning: skipped {note}", file=sys.stderr)
    updated.save(cache)
    print(f"{cloud}: {len(updated) - len(store)} new price records; {len(updated)} in {cache}")
    return 0


def refresh_from_skypilot(args: argparse.Namespace) -> int:
    """Import SkyPilot catalogs into the cache: each imported cloud's rows are added as new
    observations (``observed_at`` = the catalog's time), other clouds' rows untouched."""
    from .importers import load_any
    from .store import PriceStore, default_cache_path

    cache = args.cache or default_cache_path()
    _check_cache_path(cache)
    store = PriceStore.load(cache)
    stamp = parse_time(args.observed_at)
    fetched = [load_any(src if src.startswith(("http://", "https://")) else Path(src), stamp) for src in args.skypilot]
    updated = store
    for frame in fetched:  # everything read before anything is saved
        updated = updated.merge(frame)
    updated.save(cache)
    print(f"skypilot: {len(updated) - len(store)} new price records; {len(updated)} in {cache}")
    return 0


def select_offers(frame: pd.DataFrame, args: argparse.Namespace) -> pd.DataFrame:
    """Latest price per offer, filtered by the request; CloudInputError with suggestions when nothing matches."""
    from .store import PriceStore

    store = PriceStore(frame)
    latest = store.latest()
    if args.cloud:
        clouds = [canonical_cloud(c) for c in args.cloud]
        latest = latest[latest.cloud.isin(clouds)]
    if args.gpu:
        gpu = normalize_gpu(args.gpu)
        known = sorted(set(latest.gpu_type) - {""})
        if gpu not in known:
            raise CloudInputError(f"no prices for GPU {args.gpu!r}{did_you_mean(gpu, known)}")
        latest = latest[latest.gpu_type == gpu]
    if args.count is not None:
        if args.count <= 0:
            raise CloudInputError(f"--count must be positive, got {args.count}")
        latest = latest[latest.gpu_count == args.count]
    if args.instance_type:
        known = sorted(set(latest.instance_type))
        if args.instance_type not in known:
            raise CloudInputError(f"unknown instance type {args.instance_type!r}{did_you_mean(args.instance_type, known)}")
        latest = latest[latest.instance_type == args.instance_type]
    latest = latest[latest.spot == bool(args.spot)]
    return latest.sort_values(["usd_per_hour", "cloud", "region", "zone", "instance_type"], kind="stable")


def cmd_show(args: argparse.Namespace) -> int:
    offers = select_offers(load_catalog(args.catalog, args.observed_at), args)
    from .store import default_cache_path

    if args.catalog is None and not default_cache_path().exists():
        print("note: no price cache: these are the bundled snapshot's prices (the last resort; its spot rows are "
              "estimates); get current ones with `orchestrator prices refresh --cloud aws|gcp|azure` or "
              "`--skypilot FILE_OR_URL` (no credentials needed)", file=sys.stderr)
    if offers.empty:
        kind = "spot" if args.spot else "on-demand"
        raise CloudInputError(f"no {kind} offer matches (gpu={args.gpu}, count={args.count}, clouds={args.cloud or list(CLOUDS)})")
    from .store import PriceStore

    from .store import ages_s

    if args.limit < 0:
        raise CloudInputError(f"--limit must be >= 0 (0: all), got {args.limit}")
    max_age = DEFAULT_MAX_AGE_S if args.max_age is None else args.max_age
    if not math.isfinite(max_age) or max_age < 0:
        raise CloudInputError(f"--max-age must be a finite number of seconds >= 0, got {max_age}")
    shown = offers.head(args.limit) if args.limit > 0 else offers
    shown = shown.assign(age_s=ages_s(shown.observed_at, datetime.now(timezone.utc)).round(0))
    old = shown[shown.age_s > max_age]
    if len(old):  # a manual command only warns; automatic moves refuse such prices
        print(f"warning: {len(old)} of {len(shown)} prices are older than {max_age:.0f} s (oldest observed "
              f"{old.observed_at.min():%Y-%m-%d}); refresh with `orchestrator prices refresh`", file=sys.stderr)
    if args.json:  # a list of offer rows; each says where its price came from, when it was read and how old it is
        rows = [{**{c: _plain(r[c]) for c in OUTPUT_COLUMNS}, "timestamp": r["timestamp"].isoformat(),
                 "source": r["source"], "observed_at": r["observed_at"].isoformat(), "age_s": float(r["age_s"]),
                 "estimate": is_estimate(r["source"])}
                for r in shown.to_dict("records")]
        print(json.dumps(rows, indent=1))
    else:
        table = shown.assign(estimate=shown.source.map(is_estimate), observed=shown.observed_at.dt.strftime("%Y-%m-%d"))
        print(table[TEXT_COLUMNS].to_string(index=False))
        print(f"compared {len(offers)} offers from:")
        for line in PriceStore(offers).provenance():
            print(f"  {line}")
    return 0


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def cmd_cost_sim(args: argparse.Namespace) -> int:
    from .importers import load_any
    from .replay import Trace, common_start, replay_job, standard_policies
    from .store import PriceStore
    from .throughput import ThroughputTable

    _check_amount("--days", args.days, MAX_COST_SIM_DAYS, positive=True,
                  note=lambda d: f" (about {d * 24:.3g} one-hour replay steps per policy and model)")
    _check_amount("--checkpoint-gb", args.checkpoint_gb, 1e6)
    table = ThroughputTable.load(args.throughputs)
    models = args.model or [m for m in THESIS_MODELS if m in table.models] or list(table.models[:5])
    for model in models:
        table.check_model(model)
    if args.availability is not None:
        return cost_sim_availability(args, table, models)
    trace = Trace.from_store(PriceStore(load_any(args.trace)), "1h")
    policies = standard_policies(checkpoint_gb=args.checkpoint_gb)
    start = args.start or common_start(trace, policies)
    rows = []
    for model in models:
        samples = args.days * 24 * 3600 * table.get(model, "V100", 1)
        if samples <= 0:
            raise CloudInputError(f"{model!r} has no V100 throughput to size the job")
        results = [replay_job(trace, p, table, model, samples, start) for p in policies]
        base = results[0].cost_usd
        for r in results:
            rows.append({"model": model, "policy": r.policy, "cost_usd": round(r.cost_usd, 2),
                         "reduction": round(base / r.cost_usd, 3), "hours": round(r.hours, 1), "migrations": r.migrations})
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(pd.DataFrame(rows).to_string(index=False))
    return 0


def cost_sim_availability(args: argparse.Namespace, table: Any, models: list[str]) -> int:
    """``cost-sim --availability``: every policy pays for the preemptions the logs say it would have
    suffered; one row per (window, model, policy)."""
    from .availability import load_availability
    from .importers import load_any, load_snapshot
    from .replay_availability import Market, availability_policies, replay_models, windows
    from .store import PriceStore

    _check_amount("--deadline-factor", args.deadline_factor, 100.0, positive=True)
    events = load_availability(args.availability)
    prices = PriceStore(load_any(args.trace))
    markets = [Market.build(w, prices, PriceStore(load_snapshot()), events) for w in windows(prices, events)]
    samples_of = {}
    for model in models:
        samples_of[model] = args.days * 24 * 3600 * table.get(model, "V100", 1)
        if samples_of[model] <= 0:
            raise CloudInputError(f"{model!r} has no V100 throughput to size the job")
    rows = replay_models(markets, availability_policies(args.checkpoint_gb), table, models, samples_of, args.deadline_factor)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        shown = pd.DataFrame(rows).drop(columns=["placements", "left_out", "samples"])
        print(shown.to_string(index=False))
        for market in markets:
            print(f"{market.window.label()}: {len(market.left_out)} offers left out (reasons in --json)")
    return 0


def _check_cache_path(path: Path) -> None:
    """The price cache is replaced by rename: refuse a link, folder, device or FIFO there (and a parent
    that is not a folder) before any cloud is asked, as the orchestrator's own outputs do."""
    import os
    import stat

    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise CloudInputError(f"price cache {path}: {exc.strerror or exc}") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise CloudInputError(f"price cache {path} is not a regular file (a link, folder, device or FIFO); not replaced")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise CloudInputError(f"price cache {path}: {parent} is not a directory")
            break


def _check_amount(flag: str, value: float, limit: float, positive: bool = False,
                  note: Callable[[float], str] = lambda v: "") -> None:
    """A finite amount in ``[0, limit]`` (``> 0`` when ``positive``): ``nan`` and ``1e9`` days are typos
    that would otherwise divide by zero or replay for ever."""
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise CloudInputError(f"{flag} must be a finite number {'> 0' if positive else '>= 0'}, got {value}")
    if value > limit:
        raise CloudInputError(f"{flag} {value:g}{note(value)} is above the limit of {limit:g}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cloud.cli", description=__doc__)
    add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except CloudError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
