"""Command line: ``orchestrator profile | plan | simulate | demo | checkpoint | run | events | status | stop | runs | prices | cost-sim``.

Every user mistake becomes one line on stderr and exit code 2 (argparse's own errors included);
only bugs show a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from cloud.errors import CloudError
from orchestrator.core import limits
from orchestrator.core.errors import UserError

MAX_PROFILE_MICROBATCH = 4096  # samples in the one micro-batch profiled on this machine
MAX_SAMPLE_BYTES = 2**30  # its float32 input tensor
MAX_LOCAL_SLOTS = 64
"""``cluster --slots``: each slot is a probe process (~100 MB with torch), all on this one node; 100 000 of them
grew past 6 GB before the first probe ran. 64 is far above any real node's useful CPU slot count."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, as for every other user error
        raise UserError(f"{self.prog}: {message}")


def _add_cluster_args(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_argument_group("cluster (either --gpus ... or --cluster FILE)")
    g.add_argument("--gpus", type=int, help="number of GPUs")
    g.add_argument("--servers", type=int, help="servers the GPUs are spread over (two-level topology)")
    g.add_argument("--intra-gbps", type=float, help="bandwidth between GPUs of one server, Gb/s")
    g.add_argument("--inter-gbps", type=float, help="bandwidth between servers (or all pairs when flat), Gb/s")
    g.add_argument("--memory-gib", type=float, default=32.0, help="memory per GPU, GiB (default 32; not with --cluster)")
    g.add_argument("--cluster", help="cluster JSON spec instead of the flags above")


def build_cluster(args: argparse.Namespace, default_devices: int | None = None) -> Any:
    from orchestrator.core import cluster as cl

    if args.cluster:
        given = [flag for flag, value in (("--gpus", args.gpus), ("--servers", args.servers), ("--intra-gbps", args.intra_gbps),
                                          ("--inter-gbps", args.inter_gbps)) if value is not None]
        if given or args.memory_gib != 32.0:
            raise UserError(f"give either --cluster FILE or {given[0] if given else '--memory-gib'} and the other cluster "
                            "flags, not both (one would silently win)")
        return cl.load_cluster(args.cluster)
    gpus = args.gpus if args.gpus is not None else default_devices
    if gpus is None:
        raise UserError("give the cluster: --gpus N --inter-gbps Y [--servers S --intra-gbps X], or --cluster FILE")
    if gpus < 1:
        raise UserError(f"--gpus must be >= 1, got {gpus}")
    limits.devices(gpus, "--gpus")
    if args.inter_gbps is None:
        raise UserError("--inter-gbps is required with --gpus")
    for flag, value in (("--inter-gbps", args.inter_gbps), ("--intra-gbps", args.intra_gbps)):
        if value is not None:
            limits.number(value, flag, "bandwidth", positive=True, maximum=1e9)
    limits.number(args.memory_gib, "--memory-gib", "memory per GPU", positive=True, maximum=2.0**30)
    memory = args.memory_gib * 2**30
    if args.servers is not None and args.servers < 1:
        raise UserError(f"--servers must be >= 1, got {args.servers}")
    if args.servers:
        if gpus % args.servers:
            raise UserError(f"--gpus {gpus} is not divisible by --servers {args.servers}")
        intra = args.intra_gbps if args.intra_gbps is not None else args.inter_gbps
        return cl.two_level(args.servers, gpus // args.servers, intra, args.inter_gbps, memory)
    return cl.flat(gpus, args.inter_gbps, memory)


def _input_shape(text: str | None, microbatch_size: int) -> list[int] | None:
    """``--input-shape 3,224,224``: positive integers, and one micro-batch of them within 1 GiB."""
    if text is None:
        return None
    try:
        shape = [int(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"--input-shape {text!r} must be comma-separated positive integers, e.g. 3,224,224") from None
    if not shape or any(d < 1 for d in shape):
        raise UserError(f"--input-shape {text!r} must be comma-separated positive integers, e.g. 3,224,224")
    size = 4.0 * microbatch_size
    for d in shape:
        size *= d
    if size > MAX_SAMPLE_BYTES:
        raise UserError(f"--input-shape {text} x --microbatch-size {microbatch_size} is a {size / 2**30:.3g} GiB float32 input; "
                        f"the limit is {MAX_SAMPLE_BYTES / 2**30:.0f} GiB")
    return shape


def cmd_profile(args: argparse.Namespace) -> int:
    from orchestrator.profiling import profiler
    from orchestrator.core.files import check_output

    check_output(args.out, "profile")
    limits.count(args.microbatch_size, "--microbatch-size", "value", maximum=MAX_PROFILE_MICROBATCH)
    limits.count(args.repeats, "--repeats", "value", maximum=1000)
    if args.vocab is not None:
        limits.count(args.vocab, "--vocab", "value", maximum=2**31 - 1)
    if args.hf_kwargs and not args.hf_config:
        raise UserError("--hf-kwargs goes with --hf-config")
    if args.hf_config:
        from orchestrator.profiling import hf

        if args.vocab is not None or args.input_dtype != "float32":
            raise UserError("--hf-config profiles token ids below the config's vocab_size: drop --vocab/--input-dtype")
        shape = _input_shape(args.input_shape, args.microbatch_size)
        if shape is not None and len(shape) != 1:
            raise UserError(f"--input-shape with --hf-config is the sequence length (one number), got {args.input_shape}")
        prof = profiler.profile_hf(hf.config_from(args.hf_config, args.hf_kwargs), args.microbatch_size,
                                   shape[0] if shape else None, repeats=args.repeats)
    elif args.factory:
        shape = _input_shape(args.input_shape, args.microbatch_size)
        prof = profiler.profile_factory(args.factory, microbatch_size=args.microbatch_size, input_shape=shape,
                                        dtype=args.input_dtype, vocab=args.vocab, repeats=args.repeats)
    else:
        if args.input_shape or args.vocab is not None or args.input_dtype != "float32":
            raise UserError("--input-shape, --input-dtype and --vocab go with --factory or --hf-config")
        prof = profiler.profile_example(args.model, microbatch_size=args.microbatch_size, repeats=args.repeats)
    prof.save(args.out)
    print(f"wrote {args.out}: {prof.num_blocks} blocks, {prof.total_compute_s * 1e3:.2f} ms fwd+bwd per micro-batch of {prof.microbatch_size}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from orchestrator.core.plan import ScheduleKind
    from orchestrator.planners.base import PlannerOptions, run_planner
    from orchestrator.core.files import check_outputs, json_output, write_outputs
    from orchestrator.core.profile_loader import load_source
    from orchestrator.planners.base import get_planner

    check_outputs([(args.out, "plan"), (args.trace, "trace"), (args.png, "figure")])
    limits.count(args.microbatches, "--microbatches", "value", maximum=limits.MAX_MICROBATCHES)
    if args.max_stages is not None and args.max_stages < 1:
        raise UserError(f"--max-stages must be >= 1, got {args.max_stages}")
    spec = get_planner(args.algorithm)
    profile, graph = load_source(args.profile)
    cluster = build_cluster(args)
    # the planners simulate plans of up to min(devices, blocks) stages (x chunks when interleaving)
    stages = min(cluster.size, profile.num_blocks) if not args.interleave else profile.num_blocks
    limits.sim_events(stages, args.microbatches, "plan")
    options = PlannerOptions(
        num_microbatches=args.microbatches,
        schedule=ScheduleKind.parse(args.schedule) if args.schedule else None,
        straight=args.straight,
        max_stages=args.max_stages,
        check_memory=not args.ignore_memory,
        interleave=args.interleave,
    )
    chain: tuple[str, ...] | None = None
    chain_s = 0.0
    if graph is not None and spec.name == "pipedream":  # PipeDream cuts at down-sets: the order is part of its plan
        from orchestrator.planners.pipedream_graph import pipedream_chain

        started = time.perf_counter()
        profile, chain = pipedream_chain(graph, profile, cluster, options)
        chain_s = time.perf_counter() - started
    result = run_planner(args.algorithm, profile, cluster, options)
    if chain_s:
        result = dataclasses.replace(result, planning_time_s=result.planning_time_s + chain_s)
    payload = result.to_json()
    if chain is not None:
        payload["profile_chain"] = list(chain)
    outputs = [json_output(args.out, dict(payload, cluster=cluster.to_dict()), "plan")] if args.out else []
    write_outputs(outputs + _timelines(result.sim, args.trace, args.png, f"{result.algorithm}: {result.plan.describe()}"))
    if args.json:
        print(json.dumps(payload))
    else:
        ratio = f"{result.iteration_time_s / result.lower_bound_s:.3f}" if result.lower_bound_s > 0 else "n/a"
        print(f"algorithm      {result.plan.algorithm or result.algorithm}")
        print(f"plan           {result.plan.describe()}")
        print(f"iteration      {result.iteration_time_s * 1e3:.3f} ms (lower bound {result.lower_bound_s * 1e3:.3f} ms, ratio {ratio})")
        bubble = payload["bubble_fraction"]
        print(f"bubble         {bubble:.3f} of the iteration, mean over devices ({bubble * result.iteration_time_s * 1e3:.3f} ms)")
        if result.objective_s is not None:
            print(f"objective      {result.objective_s * 1e3:.3f} ms")
        print(f"planning time  {result.planning_time_s * 1e3:.2f} ms")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from orchestrator.core import cluster as cl
    from orchestrator.core.files import check_outputs, read_json, write_outputs
    from orchestrator.core.plan import Plan
    from orchestrator.core.profile_loader import load_profile
    from orchestrator.costmodel.simulator import simulate

    check_outputs([(args.trace, "trace"), (args.png, "figure")],
                  inputs=[(args.profile, "profile"), (args.plan, "plan"), (args.cluster, "cluster")])
    data = read_json(args.plan, "plan")
    chain = data.get("profile_chain") if isinstance(data, dict) else None
    if chain is not None and not (isinstance(chain, list) and all(isinstance(v, str) for v in chain)):
        raise UserError(f"plan {args.plan}: profile_chain must be a list of node ids")
    profile = load_profile(args.profile, chain=chain)
    plan = Plan.from_dict(data, origin=f"plan {args.plan}")
    if args.cluster or args.gpus:
        cluster = build_cluster(args)
    elif isinstance(data, dict) and "cluster" in data:
        cluster = cl.from_dict(data["cluster"], origin=f"{args.plan} (cluster)")
    else:
        raise UserError(f"{args.plan} has no cluster; give --gpus/--inter-gbps or --cluster")
    sim = simulate(plan, profile, cluster)
    write_outputs(_timelines(sim, args.trace, args.png, plan.describe()))
    summary = dict(sim.summary(), critical_path=sim.critical_path_labels()[:50])
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"iteration {sim.iteration_s * 1e3:.3f} ms, mean bubble {summary['mean_bubble_fraction']:.3f}")
    return 0


def _timelines(sim: Any, trace: str | None, png: str | None, title: str) -> list[Any]:
    """The ``--trace`` and ``--png`` outputs, rendered only when written (see :func:`write_outputs`)."""
    from orchestrator.core.files import Output, figure_output, json_output
    from orchestrator.core.timeline import chrome_trace, gantt_figure, spans_from_events

    spans = spans_from_events(sim.events)
    outputs: list[Output] = []
    if trace:
        outputs.append(json_output(trace, chrome_trace(spans, "simulated"), "trace"))
    if png:
        def render(handle: Any) -> None:
            import matplotlib.pyplot as plt

            fig = gantt_figure(spans, title)
            try:
                figure_output(png, fig).render(handle)
            finally:
                plt.close(fig)

        outputs.append(Output(Path(png), "figure", render))
    return outputs


def cmd_demo(args: argparse.Namespace) -> int:
    from orchestrator.cli.demo import run_demo
    from orchestrator.core.files import check_output_dir

    return run_demo(check_output_dir(args.out, "demo output folder"))


def cmd_checkpoint_verify(args: argparse.Namespace) -> int:
    from actors import checkpoint as ckpt

    where, manifest, skipped = ckpt.check(args.path)
    size = sum(int(e["bytes"]) for e in manifest["files"])
    note = f"; skipped {len(skipped)} damaged newer: {skipped[0].reason}" if skipped else ""
    print(f"ok: {where} (step {manifest['step']}, {manifest['num_blocks']} blocks, {size} bytes verified{note})")
    return 0


def cmd_checkpoint_copy(args: argparse.Namespace) -> int:
    from actors.checkpoint_transfer import copy_checkpoint

    report = copy_checkpoint(args.src, args.dst)
    print(f"copied: {report.source} -> {report.dest} (step {report.step}, {report.bytes} bytes verified)")
    return 0


def cmd_checkpoint_export(args: argparse.Namespace) -> int:
    """A stored checkpoint's weights under the user's names: ``save_pretrained`` for a Hugging Face
    model (``--hf-config``, or a ``--factory`` of HF blocks), ``model.safetensors`` otherwise
    (without a model: ``<block>.<name>`` keys, as ``nn.Sequential(*blocks)`` names them)."""
    from orchestrator.profiling import export

    export.check_empty_dir(args.to)
    if args.hf_kwargs and not args.hf_config:
        raise UserError("--hf-kwargs goes with --hf-config")
    blocks: list[Any] | None = None
    if args.hf_config:
        from orchestrator.profiling import hf

        blocks = hf.causal_lm_blocks(hf.config_from(args.hf_config, args.hf_kwargs))
    elif args.factory:
        from actors import user_code
        from orchestrator.profiling.models import load_factory

        blocks = user_code.blocks(load_factory(args.factory))
    where, step, weights = export.checkpoint_weights(args.path, None if blocks is None else len(blocks))
    out, count = export.write_weights(blocks, weights, args.to)
    print(f"exported: {where} (step {step}) -> {out} ({count} tensors)")
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    """The connected Ray cluster (or the local instance) as the planners see it, measured."""
    import ray

    from orchestrator.train.discovery import connect, discover_cluster

    if args.slots is not None:
        limits.count(args.slots, "--slots", "value", maximum=MAX_LOCAL_SLOTS)
    started = connect(args.address)
    try:
        found = discover_cluster(kind=args.kind, local_slots=args.slots)
        found.group.shutdown()
        payload = found.to_json()
        if args.json:
            print(json.dumps(payload))
        else:
            for d in payload["devices"]:
                print(f"device {d['device']}: node {d['node_id'][:12]} {d['kind']} {d['accelerator']} speed {d['speed']:.3g} "
                      f"({d['speed_source']}) memory {d['memory_bytes'] / 2**30:.1f} GiB")
            print(f"median message latency {payload['message_latency_s'] * 1e6:.0f} us")
        return 0
    finally:
        if started:
            ray.shutdown()


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; given the ``argv`` about to be parsed, without the cloud commands
    when ``argv`` names one of ours: ``cloud.cli`` imports pandas (≈ 0.6 s of every ``plan``)."""
    from orchestrator.planners.base import available

    parser = _Parser(prog="orchestrator", description="Pipeline-parallel training planner and orchestrator on Ray")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("profile", help="measure a model's per-block times and sizes on this machine")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default="tiny_transformer", help="built-in example model (default tiny_transformer)")
    src.add_argument("--factory", help="a user's model as module:factory returning a list of blocks (imported as python -c would)")
    src.add_argument("--hf-config", help="a Hugging Face causal LM: a model_type (llama, mistral, ...) or a folder holding config.json")
    p.add_argument("--hf-kwargs", help="with --hf-config: config fields as a JSON object, e.g. '{\"num_hidden_layers\": 4}'")
    p.add_argument("--input-shape", help="with --factory: comma-separated shape of ONE sample (no batch dimension), e.g. 3,224,224; "
                                         "with --hf-config: the sequence length")
    p.add_argument("--input-dtype", default="float32", help="with --factory: float32 (default), bfloat16, ..., or long for token ids")
    p.add_argument("--vocab", type=int, help="with --input-dtype long: token ids are drawn from 0 .. VOCAB-1")
    p.add_argument("--microbatch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", required=True, help="profile JSON to write")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("plan", help="partition a profiled model over a cluster")
    p.add_argument("--profile", required=True, help="profile JSON or PipeDream/DAPPLE graph.txt")
    _add_cluster_args(p, required=True)
    p.add_argument("--algorithm", default="pipedream", help=f"one of: {', '.join(available())}")
    p.add_argument("--microbatches", type=int, required=True)
    p.add_argument("--schedule", default=None, help="gpipe, 1f1b, interleaved or zb-h1 (default: the planner's choice; auto searches all)")
    p.add_argument("--straight", action="store_true", help="no stage replication")
    p.add_argument("--interleave", action="store_true", help="also choose virtual chunks per device (PTD-P) by simulation")
    p.add_argument("--max-stages", type=int)
    p.add_argument("--ignore-memory", action="store_true", help="do not reject plans that exceed device memory")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", help="write the plan (with its cluster) as JSON")
    p.add_argument("--trace", help="write the simulated timeline as Chrome trace JSON")
    p.add_argument("--png", help="write the simulated timeline as a PNG Gantt chart")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("simulate", help="time a plan with the discrete-event simulator")
    p.add_argument("--profile", required=True)
    p.add_argument("--plan", required=True, help="plan JSON written by `orchestrator plan --out`")
    _add_cluster_args(p, required=False)
    p.add_argument("--trace")
    p.add_argument("--png")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("demo", help="the end-to-end demo on this machine")
    p.add_argument("--out", default="out/demo", help="folder for timelines and plots")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("cluster", help="the Ray cluster's devices, measured speeds and links (starts one probe actor per device)")
    p.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")
    p.add_argument("--kind", choices=("gpu", "cpu"), default=None, help="device kind (default: GPUs if the cluster has any)")
    p.add_argument("--slots", type=int, default=None,
                   help=f"CPU slots on a single-node cluster, 1 to {MAX_LOCAL_SLOTS} (default: one per CPU)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=cmd_cluster)

    p = sub.add_parser("checkpoint", help="check or copy checkpoints (local paths, s3://, gs://, az://)")
    ck = p.add_subparsers(dest="checkpoint_command", required=True, parser_class=_Parser)
    q = ck.add_parser("verify", help="exit 0 if intact: one checkpoint, or the newest valid one under a location")
    q.add_argument("path", help="a step_N checkpoint, or the folder/URI holding several")
    q.set_defaults(func=cmd_checkpoint_verify)
    q = ck.add_parser("copy", help="copy one checkpoint between storage locations, verified, commit marker last")
    q.add_argument("src")
    q.add_argument("dst")
    q.set_defaults(func=cmd_checkpoint_copy)
    q = ck.add_parser("export", help="a checkpoint's weights under the model's own names (save_pretrained for HF models)")
    q.add_argument("path", help="a step_N checkpoint, or the folder/URI holding several (the newest valid one)")
    q.add_argument("--to", required=True, help="a new or empty folder to write")
    model = q.add_mutually_exclusive_group()
    model.add_argument("--factory", help="the model as module:factory (names from the model; default: <block>.<name>)")
    model.add_argument("--hf-config", help="a Hugging Face causal LM: a model_type or a folder holding config.json")
    q.add_argument("--hf-kwargs", help="with --hf-config: config fields as a JSON object")
    q.set_defaults(func=cmd_checkpoint_export)

    from orchestrator.cli.runs import add_parsers as add_runs
    from orchestrator.supervise.cli import add_parsers as add_supervise

    add_supervise(sub)
    add_runs(sub)

    command = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    if command in sub.choices:  # one of ours: the cloud commands cannot be the one parsed
        return parser
    try:
        from cloud.cli import add_parsers
    except ImportError:
        pass
    else:
        add_parsers(sub)
    return parser


class OutputError(UserError):
    """Standard output cannot be written (``> /dev/full``, a full disk): the user's redirection, not a bug."""


class _GuardedStdout:
    """Standard output whose write errors are an :class:`OutputError` (one line, exit 2) rather than an
    ``OSError`` traceback from whichever ``print`` hit the full disk. A reader that left (``| head``)
    stays a ``BrokenPipeError``: that is exit 0."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        if self._inner is None:  # started with standard output closed (``>&-``): Python leaves sys.stdout None
            raise OutputError("cannot write to standard output: it is closed")
        try:
            return int(self._inner.write(text))
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(f"cannot write to standard output: {exc.strerror or exc}") from None

    def flush(self) -> None:
        if self._inner is None:
            return  # nothing was written (a write would have raised)
        try:
            self._inner.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(f"cannot write to standard output: {exc.strerror or exc}") from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def main(argv: Sequence[str] | None = None) -> int:
    from actors.storage_env import EXIT_STORAGE, StorageFailed
    from orchestrator.core.files import one_command

    saved = sys.stdout
    sys.stdout = _GuardedStdout(saved)  # type: ignore[assignment]  # file-like: write, flush, the rest delegated
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = build_parser(argv).parse_args(argv)
        with one_command():  # an input read by this command is never one of its outputs
            code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at exit: ``> /dev/full`` must be one line too
        return code
    except OutputError as exc:
        _silence_stdout()  # what is still buffered must not fail again at exit
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except StorageFailed as exc:  # orchestrator run: its storage gone past the bound (the cluster is still on record)
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_STORAGE
    except (UserError, CloudError) as exc:  # cloud/ has its own error type (it imports nothing of ours)
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # ``orchestrator plan ... | head -1``: the reader left; everything was computed and written.
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout = saved


def run_main(fn: Callable[[], object]) -> None:
    """Run a driver script's ``main`` with the command line's error contract: a user mistake is
    one line on stderr and exit 2, never a traceback."""
    from actors.storage_env import EXIT_STORAGE, StorageFailed
    from orchestrator.elastic.lease import EXIT_LOCKED, RunLocked
    from orchestrator.elastic.signals import EXIT_MIGRATE, JobFailed, JobStopped, MigrationRequested

    try:
        fn()
    except (UserError, CloudError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunLocked as exc:  # another live job trains this run: not the user's mistake, not a failure of the run
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        raise SystemExit(EXIT_LOCKED) from None
    except StorageFailed as exc:  # the store did not take a checkpoint: infrastructure (a supervisor relaunches)
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        raise SystemExit(EXIT_STORAGE) from None
    except JobFailed as exc:  # the failure budget is spent; the newest committed checkpoint stays loadable
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        raise SystemExit(1) from None
    except MigrationRequested as exc:  # committed; the supervisor resumes the run elsewhere
        print(f"migrating: {_one_line(exc)}", file=sys.stderr)
        raise SystemExit(EXIT_MIGRATE) from None
    except JobStopped as exc:  # its line is on stderr already (the job printed it)
        raise SystemExit(128 + exc.signum) from None


def _one_line(exc: BaseException) -> str:
    """The message on one line: a user's file name or a quoted exception may hold newlines."""
    return " ".join(str(exc).split())


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not raise BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


if __name__ == "__main__":
    raise SystemExit(main())
