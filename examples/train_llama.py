"""Train a small Llama on this repository's own text, byte by byte, on pipeline stages; then generate with it.

The first run writes the token files into ``--data-dir``: the bytes of README.md and docs/*.md as
uint16 token ids (a vocabulary of 256), the first 90% for training, the rest for evaluation. The
model is a ``LlamaConfig`` of ``--layers`` x ``--hidden`` cut into one block per decoder layer,
trained with AdamW (weight decay on matrices only), a linear warmup then cosine decay over
``--steps``, clipping at a global gradient norm of 1.0 and bf16 autocast; the validation loss is
measured every ``--eval-every`` steps. The run lives in its storage (``--out``/checkpoints unless
``--storage``): the same command with a larger ``--steps`` resumes it. At the end the weights are
loaded into a stock ``LlamaForCausalLM`` (``load_state_dict(strict=True)``), which generates a few bytes.

    .venv/bin/python examples/train_llama.py --devices 2 --steps 300 --out out/llama --tensorboard out/llama/tb
"""

import argparse
import math
from functools import partial
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from orchestrator import (ElasticJob, TokenFile, TrainConfig, TrainingOptions, add_job_arguments, autocast_blocks,
                          decay_groups, job_configs)
from orchestrator.cli.commands import run_main
from orchestrator.profiling import hf

ROOT = Path(__file__).resolve().parents[1]


def token_files(data_dir: Path) -> tuple[Path, Path]:
    """train.bin and val.bin: this repository's Markdown as bytes (token ids 0..255), written on first use."""
    train, val = data_dir / "train.bin", data_dir / "val.bin"
    if not (train.is_file() and val.is_file()):
        text = b"\n\n".join(p.read_bytes() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
        tokens = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
        cut = int(len(tokens) * 0.9)
        data_dir.mkdir(parents=True, exist_ok=True)
        tokens[cut:].tofile(val)
        tokens[:cut].tofile(train)
        print(f"wrote {train} ({cut} tokens) and {val} ({len(tokens) - cut} tokens)", flush=True)
    return train, val


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """The learning rate's factor at ``step``: linear warmup to 1, then cosine decay to 0.1 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


def schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, partial(warmup_cosine, warmup=warmup, total=total))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4, help="decoder layers")
    p.add_argument("--hidden", type=int, default=128, help="hidden size")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--seq", type=int, default=128, help="tokens per sample")
    p.add_argument("--rows", type=int, default=16, help="samples per step")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=20, help="warmup steps")
    p.add_argument("--eval-every", type=int, default=50, help="validation loss every N steps")
    p.add_argument("--data-dir", default="out/llama-data", help="the token files (written on first use)")
    p.add_argument("--generate", type=int, default=48, help="bytes to generate at the end")
    add_job_arguments(p, devices=2, steps=300, checkpoint_every=50)  # --steps --devices --out --storage --tensorboard ...
    args = p.parse_args()

    config = LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
                         max_position_embeddings=args.seq, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    train_file, val_file = token_files(Path(args.data_dir))
    train = TrainConfig(
        model_factory=autocast_blocks(partial(hf.causal_lm_blocks, config), torch.bfloat16),
        loss_fn=hf.lm_loss,
        optimizer_factory=decay_groups(partial(torch.optim.AdamW, lr=args.lr, betas=(0.9, 0.95)), 0.1),
        data_fn=TokenFile(train_file, args.seq, args.rows),
        num_microbatches=args.microbatches,
        training=TrainingOptions(max_grad_norm=1.0, lr_scheduler=partial(schedule, warmup=args.warmup, total=args.steps)),
        eval_data_fn=TokenFile(val_file, args.seq, args.rows, seed=1), eval_every=args.eval_every, eval_steps=2)
    with ElasticJob(train, *job_configs(args)) as job:
        result = job.fit(args.steps)
        weights = job.state_dict()
        if args.verify:
            print(f"max_abs_diff={job.max_abs_diff():.3e}")
    evals = " ".join(f"{e['step']}:{e['loss']:.3f}" for e in result.events if e.get("event") == "eval")
    print(f"step {result.step}; final loss {result.final_loss:.4f}; validation loss (step:loss) {evals or '-'}")

    model = LlamaForCausalLM(config)  # the stock model, with the trained weights under its own names
    model.load_state_dict(weights, strict=True)
    prompt = torch.tensor([list(b"The pipeline ")])
    out = model.eval().generate(prompt, max_new_tokens=args.generate, do_sample=False)
    print("generated:", repr(bytes(out[0].tolist()).decode("utf-8", errors="replace")))


if __name__ == "__main__":
    run_main(main)
