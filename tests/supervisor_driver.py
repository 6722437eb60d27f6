"""A scripted driver that speaks the job's side of the supervisor's protocol (tests only).

It trains nothing: it counts steps, and writes what :class:`~orchestrator.elastic.job_loop.ElasticJob`
writes for the supervisor (``STORAGE/run.json`` through the job's own :mod:`~orchestrator.elastic.run_record`, an
event segment with ``job_started``, a
``migration_requested`` and exit 75 when ``RAYPIPE_PRICE_EVENTS`` fires), so the supervisor's
provisioning, submission, migration and relaunch are tested apart from training. Checkpoints are
"committed" every ``--checkpoint-every`` steps by the record's ``last_committed`` alone.

    python tests/supervisor_driver.py --steps 12 [--checkpoint-every 3] [--step-s 0.3] [--fail-at N]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from datetime import datetime, timezone

from actors import storage
from orchestrator.elastic import run_record as rr


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--checkpoint-every", type=int, default=3)
    p.add_argument("--step-s", type=float, default=0.3)
    p.add_argument("--fail-at", type=int, help="exit 2 as a user error (record status failed) at this step")
    args = p.parse_args()
    root, cluster, resume = os.environ["RAYPIPE_STORAGE"], os.environ["RAYPIPE_CLUSTER"], os.environ["RAYPIPE_RESUME"]
    record = rr.read(root)
    start = (record.last_committed or 0) if record and resume != "never" else 0
    if resume == "require" and not start:
        print("error: RAYPIPE_RESUME=require but nothing committed", file=sys.stderr)
        return 2
    segment = storage.join(root, "events", f"{now().replace(':', '')}-{cluster}.jsonl")
    lines: list[str] = []

    def emit(event: str, **fields: object) -> None:
        lines.append(json.dumps({"event": event, "time": now(), **fields}))
        storage.write_bytes(segment, ("\n".join(lines) + "\n").encode())

    def write(status: rr.Status, step: int, committed: int, migration: rr.MigrationRequest | None = None) -> None:
        rr.write(root, rr.RunRecord(run_id=os.environ["RAYPIPE_RUN_ID"], model_fingerprint="m", config_fingerprint="c",
                                    steps_done=step, last_committed=committed or None, status=status, cluster=cluster,
                                    migration=migration))

    emit("job_started", cluster=cluster, resumed_from=start or None, devices=4, step=start,
         offer=os.environ["RAYPIPE_OFFER"], price_events=os.environ.get("RAYPIPE_PRICE_EVENTS"))
    events = {int(e.split(":")[0]) for e in os.environ.get("RAYPIPE_PRICE_EVENTS", "").split(",") if e}
    committed = start
    write("running", start, committed)
    for step in range(start + 1, args.steps + 1):
        time.sleep(args.step_s)
        print(f"step {step} on {cluster}", flush=True)
        if args.fail_at == step:
            write("failed", step, committed)
            print("error: a user mistake in the driver", file=sys.stderr)
            return 2
        if step % args.checkpoint_every == 0:
            committed = step
        if storage.exists(storage.join(root, "stop.json")):  # orchestrator stop / Ctrl-C: commit, record, exit 0
            storage.remove_file(storage.join(root, "stop.json"))
            write("stopped", step, step)
            emit("stopped", cluster=cluster, step=step)
            return 0
        write("running", step, committed)
        if step in events:
            committed = step
            with open(os.environ["RAYPIPE_PRICES"]) as handle:
                rows = [r for r in csv.DictReader(handle)]
            target = next(r for r in rows if f"{r['cloud']}/{r['zone']}/{r['instance_type']} (spot)" != os.environ["RAYPIPE_OFFER"])
            label = f"{target['cloud']}/{target['zone']}/{target['instance_type']} (spot)"
            emit("migration_requested", reason="price", step=step, target=label)
            write("migrating", step, committed, rr.MigrationRequest("price", step, label))
            print(f"migration requested at step {step} to {label}", file=sys.stderr)
            return 75
    write("finished", args.steps, args.steps)
    emit("job_finished", cluster=cluster, step=args.steps)
    print(f"done {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
