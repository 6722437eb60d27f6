"""The top layer: the ``orchestrator`` command line and ``make demo``. Nothing imports this package."""

from orchestrator.cli.commands import main

__all__ = ["main"]
