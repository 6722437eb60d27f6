"""Train a tiny Hugging Face causal LM of any decoder-only family on pipeline stages, get it back.

The model is built from its family's config (``--family``: a ``model_type`` of ``transformers``:
gpt2, llama, mistral, qwen2, qwen3, gemma2, phi3, olmo2, ...), randomly initialized, nothing
downloaded; each of ``--stages`` Ray actors materializes only its own blocks. ``ElasticJob``
trains it and ``job.state_dict()`` returns the trained weights under the stock model's own names.

    .venv/bin/python examples/hf_causal_lm.py --family mistral --steps 4 --verify
    .venv/bin/python examples/hf_causal_lm.py --family olmo2 --steps 4 --verify   # the generic cut

prints ``params=<N> reference_params=<M>`` (N over all stages, a tied weight once; M:
``num_parameters()`` of the stock model), and with ``--verify``: ``max_abs_diff=<x>``, the
largest difference between the exported weights and the stock ``*ForCausalLM`` trained in one
process on the same micro-batches (gradient accumulation), and ``export_max_abs_diff=<y>``, the
largest difference between the logits on a fixed batch of a fresh stock model loaded with
``load_state_dict(strict=True)`` from the exported weights and those of that single-process
model. The final step is checkpointed (``checkpoint=<path>``): ``orchestrator checkpoint export
PATH --to DIR --hf-config FAMILY --hf-kwargs ...`` gives the same weights from it. The default sequence (16) is longer than the default sliding window (8), so families
with one (mistral, gemma2, phi3) attend through it. ``--export DIR`` writes the trained model
with ``save_pretrained`` (``from_pretrained(DIR)`` loads it back). A family whose cut is not the
stock model (``hf.check``: granite, whose forward scales outside its modules; bloom, whose layers
need ALiBi) exits 2 with one line before anything trains.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch

from actors.reference import ReferenceTrainer
from actors.tied import counted_once
from orchestrator import AdaptConfig, ElasticJob, RunConfig, ScalingConfig, SpotConfig, TrainConfig
from orchestrator.core.errors import UserError
from orchestrator.core.plan import straight_plan
from orchestrator.profiling import export, hf


def stage_cuts(blocks: int, stages: int) -> list[int]:
    """Contiguous, as even as possible: ``stages + 1`` block boundaries."""
    if not 1 <= stages <= blocks:
        raise UserError(f"--stages must be between 1 and the model's {blocks} blocks")
    return [round(i * blocks / stages) for i in range(stages + 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="llama", help="a transformers model_type (gpt2, llama, mistral, olmo2, ...)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--verify", action="store_true", help="compare with the stock model trained in one process")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--window", type=int, default=8, help="sliding window, for families that have one")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--dropout", type=float, help="default: the family's own")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--storage", help="checkpoint folder (default: a fresh temporary one)")
    parser.add_argument("--export", help="write the trained model here with save_pretrained (an empty or new folder)")
    args = parser.parse_args(argv)
    try:
        if args.steps < 1:
            raise UserError("--steps must be at least 1")
        config = hf.tiny_config(args.family, args.layers, args.hidden, args.heads, args.vocab, args.seq, args.window,
                                args.dropout)
        if args.export:
            export.check_empty_dir(args.export)
        factory = partial(hf.causal_lm_blocks, config)
        data = partial(hf.token_batch, args.vocab, args.seq, args.batch, seed=args.seed)
        optimizer = partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.01)
        blocks = factory()  # on the meta device: structure only
        print(f"params={counted_once(blocks)} reference_params={hf.stock_model(config).num_parameters()}", flush=True)
        plan = straight_plan(stage_cuts(len(blocks), args.stages), args.microbatches)
        storage = args.storage or str(Path(tempfile.mkdtemp(prefix="raypipe-hf-")) / "checkpoints")
        train = TrainConfig(model_factory=factory, loss_fn=hf.lm_loss, optimizer_factory=optimizer, data_fn=data,
                            num_microbatches=args.microbatches, seed=args.seed)
        with ElasticJob(train, ScalingConfig(devices=args.stages, plan=plan),
                        RunConfig(storage=storage, checkpoint_every=0), AdaptConfig(enabled=False),
                        SpotConfig(enabled=False)) as job:
            result = job.fit(args.steps)
            weights = job.state_dict()
            print(f"checkpoint={job.checkpoint_now('final')}", flush=True)  # for `orchestrator checkpoint export`
        print(f"losses={' '.join(f'{result.losses[s]:.6f}' for s in sorted(result.losses))}", flush=True)
        if args.export:
            export.save_pretrained(config, weights, args.export)
            print(f"exported {args.export}", flush=True)
        if args.verify:
            reference = ReferenceTrainer.for_plan(plan, partial(hf.stock_blocks, config), hf.lm_loss, optimizer, data,
                                                  seed=args.seed)
            reference.train(args.steps)
            stock = reference.blocks[0].model
            want = stock.state_dict()
            if list(weights) != list(want):
                raise UserError(f"exported keys differ from the stock model's: {sorted(set(weights) ^ set(want))[:3]}")
            diff = max(float((weights[k] - want[k]).abs().max()) for k in want)
            print(f"max_abs_diff={diff:.3e}", flush=True)
            fresh = export.fresh_model(config)
            fresh.load_state_dict(weights, strict=True)
            ids = hf.token_batch(args.vocab, args.seq, 4, step=10**6, seed=args.seed)[0]
            fresh.eval(), stock.eval()
            with torch.no_grad():
                logits = fresh(input_ids=ids, use_cache=False).logits - stock(input_ids=ids, use_cache=False).logits
            out = float(logits.abs().max())
            print(f"export_max_abs_diff={out:.3e}", flush=True)
            if diff > 1e-4 or out > 1e-5:
                return 1
    except UserError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
