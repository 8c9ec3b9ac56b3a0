"""The LM head only at the still-masked positions, at real vocabularies. Part of ``make bench``.

A step asks the model for logits at each row's still-masked positions (`hf_mdm.generation_sampler`,
``still_masked_positions``) instead of every column of its block. Where the vocabulary is large the LM head is a
large share of a forward, so this is where it shows. Model: a random ``MDMForMaskedDiffusion`` of hidden 256, 4
layers, with LLaDA's vocabulary (126,464) and Qwen2.5's (151,936); batch 2, a 32-token prompt and 64 new tokens in
blocks of 32, 64 steps (one token a step), deterministic transfer, confidence order, temperature 0 and 1, without a
cache and with the prefix cache. For each: the LM head's rows per forward (counted by a hook on it) against the
positions still masked before each step (summed over the batch), and generate's median seconds now against asking
at every block column (``Sampler.gather_still_masked = False``, the behaviour before), interleaved rounds after a
warm-up round; the tokens of the two at temperature 0 are checked equal.

    python evaluation/bench_lm_head.py [--repeats 3] [--threads 1] [--output FILE.md] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import Stopwatch, parse_table_arguments, print_and_write  # noqa: E402

from hf_mdm import MDMConfig, MDMForMaskedDiffusion  # noqa: E402
from hf_mdm.generation_sampler import Sampler  # noqa: E402

VOCABULARIES = {"LLaDA (126,464)": 126_464, "Qwen2.5 (151,936)": 151_936}
SETTINGS = {
    "no cache, T=0": dict(temperature=0.0),
    "prefix cache, T=0": dict(kv_cache="prefix", temperature=0.0),
    "no cache, T=1": dict(temperature=1.0, seed=0),
}


def network(args: argparse.Namespace, vocab: int) -> MDMForMaskedDiffusion:
    torch.manual_seed(0)
    config = MDMConfig(
        vocab_size=vocab, mask_token_id=vocab - 1, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=4, intermediate_size=4 * args.hidden, max_position_embeddings=512,
    )  # fmt: skip
    return MDMForMaskedDiffusion(config).eval()


def generate(model, prompt, args: argparse.Namespace, settings: dict, gather: bool) -> tuple[torch.Tensor, list]:
    """One call; the LM head's rows at each forward."""
    rows: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[:-1].numel()))
    Sampler.gather_still_masked = gather
    try:
        out = model.generate(
            prompt, max_new_tokens=args.new_tokens, steps=args.new_tokens, block_length=args.block, stop_at_eos=False,
            **settings,
        )  # fmt: skip
    finally:
        Sampler.gather_still_masked = True
        hook.remove()
    return out, rows


def still_masked(args: argparse.Namespace, batch: int) -> float:
    """Positions still masked before a step, averaged over the steps (one token a step: block, block - 1, ...)."""
    per_block = [batch * (args.block - i) for i in range(args.block)]
    return statistics.mean(per_block)


@torch.no_grad()
def measure(args: argparse.Namespace) -> list[dict]:
    table = []
    for vocab_name, vocab in VOCABULARIES.items():
        model = network(args, vocab if not args.quick else 4096)
        prompt = torch.randint(
            0, model.config.vocab_size - 2, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0)
        )
        for name, settings in SETTINGS.items():
            times: dict[bool, list[float]] = {True: [], False: []}
            outputs, rows = {}, {}
            for round_ in range(1 + args.repeats):
                for gather in (True, False):
                    with Stopwatch("cpu") as watch:
                        outputs[gather], rows[gather] = generate(model, prompt, args, settings, gather)
                    if round_:
                        times[gather].append(watch.seconds)
            equal = torch.equal(outputs[True], outputs[False]) if not settings.get("temperature") else None
            table.append(
                dict(
                    vocab=vocab_name, setting=name, rows_now=statistics.mean(rows[True]),
                    rows_before=statistics.mean(rows[False]), still=still_masked(args, args.batch),
                    now_s=statistics.median(times[True]), before_s=statistics.median(times[False]), equal=equal,
                )
            )  # fmt: skip
            print(f"  {vocab_name}, {name} done", file=sys.stderr, flush=True)
    return table


def markdown(args: argparse.Namespace, table: list[dict]) -> str:
    lines = [
        "# The LM head only at the still-masked positions",
        "",
        f"Written by `evaluation/bench_lm_head.py` (`make bench`): random MDM of hidden {args.hidden}, {args.layers} "
        f"layers; batch {args.batch}, prompt {args.prompt} + {args.new_tokens} new tokens in blocks of {args.block}, "
        f"{args.new_tokens} steps; CPU, {torch.get_num_threads()} thread(s), torch {torch.__version__}; median of "
        f"{args.repeats} interleaved rounds after a warm-up round. *before*: logits at every column of the block.",
        "",
        "| vocabulary | setting | LM-head rows / forward, before | now | still-masked positions / step | "
        "generate s, before | now | saved | tokens equal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in table:
        saved = 1 - r["now_s"] / r["before_s"]
        equal = "-" if r["equal"] is None else ("yes" if r["equal"] else "NO")
        lines.append(
            f"| {r['vocab']} | {r['setting']} | {r['rows_before']:.1f} | {r['rows_now']:.1f} | {r['still']:.1f} | "
            f"{r['before_s']:.2f} | {r['now_s']:.2f} | {100 * saved:.0f}% | {equal} |"
        )
    return "\n".join(lines) + "\n"


def parse(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sizes = dict(hidden=256, layers=4, batch=2, prompt=32, new_tokens=64, block=32)
    quick = dict(hidden=32, layers=1, batch=2, prompt=4, new_tokens=8, block=4)
    return parse_table_arguments(p, argv, 2, sizes, quick)


def main(argv: Any = None) -> str:
    args = parse(argv)
    text = markdown(args, measure(args))
    return print_and_write(text, args.output)


if __name__ == "__main__":
    main()
