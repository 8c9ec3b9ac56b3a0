"""What each sampler spends outside the model's forward, on the CPU, and its host reads per forward; with
``--baseline DIR``, against another checkout's sampler in the same run (issue 54, item 2: every sampler <= 5%).

Model: a random ``MDMForMaskedDiffusion`` of `evaluation/bench.py`'s shape (hidden 256, 4 layers, 4 heads, MLP 1024,
float32) with two vocabularies: 1,024 (bench.py's) and LLaDA's 126,464, where the work a step does over the
vocabulary (a softmax, the draws) is LLaDA's per position; prompt 64 + 192 new tokens in blocks of 32, 48 steps,
batch 1. Samplers: confidence (deterministic counts) at temperature 0 and 1, the paper's sampler, threshold 0.9 at
temperature 0 and 1, the entropy bound, and the dual cache alone and with threshold 0.9.

Every call is timed as a whole and its forwards inside it (`bench_measure.ForwardMeter`, forward hooks); *outside*
is the median over rounds of (call - forwards) / call. Calls interleaved in one process (`bench_measure.interleave`:
each run once per round, in turn, after a warm-up round), ``--threads`` (default 1). *reads / NFE*: the host
synchronisations of one untimed call (`hf_mdm.host_syncs`) per forward. ``torch.multinomial`` reads back and reduces
inside its own kernel, which the counter does not see; the sampler no longer calls it.

``--baseline DIR``: another checkout's sampler (its ``hf_mdm/generation*.py`` and what they import, loaded under
another package name: `bench_sampler.load_baseline`) on the same model and inputs; *tokens = baseline's* is the
share of generated tokens equal to the baseline's (a change of arithmetic, such as how a confidence is rounded, can
break a near tie the other way). The model is this checkout's in both, so a change inside the model's forward shows
in both columns.

Run: ``python evaluation/bench_sampler_cost.py [--repeats 3] [--vocabs 1024 126464] [--baseline DIR] [--json out]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import count_syncs, interleave  # noqa: E402
from bench_sampler import load_baseline, tiny_model  # noqa: E402

from hf_mdm.generation import diffusion_generate  # noqa: E402

GREEDY = dict(transfer="deterministic", strategy="confidence", temperature=0.0)
SAMPLERS = {
    "confidence": GREEDY,
    "confidence T=1": dict(GREEDY, temperature=1.0),
    "paper's sampler (T=1)": dict(transfer="stochastic", strategy="random", temperature=1.0),
    "threshold 0.9": dict(transfer="threshold", threshold=0.9, temperature=0.0),
    "threshold 0.9 T=1": dict(transfer="threshold", threshold=0.9, temperature=1.0),
    "entropy_bound 0.5": dict(transfer="entropy_bound", entropy_bound=0.5, temperature=0.0),
    "dual cache": dict(GREEDY, kv_cache="dual"),
    "threshold 0.9 + dual cache": dict(transfer="threshold", threshold=0.9, temperature=0.0, kv_cache="dual"),
}
OUTSIDE_MAX = 0.05
SETTING = dict(max_new_tokens=192, steps=48, block_length=32, stop_at_eos=False, seed=0)


def runs_of(model, prompt, generators: dict[str, Callable], samplers: list[str]) -> dict[str, tuple[Any, Callable]]:
    """Every (sampler, checkout) run on ``model``: (model, call)."""
    runs = {}
    for name in samplers:
        settings = SAMPLERS[name]
        for who, generate in generators.items():
            runs[f"{name}|{who}"] = (model, lambda g=generate, s=settings: g(model, prompt, **SETTING, **s))
    return runs


def reads_per_forward(generate: Callable, model, prompt, settings: dict) -> tuple[float, torch.Tensor]:
    """Host reads of one untimed call per forward, and its tokens."""
    out = {}

    def call():
        out["o"] = generate(model, prompt, return_dict_in_generate=True, **SETTING, **settings)

    syncs = count_syncs(call)
    return syncs / out["o"].nfe, out["o"].sequences


@torch.no_grad()
def measure_vocab(
    vocab: int, generators: dict[str, Callable], repeats: int, say: Callable[[str], None], samplers: list[str]
) -> list[dict]:
    model = tiny_model(vocab_size=vocab, hidden=256, layers=4)
    prompt = torch.randint(0, vocab - 2, (1, 64), generator=torch.Generator().manual_seed(1))
    series = interleave(runs_of(model, prompt, generators, samplers), repeats, 1, progress=say)
    rows = []
    for name in samplers:
        settings = SAMPLERS[name]
        row: dict[str, Any] = dict(vocab=vocab, sampler=name)
        tokens = {}
        for who, generate in generators.items():
            s = series[f"{name}|{who}"]
            row[f"outside_{who}"] = s.outside_share
            row[f"seconds_{who}"] = s.median
            row[f"forward_seconds_{who}"] = s.forward_median
            row["nfe"] = s.calls[0].forwards
            row[f"reads_per_forward_{who}"], tokens[who] = reads_per_forward(generate, model, prompt, settings)
        if "baseline" in tokens:
            row["tokens_equal"] = float((tokens["ours"] == tokens["baseline"])[:, prompt.shape[1] :].float().mean())
            row["outside_ratios"] = [
                outside_of(a) / outside_of(b)
                for a, b in zip(series[f"{name}|ours"].calls, series[f"{name}|baseline"].calls)
            ]
        rows.append(row)
    return rows


def outside_of(call) -> float:
    """Seconds of a call outside its forwards."""
    return call.seconds - call.forward_seconds


def table(rows: list[dict], baseline: bool) -> str:
    whose = ("baseline", "ours") if baseline else ("ours",)
    names = {"baseline": "baseline", "ours": "this"}
    head = ["vocab", "sampler", "NFE"]
    head += [f"outside ({names[w]})" for w in whose] + [f"reads / NFE ({names[w]})" for w in whose]
    head += ["outside s, this / baseline: median (range)", "tokens = baseline's"] if baseline else []
    lines = ["| " + " | ".join(head + [f"this <= {OUTSIDE_MAX:.0%}"]) + " |", "|" + "---|" * (len(head) + 1)]
    for r in rows:
        cells = [str(r["vocab"]), r["sampler"], str(r["nfe"])]
        cells += [f"{100 * r[f'outside_{w}']:.1f}%" for w in whose]
        cells += [f"{r[f'reads_per_forward_{w}']:.2f}" for w in whose]
        if baseline:
            ratios = r["outside_ratios"]
            cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
            cells.append(f"{r['tokens_equal']:.1%}")
        cells.append("PASS" if r["outside_ours"] <= OUTSIDE_MAX else "FAIL")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1 on a shared machine)")
    parser.add_argument("--vocabs", type=int, nargs="+", default=[1024, 126464])
    parser.add_argument("--baseline", default=None, help="another checkout whose sampler runs beside this one")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--samplers", nargs="+", choices=list(SAMPLERS), default=None, help="only these rows")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generators = {"ours": diffusion_generate}
    if args.baseline:
        generators["baseline"] = load_baseline(args.baseline)
    print(
        f"bench_sampler_cost: hidden 256, 4 layers, prompt 64 + 192 new tokens, blocks of 32, 48 steps, batch 1; "
        f"{platform.machine()}, {args.threads} thread(s), torch {torch.__version__}; 1 warm-up + {args.repeats} "
        "interleaved rounds",
        flush=True,
    )
    rows = []
    for vocab in args.vocabs:
        say = lambda line, v=vocab: print(f"  vocab {v}: {line}", file=sys.stderr, flush=True)  # noqa: E731
        rows += measure_vocab(vocab, generators, args.repeats, say, args.samplers or list(SAMPLERS))
    print(table(rows, bool(args.baseline)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
