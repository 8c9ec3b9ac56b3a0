"""Experiment c: MDM vs AR wall-clock as the sequence length grows, as forwards x cost per forward.

``wallclock`` times one batch at each length L of ``preset["lengths"]``: the same-size AR model (Llama) decoding
with its KV cache (L forwards of one new token each), and the MDM at each step count of ``preset["mdm_steps"]``
(the paper's 512) and, with ``equal_ter_from``, at the steps where the trained MDM's TER matched the trained AR's
in that experiment's results (``equal_ter_steps``; Theorem 4.2: those steps do not grow with L). The MDM does
min(N, L) forwards of the whole sequence (steps that would reveal nothing are skipped). With
``dual_cache_blocks``, every MDM setting is timed again with Fast-dLLM's dual KV cache in that many blocks
(``hf_mdm.kv_cache``). The models are untrained: the time does not depend on the weights.

Each row holds the median seconds of ``repeats`` runs (``hf_mdm.timer.Stopwatch``, the device synchronised at both
ends), the forwards of one run (counted by a forward hook) and the milliseconds per forward (their quotient), so a
crossover reads as forwards x cost per forward. Writes ``wallclock.{json,md,png}``; cells are cached in
``<out>/cache/wallclock.json`` keyed on the model, L, the batch size, the steps and the device type.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from tqdm.auto import tqdm

from ..generation import diffusion_generate
from ..timer import Stopwatch
from .common import CellCache, experiment_result, write_outputs
from .plotting import pyplot, save_figure

AR_MODEL = "AR, KV cache"


@torch.no_grad()
def wallclock(preset: dict, out: Path) -> dict[str, Any]:
    """Run (or resume) the experiment with ``preset`` and write its outputs into ``out``; returns the JSON dict."""
    cache = CellCache(out / "cache" / "wallclock.json")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mdm, ar = untrained_models(preset, device)
    equal = equal_ter_steps(out / f"{preset['equal_ter_from']}.json") if preset.get("equal_ter_from") else None
    settings = mdm_settings(preset, equal)
    rows: list[dict] = []
    for length in tqdm(preset["lengths"], desc="wall-clock", leave=False):
        rows += timing_rows(mdm, ar, length, preset, settings, cache, device)
    parameters = {"mdm": sum(p.numel() for p in mdm.parameters()), "ar": sum(p.numel() for p in ar.parameters())}
    crossovers = {s["model"]: crossover_length(rows, s["model"]) for s in settings}
    result = experiment_result(
        "wallclock", preset, rows, crossover_length=crossovers, parameters=parameters, equal_ter=equal
    )
    write_outputs(out, "wallclock", result, wallclock_table(result), lambda p: plot_wallclock(rows, p))
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


def equal_ter_steps(path: Path) -> Optional[dict]:
    """The smallest N at which the trained MDM's TER relative increase is indistinguishable from the trained AR's
    (their 95% intervals overlap) in a ``ter_vs_steps.json``; None when that file is missing. Without such an N,
    the largest N measured, with ``matched`` False."""
    if not path.exists():
        return None
    result = json.loads(path.read_text())
    ar = next(r for r in result["rows"] if r["model"] == "trained AR")
    mdm = sorted(
        (r for r in result["rows"] if r["model"] == "trained MDM" and r["language"] == ar["language"]),
        key=lambda r: r["steps"],
    )
    matched = [r for r in mdm if r["ci_low"] <= ar["ci_high"]]
    pick = matched[0] if matched else mdm[-1]
    return {
        "steps": pick["steps"],
        "matched": bool(matched),
        "language": ar["language"],
        "length": ar["length"],
        "mdm_increase": pick["relative_increase"],
        "mdm_ci": [pick["ci_low"], pick["ci_high"]],
        "ar_increase": ar["relative_increase"],
        "ar_ci": [ar["ci_low"], ar["ci_high"]],
        "num_samples": pick["num_samples"],
    }


def mdm_settings(preset: dict, equal: Optional[dict]) -> list[dict]:
    """The MDM settings to time: ``{"model": label, "steps": N, "dual": bool}``, each step count of
    ``preset["mdm_steps"]`` and the equal-TER one, then each again with the dual cache (``dual_cache_blocks``)."""
    plain = [{"model": f"MDM, {n} steps", "steps": n, "dual": False} for n in preset["mdm_steps"]]
    if equal is not None:
        plain.append({"model": f"MDM, {equal['steps']} steps (TER as AR)", "steps": equal["steps"], "dual": False})
    blocks = preset.get("dual_cache_blocks")
    dual = (
        [{**s, "model": s["model"].replace("MDM", f"MDM + dual cache ({blocks} blocks)"), "dual": True} for s in plain]
        if blocks
        else []
    )
    return plain + dual


def timing_rows(
    mdm: Any, ar: Any, length: int, preset: dict, settings: list[dict], cache: CellCache, device: torch.device
) -> list[dict]:
    """One row per model at one length: AR first, then each MDM setting (``row``)."""
    vocab, batch, repeats, blocks = (preset[k] for k in ("vocab_size", "batch_size", "repeats", "dual_cache_blocks"))
    prompt = torch.zeros(batch, 0, dtype=torch.long, device=device)
    bos = torch.full((batch, 1), vocab, dtype=torch.long, device=device)

    def run_ar() -> None:
        ar.generate(
            bos,
            attention_mask=torch.ones_like(bos),
            max_new_tokens=length,
            min_new_tokens=length,
            do_sample=False,
            use_cache=True,
            pad_token_id=vocab,
            eos_token_id=None,
        )

    def run_mdm(steps: int, dual: bool) -> Callable[[], None]:
        cached = {"block_length": -(-length // blocks), "kv_cache": "dual"} if dual else {}
        return lambda: diffusion_generate(
            mdm,
            prompt,
            max_new_tokens=length,
            steps=steps,
            transfer="deterministic",
            strategy="confidence",
            stop_at_eos=False,
            **cached,
        )

    where = f"{length}|{batch}|{device.type}"
    rows = [row(AR_MODEL, length, length, cache.get(f"ar|{where}", lambda: timed(run_ar, ar, repeats, device)))]
    for s in settings:
        kind = f"dual|{blocks}" if s["dual"] else "mdm"
        cell = cache.get(
            f"{kind}|{s['steps']}|{where}", lambda: timed(run_mdm(s["steps"], s["dual"]), mdm, repeats, device)
        )
        rows.append(row(s["model"], length, s["steps"], cell))
    return rows


def row(model: str, length: int, steps: int, cell: dict) -> dict:
    return {
        "length": length,
        "model": model,
        "steps": steps,
        **cell,
        "ms_per_forward": 1000 * cell["seconds"] / cell["forwards"],
    }


def timed(fn: Callable[[], Any], model: Any, repeats: int, device: torch.device) -> dict:
    """``{"seconds": median of repeats, "forwards": forwards of ``model`` per run}``."""
    calls = []
    hook = model.register_forward_hook(lambda *args: calls.append(1))
    try:
        seconds = median_seconds(fn, repeats, device)
    finally:
        hook.remove()
    return {"seconds": seconds, "forwards": len(calls) / repeats}


def median_seconds(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """The median wall-clock of ``repeats`` calls of ``fn``, each timed by a ``Stopwatch`` on ``device``."""
    times = []
    for _ in range(repeats):
        with Stopwatch(device) as watch:
            fn()
        times.append(watch.seconds)
    return statistics.median(times)


def ar_over(rows: list[dict], model: str) -> dict[int, float]:
    """``{L: AR seconds / model seconds}``: above 1 where AR is slower."""
    ar = {r["length"]: r["seconds"] for r in rows if r["model"] == AR_MODEL}
    return {r["length"]: ar[r["length"]] / r["seconds"] for r in rows if r["model"] == model}


def crossover_length(rows: list[dict], model: str) -> Optional[int]:
    """The length from which AR stays slower than ``model`` (at that L and every longer one measured), or None when
    AR is not slower at the longest L."""
    crossover = None
    for length, ratio in sorted(ar_over(rows, model).items()):
        crossover = (crossover or length) if ratio > 1 else None
    return crossover


def crossover_sentence(rows: list[dict], model: str) -> str:
    """Where AR is slower than ``model``, in words."""
    slower = [length for length, ratio in sorted(ar_over(rows, model).items()) if ratio > 1]
    crossover = crossover_length(rows, model)
    if crossover is not None:
        return f"AR is slower than the {model} at every L from {crossover} on"
    if slower:
        return f"AR is slower than the {model} only at L = {', '.join(map(str, slower))}, not at the longest L"
    return f"AR is faster than the {model} at every L measured"


def equal_ter_sentence(equal: Optional[dict]) -> str:
    """Where the equal-TER steps come from, in words."""
    if equal is None:
        return "No TER results in the output folder: the MDM is not timed at equal-TER steps."
    found = (
        f"N = {equal['steps']} is the smallest N at which the trained MDM's TER relative increase"
        if equal["matched"]
        else f"No N measured brings the trained MDM's TER relative increase to within the 95% "
        f"interval of the trained AR's; N = {equal['steps']}, the largest measured, is timed instead"
    )
    return (
        f"{found} ({100 * equal['mdm_increase']:.2f}%, 95% CI [{100 * equal['mdm_ci'][0]:.2f}%, "
        f"{100 * equal['mdm_ci'][1]:.2f}%]) "
        + ("overlaps the 95% interval of the trained AR's" if equal["matched"] else "against the trained AR's")
        + f" ({100 * equal['ar_increase']:.2f}%, [{100 * equal['ar_ci'][0]:.2f}%, "
        f"{100 * equal['ar_ci'][1]:.2f}%]) on the {equal['language']} at L = {equal['length']}, "
        f"{equal['num_samples']} samples per cell (ter_vs_steps); Theorem 4.2: this N does not grow with L."
    )


def wallclock_table(result: dict) -> str:
    """Markdown: each model's forwards, milliseconds per forward and seconds per batch at each L, then the set-up,
    the equal-TER steps and the crossovers in words."""
    preset, rows = result["preset"], result["rows"]
    lines = ["| L | model | forwards | ms / forward | seconds | AR / model |", "| --- | --- | --- | --- | --- | --- |"]
    ar = {r["length"]: r["seconds"] for r in rows if r["model"] == AR_MODEL}
    for r in rows:
        ratio = "" if r["model"] == AR_MODEL else f"{ar[r['length']] / r['seconds']:.2f}"
        lines.append(
            f"| {r['length']} | {r['model']} | {r['forwards']:g} | {r['ms_per_forward']:.2f} | "
            f"{r['seconds']:.3f} | {ratio} |"
        )
    models = list(dict.fromkeys(r["model"] for r in rows if r["model"] != AR_MODEL))
    lines += [
        "",
        f"Untrained `{preset['size']}` models ({result['parameters']['mdm']:,} / "
        f"{result['parameters']['ar']:,} parameters, MDM / AR), {preset['vocab_size']} tokens, batch "
        f"{preset['batch_size']}, {result['machine']}; medians of {preset['repeats']} runs. The MDM samples "
        "with deterministic transfer by confidence (argmax), AR decodes greedily; forwards are counted per run.",
        "",
        equal_ter_sentence(result.get("equal_ter")),
        "",
    ]
    lines += [f"- {crossover_sentence(rows, m)}." for m in models]
    return "\n".join(lines) + "\n"


def plot_wallclock(rows: list[dict], path: Path) -> None:
    """Two log-log panels against L, one line per model: seconds per batch, and milliseconds per forward."""
    fig, axes = pyplot().subplots(1, 2, figsize=(10, 3.8))
    for model in dict.fromkeys(r["model"] for r in rows):
        own = [r for r in rows if r["model"] == model]
        style = "-s" if model == AR_MODEL else ("--^" if "dual" in model else "-o")
        for ax, key in zip(axes, ("seconds", "ms_per_forward")):
            ax.plot([r["length"] for r in own], [r[key] for r in own], style, label=model, ms=4)
    axes[0].set(ylabel="seconds per batch", title="Wall-clock vs L")
    axes[1].set(ylabel="ms per forward", title="Cost of one forward vs L")
    for ax in axes:
        ax.set(xscale="log", yscale="log", xlabel="sequence length L")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    save_figure(fig, path)
