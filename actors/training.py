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
  the same schedule (one scheduler per block optimizer, made by ``lr_scheduler``; its state travels in the
  optimizer's, :class:`BlockSchedule`; ``ReduceLROnPlateau`` steps on the evaluation loss instead).

What is local to a block needs no communication and is a wrapper of the user's factories:
:func:`decay_groups` (weights decay, biases and norms do not — the rule "tensors of rank >= 2
decay" that minGPT and nanoGPT use, which needs no parameter names) and :func:`autocast_blocks`
(each block's forward under ``torch.autocast``; floating outputs are handed on in one fixed dtype, float32 unless
asked otherwise, so a boundary's dtype does not depend on what ran inside and the meta-device probe knows it).
"""

from __future__ import annotations

import functools
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
    """One worker's copy of the loss scale, on the stage's device. Every stage holds the same value
    because every stage updates it from the same, all-reduced, found-infinite flag.

    Why on the device: the scale multiplies every last-stage loss and unscales every gradient; a
    host tensor would be copied host -> device at each of those (a synchronising copy on CUDA).
    The update is ``GradScaler``'s own kernel (``torch._amp_update_scale_``), so it needs no host
    read of the flag either."""

    def __init__(self, config: LossScale, device: torch.device) -> None:
        self.config = config
        self.scale = torch.full((), config.init_scale, dtype=torch.float32, device=device)
        self.tracker = torch.zeros((), dtype=torch.int32, device=device)

    def scale_loss(self, loss: Tensor) -> Tensor:
        return loss * self.scale

    def inv(self) -> Tensor:
        return self.scale.double().reciprocal().float()  # GradScaler.unscale_'s inverse

    def update(self, found_inf: Tensor) -> None:
        """``found_inf``: the all-reduced count of stages that found inf/nan gradients (0: none)."""
        torch._amp_update_scale_(self.scale, self.tracker, found_inf, self.config.growth_factor,
                                 self.config.backoff_factor, self.config.growth_interval)


@dataclass(frozen=True)
class TrainingOptions:
    """Job-wide training features (a field of the job spec, so every stage applies the same)."""

    max_grad_norm: float | None = None  # clip by the global gradient norm over all stages and replicas
    lr_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None
    """One per block optimizer, stepped per iteration and checkpointed with the optimizer's state; a
    ``ReduceLROnPlateau`` steps on the evaluation loss at each evaluation (``TrainConfig.eval_every``) instead."""
    loss_scale: LossScale | None = None  # fp16: scaled losses, an iteration with inf/nan gradients is skipped everywhere

    def __post_init__(self) -> None:
        if self.max_grad_norm is not None and not (self.max_grad_norm > 0 and math.isfinite(self.max_grad_norm)):
            from orchestrator.core.errors import UserError

            raise UserError(f"max_grad_norm must be a positive number, got {self.max_grad_norm}")


def counted_params(modules: Iterable[nn.Module]) -> list[nn.Parameter]:
    """Parameters whose gradients count toward the global norm: a tied weight's copies other
    than its owner's are left out (the tied model has one such parameter)."""
    return [p for _, _, p in _counted(dict(enumerate(modules)))]


def _counted(modules: dict[int, nn.Module]) -> list[tuple[int, str, nn.Parameter]]:
    out = []
    for b in sorted(modules):
        for name, p in modules[b].named_parameters():
            tie = getattr(p, TIE, None)
            if tie is None or tie.owner is None:
                out.append((b, name, p))
    return out


@dataclass(frozen=True)
class NormLayout:
    """Where each counted parameter's gradient norm sits in the vector whose 2-norm
    ``clip_grad_norm_`` takes over the stock model.

    ``clip_grad_norm_`` computes one norm per gradient, grouped by (device, dtype) in first-seen
    order, then the 2-norm of those norms stacked. Summing squared norms instead (the obvious
    distributed form) is the same number up to rounding — but a last-bit difference in the clip
    coefficient moves a weight by one fp32 ulp, and under bf16 autocast that flips the weight's
    bf16 rounding, a 2^-8 relative change that training amplifies (issue #26: 1e-2 after 10
    steps with ``max_grad_norm=1``). So every stage writes its norms at these slots, one
    all-reduce (each slot has exactly one non-zero contributor, so the sum is exact in any order)
    assembles the very vector torch stacks, and every stage takes its norm the same way.
    Assumes the blocks' counted parameters, in block order, are the stock model's parameters
    in ``parameters()`` order (true of ``sequential_blocks``, ``split_at`` and the HF cutter).
    """

    slots: dict[tuple[int, str], int]  # (block, parameter name) -> index in the stacked norms
    dtype: torch.dtype  # the stacked norms' dtype (torch.stack promotes mixed dtypes)

    @classmethod
    def of(cls, blocks: Sequence[nn.Module]) -> "NormLayout":
        counted = _counted(dict(enumerate(blocks)))
        order = sorted(range(len(counted)), key=lambda i: ([p.dtype for _, _, p in counted].index(counted[i][2].dtype), i))
        slots = {(counted[i][0], counted[i][1]): k for k, i in enumerate(order)}
        dtypes = [p.dtype for _, _, p in counted if p.dtype.is_floating_point]
        return cls(slots, functools.reduce(torch.promote_types, dtypes) if dtypes else torch.float32)

    @property
    def carrier(self) -> torch.dtype:
        """The all-reduced vector's dtype: holds every norm exactly (bf16/fp16 norms in fp32) and
        is one every backend reduces (gloo has no bf16 sums on every version)."""
        return torch.promote_types(self.dtype, torch.float32)

    def __len__(self) -> int:
        return len(self.slots)


def total_norm(grads: Sequence[Tensor]) -> Tensor:
    """The 2-norm ``clip_grad_norm_`` computes over ``grads`` (torch's own function, one process)."""
    return torch.nn.utils.get_total_norm(grads, 2.0)


def clip_(params: Iterable[nn.Parameter], norm: Tensor, max_norm: float) -> None:
    """Scale gradients as ``clip_grad_norm_`` does for a total norm ``norm`` (torch's own code)."""
    torch.nn.utils.clip_grads_with_norm_(list(params), max_norm, norm)


def _norms_by_dtype(grads: list[Tensor]) -> list[Tensor]:
    """Per-gradient 2-norms in ``grads``' order, each computed as ``clip_grad_norm_`` does
    (``torch._foreach_norm`` over a (device, dtype) group; a tensor's norm does not depend on
    the other tensors of its group)."""
    out: list[Tensor | None] = [None] * len(grads)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, g in enumerate(grads):
        groups.setdefault((g.device, g.dtype), []).append(i)
    for idx in groups.values():
        for i, n in zip(idx, torch._foreach_norm([grads[i] for i in idx], 2.0)):
            out[i] = n
    return [n for n in out if n is not None]


Reduce = Callable[[Tensor, Any], None]


def all_reduce_sum(tensor: Tensor, group: Any) -> None:
    """The collective of the step hooks: a sum over ``group``. ``tensor`` must live on the device
    the group's backend serves — the stage's device (NCCL refuses host tensors)."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)


class StepHooks:
    """One worker's part in the collective pre-step work of an iteration (see module docstring).

    Everything stays on the stage's device and crosses the stages in ONE all-reduce per step:
    a vector of the counted gradients' norms at their :class:`NormLayout` slots plus, with loss
    scaling, the found-infinite flag in its last element. The only host read is that flag (with
    loss scaling: whether to step is a host decision, as in ``GradScaler.step``)."""

    def __init__(self, options: TrainingOptions, tied: Any, counted: list[tuple[int, str, nn.Parameter]],
                 every: list[nn.Parameter], norm_group: Any, schedulers: dict[int, BlockSchedule], plan: Any,
                 device: torch.device, layout: NormLayout | None, reduce: Reduce = all_reduce_sum) -> None:
        self.options, self.tied, self.counted, self.every = options, tied, counted, every
        self.norm_group, self.schedulers, self.plan = norm_group, schedulers, plan
        self.device, self.layout, self.reduce = device, layout, reduce
        self.scaler = Scaler(options.loss_scale, device) if options.loss_scale is not None else None
        if options.max_grad_norm is not None and layout is None:
            raise ValueError("clipping needs the model's NormLayout")
        slots = [layout.slots[(b, n)] for b, n, _ in counted] if layout is not None and options.max_grad_norm is not None else []
        self.slot_index = torch.tensor(slots, dtype=torch.long, device=device)
        self.before_done, self.stepping = -1, True

    def prepare(self, step: int) -> Tensor | None:
        """This step's device work, no host read: :meth:`contribution`, the one all-reduce,
        :meth:`finish`. Returns the reduced found-infinite count (``None`` without loss scaling)."""
        vec = self.contribution(step)
        if vec is None:
            return None
        if self.norm_group is not None:
            self.reduce(vec, self.norm_group)
        return self.finish(vec)

    def contribution(self, step: int) -> Tensor | None:
        """Tied sums, unscaling (``GradScaler.unscale_``'s kernel per (device, dtype)), and this
        worker's vector: its counted gradients' norms at their slots, the found flag last."""
        if self.tied is not None:
            self.tied.before_step(step)
        clipping = self.options.max_grad_norm is not None and self.layout is not None
        width = (len(self.layout) if clipping and self.layout is not None else 0) + (self.scaler is not None)
        if width == 0:
            return None
        vec = torch.zeros(width, dtype=self.layout.carrier if self.layout is not None else torch.float32, device=self.device)
        if self.scaler is not None:
            found = torch.zeros(1, dtype=torch.float32, device=self.device)
            groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
            for p in self.every:
                if p.grad is not None:
                    groups.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
            inv = self.scaler.inv()
            for same in groups.values():
                torch._amp_foreach_non_finite_check_and_unscale_(same, found, inv)
            vec[-1:].copy_(found)
        if clipping:
            mine = [(i, p.grad) for i, (_, _, p) in enumerate(self.counted) if p.grad is not None]
            if mine:
                norms = torch.stack(_norms_by_dtype([g for _, g in mine])).to(vec.dtype)
                index = self.slot_index if len(mine) == len(self.counted) else self.slot_index[[i for i, _ in mine]]
                vec.index_copy_(0, index, norms)
        return vec

    def finish(self, vec: Tensor) -> Tensor | None:
        """With the all-reduced vector: clip every gradient (overflowed or not, as
        ``clip_grad_norm_`` after ``GradScaler.unscale_`` does) and update the scale."""
        if self.options.max_grad_norm is not None and self.layout is not None:
            norm = torch.linalg.vector_norm(vec[:len(self.layout)].to(self.layout.dtype), 2.0)  # as torch.stack(norms)
            clip_(self.every, norm, self.options.max_grad_norm)
        if self.scaler is None:
            return None
        flag = vec[-1:].float()
        self.scaler.update(flag)
        return flag

    def before(self, step: int) -> bool:
        """Prepare the gradients for this iteration's optimizer steps; ``False``: skip them (fp16
        gradients overflowed on some stage: every stage skips, as GradScaler.step does)."""
        if step == self.before_done:
            return self.stepping
        self.before_done = step
        flag = self.prepare(step)
        self.stepping = flag is None or float(flag.item()) == 0.0  # the step's one host read
        return self.stepping

    def after(self, stage: int) -> None:
        """After ``stage``'s optimizers stepped: its blocks' schedulers step (an interleaved
        device's other stages step later, still at the old rate, as in single-process training)."""
        s = self.plan.stages[stage]
        for b in range(s.first, s.last):
            if b in self.schedulers:
                self.schedulers[b].step()

    def groups(self) -> list[Any]:
        """The process groups these hooks own (the norm group and the tied weights' groups): a
        live move that builds new hooks destroys these."""
        own = [] if self.norm_group is None else [self.norm_group]
        return own + ([] if self.tied is None else list(self.tied.groups.values()))


SCHEDULE_KEY = "lr_scheduler"  # where a block optimizer's state dict carries its scheduler's


class BlockSchedule:
    """One block optimizer's LR scheduler, whose state travels inside the optimizer's state dict.

    Why there: every path that saves or hands on a block's state — checkpoint files, host copies for a recovery in
    place, live moves — already carries ``optimizer.state_dict()``; with the scheduler's state in it (an optimizer
    state-dict hook) a resumed, recovered or moved block continues its schedule exactly, counters included, and the
    LR in force is the optimizer's own (restored with its param groups), never recomputed by stepping a new scheduler
    forward. ``ReduceLROnPlateau`` steps on a metric, not per iteration: the evaluation loss, at each evaluation
    (:meth:`metric`); every other scheduler steps once per iteration (:meth:`step`)."""

    def __init__(self, scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
        self.scheduler = scheduler
        self.on_metric = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        self.restored = True  # False after loading a state saved without a schedule (before schedules were saved)
        self._loading: dict[str, Any] | None = None
        optimizer.register_state_dict_post_hook(self._save)
        optimizer.register_load_state_dict_pre_hook(self._take)
        optimizer.register_load_state_dict_post_hook(self._load)

    def step(self) -> None:
        """After the block's optimizer stepped (a metric-driven scheduler waits for its metric)."""
        if not self.on_metric:
            self.scheduler.step()

    def metric(self, value: float) -> None:
        """After an evaluation: ``ReduceLROnPlateau`` steps on its loss."""
        if self.on_metric:
            self.scheduler.step(value)

    def forward(self, completed: int) -> None:
        """After loading a state saved without a schedule (a checkpoint older than this class): step the scheduler
        past ``completed`` iterations, as a resume did before schedules were saved (exact for a schedule of the step
        alone; a ``ReduceLROnPlateau`` starts afresh)."""
        if not self.restored:
            for _ in range(completed):
                self.step()
            self.restored = True

    def _save(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
        return {**state, SCHEDULE_KEY: self.scheduler.state_dict()}

    def _take(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
        self._loading = state.pop(SCHEDULE_KEY, None)  # ``state`` is the optimizer's own shallow copy
        return state

    def _load(self, optimizer: torch.optim.Optimizer) -> None:
        saved, self._loading = self._loading, None
        self.restored = saved is not None
        if saved is not None:  # after the param groups: the LR in force is the saved one
            self.scheduler.load_state_dict(dict(saved))


def schedulers_for(options: TrainingOptions, optimizers: dict[int, torch.optim.Optimizer]) -> dict[int, BlockSchedule]:
    """One scheduler per block optimizer (made by ``lr_scheduler``), its state kept in the optimizer's; build it
    before loading a saved optimizer state, so that the load restores the schedule too."""
    if options.lr_scheduler is None:
        return {}
    return {b: BlockSchedule(options.lr_scheduler(opt), opt) for b, opt in optimizers.items()}


def norm_contributors(plan: Any, device: int, modules: dict[int, nn.Module]) -> list[tuple[int, str, nn.Parameter]]:
    """This device's share of the global norm, as (block, name, parameter): blocks of stages it
    is the first replica of (a replica's gradients equal its first replica's after the all-reduce)."""
    mine = {b: modules[b] for j in plan.stages_of_device(device) if plan.stages[j].devices[0] == device
            for b in range(plan.stages[j].first, plan.stages[j].last) if b in modules}
    return _counted(mine)


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


class Autocast:
    """Forward hooks that run one block under ``torch.autocast(dtype)`` on its input's device. Hooks, not a wrapper
    module: the block stays the user's own object, so its parameter names (and what a loader recorded on it, such as
    the Hugging Face names) are unchanged in ``state_dict()``, checkpoints and exports."""

    def __init__(self, dtype: torch.dtype, boundary: torch.dtype = torch.float32) -> None:
        self.dtype, self.boundary = dtype, boundary
        self.entered: list[Any] = []  # one per forward in progress (recomputation runs a forward inside a backward)

    def install(self, block: nn.Module) -> nn.Module:
        block.register_forward_pre_hook(self.enter)
        block.register_forward_hook(self.leave, always_call=True)  # leaves autocast even when the forward raises
        return block

    def enter(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0] if args else None
        device = x.device.type if isinstance(x, Tensor) else "cpu"
        if device == "meta":  # a shape probe: autocast has no meta kernels; the cast in leave fixes the dtype
            self.entered.append(None)
            return
        context = torch.autocast(device_type=device, dtype=self.dtype)
        context.__enter__()
        self.entered.append(context)

    def leave(self, module: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
        context = self.entered.pop() if self.entered else None
        if context is not None:
            context.__exit__(None, None, None)
        # one boundary dtype whatever ran inside: a fixed dtype the probe can know
        return out.to(self.boundary) if isinstance(out, Tensor) and out.is_floating_point() else out


@dataclass(frozen=True)
class autocast_blocks:  # noqa: N801 - used like a function: autocast_blocks(factory, torch.bfloat16)
    """A model factory whose blocks run their forward under ``torch.autocast(dtype)`` (the blocks themselves, with
    :class:`Autocast` hooks: their names are the user's).

    ``boundary``: the dtype every block but the last hands on (the activations and gradients that travel between
    stages). float32 by default, which is exactly ``torch.autocast`` over the stock model (its residual stream stays
    float32 between layers). ``boundary=dtype`` halves what travels and what is stashed between blocks, but rounds the
    residual stream to ``dtype`` at every block boundary, as bf16 pipelines such as Megatron's do: a different
    computation from autocast over the stock model (a GPT-2 of 2 layers moved 0.04 apart in 3 AdamW steps), still
    exactly the single-process reference's, which runs the same blocks (on the CPU, at the same torch thread count:
    bf16 reductions are summed per thread). The last block's output, which goes to the loss, stays float32."""

    model_factory: Callable[[], Sequence[nn.Module]]
    dtype: torch.dtype = torch.bfloat16
    boundary: torch.dtype = torch.float32

    def __call__(self) -> list[nn.Module]:
        blocks = list(self.model_factory())
        return [Autocast(self.dtype, self.boundary if b < len(blocks) - 1 else torch.float32).install(block)
                for b, block in enumerate(blocks)]
