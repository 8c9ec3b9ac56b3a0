"""KV caches and parallel decoding: speed ratios measured in one run, cache memory, and what they cost on a trained MDM.

1. Speed: a tiny LLaDA-architecture network (LLaDAModelLM) on the CPU, prompt 64, 256 new tokens, block 32,
   256 steps (one token a step, confidence order, temperature 0), batch 1 and 8: generate time without a cache /
   with the dual cache (target >= 3) and / with the prefix cache (target >= 1.8), interleaved repeats (each repeat
   times the three back to back), medians; tokens per second of each.
2. Memory: the bytes of keys/values the cache holds at every forward (a wrapper records them): the peak, and
   whether it ever grows across steps (it should hold one canvas per layer and branch, constant).
3. Parallel decoding on a trained tiny MDM of the 2-gram language of ``evaluation/configs/ter_vs_steps.yaml``
   (trained as ``make reproduce`` trains it, reused from ``--results`` when there): forwards per token and the
   generative perplexity relative increase (95% interval) of threshold 0.9 and entropy-bound decoding with the dual
   cache, beside the confidence-ordered one-token-a-step sampler (temperature 1, blocks of 8,
   ``hf_mdm.experiments.fast``).

    python evaluation/bench_cache.py [--repeats 5] [--threads 1] [--batches 1 8] [--device cuda --dtype bfloat16]
        [--skip-trained]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from hf_mdm.experiments import load_scale
from hf_mdm.experiments.common import make_language, trained_pair
from hf_mdm.experiments.fast import sample_with
from hf_mdm.experiments.ter_cells import gen_ppl_cell
from hf_mdm.generation import diffusion_generate
from hf_mdm.kv_cache import output_cache
from hf_mdm.models import LLaDAConfig, LLaDAModelLM
from hf_mdm.timer import Stopwatch

CONFIGS = Path(__file__).parent / "configs"
CACHES = (None, "prefix", "dual")


class CacheProbe(torch.nn.Module):
    """The model, recording the bytes of keys/values in the cache each forward returns."""

    supports_per_row_logits_to_keep = True
    supports_diffusion_cache = True

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.config, self.cache_bytes = model, model.config, []

    def forward(
        self, input_ids, attention_mask=None, logits_to_keep=0, cache=None, use_cache=None, cache_position=None
    ):
        out = self.model(
            input_ids,
            attention_mask=attention_mask,
            logits_to_keep=logits_to_keep,
            cache=cache,
            use_cache=use_cache,
            cache_position=cache_position,
        )
        cache = output_cache(out)
        if cache is not None:
            self.cache_bytes.append(sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers))
        return out


def tiny_llada(device: str, dtype: torch.dtype) -> LLaDAModelLM:
    torch.manual_seed(0)
    config = LLaDAConfig(
        d_model=256,
        n_heads=8,
        n_kv_heads=8,
        n_layers=4,
        mlp_hidden_size=1024,
        vocab_size=1024,
        embedding_size=1024,
        mask_token_id=1023,
        eos_token_id=1022,
        pad_token_id=1022,
        max_sequence_length=512,
    )
    return LLaDAModelLM(config).to(device=device, dtype=dtype).eval()


@torch.no_grad()
def speed(model, batch: int, repeats: int) -> dict:
    """Medians of interleaved repeats: seconds per generate with each cache, ratios, tokens per second."""
    prompt = torch.randint(0, 1000, (batch, 64), generator=torch.Generator().manual_seed(batch)).to(model.device)
    kwargs = dict(max_new_tokens=256, steps=256, block_length=32, strategy="confidence", stop_at_eos=False)
    run = {cache: (lambda c=cache: diffusion_generate(model, prompt, kv_cache=c, **kwargs)) for cache in CACHES}
    for fn in run.values():
        fn()  # warm-up
    times = {cache: [] for cache in CACHES}
    for _ in tqdm(range(repeats), desc=f"batch {batch}", leave=False):
        for cache, fn in run.items():
            with Stopwatch(model.device) as watch:
                fn()
            times[cache].append(watch.seconds)
    ratios = {cache: statistics.median(a / b for a, b in zip(times[None], times[cache])) for cache in CACHES[1:]}
    seconds = {str(cache): statistics.median(times[cache]) for cache in CACHES}
    return {
        "batch": batch,
        "seconds": seconds,
        "none_over": ratios,
        "tokens_per_s": {k: batch * 256 / v for k, v in seconds.items()},
    }


@torch.no_grad()
def memory(model) -> dict:
    probe = CacheProbe(model)
    prompt = torch.randint(0, 1000, (8, 64), generator=torch.Generator().manual_seed(0)).to(model.device)
    out = {}
    for cache in CACHES[1:]:
        probe.cache_bytes.clear()
        diffusion_generate(
            probe,
            prompt,
            max_new_tokens=256,
            steps=256,
            block_length=32,
            kv_cache=cache,
            cfg_scale=0.5,
            stop_at_eos=False,
        )
        sizes = probe.cache_bytes
        out[cache] = {"peak_bytes": max(sizes), "forwards": len(sizes), "constant": len(set(sizes)) == 1}
    config = model.config
    out["one_canvas_bytes"] = (
        2 * 8 * 320 * config.effective_n_kv_heads * config.head_dim * config.n_layers * 2 * model.dtype.itemsize
    )  # branches x rows x columns x heads x dim x layers x (k, v)
    return out


def trained(results: Path) -> list[dict]:
    """Forwards per token and generative perplexity of the plain, threshold and entropy-bound samplers on the trained
    2-gram MDM."""
    _, scale = load_scale(CONFIGS / "ter_vs_steps.yaml")
    spec = next(s for s in scale["languages"] if s.get("train"))
    language, length = make_language(spec), scale["train_length"]
    model = trained_pair(language, length, scale, results, "2-gram", spec.get("training"))["mdm"]
    section = {"block_length": 8, "seed": 0}
    samplers = {
        "confidence order, 1 token/step": dict(strategy="confidence"),
        "threshold 0.9 + dual cache": dict(transfer="threshold", threshold=0.9, kv_cache="dual"),
        "entropy bound 0.5 + dual cache": dict(transfer="entropy_bound", entropy_bound=0.5, kv_cache="dual"),
    }
    rows = []
    for name, settings in samplers.items():
        start = time.perf_counter()
        samples, costs = sample_with(model, 512, length, section, settings)
        seconds = time.perf_counter() - start
        gen = gen_ppl_cell(language, samples)
        rows.append(
            {
                "sampler": name,
                "forwards_per_token": costs["forwards_per_token"],
                "gen_ppl_increase": gen["gen_ppl_increase"],
                "ci": [gen["gen_ppl_ci_low"], gen["gen_ppl_ci_high"]],
                "seconds": seconds,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1 on a shared machine)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--results", default="results", help="where make reproduce keeps its trained models")
    parser.add_argument("--skip-trained", action="store_true", help="leave out part 3 (trains a model if needed)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = tiny_llada(args.device, getattr(torch, args.dtype))
    report = {
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads,
        "speed": [speed(model, batch, args.repeats) for batch in args.batches],
        "memory": memory(model),
    }
    if not args.skip_trained:
        report["trained"] = trained(Path(args.results))
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


def print_report(report: dict) -> None:
    print(
        f"[1] tiny LLaDA (4 x 256, vocab 1024) on {report['device']} {report['dtype']}, prompt 64, 256 new tokens, "
        "block 32, 256 steps"
    )
    for row in report["speed"]:
        s, r, t = row["seconds"], row["none_over"], row["tokens_per_s"]
        print(
            f"    batch {row['batch']}: no cache {s['None']:.2f} s ({t['None']:.0f} tok/s), prefix {s['prefix']:.2f} s "
            f"({t['prefix']:.0f} tok/s), dual {s['dual']:.2f} s ({t['dual']:.0f} tok/s)"
        )
        print(
            f"             no cache / dual = {r['dual']:.2f} (target >= 3), no cache / prefix = {r['prefix']:.2f} "
            "(target >= 1.8)"
        )
    memory_ = report["memory"]
    print(f"[2] cache memory (batch 8, guidance): one canvas = {memory_['one_canvas_bytes'] / 2**20:.2f} MiB")
    for cache in CACHES[1:]:
        m = memory_[cache]
        print(
            f"    {cache}: peak {m['peak_bytes'] / 2**20:.2f} MiB over {m['forwards']} forwards, "
            f"{'constant' if m['constant'] else 'GROWS'}"
        )
    for row in report.get("trained", []):
        if row is report["trained"][0]:
            print("[3] trained 2-gram MDM, L = 64, 512 samples, temperature 1, blocks of 8")
        print(
            f"    {row['sampler']:<32} forwards/token {row['forwards_per_token']:.3f}  GenPPL increase "
            f"{100 * row['gen_ppl_increase']:.2f}% [{100 * row['ci'][0]:.2f}, {100 * row['ci'][1]:.2f}]  "
            f"{row['seconds']:.1f} s"
        )


if __name__ == "__main__":
    main()
