"""Training features across stages: gradient clipping by the global norm, learning-rate
schedules, weight-decay parameter groups, autocast — each equal to its single-process version.

What needs the other stages is done in :class:`StepHooks`, which a stage worker installs on its
executor around the optimizer steps of every iteration:

* before the first step: tied weights' gradients are summed (:mod:`actors.tied`), then, with
  ``max_grad_norm``, the squared gradient norms of every stage are summed over a process group of
  all the plan's devices (each stage counted once, by its first replica; a tied weight once, by
  its owner copy) and every device scales its gradients by the same coefficient, the one
  ``torch.nn.utils.clip_grad_norm_`` computes over the whole model;
* after the last step: each block's scheduler steps once, so every stage's learning rate follows
  the same schedule (one scheduler per block optimizer, made by ``lr_scheduler``).

What is local to a block needs no communication and is a wrapper of the user's factories:
:func:`decay_groups` (weights decay, biases and norms do not — the rule "tensors of rank >= 2
decay" that minGPT and nanoGPT use, which needs no parameter names) and :func:`autocast_blocks`
(each block's forward under ``torch.autocast``; floating outputs are handed on in float32, so a
boundary's dtype does not depend on what ran inside and the meta-device probe knows it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from actors.materialize import TIE


@dataclass(frozen=True)
class LossScale:
    """Dynamic loss scaling for fp16, with ``torch.amp.GradScaler``'s rule and defaults."""

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000


class Scaler:
    """One worker's copy of the loss scale. Every stage holds the same value because every
    stage updates it from the same, all-reduced, found-infinite flag."""

    def __init__(self, config: LossScale) -> None:
        self.config = config
        self.scale = torch.tensor(config.init_scale, dtype=torch.float32)
        self.tracker = 0

    def scale_loss(self, loss: Tensor) -> Tensor:
        return loss * self.scale.to(loss.device)

    def inv(self) -> Tensor:
        return self.scale.double().reciprocal().float()

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale = self.scale * self.config.backoff_factor
            self.tracker = 0
        else:
            self.tracker += 1
            if self.tracker == self.config.growth_interval:
                self.scale = self.scale * self.config.growth_factor
                self.tracker = 0


@dataclass(frozen=True)
class TrainingOptions:
    """Job-wide training features (a field of the job spec, so every stage applies the same)."""

    max_grad_norm: float | None = None  # clip by the global gradient norm over all stages and replicas
    lr_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None  # one per block optimizer, stepped per iteration
    loss_scale: LossScale | None = None  # fp16: scaled losses, an iteration with inf/nan gradients is skipped everywhere

    def __post_init__(self) -> None:
        if self.max_grad_norm is not None and not (self.max_grad_norm > 0 and math.isfinite(self.max_grad_norm)):
            from orchestrator.core.errors import UserError

            raise UserError(f"max_grad_norm must be a positive number, got {self.max_grad_norm}")


def counted_params(modules: Iterable[nn.Module]) -> list[nn.Parameter]:
    """Parameters whose gradients count toward the global norm: a tied weight's copies other
    than its owner's are left out (the tied model has one such parameter)."""
    out = []
    for m in modules:
        for p in m.parameters():
            tie = getattr(p, TIE, None)
            if tie is None or tie.owner is None:
                out.append(p)
    return out


def sum_of_squares(params: Sequence[nn.Parameter]) -> Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    return torch.stack([torch.linalg.vector_norm(g, 2.0, dtype=torch.float32) for g in grads]).square().sum()


def clip_(params: Iterable[nn.Parameter], total_sq: Tensor, max_norm: float) -> None:
    """Scale gradients as ``clip_grad_norm_`` does for a total norm of ``sqrt(total_sq)``."""
    coef = torch.clamp(max_norm / (total_sq.sqrt() + 1e-6), max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef.to(p.grad.device, p.grad.dtype))


class StepHooks:
    """One worker's part in the collective pre-step work of an iteration (see module docstring)."""

    def __init__(self, options: TrainingOptions, tied: Any, counted: list[nn.Parameter], every: list[nn.Parameter],
                 norm_group: Any, schedulers: dict[int, Any], plan: Any) -> None:
        self.options, self.tied, self.counted, self.every = options, tied, counted, every
        self.norm_group, self.schedulers, self.plan = norm_group, schedulers, plan
        self.scaler = Scaler(options.loss_scale) if options.loss_scale is not None else None
        self.before_done, self.stepping = -1, True

    def before(self, step: int) -> bool:
        """Prepare the gradients for this iteration's optimizer steps; ``False``: skip them (fp16
        gradients overflowed on some stage: every stage skips, as GradScaler.step does)."""
        if step == self.before_done:
            return self.stepping
        self.before_done, self.stepping = step, True
        if self.tied is not None:
            self.tied.before_step(step)
        if self.scaler is not None:
            inv = self.scaler.inv()
            found = torch.zeros((), dtype=torch.float32)
            for p in self.every:
                if p.grad is not None:
                    p.grad.mul_(inv.to(p.grad.device))
                    found += (~torch.isfinite(p.grad)).any().float().cpu()
            if self.norm_group is not None:
                dist.all_reduce(found, op=dist.ReduceOp.SUM, group=self.norm_group)
            self.stepping = bool(found.item() == 0)
            self.scaler.update(not self.stepping)
        if self.options.max_grad_norm is not None and self.stepping:
            total = sum_of_squares(self.counted)
            if self.norm_group is not None:
                dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.norm_group)
            clip_(self.every, total, self.options.max_grad_norm)
        return self.stepping

    def after(self, stage: int) -> None:
        """After ``stage``'s optimizers stepped: its blocks' schedulers step (an interleaved
        device's other stages step later, still at the old rate, as in single-process training)."""
        s = self.plan.stages[stage]
        for b in range(s.first, s.last):
            if b in self.schedulers:
                self.schedulers[b].step()


def schedulers_for(options: TrainingOptions, optimizers: dict[int, torch.optim.Optimizer], completed: int = 0) -> dict[int, Any]:
    """One scheduler per block optimizer, advanced past ``completed`` iterations (a restored or
    received block continues the schedule where the job is, like every other block)."""
    if options.lr_scheduler is None:
        return {}
    out = {}
    for b, opt in optimizers.items():
        sched = options.lr_scheduler(opt)
        for _ in range(completed):
            sched.step()
        out[b] = sched
    return out


def norm_contributors(plan: Any, device: int, modules: dict[int, nn.Module]) -> list[nn.Parameter]:
    """This device's share of the global norm: blocks of stages it is the first replica of."""
    mine = [modules[b] for j in plan.stages_of_device(device) if plan.stages[j].devices[0] == device
            for b in range(plan.stages[j].first, plan.stages[j].last) if b in modules]
    return counted_params(mine)


# ----- factory wrappers (picklable: they travel to the stage actors) -----
@dataclass(frozen=True)
class decay_groups:  # noqa: N801 - used like a function: decay_groups(AdamW, 0.1)
    """An optimizer factory whose parameters of rank >= 2 decay by ``weight_decay`` and the
    others (biases, norm scales) do not: ``decay_groups(partial(torch.optim.AdamW, lr=3e-4), 0.1)``."""

    optimizer_factory: Callable[..., torch.optim.Optimizer]
    weight_decay: float

    def __call__(self, params: Iterable[Any]) -> torch.optim.Optimizer:
        ps: list[Tensor] = []
        for item in params:  # parameters, or param-group dicts (their parameters are regrouped)
            ps.extend(item["params"] if isinstance(item, dict) else [item])
        groups = [{"params": [p for p in ps if p.dim() >= 2], "weight_decay": self.weight_decay},
                  {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]
        return self.optimizer_factory([g for g in groups if g["params"]])


class Autocast(nn.Module):
    """A block whose forward runs under ``torch.autocast(dtype)`` on its input's device."""

    def __init__(self, block: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.block, self.dtype = block, dtype

    def forward(self, x: Any) -> Any:
        device = x.device.type if isinstance(x, Tensor) else "cpu"
        if device == "meta":  # a shape probe: autocast has no meta kernels; the cast below fixes the dtype
            out = self.block(x)
        else:
            with torch.autocast(device_type=device, dtype=self.dtype):
                out = self.block(x)
        # boundaries stay float32 whatever ran inside: a fixed dtype the probe can know
        return out.float() if isinstance(out, Tensor) and out.is_floating_point() else out


@dataclass(frozen=True)
class autocast_blocks:  # noqa: N801 - used like a function: autocast_blocks(factory, torch.bfloat16)
    """A model factory whose blocks run their forward under ``torch.autocast(dtype)``."""

    model_factory: Callable[[], Sequence[nn.Module]]
    dtype: torch.dtype = torch.bfloat16

    def __call__(self) -> list[nn.Module]:
        return [Autocast(b, self.dtype) for b in self.model_factory()]
