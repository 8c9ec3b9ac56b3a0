"""hf_mdm beside the ecosystem's own diffusion-LM samplers, on the same model and the same tokens. Part of
``make bench`` (-> ``evaluation/PEERS.md``).

- LLaDA2: diffusers' ``LLaDA2Pipeline`` (``BlockRefinementScheduler``, no KV cache: every forward recomputes the
  canvas up to the current block) against hf_mdm's reproduction of it,
  `MaskedDiffusionGenerationConfig.llada2_pipeline`, without a cache and with the exact block cache (hf_mdm's
  default for a block-causal model: a forward computes the current block only). A random LLaDA2.0 MoE (sizes
  below; its LM head scaled up so that confidences spread and the thresholds matter), float32, blocks of 32 and
  the pipeline's other defaults (32 steps, threshold 0.7, editing 0.5), at two sizes:

  - small: a prompt of 40 tokens (not ending on a block boundary), 128 new tokens, where the cache has little to
    save; the pipeline's defaults at batch 1, editing off at batch 4 (the pipeline's rows of a batch depend on each
    other when editing is on); ``--repeats`` rounds after a warm-up round;
  - large, the size users run (``LARGE``): a prompt of 256 tokens, 512 new tokens, the same model; editing 0.5 at
    batch 1 and off at batch 8; the pipeline and the exact block cache only (hf_mdm without a cache computes the
    whole 768-column canvas at every forward, longer than the pipeline), ``--large-repeats`` rounds (default 2)
    and no warm-up round (the small size's rounds ran the same model). Left out by ``--quick``.
- DiffusionGemma: transformers' own ``DiffusionGemmaForBlockDiffusion.generate`` against hf_mdm's
  `MaskedDiffusionGenerationConfig.diffusion_gemma` (`hf_mdm.generation_uniform`) on the same random model (the
  harness's layout at the sizes below, canvases of 32, LM head scaled up), same seed, 16 denoising steps at most,
  transformers' other defaults, prompt 40 and 128 new tokens, batch 1 and a left-padded batch of 4; forwards and
  positions are the decoder's (the encoder's passes are not counted, as DiffusionGemma does not count them).
  diffusers' ``DiffusionGemmaPipeline`` is not timed: with transformers 5.24 it fails at its first call (it passes
  the cache as ``past_key_values`` where transformers names it ``cache``), and patched it appends the scheduler's
  canvas instead of the argmax, so its tokens are not DiffusionGemma's
  (`tests/generation/test_diffusion_gemma_sampler.py`).

Each row: median seconds over the interleaved rounds, model forwards, positions the forwards computed (rows x input
length, summed), the time ratio to the peer, and whether the tokens equal the peer's (checked on every round).
About 11 minutes on 2 CPU cores with the defaults (most of it the large size's batch of 8 through the
pipeline: three to four minutes a call).

    python evaluation/bench_peers.py [--repeats 3] [--large-repeats 2] [--threads 1] [--output FILE.md] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import interleave, parse_table_arguments, print_and_write  # noqa: E402

from hf_mdm import MaskedDiffusionGenerationConfig  # noqa: E402
from hf_mdm.generation import diffusion_generate  # noqa: E402
from hf_mdm.models import LLaDA2MoeConfig, LLaDA2MoeModelLM  # noqa: E402

SIZES = dict(hidden=256, layers=4, vocab=2048, prompt=40, new=128, head_scale=8.0)
QUICK = dict(hidden=64, layers=2, vocab=256, prompt=12, new=32)
LARGE = dict(prompt=256, new=512)  # LLaDA2 at the size users run (blocks of 32, the pipeline's default)
MASK_OFFSET, EOS_OFFSET = 1, 2  # [MASK] is the last id, EOS the one before


def llada2(args: argparse.Namespace) -> LLaDA2MoeModelLM:
    """A random LLaDA2.0 MoE whose LM head is scaled up (``head_scale``) and whose [MASK] row is zero."""
    torch.manual_seed(0)
    config = LLaDA2MoeConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4,
        num_experts=8, num_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
        moe_intermediate_size=args.hidden // 2, first_k_dense_replace=1, max_position_embeddings=1024,
        mask_token_id=args.vocab - MASK_OFFSET, eos_token_id=args.vocab - EOS_OFFSET, pad_token_id=0, block_size=32,
    )  # fmt: skip
    model = LLaDA2MoeModelLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(args.head_scale)
        model.lm_head.weight[config.mask_token_id] = 0.0
    return model


def llada2_runs(args: argparse.Namespace, model, batch: int, editing: Any, checks: list[bool]) -> dict:
    """The pipeline and hf_mdm's two runs of it at ``batch``; each hf_mdm call appends to ``checks`` whether its
    tokens equal those of the pipeline's call of the same round (which runs first), up to each row's first EOS."""
    from diffusers import BlockRefinementScheduler, LLaDA2Pipeline

    config = model.config
    prompt = torch.randint(1, args.vocab - 2, (batch, args.prompt), generator=torch.Generator().manual_seed(1))
    settings = dict(gen_length=args.new, editing_threshold=editing, eos_token_id=config.eos_token_id)
    pipe = LLaDA2Pipeline(model=model, scheduler=BlockRefinementScheduler(), tokenizer=None)
    pipe.set_progress_bar_config(disable=True)
    latest: list[list[int]] = []

    def pipeline() -> None:
        out = pipe(input_ids=prompt, use_chat_template=False, output_type="seq", mask_token_id=config.mask_token_id,
                   **settings)  # fmt: skip
        latest[:] = [up_to_eos(row, config.eos_token_id) for row in out.sequences.tolist()]

    def hf_mdm(kv_cache: str) -> Callable[[], None]:
        preset = MaskedDiffusionGenerationConfig.llada2_pipeline(**settings, kv_cache=kv_cache, pad_token_id=0)

        def run() -> None:
            rows = model.generate(prompt, generation_config=preset)[:, args.prompt :].tolist()
            checks.append(all(row[: len(ref)] == ref for row, ref in zip(rows, latest)))

        return run

    return {"pipeline": (model, pipeline), "none": (model, hf_mdm("none")), "prefix": (model, hf_mdm("prefix"))}


def up_to_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


LLADA2_RUNS = {
    "pipeline": "diffusers LLaDA2Pipeline (no cache)",
    "none": "hf_mdm llada2_pipeline, no cache",
    "prefix": "hf_mdm llada2_pipeline, exact block cache",
}


def llada2_rows(args: argparse.Namespace) -> list[dict]:
    """The small size's rows (every run; batch 1 and 4), then unless ``--quick`` the large size's (the pipeline and
    the exact block cache; batch 1 and 8), on one model."""
    model, rows = llada2(args), []
    sizes = [(args.prompt, args.new, ((1, 0.5), (4, None)), tuple(LLADA2_RUNS), args.repeats, 1)]
    if not args.quick:
        large = ((1, 0.5), (8, None)), ("pipeline", "prefix"), args.large_repeats, 0
        sizes.append((LARGE["prompt"], LARGE["new"], *large))
    for prompt, new, batches, keys, repeats, warmup in sizes:
        sized = argparse.Namespace(**{**vars(args), "prompt": prompt, "new": new})
        for batch, editing in batches:
            checks: list[bool] = []
            runs = llada2_runs(sized, model, batch, editing, checks)
            series = interleave({key: runs[key] for key in keys}, repeats, warmup=warmup)
            names = {key: LLADA2_RUNS[key] for key in keys}
            size = (prompt, new)
            rows += timed_rows("LLaDA2Pipeline", series, "pipeline", names, batch, editing, all(checks), size)
    return rows


def timed_rows(
    peer: str, series: dict, peer_key: str, names: dict, batch: int, editing: Any, equal: bool, size: tuple
) -> list:
    """One row per run of ``series`` (named by ``names``): the (prompt, new tokens) ``size``, median seconds,
    forwards, positions, the peer's time over the run's, whether the tokens equal the peer's."""
    rows = []
    for key, name in names.items():
        s = series[key]
        rows.append(
            dict(
                peer=peer, run=name, size=size, batch=batch, editing=editing, seconds=s.median,
                forwards=s.calls[0].forwards, positions=s.calls[0].positions,
                ratio=series[peer_key].median / s.median, equal=equal,
            )
        )  # fmt: skip
    return rows


def diffusion_gemma(args: argparse.Namespace):
    """A random DiffusionGemma (the harness's tiny layout at ``hidden`` and ``layers``), canvases of 32, its LM head
    scaled up (``head_scale``, tied to the embeddings) so that entropies spread around the bound."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    from hf_mdm.harness.tiny import TINY_DIFFUSION_GEMMA_TEXT, TINY_VISION

    torch.manual_seed(0)
    text = dict(TINY_DIFFUSION_GEMMA_TEXT, vocab_size=args.vocab, hidden_size=args.hidden, head_dim=args.hidden // 4)
    text.update(global_head_dim=args.hidden // 4, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers)
    text.update(moe_intermediate_size=args.hidden // 2, initializer_range=0.02)
    special = dict(eos_token_id=1, bos_token_id=2, pad_token_id=0)
    config = DiffusionGemmaConfig(
        text_config={**text, **special}, vision_config=TINY_VISION, canvas_length=32, **special
    )
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(args.head_scale)
    return model


def diffusion_gemma_rows(args: argparse.Namespace) -> list[dict]:
    """transformers' generate and hf_mdm's diffusion_gemma preset, same seed, batch 1 and 4 (left-padded)."""
    model, rows = diffusion_gemma(args), []
    settings = dict(max_new_tokens=args.new, max_denoising_steps=16, eos_token_id=1, pad_token_id=0)
    for batch in (1, 4):
        ids = torch.randint(3, args.vocab, (batch, args.prompt), generator=torch.Generator().manual_seed(2))
        mask = torch.ones_like(ids)
        mask[1:, :3] = 0
        ids = ids.masked_fill(mask == 0, 0)
        latest: list[torch.Tensor] = []
        checks: list[bool] = []

        def transformers_generate() -> None:
            torch.manual_seed(0)
            latest[:] = [model.generate(ids, attention_mask=mask, **settings).sequences]

        def hf_mdm() -> None:
            preset = MaskedDiffusionGenerationConfig.diffusion_gemma(**settings)
            ours = diffusion_generate(model, ids, attention_mask=mask, generation_config=preset, seed=0)
            checks.append(torch.equal(ours.sequences, latest[0]))

        decoder = (
            model.model.decoder
        )  # metered: the canvas forwards (the encoder's are not counted, as DiffusionGemma's)
        runs = {"transformers": (decoder, transformers_generate), "hf_mdm": (decoder, hf_mdm)}
        series = interleave(runs, args.repeats, warmup=1)
        names = {"transformers": "transformers DiffusionGemma generate", "hf_mdm": "hf_mdm diffusion_gemma preset"}
        size = (args.prompt, args.new)
        rows += timed_rows("DiffusionGemma generate", series, "transformers", names, batch, None, all(checks), size)
    return rows


def markdown(args: argparse.Namespace, rows: list[dict]) -> str:
    large = f"; {args.large_repeats} without one at {LARGE['prompt']} + {LARGE['new']}"
    large = "" if args.quick else large
    lines = [
        f"# hf_mdm beside its peers, same model, same tokens ({args.repeats} interleaved rounds after a warm-up"
        f"{large}, {args.threads} thread{'s' if args.threads > 1 else ''}, CPU)",
        "",
        f"LLaDA2: random LLaDA2.0 MoE (hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}, 8 experts, "
        f"LM head x{args.head_scale}), float32, blocks of 32, 32 steps, threshold 0.7, the pipeline's defaults. "
        "DiffusionGemma: canvases of 32, 16 denoising steps at most.",
        "",
        "| peer | run | prompt + new | batch | editing | median s | forwards | positions computed | "
        "peer's time / this time | tokens equal the peer's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        editing = "off" if row["editing"] is None else str(row["editing"])
        size = f"{row['size'][0]} + {row['size'][1]}"
        lines.append(
            f"| {row['peer']} | {row['run']} | {size} | {row['batch']} | {editing} | {row['seconds']:.3f} "
            f"| {row['forwards']} | {row['positions']} | {row['ratio']:.2f}x | {'yes' if row['equal'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def parse(argv: Any = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--large-repeats", type=int, default=2, help="timed rounds of LLaDA2 at the large size")
    return parse_table_arguments(parser, argv, repeats=3, sizes=SIZES, quick=QUICK)


def main(argv: Any = None) -> str:
    args = parse(argv)
    rows = llada2_rows(args) + diffusion_gemma_rows(args)
    return print_and_write(markdown(args, rows), args.output)


if __name__ == "__main__":
    main()
