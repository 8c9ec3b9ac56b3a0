"""Sampler speed: two ratios, each measured within one run (medians of repeated timings).

1. Overhead: generate wall time / (NFE x one forward of the full sequence), batch 8, prompt 32, 128 new
   tokens, 128 steps, tiny model, CPU. Target <= 1.05. Each repeat times a generate and then NFE forwards back to
   back (same machine load); the median of the per-repeat ratios is reported. Also printed: the same against a forward that computes the LM
   head only on one block (what generate's forwards actually cost), i.e. the sampler's own share.
2. LM head on the revealable positions only: LLaDA's vocabulary (126,464) on a tiny network, 128 new tokens,
   block 32, 128 steps: generate / the same sampler computing full-sequence logits. Target <= 0.5.

3. With ``--baseline DIR`` (another checkout of the project, e.g. ``git worktree add /tmp/before <rev>``): the
   generate time of this checkout's sampler / the baseline's sampler on the same model and inputs, both settings
   above, interleaved repeats in one process (the baseline's ``hf_mdm/generation*.py`` loaded under another
   package name); the tokens must be identical.

Run: ``python evaluation/bench_sampler.py [--repeats 5] [--json out.json] [--baseline DIR]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import time
import types
from pathlib import Path

import torch
from tqdm.auto import tqdm

from hf_mdm import MDMConfig, MDMForMaskedDiffusion
from hf_mdm.generation import diffusion_generate


class FullLogitsOnly(torch.nn.Module):
    """Hides ``logits_to_keep`` from the sampler, so it computes full-sequence logits (the naive sampler)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids, attention_mask=None):
        return self.model(input_ids, attention_mask=attention_mask)


def median_time(fn, repeats: int, desc: str = "") -> float:
    fn()  # warm-up
    times = []
    for _ in tqdm(range(repeats), desc=desc, disable=not desc, leave=False):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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
def overhead(repeats: int) -> dict:
    model = tiny_model(vocab_size=1024, hidden=128, layers=2)
    bsz, plen, new, steps = 8, 32, 128, 128
    x = torch.randint(0, 1000, (bsz, plen), generator=torch.Generator().manual_seed(0))
    full = torch.randint(0, 1000, (bsz, plen + new))
    out = diffusion_generate(model, x, max_new_tokens=new, steps=steps, block_length=32, return_dict_in_generate=True)
    nfe = out.nfe
    block = torch.arange(plen, plen + 32)

    def forwards(logits_to_keep):
        for _ in range(nfe):
            model(full, logits_to_keep=logits_to_keep)

    # Interleaved: each repeat times one generate and, right after, NFE forwards, so both see the same machine load.
    gen_times, fwd_times, block_times = [], [], []
    generate = lambda: diffusion_generate(model, x, max_new_tokens=new, steps=steps, block_length=32)  # noqa: E731
    generate()
    for _ in tqdm(range(repeats), desc="[1] overhead", leave=False):
        gen_times.append(median_time(generate, 1))
        fwd_times.append(median_time(lambda: forwards(0), 1))
        block_times.append(median_time(lambda: forwards(block), 1))
    ratios = [g / f for g, f in zip(gen_times, fwd_times)]
    block_ratios = [g / b for g, b in zip(gen_times, block_times)]
    t_gen, t_fwd, t_fwd_block = (
        statistics.median(v) / d for v, d in ((gen_times, 1), (fwd_times, nfe), (block_times, nfe))
    )
    return {
        "setting": f"batch {bsz}, prompt {plen}, {new} new tokens, {steps} steps, block 32, hidden 128, 2 layers, vocab 1024",
        "nfe": nfe,
        "generate_s": t_gen,
        "forward_full_s": t_fwd,
        "forward_block_head_s": t_fwd_block,
        "ratio_vs_full_forward": statistics.median(ratios),
        "ratio_vs_block_head_forward": statistics.median(block_ratios),
        "ratios": ratios,
    }


@torch.no_grad()
def lm_head(repeats: int) -> dict:
    model = tiny_model(vocab_size=126464, hidden=64, layers=2)
    bsz, plen, new, steps = 1, 32, 128, 128
    x = torch.randint(0, 1000, (bsz, plen), generator=torch.Generator().manual_seed(0))
    kwargs = dict(max_new_tokens=new, steps=steps, block_length=32)
    ours = diffusion_generate(model, x, **kwargs)
    naive = diffusion_generate(FullLogitsOnly(model), x, **kwargs)
    assert torch.equal(ours, naive), "restricting the LM head must not change the tokens"
    t_ours = median_time(lambda: diffusion_generate(model, x, **kwargs), repeats, "[2] LM head on the block")
    t_naive = median_time(lambda: diffusion_generate(FullLogitsOnly(model), x, **kwargs), repeats, "[2] full logits")
    return {
        "setting": f"batch {bsz}, prompt {plen}, {new} new tokens, {steps} steps, block 32, hidden 64, vocab 126464",
        "generate_s": t_ours,
        "full_logits_generate_s": t_naive,
        "ratio": t_ours / t_naive,
        "same_tokens": True,
    }


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
    """This checkout's generate time / the baseline's, interleaved, on both settings above."""
    settings = {
        "overhead": (tiny_model(vocab_size=1024, hidden=128, layers=2), 8),
        "lm_head": (tiny_model(vocab_size=126464, hidden=64, layers=2), 1),
    }
    results = {}
    for name, (model, bsz) in settings.items():
        x = torch.randint(0, 1000, (bsz, 32), generator=torch.Generator().manual_seed(0))
        kwargs = dict(max_new_tokens=128, steps=128, block_length=32)
        ours, theirs = diffusion_generate(model, x, **kwargs), baseline_generate(model, x, **kwargs)
        assert torch.equal(ours, theirs), f"{name}: the tokens differ from the baseline's"
        ratios = [
            median_time(lambda: diffusion_generate(model, x, **kwargs), 1)
            / median_time(lambda: baseline_generate(model, x, **kwargs), 1)
            for _ in tqdm(range(repeats), desc=f"[3] {name} vs baseline", leave=False)
        ]
        results[name] = {"ratio": statistics.median(ratios), "ratios": ratios, "same_tokens": True}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--baseline", default=None, help="another checkout to compare this sampler's speed with")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"bench_sampler: {args.repeats} repeats of each timing (a few minutes on 2 CPU cores; progress below)",
        flush=True,
    )
    results = {
        "machine": f"{platform.processor() or platform.machine()}, {args.threads} threads, torch {torch.__version__}",
        "overhead": overhead(args.repeats),
        "lm_head": lm_head(args.repeats),
    }
    if args.baseline:
        results["versus_baseline"] = versus_baseline(load_baseline(args.baseline), args.repeats)
    o, h = results["overhead"], results["lm_head"]
    print(f"[1] {o['setting']}")
    print(
        f"    generate {o['generate_s']:.3f} s, NFE {o['nfe']}, full forward {o['forward_full_s'] * 1e3:.2f} ms, "
        f"block-head forward {o['forward_block_head_s'] * 1e3:.2f} ms"
    )
    low, high = min(o["ratios"]), max(o["ratios"])
    print(
        f"    generate / (NFE x full forward)       = {o['ratio_vs_full_forward']:.3f}   (target <= 1.05; "
        f"median of {len(o['ratios'])} interleaved repeats, range {low:.3f}-{high:.3f})"
    )
    print(f"    generate / (NFE x block-head forward) = {o['ratio_vs_block_head_forward']:.3f}   (sampler's own share)")
    print(f"[2] {h['setting']}")
    print(f"    generate {h['generate_s']:.3f} s vs full-logits sampler {h['full_logits_generate_s']:.3f} s")
    print(f"    ratio = {h['ratio']:.3f}   (target <= 0.5; identical tokens)")
    for name, row in results.get("versus_baseline", {}).items():
        low, high = min(row["ratios"]), max(row["ratios"])
        print(
            f"[3] {name} setting: generate / baseline's generate = {row['ratio']:.3f} (median of "
            f"{len(row['ratios'])} interleaved repeats, range {low:.3f}-{high:.3f}; identical tokens)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
