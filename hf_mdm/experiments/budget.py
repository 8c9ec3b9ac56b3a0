"""Block sizes at equal training FLOPs over several training seeds: the ``equal_flops`` part of ``block_diffusion``.

The trained comparison beside it (`hf_mdm.experiments.blocks_trained`) gives every diffusion model the same
optimiser steps and one seed, so a block diffusion model, whose objective reads the noisy and the clean sequence side
by side (2L positions a sequence), spends about twice the MDM's compute there. Here every model of the language (AR,
the MDM, b = L, and one block diffusion model per entry of ``block_sizes``, all of one size and batch) gets the same
training FLOPs: those of ``budget_mdm_steps`` steps of the MDM, each model's steps being that budget over the FLOPs of
its own step (`hf_mdm.training.step_flops`, counted by torch: every matrix product, attention's included). Each model
is trained once per seed of ``seeds`` (a new training sample, initialisation and masking draws each), then judged by
one decoding law (`hf_mdm.experiments.decoding`): one token a step from left to right (AR: ancestral), its exact NLL
per token over the language's entropy, minus 1, on held-out sequences, and the SER of ``num_samples`` samples; the
paper's sampler's SER at N = L and the ELBO's bound are shown beside them, without verdicts. Over the seeds, each
model's mean with its 95% Student-t interval, and its difference to the MDM paired by seed (one seed, one training
sample) with its interval; a difference is called only where that interval excludes 0.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from scipy import stats
from tqdm.auto import tqdm

from ..training import step_flops
from .block_cells import AR, block_sizes, model_label
from .common import CellCache, language_name, make_language, trained_model
from .decoding import ELBO_GAP, EXACT_GAP, LEARNED_SER, PAPER_SER, RANDOM_SER, judged_cell

#: The judged quantities over the seeds, with verdicts: (row key, name).
QUANTITIES = (EXACT_GAP, LEARNED_SER)
#: Shown beside them, means only: the SER in a random order, the paper's sampler's and the ELBO's bound (no AR
#: value; no verdict).
BESIDE = (RANDOM_SER, PAPER_SER, ELBO_GAP)
MDM = "MDM"


def budget_plan(section: dict) -> list[dict]:
    """Per model: its label, ``block`` (None for AR, L for the MDM), the FLOPs of one training step and the steps
    that spend the budget (``budget_mdm_steps`` steps of the MDM)."""
    length, cfg, vocab = section["length"], section["training"], section["language"]["vocab_size"]

    def flops(block: int | None) -> int:
        kind, blocks = ("ar", None) if block is None else ("mdm", None if block == length else block)
        return step_flops(kind, vocab, length, cfg["size"], cfg["batch_size"], blocks)

    budget = section["budget_mdm_steps"] * flops(length)
    plan = []
    for block in [None, *block_sizes(section)]:
        per_step = flops(block)
        label = AR if block is None else model_label(block, length)
        plan.append({"model": label, "block": block, "step_flops": per_step, "steps": max(1, round(budget / per_step))})
    return plan


def equal_flops_rows(section: dict, out: Path, cache: CellCache) -> list[dict]:
    """One row per model and seed: its training budget (steps, sequences, tokens, FLOPs), validation gap and SER."""
    spec = section["language"]
    language, name = make_language(spec), language_name(spec)
    plan, rows = budget_plan(section), []
    described = {k: v for k, v in section.items() if k != "seeds"}  # a new seed reuses the others' cells
    digest = hashlib.sha1(json.dumps(described, sort_keys=True, default=dict).encode()).hexdigest()[:12]
    for seed in tqdm(section["seeds"], desc="block sizes at equal FLOPs", leave=False):
        for model in plan:
            cell = cache.get(
                f"equal_flops4|{model['model']}|{model['steps']} steps|seed {seed}|{digest}",
                lambda: _train_and_measure(language, name, section, model, seed, out),
            )
            rows.append({"language": name, "length": section["length"], "seed": seed, **model, **cell})
    return rows


def _train_and_measure(language: Any, name: str, section: dict, model: dict, seed: int, out: Path) -> dict:
    length, block, steps = section["length"], model["block"], model["steps"]
    kind = "ar" if block is None else "mdm"
    extra = {} if block in (None, length) else {"block_size": block}
    overrides = {"seed": seed, "max_steps": steps, "ar_max_steps": steps, **extra}
    trained = trained_model(kind, language, length, section, out, f"{name}-flops", overrides)
    batch = section["training"]["batch_size"]
    return {
        **judged_cell(kind, trained, language, section, seed, block),
        "sequences": steps * batch,
        "tokens": steps * batch * length,
        "flops": steps * model["step_flops"],
    }


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """The mean of ``values`` and its 95% Student-t interval (NaN bounds for fewer than two values)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    if max(values) == min(values):
        return mean, mean, mean
    interval = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    return mean, float(interval.low), float(interval.high)


def equal_flops_summary(rows: list[dict]) -> list[dict]:
    """Per model: each quantity's mean over the seeds with its interval, and the mean of its seed-paired difference to
    the MDM's with that difference's interval (``d_<key>``, ``d_<key>_low``, ``d_<key>_high``)."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    mdm = next(m for m in models if m.startswith(MDM))
    by_seed = {m: {r["seed"]: r for r in rows if r["model"] == m} for m in models}
    summary = []
    for model in models:
        seeds = sorted(set(by_seed[model]) & set(by_seed[mdm]))
        first = next(iter(by_seed[model].values()))
        entry = {k: first[k] for k in ("model", "steps", "sequences", "tokens", "flops")}
        entry["seeds"] = len(by_seed[model])
        for key, _ in QUANTITIES + BESIDE:
            values = [r[key] for r in by_seed[model].values() if r.get(key) is not None]
            if not values:
                continue
            entry[key], entry[f"{key}_low"], entry[f"{key}_high"] = mean_interval(values)
            if model != mdm and (key, _) in QUANTITIES:
                differences = [by_seed[model][s][key] - by_seed[mdm][s][key] for s in seeds]
                entry[f"d_{key}"], entry[f"d_{key}_low"], entry[f"d_{key}_high"] = mean_interval(differences)
        summary.append(entry)
    return summary


def difference_verdict(entry: dict, key: str, name: str, reference: str = "the MDM's", prefix: str = "d") -> str:
    """Whether ``entry``'s ``key`` is lower or higher than ``reference``, from the paired interval of its difference
    (``<prefix>_<key>``); else not resolved."""
    d, low, high = entry[f"{prefix}_{key}"], entry[f"{prefix}_{key}_low"], entry[f"{prefix}_{key}_high"]
    described = f"{d:+.4f} [{low:+.4f}, {high:+.4f}] over {entry['seeds']} seeds"
    if high < 0:
        return f"{name} lower than {reference} ({described})"
    if low > 0:
        return f"{name} higher than {reference} ({described})"
    return f"{name} not resolved from {reference} ({described}; the interval contains 0)"


def beside_cell(entry: dict, key: str, digits: int = 3, signed: bool = False) -> str:
    """A shown-beside quantity's mean and interval, or "-" where the model has none (AR)."""
    if key not in entry:
        return "-"
    form = f"{'+' if signed else ''}.{digits}f"
    return f"{entry[key]:{form}} [{entry[f'{key}_low']:{form}}, {entry[f'{key}_high']:{form}}]"


def equal_flops_text(section: dict, rows: list[dict]) -> str:
    """The markdown of the comparison: set-up, the table over the seeds, one finding per model against the MDM."""
    summary = equal_flops_summary(rows)
    lines = [
        f"Block sizes at equal training FLOPs ({rows[0]['language']}, L = {section['length']}, size "
        f"{section['training']['size']!r}, batch {section['training']['batch_size']}): every model gets the FLOPs of "
        f"{section['budget_mdm_steps']} MDM steps (each step's forward and backward counted by torch's "
        "FlopCounterMode: every matrix product, attention's included, dense over the S x S scores for S positions, "
        f"2L for block diffusion), trained once per seed of {section['seeds']} (a new sample, initialisation and "
        "masking each). Every model is judged by one decoding law, one token a step from left to right (exact for "
        "the oracle: SER 0; for AR its ancestral sampling): its exact NLL per token on "
        f"{section.get('nll_sequences', 1024)} held-out sequences and the SER of {section['num_samples']} samples per "
        "seed. Beside them, without verdicts: the SER one token a step in a random order (the judged order favours "
        "models trained for left to right), the paper's sampler's SER at N = L (a random number of tokens a step, so "
        "part of its error is the sampler's) and the ELBO's upper bound. Means over the seeds with 95% Student-t "
        "intervals; differences to the MDM paired by seed.",
        "",
        "| model | steps | tokens | training FLOPs | exact NLL / entropy - 1 | 95% CI | SER, left to right | 95% CI "
        "| SER, random order | SER, paper's sampler (N = L) | ELBO bound / entropy - 1 |",
        "| --- " * 11 + "|",
    ]
    for e in summary:
        lines.append(
            f"| {e['model']} | {e['steps']} | {e['tokens']:,} | {e['flops']:.2e} | {e['gap']:+.4f} | "
            f"[{e['gap_low']:+.4f}, {e['gap_high']:+.4f}] | {e['ser']:.3f} | [{e['ser_low']:.3f}, {e['ser_high']:.3f}] "
            f"| {beside_cell(e, 'ser_random')} | {beside_cell(e, 'ser_paper')} | {beside_cell(e, 'elbo_gap', 4, True)} |"
        )
    lines.append("")
    for e in (e for e in summary if "d_gap" in e):
        verdicts = "; ".join(difference_verdict(e, key, name) for key, name in QUANTITIES)
        lines.append(f"- {e['model']} at equal training FLOPs: {verdicts}.")
    return "\n".join(lines) + "\n\n![equal FLOPs](block_diffusion_budget.png)\n"


def plot_equal_flops(rows: list[dict], path: Path) -> None:
    """Per quantity, each seed's value (dots) and the mean with its 95% interval (bar) per model."""
    from .plotting import pyplot, save_figure

    plt, summary = pyplot(), equal_flops_summary(rows)
    fig, axes = plt.subplots(1, len(QUANTITIES), figsize=(5 * len(QUANTITIES), 3.8), squeeze=False)
    for ax, (key, name) in zip(axes[0], QUANTITIES):
        for x, e in enumerate(summary):
            seeds = [r[key] for r in rows if r["model"] == e["model"]]
            ax.plot([x] * len(seeds), seeds, "o", color="0.6", ms=4, label="one seed" if x == 0 else None)
            low, high = e[f"{key}_low"], e[f"{key}_high"]
            bar = [[e[key] - low], [high - e[key]]] if math.isfinite(low) else None
            ax.errorbar(
                [x + 0.15], [e[key]], yerr=bar, fmt="s", color="C0", capsize=3, label="mean, 95% CI" if x == 0 else None
            )
        ax.set_xticks(range(len(summary)), [e["model"] for e in summary], rotation=20, fontsize=7)
        ax.set(ylabel=name, title=name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path, "Equal training FLOPs, several seeds")
