"""One validator for every schedule, with a readable device × step grid on failure.

It checks what both interpreters rely on: every unit is forwarded and backwarded exactly once
per stage replica (one ``B``, or one ``BI`` then one ``W``), a backward follows its forward, every send has exactly one matching receive
in the same per-link order, and each stage ends with one optimizer step per device.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from orchestrator.schedule.ir import Action, Kind, Schedule


class ScheduleError(RuntimeError):
    """A schedule that cannot run (a generator bug or a hand-written schedule's mistake)."""


def render_grid(schedule: Schedule, mark: tuple[int, int] | None = None, width: int = 12, window: int = 10) -> str:
    """Devices as rows, program steps as columns; ``mark=(device, step)`` adds ``<-- ERROR HERE``."""
    lines = []
    lo = 0
    if mark is not None:
        lo = max(0, mark[1] - window // 2)
    for dev, acts in sorted(schedule.programs.items()):
        cells = [str(a).ljust(width) for a in acts[lo : lo + window]]
        line = f"dev {dev:>3} | " + "".join(cells)
        if mark is not None and mark[0] == dev:
            line += f"  <-- ERROR HERE (step {mark[1]}: {acts[mark[1]] if mark[1] < len(acts) else 'end'})"
        lines.append(line)
    return "\n".join(lines)


def validate(schedule: Schedule) -> None:
    plan = schedule.plan
    units = set(schedule.units)
    sends: dict[tuple[int, int], list[tuple[str, int, tuple[int, int]]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple[str, int, tuple[int, int]]]] = defaultdict(list)
    first_step: dict[tuple[int, int], int] = {}

    def fail(msg: str, dev: int, step: int) -> None:
        raise ScheduleError(f"{msg}\n{render_grid(schedule, (dev, step))}")

    for dev, acts in schedule.programs.items():
        mine = set(plan.stages_of_device(dev))
        done: Counter[tuple[Kind, int, tuple[int, int]]] = Counter()
        steps: Counter[int] = Counter()
        for i, a in enumerate(acts):
            if a.stage not in mine:
                fail(f"device {dev} runs {a} but stage {a.stage} is not on it", dev, i)
            if a.kind.is_compute:
                if a.unit not in units:
                    fail(f"unknown unit in {a}", dev, i)
                key = (a.kind, a.stage, a.unit)
                done[key] += 1
                if done[key] > 1:
                    fail(f"{a} runs twice", dev, i)
                if a.kind.grads_input and not done[(Kind.FORWARD, a.stage, a.unit)]:
                    fail(f"{a} runs before its forward", dev, i)
                if a.kind is Kind.BACKWARD_WEIGHT and not done[(Kind.BACKWARD_INPUT, a.stage, a.unit)]:
                    fail(f"{a} runs before its input gradient ({a.stage}BI)", dev, i)
                if a.kind.grads_input and done[(Kind.BACKWARD, a.stage, a.unit)] + done[(Kind.BACKWARD_INPUT, a.stage, a.unit)] > 1:
                    fail(f"{a}: the unit's backward runs both whole and split", dev, i)
            elif a.kind is Kind.STEP:
                steps[a.stage] += 1
                if any(not _backwarded(done, a.stage, u) for u in units):
                    fail(f"{a} runs before every backward of stage {a.stage}", dev, i)
            elif a.kind in (Kind.SEND_F, Kind.SEND_B):
                tag = "F" if a.kind is Kind.SEND_F else "B"
                sends[(dev, a.peer)].append((tag, a.stage, a.unit))
                first_step.setdefault((dev, a.peer), i)
            elif a.kind in (Kind.RECV_F, Kind.RECV_B):
                tag = "F" if a.kind is Kind.RECV_F else "B"
                src_stage = a.stage - 1 if tag == "F" else a.stage + 1
                recvs[(a.peer, dev)].append((tag, src_stage, a.unit))
        for s in mine:
            missing = [u for u in units if not done[(Kind.FORWARD, s, u)] or not _backwarded(done, s, u)]
            if missing:
                fail(f"device {dev} never completes stage {s} for unit(s) {missing[:4]}", dev, len(acts))
            if steps[s] != 1:
                fail(f"device {dev} steps stage {s} {steps[s]} times", dev, len(acts))
    for link in set(sends) | set(recvs):
        if sends.get(link, []) != recvs.get(link, []):
            src, dst = link
            raise ScheduleError(
                f"link {src}->{dst}: sends {[_fmt(x) for x in sends.get(link, [])][:6]} do not match "
                f"receives {[_fmt(x) for x in recvs.get(link, [])][:6]} in order\n{render_grid(schedule, (src, first_step.get(link, 0)))}"
            )


def _backwarded(done: Counter[tuple[Kind, int, tuple[int, int]]], stage: int, unit: tuple[int, int]) -> bool:
    """The unit's weight gradients of ``stage`` are in: a whole ``B``, or ``BI`` and its ``W``."""
    return bool(done[(Kind.BACKWARD, stage, unit)] or (done[(Kind.BACKWARD_INPUT, stage, unit)] and done[(Kind.BACKWARD_WEIGHT, stage, unit)]))


def _fmt(item: tuple[str, int, tuple[int, int]]) -> str:
    tag, stage, (mb, part) = item
    return f"{tag}{stage}:{mb}" + (f".{part}" if part else "")

