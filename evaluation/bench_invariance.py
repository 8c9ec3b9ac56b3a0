"""Batch invariance (`hf_mdm.generation_rows`): how much a batched row differs from itself alone, and what
``batch_invariant=True`` costs. Part of ``make bench``.

Setting (the one users reported): a random ``MDMForMaskedDiffusion`` (hidden 256, 4 layers, vocabulary 1024), eight
left-padded prompts of 12-32 tokens, 32 new tokens in blocks of 16 (32 steps), on the CPU; ``--prompt-sets``
different sets of prompts. For each sampler, every row generated in the batch is compared with the same prompt
generated alone (``seed=`` the row's own at temperature 1): rows that differ and tokens that differ per row, in
float32 and bfloat16, without and with ``batch_invariant=True``. The autoregressive baseline, a transformers Llama of
the same sizes, greedy ``generate`` with left padding, is compared the same way, batched and one request at a time
(`hf_mdm.harness.reproducible.generate_alone`, the ``hf_timed`` model's ``batch_invariant=True``).

Cost, against the targets: eight prompts of one length, ``batch_invariant=True`` against the default batched call
(<= 1.05x); eight prompts of realistic mixed lengths (GSM8K questions' lengths), the same (<= 1.3x); one seed per
row at temperature 1 against one seed for the batch (<= 1.1x); each also with every row alone (the mode before it
kept the batch). Interleaved rounds after a warm-up round, median seconds over ``--repeats`` rounds, in float32 and
bfloat16.

    python evaluation/bench_invariance.py [--prompt-sets 3] [--repeats 3] [--threads 1] [--output FILE.md] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import interleave, parse_table_arguments, print_and_write  # noqa: E402

from hf_mdm import (  # noqa: E402
    MDMConfig,
    MDMForMaskedDiffusion,
    generation_rows,  # noqa: E402
)
from hf_mdm.harness.reproducible import generate_alone  # noqa: E402


def amx_note() -> str:
    return "yes" if generation_rows._amx_in_use() else "no"


SAMPLERS = {  # name: (settings, seeds: one for the batch or one a row)
    "confidence, T=0": ({}, "batch"),
    "dual cache, T=0": (dict(kv_cache="dual"), "batch"),
    "threshold 0.9, T=0": (dict(transfer="threshold", threshold=0.9), "batch"),
    "random order, T=1, seed=0": (dict(strategy="random", temperature=1.0), "batch"),
    "random order, T=1, one seed a row": (dict(strategy="random", temperature=1.0), "row"),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def networks(args: argparse.Namespace, dtype: torch.dtype) -> tuple[MDMForMaskedDiffusion, LlamaForCausalLM]:
    torch.manual_seed(0)
    sizes = dict(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=4)
    sizes.update(intermediate_size=4 * args.hidden, max_position_embeddings=256)
    mdm = MDMForMaskedDiffusion(MDMConfig(vocab_size=args.vocab, mask_token_id=args.vocab - 1, **sizes))
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=args.vocab, tie_word_embeddings=False, **sizes))
    return mdm.eval().to(dtype), llama.eval().to(dtype)


def prompt_set(args: argparse.Namespace, index: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Eight prompts of 12-32 tokens, left-padded (pad id 0): (ids, attention mask, the prompts)."""
    generator = torch.Generator().manual_seed(index)
    lengths = torch.randint(args.shortest, args.longest + 1, (args.batch,), generator=generator).tolist()
    prompts = [torch.randint(1, args.vocab - 2, (n,), generator=generator) for n in lengths]
    ids = torch.zeros((args.batch, max(lengths)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, ids.shape[1] - len(p) :], mask[i, ids.shape[1] - len(p) :] = p, 1
    return ids, mask, prompts


def differences(batched: torch.Tensor, alone: list[list[int]]) -> tuple[int, int]:
    """Rows of ``batched`` (B, T) that differ from ``alone``, and the tokens that differ, summed over rows."""
    tokens = [sum(a != b for a, b in zip(row, want)) for row, want in zip(batched.tolist(), alone)]
    return sum(t > 0 for t in tokens), sum(tokens)


@torch.no_grad()
def mdm_variance(args: argparse.Namespace, model, sets: list, sampler: tuple, invariant: bool) -> tuple[int, int]:
    """Rows and tokens differing from alone, over the prompt sets; seeds one for the batch (0, each row alone with
    seed 0) or one a row (row i: i)."""
    settings, kind = sampler
    rows = tokens = 0
    for ids, mask, prompts in sets:
        seeds = list(range(len(prompts))) if kind == "row" else 0
        kw = dict(max_new_tokens=args.new_tokens, steps=args.new_tokens, block_length=args.block, **settings)
        out = model.generate(ids, attention_mask=mask, seed=seeds, batch_invariant=invariant, **kw)
        row_seeds = seeds if kind == "row" else [0] * len(prompts)
        alone = [model.generate(p[None], seed=s, **kw)[0, len(p) :].tolist() for p, s in zip(prompts, row_seeds)]
        r, t = differences(out[:, ids.shape[1] :], alone)
        rows, tokens = rows + r, tokens + t
    return rows, tokens


def ar_generate(args: argparse.Namespace, model) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def generate(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model.generate(
            ids, attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0,
            eos_token_id=None,
        )  # fmt: skip

    return generate


@torch.no_grad()
def ar_variance(args: argparse.Namespace, model, sets: list, invariant: bool) -> tuple[int, int]:
    generate, rows, tokens = ar_generate(args, model), 0, 0
    for ids, mask, prompts in sets:
        if invariant:
            out, _ = generate_alone(generate, ids, mask, list(range(len(prompts))), 0)
        else:
            out = generate(ids, mask)[:, ids.shape[1] :]
        alone = [generate(p[None], torch.ones_like(p[None]))[0, len(p) :].tolist() for p in prompts]
        r, t = differences(out, alone)
        rows, tokens = rows + r, tokens + t
    return rows, tokens


def variance_rows(args: argparse.Namespace) -> list[dict]:
    sets = [prompt_set(args, i) for i in range(args.prompt_sets)]
    total, table = args.batch * len(sets), []
    for dtype_name, dtype in DTYPES.items():
        mdm, llama = networks(args, dtype)
        for name, sampler in SAMPLERS.items():
            cells = [mdm_variance(args, mdm, sets, sampler, invariant) for invariant in (False, True)]
            table.append(dict(model="MDM", sampler=name, dtype=dtype_name, rows=total, cells=cells))
        cells = [ar_variance(args, llama, sets, invariant) for invariant in (False, True)]
        table.append(
            dict(model="AR (transformers generate)", sampler="greedy", dtype=dtype_name, rows=total, cells=cells)
        )
        print(f"  variance: {dtype_name} done", file=sys.stderr, flush=True)
    return table


def realistic_lengths(args: argparse.Namespace) -> list[int]:
    """``args.batch`` prompt lengths from a realistic distribution: GSM8K test questions' lengths in words x 4/3
    (about a subword tokenizer's count) from ``$HF_MDM_DATA_DIR`` or ``../shared/data`` when present, every 50th
    question; else uniform in [shortest, longest]."""
    for root in (os.environ.get("HF_MDM_DATA_DIR"), Path(__file__).resolve().parents[2] / "shared" / "data"):
        path = Path(root or "") / "gsm8k" / "test.jsonl"
        if root and path.is_file():
            questions = [json.loads(line)["question"] for line in path.read_text().splitlines() if line.strip()]
            return [round(len(q.split()) * 4 / 3) for q in questions[::50][: args.batch]]
    generator = torch.Generator().manual_seed(0)
    return torch.randint(args.shortest, args.longest + 1, (args.batch,), generator=generator).tolist()


def batch_of(args: argparse.Namespace, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of ``lengths`` tokens, left-padded (pad id 0): (ids, attention mask)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.zeros((len(lengths), max(lengths)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, ids.shape[1] - n :] = torch.randint(1, args.vocab - 2, (n,), generator=generator)
        mask[i, ids.shape[1] - n :] = 1
    return ids, mask


@contextlib.contextmanager
def rows_alone() -> Iterator[None]:
    """The previous mode, for comparison: every row of an invariant or per-row-seed call alone."""
    saved = generation_rows.RowLayout.groups
    generation_rows.RowLayout.groups = generation_rows.RowLayout.alone
    try:
        yield
    finally:
        generation_rows.RowLayout.groups = saved


def cost_cases(args: argparse.Namespace, mdm) -> dict[str, dict[str, Callable[[], Any]]]:
    """Per case: the baseline, the invariant call (or per-row seeds) and the same with every row alone."""
    kw = dict(max_new_tokens=args.new_tokens, steps=args.new_tokens, block_length=args.block)
    equal = batch_of(args, [args.longest] * args.batch)
    mixed = batch_of(args, realistic_lengths(args))
    seeds = list(range(args.batch))

    def call(batch, alone=False, **extra):
        def run():
            with rows_alone() if alone else contextlib.nullcontext():
                return mdm.generate(batch[0], attention_mask=batch[1], **kw, **extra)

        return run

    return {
        "equal lengths, batch_invariant (T=0)": dict(
            base=call(equal), new=call(equal, batch_invariant=True), alone=call(equal, True, batch_invariant=True)
        ),
        "mixed lengths, batch_invariant (T=0)": dict(
            base=call(mixed), new=call(mixed, batch_invariant=True), alone=call(mixed, True, batch_invariant=True)
        ),
        "equal lengths, one seed a row (T=1) vs one seed": dict(
            base=call(equal, temperature=1.0, seed=0),
            new=call(equal, temperature=1.0, seed=seeds),
            alone=call(equal, True, temperature=1.0, seed=seeds),
        ),
    }


TARGETS = {"equal lengths": 1.05, "mixed lengths": 1.3, "equal lengths, one seed": 1.1}


@torch.no_grad()
def cost_rows(args: argparse.Namespace) -> list[dict]:
    table = []
    for dtype_name, dtype in DTYPES.items():
        mdm, _ = networks(args, dtype)
        for case, calls in cost_cases(args, mdm).items():
            series = interleave({k: (mdm, fn) for k, fn in calls.items()}, args.repeats, warmup=1)
            base, new, alone = (series[k].median for k in ("base", "new", "alone"))
            target = next(v for k, v in sorted(TARGETS.items(), key=lambda kv: -len(kv[0])) if case.startswith(k))
            table.append(dict(case=case, dtype=dtype_name, base=base, new=new, alone=alone, target=target))
        print(f"  cost: {dtype_name} done", file=sys.stderr, flush=True)
    return table


def markdown(args: argparse.Namespace, variance: list[dict], cost: list[dict]) -> str:
    lines = [
        "# Batch invariance: a batched row against itself alone",
        "",
        f"Written by `evaluation/bench_invariance.py` (`make bench`): random MDM and Llama of hidden {args.hidden}, "
        f"{args.layers} layers, vocabulary {args.vocab}; {args.prompt_sets} sets of {args.batch} left-padded prompts "
        f"of {args.shortest}-{args.longest} tokens, {args.new_tokens} new tokens in blocks of {args.block}; CPU, "
        f"{torch.get_num_threads()} thread(s), torch {torch.__version__}.",
        "",
        "| model | sampler | dtype | rows differing (default) | tokens differing per row (default) "
        "| rows differing (batch_invariant) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in variance:
        (rows, tokens), (inv_rows, _) = r["cells"]
        lines.append(
            f"| {r['model']} | {r['sampler']} | {r['dtype']} | {rows} of {r['rows']} | {tokens / r['rows']:.1f} "
            f"| {inv_rows} of {r['rows']} |"
        )
    lines += [
        "",
        "With one seed a row each row draws from its own generator; rows of one length and [MASK] layout run as one "
        "batch without padding (`hf_mdm.generation_rows`), where the device's kernels give a row the same bits at "
        f"any number of rows: on this CPU float32 does; bfloat16 runs under AMX here (AMX in use: {amx_note()}), "
        "whose products change bits with the number of rows, so its rows run alone.",
        "",
        f"Cost of a batch of {args.batch} (median seconds over {args.repeats} interleaved rounds after a warm-up "
        f"round). Equal lengths: {args.batch} prompts of {args.longest} tokens. Mixed lengths: "
        f"{realistic_lengths(args)} tokens (GSM8K test questions' word counts x 4/3), left-padded. 'rows alone': "
        "the same call with every row alone, as the mode ran before it kept the batch.",
        "",
        "| case | dtype | baseline s | this mode s | ratio | target | rows alone s | rows alone ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in cost:
        ratio, before = r["new"] / r["base"], r["alone"] / r["base"]
        verdict = "met" if ratio <= r["target"] else "not met"
        lines.append(
            f"| {r['case']} | {r['dtype']} | {r['base']:.3f} | {r['new']:.3f} | {ratio:.2f}x | <= {r['target']}x "
            f"({verdict}) | {r['alone']:.3f} | {before:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def parse(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompt-sets", type=int, default=3)
    sizes = dict(hidden=256, layers=4, vocab=1024, batch=8, shortest=12, longest=32, new_tokens=32, block=16)
    quick = dict(hidden=32, layers=1, vocab=64, batch=3, shortest=2, longest=6, new_tokens=8, block=4, prompt_sets=1)
    return parse_table_arguments(p, argv, 3, sizes, quick)


def main(argv: Any = None) -> str:
    args = parse(argv)
    text = markdown(args, variance_rows(args), cost_rows(args))
    return print_and_write(text, args.output)


if __name__ == "__main__":
    main()
