"""What the migration planner sees of the price catalog, owned by the job (built once, changed only here).

Apart from :mod:`orchestrator.elastic.job_spot` (which builds it and asks the planner over it) so that the job's
view (:class:`~orchestrator.elastic.job_view.JobView`) can name its type without importing the spot side.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datetime import datetime

    from cloud.records import Offer
    from cloud.throughput import ThroughputTable


@dataclass
class PriceView:
    """What the migration planner sees: the latest price of every offer (replayed price changes
    applied), the offer the job runs on (with the ``observed_at`` of its price: ``current.as_event()``
    is what ``job_started`` records as ``offer``), and this model's simulated throughput on each
    (GPU type, count)."""

    offers: Any  # pandas.DataFrame: one row per offer (``cloud.store.latest_rows``)
    current: "Offer"
    throughputs: "ThroughputTable"

    def age_s(self, now: "datetime") -> float | None:
        """Age of the current offer's price at ``now`` (None: unknown)."""
        return self.current.age_s(now)

    def is_current(self) -> Any:
        """A boolean mask over ``offers``: the rows of the offer the job runs on."""
        cur, offers = self.current, self.offers
        return (offers.cloud == cur.cloud) & (offers.region == cur.region) & (offers.zone == cur.zone) \
            & (offers.instance_type == cur.instance_type) & (offers.spot == cur.spot)

    def reprice_current(self, factor: float) -> "Offer":
        """A replayed price change of the offer the job runs on: its rows and ``current`` scaled by ``factor``."""
        self.offers.loc[self.is_current(), "usd_per_hour"] *= factor
        self.current = replace(self.current, usd_per_hour=self.current.usd_per_hour * factor)
        return self.current


__all__ = ["PriceView"]
