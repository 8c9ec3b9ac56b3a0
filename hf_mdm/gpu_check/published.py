"""Published speed figures of other diffusion-LM inference systems, with their settings, beside the check's rows.

Their settings differ from the check's in every respect that sets speed (trained weights that make tokens confident,
so threshold decoding reveals many a step; other lengths, tasks, GPUs and GPU counts), so the table puts the numbers
side by side and compares nothing: our rows are random weights at a fixed 64 steps for 256 new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .table import Row

__all__ = ["Published", "PUBLISHED", "published_lines"]


@dataclass(frozen=True)
class Published:
    system: str
    source: str
    figure: str
    settings: str
    ours: str  # the model of the check set beside it


PUBLISHED = (
    Published(
        "Fast-dLLM", "arXiv 2505.22618", "up to 27.6x end-to-end throughput over LLaDA's generate",
        "LLaDA-8B, prefix/dual cache + confidence-threshold parallel decoding, 1,024 generated tokens, GSM8K, one A100",
        "LLaDA-8B",
    ),
    Published(
        "dInfer", "arXiv 2510.08666", "over 1,100 tokens/s",
        "LLaDA-MoE (7B total, ~1B active), HumanEval, batch 1, 8 H800s", "LLaDA2.0-mini",
    ),
    Published(
        "SGLang dLLM", "SGLang's diffusion-LM serving path", "426 tokens/s",
        "LLaDA2.1-mini, one concurrent request, one B200", "LLaDA2.0-mini",
    ),
)  # fmt: skip


def _fastest(rows: list[Row], model: str) -> Optional[Row]:
    timed = [r for r in rows if r.model == model and r.batch == 1 and r.tokens_per_s]
    return max(timed, key=lambda r: r.tokens_per_s) if timed else None


def _beside(rows: list[Row], model: str) -> str:
    """Our fastest batch-1 row of ``model``, and its speed over the same model's confidence row without a cache."""
    best = _fastest(rows, model)
    if best is None:
        return "not measured in this run"
    base = next((r for r in rows if (r.model, r.batch, r.sampler, r.weights) == (model, 1, "confidence, no cache", "none")), None)  # fmt: skip
    over = f", {best.tokens_per_s / base.tokens_per_s:.2f}x the no-cache row" if base and base.tokens_per_s else ""
    weights = "" if best.weights == "none" else f", {best.weights}"
    return f"{best.tokens_per_s:.1f} tokens/s ({model}, {best.sampler}{weights}{over})"


def published_lines(rows: list[Row]) -> list[str]:
    """The published figures with their settings, our fastest batch-1 row of the nearest model beside each."""
    lines = [
        "",
        "Published figures, their settings named, beside this run's fastest batch-1 row of the nearest model (random "
        "weights, 256 new tokens in 64 steps): the settings differ (trained weights, lengths, tasks, GPUs), so the "
        "numbers sit side by side and are not a comparison.",
        "",
        "| system | source | figure | their settings | this run |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in PUBLISHED:
        lines.append(f"| {p.system} | {p.source} | {p.figure} | {p.settings} | {_beside(rows, p.ours)} |")
    return lines
