"""A soak: one ElasticJob through hundreds of steps with a seeded fault about every 10 steps, on 3 Ray nodes.

Why: each recovery path is tested on its own elsewhere; only a long run with every kind of fault, one after the
other, shows that they compose — that the weights stay exact, that nothing is left behind (Ray actors, placement
groups, processes) and that the survivors' memory does not grow with every fault.

The cluster is a real ``ray.cluster_utils.Cluster`` (a head with 1 CPU, two worker nodes with 2 CPUs each: five
CPU devices on three nodes). Between chunks of ``--every`` steps (one ``ElasticJob.fit`` each) the seeded schedule
draws one fault: an unnoticed worker death (``ray.kill`` of a stage actor: its next call sees Ray's actor death), a
hung worker (the rehearsed hang of ``--inject-hang-at``: it blocks for ever halfway through its next step, the job's
deadline finds it, ends its process and recovers in place), a node removal (``Cluster.remove_node``: all its workers die), a preemption notice for one device or for a whole node
(``ElasticJob.notify``), a node join (``Cluster.add_node``: growth) or a slowdown of one device (the workers'
injection knob, lifted one chunk later). Each kind is drawn once early, in a seeded order, then at random. The last
line is one JSON object: ``max_abs_diff`` against uninterrupted single-process training, ``faults`` (count per
kind), ``handled`` (per fault: its kind, step, and the job's events that followed it), ``leaked``, the survivors'
resident memory from step 50 to the end, the goodput (samples per second over the whole run, recoveries included:
the time inside the job's ``fit`` calls, not the soak's own cluster changes, which a cloud makes in parallel) and
``ok``.

``--trace LOGS`` replaces the seeded faults by the losses and joins of two spot offers in the thesis's availability
logs (:mod:`benchmarks.soak_trace`), time-compressed, and replays the same trace twice — with recovery in place, then
with full restarts only (``RunConfig(recover_in_place=False)``) — to report the two goodputs side by side.

    python benchmarks/soak.py --steps 500 --seed 7          # writes benchmarks/results/soak.md with --record
    python benchmarks/soak.py --steps 100 --trace ../shared/pricing_traces/training_on_a_dime/logs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.soak_trace import TraceEvent, compression, trace_schedule  # noqa: E402

KINDS = ("death", "hang", "node_removal", "notice_device", "notice_node", "join", "slowdown")
TAKING = ("death", "hang", "node_removal")  # kinds that take capacity away
WIDTHS = (8, 16, 16, 16, 16, 16, 16, 16, 4)


def schedule(steps: int, every: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[tuple[int, str]]:
    """``(step, kind)``: every kind once in a seeded order, then seeded random kinds, one per ``every`` steps."""
    rng = random.Random(seed)
    # every kind once first, those that take capacity away last: a death and a node removal early leave the job one
    # device to train on, where no notice can be evacuated (it would be a migration) and the notices are never drawn
    gentle = [k for k in kinds if k not in TAKING]
    rng.shuffle(gentle)
    first = gentle + [k for k in TAKING if k in kinds]
    at = list(range(every, steps, every))
    return [(s, first[i] if i < len(first) else rng.choice(kinds)) for i, s in enumerate(at)]


def rss_kib(pid: int) -> int | None:
    """Resident memory of a local process (every node of a ``cluster_utils`` cluster is on this machine)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class Soak:
    """The cluster, the job and the faults (see the module docstring)."""

    def __init__(self, steps: int, seed: int, every: int, tmp: Path, kinds: tuple[str, ...] = KINDS, in_place: bool = True) -> None:
        import ray
        from ray.cluster_utils import Cluster

        from actors.ray_session import LOCAL_SYSTEM_CONFIG
        from orchestrator import AdaptConfig, ElasticJob, RunConfig, ScalingConfig, SpotConfig, TrainConfig
        from orchestrator.adapt.controller import ControllerConfig
        from orchestrator.core.plan import straight_plan
        from orchestrator.profiling.models import example_batch, loss_fn, mlp

        self.steps, self.every, self.kinds, self.rng = steps, every, kinds, random.Random(seed + 1)
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                         "_system_config": LOCAL_SYSTEM_CONFIG})
        self.nodes = [self.cluster.add_node(num_cpus=2) for _ in range(2)]
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, log_to_driver=False)
        train = TrainConfig(model_factory=partial(mlp, WIDTHS), loss_fn=loss_fn("mlp"),
                            optimizer_factory=partial(torch.optim.SGD, lr=0.05, momentum=0.9),
                            data_fn=partial(example_batch, "mlp", 12, widths=WIDTHS), num_microbatches=4)
        self.events_file = tmp / "events.jsonl"
        self.job = ElasticJob(train, ScalingConfig(devices=5, max_devices=64, plan=straight_plan([0, 2, 3, 5, 6, 8], 4), node_poll_s=0.1),
                              RunConfig(storage=str(tmp / "ckpt"), events=self.events_file, checkpoint_every=every,
                                        max_failures=steps, recover_in_place=in_place),
                              AdaptConfig(controller=ControllerConfig(straight=True)),
                              SpotConfig(enabled=True, margin_s=1.0, ray_drain_poll_s=0.0))
        self.slowed: int | None = None
        self.pids: set[int] = set()
        self.memory: dict[int, int] = {}  # pid -> RSS KiB at step 50 (or when first seen after it)
        self.offer_nodes: dict[int, Any] = dict(enumerate(self.nodes))  # --trace: the node standing for each offer
        self.batch = int(train.data_fn(0)[0].shape[0])  # samples per step

    # ----- faults -----
    def inject(self, kind: str) -> str:
        """Carry out one fault between chunks; returns what was done (or why another kind stood in)."""
        job = self.job
        plan_devices = list(job.runtime.plan.devices)
        group = job.runtime.group
        assert group is not None
        workers = [n for n in self.nodes if n in self.cluster.worker_nodes]
        node_of = {d: group.node_of(d) for d in job.alive}
        if kind in ("node_removal", "notice_node") and len(workers) < 2:
            kind = "join"  # keep a node to train on: add capacity instead
        # a node the job trains on, where there is one (the fault reaches it), but not one holding every device the
        # job has: that is no partial loss but the whole job's (a restart from storage is all that is left to do)
        partial = [n for n in workers if set(node_of) - {d for d, at in node_of.items() if at == n.node_id}]
        busy = [n for n in partial if n.node_id in {node_of[d] for d in plan_devices if d in node_of}]
        workers = busy or partial or workers
        if kind in ("death", "hang") and len(plan_devices) < 2:
            kind = "slowdown"
        if kind == "death":
            d = self.rng.choice(plan_devices)
            import ray

            ray.kill(group.actor_of(d), no_restart=True)
            return f"death: device {d}'s actor killed"
        if kind == "hang":  # the rehearsed hang (--inject-hang-at): the worker blocks for ever halfway through the next step
            d = self.rng.choice(plan_devices)
            job.runtime.arm_kill(d, job.runtime.step, hang=True)
            return f"hang: device {d} blocks in step {job.runtime.step}"
        if kind == "node_removal" and not partial:
            kind = "join"  # every device of the job is on one node: add capacity instead
        if kind == "node_removal":
            node = self.rng.choice(workers)
            self.cluster.remove_node(node)
            self.nodes.remove(node)
            return f"node_removal: node {node.node_id[:12]}"
        if kind in ("notice_device", "notice_node") and len(plan_devices) < 2:
            kind = "join"  # a notice for every device the job trains on is a migration to another cluster, not a soak fault
        if kind == "notice_device":
            d = self.rng.choice(plan_devices)
            job.notify((d,), 30.0, "soak")
            return f"notice_device: device {d}"
        if kind == "notice_node":
            node = self.rng.choice(workers)
            on = tuple(sorted(d for d, n in node_of.items() if n == node.node_id))
            if not on or set(plan_devices) <= set(on):
                return self.inject("notice_device")
            job.notify(on, 30.0, "soak")
            return f"notice_node: devices {list(on)} on node {node.node_id[:12]}"
        if kind == "join":
            self.nodes.append(self.cluster.add_node(num_cpus=2))
            self.cluster.wait_for_nodes()
            return f"join: node {self.nodes[-1].node_id[:12]}"
        d = self.rng.choice(plan_devices)
        job.runtime.set_knobs(d, 4.0, {})
        self.slowed = d
        return f"slowdown: device {d} 4x"

    def replay(self, event: TraceEvent) -> str:
        """One loss or join of the trace (a loss of a node already gone, or a join of one there, changes nothing)."""
        node = self.offer_nodes.get(event.slot)
        if event.kind == "loss" and node is not None:
            self.cluster.remove_node(node)
            self.nodes.remove(node)
            del self.offer_nodes[event.slot]
            return f"node_removal: {event.offer} preempted at {event.at}"
        if event.kind == "join" and node is None:
            self.offer_nodes[event.slot] = self.cluster.add_node(num_cpus=2)
            self.nodes.append(self.offer_nodes[event.slot])
            self.cluster.wait_for_nodes()
            return f"join: {event.offer} up at {event.at}"
        return f"none: {event.offer} {event.kind} at {event.at} (no change)"

    def lift_slowdown(self) -> None:
        if self.slowed is not None and self.job.runtime.started and self.slowed in self.job.runtime.plan.devices:
            try:
                self.job.runtime.set_knobs(self.slowed, 1.0, {})
            except Exception:  # noqa: BLE001 - its worker may have died since
                pass
        self.slowed = None

    # ----- measurement -----
    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.events_file.read_text().splitlines()]

    def sample_memory(self) -> None:
        pids = {d.pid for d in self.job.runtime.devices()}
        self.pids |= pids
        if self.job.runtime.step >= 50:
            for pid in pids:
                if pid not in self.memory:
                    found = rss_kib(pid)
                    if found is not None:
                        self.memory[pid] = found

    def memory_growth(self) -> dict[str, Any]:
        pids = {d.pid for d in self.job.runtime.devices()}
        now = {pid: rss_kib(pid) for pid in pids if pid in self.memory}
        growth = {str(pid): round(kib / self.memory[pid] - 1.0, 4) for pid, kib in now.items() if kib}
        return {"from_step_50_kib": {str(p): self.memory[p] for p in now}, "end_kib": {str(p): k for p, k in now.items()},
                "max_growth": max(growth.values()) if growth else None}

    def leaked(self) -> list[str]:
        """Ray actors and placement groups of the run still alive after it ended, and its worker processes."""
        import ray
        import ray._private.state as state

        out: list[str] = []
        deadline = time.monotonic() + 30
        while True:  # a killed actor's process can take a moment to go
            actors = [a for a in state.actors().values() if a.get("ActorClassName") == "StageWorker" and a.get("State") == "ALIVE"]
            alive = [p for p in sorted(self.pids) if rss_kib(p) is not None]
            if (not actors and not alive) or time.monotonic() > deadline:
                break
            time.sleep(1)
        out += [f"actor {a['ActorID'][:12]} (pid {a.get('Pid')})" for a in actors]
        out += [f"placement group {pg_id[:12]}" for pg_id, pg in ray.util.placement_group_table().items() if pg.get("state") == "CREATED"]
        out += [f"process {p}" for p in alive]
        return out

    def run(self, trace: Sequence[TraceEvent] | None = None) -> dict[str, Any]:
        """The seeded faults (or the ``trace``'s losses and joins) between chunks; the result line's fields."""
        handled: list[dict[str, Any]] = []
        counts = {k: 0 for k in KINDS}
        plan: dict[int, list[Any]] = {}
        for step, fault in (schedule(self.steps, self.every, self.rng.randrange(1 << 30), self.kinds) if trace is None
                            else [(e.step, e) for e in trace]):
            plan.setdefault(step, []).append(fault)
        error = None
        mark = fresh = 0  # events seen; faults whose chunk has completed
        train_s = 0.0  # inside the job's fit (recoveries included); the soak's own cluster changes are the cloud's time
        try:
            while self.job.runtime.step < self.steps:
                t0 = time.perf_counter()
                try:
                    self.job.fit(min(self.job.runtime.step + self.every, self.steps))  # fit(N) trains to step N
                finally:
                    train_s += time.perf_counter() - t0
                self.sample_memory()
                events = self.events()
                for h in handled[fresh:]:  # the chunk after the faults completed: handled; the events say how
                    h["completed"] = True
                    h["events"] = sorted({e["event"] for e in events[mark:]} - {"job_finished", "adapt"})
                    h["modes"] = sorted({str(e.get("mode")) for e in events[mark:] if "mode" in e})
                mark, fresh = len(events), len(handled)
                self.lift_slowdown()
                if self.job.runtime.step >= self.steps:
                    continue
                for fault in plan.get(self.job.runtime.step, []):
                    done = self.replay(fault) if isinstance(fault, TraceEvent) else self.inject(fault)
                    if done.startswith("none:"):
                        continue
                    counts[done.split(":")[0]] += 1
                    handled.append({"step": self.job.runtime.step, "fault": done})
        except Exception as exc:  # noqa: BLE001 - reported in the JSON line, exit 1; its traceback on stderr
            traceback.print_exc()
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        diff = self.job.max_abs_diff() if error is None else None
        memory = self.memory_growth() if error is None else {}
        self.job.close()
        leaked = self.leaked()
        ok = (error is None and diff is not None and diff <= 1e-5 and not leaked
              and (trace is not None or all(counts[k] for k in self.kinds))
              and (memory.get("max_growth") is None or memory["max_growth"] <= 0.10))
        hangs = [e for e in self.events() if e["event"] == "worker_failed" and e.get("cause") == "hang"]
        ok = ok and (trace is not None or len(hangs) == counts["hang"])  # every hang found by the deadline, none made up
        recovered = [e for e in self.events() if e["event"] == "recovered"]
        stalls = {str(m): [float(e["stall_s"]) for e in recovered if e["mode"] == m] for m in {e["mode"] for e in recovered}}
        return {"steps": self.job.runtime.step, "max_abs_diff": diff, "faults": counts, "handled": handled, "leaked": leaked,
                "memory": memory, "train_s": round(train_s, 2),
                "goodput_samples_per_s": round(self.job.runtime.step * self.batch / train_s, 2) if error is None else None,
                "hangs_detected": [{"step": e["step"], "device": e["device"], "hang_detect_s": e.get("hang_detect_s")} for e in hangs],
                "recoveries": {m: {"count": len(v), "stall_s_total": round(sum(v), 2), "stall_s_max": max(v)} for m, v in sorted(stalls.items())},
                "error": error, "ok": ok}

    def close(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()
        current = Path("/tmp/ray/ray_current_cluster")  # never leave later ray.init() calls pointing here
        if current.exists() and current.read_text().strip() == self.cluster.address:
            current.unlink()


def one_run(steps: int, seed: int, every: int, trace: Sequence[TraceEvent] | None = None, in_place: bool = True) -> dict[str, Any]:
    """One soak on a cluster of its own (torn down after it)."""
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        soak = Soak(steps, seed, every, Path(tmp), in_place=in_place)
        try:
            return soak.run(trace)
        finally:
            soak.close()


def replay_trace(logs: str, steps: int, seed: int, every: int) -> int:
    """``--trace``: the same losses and joins with recovery in place, then with full restarts only; one JSON line."""
    from cloud.availability import load_availability
    from cloud.errors import CloudInputError

    try:
        events = trace_schedule(load_availability(logs), steps, every)
    except CloudInputError as exc:
        print(f"error: --trace {logs}: {exc}", file=sys.stderr)
        return 2
    if not any(e.kind == "loss" for e in events):
        print(f"error: --trace {logs}: no preemption of an offer in the logs: nothing to replay", file=sys.stderr)
        return 2
    runs = {mode: one_run(steps, seed, every, events, in_place=mode == "in_place") for mode in ("in_place", "restart")}
    short = {mode: {k: r[k] for k in ("steps", "max_abs_diff", "faults", "recoveries", "leaked", "memory", "train_s",
                                       "goodput_samples_per_s", "error", "ok")}
             | {"handled": [[h["step"], h["fault"].split(" ")[0].rstrip(":"), h.get("events", []), h.get("modes", [])] for h in r["handled"]]}
             for mode, r in runs.items()}
    good = {m: r["goodput_samples_per_s"] for m, r in runs.items()}
    iteration = runs["in_place"]["train_s"] / max(1, runs["in_place"]["steps"])
    result = {"trace": logs, "offers": sorted({e.offer for e in events}), "events": [[e.step, e.kind, e.slot, e.at] for e in events],
              "compression": round(compression(events, steps, iteration), 1), **short,
              "goodput_ratio": round(good["in_place"] / good["restart"], 3) if good["in_place"] and good["restart"] else None,
              "ok": all(r["ok"] for r in runs.values()), "seed": seed}
    print(json.dumps(result))
    return 0 if result["ok"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--every", type=int, default=10, help="steps between faults")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"fault kinds to draw from (default: all of {', '.join(KINDS)})")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/soak.md")
    parser.add_argument("--trace", metavar="LOGS", help="losses and joins from availability logs (a file, or a folder with "
                        "availability/*.out below it), replayed with recovery in place and with full restarts only")
    args = parser.parse_args()
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        print(f"error: --kinds {args.kinds!r}: unknown kind(s) {unknown} (choose from {', '.join(KINDS)})", file=sys.stderr)
        return 2
    if args.steps < 2 * args.every or args.every < 2:
        print(f"error: --steps {args.steps} must be at least twice --every {args.every} (and --every at least 2)", file=sys.stderr)
        return 2
    os.environ.pop("RAY_ADDRESS", None)  # the soak's own cluster, never one the caller points at
    if args.trace is not None:
        return replay_trace(args.trace, args.steps, args.seed, args.every)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        soak = Soak(args.steps, args.seed, args.every, Path(tmp), kinds)
        try:
            result = soak.run()
        finally:
            soak.close()
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["seed"] = args.seed
    if args.record:
        out = ROOT / "benchmarks" / "results" / "soak.md"
        out.write_text("# Soak (benchmarks/soak.py)\n\n"
                       f"`python benchmarks/soak.py --steps {args.steps} --seed {args.seed} --kinds {','.join(kinds)}` on a 3-node "
                       f"ray.cluster_utils cluster (load average {os.getloadavg()[0]:.1f} at the end).\n\n"
                       + (f"Kinds left out: {', '.join(k for k in KINDS if k not in kinds)}.\n\n" if len(kinds) < len(KINDS) else "")
                       + f"```json\n{json.dumps(result, indent=1)}\n```\n")
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
