"""raypipe orchestrator: profiles, cluster model, plans, schedule IR, simulator, planners, CLI."""

from orchestrator.errors import UserError
from orchestrator.profile import Block, Profile, load_profile

__all__ = ["Block", "Profile", "UserError", "load_profile"]
