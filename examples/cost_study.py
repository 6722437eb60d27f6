"""Where should a 4-day ResNet-50 job run, and when should it move? A driver a user copies.

Uses the bundled price snapshot (or --catalog PATH with any importable price file/folder) and the
thesis' throughputs if ../shared is present, else a small hand-written table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cloud.importers import load_any, load_snapshot  # noqa: E402
from cloud.migration import MigrationCosts, plan_migration  # noqa: E402
from cloud.policies import JobDemand, cheapest, min_cost_with_deadline  # noqa: E402
from cloud.records import Offer, is_estimate  # noqa: E402
from cloud.store import PriceStore  # noqa: E402
from cloud.throughput import ThroughputTable  # noqa: E402

ORACLE = Path(__file__).resolve().parents[2] / "shared/pricing_traces/training_on_a_dime/notebooks/oracle_throughputs.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--catalog", type=Path)
    parser.add_argument("--deadline-h", type=float, default=48.0)
    args = parser.parse_args()
    store = PriceStore(load_any(args.catalog) if args.catalog else load_snapshot())
    model = "ResNet-50 (batch size 64)"
    table = (ThroughputTable.from_oracle_json(ORACLE, scaling_efficiency=0.9) if ORACLE.exists()
             else ThroughputTable({(model, "V100", 1): 5.46, (model, "T4", 1): 1.9, (model, "A100", 1): 12.0}, 0.9))
    job = JobDemand("resnet50", model, samples=4 * 24 * 3600 * table.get(model, "V100", 1))
    offers = store.latest()

    def basis(offer: Offer) -> str:
        """Say when a price is an estimate (the bundled spot rows are), never let it pass as observed."""
        row = offers[(offers.cloud == offer.cloud) & (offers.region == offer.region) & (offers.zone == offer.zone)
                     & (offers.instance_type == offer.instance_type) & (offers.spot == offer.spot)].iloc[0]
        return f"[{row.source}]" if is_estimate(row.source) else f"[observed {row.observed_at:%Y-%m-%d}]"

    best = cheapest(offers, table, job)
    print(f"best value: {best.offer.label()} {best.hours:.1f} h ${best.cost_usd:.2f} {basis(best.offer)}")
    fast = min_cost_with_deadline(offers, table, job, args.deadline_h)
    print(f"cheapest within {args.deadline_h:g} h: {fast.offer.label()} {fast.hours:.1f} h ${fast.cost_usd:.2f} "
          f"{basis(fast.offer)}")
    decision = plan_migration(fast.offer, offers, table, model, job.samples / 2, MigrationCosts(checkpoint_gb=0.2))
    print(f"halfway through on {fast.offer.label()}: {decision}")
    print("prices compared:")
    for line in PriceStore(offers).provenance():
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
