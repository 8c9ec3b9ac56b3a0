"""Fine-tuning memory and time: a masked diffusion LM's SFT against AR SFT of the same size and sequence length.
Part of ``make bench`` (-> ``evaluation/SFT_MEMORY.md``).

Three runs of the same shape (hidden ``--hidden``, ``--layers`` layers, LLaDA's vocabulary of 126,464 unless
``--vocab``, ``--batch`` sequences of ``--length`` tokens, half prompt and half response, AdamW):

- ``AR``: a transformers Llama, SFT as transformers computes it (labels on the response, its causal LM loss);
- ``MDM, every position's logits``: hf_mdm's LLaDA class, the loss read off the logits of every position, as
  LLaDA's published SFT code computes it (``logits = model(noisy_batch).logits``, then the masked ones);
- ``MDM, hf_mdm``: the same model with hf_mdm's recipe (`hf_mdm.finetune.sft_step_loss`): the LM head only at the
  masked response positions.

each with full fine-tuning and LoRA (rank 16 on every linear layer), without and with gradient checkpointing. Every
run is its own process: peak memory is the process's peak resident set (``ru_maxrss``) on the CPU, or
``torch.cuda.max_memory_allocated`` on CUDA, minus the same measure after the model was built (what training adds
above the weights); seconds per step is the median of ``--steps`` steps after one warm-up step.

    python evaluation/bench_sft_memory.py [--hidden 256] [--layers 4] [--length 256] [--batch 4] [--steps 3]
        [--vocab 126464] [--device cpu] [--output FILE.md] [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import print_and_write  # noqa: E402

KINDS = {
    "ar": "AR (Llama, transformers' loss)",
    "mdm_all_logits": "MDM, every position's logits",
    "mdm": "MDM, hf_mdm (LM head at the masked positions)",
}
QUICK = dict(hidden=64, layers=2, length=64, batch=2, steps=1, vocab=4096)


def build(kind: str, args: argparse.Namespace) -> torch.nn.Module:
    """The network of ``kind`` at the benchmark's shape, float32, on ``args.device``."""
    torch.manual_seed(0)
    if kind == "ar":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
            num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=8,
            max_position_embeddings=args.length, tie_word_embeddings=False,
        )  # fmt: skip
        return LlamaForCausalLM(config).to(args.device)
    from hf_mdm.models import LLaDAConfig, LLaDAModelLM

    config = LLaDAConfig(
        d_model=args.hidden, n_heads=8, n_kv_heads=8, n_layers=args.layers, mlp_hidden_size=4 * args.hidden,
        vocab_size=args.vocab, embedding_size=args.vocab, max_sequence_length=args.length,
        mask_token_id=args.vocab - 1, eos_token_id=args.vocab - 2, pad_token_id=args.vocab - 2,
    )  # fmt: skip
    return LLaDAModelLM(config).to(args.device)


def batch_of(kind: str, args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """One batch: random tokens, the first half of each row the prompt."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab - 2, (args.batch, args.length), generator=generator)
    prompt = args.length // 2
    if kind == "ar":
        labels = ids.clone()
        labels[:, :prompt] = -100
        return {"input_ids": ids.to(args.device), "labels": labels.to(args.device)}
    from hf_mdm.finetune import SFTCollator

    rows = [{"input_ids": row, "prompt_length": prompt} for row in ids.tolist()]
    batch = SFTCollator(args.vocab - 1, args.vocab - 2, seed=0)(rows)
    return {name: value.to(args.device) for name, value in batch.items()}


def loss_of(kind: str, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if kind == "ar":
        return model(**batch).loss
    if kind == "mdm":
        from hf_mdm.finetune import sft_step_loss

        return sft_step_loss(model, batch)
    return _all_logits_loss(model(input_ids=batch["input_ids"]).logits, batch)


def _all_logits_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """LLaDA's SFT loss from every position's logits (B, L, V)."""
    scored = batch["labels"] != -100
    ce = torch.nn.functional.cross_entropy(logits[scored].float(), batch["labels"][scored], reduction="none")
    weights = 1.0 / (batch["p_mask"][scored] * batch["answer_lengths"][scored.nonzero()[:, 0]])
    return (ce * weights).sum() / logits.shape[0]


def peak_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(kind: str, lora: bool, checkpointing: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``args.steps`` steps (after a warm-up step) in this process; its memory and time."""
    torch.set_num_threads(args.threads)
    model = build(kind, args).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    if lora:
        from hf_mdm.finetune import apply_lora

        model = apply_lora(model, r=16, alpha=32, dropout=0.0)
    batch = batch_of(kind, args)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = peak_mb(args.device)
    seconds = []
    for step in range(args.steps + 1):
        start = time.perf_counter()
        loss = loss_of(kind, model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        if step:
            seconds.append(time.perf_counter() - start)
    return {"added_mb": peak_mb(args.device) - base, "s_per_step": statistics.median(seconds), "loss": float(loss)}


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (kind, LoRA, checkpointing) in its own process."""
    rows = []
    for lora in (False, True):
        for checkpointing in (False, True):
            for kind in KINDS:
                flags = ["--one", kind, "--lora", str(int(lora)), "--checkpointing", str(int(checkpointing))]
                command = [sys.executable, __file__, *flags, *_shape_flags(args)]
                out = subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
                rows.append(dict(kind=kind, lora=lora, checkpointing=checkpointing, **json.loads(out)))
    return rows


def _shape_flags(args: argparse.Namespace) -> list[str]:
    names = ("hidden", "layers", "length", "batch", "steps", "vocab", "device", "threads")
    return [item for name in names for item in (f"--{name}", str(getattr(args, name)))]


def markdown(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    where = "CPU (peak resident set)" if args.device == "cpu" else f"{args.device} (max allocated)"
    lines = [
        f"# SFT memory and time: masked diffusion against AR ({where}, {args.threads} thread(s))",
        "",
        f"hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}, batch {args.batch} x {args.length} tokens "
        f"(half prompt, half response), AdamW, float32; medians of {args.steps} steps after a warm-up step. Memory: "
        "what training adds above the built model.",
        "",
        "| run | LoRA | checkpointing | memory added (MiB) | vs AR | s / step | vs AR |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ar = next(
            r
            for r in rows
            if r["kind"] == "ar" and (r["lora"], r["checkpointing"]) == (row["lora"], row["checkpointing"])
        )
        lines.append(
            f"| {KINDS[row['kind']]} | {'yes' if row['lora'] else 'no'} | {'yes' if row['checkpointing'] else 'no'} | "
            f"{row['added_mb']:.0f} | {_ratio(row['added_mb'], ar['added_mb'])} | {row['s_per_step']:.3f} | "
            f"{row['s_per_step'] / ar['s_per_step']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference > 0 else "n/a"


def parse(argv: Any = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in dict(hidden=256, layers=4, length=256, batch=4, steps=3, vocab=126464, threads=1).items():
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", default=None, help="also write the table here (Markdown, atomically)")
    parser.add_argument("--quick", action="store_true", help="a tiny shape, one step: a smoke run")
    parser.add_argument("--one", choices=list(KINDS), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--lora", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    return args


def main(argv: Any = None) -> str:
    args = parse(argv)
    if args.one is not None:
        print(json.dumps(run_one(args.one, bool(args.lora), bool(args.checkpointing), args)))
        return ""
    return print_and_write(markdown(args, measure(args)), args.output)


if __name__ == "__main__":
    main()
