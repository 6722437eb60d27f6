"""``orchestrator status | stop | runs``: watch, stop and list runs from anywhere that can read their storage.

Why from storage: a run outlives its processes and may move between clusters, so the one place that always
knows it is its storage location. The job writes what a watcher wants into its run record at most once a second
(:class:`~orchestrator.elastic.run_record.Live`); these commands only read it, and ``stop`` writes one small
request beside it that the job honours between steps (it commits, records ``stopped`` and exits 0). Whoever may
write a run's storage may stop it. Like every command, a mistake is one line and exit 2, with nothing written.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import stat
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from orchestrator.core.errors import UserError

ACTIVE = ("running", "migrating")
RUN_DEPTH = 4
"""``runs PREFIX`` looks for run records this many folders below the prefix, no deeper (bounded on any bucket)."""
WATCH_S = 2.0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("status", help="a run's status from its storage: step, loss, samples/s, plan, cost, age")
    p.add_argument("storage", help="the run's storage (a folder, s3://, gs://, az://)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--watch", action="store_true", help=f"redraw every {WATCH_S:g} s until the run ends (Ctrl-C leaves)")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("stop", help="ask a running run to stop: it finishes its step, commits, records 'stopped'")
    p.add_argument("storage", help="the run's storage")
    p.set_defaults(func=cmd_stop)
    p = sub.add_parser("runs", help="the runs under a folder or bucket prefix")
    p.add_argument("prefix", help="a folder or s3://, gs://, az:// prefix")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_runs)


def _check_location(where: str) -> None:
    """A local path must be a folder: a file, a FIFO or a device is named, never opened."""
    from actors import storage

    if storage.is_local(where):
        path = storage.local_path(where)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise UserError(f"{where}: no such folder") from None
        except OSError as exc:
            raise UserError(f"{where}: cannot read ({exc.strerror})") from None
        if not stat.S_ISDIR(mode):
            raise UserError(f"{where}: not a folder (a run's storage is a folder or an object-store prefix)")


def _record(where: str) -> Any:
    """The run record at ``where`` (one line when there is none, or it cannot be read)."""
    from orchestrator.elastic import run_record as rr
    from orchestrator.supervise.state import _fresh

    _check_location(where)
    _fresh(rr.location(where))
    record = rr.read(where)
    if record is None:
        raise UserError(f"{where}: no run here (no {rr.RECORD})")
    return record


def status_of(where: str) -> dict[str, Any]:
    """What ``status --json`` prints (see the module docstring)."""
    from orchestrator.supervise.state import STATE, newest_committed, read_json
    from actors import storage

    record = _record(where)
    live = record.live
    supervisor = read_json(storage.join(where, STATE)) or {}
    cluster = supervisor.get("cluster") or {}
    out: dict[str, Any] = {
        "run_id": record.run_id, "storage": where, "status": record.status, "step": record.steps_done,
        "target": live.target if live else None, "loss": live.loss if live else None,
        "eval_loss": live.eval_loss if live else None, "samples_per_s": live.samples_per_s if live else None,
        "last_committed": newest_committed(where, record.last_committed),
        "plan": [asdict(s) for s in live.plan] if live else [],
        "recoveries": (live.recoveries if live else 0) + int(supervisor.get("recoveries") or 0),
        "moves": live.moves if live else 0, "migrations": int(bool(supervisor.get("price_migrated"))),
        "usd_total": live.usd_total if live else 0.0, "usd_per_hour": live.usd_per_hour if live else None,
        "usd_lost": live.usd_lost if live else 0.0, "samples": live.samples if live else 0,
        "usd_per_million_samples": live.usd_per_million_samples if live else None,
        "eta_s": live.eta_s if live and record.status in ACTIVE else None,
        "age_s": round(max(0.0, time.time() - record.updated_at), 1),
        "updated": datetime.fromtimestamp(record.updated_at, timezone.utc).isoformat(timespec="seconds"),
        "cluster": cluster.get("cluster_id") or record.cluster, "offer": cluster.get("offer"),
    }
    if record.migration is not None:
        out["migration"] = asdict(record.migration)
    return out


def _text(s: dict[str, Any]) -> str:
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [f"run {s['run_id']}  {s['status']}  step {s['step']}/{num(s['target'], 'd')}  "
             f"(read {s['age_s']:g} s ago{'; stale?' if s['status'] in ACTIVE and s['age_s'] > 120 else ''})",
             f"  loss {num(s['loss'], '.4f')}  eval {num(s['eval_loss'], '.4f')}  {num(s['samples_per_s'], '.1f')} samples/s  "
             f"eta {num(s['eta_s'], '.0f')} s  committed {num(s['last_committed'], 'd')}",
             f"  recoveries {s['recoveries']}  moves {s['moves']}  migrations {s['migrations']}  "
             f"${s['usd_total']:.4f} so far at ${num(s['usd_per_hour'], '.3f')}/h (lost to recoveries ${s['usd_lost']:.4f}; "
             f"${num(s['usd_per_million_samples'], '.2f')} per million samples)"]
    if s["cluster"]:
        lines.append(f"  cluster {s['cluster']}  offer {s['offer'] or '-'}")
    for k, stage in enumerate(s["plan"]):
        nodes = sorted({n[:8] for n in stage["nodes"]})
        lines.append(f"  stage {k}: blocks [{stage['blocks'][0]}, {stage['blocks'][1]}) on devices {list(stage['devices'])} "
                     f"(node {', '.join(nodes)})")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    where = _location(args.storage)
    while True:
        s = status_of(where)
        if args.json:
            print(json.dumps(s), flush=True)
        else:
            if args.watch and sys.stdout.isatty():
                print("\033[H\033[J", end="")  # redraw in place
            print(_text(s), flush=True)
        if not args.watch or s["status"] not in ACTIVE:
            return 0
        time.sleep(WATCH_S)


def cmd_stop(args: argparse.Namespace) -> int:
    from orchestrator.elastic import run_record as rr

    where = _location(args.storage)
    record = _record(where)
    if record.status not in ACTIVE:
        raise UserError(f"{where}: run {record.run_id} is {record.status}, not running: nothing to stop")
    rr.request_stop(where, f"{getpass.getuser()}@{socket.gethostname()}")
    print(f"stop requested: run {record.run_id} (step {record.steps_done}) finishes its step, commits and stops")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from actors import storage
    from orchestrator.elastic import run_record as rr

    prefix = _location(args.prefix)
    _check_location(prefix)
    if storage.is_local(prefix):  # listed as absolute folders: what fsspec returns, and what status and stop take
        prefix = os.path.abspath(storage.local_path(prefix))
    fs, path = storage.filesystem(prefix)
    found: list[str] = []
    with storage.errors(prefix, "list"):
        fs.invalidate_cache()
        for depth in range(RUN_DEPTH + 1):
            found += sorted(str(p) for p in fs.glob("/".join([path.rstrip("/"), *["*"] * depth, rr.RECORD])))
    if not found:
        raise UserError(f"{prefix}: no run under it (no {rr.RECORD} within {RUN_DEPTH} folders)")
    rows: list[dict[str, Any]] = []
    for p in found:
        where = _rejoin(prefix, path, p.rsplit("/", 1)[0])
        try:
            record = rr.read(where)
        except UserError as exc:  # a damaged record is listed as such, not a reason to list nothing
            rows.append({"storage": where, "run_id": None, "status": "unreadable", "error": str(exc)})
            continue
        if record is None:
            continue
        live = record.live
        rows.append({"storage": where, "run_id": record.run_id, "status": record.status, "step": record.steps_done,
                     "target": live.target if live else None,
                     "updated": datetime.fromtimestamp(record.updated_at, timezone.utc).isoformat(timespec="seconds"),
                     "usd_total": live.usd_total if live else 0.0})
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{row['storage']}  {row['run_id'] or '-'}  {row['status']}  step {row.get('step', '-')}/"
                  f"{row.get('target') if row.get('target') is not None else '-'}  {row.get('updated', '')}  "
                  f"${row.get('usd_total', 0.0):.4f}")
    return 0


def _location(text: str) -> str:
    from actors import storage

    scheme = storage.scheme(text)
    if scheme and scheme not in storage.PROTOCOLS:
        raise UserError(f"{text}: unknown storage scheme {scheme!r} (use {storage.SUPPORTED})")
    return text.rstrip("/") or text


def _rejoin(prefix: str, path: str, found: str) -> str:
    """A path fsspec returned, under ``prefix`` as the user wrote it (their scheme, their relative folder)."""
    from actors import storage

    rest = found[len(path.rstrip("/")):].lstrip("/") if found.startswith(path.rstrip("/")) else found
    return storage.join(prefix, *[r for r in rest.split("/") if r]) if rest else prefix


__all__ = ["add_parsers", "status_of"]
