"""The gradient sum of a replicated stage, as DDP does it: buckets all-reduced while the last backward still runs.

Why an object of its own: it owns one piece of state, the stage's gradient buckets: flat buffers allocated once,
whose views *are* the parameters' ``.grad`` during an iteration (so gradients accumulate in place and no flat copy
is ever made: one copy of the gradients at peak, as DDP's ``gradient_as_bucket_view``), which of their parameters
are final, and the all-reduces in flight. The executor tells it when the iteration starts (:meth:`GradSync.attach`),
when the stage's last weight-gradient action runs (:meth:`GradSync.arm` / :meth:`GradSync.disarm`; the lowering
knows which one, :func:`orchestrator.schedule.nccl.gradient_launch_points`), which parameters a split ``W`` has just
finished (:meth:`GradSync.ready`), and when the schedule's ``ALL_REDUCE`` action waits (:meth:`GradSync.finish`).

Buckets follow DDP's rule: parameters in reverse order (backward produces the last ones' gradients first), one
dtype and device per bucket (no bf16 -> fp32 promotion), the first bucket of each about 1 MiB, the others about
25 MiB. A bucket's all-reduce starts once every parameter in it is final, in bucket order on every replica (a later
bucket that is ready first waits for the earlier ones), so every member issues the same collectives in the same
order. The sum is the one the flat all-reduce made (the gradients' ``SUM`` over the replica group): with two
replicas it is bit-identical; with more, only the summation order of the backend's ring can differ.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

BUCKET_BYTES = 25 * 2 ** 20  # DDP's bucket_cap_mb
FIRST_BUCKET_BYTES = 2 ** 20  # DDP's first bucket: the first all-reduce starts early in the backward


def bucket_order(params: Iterable[nn.Parameter], cap: int = BUCKET_BYTES, first: int = FIRST_BUCKET_BYTES) -> list[list[nn.Parameter]]:
    """``params`` (those that need a gradient, each once) in buckets, in the order their all-reduces start (see
    module docstring)."""
    seen: set[int] = set()
    order = []
    for p in reversed(list(params)):
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            order.append(p)
    open_: dict[tuple[torch.dtype, torch.device], tuple[list[nn.Parameter], int, int]] = {}  # (params, bytes, limit)
    closed: list[list[nn.Parameter]] = []
    for p in order:
        key = (p.dtype, p.device)
        members, size, limit = open_.get(key, ([], 0, first))
        members.append(p)
        size += p.numel() * p.element_size()
        if size >= limit:
            closed.append(members)
            open_[key] = ([], 0, cap)
        else:
            open_[key] = (members, size, limit)
    closed += [members for members, _, _ in open_.values() if members]
    position = {id(p): i for i, p in enumerate(order)}
    return sorted(closed, key=lambda b: position[id(b[0])])


class GradSync:
    """The gradient buckets of one replicated stage on one device (see module docstring)."""

    def __init__(self, params: Iterable[nn.Parameter], group: Any, cap: int = BUCKET_BYTES, first: int = FIRST_BUCKET_BYTES) -> None:
        self.group = group
        self.buckets = bucket_order(params, cap, first)
        self.flat = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device) for b in self.buckets]
        self.params = [p for b in self.buckets for p in b]
        self.where: dict[int, tuple[int, Tensor]] = {}  # id(parameter) -> (bucket, its view of the buffer)
        for k, (bucket, flat) in enumerate(zip(self.buckets, self.flat)):
            at = 0
            for p in bucket:
                self.where[id(p)] = (k, flat[at:at + p.numel()].view_as(p))
                at += p.numel()
        self.left = [len(b) for b in self.buckets]  # parameters not final yet, per bucket
        self.done: set[int] = set()  # ids of the parameters whose gradient is final
        self.next = 0  # the first bucket whose all-reduce has not started
        self.works: list[Any] = []
        self.handles: list[Any] = []

    def attach(self) -> None:
        """A new iteration: every parameter's gradient is its (zeroed) view of the buckets, so each backward
        accumulates in place; a gradient already there (set before this iteration) is kept in it."""
        for flat in self.flat:
            flat.zero_()
        for p in self.params:
            view = self.where[id(p)][1]
            g = p.grad
            if g is not None:
                view.copy_(g)
            p.grad = view
        self.left = [len(b) for b in self.buckets]
        self.done = set()
        self.next = 0
        self.works = []

    def arm(self) -> None:
        """The stage's last weight-gradient action starts: each parameter whose gradient is accumulated now is final."""
        self.handles = [p.register_post_accumulate_grad_hook(self.ready) for p in self.params]

    def disarm(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def ready(self, p: Tensor) -> None:
        """``p``'s gradient is final: once its bucket and every earlier one are, their all-reduces start."""
        found = self.where.get(id(p))
        if found is None or id(p) in self.done:
            return
        self.done.add(id(p))
        k, view = found
        self._keep(p, view)
        self.left[k] -= 1
        while self.next < len(self.buckets) and self.left[self.next] == 0:
            self._launch()

    def finish(self) -> None:
        """The ``ALL_REDUCE`` action: start what has not started (a parameter no backward reached keeps a zero
        gradient, as before), then wait for every bucket; the parameters' gradients hold the sums."""
        while self.next < len(self.buckets):
            for p in self.buckets[self.next]:
                if id(p) not in self.done:
                    self.done.add(id(p))
                    self._keep(p, self.where[id(p)][1])
            self._launch()
        for work in self.works:
            work.wait()  # on CUDA: the compute stream waits for the all-reduce; the host does not
        self.works = []

    def drop(self) -> None:
        """Forget the group and the all-reduces in flight (a failed iteration: the group is aborted next)."""
        self.disarm()
        self.works, self.group = [], None

    def _keep(self, p: Tensor, view: Tensor) -> None:
        """``p``'s gradient lives in its view (it does unless something replaced ``.grad`` during the iteration)."""
        g = p.grad
        if g is None:
            view.zero_()
            p.grad = view
        elif g.data_ptr() != view.data_ptr():
            view.copy_(g)
            p.grad = view

    def _launch(self) -> None:
        self.works.append(dist.all_reduce(self.flat[self.next], op=dist.ReduceOp.SUM, group=self.group, async_op=True))
        self.next += 1
