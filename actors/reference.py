"""Single-process training with the pipeline's exact micro-batching: the exactness oracle.

It builds the model the way every stage worker does (``torch.manual_seed(seed)`` then the
factory; blocks built on the meta device are materialized with the same per-path seeds), draws
dropout masks from the same per-(step, unit, block) seeds, sums tied weights' gradients, keeps one optimizer per block, cuts each iteration batch into the same units with the
same row rules (:mod:`actors.transport`), weights each unit's loss by its share of the batch rows
and accumulates gradients before one optimizer step (fp16 losses scaled as ``GradScaler`` does). Pipelined training of any plan must end up
``allclose`` to this; the only differences allowed are floating-point summation order (replica
shares and all-reduce add the same terms in another order).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from actors import seeding, tied
from actors.materialize import materialize
from actors.training import TrainingOptions, clip_, counted_params, schedulers_for, total_norm
from actors.transport import unit_range
from orchestrator.core.plan import Plan, Stage
from orchestrator.schedule.ir import units_of


class ReferenceTrainer:
    """Sequential gradient-accumulation training; ``state_dicts()`` is keyed by block like workers'."""

    def __init__(
        self,
        model_factory: Callable[[], list[nn.Module]],
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        optimizer_factory: Callable[[Any], torch.optim.Optimizer],
        data_fn: Callable[[int], tuple[Tensor, Tensor]],
        num_microbatches: int,
        sliced_microbatches: int = 0,
        seed: int = 0,
        device: str | torch.device = "cpu",
        training: TrainingOptions | None = None,
    ) -> None:
        torch.manual_seed(seed)
        self.device = torch.device(device)  # a GPU reference compares GPU runs with the same kernels
        # meta-built blocks are materialized as a stage worker does (the same per-path seeds)
        self.blocks = [materialize(m, self.device, seed, f"block{b}") for b, m in enumerate(model_factory())]
        self.ties = tied.tie_table(self.blocks)  # copies of one weight: gradients summed, as the stages do
        self.training = training or TrainingOptions()
        self.seed = seed
        self.optimizers = {
            b: optimizer_factory(m.parameters()) for b, m in enumerate(self.blocks) if any(True for _ in m.parameters())
        }
        self.schedulers = schedulers_for(self.training, self.optimizers)
        self.loss_fn, self.data_fn = loss_fn, data_fn
        self.num_microbatches, self.sliced = num_microbatches, sliced_microbatches
        self.step = 0
        self.losses: list[float] = []
        scale = self.training.loss_scale
        self.scale, self.good_steps = (scale.init_scale if scale is not None else 1.0), 0  # GradScaler's scale and tracker

    @classmethod
    def for_plan(
        cls, plan: Plan, model_factory: Callable[[], list[nn.Module]], loss_fn: Callable[[Tensor, Tensor], Tensor],
        optimizer_factory: Callable[[Any], torch.optim.Optimizer], data_fn: Callable[[int], tuple[Tensor, Tensor]], seed: int = 0,
        device: str | torch.device = "cpu", training: TrainingOptions | None = None,
    ) -> "ReferenceTrainer":
        """The reference with ``plan``'s micro-batch and slicing counts (its stages do not matter)."""
        return cls(model_factory, loss_fn, optimizer_factory, data_fn, plan.num_microbatches, plan.sliced_microbatches, seed, device,
                   training)

    def train(self, steps: int) -> list[float]:
        """Run ``steps`` iterations from the current step; returns their full-batch losses."""
        out = []
        for _ in range(steps):
            out.append(self._iteration(self.step))
            self.step += 1
        self.losses += out
        return out

    def _iteration(self, step: int) -> float:
        inputs, targets = self.data_fn(step)
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        rows = int(inputs.shape[0])
        whole = Plan((Stage(0, len(self.blocks), (0,)),), self.num_microbatches, sliced_microbatches=self.sliced)
        total = 0.0
        for mb, part in units_of(whole):
            lo, hi = unit_range(rows, self.num_microbatches, mb, part)
            if hi <= lo:
                continue
            x = inputs[lo:hi]
            seeding.enter_unit(self.seed, step, (mb, part))
            for block in self.blocks:
                x = block(x)
            seeding.leave_unit()
            loss = self.loss_fn(x, targets[lo:hi]) * ((hi - lo) / rows)
            (loss * self.scale if self.training.loss_scale is not None else loss).backward()
            total += float(loss.detach())
        tied.sum_local(dict(enumerate(self.blocks)), self.ties)
        stepping = self._unscale()
        if self.training.max_grad_norm is not None and stepping:  # what clip_grad_norm_ does over the (tied) model
            norm = total_norm([p.grad for p in counted_params(self.blocks) if p.grad is not None])
            clip_([p for m in self.blocks for p in m.parameters()], norm, self.training.max_grad_norm)
        for b, opt in self.optimizers.items():
            if stepping:
                opt.step()
            opt.zero_grad(set_to_none=True)
            if b in self.schedulers:
                self.schedulers[b].step()
        return total

    def _unscale(self) -> bool:
        """fp16 loss scaling as ``torch.amp.GradScaler`` does it for one optimizer over the whole model: gradients
        unscaled by the scale's fp32 inverse; any inf/nan skips the whole step and backs the scale off, and
        ``growth_interval`` finite steps in a row grow it. Returns whether the optimizers step."""
        config = self.training.loss_scale
        if config is None:
            return True
        inv = torch.tensor(self.scale, dtype=torch.float64).reciprocal().float()
        grads = [p.grad for m in self.blocks for p in m.parameters() if p.grad is not None]
        for g in grads:
            g.mul_(inv.to(g.device))
        if not all(bool(torch.isfinite(g).all()) for g in grads):
            self.scale, self.good_steps = self.scale * config.backoff_factor, 0
            return False
        self.good_steps += 1
        if self.good_steps == config.growth_interval:
            self.scale, self.good_steps = self.scale * config.growth_factor, 0
        return True

    def evaluate(self, eval_data_fn: Callable[[int], tuple[Tensor, Tensor]], batches: int) -> float:
        """The mean loss over ``eval_data_fn(0 .. batches - 1)`` with no gradient and dropout off, units weighted as in
        training: the oracle of the pipelined evaluation. Nothing changes (each block's mode is restored)."""
        from actors.execution import evaluation

        whole = Plan((Stage(0, len(self.blocks), (0,)),), self.num_microbatches, sliced_microbatches=self.sliced)
        total = 0.0
        with evaluation(self.blocks):
            for i in range(batches):
                inputs, targets = eval_data_fn(i)
                inputs, targets = inputs.to(self.device), targets.to(self.device)
                rows = int(inputs.shape[0])
                for mb, part in units_of(whole):
                    lo, hi = unit_range(rows, self.num_microbatches, mb, part)
                    if hi > lo:
                        x = inputs[lo:hi]
                        for block in self.blocks:
                            x = block(x)
                        total += float(self.loss_fn(x, targets[lo:hi]) * ((hi - lo) / rows))
        return total / batches

    def step_on_metric(self, value: float) -> None:
        """After an evaluation: ``ReduceLROnPlateau`` steps on its loss, as the stage workers' do."""
        for schedule in self.schedulers.values():
            schedule.metric(value)

    def state_dicts(self) -> dict[int, dict[str, Tensor]]:
        return {b: {k: v.detach().cpu().clone() for k, v in m.state_dict().items()} for b, m in enumerate(self.blocks)}


def max_difference(a: dict[int, dict[str, Tensor]], b: dict[int, dict[str, Tensor]]) -> float:
    """Largest absolute parameter difference between two block-keyed state dicts."""
    if set(a) != set(b):
        raise ValueError(f"different blocks: {sorted(a)} vs {sorted(b)}")
    worst = 0.0
    for block, state in a.items():
        for name, value in state.items():
            worst = max(worst, float((value.double() - b[block][name].double()).abs().max()) if value.numel() else 0.0)
    return worst


def allclose(a: dict[int, dict[str, Tensor]], b: dict[int, dict[str, Tensor]], rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    return set(a) == set(b) and all(
        torch.allclose(v, b[blk][k], rtol=rtol, atol=atol) for blk, st in a.items() for k, v in st.items()
    )
