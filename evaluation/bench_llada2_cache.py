"""LLaDA2's exact block cache against the published generate()'s loop: positions computed and wall time, in one run.

Under LLaDA2's block-causal attention a completed block never changes, so its keys/values can be computed once:
hf_mdm's ``kv_cache="prefix"`` (the default for LLaDA2) runs the canvas once and then, per forward, only the current
block (on a block's first forward also the block before it). The published generate() runs, every forward, the
whole canvas up to the end of the current block. Both reveal the same tokens (checked here on every repeat).

A random LLaDA2 architecture (``LLaDA2MoeModelLM``, sizes below, float32 on the CPU unless ``--device``), a random
prompt, ``MaskedDiffusionGenerationConfig.llada2`` with the published defaults but ``gen_length``: the published
loop (re-stated below on the same model, no cache) and hf_mdm's cached sampler timed A/B interleaved after a warm-up,
``--repeats`` times; medians and their ratio. Measured on a shared CPU, one thread (JSON fields abridged):
prompt 64, gen_length 128: 128 forwards, positions 18432 vs 4352 (4.2x), median 4.32 s vs 2.27 s (1.9x);
``--prompt 256 --gen-length 512``: 512 forwards, positions 270336 vs 17600 (15.4x), 44.9 s vs 8.87 s (5.1x).

    python evaluation/bench_llada2_cache.py [--repeats 3] [--threads 1] [--prompt 64] [--gen-length 128]
        [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hf_mdm import MaskedDiffusionGenerationConfig
from hf_mdm.gpu_check.llada2_loop import cut_at_eos, published_loop
from hf_mdm.models import LLaDA2MoeConfig, LLaDA2MoeModelLM

SIZES = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=16,
    num_shared_experts=1,
    num_experts_per_tok=4,
    n_group=4,
    topk_group=2,
    moe_intermediate_size=128,
    first_k_dense_replace=1,
    max_position_embeddings=4096,
    initializer_range=0.1,
    mask_token_id=4095,
    eos_token_id=4094,
    pad_token_id=0,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: a CPU shared with other work)")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--gen-length", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = LLaDA2MoeModelLM(LLaDA2MoeConfig(**SIZES)).eval().to(args.device)
    prompt = torch.randint(1, SIZES["vocab_size"] - 2, (1, args.prompt), device=args.device)
    settings = dict(gen_length=args.gen_length, block_length=32, steps=32, threshold=0.95)
    config = MaskedDiffusionGenerationConfig.llada2(**settings, return_dict_in_generate=True)

    def cached():
        return model.generate(prompt, generation_config=config)

    def published():
        return published_loop(model, prompt, **settings)

    def timed(run):
        if args.device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = run()
        if args.device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - start, result

    cached(), published()  # warm-up
    times = {"published_no_cache": [], "hf_mdm_exact_cache": []}
    for _ in range(args.repeats):  # A/B interleaved
        seconds, (tokens, forwards, positions) = timed(published)
        times["published_no_cache"].append(seconds)
        seconds, out = timed(cached)
        times["hf_mdm_exact_cache"].append(seconds)
        generated = out.sequences[0, args.prompt :]
        eos_id = SIZES["eos_token_id"]
        assert cut_at_eos(generated, eos_id) == cut_at_eos(tokens, eos_id), "the cache changed the tokens"
        assert out.nfe == forwards, (out.nfe, forwards)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = dict(
        device=str(args.device),
        threads=args.threads,
        prompt=args.prompt,
        **settings,
        forwards=forwards,
        positions={"published_no_cache": positions, "hf_mdm_exact_cache": out.forward_tokens},
        positions_ratio=positions / out.forward_tokens,
        median_seconds=medians,
        wall_time_ratio=medians["published_no_cache"] / medians["hf_mdm_exact_cache"],
        repeats=args.repeats,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
