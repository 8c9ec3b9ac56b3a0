"""Sampler speed: the LM head on the revealable positions only, and this sampler against another checkout's.

The sampler's own cost beside its forwards (the outside-forward share, timed in the same call) and the caches against
their ideal are measured by ``evaluation/bench.py`` (``make bench``); this script measures two other ratios, each A/B
interleaved in one process (rounds that call both once in turn, after a warm-up round), ``--threads`` (default 1: on
a shared machine more threads measure contention), the median and range of the per-round ratios:

1. LM head on the revealable positions only: LLaDA's vocabulary (126,464) on a tiny network, 128 new tokens,
   block 32, 128 steps: generate / the same sampler computing full-sequence logits. Target <= 0.5.
2. With ``--baseline DIR`` (another checkout of the project, e.g. ``git worktree add /tmp/before <rev>``): the
   generate time of this checkout's sampler / the baseline's sampler on the same model and inputs (batch 8, hidden
   128, vocab 1024; and the setting of 1), interleaved repeats in one process (the baseline's ``hf_mdm/generation*.py``
   loaded under another package name); the tokens must be identical.

Run: ``python evaluation/bench_sampler.py [--repeats 5] [--threads 1] [--json out.json] [--baseline DIR]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import types
from pathlib import Path

import torch

from hf_mdm import MDMConfig, MDMForMaskedDiffusion
from hf_mdm.generation import diffusion_generate
from hf_mdm.timer import Stopwatch


class FullLogitsOnly(torch.nn.Module):
    """Hides ``logits_to_keep`` from the sampler, so it computes full-sequence logits (the naive sampler)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids, attention_mask=None):
        return self.model(input_ids, attention_mask=attention_mask)


def interleaved_ratios(ours, theirs, repeats: int, desc: str) -> dict:
    """Rounds timing ``ours`` then ``theirs`` (one call each) after one untimed round: their times' medians and the
    per-round ratios ours / theirs (median, range)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    for round_ in range(1 + repeats):
        for name, fn in (("ours", ours), ("theirs", theirs)):
            with Stopwatch("cpu") as watch:
                fn()
            if round_:
                times[name].append(watch.seconds)
        print(f"  {desc}: round {round_ + 1} of {1 + repeats} done", file=sys.stderr, flush=True)
    ratios = [a / b for a, b in zip(times["ours"], times["theirs"])]
    return {
        "ours_s": statistics.median(times["ours"]),
        "theirs_s": statistics.median(times["theirs"]),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
    }


def tiny_model(vocab_size: int, hidden: int, layers: int, seed: int = 0) -> MDMForMaskedDiffusion:
    torch.manual_seed(seed)
    config = MDMConfig(
        vocab_size=vocab_size,
        mask_token_id=vocab_size - 1,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
    )
    return MDMForMaskedDiffusion(config).eval()


@torch.no_grad()
def lm_head(repeats: int) -> dict:
    model = tiny_model(vocab_size=126464, hidden=64, layers=2)
    bsz, plen, new, steps = 1, 32, 128, 128
    x = torch.randint(0, 1000, (bsz, plen), generator=torch.Generator().manual_seed(0))
    kwargs = dict(max_new_tokens=new, steps=steps, block_length=32)
    ours = diffusion_generate(model, x, **kwargs)
    naive = diffusion_generate(FullLogitsOnly(model), x, **kwargs)
    assert torch.equal(ours, naive), "restricting the LM head must not change the tokens"
    result = interleaved_ratios(
        lambda: diffusion_generate(model, x, **kwargs),
        lambda: diffusion_generate(FullLogitsOnly(model), x, **kwargs),
        repeats,
        "[1] LM head on the block vs full logits",
    )
    setting = f"batch {bsz}, prompt {plen}, {new} new tokens, {steps} steps, block 32, hidden 64, vocab 126464"
    return {"setting": setting, **result, "same_tokens": True}


def load_baseline(checkout: str):
    """``diffusion_generate`` of another checkout's sampler (its flat generation modules import only torch,
    transformers and each other, so they load as a package of their own without its ``__init__``)."""
    name = "_baseline_hf_mdm"
    package = types.ModuleType(name)
    package.__path__ = [str(Path(checkout) / "hf_mdm")]
    sys.modules[name] = package
    return importlib.import_module(f"{name}.generation").diffusion_generate


@torch.no_grad()
def versus_baseline(baseline_generate, repeats: int) -> dict:
    """This checkout's generate time / the baseline's, interleaved, on two settings."""
    settings = {
        "batch 8, vocab 1024": (tiny_model(vocab_size=1024, hidden=128, layers=2), 8),
        "lm_head": (tiny_model(vocab_size=126464, hidden=64, layers=2), 1),
    }
    results = {}
    for name, (model, bsz) in settings.items():
        x = torch.randint(0, 1000, (bsz, 32), generator=torch.Generator().manual_seed(0))
        kwargs = dict(max_new_tokens=128, steps=128, block_length=32)
        ours, theirs = diffusion_generate(model, x, **kwargs), baseline_generate(model, x, **kwargs)
        assert torch.equal(ours, theirs), f"{name}: the tokens differ from the baseline's"
        results[name] = interleaved_ratios(
            lambda: diffusion_generate(model, x, **kwargs),
            lambda: baseline_generate(model, x, **kwargs),
            repeats,
            f"[2] {name} vs baseline",
        )
        results[name]["same_tokens"] = True
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1 on a shared machine)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--baseline", default=None, help="another checkout to compare this sampler's speed with")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"bench_sampler: {args.repeats} interleaved rounds of each comparison after one warm-up round", flush=True)
    results = {
        "machine": f"{platform.processor() or platform.machine()}, {args.threads} threads, torch {torch.__version__}",
        "lm_head": lm_head(args.repeats),
    }
    if args.baseline:
        results["versus_baseline"] = versus_baseline(load_baseline(args.baseline), args.repeats)
    h = results["lm_head"]
    print(f"[1] {h['setting']}")
    print(f"    generate {h['ours_s']:.3f} s vs full-logits sampler {h['theirs_s']:.3f} s (medians)")
    low, high = min(h["ratios"]), max(h["ratios"])
    print(f"    ratio = {h['ratio']:.3f}   (target <= 0.5; per-round range {low:.3f}-{high:.3f}; identical tokens)")
    for name, row in results.get("versus_baseline", {}).items():
        low, high = min(row["ratios"]), max(row["ratios"])
        print(
            f"[2] {name}: generate / baseline's generate = {row['ratio']:.3f} (median of "
            f"{len(row['ratios'])} interleaved rounds, range {low:.3f}-{high:.3f}; identical tokens)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
