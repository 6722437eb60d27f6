"""What switching really costs, learnt from what switches measured.

Why a value of its own: the controller prices every option by a model of its cost (hand-over
transfers on the believed links plus a per-move overhead; a fixed restart time plus checkpoint
I/O), and the model is only a prior. Each move and restart reports what it really stalled, and
the controller folds that in — a frozen :class:`Calibration` replaced after each report, so the
pricing rule and its learning sit in one place and a test can probe them without a pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Calibration:
    move_overhead_s: float
    """Per-move stall beyond the hand-over transfers."""
    restart_fixed_s: float
    """Restart time beyond checkpoint I/O."""
    handover_scale: float | None = None
    """Measured stall over predicted hand-over where the model over-prices it (``None``: no move
    measured yet, the believed links' word stands)."""
    alpha: float = 0.5
    """Weight of the newest report."""

    def move_price(self, transfers_s: float) -> float:
        """Predicted stall of one live move whose hand-over the believed links time at ``transfers_s``."""
        return (1.0 if self.handover_scale is None else self.handover_scale) * transfers_s + self.move_overhead_s

    def after_move(self, transfers_s: float, stall_s: float) -> "Calibration":
        """Learn from a move that stalled ``stall_s`` where the links predicted ``transfers_s``:
        beyond the hand-over, the excess is per-move overhead; short of it, the model over-prices
        hand-overs and they are scaled down (the first measured move replaces the prior outright).
        One-sided (the overhead alone), a model whose links are believed too slow keeps pricing
        every move at its own figure: live, a one-block move priced at 0.9–1.7 s stalled 80 ms, and
        a 2.5% gain (10 ms per iteration over 50) was refused as not paying for it."""
        a = self.alpha
        scale = stall_s / transfers_s if 0 < stall_s < transfers_s else 1.0
        learnt = scale if self.handover_scale is None else (1 - a) * self.handover_scale + a * scale
        overhead = (1 - a) * self.move_overhead_s + a * max(0.0, stall_s - scale * transfers_s)
        return replace(self, move_overhead_s=overhead, handover_scale=learnt)

    def after_restart(self, io_s: float, downtime_s: float) -> "Calibration":
        """Learn from a restart that was down ``downtime_s``, of which ``io_s`` checkpoint I/O."""
        a = self.alpha
        return replace(self, restart_fixed_s=(1 - a) * self.restart_fixed_s + a * max(0.0, downtime_s - io_s))
