"""Experiment c: MDM vs AR wall-clock as the sequence length grows.

``wallclock`` times the generation of one batch by an MDM at a fixed number of steps and by the same-size AR model
(Llama) decoding with its KV cache, at each length L, with untrained models (the time does not depend on the
weights). With ``dual_cache_blocks`` in the preset, the MDM is also timed with Fast-dLLM's dual KV cache in that
many semi-autoregressive blocks (the same steps; ``hf_mdm.kv_cache``). Each time is the median of ``repeats`` runs, measured with ``hf_mdm.timer.Stopwatch`` (the device
synchronised at both ends). Writes ``wallclock.{json,md,png}``; cells are cached in ``<out>/cache/wallclock.json``
keyed on L, the batch size, the steps and the device type.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from tqdm.auto import tqdm

from ..generation import diffusion_generate
from ..timer import Stopwatch
from .common import CellCache, experiment_result, write_outputs
from .plotting import pyplot, save_figure


@torch.no_grad()
def wallclock(preset: dict, out: Path) -> dict[str, Any]:
    """Run (or resume) the experiment with ``preset`` and write its outputs into ``out``; returns the JSON dict."""
    cache = CellCache(out / "cache" / "wallclock.json")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mdm, ar = untrained_models(preset, device)
    rows = [timing_row(mdm, ar, length, preset, cache, device)
            for length in tqdm(preset["lengths"], desc="wall-clock", leave=False)]
    crossover = crossover_length(rows)
    parameters = {"mdm": sum(p.numel() for p in mdm.parameters()), "ar": sum(p.numel() for p in ar.parameters())}
    result = experiment_result("wallclock", preset, rows, crossover_length=crossover, parameters=parameters)
    steps = preset["mdm_steps"]
    write_outputs(out, "wallclock", result, wallclock_table(result), lambda p: plot_wallclock(rows, steps, p))
    return result


def untrained_models(preset: dict, device: torch.device) -> tuple[Any, Any]:
    """The MDM and the AR model of ``preset["size"]`` for the longest length, seeded, on ``device``, in eval mode."""
    from transformers import LlamaForCausalLM

    from .. import MDMForMaskedDiffusion
    from ..training import ar_config_for, mdm_config_for

    vocab, longest = preset["vocab_size"], max(preset["lengths"])
    torch.manual_seed(0)
    mdm = MDMForMaskedDiffusion(mdm_config_for(vocab, longest, preset["size"])).to(device).eval()
    ar = LlamaForCausalLM(ar_config_for(vocab, longest, preset["size"])).to(device).eval()
    return mdm, ar


def timing_row(mdm: Any, ar: Any, length: int, preset: dict, cache: CellCache, device: torch.device) -> dict:
    """``{"length", "mdm_s", "ar_s", "ar_over_mdm"}``: median seconds per batch of each model at one length."""
    vocab, batch, steps, repeats = preset["vocab_size"], preset["batch_size"], preset["mdm_steps"], preset["repeats"]
    prompt = torch.zeros(batch, 0, dtype=torch.long, device=device)
    bos = torch.full((batch, 1), vocab, dtype=torch.long, device=device)

    def run_mdm() -> None:
        diffusion_generate(mdm, prompt, max_new_tokens=length, steps=steps, transfer="deterministic",
                           strategy="confidence", stop_at_eos=False)

    def run_ar() -> None:
        ar.generate(bos, attention_mask=torch.ones_like(bos), max_new_tokens=length, min_new_tokens=length,
                    do_sample=False, use_cache=True, pad_token_id=vocab, eos_token_id=None)

    cell = cache.get(f"{length}|{batch}|{steps}|{device.type}", lambda: {
        "mdm_s": median_seconds(run_mdm, repeats, device), "ar_s": median_seconds(run_ar, repeats, device)})
    row = {"length": length, **cell, "ar_over_mdm": cell["ar_s"] / cell["mdm_s"]}
    blocks = preset.get("dual_cache_blocks")
    if blocks:
        block_length = -(-length // blocks)

        def run_dual() -> None:
            diffusion_generate(mdm, prompt, max_new_tokens=length, steps=steps, transfer="deterministic",
                               strategy="confidence", stop_at_eos=False, block_length=block_length, kv_cache="dual")

        row["mdm_dual_s"] = cache.get(f"dual|{blocks}|{length}|{batch}|{steps}|{device.type}",
                                      lambda: median_seconds(run_dual, repeats, device))  # fmt: skip
    return row


def median_seconds(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """The median wall-clock of ``repeats`` calls of ``fn``, each timed by a ``Stopwatch`` on ``device``."""
    times = []
    for _ in range(repeats):
        with Stopwatch(device) as watch:
            fn()
        times.append(watch.seconds)
    return statistics.median(times)


def crossover_length(rows: list[dict]) -> Optional[int]:
    """The length from which AR stays slower than the MDM (at that L and every longer one measured), or None when
    AR is not slower at the longest L; rows are ordered by length."""
    crossover = None
    for row in rows:
        crossover = (crossover or row["length"]) if row["ar_s"] > row["mdm_s"] else None
    return crossover


def crossover_sentence(rows: list[dict]) -> str:
    """The crossover in words (`crossover_length`)."""
    crossover = crossover_length(rows)
    if crossover is None:
        return "AR is not slower than the MDM at the longest L measured"
    return f"AR is slower than the MDM at every L from {crossover} on"


def wallclock_table(result: dict) -> str:
    """Markdown: seconds per batch of each model at each L, and a line on the set-up and the crossover."""
    preset, rows = result["preset"], result["rows"]
    dual = "mdm_dual_s" in rows[0]
    lines = [f"| L | MDM, {preset['mdm_steps']} steps (s) | AR with KV cache (s) | AR / MDM |"
             + (f" MDM + dual cache, {preset['dual_cache_blocks']} blocks (s) | AR / (MDM + dual cache) |" if dual else ""),
             "| --- | --- | --- | --- |" + (" --- | --- |" if dual else "")]  # fmt: skip
    lines += [f"| {r['length']} | {r['mdm_s']:.3f} | {r['ar_s']:.3f} | {r['ar_over_mdm']:.2f} |"
              + (f" {r['mdm_dual_s']:.3f} | {r['ar_s'] / r['mdm_dual_s']:.2f} |" if dual else "") for r in rows]
    lines += ["", f"Batch {preset['batch_size']}, {result['machine']}, {result['parameters']['mdm']:,} / "
              f"{result['parameters']['ar']:,} parameters (MDM / AR); medians of {preset['repeats']} runs. "
              + crossover_sentence(rows) + "."]
    return "\n".join(lines) + "\n"


def plot_wallclock(rows: list[dict], steps: int, path: Path) -> None:
    """Seconds per batch against L (log-log), one line per model."""
    fig, ax = pyplot().subplots(figsize=(5, 3.6))
    lengths = [r["length"] for r in rows]
    ax.plot(lengths, [r["mdm_s"] for r in rows], "-o", label=f"MDM, {steps} steps")
    ax.plot(lengths, [r["ar_s"] for r in rows], "-s", label="AR, KV cache")
    if "mdm_dual_s" in rows[0]:
        ax.plot(lengths, [r["mdm_dual_s"] for r in rows], "-^", label=f"MDM + dual cache, {steps} steps")
    ax.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel="seconds per batch", title="Wall-clock vs L")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)
