"""The offers a run may be placed on, and the price file the job prices migrations with.

With the ``local`` provider each local cluster is an offer: ``local/<letter>/cpu-N (spot)``, all
at one list price, standing in for ``gpu_type`` (the job's cost model simulates the model on that
GPU type; two local offers of one type differ only by price, so a price change alone decides).
The price file (``RAYPIPE_PRICES``) is the catalog's schema CSV (what
:func:`cloud.importers.load_any` reads), one row per offer, stamped when the run starts.
"""

from __future__ import annotations

import csv
from pathlib import Path

from cloud.records import SCHEMA, Offer
from orchestrator.supervise.state import stamp

LOCAL_PRICE = 1.0
"""$/h of every local offer in the price file (only their ratio matters)."""
PRICE_FACTOR = 4.0
"""The rehearsal ``--price-change-at``: the current offer's price times this, so that another
offer of the same throughput costs a quarter: the cost model moves (tests/test_supervisor.py
checks that :func:`cloud.migration.plan_migration` says so on the price file)."""


def local_offers(count: int, devices: int, gpu_type: str = "V100") -> list[Offer]:
    """``count`` local clusters of ``devices`` CPU slots each, as offers of one price."""
    return [Offer("local", "local", chr(ord("a") + i), f"cpu-{devices}", gpu_type, devices, True, LOCAL_PRICE)
            for i in range(count)]


def write_price_file(offers: list[Offer], path: Path, source: str = "raypipe supervisor: local clusters") -> Path:
    """The offers as schema CSV rows, stamped now; written whole then renamed (the job may read it)."""
    now = stamp()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(SCHEMA))
        writer.writeheader()
        for o in offers:
            writer.writerow({"timestamp": now, "cloud": o.cloud, "region": o.region, "zone": o.zone,
                             "instance_type": o.instance_type, "gpu_type": o.gpu_type, "gpu_count": o.gpu_count,
                             "spot": o.spot, "usd_per_hour": o.usd_per_hour, "source": source, "observed_at": now})
    tmp.replace(path)
    return path


def ranked(offers: list[Offer]) -> list[Offer]:
    """Cheapest first (ties by label: a stable order for failover)."""
    return sorted(offers, key=lambda o: (o.usd_per_hour, o.label()))
