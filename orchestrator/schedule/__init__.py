"""Schedule IR, generators, lowering and validation (see ir.py for the data model)."""

from orchestrator.schedule.ir import Action, Kind, Schedule, parse_action, unit_fraction, units_of
from orchestrator.schedule.lowering import lower
from orchestrator.schedule.validate import ScheduleError, render_grid, validate

__all__ = [
    "Action", "Kind", "Schedule", "ScheduleError", "lower", "parse_action", "render_grid",
    "unit_fraction", "units_of", "validate",
]
