"""Theorem 4.4 on the chain language: the steps N the paper's sampler needs for a fixed SER target, against L.

Theorem 4.4 says that on a language built for it the MDM needs N growing linearly with L for a low SER. On that
language (`ChainLanguage`, the 16-token construction of the theorem as DESIGN.md section 4 states it: tokens (u, v),
each next u equal to the previous v, so every valid sequence is a chain of links and two neighbours revealed in one
step disagree with probability 3/4) with the exact-posterior oracle, ``steps_for_ser``
measures the SER at N = r x L for a grid of ratios r at each L and finds the N at which the SER falls to the
target (interpolated in log N between grid points), with the range from the ends of the 95% Wilson intervals; the
closed form's N beside them. ``scaling_fit`` fits log N = a + slope log L by
least squares with the slope's 95% interval (Student t with L - 2 degrees of freedom): linear growth is a slope of 1.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from scipy import stats

from ..languages import ChainLanguage, OracleDenoiser
from ..metrics import SequenceErrorRate
from .common import CellCache, sample_mdm


def closed_form_steps(length: int, target: float) -> float:
    """The N (real) at which the chain's closed-form SER 1 - (1 - 3/(4N))^(L-1) equals ``target``."""
    return 3.0 / (4.0 * (1.0 - (1.0 - target) ** (1.0 / max(length - 1, 1))))


def steps_for_ser(section: dict, num: int, cache: CellCache) -> list[dict]:
    """One row per length of ``section["lengths"]``: the SER of the oracle at N = ratio x L for each ratio of
    ``section["steps_over_length"]``, and the N at which the measured SER, and each end of its 95% interval, falls
    to ``section["target"]`` (linear in log N between the two grid points around the crossing); the closed form's
    N beside them."""
    chain, target = ChainLanguage(), section["target"]
    oracle = OracleDenoiser(chain, mask_token_id=chain.vocab_size)
    rows = []
    for length in section["lengths"]:
        grid = []
        for ratio in section["steps_over_length"]:
            steps = max(1, round(ratio * length))
            cell = cache.get(
                f"scaling|{length}|{steps}|{num}",
                lambda steps=steps: _ser(chain, sample_mdm(oracle, num, length, steps, seed=steps)),
            )
            grid.append({"steps": steps, **cell})
        rows.append(
            {
                "length": length,
                "target": target,
                "steps": crossing(grid, "ser", target),
                "steps_ci_low": crossing(grid, "ser_ci_low", target),
                "steps_ci_high": crossing(grid, "ser_ci_high", target),
                "steps_closed_form": closed_form_steps(length, target),
                "grid": grid,
                "num_samples": num,
            }
        )
    return rows


def crossing(grid: list[dict], key: str, target: float) -> float:
    """The N at which ``key`` first falls to ``target`` along ``grid`` (rows by increasing N), linear in log N
    between the last point above and the first at or below; NaN where no point of the grid reaches it or the first
    already does."""
    for before, after in zip(grid, grid[1:]):
        if before[key] > target >= after[key]:
            w = (before[key] - target) / (before[key] - after[key])
            return math.exp(math.log(before["steps"]) + w * (math.log(after["steps"]) - math.log(before["steps"])))
    return math.nan


def _ser(language: Any, samples: torch.Tensor) -> dict[str, float]:
    r = SequenceErrorRate().compute(predictions=samples.tolist(), language=language)
    return {k: r[k] for k in ("ser", "ser_ci_low", "ser_ci_high")}


def scaling_fit(rows: list[dict], key: str) -> dict[str, float]:
    """The least-squares slope of log N (``row[key]``) against log L with its 95% interval; NaN bounds for fewer than
    three lengths."""
    rows = [r for r in rows if math.isfinite(r[key]) and r[key] > 0]
    if len(rows) < 2:  # no line through fewer points (scipy's linregress refuses them)
        return {"slope": math.nan, "slope_ci_low": math.nan, "slope_ci_high": math.nan, "points": len(rows)}
    x = [math.log(r["length"]) for r in rows]
    y = [math.log(r[key]) for r in rows]
    fit = stats.linregress(x, y)
    if len(rows) < 3:
        return {"slope": float(fit.slope), "slope_ci_low": math.nan, "slope_ci_high": math.nan, "points": len(rows)}
    half = stats.t.ppf(0.975, len(rows) - 2) * fit.stderr
    return {
        "slope": float(fit.slope),
        "slope_ci_low": float(fit.slope - half),
        "slope_ci_high": float(fit.slope + half),
        "points": len(rows),
    }


def scaling_table(rows: list[dict]) -> str:
    """Markdown: the N at which the SER falls to the target at each L, measured and closed form, and the fits."""
    if not rows:
        return ""
    ratios = ", ".join(f"{g['steps'] / rows[0]['length']:g}" for g in rows[0]["grid"])
    lines = [
        "",
        f"Theorem 4.4 on the chain language (oracle, the paper's sampler): the N at which the SER falls to "
        f"{rows[0]['target']:g}, from the SER measured at N/L = {ratios} ({rows[0]['num_samples']} samples each), "
        "interpolated in log N; the range: where the ends of the 95% intervals cross it:",
        "",
        "| L | N (measured) | range | N (closed form) | N / L (measured) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['length']} | {r['steps']:.1f} | [{r['steps_ci_low']:.1f}, {r['steps_ci_high']:.1f}] | "
            f"{r['steps_closed_form']:.1f} | {r['steps'] / r['length']:.3f} |"
        )
    lines += ["", *[f"- {line}" for line in scaling_sentences(rows)]]
    return "\n".join(lines) + "\n"


def scaling_sentences(rows: list[dict]) -> list[str]:
    """The fitted slope of the measured N in words, beside the closed form's: growth linear in L is said only where
    the slope's interval holds 1 and lies above 0.5."""
    fit = scaling_fit(rows, "steps")
    if fit["points"] < 3:
        return []
    exact = scaling_fit(rows, "steps_closed_form")
    lengths = ", ".join(str(r["length"]) for r in rows if math.isfinite(r["steps"]))
    if fit["slope_ci_low"] <= 1 <= fit["slope_ci_high"] and fit["slope_ci_low"] > 0.5:
        verdict = "consistent with N growing linearly in L (the interval holds 1 and lies above 0.5)"
    elif fit["slope_ci_low"] <= 1 <= fit["slope_ci_high"]:
        verdict = "the interval holds 1 but is too wide to tell linear from slower growth"
    else:
        verdict = "not consistent with a slope of 1"
    return [
        f"log N against log L at L = {lengths} (least squares, 95% interval from the residuals, Student t with "
        f"{fit['points'] - 2} degrees of freedom): slope {fit['slope']:.3f} [{fit['slope_ci_low']:.3f}, "
        f"{fit['slope_ci_high']:.3f}], {verdict}; the closed form's N over the same lengths has slope "
        f"{exact['slope']:.3f} (exact; 1 in the limit of large L)."
    ]
