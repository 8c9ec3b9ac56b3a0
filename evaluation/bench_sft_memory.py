"""Fine-tuning memory and time: a masked diffusion LM's SFT against AR SFT of the same size and sequence length.
Part of ``make bench`` (-> ``evaluation/SFT_MEMORY.md``).

Four runs of the same shape (hidden ``--hidden``, ``--layers`` layers, LLaDA's vocabulary of 126,464 unless
``--vocab``, ``--batch`` sequences of ``--length`` tokens, half prompt and half response, AdamW):

- ``AR``: a transformers Llama, SFT as transformers computes it (labels on the response, its causal LM loss: the
  logits of every position, of which only those predicting a response token are scored);
- ``AR, LM head at the scored positions``: the same Llama, its base model's hidden states, the LM head only at the
  positions whose next token is a response token, cross-entropy there (the same loss);
- ``MDM, every position's logits``: hf_mdm's LLaDA class, the loss read off the logits of every position, as
  LLaDA's published SFT code computes it (``logits = model(noisy_batch).logits``, then the masked ones);
- ``MDM, hf_mdm``: the same model with hf_mdm's recipe (`hf_mdm.finetune.sft_step_loss`): the LM head only at the
  masked response positions.

each with full fine-tuning and LoRA (rank 16 on every linear layer), without and with gradient checkpointing; every
run beside both AR runs. The diffusion runs' mask draw is the collator's first seed whose draw masks the expected
number of response positions, given its times too, and whose longest row (hf_mdm's LM head runs at batch x that
many positions, the shorter rows padded) is its expected length, each within ``TOLERANCE`` (`mask_draw`). Every
run is its own process: peak memory is the process's peak resident set (``ru_maxrss``) on the CPU, or
``torch.cuda.max_memory_allocated`` on CUDA, minus the same measure after the model was built (what training adds
above the weights); seconds per step is the median of ``--steps`` steps after one warm-up step.

    python evaluation/bench_sft_memory.py [--hidden 256] [--layers 4] [--length 256] [--batch 4] [--steps 3]
        [--vocab 126464] [--device cpu] [--output FILE.md] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
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
    "ar_scored": "AR (Llama, LM head at the scored positions)",
    "mdm_all_logits": "MDM, every position's logits",
    "mdm": "MDM, hf_mdm (LM head at the masked positions)",
}
AR_KINDS = ("ar", "ar_scored")
QUICK = dict(hidden=64, layers=2, length=64, batch=2, steps=1, vocab=4096)
TOLERANCE = 0.01  # of each expectation the mask draw meets, and at least one position
SEEDS = 1_000_000  # the mask draw's seeds tried


def build(kind: str, args: argparse.Namespace) -> torch.nn.Module:
    """The network of ``kind`` at the benchmark's shape, float32, on ``args.device``."""
    torch.manual_seed(0)
    if kind in AR_KINDS:
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
    """One batch: random tokens, the first half of each row the prompt; the diffusion runs' mask is `mask_draw`'s."""
    ids = _ids(args)
    if kind in AR_KINDS:
        labels = ids.clone()
        labels[:, : args.length // 2] = -100
        return {"input_ids": ids.to(args.device), "labels": labels.to(args.device)}
    draw = mask_draw(args)
    batch = _collate(args, draw["seed"])
    assert _within(int((batch["labels"] != -100).sum()), draw["expected"]), draw
    return {name: value.to(args.device) for name, value in batch.items()}


def _ids(args: argparse.Namespace) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, args.vocab - 2, (args.batch, args.length), generator=generator)


def _collate(args: argparse.Namespace, seed: int) -> dict[str, torch.Tensor]:
    from hf_mdm.finetune import SFTCollator

    rows = [{"input_ids": row, "prompt_length": args.length // 2} for row in _ids(args).tolist()]
    return SFTCollator(args.vocab - 1, args.vocab - 2, seed=seed)(rows)


def mask_draw(args: argparse.Namespace) -> dict[str, Any]:
    """The collator's first seed whose draw masks the expected number of response positions, E = batch x response x
    (1 + eps) / 2 (times t uniform on [eps, 1]), whose times expect that many too (the sum of t x response length),
    and whose longest row masks the expected longest of ``--batch`` rows: each within ``TOLERANCE`` of it."""
    from hf_mdm.finetune import SFTCollator

    eps, response = SFTCollator(0, 0).eps, args.length - args.length // 2
    expected, longest = args.batch * response * (1 + eps) / 2, _expected_longest(response, args.batch, eps)
    for seed in range(SEEDS):
        batch = _collate(args, seed)
        scored = batch["labels"] != -100
        masked, given = int(scored.sum()), float((batch["p_mask"][:, 0] * batch["answer_lengths"]).sum())
        longest_row = int(scored.sum(1).max())
        if _within(masked, expected) and _within(given, expected) and _within(longest_row, longest):
            return dict(
                seed=seed, masked=masked, positions=args.batch * response, expected=expected, given_times=given,
                longest=longest_row, expected_longest=longest,
            )  # fmt: skip
    raise RuntimeError(f"no mask draw of the first {SEEDS} seeds is within {TOLERANCE:.0%} of its expectation")


def _within(value: float, expected: float) -> bool:
    return abs(value - expected) <= max(TOLERANCE * expected, 1.0)


def _expected_longest(n: int, rows: int, eps: float) -> float:
    """E[max of ``rows`` counts], each Binomial(n, t) with t uniform on [eps, 1]: P(count = k) is
    P(Binomial(n + 1, eps) <= k) / ((n + 1)(1 - eps)), and E[max] the sum over k < n of 1 - P(count <= k)^rows."""
    binomial = [math.comb(n + 1, j) * eps**j * (1 - eps) ** (n + 1 - j) for j in range(n + 1)]
    count = [below / ((n + 1) * (1 - eps)) for below in itertools.accumulate(binomial)]
    return sum(1.0 - min(cdf, 1.0) ** rows for cdf in list(itertools.accumulate(count))[:n])


def loss_of(kind: str, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if kind == "ar":
        return model(**batch).loss
    if kind == "ar_scored":
        return _ar_scored_loss(model, batch)
    if kind == "mdm":
        from hf_mdm.finetune import sft_step_loss

        return sft_step_loss(model, batch)
    return _all_logits_loss(model(input_ids=batch["input_ids"]).logits, batch)


def _ar_scored_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """transformers' causal LM loss with the LM head only at the positions whose next token is scored. (Nothing is
    imported here: an import inside the measured steps would count its modules as training memory.)"""
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model  # under LoRA, PEFT's wrapper
    hidden = causal.model(input_ids=batch["input_ids"]).last_hidden_state
    targets = batch["labels"][:, 1:]
    scored = targets != -100
    logits = causal.lm_head(hidden[:, :-1][scored])
    return torch.nn.functional.cross_entropy(logits.float(), targets[scored])


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
    draw = mask_draw(args)
    lines = [
        f"# SFT memory and time: masked diffusion against AR ({where}, {args.threads} thread(s))",
        "",
        f"hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}, batch {args.batch} x {args.length} tokens "
        f"(half prompt, half response), AdamW, float32; medians of {args.steps} steps after a warm-up step. Memory: "
        "what training adds above the built model. Each run against both AR runs: transformers' loss (the logits of "
        "every position) and the LM head only at the scored positions (those predicting a response token).",
        "",
        f"Mask draw of the diffusion runs (collator seed {draw['seed']}): {draw['masked']} of {draw['positions']} "
        f"response positions masked, against {draw['expected']:.1f} expected and {draw['given_times']:.1f} given the "
        f"draw's times; longest row {draw['longest']} masked, against {draw['expected_longest']:.1f} expected (hf_mdm's "
        f"LM head runs at {args.batch} x {draw['longest']} positions, the shorter rows padded). Tolerance: "
        f"{TOLERANCE:.0%} of each expectation, at least one position.",
        "",
        "| run | LoRA | checkpointing | memory added (MiB) | vs AR | vs AR, scored head | s / step | vs AR "
        "| vs AR, scored head |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ar, scored = (
            next(
                r
                for r in rows
                if r["kind"] == kind and (r["lora"], r["checkpointing"]) == (row["lora"], row["checkpointing"])
            )
            for kind in AR_KINDS
        )
        lines.append(
            f"| {KINDS[row['kind']]} | {'yes' if row['lora'] else 'no'} | {'yes' if row['checkpointing'] else 'no'} | "
            f"{row['added_mb']:.0f} | {_ratio(row['added_mb'], ar['added_mb'])} | "
            f"{_ratio(row['added_mb'], scored['added_mb'])} | {row['s_per_step']:.3f} | "
            f"{_ratio(row['s_per_step'], ar['s_per_step'])} | {_ratio(row['s_per_step'], scored['s_per_step'])} |"
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
