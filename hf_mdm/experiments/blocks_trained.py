"""Trained block diffusion beside the paper's MDM and the AR baseline: quality against steps, time against L.

Part of the ``block_diffusion`` experiment (`hf_mdm.experiments.blocks` measures the exact oracle). Its scale's
``trained`` section:

- quality: per language, an AR model, the bidirectional MDM (b = L) and one block diffusion model per entry of
  ``block_sizes`` (block-causal attention, BD3-LM's objective), all of one size, trained on the same seeded sample
  of the language at ``length``; each diffusion model sampled with the paper's sampler block by block (its own
  block size, the exact block cache) at each of ``steps_per_block``; SER and generative perplexity (the samples scored
  by the language, not the paper's TER) with 95% intervals and the costs of
  `hf_mdm.experiments.blocks` (sequential forwards and positions computed per token).
- time (``timing``): untrained models of one size at each length of ``lengths``, one sequence from the empty prompt:
  AR with its KV cache (one forward per token), the MDM and each block size revealing each of ``tokens_per_forward``
  tokens a forward, median seconds of
  interleaved repeats after a warm-up, with the forwards counted.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from ..generation import diffusion_generate
from .block_cells import AR, PAPER_SAMPLER, ar_cell, block_sizes, measure, model_label
from .common import CellCache, language_name, make_language, trained_model, training_steps
from .decoding import exact_nll
from .speed import ar_over, ar_run, timed_together, untrained_models


def trained_rows(section: dict, out: Path, cache: CellCache) -> list[dict]:
    """Rows of the trained models on every language of ``section`` (see the module's docstring)."""
    length, rows = section["length"], []
    for entry in section["languages"]:
        spec = {k: v for k, v in entry.items() if k != "training"}
        language, name = make_language(spec), language_name(spec)
        models = _models(language, name, section, out, entry.get("training"))
        ar = cache.get(_key("ar", name, section, entry), lambda: ar_cell(models(None)["ar"], language, section))
        rows.append({"language": name, "length": length, "model": AR, "block_size": 1, "steps": length, **ar})
        for block in block_sizes(section):
            for per_block in sorted({min(s, block) for s in section["steps_per_block"]}):
                settings = {**PAPER_SAMPLER, "steps_per_block": per_block}
                cell = cache.get(
                    _key(f"b{block}|{per_block}", name, section, entry),
                    lambda: measure(models(block)["mdm"], language, length, block, settings, section),
                )
                rows.append({"language": name, "length": length, "model": model_label(block, length), **cell})
        rows += _validation(models, language, name, section, cache, entry)
    return rows


def _models(language: Any, name: str, section: dict, out: Path, overrides: dict | None) -> Callable:
    """``models(block)``: the trained AR (block None), MDM (block L) or block diffusion model, trained on first use."""
    length, loaded = section["length"], {}

    def models(block: int | None) -> dict:
        if block not in loaded:
            kind = "ar" if block is None else "mdm"
            extra = {} if block in (None, length) else {"block_size": block}
            loaded[block] = trained_model(kind, language, length, section, out, name, {**(overrides or {}), **extra})
        return loaded[block]

    return models


def _key(what: str, language: str, section: dict, entry: dict) -> str:
    """A cell's cache key: what it measures, the language, and a hash of the settings it depends on."""
    settings = [section["length"], section["num_samples"], section.get("seed", 0), section["training"], entry]
    described = json.dumps(settings, sort_keys=True, default=dict)
    return f"trained|{what}|{language}|{hashlib.sha1(described.encode()).hexdigest()[:12]}"


def _validation(models: Callable, language: Any, name: str, section: dict, cache: CellCache, entry: dict) -> list[dict]:
    """Per model, the validation NLL per token (for diffusion models the ELBO's bound) over the entropy, minus 1, and
    the exact NLL of one decoding law, one token a step left to right (AR: its own), on held-out sequences."""
    rows = []
    for block in [None, *block_sizes(section)]:
        kind = "ar" if block is None else "mdm"
        label = AR if block is None else model_label(block, section["length"])

        def cell() -> dict:
            trained = models(block)
            exact = exact_nll(kind, trained[kind], language, section, section.get("seed", 0))
            return {"nll": float(trained[f"{kind}_nll"]), "gap": float(trained[f"{kind}_gap"]), **exact}

        cell = cache.get(_key(f"validation2|{block}", name, section, entry), cell)
        rows.append({"language": name, "length": section["length"], "model": label, "validation": True, **cell})
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Time against L


def timing_rows(timing: dict, cache: CellCache) -> list[dict]:
    """Median seconds and forwards of one sequence per model at each length (see the module's docstring)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    scale = {"vocab_size": timing["vocab_size"], "lengths": timing["lengths"], "size": timing["size"]}
    mdm, ar = untrained_models(scale, device)
    described = hashlib.sha1(json.dumps(timing, sort_keys=True, default=dict).encode()).hexdigest()[:12]
    rows, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # one thread on a CPU: on a shared machine more threads time their contention
    try:
        for length in tqdm(timing["lengths"], desc="block diffusion wall-clock", leave=False):
            rows += cache.get(
                f"timing2|{length}|{device.type}|{described}", lambda: _time_length(mdm, ar, length, timing, device)
            )
    finally:
        torch.set_num_threads(threads)
    return rows


def _time_length(mdm: Any, ar: Any, length: int, timing: dict, device: torch.device) -> list[dict]:
    """Every model at ``length``, timed together (`speed.timed_together`: a counted warm-up, then interleaved
    rounds): AR, then the MDM and each block size at each number of tokens revealed per forward
    (``tokens_per_forward``: ``b / k`` steps per block)."""
    runs = {AR: (ar_run(ar, length, timing["vocab_size"], 1, device), ar, length)}
    for block in block_sizes({**timing, "length": length}):
        model = copy.deepcopy(mdm)  # the same weights, block-causal attention over blocks of b (b = L: the MDM)
        model.config.block_size = None if block == length else block
        for k in timing["tokens_per_forward"]:
            label = "MDM (b = L)" if block == length else model_label(block, length)
            steps = max(1, block // k) * (length // block)
            runs[f"{label}, {k} token{'s' if k > 1 else ''} / forward"] = (
                _mdm_run(model, length, block, steps, device),
                model,
                steps,
            )
    cells = timed_together(runs, timing["repeats"], device)
    return [{"length": length, "model": name, **cell} for name, cell in cells.items()]


def _mdm_run(model: Any, length: int, block: int, steps: int, device: torch.device) -> Callable[[], Any]:
    prompt = torch.zeros(1, 0, dtype=torch.long, device=device)
    return lambda: diffusion_generate(
        model,
        prompt,
        max_new_tokens=length,
        steps=steps,
        block_length=block,
        transfer="deterministic",
        strategy="confidence",
        stop_at_eos=False,
    )


# ----------------------------------------------------------------------------------------------------------------
# Text and plot


def trained_table(rows: list[dict]) -> str:
    """Markdown: the trained models' points, then their validation NLL."""
    lines = [
        "| language | L | model | steps per block | SER | 95% CI | GenPPL(p)/TER(q) - 1 | 95% CI "
        "| sequential forwards / token | positions / token |",
        "| --- " * 10 + "|",
    ]
    for r in (r for r in rows if not r.get("validation")):
        per_block = r["steps"] * r["block_size"] // r["length"] if r["model"] != AR else 1
        lines.append(
            f"| {r['language']} | {r['length']} | {r['model']} | {per_block} | {r['ser']:.3f} | "
            f"[{r['ser_ci_low']:.3f}, {r['ser_ci_high']:.3f}] | {r['gen_ppl_increase']:+.4f} | "
            f"[{r['gen_ppl_ci_low']:+.4f}, {r['gen_ppl_ci_high']:+.4f}] | {r['forwards_per_token']:.3f} | "
            f"{r['positions_per_token']:.2f} |"
        )
    lines += [
        "",
        "| language | model | validation NLL / token (nats; diffusion models: the ELBO's upper bound) | its / entropy "
        "- 1 | exact NLL / token, one token a step left to right (AR: its own) | exact / entropy - 1 |",
    ]
    lines.append("| --- " * 6 + "|")
    lines += [
        f"| {r['language']} | {r['model']} | {r['nll']:.4f} | {r['gap']:+.4f} | {r['exact_nll']:.4f} | "
        f"{r['exact_gap']:+.4f} |"
        for r in rows
        if r.get("validation")
    ]
    return "\n".join(lines) + "\n"


def timing_table(rows: list[dict]) -> str:
    """Markdown: seconds per sequence and AR's seconds over each model's, per length."""
    ar = {r["length"]: r["seconds"] for r in rows if r["model"] == AR}
    lines = ["| L | model | forwards | seconds, median [min, max] | AR seconds / seconds |", "| --- " * 5 + "|"]
    lines += [
        f"| {r['length']} | {r['model']} | {r['forwards']:.0f} | {r['seconds']:.4f} "
        f"[{r.get('seconds_min', r['seconds']):.4f}, {r.get('seconds_max', r['seconds']):.4f}] | "
        f"{ar[r['length']] / r['seconds']:.2f} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


#: The quality metrics of the findings: (row key, interval keys, name).
METRICS = (
    ("ser", ("ser_ci_low", "ser_ci_high"), "SER"),
    ("gen_ppl_increase", ("gen_ppl_ci_low", "gen_ppl_ci_high"), "generative perplexity"),  # GenPPL(p)/TER(q) - 1
)


def trained_findings(rows: list[dict], timing: list[dict]) -> str:
    """Sentences computed from the rows: per language and metric (SER; generative perplexity where AR's is
    finite), AR's value and per
    model the cheapest point whose interval overlaps AR's (or that none does); per timed model the lengths from
    which it is faster than AR."""
    lines = []
    for language in dict.fromkeys(r["language"] for r in rows):
        here = [r for r in rows if r["language"] == language and not r.get("validation")]
        ar = next(r for r in here if r["model"] == AR)
        for key, (low, high), name in METRICS:
            if key == "ser" and not any(r["ser"] for r in here):
                lines.append(f"- {language}: every sequence is valid, SER is 0 for every model and setting.")
                continue
            if not math.isfinite(ar[key]):
                continue  # generative perplexity of samples outside the language's support
            lines.append(
                f"- {language}, {name}: AR's {ar[key]:.3f} [{ar[low]:.3f}, {ar[high]:.3f}] ({ar['num_samples']} samples)."
            )
            for model in dict.fromkeys(r["model"] for r in here if r["model"] != AR):
                points = [r for r in here if r["model"] == model]
                lines.append(f"  - {model}, the paper's sampler: {_as_good_as(ar, points, key, (low, high), name)}")
    for model in dict.fromkeys(r["model"] for r in timing if r["model"] != AR):
        lines.append(f"- Time, {model}: {_faster_than_ar(timing, model)}")
    if timing:
        lines.append(
            "- These times are of untrained models: a time, not a trade. Set each beside the trained models' SER and "
            "generative perplexity at the same tokens per forward in the table above."
        )
    return "\n".join(lines) + "\n"


def _as_good_as(ar: dict, points: list[dict], key: str, interval: tuple[str, str], name: str) -> str:
    low, high = interval
    matched = sorted((p for p in points if p[low] <= ar[high]), key=lambda p: p["forwards_per_token"])
    if not matched:
        best = min(points, key=lambda p: p[key])
        return (
            f"no setting measured reaches AR's {name}; the lowest is {best[key]:.3f} [{best[low]:.3f}, "
            f"{best[high]:.3f}] at {best['forwards_per_token']:.3f} forwards / token."
        )
    p = matched[0]
    return (
        f"{name} {p[key]:.3f} [{p[low]:.3f}, {p[high]:.3f}], its interval overlapping AR's (no difference resolved), from "
        f"{p['forwards_per_token']:.3f} sequential forwards / token ({p['positions_per_token']:.2f} positions / token)."
    )


def _faster_than_ar(timing: list[dict], model: str) -> str:
    """Where ``model`` is faster than AR: only where every timed round of it beat every round of AR
    (`speed.ratio_over`); the lengths listed, not extrapolated."""
    ratios = sorted(ar_over(timing, model, AR).items())
    faster = [length for length, (_, low, _) in ratios if low > 1]
    described = ", ".join(f"{m:.2f}x [{lo:.2f}, {hi:.2f}] at L = {n}" for n, (m, lo, hi) in ratios)
    repeats = next((r.get("repeats", "?") for r in timing if r["model"] == model), "?")
    if len(faster) == len(ratios):
        verdict = "faster than AR at every L measured (every round beat every AR round)"
    elif faster:
        verdict = "faster than AR in every round only at L = " + ", ".join(map(str, faster))
    else:
        verdict = "at no L measured faster than AR in every round"
    return (
        f"{verdict} (AR seconds / its seconds, median and the range over {repeats} interleaved rounds, fastest "
        f"against slowest: {described})."
    )


def plot_trained(rows: list[dict], timing: list[dict], path: Path) -> None:
    """Per language, SER (or, where every sequence is valid, the generative perplexity increase) against sequential
    forwards per token for each trained model (AR a star); then seconds against L for every timed model (log-log)."""
    from .plotting import pyplot, save_figure

    plt = pyplot()
    languages = list(dict.fromkeys(r["language"] for r in rows))
    fig, axes = plt.subplots(1, len(languages) + 1, figsize=(4.5 * (len(languages) + 1), 3.8), squeeze=False)
    for ax, language in zip(axes[0], languages):
        here = [r for r in rows if r["language"] == language and not r.get("validation")]
        key, label = ("ser", "SER") if any(r["ser"] for r in here) else ("gen_ppl_increase", "GenPPL(p)/TER(q) - 1")
        for model in dict.fromkeys(r["model"] for r in here):
            pts = sorted((r["forwards_per_token"], r[key]) for r in here if r["model"] == model)
            ax.plot(*zip(*pts), "*" if model == AR else "-o", ms=8 if model == AR else 3, label=model)
        ax.set(xscale="log", xlabel="sequential forwards / token", ylabel=label, title=language)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for model in dict.fromkeys(r["model"] for r in timing):
        pts = sorted((r["length"], r["seconds"]) for r in timing if r["model"] == model)
        ax.plot(*zip(*pts), "-o", ms=3, label=model)
    ax.set(xscale="log", yscale="log", xlabel="L", ylabel="seconds per sequence", title="wall-clock (untrained)")
    ax.set_xticks(sorted({r["length"] for r in timing}), [str(n) for n in sorted({r["length"] for r in timing})])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    save_figure(fig, path, "Trained block diffusion against the MDM and AR")


def _budgets(section: dict) -> str:
    """Per language: each model's optimiser steps and the positions its forwards computed in training (steps x batch
    x positions a sequence: L for AR and the MDM, 2L for block diffusion, whose objective runs the noisy and the
    clean sequence side by side), a proxy for training FLOPs at equal model size; one training seed."""
    parts = []
    length = section["length"]
    for entry in section["languages"]:
        cfg = {**section["training"], **entry.get("training", {})}
        name = language_name({k: v for k, v in entry.items() if k != "training"})
        mdm, ar, batch = training_steps(cfg, "mdm"), training_steps(cfg, "ar"), cfg["batch_size"]
        parts.append(
            f"{name}: {cfg['num_train']} sequences; AR {ar} steps ({ar * batch * length:,} positions), the MDM "
            f"{mdm} steps ({mdm * batch * length:,} positions), block diffusion {mdm} steps "
            f"({2 * mdm * batch * length:,} positions)"
        )
    return "; ".join(parts) + f"; one training seed ({section['training'].get('seed', 0)}) per model"


def trained_text(scale: dict, trained: list[dict], timing: list[dict]) -> str:
    """The markdown of the trained part: set-up, tables, findings, the plot."""
    section = scale["trained"]
    text = (
        f"Trained models (L = {section['length']}): AR, the MDM and block diffusion models with b in "
        f"{section['block_sizes']}, size {section['training']['size']!r}, all models of a language trained on the same "
        f"sequences ({_budgets(section)}); the paper's sampler block by block with the exact block cache, "
        f"{section['num_samples']} samples per point.\n\n" + trained_table(trained)
    )
    if timing:
        t = section["timing"]
        text += (
            f"\nWall-clock, untrained models of size {t['size']!r}, one sequence, one CPU thread (on a CPU), median of "
            f"{t['repeats']} "
            "interleaved repeats after a warm-up; AR with its KV cache, block diffusion with the exact block cache, "
            "the MDM without a cache:\n\n" + timing_table(timing)
        )
    return text + "\n" + trained_findings(trained, timing) + "\n![trained](block_diffusion_trained.png)\n"
