"""Experiment b: the sequence error rate against the number of sampling steps (Theorem 4.4).

``ser_vs_steps`` measures the SER against N for a pruned HMM and for the Theorem 4.4 chain language, with the
exact-posterior oracle and with trained MDMs, the trained AR model as reference, at several lengths L with N a
fixed multiple of L (``scale["steps_over_length"]``): plotted against N/L the curves of all L fall on one
(Theorem 4.4: SER needs N growing with L); for the chain the oracle rows carry the predicted SER. With
``scale["steps_for_ser"]`` (``{target, lengths}``) it also finds the N the chain needs for an SER target at each
L and fits its growth (`scaling`); trained languages get their denoiser's learning error (`learning`). Writes
``ser_vs_steps.{json,md,png}``; cells are cached in ``<out>/cache/ser_vs_steps.json``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..languages import ChainLanguage
from ..metrics import SequenceErrorRate
from .common import (
    CellCache,
    experiment_result,
    language_name,
    lazy_pair,
    make_language,
    measure_languages,
    setup_lines,
    validation_table,
    write_outputs,
)
from .fast import fast_rows, fast_table
from .learning import denoiser_kl
from .plotting import ar_lines, language_panels, mdm_curves
from .scaling import scaling_table, steps_for_ser

#: What an SER cell keeps of ``SequenceErrorRate.compute``.
SER_KEYS = ("ser", "ser_ci_low", "ser_ci_high")


def ser_vs_steps(scale: dict, out: Path) -> dict[str, Any]:
    """Run (or resume) the experiment with ``scale`` and write its outputs into ``out``; returns the JSON dict."""
    ratios = scale["steps_over_length"]
    rows = measure_languages(
        "ser_vs_steps", scale, out, cell=ser_cell, steps_for=lambda length: steps_at(length, ratios), label="SER"
    )
    add_ratios_and_predictions(rows)
    cache = CellCache(out / "cache" / "ser_vs_steps.json")
    fast = fast_rows(scale, out, cache, ser_cell)
    learning = learning_rows(scale, out, cache)
    scaling = steps_for_ser(scale["steps_for_ser"], scale["num_samples"], cache) if "steps_for_ser" in scale else []
    extra = {
        **({"fast_rows": fast} if fast else {}),
        **({"learning_rows": learning} if learning else {}),
        **({"scaling_rows": scaling} if scaling else {}),
    }
    result = experiment_result("ser_vs_steps", scale, rows, **extra)
    setup = "\n".join(setup_lines(scale)) + "\n"
    table = setup + ser_table(rows) + fast_table(fast, scale, "ser", ("ser_ci_low", "ser_ci_high"), "SER")
    table += learning_table(learning) + scaling_table(scaling)
    write_outputs(out, "ser_vs_steps", result, table, lambda p: plot_ser(rows, p))
    return result


def learning_rows(scale: dict, out: Path, cache: CellCache) -> list[dict]:
    """Per trained language: the trained denoiser's KL to the language's posterior at the training length
    (`learning.denoiser_kl`, ``scale["num_samples"]`` sequences)."""
    rows = []
    for spec in scale["languages"]:
        if not spec.get("train", False):
            continue
        language, name, length = make_language(spec), language_name(spec), scale["train_length"]
        pair = lazy_pair(language, length, scale, out, name, spec.get("training"))
        num = scale["num_samples"]
        cell = cache.get(
            f"learning|{name}|{length}|{num}", lambda: denoiser_kl(pair()["mdm"], language, length, num, 0)
        )
        rows.append({"language": name, "length": length, **cell})
    return rows


def learning_table(rows: list[dict]) -> str:
    """Markdown: the learning error of each trained MDM (`learning.denoiser_kl`)."""
    if not rows:
        return ""
    lines = [
        "",
        "Learning error of the trained MDMs: KL from the language's exact posterior to the trained denoiser, nats per "
        "masked token, over sequences of the language masked at t ~ U(0, 1) (0 for the oracle):",
        "",
        "| language | L | KL | 95% CI | n |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['language']} | {r['length']} | {r['kl']:.4f} | [{r['kl_ci_low']:.4f}, {r['kl_ci_high']:.4f}] | "
        f"{r['num_sequences']} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def ser_cell(language: Any, samples: Any) -> dict[str, float]:
    """A cell: the SER and its 95% Wilson interval."""
    r = SequenceErrorRate().compute(predictions=samples.tolist(), language=language)
    return {k: r[k] for k in SER_KEYS}


def steps_at(length: int, ratios: list[float]) -> list[int]:
    """The step counts ``N = round(ratio * L)`` (at least 1) for each ratio N/L."""
    return [max(1, int(round(ratio * length))) for ratio in ratios]


def add_ratios_and_predictions(rows: list[dict]) -> None:
    """Adds ``steps_over_length`` to every measured row, and the Theorem 4.4 ``predicted`` SER to the chain's
    oracle rows."""
    for r in rows:
        if r["model"] != "validation":
            r["steps_over_length"] = r["steps"] / r["length"]
            if r["language"] == "chain" and r["model"] == "oracle MDM":
                r["predicted"] = ChainLanguage.predicted_ser(r["length"], r["steps"])


def ser_table(rows: list[dict]) -> str:
    """Markdown: one line per measured row (with the 95% CI and the prediction), then the validation table."""
    lines = [
        "| language | L | model | N | N/L | SER | 95% CI | predicted (Thm 4.4) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["model"] == "validation":
            continue
        pred = f"{r['predicted']:.3f}" if "predicted" in r else ""
        interval = f"[{r['ser_ci_low']:.3f}, {r['ser_ci_high']:.3f}]"
        lines.append(
            f"| {r['language']} | {r['length']} | {r['model']} | {r['steps']} | "
            f"{r['steps_over_length']:.3g} | {r['ser']:.3f} | {interval} | {pred} |"
        )
    return "\n".join(lines + validation_table(rows)) + "\n"


def plot_ser(rows: list[dict], path: Path) -> None:
    """One panel per language: SER against N/L (log x), one curve per model and length with its 95% interval as a
    band; the chain's theory curve."""

    def draw(ax: Any, name: str) -> None:
        mdm_curves(ax, rows, name, "steps_over_length", "ser", interval=("ser_ci_low", "ser_ci_high"))
        if name == "chain":
            grid = [2 ** (k / 4) for k in range(-12, 21)]
            ax.plot(grid, [1 - math.exp(-0.75 / g) for g in grid], "k-", lw=0.8, alpha=0.5, label="1 - exp(-3L/4N)")
        ar_lines(ax, rows, name, "ser", interval=("ser_ci_low", "ser_ci_high"))
        ax.set(xscale="log", xlabel="steps / length (N/L)", ylabel="SER", ylim=(-0.02, 1.02), title=name)

    language_panels(rows, path, 4.4, "Sequence error rate vs N/L (Theorem 4.4: needs N growing with L)", draw)
