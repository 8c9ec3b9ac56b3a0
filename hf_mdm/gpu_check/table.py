"""The real-shape timing table of the GPU check: each model at batch 1 and 32, a 256-token prompt and 256 new tokens.

Diffusion models, each row a sampler: the paper's (stochastic transfer, random order, temperature 1), confidence
decoding without a cache, the prefix and dual caches (the exact block cache for the block-causal LLaDA2), threshold
decoding, and on CUDA the same confidence decoding, without and with the caches, with its forwards compiled into
CUDA graphs (``compile_config`` mode ``"reduce-overhead"``, the caches then static; tokens checked against eager); for LLaDA2 at batch 1 also its published generate()'s loop
(no cache, `hf_mdm.gpu_check.llada2_loop`) against hf_mdm's exact block cache, tokens checked. Autoregressive
baselines: transformers' ``generate``, greedy, with its dynamic cache and with its static cache (compiled by
transformers on CUDA). Every row: a warm-up call (and compilation), then ``repeats`` timed calls, device
synchronised; tokens/s, ms per forward, NFE and peak memory. Rows past the time budget are listed as skipped, so the
command ends in its time whatever the device.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from transformers import CompileConfig

from ..timer import Stopwatch
from .llada2_loop import cut_at_eos, published_loop
from .shapes import Shape

__all__ = ["Settings", "Row", "measure_shape", "first_difference", "SAMPLERS"]

SAMPLERS: dict[str, dict[str, Any]] = {
    "paper's sampler (stochastic, random, T=1)": dict(transfer="stochastic", strategy="random", temperature=1.0),
    "confidence, no cache": dict(kv_cache="none"),
    "confidence, prefix cache": dict(kv_cache="prefix"),
    "confidence, dual cache": dict(kv_cache="dual"),
    "threshold 0.9 (adaptive: depends on the weights)": dict(transfer="threshold", threshold=0.9, kv_cache="none"),
}
CACHE_ROWS = {"none": "confidence, no cache", "prefix": "confidence, prefix cache", "dual": "confidence, dual cache"}
CUDA_GRAPHS = {f"{row}, CUDA graphs": cache for cache, row in CACHE_ROWS.items()}  # checked against the eager row


@dataclass
class Settings:
    device: str
    dtype: torch.dtype
    batches: tuple[int, ...] = (1, 32)
    prompt: int = 256
    new_tokens: int = 256
    block: int = 32
    steps: int = 64
    repeats: int = 1
    deadline: float = float("inf")  # time.monotonic() after which rows are skipped


@dataclass
class Row:
    model: str
    batch: int
    sampler: str
    seconds: Optional[float] = None
    tokens_per_s: Optional[float] = None
    ms_per_forward: Optional[float] = None
    nfe: Optional[int] = None
    peak_memory_gib: Optional[float] = None
    tokens_equal: Optional[bool] = None  # against the row it reproduces (CUDA graphs: eager; published loop: cache)
    note: str = ""
    tokens: Any = field(default=None, repr=False)


def _timed(settings: Settings, call: Callable[[], Any]) -> tuple[float, Any, Optional[float]]:
    """A warm-up call, then the median of ``repeats`` timed ones; the last output; peak memory (GiB, CUDA)."""
    call()
    cuda = torch.device(settings.device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, out = [], None
    for _ in range(settings.repeats):
        with Stopwatch(torch.device(settings.device)) as watch:
            out = call()
        times.append(watch.seconds)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    return statistics.median(times), out, peak


def _row(settings: Settings, model: str, batch: int, sampler: str, call: Callable[[], tuple[Any, int]]) -> Row:
    if time.monotonic() > settings.deadline:
        return Row(model, batch, sampler, note="skipped: time budget")
    try:
        seconds, (tokens, nfe), peak = _timed(settings, call)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return Row(model, batch, sampler, note="out of memory")
    return Row(
        model, batch, sampler, seconds, batch * settings.new_tokens / seconds, 1000 * seconds / max(nfe, 1), nfe,
        peak, tokens=tokens,
    )  # fmt: skip


def measure_shape(
    shape: Shape, settings: Settings, batches: tuple[int, ...], graphs: bool, done: list[Row]
) -> list[Row]:
    """One model's rows at ``batches`` (built here, freed after): the eager samplers, or with ``graphs`` the CUDA-graph
    rows, each checked against its eager row in ``done``."""
    if time.monotonic() > settings.deadline:
        return [Row(shape.name, b, "CUDA graphs" if graphs else "all", note="skipped: time budget") for b in batches]
    network = shape.build(settings.dtype, settings.device)
    try:
        rows = []
        for batch in batches:
            generator = torch.Generator(device="cpu").manual_seed(batch)
            vocab = network.config.vocab_size
            prompt = torch.randint(3, min(vocab, 30000) - 2, (batch, settings.prompt), generator=generator)
            prompt = prompt.to(settings.device)
            if graphs:
                rows += _cuda_graph_rows(
                    settings, shape, batch, _diffusion_call(network, shape, prompt, settings), done
                )
            else:
                measure = _diffusion_rows if shape.kind == "diffusion" else _ar_rows
                rows += measure(network, shape, prompt, settings)
        return rows
    finally:
        del network
        if torch.device(settings.device).type == "cuda":
            torch.cuda.empty_cache()


def _diffusion_call(network, shape: Shape, prompt: torch.Tensor, settings: Settings):
    """``generate(**sampler)``: a call that runs the sampler on ``prompt`` and returns (new tokens, NFE)."""
    base = dict(max_new_tokens=settings.new_tokens, steps=settings.steps, block_length=settings.block, seed=0)
    base.update(stop_at_eos=False, **dict(shape.token_ids))

    def generate(**sampler: Any) -> Callable[[], tuple[Any, int]]:
        def call():
            out = network.generate(prompt, return_dict_in_generate=True, **base, **sampler)
            return out.sequences[:, prompt.shape[1] :].cpu(), int(out.nfe)

        return call

    return generate


def _diffusion_rows(network, shape: Shape, prompt: torch.Tensor, settings: Settings) -> list[Row]:
    batch = prompt.shape[0]
    generate = _diffusion_call(network, shape, prompt, settings)
    rows = []
    for name, sampler in SAMPLERS.items():
        if shape.block_causal and sampler.get("kv_cache") == "dual":
            continue  # a block-causal model's cache is the exact prefix cache
        rows.append(_row(settings, shape.name, batch, name, generate(**sampler)))
    if shape.block_causal and batch == 1:
        rows += _llada2_rows(network, shape, prompt, settings)
    return rows


def first_difference(a: torch.Tensor, b: torch.Tensor) -> Optional[int]:
    """The first new-token position where any row of ``a`` and ``b`` differ (None when equal)."""
    differ = (a != b).any(dim=0).nonzero()
    return int(differ[0]) if len(differ) else None


def _cuda_graph_rows(settings: Settings, shape: Shape, batch: int, generate, eager: list[Row]) -> list[Row]:
    """Confidence decoding with its forwards compiled into CUDA graphs, without and with the caches (static there),
    each checked token for token against its eager row."""
    graphs = CompileConfig(backend="inductor", mode="reduce-overhead", dynamic=False)
    rows = []
    for name, cache in CUDA_GRAPHS.items():
        if shape.block_causal and cache == "dual":
            continue
        row = _row(
            settings, shape.name, batch, name, generate(kv_cache=cache, compile_forward=True, compile_config=graphs)
        )
        same = next((r for r in eager if (r.model, r.batch, r.sampler) == (shape.name, batch, CACHE_ROWS[cache])), None)
        if row.tokens is not None and same is not None and same.tokens is not None:
            at = first_difference(row.tokens, same.tokens)
            row.tokens_equal = at is None
            row.note = row.note or ("" if at is None else f"first differs at new token {at} of {row.tokens.shape[1]}")
        rows.append(row)
    return rows


def _llada2_rows(network, shape: Shape, prompt: torch.Tensor, settings: Settings) -> list[Row]:
    """LLaDA2's published loop (no cache) against hf_mdm's exact block cache with the published settings."""
    from ..generation_config import MaskedDiffusionGenerationConfig

    published = dict(gen_length=settings.new_tokens, block_length=32, steps=32, threshold=0.95)
    config = MaskedDiffusionGenerationConfig.llada2(**published, return_dict_in_generate=True)

    def cached():
        out = network.generate(prompt, generation_config=config)
        return out.sequences[0, prompt.shape[1] :].cpu(), int(out.nfe)

    def loop():
        tokens, forwards, _ = published_loop(network, prompt, **published)
        return tokens.cpu(), forwards

    ours = _row(settings, shape.name, 1, "llada2 preset, exact block cache", cached)
    theirs = _row(settings, shape.name, 1, "llada2 published loop (no cache)", loop)
    if ours.tokens is not None and theirs.tokens is not None:
        eos = network.config.eos_token_id
        theirs.tokens_equal = cut_at_eos(ours.tokens, eos) == cut_at_eos(theirs.tokens, eos)
    return [ours, theirs]


def _ar_rows(network, shape: Shape, prompt: torch.Tensor, settings: Settings) -> list[Row]:
    batch = prompt.shape[0]
    common = dict(max_new_tokens=settings.new_tokens, min_new_tokens=settings.new_tokens, do_sample=False)
    common["pad_token_id"] = 0

    def generate(**extra: Any) -> Callable[[], tuple[Any, int]]:
        def call():
            out = network.generate(prompt, attention_mask=torch.ones_like(prompt), **common, **extra)
            return out[:, prompt.shape[1] :].cpu(), settings.new_tokens

        return call

    rows = [_row(settings, shape.name, batch, "transformers generate, dynamic cache", generate())]
    rows.append(
        _row(
            settings, shape.name, batch, "transformers generate, static cache", generate(cache_implementation="static")
        )
    )
    return rows
