"""Field checks and size limits shared by the loaders (profile, cluster, plan) and the CLIs.

Why one place: every loader needs the same judgement — a JSON ``true`` is not a number, ``NaN``
is not a size, ``2.7`` is not a micro-batch count — and every message should name where the bad
value sits ("block 'fc2': forward_s ...", "device 3: speed ..."). Limits are here too, so the
numbers a user can be refused with are documented once.

The limits are what this project's reference machine (24 GB RAM, 2 cores) does in well under a
minute, with the measurements behind them:

* :data:`MAX_DEVICES` = 1024. The widest-path routing is Floyd–Warshall on an n×n matrix: 2.3 s at
  1024 devices, 24 s at 2048 (O(n³)); 100 000 devices would need 75 GiB for one matrix.
* :data:`MAX_SIM_EVENTS` = 2 000 000 simulator events (about 4 per stage per micro-batch). The
  simulator spends ~15 µs and ~0.5 KB per event: 1.2 M events took 17.5 s and 576 MB, so the
  limit is about 30 s and 1 GB for one simulation (a planner may run several).
* :data:`MAX_MICROBATCHES` = 65 536 per iteration (the runtime's tag space allows 4096; the
  simulator still answers "what if" questions beyond that, within the event limit).
* :data:`MAX_BLOCKS` = 100 000 blocks in a profile (planners are O(L²) in blocks at worst).
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from typing import Any, Collection, Iterable, Mapping

from orchestrator.core.errors import UserError

MAX_DEVICES = 1024
MAX_SIM_EVENTS = 2_000_000
SIM_BYTES_PER_EVENT = 500
SIM_SECONDS_PER_EVENT = 15e-6
MAX_MICROBATCHES = 65_536
MAX_BLOCKS = 100_000
MAX_BYTES = 2.0**60  # a size beyond an exbibyte is a typo, and sums of them must stay finite
MAX_SECONDS = 1e7  # one block taking ~4 months per micro-batch is a typo too


def number(value: Any, where: str, field: str, *, positive: bool = False, maximum: float | None = None) -> float:
    """``value`` as a finite float ``>= 0`` (``> 0`` when ``positive``, ``<= maximum`` if given).

    ``bool`` is refused although Python counts it as an int: ``true`` in a JSON file is a mistake."""
    if type(value) is float and 0.0 <= value <= (maximum if maximum is not None else math.inf) and value != math.inf:
        if value > 0 or not positive:
            return value  # the common case, kept cheap: planners build many blocks and devices
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserError(f"{where}: {field} must be a number, got {_show(value)}")
    x = float(value)
    if not math.isfinite(x):
        raise UserError(f"{where}: {field} must be finite, got {x}")
    if positive and not x > 0:
        raise UserError(f"{where}: {field} must be > 0, got {_show(value)}")
    if x < 0:
        raise UserError(f"{where}: {field} must be >= 0, got {_show(value)}")
    if maximum is not None and x > maximum:
        raise UserError(f"{where}: {field} is {x:g}, above the limit {maximum:g}")
    return x


def count(value: Any, where: str, field: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; ``3.0`` is accepted, ``2.7``, ``"3"`` and ``true`` are not."""
    if type(value) is int and value >= minimum and (maximum is None or value <= maximum):
        return value  # the common case, kept cheap: planners build many stages
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserError(f"{where}: {field} must be an integer, got {_show(value)}")
    if not isinstance(value, numbers.Integral) and not (math.isfinite(value) and float(value).is_integer()):
        raise UserError(f"{where}: {field} must be an integer, got {value}")
    n = int(float(value)) if not isinstance(value, numbers.Integral) else int(value)  # type: ignore[call-overload]
    if n < minimum:
        raise UserError(f"{where}: {field} must be >= {minimum}, got {n}")
    if maximum is not None and n > maximum:
        raise UserError(f"{where}: {field} is {n}, above the limit {maximum}")
    return n


def text(value: Any, where: str, field: str) -> str:
    """``value`` as a string (names, nodes, kinds): a number or a list there is a mistake."""
    if not isinstance(value, str):
        raise UserError(f"{where}: {field} must be a string, got {_show(value)}")
    return value


def flag(value: Any, where: str, field: str) -> bool:
    """``value`` as a bool: ``1``, ``"yes"`` or ``"false"`` (truthy!) are mistakes, not flags."""
    if not isinstance(value, bool):
        raise UserError(f"{where}: {field} must be True or False, got {_show(value)}")
    return value


def function(value: Any, where: str, field: str) -> Any:
    """A callable (a factory, a loss, a data function); a list or a string there is a mistake
    that would otherwise surface as a traceback inside a remote worker."""
    if not callable(value):
        raise UserError(f"{where}: {field} must be a function (a picklable callable), got {_show(value)}")
    return value


def path_text(value: Any, where: str, field: str) -> str:
    """A non-empty path or URI given as a string or a path object."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value) or "\x00" in str(os.fspath(value)):
        raise UserError(f"{where}: {field} must be a non-empty path or URI, got {_show(value)}")
    return str(os.fspath(value))


def instance(value: Any, kind: type, where: str, field: str, optional: bool = False) -> Any:
    """``value`` of type ``kind`` (or None when ``optional``)."""
    if (value is None and optional) or isinstance(value, kind):
        return value
    raise UserError(f"{where}: {field} must be a {kind.__name__}{' or None' if optional else ''}, got {_show(value)}")


def suggest(name: str, options: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``options``, else the list of them."""
    names = sorted(options)
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(names)})"


def choice(value: Any, where: str, field: str, options: Collection[str]) -> str:
    """One of ``options``; anything else with a "did you mean"."""
    if not isinstance(value, str) or value not in options:
        raise UserError(f"{where}: unknown {field} {_show(value)}{suggest(str(value), options)}")
    return value


def known_fields(data: Mapping[str, Any], allowed: Collection[str], where: str) -> None:
    """Strict schemas: a field this format does not define is refused (a misspelt ``devcies``
    silently ignored would mean a default the user did not ask for), naming the closest field.
    ``where`` prefixes the message ("" for a file's top level, which its loader names already)."""
    for key in data:
        if key not in allowed:
            raise UserError(f"{where + ': ' if where else ''}unknown field {_show(key)}{suggest(str(key), allowed)}")


def version(data: Mapping[str, Any], where: str, known: Collection[int], default: int) -> int:
    """The file's format ``version`` (``default`` when absent: files written before versions were
    recorded); one this reader does not know is refused rather than half understood."""
    got = data.get("version", default)
    if isinstance(got, bool) or not isinstance(got, int) or got not in known:
        raise UserError(f"{where + ': ' if where else ''}unsupported format version {_show(got)} (this reader knows "
                        f"{', '.join(map(str, sorted(known)))})")
    return got


def devices(n: int, where: str = "cluster") -> int:
    """Refuse a device count above :data:`MAX_DEVICES` before any n×n matrix is allocated."""
    if n > MAX_DEVICES:
        gib = n * n * 8 * 3 / 2**30 if n < 10**12 else float("inf")  # an int that large overflows the float division
        raise UserError(
            f"{where}: {n} devices need about {gib:.1f} GiB and O(n^3) routing; the limit is {MAX_DEVICES} devices"
        )
    return n


def sim_events(num_stages: int, units: int, where: str = "simulation") -> int:
    """Refuse a simulation whose estimated event count exceeds :data:`MAX_SIM_EVENTS` (before lowering)."""
    events = 4 * max(1, num_stages) * max(1, units)
    if events > MAX_SIM_EVENTS:
        raise UserError(
            f"{where}: {num_stages} stages x {units} micro-batch units is about {events:.3g} events "
            f"(~{events * SIM_BYTES_PER_EVENT / 2**30:.3g} GiB, ~{events * SIM_SECONDS_PER_EVENT:.3g} s); "
            f"the limit is {MAX_SIM_EVENTS:,} events (about 1 GB, 30 s on a 24 GB machine)"
        )
    return events


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
