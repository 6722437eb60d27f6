"""A Plan: which blocks run where, on how many replicas, in which schedule.

Stages are listed in model order and each is a contiguous block range with its device group.
Interleaving (Megatron PTD-P) is expressed without a second notion of "chunk": a plan with
``p`` device groups and ``v`` virtual chunks simply has ``p·v`` stages where stage ``j`` runs on the
same group as stage ``j mod p``. Replication (data parallelism inside a stage) splits every
micro-batch row-wise across the group's devices, so a stage with ``k`` devices computes each
micro-batch ``k`` times faster and all-reduces gradients once per iteration.

Plans are immutable; the controller's moves produce new Plans.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Sequence

from orchestrator.core import limits
from orchestrator.core.errors import UserError
from orchestrator.core.files import read_json


class ScheduleKind(str, Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZB_H1 = "zb-h1"  # zero bubble (Qi et al., ICLR 2024), H1: 1F1B's peak memory, W deferred into bubbles

    @classmethod
    def parse(cls, text: str) -> "ScheduleKind":
        aliases = {"pipedream-flush": "1f1b", "dapple": "1f1b", "ptd-p": "interleaved", "interleaved-1f1b": "interleaved",
                   "zb": "zb-h1", "zbh1": "zb-h1", "zero-bubble": "zb-h1"}
        key = aliases.get(text.lower(), text.lower())
        for kind in cls:
            if kind.value == key:
                return kind
        raise UserError(f"unknown schedule {text!r}; choose one of {', '.join(k.value for k in cls)}")


@dataclass(frozen=True, slots=True)
class Stage:
    """Blocks ``[first, last)`` on ``devices`` (more than one: data-parallel replicas).
    ``recompute``: keep only the stage's input per in-flight micro-batch and run the forward
    again during backward (activation recomputation: less memory, one more forward)."""

    first: int
    last: int
    devices: tuple[int, ...]
    recompute: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "first", limits.count(self.first, "stage", "first block", minimum=0))
        object.__setattr__(self, "last", limits.count(self.last, f"stage starting at block {self.first}", "last block", minimum=0))
        devices = tuple(self.devices)
        if not all(type(d) is int for d in devices) or (devices and min(devices) < 0):  # the common case, one pass: 1024-device stages
            devices = tuple(limits.count(d, f"stage [{self.first}, {self.last})", "device", minimum=0) for d in devices)
        object.__setattr__(self, "devices", devices)
        if self.last <= self.first:
            raise UserError(f"stage [{self.first}, {self.last}) is empty")
        if not self.devices:
            raise UserError(f"stage [{self.first}, {self.last}) has no devices")
        if len(set(self.devices)) != len(self.devices):
            raise UserError(f"stage [{self.first}, {self.last}) lists a device twice")

    @property
    def replicas(self) -> int:
        return len(self.devices)

    @property
    def num_blocks(self) -> int:
        return self.last - self.first


@dataclass(frozen=True)
class Plan:
    """An executable partition. ``sliced_microbatches`` is AutoPipe's warm-up slicing: the first
    that many micro-batches are each split into two halves that flow as separate units."""

    stages: tuple[Stage, ...]
    num_microbatches: int
    schedule: ScheduleKind = ScheduleKind.ONE_F_ONE_B
    sliced_microbatches: int = 0
    algorithm: str = ""
    predicted_iteration_s: float | None = field(default=None, compare=False)
    objective_s: float | None = field(default=None, compare=False)
    """The planner's own objective for this plan (e.g. PipeDream's bottleneck), when it has one."""
    _groups: tuple[tuple[int, ...], ...] = field(default=(), init=False, repr=False, compare=False)
    """:attr:`device_groups`, derived once by ``__post_init__`` (every simulation reads it, per stage)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "schedule", ScheduleKind(self.schedule))
        if not self.stages:
            raise UserError("plan has no stages")
        if self.schedule is ScheduleKind.ZB_H1 and any(s.recompute for s in self.stages):
            raise UserError("schedule zb-h1 cannot recompute activations (its split backward needs the saved graph); "
                            "use 1f1b or gpipe for stages that recompute")
        object.__setattr__(self, "num_microbatches", limits.count(self.num_microbatches, "plan", "num_microbatches", maximum=limits.MAX_MICROBATCHES))
        object.__setattr__(self, "sliced_microbatches", limits.count(self.sliced_microbatches, "plan", "sliced_microbatches", minimum=0))
        if self.stages[0].first != 0:
            raise UserError("the first stage must start at block 0")
        for a, b in zip(self.stages, self.stages[1:]):
            if b.first != a.last:
                raise UserError(f"stages must be contiguous: [{a.first},{a.last}) is followed by [{b.first},{b.last})")
        owner: dict[int, tuple[int, ...]] = {}
        checked: set[tuple[int, ...]] = set()
        for j, stage in enumerate(self.stages):
            if stage.devices in checked:  # a group seen already: its devices are owned by it (interleaved plans)
                continue
            checked.add(stage.devices)
            for d in stage.devices:
                if owner.setdefault(d, stage.devices) != stage.devices:
                    raise UserError(
                        f"device {d} is in two stages with different device groups: {list(owner[d])} and stage {j}'s "
                        f"{list(stage.devices)} (a device belongs to one group)"
                    )
        groups: list[tuple[int, ...]] = []
        for stage in self.stages:
            if stage.devices in groups:
                break
            groups.append(stage.devices)
        object.__setattr__(self, "_groups", tuple(groups))
        p = len(groups)
        if len(self.stages) % p:
            raise UserError(
                f"{len(self.stages)} stages on {p} device groups: a device group may hold several stages only in the "
                f"interleaved pattern (stage j on group j mod {p}), which needs a multiple of {p} stages"
            )
        for j, stage in enumerate(self.stages):
            if stage.devices != groups[j % p]:
                raise UserError(
                    f"stage {j} runs on {list(stage.devices)} but the interleaved pattern needs {list(groups[j % p])}"
                )
        seen: set[int] = set()
        for g in groups:
            if seen & set(g):
                raise UserError(f"device(s) {sorted(seen & set(g))} appear in two stages")
            seen |= set(g)
        if self.virtual_chunks > 1 and self.schedule is not ScheduleKind.INTERLEAVED:
            raise UserError("a plan with repeated device groups needs the interleaved schedule")
        if not 0 <= self.sliced_microbatches <= self.num_microbatches:
            raise UserError("sliced_microbatches must be between 0 and the micro-batch count")

    # ----- derived views -----
    @property
    def device_groups(self) -> tuple[tuple[int, ...], ...]:
        """Distinct device groups in pipeline order (the physical stages)."""
        return self._groups

    @property
    def num_physical_stages(self) -> int:
        return len(self.device_groups)

    @property
    def virtual_chunks(self) -> int:
        return len(self.stages) // len(self.device_groups)

    @property
    def num_blocks(self) -> int:
        return self.stages[-1].last

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for g in self.device_groups for d in g)

    def stages_of_device(self, device: int) -> list[int]:
        return [j for j, s in enumerate(self.stages) if device in s.devices]

    def stage_of_block(self, block: int) -> int:
        for j, s in enumerate(self.stages):
            if s.first <= block < s.last:
                return j
        raise IndexError(block)

    def check_against(self, num_blocks: int, num_devices: int) -> None:
        if self.num_blocks != num_blocks:
            raise UserError(f"plan covers {self.num_blocks} blocks but the profile has {num_blocks}")
        bad = [d for d in self.devices if not 0 <= d < num_devices]
        if bad:
            raise UserError(f"plan uses device(s) {bad} but the cluster has {num_devices} devices")

    def with_schedule(self, schedule: ScheduleKind) -> "Plan":
        return replace(self, schedule=schedule)

    def describe(self) -> str:
        parts = [f"[{s.first}:{s.last})@{','.join(map(str, s.devices))}{'+recompute' if s.recompute else ''}" for s in self.stages]
        extra = f" v={self.virtual_chunks}" if self.virtual_chunks > 1 else ""
        extra += f" sliced={self.sliced_microbatches}" if self.sliced_microbatches else ""
        return f"{self.schedule.value} M={self.num_microbatches}{extra} " + " ".join(parts)

    # ----- JSON -----
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "raypipe-plan",
            "algorithm": self.algorithm,
            "schedule": self.schedule.value,
            "num_microbatches": self.num_microbatches,
            "sliced_microbatches": self.sliced_microbatches,
            "virtual_chunks": self.virtual_chunks,
            "num_stages": len(self.stages),
            "stages": [{"blocks": [s.first, s.last], "devices": list(s.devices), **({"recompute": True} if s.recompute else {})}
                       for s in self.stages],
            "predicted_iteration_s": self.predicted_iteration_s,
        }

    @classmethod
    def from_dict(cls, data: Any, origin: str = "plan") -> "Plan":
        """A plan file's object, strictly: a known format and version, every field known (what ``plan --out``
        writes beside the plan is in :data:`RESULT_FIELDS`), and ``num_stages`` / ``virtual_chunks``, when
        given, agreeing with the stages."""
        kind = data.get("format") if isinstance(data, dict) else None
        if kind is not None and kind != "raypipe-plan":
            shown = f"a {kind} file" if isinstance(kind, str) and kind.startswith("raypipe-") else f"format {limits._show(kind)}"
            raise UserError(f"{origin}: is {shown}, not a plan (\"format\": \"raypipe-plan\")")
        if not isinstance(data, dict) or "stages" not in data:
            raise UserError(f"{origin}: not a plan JSON (no \"stages\")")
        try:
            limits.known_fields(data, PLAN_FIELDS + RESULT_FIELDS, "")
            limits.version(data, "", FORMAT_VERSIONS, default=1)
            raw = data["stages"]
            if not isinstance(raw, list):
                raise UserError(f"\"stages\" must be a list, got {type(raw).__name__}")
            stages = []
            for j, s in enumerate(raw):
                if not isinstance(s, dict) or not isinstance(s.get("blocks"), list) or len(s["blocks"]) != 2:
                    raise UserError(f"stage {j} must be an object with \"blocks\": [first, last] and \"devices\"")
                limits.known_fields(s, STAGE_FIELDS, f"stage {j}")
                if not isinstance(s.get("devices"), list):
                    raise UserError(f"stage {j}: \"devices\" must be a list of device ids")
                where = f"stage {j}"
                if not isinstance(s.get("recompute", False), bool):
                    raise UserError(f"stage {j}: \"recompute\" must be true or false")
                stages.append(Stage(limits.count(s["blocks"][0], where, "first block", minimum=0),
                                    limits.count(s["blocks"][1], where, "last block", minimum=0),
                                    tuple(limits.count(d, where, "device", minimum=0) for d in s["devices"]),
                                    bool(s.get("recompute", False))))
            if "num_microbatches" not in data:
                raise UserError("missing \"num_microbatches\"")
            plan = cls(
                stages=tuple(stages),
                num_microbatches=data["num_microbatches"],
                schedule=ScheduleKind.parse(limits.text(data.get("schedule", "1f1b"), "plan", "schedule")),
                sliced_microbatches=data.get("sliced_microbatches", 0),
                algorithm=limits.text(data.get("algorithm", ""), "plan", "algorithm"),
            )
            for key, actual in (("num_stages", len(plan.stages)), ("virtual_chunks", plan.virtual_chunks)):
                if key in data and limits.count(data[key], "plan", key) != actual:
                    raise UserError(f"\"{key}\" is {data[key]} but the stages make {actual}")
            return plan
        except UserError as exc:
            raise UserError(f"{origin}: {exc}") from None
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise UserError(f"{origin}: malformed plan ({type(exc).__name__}: {exc})") from None


FORMAT_VERSIONS = (1,)  # a plan file without "version" is 1
PLAN_FIELDS = ("format", "version", "algorithm", "schedule", "num_microbatches", "sliced_microbatches", "virtual_chunks",
               "num_stages", "stages", "predicted_iteration_s")
RESULT_FIELDS = ("cluster", "iteration_time_s", "bottleneck_s", "lower_bound_s", "ratio_to_lower_bound", "planning_time_s",
                 "peak_memory_bytes", "bubble_fraction", "bubble_fraction_per_device", "objective_s", "profile_chain")
"""What ``orchestrator plan --out`` writes beside the plan (the planner's result and the cluster): read, not used
here. ``profile_chain`` (a graph.txt profile's node order, when ``pipedream`` chose another than the loader's)
is used by ``orchestrator simulate`` to chain the profile as the plan was made."""
STAGE_FIELDS = ("blocks", "devices", "recompute")


def load_plan(path: str | Path) -> Plan:
    p = Path(path)
    data = read_json(p, "plan")
    return Plan.from_dict(data, origin=str(p))


def straight_plan(
    boundaries: Sequence[int],
    num_microbatches: int,
    schedule: ScheduleKind = ScheduleKind.ONE_F_ONE_B,
    devices: Sequence[Sequence[int]] | None = None,
    algorithm: str = "",
) -> Plan:
    """A plan from cut points ``[0, c1, ..., L]``; one device per stage unless ``devices`` is given."""
    cuts = list(boundaries)
    n = len(cuts) - 1
    groups = [tuple(g) for g in devices] if devices is not None else [(i,) for i in range(n)]
    stages = tuple(Stage(cuts[i], cuts[i + 1], groups[i]) for i in range(n))
    return Plan(stages, num_microbatches, schedule, algorithm=algorithm)


def interleave(plan: Plan, chunks: int, boundaries: Sequence[int] | None = None) -> Plan:
    """Turn a p-stage plan into an interleaved one with ``chunks`` virtual stages per device group.

    Without ``boundaries`` the blocks are cut into ``p·chunks`` runs of near-equal count.
    """
    groups = plan.device_groups
    n = len(groups) * chunks
    num_blocks = plan.num_blocks
    if n > num_blocks:
        raise UserError(f"cannot interleave {num_blocks} blocks into {n} virtual stages")
    if boundaries is None:
        boundaries = [round(i * num_blocks / n) for i in range(n + 1)]
    cuts = list(boundaries)
    stages = tuple(Stage(cuts[i], cuts[i + 1], groups[i % len(groups)]) for i in range(n))
    schedule = ScheduleKind.INTERLEAVED if chunks > 1 else plan.schedule
    return Plan(stages, plan.num_microbatches, schedule, plan.sliced_microbatches, plan.algorithm)
