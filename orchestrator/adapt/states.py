"""The controller's vocabulary: its states, its configuration, and what each step records.

Apart from :mod:`orchestrator.adapt.controller` so that the state machine's file holds the machine, and so that
the layers above (the elastic job's configs, growth) can name a configuration or a record without the machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from orchestrator.adapt.monitor import MonitorConfig
from orchestrator.adapt.policies import ArbiterConfig, Decision


class ControllerState(str, Enum):
    WARMUP = "warmup"
    STEADY = "steady"
    ADAPTING = "adapting"


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    warmup_iterations: int = 5
    """Iterations before the first decision: enough for the monitor to know each track's noise
    (five samples), so that the first decision is not made on bands it has not measured yet."""
    monitor: MonitorConfig = MonitorConfig()
    arbiter: ArbiterConfig = ArbiterConfig()
    use_moves: bool = True
    use_restart: bool = False
    straight: bool = False
    """Only moves that keep one device per stage."""
    replan_algorithm: str = "pipedream"
    moves_per_pause: int = 0
    """Moves of a chosen path carried out between two iterations (0: the whole path at once, so a
    detected change is answered before the next iteration instead of one move per iteration —
    the rest of a path would otherwise be re-judged on a model its own first moves disturbed).
    A whole path is carried out as one live move from the current plan to the path's end: each
    block is handed over once, to its final owner, in one stall (a block the path would move
    twice travels once), and the path is priced that way."""
    max_walk: int = 32
    confirm_top: int = 2
    """Single moves confirmed with the simulator besides the walk's and the path's ends."""
    move_overhead_s: float = 0.05
    """Prior per-move stall beyond transfers; replaced by measurements."""
    restart_fixed_s: float = 20.0
    """Prior restart time beyond checkpoint I/O; replaced by measurements."""
    storage_gbps: float = 8.0
    total_iterations: int | None = None
    calibration_alpha: float = 0.5
    initiative_noise: float = 2.0
    """A decision no confirmed change prompted (the first after warm-up, a follow-up after a move)
    weighs gains against this many times the noise floor: its predicted gain rests only on belief
    differences nobody tested — on identical live devices, phantom gains of 1–3.8% against floors
    of 2.2–6%, so at one deviation a quiet run moved now and then — while a confirmed change is a
    tested one and gets the plain floor."""
    replan_reuse_tol: float | None = None
    """A full re-plan computed on a believed model is reused while every speed and bandwidth stays
    within this log distance of that model's; ``None``: the monitor's ``enter`` threshold (the
    change-detection resolution: smaller deviations are never reported as changes), so it is
    computed once per detected change; 0: only for the identical model. The re-plan's destination
    is always re-timed on the current model before the arbiter sees it."""
    plan_ahead: bool = True
    """Compute the planner's answer (the full re-plan before its polishing walk, which is redone
    per detected change) for the nominal cluster when the controller is built, and for each newly
    believed model in a background thread as soon as the model is known (between iterations), so
    that it runs while the next iteration does; a decision that needs it waits only for what is
    left. The answer is the same as computing it in the decision (a pure function of the model);
    only where the time is spent changes."""


@dataclass(frozen=True)
class Transition:
    step: int
    before: ControllerState
    after: ControllerState
    reason: str


@dataclass(frozen=True)
class StepRecord:
    step: int
    iteration: int
    state: ControllerState  # after the step
    iteration_s: float
    completed: bool
    decision: Decision | None = None
    decision_s: float = 0.0
    action: str = ""  # "", "move", "path-move", "restart"
    action_s: float = 0.0  # stall or downtime the action cost
