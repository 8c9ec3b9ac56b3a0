"""The real-shape timing table of the GPU check: each model at batch 1 and 32, a 256-token prompt and 256 new tokens.

Diffusion models, each row a sampler: the paper's (stochastic transfer, random order, temperature 1), confidence
decoding without a cache, the prefix and dual caches (the exact block cache for the block-causal LLaDA2), threshold
decoding (batch 1; at batch 32 the three cache rows), and on CUDA the same confidence decoding, without and with the
caches, with its forwards compiled into CUDA graphs (``compile_config`` mode ``"reduce-overhead"``, the caches then
static; tokens checked against eager); for LLaDA2 at batch 1 also its published generate()'s loop (no cache,
`hf_mdm.gpu_check.llada2_loop`) against hf_mdm's exact block cache, tokens checked; for LLaDA-8B at batch 1 the dual
cache with int8 and int4 weights (`hf_mdm.quantization.quantize_weights`), eager and on CUDA in CUDA graphs.
Autoregressive baselines: transformers' ``generate``, greedy, with its dynamic cache and with its static cache
(compiled by transformers on CUDA). Every row: a warm-up call (an eager diffusion row's with one step a block: the
same shapes, an eighth of the forwards; a compiled row's the whole call, which compiles), then ``repeats`` timed
calls, device synchronised; tokens/s, ms per forward, NFE, peak memory and the two limits of
`hf_mdm.gpu_check.limits`. Which rows run, in which order, is `hf_mdm.gpu_check.schedule`'s.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from transformers import CompileConfig

from ..timer import Stopwatch
from .limits import forward_work, limit_ratio, limits_ms, model_size, positions
from .llada2_loop import cut_at_eos, published_loop
from .shapes import Shape

__all__ = [
    "Settings",
    "diffusion_call",
    "Row",
    "RowSpec",
    "table_rows",
    "measure_row",
    "skipped_row",
    "first_difference",
    "SAMPLERS",
    "QUANTIZED",
]

SAMPLERS: dict[str, dict[str, Any]] = {
    "paper's sampler (stochastic, random, T=1)": dict(transfer="stochastic", strategy="random", temperature=1.0),
    "confidence, no cache": dict(kv_cache="none"),
    "confidence, prefix cache": dict(kv_cache="prefix"),
    "confidence, dual cache": dict(kv_cache="dual"),
    "threshold 0.9 (adaptive: depends on the weights)": dict(transfer="threshold", threshold=0.9, kv_cache="none"),
}
CACHE_ROWS = {"none": "confidence, no cache", "prefix": "confidence, prefix cache", "dual": "confidence, dual cache"}
CUDA_GRAPHS = {f"{row}, CUDA graphs": cache for cache, row in CACHE_ROWS.items()}  # checked against the eager row
LLADA2_ROWS = {"llada2 preset, exact block cache": "exact", "llada2 published loop (no cache)": "loop"}
AR_ROWS = ("transformers generate, dynamic cache", "transformers generate, static cache")
QUANTIZED = ("int8", "int4")  # weight-only, beside bfloat16
QUANTIZED_ROWS = {"LLaDA-8B": ("confidence, dual cache", "confidence, dual cache, CUDA graphs")}  # at batch 1


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
    group_size: int = 128  # int4's
    deadline: float = float("inf")  # time.monotonic() after which rows are skipped


@dataclass(frozen=True)
class RowSpec:
    """A row to measure: the model, the batch, the sampler, the weights (``"none"``: as built, or one of `QUANTIZED`)
    and whether its forwards compile (the costly rows)."""

    model: str
    batch: int
    sampler: str
    weights: str = "none"  # quantized: "none" or one of QUANTIZED
    compiled: bool = False

    @property
    def cache(self) -> str:
        """The positions its forwards compute, by `hf_mdm.gpu_check.limits.positions`'s names."""
        if self.sampler in LLADA2_ROWS:
            return LLADA2_ROWS[self.sampler]
        if self.sampler in AR_ROWS:
            return "ar"
        sampler = SAMPLERS.get(self.sampler) or SAMPLERS[CACHE_ROWS[CUDA_GRAPHS[self.sampler]]]
        return sampler.get("kv_cache", "none")


@dataclass
class Row:
    model: str
    batch: int
    sampler: str
    weights: str = "none"  # quantized: "none" or one of QUANTIZED
    seconds: Optional[float] = None
    tokens_per_s: Optional[float] = None
    ms_per_forward: Optional[float] = None
    nfe: Optional[int] = None
    peak_memory_gib: Optional[float] = None
    flop_limit_ms: Optional[float] = None  # its FLOPs at limits.PEAK_FLOPS
    byte_limit_ms: Optional[float] = None  # the bytes it must read at limits.PEAK_BANDWIDTH
    limit_ratio: Optional[float] = None  # ms per forward over the larger of the two
    tokens_equal: Optional[bool] = None  # against the row it reproduces (CUDA graphs: eager; published loop: cache)
    note: str = ""
    tokens: Any = field(default=None, repr=False)


def table_rows(shape: Shape, batch: int, cuda: bool) -> list[RowSpec]:
    """``shape``'s rows at ``batch`` in table order; the compiled ones only on CUDA (on the CPU transformers' static
    cache runs eager)."""
    if shape.kind == "ar":
        return [RowSpec(shape.name, batch, name, compiled=cuda and "static" in name) for name in AR_ROWS]
    eager = list(SAMPLERS) if batch == 1 else list(CACHE_ROWS.values())
    specs = [RowSpec(shape.name, batch, name) for name in eager]
    if shape.block_causal and batch == 1:
        specs += [RowSpec(shape.name, batch, name) for name in LLADA2_ROWS]
    specs += [RowSpec(shape.name, batch, name, compiled=True) for name in CUDA_GRAPHS if cuda]
    if batch == 1:
        quantized = [name for name in QUANTIZED_ROWS.get(shape.name, ()) if cuda or name in SAMPLERS]
        specs += [RowSpec(shape.name, batch, name, w, name not in SAMPLERS) for w in QUANTIZED for name in quantized]
    return [s for s in specs if not (shape.block_causal and s.cache == "dual")]  # its exact cache is the prefix one


def skipped_row(spec: RowSpec, why: str) -> Row:
    return Row(spec.model, spec.batch, spec.sampler, spec.weights, note=f"skipped: {why}")


def _timed(settings: Settings, call: Callable[[], Any], warm: Callable[[], Any]) -> tuple[float, Any, Optional[float]]:
    """The ``warm`` call, then the median of ``repeats`` timed ones; the last output; peak memory (GiB, CUDA)."""
    warm()
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


def measure_row(network, shape: Shape, spec: RowSpec, prompt: torch.Tensor, settings: Settings, done: list) -> Row:
    """``spec`` measured on ``network`` (built with ``spec``'s weights) and ``prompt``, its tokens checked against
    the row of ``done`` it reproduces; skipped past the deadline, and "out of memory" where it does not fit."""
    if time.monotonic() > settings.deadline:
        return skipped_row(spec, "time budget")
    call, warm = _calls(network, shape, spec, prompt, settings)
    try:
        seconds, (tokens, nfe), peak = _timed(settings, call, warm)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return Row(spec.model, spec.batch, spec.sampler, spec.weights, note="out of memory")
    ms = 1000 * seconds / max(nfe, 1)
    cache = "exact" if shape.block_causal and spec.cache == "prefix" else spec.cache
    work = forward_work(model_size(network), spec.batch, *positions(cache, *_lengths(settings)))
    row = Row(
        spec.model, spec.batch, spec.sampler, spec.weights, seconds, spec.batch * settings.new_tokens / seconds, ms,
        nfe, peak, *limits_ms(work), limit_ratio(ms, work), tokens=tokens,
    )  # fmt: skip
    _check_tokens(row, spec, done, getattr(network.config, "eos_token_id", None))
    return row


def _lengths(settings: Settings) -> tuple[int, int, int, int]:
    return settings.prompt, settings.new_tokens, settings.block, settings.steps


def _calls(network, shape: Shape, spec: RowSpec, prompt: torch.Tensor, settings: Settings):
    """The timed call of ``spec`` and its warm-up call, each returning (new tokens, NFE)."""
    if spec.sampler in AR_ROWS:
        return _ar_calls(network, prompt, settings, static="static" in spec.sampler)
    if spec.sampler in LLADA2_ROWS:
        call = _llada2_call(network, prompt, settings, loop=LLADA2_ROWS[spec.sampler] == "loop")
        return call, call
    generate = diffusion_call(network, shape, prompt, settings)
    if spec.compiled:
        graphs = CompileConfig(backend="inductor", mode="reduce-overhead", dynamic=False)
        call = generate(kv_cache=spec.cache, compile_forward=True, compile_config=graphs)
        return call, call  # the warm-up compiles every graph the timed call replays
    sampler = SAMPLERS[spec.sampler]
    return generate(**sampler), generate(**dict(sampler, steps=max(settings.new_tokens // settings.block, 1)))


def _check_tokens(row: Row, spec: RowSpec, done: list, eos: Optional[int]) -> None:
    """CUDA graphs against the eager row of the same cache and weights; the published loop against the preset."""
    if spec.compiled and spec.sampler in CUDA_GRAPHS:
        key = (spec.model, spec.batch, CACHE_ROWS[CUDA_GRAPHS[spec.sampler]], spec.weights)
    elif spec.sampler == "llada2 published loop (no cache)":
        key = (spec.model, spec.batch, "llada2 preset, exact block cache", spec.weights)
    else:
        return
    same = next((r for r in done if (r.model, r.batch, r.sampler, r.weights) == key and r.tokens is not None), None)
    if row.tokens is None or same is None:
        return
    if spec.sampler in CUDA_GRAPHS:
        at = first_difference(row.tokens, same.tokens)
        row.tokens_equal = at is None
        row.note = row.note or ("" if at is None else f"first differs at new token {at} of {row.tokens.shape[1]}")
    else:
        row.tokens_equal = cut_at_eos(row.tokens, eos) == cut_at_eos(same.tokens, eos)


def diffusion_call(network, shape: Shape, prompt: torch.Tensor, settings: Settings):
    """``generate(**sampler)``: a call that runs the sampler on ``prompt`` and returns (new tokens, NFE)."""
    base = dict(max_new_tokens=settings.new_tokens, steps=settings.steps, block_length=settings.block, seed=0)
    base.update(stop_at_eos=False, **dict(shape.token_ids))

    def generate(**sampler: Any) -> Callable[[], tuple[Any, int]]:
        def call():
            out = network.generate(prompt, return_dict_in_generate=True, **dict(base, **sampler))
            return out.sequences[:, prompt.shape[1] :].cpu(), int(out.nfe)

        return call

    return generate


def first_difference(a: torch.Tensor, b: torch.Tensor) -> Optional[int]:
    """The first new-token position where any row of ``a`` and ``b`` differ (None when equal)."""
    differ = (a != b).any(dim=0).nonzero()
    return int(differ[0]) if len(differ) else None


def _llada2_call(network, prompt: torch.Tensor, settings: Settings, loop: bool) -> Callable[[], tuple[Any, int]]:
    """LLaDA2's published loop (no cache), or hf_mdm's exact block cache with the published settings (batch 1)."""
    from ..generation_config import MaskedDiffusionGenerationConfig

    published = dict(gen_length=settings.new_tokens, block_length=32, steps=32, threshold=0.95)
    config = MaskedDiffusionGenerationConfig.llada2(**published, return_dict_in_generate=True)

    def cached():
        out = network.generate(prompt, generation_config=config)
        return out.sequences[0, prompt.shape[1] :].cpu(), int(out.nfe)

    def published_call():
        tokens, forwards, _ = published_loop(network, prompt, **published)
        return tokens.cpu(), forwards

    return published_call if loop else cached


def _ar_calls(network, prompt: torch.Tensor, settings: Settings, static: bool):
    """transformers' greedy ``generate``: the timed call and its warm-up (a dynamic cache's with one block of new
    tokens: the same kernels; a static cache's the whole call, whose cache length and compilation it fixes)."""
    common = dict(do_sample=False, pad_token_id=0, **({"cache_implementation": "static"} if static else {}))

    def generate(new_tokens: int) -> Callable[[], tuple[Any, int]]:
        def call():
            out = network.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, **common,
            )  # fmt: skip
            return out[:, prompt.shape[1] :].cpu(), new_tokens

        return call

    timed = generate(settings.new_tokens)
    return timed, timed if static else generate(min(settings.block, settings.new_tokens))
