"""What the elastic job's policies ask for between iterations: typed, frozen actions.

Each policy of :class:`~orchestrator.elastic.job_loop.ElasticJob` (the user's callbacks and evaluation, the
checkpoint upload, notices, the controller, the spot policy, the checkpoint and snapshot cadences) looks at the step
just gathered and returns a sequence of these; the job's carrier (``ElasticJob._act``) alone carries them out, after
draining the step in flight once. A user's callback returns two of them itself (:class:`Checkpoint`, :class:`Stop`,
defined with the callbacks, the user's vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from orchestrator.train.callbacks import Checkpoint, Stop

if TYPE_CHECKING:
    from cloud.migration import Migrate
    from orchestrator.adapt.controller import Observed
    from orchestrator.elastic.evacuation import Notice


@dataclass(frozen=True)
class Evaluate:
    """The evaluation due at this step: forward only over the current plan."""


@dataclass(frozen=True)
class CommitUpload:
    """Commit the background checkpoint that uploaded while the step after it ran."""


@dataclass(frozen=True)
class Leave:
    """Evacuated devices leave the process group now (their deadline is near): it is re-formed without them."""

    notice: Notice


@dataclass(frozen=True)
class Preempt:
    """A preemption notice: evacuate live when the survivors can hold the model, else relocate."""

    notice: Notice


@dataclass(frozen=True)
class Adapt:
    """The controller's act (live moves, or a planned restart), reported back to it once carried out."""

    decided: Observed


@dataclass(frozen=True)
class Relocate:
    """Move the job where a price change makes it pay (a supervised job asks its supervisor)."""

    move: Migrate


@dataclass(frozen=True)
class Snapshot:
    """An in-memory snapshot of every worker's state, copied in the background while the next step runs."""


JobAction = Union[Evaluate, Checkpoint, Stop, CommitUpload, Leave, Preempt, Adapt, Relocate, Snapshot]

__all__ = ["Adapt", "Checkpoint", "CommitUpload", "Evaluate", "JobAction", "Leave", "Preempt", "Relocate", "Snapshot", "Stop"]
