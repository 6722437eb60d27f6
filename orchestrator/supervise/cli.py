"""``orchestrator run`` (the supervisor) and ``orchestrator events`` (a run's merged event log)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.core.errors import UserError
from orchestrator.core.files import check_output_dir

PROVIDERS = ("local", "existing", "ray-up")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("run", help="supervise a driver from outside its cluster: provision, submit, migrate, relaunch",
                       description="orchestrator run [options] -- DRIVER.py [driver args]")
    p.add_argument("--provider", choices=PROVIDERS, default="local",
                   help="local: separate Ray clusters on this machine; existing: --address; ray-up: Ray's cluster launcher")
    p.add_argument("--storage", required=True, help="the run's storage URI (checkpoints, run record, events; s3://, gs://, az://, a folder)")
    p.add_argument("--out", help="folder for the price file and, at the end, the merged events.jsonl")
    p.add_argument("--run-id", help="the run's id (default: the storage's, else a new one)")
    p.add_argument("--resume", choices=("auto", "never", "require"), default="auto", help="for the first job (default auto)")
    p.add_argument("--working-dir", default=".", help="uploaded as the driver's working directory (default .)")
    p.add_argument("--price-change-at", type=int, help="rehearsal: the current offer's price rises after this step")
    p.add_argument("--kill-cluster-at", type=int, help="rehearsal (local): kill the current cluster's processes after this step")
    p.add_argument("--max-recoveries", type=int, default=3, help="relaunches after unasked deaths (default 3)")
    p.add_argument("--clusters", type=int, default=2, help="local: offers, one local cluster each (default 2)")
    p.add_argument("--cpus", type=int, default=4, help="local: CPUs (device slots) of each local cluster (default 4)")
    p.add_argument("--address", help="existing: the cluster's GCS host:port")
    p.add_argument("--dashboard", help="existing: its Job API URL (default http://HOST:8265)")
    p.add_argument("--auth-token-path", help="existing: the cluster's Ray auth token file (default RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token)")
    p.add_argument("--devices", type=int, default=4, help="existing/ray-up: GPUs the driver uses (default 4)")
    p.add_argument("--catalog", help="ray-up: price file or folder to take offers from (default: the bundled snapshot)")
    p.add_argument("--gpu", help="ray-up: GPU model of the offers (e.g. V100)")
    p.add_argument("--cloud", action="append", default=[], help="ray-up: restrict offers to a cloud (repeatable)")
    p.add_argument("--max-offers", type=int, default=3, help="ray-up: the cheapest N offers, failed over in order")
    p.add_argument("--cloud-config", help="ray-up: YAML with your project/subscription/network per cloud")
    p.add_argument("driver", nargs=argparse.REMAINDER, help="-- DRIVER.py [driver args]")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("events", help="print a run's event log: every segment, ordered by time")
    p.add_argument("storage", help="the run's storage URI")
    p.set_defaults(func=cmd_events)


def cmd_events(args: argparse.Namespace) -> int:
    from actors import storage
    from orchestrator.supervise.state import EVENTS, merged_events

    if not storage.exists(storage.join(args.storage, EVENTS)):
        raise UserError(f"{args.storage}: no event log here (expected {storage.join(args.storage, EVENTS)}/*.jsonl)")
    for event in merged_events(args.storage):
        print(json.dumps(event, default=str))
    return 0


def _storage(text: str) -> str:
    from actors import storage

    scheme = storage.scheme(text)
    if scheme and scheme not in storage.PROTOCOLS:
        raise UserError(f"--storage {text}: unknown scheme {scheme!r} (use {storage.SUPPORTED})")
    # the driver runs in a copy of the working dir: a local folder must be absolute
    return str(Path(storage.local_path(text)).resolve()) if storage.is_local(text) else text.rstrip("/")


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.supervise.supervisor import Supervisor, SupervisorConfig

    driver = list(args.driver[1:] if args.driver[:1] == ["--"] else args.driver)
    if not driver:
        raise UserError("orchestrator run: give the driver after --, e.g. -- examples/elastic_gpt.py --steps 24")
    working_dir = Path(args.working_dir).resolve()
    if not working_dir.is_dir():
        raise UserError(f"--working-dir {args.working_dir}: not a folder")
    if not driver[0].endswith(".py") or not (working_dir / driver[0]).is_file():
        raise UserError(f"driver {driver[0]!r}: no such Python file in {working_dir}")
    for flag, value in (("--clusters", args.clusters), ("--cpus", args.cpus), ("--devices", args.devices),
                        ("--max-offers", args.max_offers)):
        if value < 1:
            raise UserError(f"{flag} must be >= 1, got {value}")
    if args.kill_cluster_at is not None and args.provider != "local":
        raise UserError("--kill-cluster-at is a rehearsal for --provider local only")
    out = Path(args.out).resolve() if args.out else None
    if out is not None:
        check_output_dir(out, "--out")  # before anything is written to the storage
    offers, provisioner = _provider(args, out)
    config = SupervisorConfig(driver=tuple(driver), storage=_storage(args.storage), offers=tuple(offers),
                              working_dir=str(working_dir), run_id=args.run_id, resume=args.resume, out=out,
                              price_change_at=args.price_change_at, kill_cluster_at=args.kill_cluster_at,
                              max_recoveries=args.max_recoveries)
    return Supervisor(config, provisioner).run()


def _provider(args: argparse.Namespace, out: Path | None) -> tuple[list[Any], Any]:
    from cloud.records import Offer
    from orchestrator.supervise.offers import local_offers

    if args.provider == "local":
        from orchestrator.supervise.local import LocalProvisioner

        if args.clusters < 2 and (args.price_change_at or args.kill_cluster_at):
            raise UserError("the rehearsals move the run to another cluster: --clusters must be >= 2")
        return local_offers(args.clusters, args.cpus), LocalProvisioner(cpus=args.cpus)
    if args.provider == "existing":
        from orchestrator.supervise.provision import ExistingProvisioner

        provisioner = ExistingProvisioner(args.address or os.environ.get("RAY_ADDRESS", ""), args.dashboard, args.auth_token_path)
        return [Offer("existing", "existing", "", provisioner.address, args.gpu or "V100", args.devices, False, 1.0)], provisioner
    return _rayup_offers(args, out)


def _rayup_offers(args: argparse.Namespace, out: Path | None) -> tuple[list[Any], Any]:
    import yaml

    from cloud.importers import load_any, load_snapshot
    from cloud.records import Offer, normalize_gpu
    from orchestrator.supervise.offers import ranked
    from orchestrator.supervise.rayup import RayUpProvisioner

    table = load_any(args.catalog) if args.catalog else load_snapshot()
    table = table[(table.gpu_count == args.devices) & (table.usd_per_hour > 0) & table.spot]
    if args.gpu:
        table = table[table.gpu_type.map(normalize_gpu) == normalize_gpu(args.gpu)]
    if args.cloud:
        table = table[table.cloud.isin(args.cloud)]
    offers = ranked([Offer(str(r.cloud), str(r.region), str(r.zone), str(r.instance_type), str(r.gpu_type),
                           int(r.gpu_count), bool(r.spot), float(r.usd_per_hour)) for r in table.itertuples()])
    unique = list({o.label(): o for o in offers}.values())[: args.max_offers]
    if not unique:
        raise UserError(f"no spot offer with {args.devices} GPUs{' of ' + args.gpu if args.gpu else ''} in the catalog")
    cloud_config: dict[str, Any] = {}
    if args.cloud_config:
        try:
            cloud_config = yaml.safe_load(Path(args.cloud_config).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UserError(f"--cloud-config {args.cloud_config}: {' '.join(str(exc).split())[:200]}") from None
        if not isinstance(cloud_config, dict):
            raise UserError(f"--cloud-config {args.cloud_config}: expected a mapping of cloud -> settings")
    workdir = (out / "clusters") if out else Path(tempfile.mkdtemp(prefix="raypipe-clusters-"))
    workdir.mkdir(parents=True, exist_ok=True)
    return unique, RayUpProvisioner({o.label(): o for o in unique}, workdir, cloud_config)
