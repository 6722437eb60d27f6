"""Adaptive controller (AutoPipe-Hu): keep a running job near its best partition as resources change.

Monitor (observations → believed speeds/bandwidths) → cost model → two-worker incremental moves
ranked by a vectorized estimate and confirmed by the simulator → explicit switch arbiter → live
move carried out by the job that runs the controller (the elastic job, or the simulated job over the simulated
runtime). See ``controller.py`` for the state machine and ``handle.py`` for what a move ships.
"""

from orchestrator.adapt.controller import Controller, ControllerConfig, ControllerState, StepRecord, Transition
from orchestrator.costmodel.estimate import CostModel, Layout
from orchestrator.adapt.faults import FaultSchedule, Join, Kill, Slowdown, Throttle, scenario, set_inter_node_bandwidth
from orchestrator.adapt.handle import IterationMetrics, MoveReport, RestartReport, move_transfers, handover_time
from orchestrator.adapt.monitor import MonitorConfig, Beliefs, Track, model_cluster, observe, update_track
from orchestrator.planners.moves import Move, MoveKind, path_to, walk, workers_touched
from orchestrator.adapt.policies import (
    ArbiterConfig, ExplicitArbiter, Option, Restart, Stay, Switch, full_replan, on_worker_death, should_switch,
)
from orchestrator.adapt.simulated import NoiseTrace, SimulatedCosts, SimulatedJob, SimulatedRuntime

__all__ = [
    "ArbiterConfig", "Controller", "ControllerConfig", "CostModel", "ExplicitArbiter", "FaultSchedule",
    "IterationMetrics", "Join", "Kill", "Layout", "MonitorConfig", "Beliefs", "Move", "MoveKind", "MoveReport", "NoiseTrace", "Option",
    "Restart", "RestartReport", "SimulatedCosts", "SimulatedJob", "SimulatedRuntime", "Slowdown", "ControllerState", "Stay", "StepRecord",
    "Switch", "Throttle", "Track", "Transition", "full_replan", "model_cluster", "move_transfers", "observe",
    "on_worker_death", "path_to", "scenario", "set_inter_node_bandwidth", "should_switch", "handover_time", "update_track", "walk",
    "workers_touched",
]
