"""Threshold decoding against confidence decoding at the same forwards, interleaved (issue 54, item 2).

The first GPU run timed LLaDA-8B's threshold 0.9 row at 39.93 ms a forward against 24.70 ms for confidence, one
call each, while the same run's Dream-7B had threshold faster than confidence (19.06 against 21.91 ms); on the CPU the
threshold step launches the confidence step's operations plus a handful on (B, 32) tensors and reads one value.
So the check times the two without a cache on LLaDA-8B at batch 1, called in turn for ``rounds`` rounds after one
warm-up call each: with random weights no confidence reaches 0.9, so threshold decoding reveals what the
remaining steps need and runs the confidence rows' forwards, and any gap a forward is the step's own.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from ..timer import Stopwatch
from .table import SAMPLERS, Settings, diffusion_call

__all__ = ["Interleaved", "measure_interleaved", "interleaved_lines", "ROUNDS", "COMPARED"]

ROUNDS = 3
#: the table's two rows compared (no cache both, the confidence order both), by their names there
COMPARED: dict[str, dict[str, Any]] = {
    name: SAMPLERS[name] for name in ("confidence, no cache", "threshold 0.9 (adaptive: depends on the weights)")
}


@dataclass
class Interleaved:
    model: str
    rounds: int
    ms_per_forward: dict[str, list[float]] = field(default_factory=dict)  # sampler -> one value a round
    nfe: dict[str, int] = field(default_factory=dict)

    def median_ms(self, sampler: str) -> float:
        return statistics.median(self.ms_per_forward[sampler])


@torch.no_grad()
def measure_interleaved(network, shape, prompt: torch.Tensor, settings: Settings, rounds: int = ROUNDS) -> Interleaved:
    """``rounds`` rounds of one call of each of `COMPARED` on ``network`` (``shape``'s) and ``prompt``, after a
    warm-up call each (one step a block, as the table's rows warm up); ms a forward of each call (device-synchronised
    timers)."""
    generate = diffusion_call(network, shape, prompt, settings)
    calls = {name: generate(**sampler) for name, sampler in COMPARED.items()}
    blocks = max(settings.new_tokens // settings.block, 1)
    for sampler in COMPARED.values():  # the same shapes, one step a block
        generate(**dict(sampler, steps=blocks))()
    result = Interleaved(shape.name, rounds, {name: [] for name in calls})
    for _ in range(rounds):
        for name, call in calls.items():
            with Stopwatch(settings.device) as watch:
                _, nfe = call()
            result.ms_per_forward[name].append(1000 * watch.seconds / max(nfe, 1))
            result.nfe[name] = nfe
    return result


def interleaved_lines(measured: list[Interleaved]) -> list[str]:
    """The report's section: each round's ms a forward and the medians' ratio."""
    if not measured:
        return []
    lines = [
        "",
        "Threshold 0.9 against confidence, no cache, batch 1, called in turn after a warm-up call each "
        "(`hf_mdm.gpu_check.adaptive`): ms a forward of each round.",
        "",
        "| model | sampler | NFE | ms / forward, each round | median | threshold / confidence |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    confidence, threshold = COMPARED
    for m in measured:
        ratio = m.median_ms(threshold) / m.median_ms(confidence)
        for name in COMPARED:
            rounds = ", ".join(f"{ms:.2f}" for ms in m.ms_per_forward[name])
            last = f"{ratio:.2f}" if name == threshold else ""
            lines.append(f"| {m.model} | {name} | {m.nfe[name]} | {rounds} | {m.median_ms(name):.2f} | {last} |")
    return lines
