"""`make bench`: one table of what a sampler costs beyond its forwards, what the caches gain against their ideal, and
hf_mdm's forward against a transformers Llama forward, each with its target of issue 22 (item 3) and PASS/FAIL.

Model: a randomly initialised ``MDMForMaskedDiffusion`` (default hidden 256, 4 layers, 4 heads, MLP 1024, vocab
1024, float32 on the CPU), where a forward of the 256-position canvas is real work; a random prompt of 64 tokens,
192 new ones in blocks of 32, 48 steps (4 a block), batch 1 and 8. Rows:

- samplers (no cache): every call's wall time and the time inside ``model.forward`` in the same call (forward hooks,
  device synchronised: `bench_measure.ForwardMeter`); *outside* is the median over calls of (generate - forwards)
  / generate. Target: outside <= 5%.
- caches: ``kv_cache="prefix"`` and ``"dual"`` on the bidirectional MDM, and the exact block cache
  (``kv_cache="prefix"``) of the block-causal ``MDMConfig(block_size=32)``, each against the same model without a
  cache (deterministic transfer, confidence order, temperature 0). *measured* = median over rounds of (time
  without / time with the cache); *ideal* = positions computed without / with it (counted by the hook on each
  forward's input length); target: measured / ideal >= 0.8.
- forward: hf_mdm's full-canvas forward / ``transformers.LlamaForCausalLM``'s of the same sizes and canvas (sdpa
  attention both), median over rounds (each call runs ``FORWARD_CALLS`` forwards). Target: <= 1.05.
- forward cost per position (information): a forward of one block's width against one of the whole canvas, per
  position. A cache's ideal assumes 1; above 1 a short forward is bound by reading the weights for few rows, which
  no cache removes.

Where targets are judged: at ``--judge-batch`` (default 8), a size where a forward is real work (a block forward is
8 x 32 = 256 positions a weight matrix is read for); the other batch sizes are printed with their verdict in brackets,
"not judged". At batch 1 a block forward reads every weight for 32 rows, and the "forward cost per position" row
measures what that costs.
- compiled: ``compile_forward=True`` (``--compile-backend``, dynamic shapes) on the deterministic+confidence
  sampler, interleaved with the eager one; *measured* = median over rounds of (eager time / compiled time), and
  whether the tokens are the eager ones (the target).

*host syncs / NFE*: the host synchronisations of one untimed call of the sampler (`bench_measure.count_syncs`) per
forward: ~0 for the count-based samplers at temperature 0, ~1 for the adaptive ones.

Method: all runs of a batch size interleaved in one process, each called once per round in turn (`interleave`), after
``--warmup`` untimed rounds, ``--repeats`` timed rounds; min and median shown. ``--threads`` (default 1: on a shared
machine more threads measure contention) is set with ``torch.set_num_threads``. ``--quick`` runs a tiny model once
(the tests' smoke run; its numbers mean nothing).

    python evaluation/bench.py [--repeats 3] [--warmup 1] [--threads 1] [--batches 1 8] [--judge-batch 8]
        [--hidden 256] [--layers 4]
        [--prompt 64] [--new-tokens 192] [--block 32] [--steps 48] [--compile-backend inductor] [--quick]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import Series, Target, cache_positions, count_syncs, format_table, interleave  # noqa: E402

from hf_mdm import MDMConfig, MDMForMaskedDiffusion  # noqa: E402
from hf_mdm.generation import diffusion_generate  # noqa: E402

GREEDY = dict(transfer="deterministic", strategy="confidence", temperature=0.0)
SAMPLERS = {
    "deterministic+confidence": dict(GREEDY),
    "deterministic+confidence T=1": dict(transfer="deterministic", strategy="confidence", temperature=1.0),
    "stochastic+random": dict(transfer="stochastic", strategy="random", temperature=1.0),
    "threshold 0.9": dict(transfer="threshold", threshold=0.9, strategy="confidence", temperature=0.0),
    "entropy_bound 0.5": dict(transfer="entropy_bound", entropy_bound=0.5, strategy="confidence", temperature=0.0),
    "speculative k=4": dict(transfer="speculative", draft_length=4, temperature=0.0, steps=None),
    "remdm cap 0.2": dict(transfer="stochastic", strategy="random", temperature=1.0, remdm="cap", remdm_eta=0.2),
}
CACHES = {"mdm prefix cache": ("mdm", "prefix", "prefix"), "mdm dual cache": ("mdm", "dual", "dual")}
EXACT = ("block-causal exact cache", ("block", "prefix", "exact"))
COMPILED = "deterministic+confidence compiled"
COMPILED_ROW = "compiled / eager forward"
OUTSIDE_MAX, CACHE_MIN, FORWARD_MAX = 0.05, 0.8, 1.05
FORWARD_CALLS = 4
QUICK = dict(
    hidden=32,
    layers=1,
    vocab=64,
    prompt=8,
    new_tokens=16,
    block=8,
    steps=4,
    repeats=1,
    warmup=0,
    compile_backend="eager",
)


def mdm(args: argparse.Namespace, block_size: Any = None) -> MDMForMaskedDiffusion:
    torch.manual_seed(0)
    config = MDMConfig(
        vocab_size=args.vocab,
        mask_token_id=args.vocab - 1,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=max(512, args.prompt + args.new_tokens),
        block_size=block_size,
    )
    return MDMForMaskedDiffusion(config).eval()


def llama_like(model: MDMForMaskedDiffusion) -> LlamaForCausalLM:
    """A transformers Llama of the MDM's sizes (same layers, widths, heads, vocabulary, RoPE, norm)."""
    c = model.config
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def runs_of(args: argparse.Namespace, models: dict, batch: int) -> dict:
    """Every run of one batch size: (model, call)."""
    gen = torch.Generator().manual_seed(batch)
    prompt = torch.randint(0, args.vocab - 2, (batch, args.prompt), generator=gen)
    canvas = torch.randint(0, args.vocab - 2, (batch, args.prompt + args.new_tokens), generator=gen)
    base = dict(max_new_tokens=args.new_tokens, steps=args.steps, block_length=args.block, stop_at_eos=False, seed=0)

    def generate(model, **settings):
        return model, lambda: diffusion_generate(model, prompt, **{**base, **settings})

    runs = {name: generate(models["mdm"], **settings) for name, settings in SAMPLERS.items()}
    for name, (model, cache, _) in CACHES.items():
        runs[name] = generate(models[model], kv_cache=cache, **GREEDY)
    compiled = CompileConfig(backend=args.compile_backend, dynamic=True, mode="default")
    runs[COMPILED] = generate(models["mdm"], compile_forward=True, compile_config=compiled, **GREEDY)
    runs["block-causal no cache"] = generate(models["block"], kv_cache="none", **GREEDY)  # its default is the cache
    runs[EXACT[0]] = generate(models["block"], kv_cache="prefix", **GREEDY)
    for name in ("mdm", "llama"):
        runs[f"{name} forward"] = (models[name], lambda m=models[name]: forwards(m, canvas))
    runs["mdm block-wide forward"] = (models["mdm"], lambda: forwards(models["mdm"], canvas[:, : args.block]))
    return runs


def forwards(model: Any, canvas: torch.Tensor) -> None:
    """``FORWARD_CALLS`` forwards of ``canvas`` (one timed call: a forward alone is short, so noisier)."""
    for _ in range(FORWARD_CALLS):
        model(canvas, logits_to_keep=0)


def round_ratio(a: Series, b: Series) -> float:
    """The median over rounds of a's time / b's time in the same round."""
    return statistics.median(x.seconds / y.seconds for x, y in zip(a.calls, b.calls))


def judged(args: argparse.Namespace, batch: int) -> bool:
    """Whether targets are judged at this batch size: ``--judge-batch``, else the largest batch run."""
    return batch == (args.judge_batch if args.judge_batch in args.batches else max(args.batches))


def cache_row(name: str, batch: int, cached: Series, plain: Series, kind: str, args: argparse.Namespace) -> dict:
    measured = round_ratio(plain, cached)
    ideal = plain.calls[0].positions / cached.calls[0].positions
    for series, cache in ((plain, None), (cached, kind)):
        by_hand = batch * cache_positions(cache, args.prompt, args.new_tokens, args.block, args.steps)
        if series.calls[0].positions != by_hand:
            raise RuntimeError(f"{name}: the hook counted {series.calls[0].positions} positions, by hand {by_hand}")
    text = f"{measured:.2f}x / ideal {ideal:.2f}x = {measured / ideal:.2f}"
    return dict(
        name=name,
        batch=batch,
        series=cached,
        measured=text,
        target=Target("measured/ideal", measured / ideal, CACHE_MIN, False, judged(args, batch)),
    )


def untimed_checks(runs: dict, series: dict[str, Series]) -> bool:
    """The host syncs of each sampler (one untimed call each, kept in its series) and whether the compiled run's
    tokens are the eager run's."""
    for name in SAMPLERS:
        series[name].syncs = count_syncs(runs[name][1])
    return torch.equal(runs[COMPILED][1](), runs["deterministic+confidence"][1]())


def compiled_row(series: dict[str, Series], batch: int, tokens_equal: bool, judge: bool) -> dict:
    """The compiled run against the eager one; no timing columns (the forward hooks do not see a compiled forward)."""
    eager, compiled = series["deterministic+confidence"], series[COMPILED]
    speedup = round_ratio(eager, compiled)
    measured = (
        f"eager {eager.median:.3f}s / compiled {compiled.median:.3f}s = {speedup:.2f}x, "
        f"tokens {'equal' if tokens_equal else 'differ'}"
    )
    target = Target("tokens equal", float(tokens_equal), 1.0, False, judge)
    return dict(name=COMPILED_ROW, batch=batch, measured=measured, target=target)


def rows_of(args: argparse.Namespace, series: dict[str, Series], batch: int, tokens_equal: bool) -> list[dict]:
    rows, judge = [], judged(args, batch)
    for name in SAMPLERS:
        s = series[name]
        share = Target("outside", s.outside_share, OUTSIDE_MAX, True, judge)
        rows.append(dict(name=name, batch=batch, series=s, measured=f"{100 * s.outside_share:.1f}%", target=share))
    plain = series["deterministic+confidence"]
    for name, (_, _, kind) in CACHES.items():
        rows.append(cache_row(name, batch, series[name], plain, kind, args))
    rows.append(cache_row(EXACT[0], batch, series[EXACT[0]], series["block-causal no cache"], "exact", args))
    ratio = round_ratio(series["mdm forward"], series["llama forward"])
    target = Target("mdm/llama", ratio, FORWARD_MAX, True, judge)
    name = "mdm forward / llama forward"
    rows.append(dict(name=name, batch=batch, series=series["mdm forward"], measured=f"{ratio:.3f}", target=target))
    rows.append(position_cost_row(args, series, batch))
    rows.append(compiled_row(series, batch, tokens_equal, judge))
    return rows


def position_cost_row(args: argparse.Namespace, series: dict[str, Series], batch: int) -> dict:
    """What a forward of one block's width costs per position against a forward of the whole canvas (median over
    rounds): a cache's ideal assumes 1 (cost proportional to positions); above 1, a short forward pays for reading
    every weight for few rows, which no cache removes, and the caches' measured/ideal falls below 1 by that much."""
    canvas = args.prompt + args.new_tokens
    per_position = round_ratio(series["mdm block-wide forward"], series["mdm forward"]) * canvas / args.block
    name = f"forward cost per position, {args.block} vs {canvas} positions a row"
    return dict(name=name, batch=batch, series=series["mdm block-wide forward"], measured=f"{per_position:.2f}x")


def parse(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (min and median over them)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1 on a shared machine)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument(
        "--judge-batch",
        type=int,
        default=8,
        help="the batch size the targets are judged at (default 8: a block forward is 256 positions, real work; "
        "at batch 1 it is 32, bound by reading the weights); the largest batch run when this one is not",
    )
    for name, default in (("hidden", 256), ("layers", 4), ("vocab", 1024), ("prompt", 64)):
        p.add_argument(f"--{name}", type=int, default=default)
    for name, default in (("new-tokens", 192), ("block", 32), ("steps", 48)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the compiled row")
    p.add_argument("--quick", action="store_true", help="a tiny model, one round, no warm-up: a smoke run")
    p.add_argument("--json", default=None, help="also write the table's numbers here")
    args = p.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    return args


@torch.no_grad()
def main(argv: Any = None) -> list[dict]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    models = {"mdm": mdm(args), "block": mdm(args, block_size=args.block)}
    models["llama"] = llama_like(models["mdm"])
    print(
        f"bench: MDMForMaskedDiffusion hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, prompt "
        f"{args.prompt} + {args.new_tokens} new tokens (canvas {args.prompt + args.new_tokens}), blocks of "
        f"{args.block}, {args.steps} steps; {platform.machine()}, {torch.get_num_threads()} thread(s), torch "
        f"{torch.__version__}; {args.warmup} warm-up + {args.repeats} interleaved rounds per batch",
        flush=True,
    )
    rows = []
    for batch in args.batches:
        say = lambda line, b=batch: print(f"  batch {b}: {line}", file=sys.stderr, flush=True)  # noqa: E731
        runs = runs_of(args, models, batch)
        series = interleave(runs, args.repeats, args.warmup, progress=say)
        rows += rows_of(args, series, batch, untimed_checks(runs, series))
    print(format_table(rows))
    if args.json:
        numbers = [
            dict(name=r["name"], batch=r["batch"], measured=r["measured"])
            | ({"value": t.value, "holds": t.holds, "judged": t.judged} if (t := r.get("target")) else {})
            for r in rows
        ]
        Path(args.json).write_text(json.dumps(numbers, indent=2))
    return rows


if __name__ == "__main__":
    main()
