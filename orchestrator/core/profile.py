"""A model as a chain of blocks, with what each block costs.

Every planner, the simulator and the controller read the model only through a :class:`Profile`.
A block is the unit a stage boundary may fall between: a layer, or a sub-layer such as the
attention or FFN half of a transformer layer (AutoPipe-Liu profiles at that granularity so the
planner can balance finer than whole layers).

All times are seconds **per micro-batch** of ``microbatch_size`` samples on a device of relative
speed 1.0; all sizes are bytes for one micro-batch. Prefix sums are precomputed once so planners
can evaluate any contiguous range in O(1) with numpy.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from orchestrator.core.errors import UserError
from orchestrator.core import limits
from orchestrator.core.files import write_json_atomic

__all__ = ["Block", "Profile", "load_profile", "write_json_atomic"]

FORMAT_VERSION = 1
FORMAT_VERSIONS = (1,)  # every version this reader loads (a file without "version" is 1)
PROFILE_FIELDS = ("format", "version", "name", "microbatch_size", "input_bytes", "source", "blocks")


@dataclass(frozen=True, slots=True)
class Block:
    """One indivisible piece of the model.

    ``activation_bytes`` is everything that crosses a stage boundary placed right after this
    block, summed over all the tensors that cross it (a DAG's cut may carry a hidden state, a
    residual and an attention mask at once; a tensor read further on is relayed, so it counts at
    every boundary it spans). ``stash_bytes`` is the memory a stage keeps per in-flight micro-batch for this block's
    backward pass (saved activations); it defaults to the output activation size, which is what
    PipeDream/DAPPLE profiles give.

    ``weight_s`` is the part of ``backward_s`` that computes the weight gradients (the ``W`` of a
    split backward; the rest is the input gradient ``B``). Zero-bubble schedules time the two
    halves apart. The profiler measures it; a profile without it (PipeDream/DAPPLE ``graph.txt``)
    assumes half of the backward, the split the zero-bubble paper reports for transformers.
    """

    name: str
    forward_s: float
    backward_s: float
    activation_bytes: float
    param_bytes: float
    stash_bytes: float = -1.0
    weight_s: float = -1.0

    def __post_init__(self) -> None:
        where = f"block {self.name!r}"
        limits.text(self.name, "block", "name")
        for attr in ("forward_s", "backward_s", "activation_bytes", "param_bytes"):
            top = limits.MAX_SECONDS if attr.endswith("_s") else limits.MAX_BYTES
            object.__setattr__(self, attr, limits.number(getattr(self, attr), where, attr, maximum=top))
        if isinstance(self.stash_bytes, (int, float)) and not isinstance(self.stash_bytes, bool) and self.stash_bytes == -1:
            object.__setattr__(self, "stash_bytes", float(self.activation_bytes))  # the default: the output activation
        else:
            object.__setattr__(self, "stash_bytes", limits.number(self.stash_bytes, where, "stash_bytes", maximum=limits.MAX_BYTES))
        if isinstance(self.weight_s, (int, float)) and not isinstance(self.weight_s, bool) and self.weight_s == -1:
            object.__setattr__(self, "weight_s", self.backward_s / 2)  # no measured split: half (see above)
        else:
            object.__setattr__(self, "weight_s", limits.number(self.weight_s, where, "weight_s", maximum=limits.MAX_SECONDS))
            if self.weight_s > self.backward_s:
                raise UserError(f"{where}: weight_s {self.weight_s} exceeds backward_s {self.backward_s} (it is a part of it)")


@dataclass(frozen=True)
class Profile:
    """The model as an ordered chain of blocks plus the input size to the first block."""

    name: str
    blocks: tuple[Block, ...]
    microbatch_size: int = 1
    input_bytes: float = 0.0
    source: str = ""
    # Derived prefix sums; not part of equality or the file format.
    _prefix: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"profile {self.name!r}"
        if not self.blocks:
            raise UserError(f"{where} has no blocks")
        limits.count(len(self.blocks), where, "number of blocks", maximum=limits.MAX_BLOCKS)
        object.__setattr__(self, "microbatch_size", limits.count(self.microbatch_size, where, "microbatch_size", maximum=2**31))
        object.__setattr__(self, "input_bytes", limits.number(self.input_bytes, where, "input_bytes", maximum=limits.MAX_BYTES))
        object.__setattr__(self, "blocks", tuple(self.blocks))
        if not any(b.forward_s > 0 or b.backward_s > 0 for b in self.blocks):
            raise UserError(f"{where}: every block has zero forward and backward time; nothing to balance")
        for key in ("forward_s", "backward_s", "weight_s", "param_bytes", "stash_bytes"):
            values = np.array([getattr(b, key) for b in self.blocks], dtype=np.float64)
            prefix = np.concatenate([[0.0], np.cumsum(values)])
            prefix.flags.writeable = False
            self._prefix[key] = prefix
        acts = np.array([b.activation_bytes for b in self.blocks], dtype=np.float64)
        acts.flags.writeable = False
        self._prefix["activation"] = acts

    # ----- sizes and range queries (O(1) each, vectorizable) -----
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def prefix(self, key: str) -> np.ndarray:
        """Prefix sums (length L+1) of ``forward_s``, ``backward_s``, ``weight_s``, ``param_bytes`` or ``stash_bytes``."""
        return self._prefix[key]

    @property
    def activations(self) -> np.ndarray:
        """Output activation bytes of each block (length L)."""
        return self._prefix["activation"]

    def forward_time(self, first: int, last: int) -> float:
        p = self._prefix["forward_s"]
        return float(p[last] - p[first])

    def backward_time(self, first: int, last: int) -> float:
        p = self._prefix["backward_s"]
        return float(p[last] - p[first])

    def weight_time(self, first: int, last: int) -> float:
        """The weight-gradient part ``W`` of :meth:`backward_time` (see :class:`Block`)."""
        p = self._prefix["weight_s"]
        return float(p[last] - p[first])

    def compute_time(self, first: int, last: int) -> float:
        return self.forward_time(first, last) + self.backward_time(first, last)

    def param_bytes(self, first: int, last: int) -> float:
        p = self._prefix["param_bytes"]
        return float(p[last] - p[first])

    def stash_bytes(self, first: int, last: int) -> float:
        p = self._prefix["stash_bytes"]
        return float(p[last] - p[first])

    def stage_backward_time(self, first: int, last: int, recompute: bool = False) -> float:
        """Backward of blocks ``[first, last)``; with activation recomputation the forward runs
        again first (its cost)."""
        return self.backward_time(first, last) + (self.forward_time(first, last) if recompute else 0.0)

    def stage_stash_bytes(self, first: int, last: int, recompute: bool = False) -> float:
        """Bytes kept per in-flight micro-batch; with recomputation only the stage's input (what
        the recomputed forward starts from), else what autograd saves in every block."""
        return self.boundary_bytes(first) if recompute else self.stash_bytes(first, last)

    def boundary_bytes(self, cut: int) -> float:
        """Bytes crossing a cut placed before block ``cut`` (all tensors the previous block's boundary carries)."""
        if cut <= 0:
            return float(self.input_bytes)
        return float(self.activations[cut - 1])

    @property
    def total_compute_s(self) -> float:
        return self.compute_time(0, self.num_blocks)

    @property
    def total_param_bytes(self) -> float:
        return self.param_bytes(0, self.num_blocks)

    # ----- transformations -----
    def scaled(self, forward: float = 1.0, backward: float | None = None) -> "Profile":
        """The same model with compute times multiplied (e.g. by a device's observed slowdown)."""
        backward = forward if backward is None else backward
        blocks = tuple(
            Block(b.name, b.forward_s * forward, b.backward_s * backward, b.activation_bytes, b.param_bytes, b.stash_bytes,
                  b.weight_s * backward)
            for b in self.blocks
        )
        return Profile(self.name, blocks, self.microbatch_size, self.input_bytes, self.source)

    def with_activation_scale(self, factor: float) -> "Profile":
        """Activation and stash bytes multiplied by ``factor`` (SPP's activation-size sweep)."""
        blocks = tuple(
            Block(b.name, b.forward_s, b.backward_s, b.activation_bytes * factor, b.param_bytes, b.stash_bytes * factor, b.weight_s)
            for b in self.blocks
        )
        return Profile(self.name, blocks, self.microbatch_size, self.input_bytes * factor, self.source)

    def coarsened(self, groups: Sequence[tuple[int, int]]) -> "Profile":
        """Merge contiguous block ranges into single blocks (e.g. to cap planner input size)."""
        blocks = []
        for first, last in groups:
            blocks.append(
                Block(
                    name="+".join(self.blocks[first].name.split("+")[:1]) + (f"..{last - 1}" if last - first > 1 else ""),
                    forward_s=self.forward_time(first, last),
                    backward_s=self.backward_time(first, last),
                    activation_bytes=float(self.activations[last - 1]),
                    param_bytes=self.param_bytes(first, last),
                    stash_bytes=self.stash_bytes(first, last),
                    weight_s=min(self.weight_time(first, last), self.backward_time(first, last)),
                )
            )
        return Profile(self.name, tuple(blocks), self.microbatch_size, self.input_bytes, self.source)

    # ----- JSON -----
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "raypipe-profile",
            "version": FORMAT_VERSION,
            "name": self.name,
            "microbatch_size": self.microbatch_size,
            "input_bytes": self.input_bytes,
            "source": self.source,
            "blocks": [asdict(b) for b in self.blocks],
        }

    @classmethod
    def from_dict(cls, data: Any, origin: str = "profile") -> "Profile":
        """A profile file's object, strictly: every field known (a misspelt one is refused with the closest
        name), a known ``version`` (absent: 1), every number checked (:mod:`orchestrator.core.limits`)."""
        if not isinstance(data, dict) or data.get("format") != "raypipe-profile":
            kind = data.get("format") if isinstance(data, dict) else None
            if isinstance(kind, str) and kind.startswith("raypipe-"):
                raise UserError(f"{origin}: is a {kind} file, not a profile (\"format\": \"raypipe-profile\")")
            raise UserError(f"{origin}: not a raypipe profile JSON (missing \"format\": \"raypipe-profile\")")
        try:
            limits.known_fields(data, PROFILE_FIELDS, "")
            limits.version(data, "", FORMAT_VERSIONS, default=1)
            raw = data.get("blocks")
            if not isinstance(raw, list):
                raise UserError(f"\"blocks\" must be a list, got {type(raw).__name__}")
            limits.count(len(raw), "profile", "number of blocks", minimum=0, maximum=limits.MAX_BLOCKS)
            fields = {f.name for f in dataclasses.fields(Block)}
            blocks = []
            for i, b in enumerate(raw):
                if not isinstance(b, dict):
                    raise UserError(f"block {i} must be an object, got {type(b).__name__}")
                limits.known_fields(b, fields, f"block {i}")
                missing = {"name", "forward_s", "backward_s", "activation_bytes", "param_bytes"} - set(b)
                if missing:
                    raise UserError(f"block {i}: missing field(s) {sorted(missing)}")
                for size in ("stash_bytes", "weight_s"):  # in a file a size or a time; leave it out for the default
                    if size in b:
                        top = limits.MAX_SECONDS if size == "weight_s" else limits.MAX_BYTES
                        limits.number(b[size], f"block {b.get('name', i)!r}", size, maximum=top)
                blocks.append(Block(**b))
            return cls(
                name=limits.text(data.get("name", "model"), "profile", "name"),
                blocks=tuple(blocks),
                microbatch_size=data.get("microbatch_size", 1),
                input_bytes=data.get("input_bytes", 0.0),
                source=str(data.get("source", "")),
            )
        except UserError as exc:
            raise UserError(f"{origin}: {exc}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json_atomic(Path(path), self.to_dict())
