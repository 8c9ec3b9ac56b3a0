"""Experiment a: the TER relative increase against the number of sampling steps (the paper's table; Theorem 4.2).

``ter_vs_steps`` measures TER(p)/TER(q) - 1 (the paper's epsilon_total) of the paper's sampler (stochastic
transfer, random order, linear schedule) against the number of steps N, for n-gram languages at several lengths L:
with the exact-posterior oracle (no learning error) and with trained MDMs, the trained AR model's TER as reference.
Theorem 4.2: it depends on N, not on L. Writes ``ter_vs_steps.{json,md,png}``; cells are cached in
``<out>/cache/ter_vs_steps.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..metrics import TokenErrorRate
from .common import CellCache, experiment_result, measure_languages, setup_lines, validation_table, write_outputs
from .fast import fast_rows, fast_table, ter_interval
from .plotting import ar_lines, language_panels, mdm_curves

#: What a TER cell keeps of ``TokenErrorRate.compute``.
TER_KEYS = ("ter", "ter_reference", "relative_increase", "num_out_of_support")
#: Relative increases are drawn on a log axis, at least this.
PLOT_FLOOR = 1e-5


def ter_vs_steps(preset: dict, out: Path) -> dict[str, Any]:
    """Run (or resume) the experiment with ``preset`` and write its outputs into ``out``; returns the JSON dict."""
    steps_list = preset["steps"]
    rows = measure_languages(
        "ter_vs_steps", preset, out, cell=ter_cell, steps_for=lambda length: steps_list, label="TER"
    )
    fast = fast_rows(preset, out, CellCache(out / "cache" / "ter_vs_steps.json"), ter_cell)
    result = experiment_result("ter_vs_steps", preset, rows, **({"fast_rows": fast} if fast else {}))
    fast_lines = fast_table(fast, preset, "relative_increase", ("ci_low", "ci_high"), "TER(p)/TER(q) - 1")
    table = "\n".join(setup_lines(preset)) + "\n" + ter_table(rows, steps_list) + fast_lines
    write_outputs(out, "ter_vs_steps", result, table, lambda p: plot_ter(rows, p))
    return result


def ter_cell(language: Any, samples: Any) -> dict[str, float]:
    """A cell: the TER keys, the 95% interval of the relative increase (``ci_low``, ``ci_high``) and the
    sample count."""
    r = TokenErrorRate().compute(predictions=samples.tolist(), language=language)
    low, high = ter_interval(language, samples, r["ter_reference"])
    return {**{k: r[k] for k in TER_KEYS}, "ci_low": low, "ci_high": high, "num_samples": int(samples.shape[0])}


def ter_table(rows: list[dict], steps_list: list[int]) -> str:
    """Markdown: the relative increase per language, length and model against N, then the validation table."""
    lines = [
        "| language | L | model | " + " | ".join(f"N={s}" for s in steps_list) + " |",
        "| --- | --- | --- |" + " --- |" * len(steps_list),
    ]
    groups: dict[tuple, dict[int, float]] = {}
    for r in rows:
        if r["model"] in ("oracle MDM", "trained MDM"):
            groups.setdefault((r["language"], r["length"], r["model"]), {})[r["steps"]] = r["relative_increase"]
    for (name, length, model), by_steps in groups.items():
        cells = [f"{100 * by_steps[s]:.2f}%" if s in by_steps else "" for s in steps_list]
        lines.append(f"| {name} | {length} | {model} | " + " | ".join(cells) + " |")
    for r in rows:
        if r["model"] == "trained AR":
            lines.append(
                f"| {r['language']} | {r['length']} | trained AR (L steps) | "
                + " | ".join([f"{100 * r['relative_increase']:.2f}%"] * len(steps_list))
                + " |"
            )
    return "\n".join(lines + validation_table(rows)) + "\n"


def plot_ter(rows: list[dict], path: Path) -> None:
    """One log-log panel per language: the relative increase against N, one curve per model and length."""

    def clip(value: float) -> float:
        return max(value, PLOT_FLOOR)

    def draw(ax: Any, name: str) -> None:
        mdm_curves(ax, rows, name, "steps", "relative_increase", clip, interval=("ci_low", "ci_high"))
        ar_lines(ax, rows, name, "relative_increase", clip, interval=("ci_low", "ci_high"))
        ax.set(xscale="log", yscale="log", xlabel="sampling steps N", ylabel="TER(p)/TER(q) - 1", title=name)

    language_panels(rows, path, 4.2, "TER relative increase vs steps (Theorem 4.2: depends on N, not L)", draw)
