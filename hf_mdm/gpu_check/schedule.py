"""The plan of ``make gpu-check``: what it runs, in which order, and how long each part should take on one H200.

The work, in order (`plan`): every model's eager rows at batch 1 (`TARGET_MODEL`'s followed by threshold decoding
against confidence decoding, interleaved: `hf_mdm.gpu_check.adaptive`), then at the other batch sizes, then the eager
quantized rows, then the compiled rows that carry the targets (`TARGET_MODEL`'s at batch 1: CUDA graphs for each
cache, bf16 and quantized), batch invariance, serving, and last the other costly rows, whose forwards compile (CUDA
graphs, transformers' static cache), then the CUDA tests. A compiled row keeps its model built for the compiled
rows after it (same model, same weights), so its compiled forwards, kept on the model
(`hf_mdm.generation_denoiser.compiled_forward`), serve every later row of the same shape; `compile_caches` gives
inductor an on-disk cache (FX graph and autograd caches) shared with the CUDA tests' process, and raises dynamo's
recompile limit so a model's graphs for its caches and batch sizes do not exhaust it. Each part has an estimated
cost (`estimate`); the plan keeps, in order, what fits the budget (8 minutes by default) and drops the rest, named;
while running, a part is skipped when its estimate would take it past the deadline.

The costs (seconds, one H200, bfloat16, random weights): the ms a forward `MEASURED` in ``results/gpu/`` where a
row was measured (LLaDA-8B and Dream-7B at batch 1); everything else is an estimate, and says so in the plan:

- a model never measured: the measured model of its shape and depth (`SAME_SHAPE`), or `ASSUMED_FORWARD_MS`;
- batch > 1: the batch-1 time or the nearer limit of `hf_mdm.gpu_check.limits` at `ASSUMED_EFFICIENCY`, the larger;
- compilation: `COMPILE_S_PER_GRAPH`, derived from the first runs (their two CUDA-graph rows, 8 graphs each before
  dynamo's recompile limit, ended past the budget: at least ~190 s for 16 graphs of LLaDA-8B, ~160 s for Dream-7B), at
  `GRAPHS_PER_ROW` graphs a row (issue 54: at most 3 a model and cache kind with static shapes);
- building a model with random weights, quantizing it, the CUDA tests: the `ASSUMED` constants.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from .adaptive import COMPARED, ROUNDS
from .limits import ModelSize, forward_work, limits_ms, model_size, positions
from .serving import SERVED_MODELS
from .shapes import Shape
from .table import RowSpec, Settings, table_rows

__all__ = ["Item", "Schedule", "plan", "estimate", "compile_caches", "MEASURED", "BUDGET_S"]

BUDGET_S = 480.0  # 8 minutes: what one H200 session leaves for the check once the machine has started
RESULTS = "results/gpu/gpu_check.json, gpu_check_second_run.json"
MEASURED: dict[tuple[str, str], float] = {  # ms a forward, batch 1, bfloat16, 64 forwards (RESULTS)
    ("LLaDA-8B", "paper's sampler (stochastic, random, T=1)"): 25.59,
    ("LLaDA-8B", "confidence, no cache"): 24.70,
    ("LLaDA-8B", "confidence, prefix cache"): 30.64,
    ("LLaDA-8B", "confidence, dual cache"): 25.27,
    ("LLaDA-8B", "threshold 0.9 (adaptive: depends on the weights)"): 39.93,
    ("LLaDA-8B", "confidence, no cache, CUDA graphs"): 17.26,
    ("LLaDA-8B", "confidence, prefix cache, CUDA graphs"): 22.14,
    ("Dream-7B", "paper's sampler (stochastic, random, T=1)"): 19.20,
    ("Dream-7B", "confidence, no cache"): 21.91,
    ("Dream-7B", "confidence, prefix cache"): 21.80,
    ("Dream-7B", "confidence, dual cache"): 22.19,
    ("Dream-7B", "threshold 0.9 (adaptive: depends on the weights)"): 19.06,
    ("Dream-7B", "confidence, no cache, CUDA graphs"): 15.90,
    ("Dream-7B", "confidence, prefix cache, CUDA graphs"): 19.09,
}
SAME_SHAPE = {"Qwen2.5-7B": "Dream-7B", "Llama-3-8B": "LLaDA-8B"}  # a host-bound forward: same layers, same widths
ASSUMED_FORWARD_MS = {"LLaDA2.0-mini": 40.0}  # 20 mixture-of-experts layers: more operations a layer than LLaDA's
ASSUMED_EFFICIENCY = 0.5  # share of the nearer limit an eager forward reaches once the batch makes it bound by it
COMPILE_S_PER_GRAPH = 12.0  # derived lower bound (module docstring)
GRAPHS_PER_ROW = {"diffusion": 3, "ar": 2}  # ar: transformers compiles its decoding step (and the prompt's forward)
GRAPH_SPEEDUP = 17.26 / 24.70  # CUDA graphs over eager, LLaDA-8B's no-cache rows (RESULTS)
ASSUMED_QUANTIZED_SLOWDOWN = 1.25  # an eager weight-only forward: dequantizing operations on a host-bound forward
ASSUMED_BUILD_S_PER_BILLION = 0.6  # random initialisation on the GPU and Python's side of building the model
ASSUMED_QUANTIZE_S_PER_BILLION = 1.5
ASSUMED_CUDA_TESTS_S = 90.0  # the first run stopped them at 90 s (cold caches); warm they took 25.9 s (RESULTS)
#: The model whose batch-1 compiled rows carry issue 54's targets (dual cache with CUDA graphs <= 6 ms a forward, no
#: cache <= 13 ms, int4 dual faster than bf16): they run right after the eager rows, before invariance and serving.
TARGET_MODEL = "LLaDA-8B"
LLADA2_FORWARDS = 256  # its published settings: 32 steps for each of 8 blocks; random weights rarely reach 0.95


@dataclass(frozen=True)
class Item:
    """A part of the check: a table row (``spec``), one model's batch invariance, serving ``count`` concurrent
    requests of one model, or the CUDA tests."""

    kind: str  # "row", "adaptive" (threshold against confidence: `hf_mdm.gpu_check.adaptive`), "invariance",
    # "serving", "cuda tests"
    model: str = ""
    spec: Optional[RowSpec] = None
    count: int = 0

    @property
    def costly(self) -> bool:
        return self.spec is not None and self.spec.compiled

    @property
    def builds(self) -> Optional[tuple[str, str]]:
        """The model and weights a row keeps built for the next row; None: the part builds its own."""
        return (self.spec.model, self.spec.weights) if self.spec is not None else None

    def label(self) -> str:
        if self.kind == "adaptive":
            return f"{self.model}, batch 1, threshold 0.9 against confidence, interleaved ({ROUNDS} rounds)"
        if self.spec is not None:
            weights = "" if self.spec.weights == "none" else f", {self.spec.weights}"
            return f"{self.spec.model}, batch {self.spec.batch}, {self.spec.sampler}{weights}"
        if self.kind == "serving":
            return f"serving {self.model}, {self.count} concurrent"
        return f"{self.kind} {self.model}".strip()


@dataclass
class Planned:
    item: Item
    seconds: float  # estimated, a build included where the item builds its model
    basis: str  # "measured ..." or "estimate ..."
    planned: bool


@dataclass
class Schedule:
    budget_s: float
    entries: list[Planned] = field(default_factory=list)

    @property
    def planned(self) -> list[Planned]:
        return [e for e in self.entries if e.planned]

    @property
    def dropped(self) -> list[Planned]:
        return [e for e in self.entries if not e.planned]

    @property
    def total_s(self) -> float:
        return sum(e.seconds for e in self.planned)

    def lines(self) -> list[str]:
        """The plan as a markdown table: every part, its estimate and basis, planned or dropped."""
        lines = [
            f"Plan: {len(self.planned)} parts in an estimated {self.total_s:.0f} s of a {self.budget_s:.0f} s budget; "
            f"{len(self.dropped)} left out (they would not fit). Estimates for one H200; 'measured' where "
            f"{RESULTS} timed the row.",
            "",
            "| # | part | estimated s | basis | planned |",
            "| --- | --- | --- | --- | --- |",
        ]
        for n, e in enumerate(self.entries, 1):
            planned = "yes" if e.planned else "no: past the budget"
            lines.append(f"| {n} | {e.item.label()} | {e.seconds:.1f} | {e.basis} | {planned} |")
        return lines


def items(shapes: list[Shape], settings: Settings, cuda: bool) -> list[Item]:
    """Every part of the check in the order it runs (the module docstring)."""
    specs = [s for b in settings.batches for shape in shapes for s in table_rows(shape, b, cuda)]
    eager = [s for s in specs if not s.compiled]
    first = [s for s in eager if s.batch == settings.batches[0] and s.weights == "none"]
    rest = [s for s in eager if s.batch != settings.batches[0] and s.weights == "none"]
    quantized = [s for s in eager if s.weights != "none"]
    order = {shape.name: n for n, shape in enumerate(shapes)}
    compiled = sorted((s for s in specs if s.compiled), key=lambda s: (order[s.model], s.weights != "none", s.batch))
    targets = [s for s in compiled if s.model == TARGET_MODEL and s.batch == settings.batches[0]]
    counts = (1, 3) if settings.prompt < 256 else (1, 8, 32)
    parts = [Item("row", s.model, s) for s in first]
    if any(shape.name == TARGET_MODEL for shape in shapes):  # after its batch-1 rows: the model is still built
        at = max(n for n, part in enumerate(parts) if part.model == TARGET_MODEL) + 1
        parts.insert(at, Item("adaptive", TARGET_MODEL, RowSpec(TARGET_MODEL, 1, "confidence, no cache")))
    parts += [Item("row", s.model, s) for s in rest + quantized + targets]
    parts += [Item("invariance", shape.name) for shape in shapes if shape.kind == "diffusion"]
    parts += [Item("serving", shape.name, count=n) for shape in shapes if shape.name in SERVED_MODELS for n in counts]
    parts += [Item("row", s.model, s) for s in compiled if s not in targets]
    return parts + [Item("cuda tests")]


def plan(
    shapes: list[Shape],
    settings: Settings,
    cuda: bool = True,
    budget_s: float = BUDGET_S,
    cost: Optional[Callable[[Item, bool], tuple[float, str]]] = None,
) -> Schedule:
    """The parts of `items` with their costs (``cost(item, builds)``: seconds and basis, ``builds`` whether the item
    builds its model; default `estimate`), each kept while the planned total stays within ``budget_s``."""
    if cost is None:
        sizes = {shape.name: model_size(shape.build(torch.bfloat16, "meta")) for shape in shapes}
        kinds = {shape.name: shape.kind for shape in shapes}

        def cost(item: Item, builds: bool) -> tuple[float, str]:
            return estimate(item, builds, settings, sizes, kinds)

    schedule, clock, built = Schedule(budget_s), 0.0, None
    for item in items(shapes, settings, cuda):
        seconds, basis = cost(item, item.builds is None or item.builds != built)
        fits = clock + seconds <= budget_s
        schedule.entries.append(Planned(item, seconds, basis, fits))
        if fits:
            clock, built = clock + seconds, item.builds
    return schedule


def _eager_ms(model: str, sampler: str) -> float:
    """ms a batch-1 eager bfloat16 forward: measured, the measured model of the same shape's, or assumed."""
    same = (SAME_SHAPE.get(model, model), "confidence, no cache")
    return MEASURED.get((model, sampler)) or MEASURED.get(same) or ASSUMED_FORWARD_MS[model]


def _ms(spec: RowSpec, size: ModelSize, settings: Settings) -> tuple[float, bool]:
    """ms a forward of ``spec`` and whether measured: at batch 1 `MEASURED` or derived from `_eager_ms`; with more
    rows the batch-1 time or the nearer limit at `ASSUMED_EFFICIENCY`, the larger."""
    measured = spec.weights == "none" and (spec.model, spec.sampler) in MEASURED
    if measured:
        ms = MEASURED[(spec.model, spec.sampler)]
    else:
        ms = _eager_ms(spec.model, spec.sampler.removesuffix(", CUDA graphs"))
        ms *= GRAPH_SPEEDUP if spec.compiled else ASSUMED_QUANTIZED_SLOWDOWN if spec.weights != "none" else 1.0
    if spec.batch > 1:
        lengths = settings.prompt, settings.new_tokens, settings.block, settings.steps
        bound = max(limits_ms(forward_work(size, spec.batch, *positions(spec.cache, *lengths))))
        ms, measured = max(ms, bound / ASSUMED_EFFICIENCY), False
    return ms, measured


def _row_seconds(spec: RowSpec, size: ModelSize, kind: str, settings: Settings) -> tuple[float, str]:
    """A row's warm-up (and compilation) and timed calls, as `hf_mdm.gpu_check.table` runs them."""
    ms, measured = _ms(spec, size, settings)
    if spec.cache == "ar":
        forwards, warm = settings.new_tokens, 1.0 if spec.compiled else settings.block / settings.new_tokens
    elif "llada2" in spec.sampler:
        forwards, warm = LLADA2_FORWARDS, 1.0
    else:
        forwards, warm = (
            settings.steps,
            1.0 if spec.compiled else (settings.new_tokens // settings.block) / settings.steps,
        )
    compile_s = GRAPHS_PER_ROW[kind] * COMPILE_S_PER_GRAPH if spec.compiled else 0.0
    basis = ("measured ms/forward" if measured else "estimate") + (", compiles" if spec.compiled else "")
    return compile_s + (warm + settings.repeats) * forwards * ms / 1000, basis


def _section_seconds(item: Item, size: ModelSize, settings: Settings) -> float:
    """Batch invariance (8 rows alone and batched: a forward and a generate call each) or serving ``count``
    requests (a warm-up, the batched call, the joined calls), every call of ``settings.steps`` forwards."""
    batch = 8 if item.kind == "invariance" else item.count
    ms = {n: _ms(RowSpec(item.model, n, "confidence, no cache"), size, settings)[0] for n in (1, batch)}
    if item.kind == "invariance":
        return (8 * ms[1] + ms[8]) * (settings.steps + 1) / 1000
    return 3 * settings.steps * ms[batch] / 1000


def estimate(
    item: Item, builds: bool, settings: Settings, sizes: dict[str, ModelSize], kinds: dict[str, str]
) -> tuple[float, str]:
    """Seconds of ``item`` on one H200 (its model's build and quantization when ``builds``) and its basis."""
    if item.kind == "cuda tests":
        return ASSUMED_CUDA_TESTS_S, "estimate (cold caches)"
    size = sizes[item.model]
    quantized = item.spec is not None and item.spec.weights != "none"
    per_billion = ASSUMED_BUILD_S_PER_BILLION + (ASSUMED_QUANTIZE_S_PER_BILLION if quantized else 0.0)
    build = per_billion * size.parameters / 1e9 if builds else 0.0
    if item.kind == "adaptive":  # a warm-up call of one step a block, then the rounds, of each sampler
        ms = [_eager_ms(item.model, name) for name in COMPARED]
        blocks = settings.new_tokens // settings.block
        return build + sum((blocks + ROUNDS * settings.steps) * m for m in ms) / 1000, "measured ms/forward"
    if item.spec is None:
        return build + _section_seconds(item, size, settings), "estimate"
    seconds, basis = _row_seconds(item.spec, size, kinds[item.model], settings)
    return build + seconds, basis


def compile_caches(cache_dir: Path) -> dict[str, str]:
    """Inductor's on-disk caches under ``cache_dir`` for this process and the CUDA tests' (environment variables:
    set only where not set already), and dynamo's recompile limit raised to 64; returns what it set."""
    settings = {
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }
    for name, value in settings.items():
        os.environ.setdefault(name, value)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 1024)
    return {name: os.environ[name] for name in settings} | {"recompile_limit": "64"}
