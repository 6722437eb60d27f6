"""Train the stock Hugging Face ``GPT2LMHeadModel`` on 4 pipeline stages (Ray actors).

The model is a small GPT-2 configuration with the class's defaults: input and output embeddings
tied (the first and last stage each hold a copy and sum its gradient) and dropout as configured
(masks drawn from a seed per step, micro-batch and block). Nothing is downloaded: weights are
initialized from the config, each stage materializing only its own blocks.

    .venv/bin/python examples/hf_gpt2.py --steps 3 --verify

prints ``params=<N> reference_params=<M>`` (N: over all stages, the tied weight once; M:
``num_parameters()`` of the stock model) and, with ``--verify``, ``max_abs_diff=<float>``: the
largest weight difference after training against single-process training of the stock model
(its own forward, one shared embedding parameter) on the same data and micro-batches.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import torch

from actors.reference import ReferenceTrainer
from actors.tied import counted_once
from orchestrator.profiling import hf
from orchestrator.core.errors import UserError
from orchestrator.core.plan import straight_plan
from orchestrator.train.trainer import PipelineTrainer


def stage_cuts(blocks: int, stages: int) -> list[int]:
    """Contiguous, as even as possible: ``stages + 1`` block boundaries."""
    if not 1 <= stages <= blocks:
        raise UserError(f"--stages must be between 1 and the model's {blocks} blocks")
    return [round(i * blocks / stages) for i in range(stages + 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--verify", action="store_true", help="compare with single-process training of the stock model")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--embd", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1, help="GPT-2's default for all three dropouts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        from transformers import GPT2Config

        if args.steps < 1:
            raise UserError("--steps must be at least 1")
        config = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads, vocab_size=args.vocab,
                            n_positions=args.seq, resid_pdrop=args.dropout, embd_pdrop=args.dropout,
                            attn_pdrop=args.dropout, bos_token_id=0, eos_token_id=0)
        factory = partial(hf.causal_lm_blocks, config)
        data = partial(hf.token_batch, args.vocab, args.seq, args.batch, seed=args.seed)
        optimizer = partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.01)
        blocks = factory()  # on the meta device: structure only
        print(f"params={counted_once(blocks)} reference_params={hf.stock_model(config).num_parameters()}", flush=True)
        plan = straight_plan(stage_cuts(len(blocks), args.stages), args.microbatches)
        with PipelineTrainer(factory, hf.lm_loss, optimizer, data, args.microbatches, plan=plan, seed=args.seed) as trainer:
            result = trainer.fit(args.steps)
            got = trainer.state_dicts()
        print(f"losses={' '.join(f'{v:.6f}' for v in result.losses)}", flush=True)
        if args.verify:
            reference = ReferenceTrainer.for_plan(plan, partial(hf.stock_blocks, config), hf.lm_loss, optimizer, data,
                                                  seed=args.seed)
            reference.train(args.steps)
            want = dict(reference.blocks[0].model.named_parameters(remove_duplicate=False))
            paths = hf.param_paths(blocks)
            diff = max(float((got[b][name] - want[path].detach()).abs().max()) for (b, name), path in paths.items())
            print(f"max_abs_diff={diff:.3e}", flush=True)
            if diff > 1e-4:
                return 1
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
