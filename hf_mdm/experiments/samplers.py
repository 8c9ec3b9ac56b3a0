"""Beyond Theorem 4.4: which samplers beat the paper's on sequence error at equal sequential forwards, with the oracle.

The paper's sampler (stochastic transfer, random order) needs a number of steps N growing with L to keep the
sequence error rate low (Theorem 4.4). Other samplers spend their forwards differently: confidence ordering,
threshold and entropy-bound decoding (several tokens a forward where the model is sure), remasking (ReMDM:
revealed tokens can be masked again and predicted anew) and exact speculative decoding (the left-to-right
factorisation, drafted from the marginals of the previous forward and verified in one batched forward). On a
synthetic language their cost is measured against the language's exact likelihood: SER and generative perplexity
of their samples (the samples scored by the language; the paper's TER needs the sampler's law, known for the
paper's sampler only: `hf_mdm.likelihood_law`), with
the exact-posterior oracle (no learning error) and with trained MDMs.

A scale (``evaluation/configs/samplers.yaml``) lists languages, each with its ``metric`` (``ser`` or ``ter``) and
``lengths``, and samplers: `MaskedDiffusionGenerationConfig` fields plus a ``sweep`` of one field over two or three
values (``steps_over_length`` sets ``steps = round(value * L)``). Every point draws ``num_samples`` sequences at
temperature 1 in one block and reports the metric with its 95% interval and the *sequential forwards per token*: the
forwards a row needs on its own (the steps or rounds in which it revealed something: a remasking step that only
takes tokens back runs no forward), over L. Speculative decoding computes several canvases per round: the
rows x positions it computes are reported beside its rounds. Cells are cached in ``<out>/cache/samplers.json``;
trained models are those of the other experiments (same settings, same folder), trained here only if missing.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..languages import OracleDenoiser
from .common import (
    CellCache,
    experiment_result,
    language_name,
    language_parameters,
    lazy_pair,
    make_language,
    training_sentence,
    write_outputs,
)
from .fast import active_steps, generate_batches
from .plotting import pyplot, save_figure
from .ser import ser_cell
from .ter_cells import gen_ppl_cell

#: Keys of a language entry that are this experiment's, not the language's.
ENTRY_FIELDS = ("metric", "lengths")
#: The cell of each metric: samples -> values with a 95% interval, and the names of value / interval keys.
METRICS = {
    "ser": (ser_cell, "ser", ("ser_ci_low", "ser_ci_high"), "SER"),
    "gen_ppl": (gen_ppl_cell, "gen_ppl_increase", ("gen_ppl_ci_low", "gen_ppl_ci_high"), "GenPPL(p)/TER(q) - 1"),
}
#: The sampler every other is compared with (its ``name`` in the scale).
PAPER = "paper (stochastic, random)"
#: The exact sampler whose law speculative decoding keeps (its ``name`` in the scale).
LEFT_TO_RIGHT = "left-to-right, 1 token/step"


def compare_samplers(scale: dict, out: Path) -> dict[str, Any]:
    """Run (or resume) the sampler comparison with ``scale`` and write ``samplers.{json,md,png}`` into ``out``."""
    cache = CellCache(out / "cache" / "samplers.json")
    rows: list[dict] = []
    for entry in scale["languages"]:
        rows += _language_rows(entry, scale, out, cache)
    result = experiment_result("samplers", scale, rows)
    text = "\n".join(setup_lines(scale)) + samplers_table(rows) + "\n" + verdict(rows) + "\n"
    write_outputs(out, "samplers", result, text, lambda p: plot_samplers(rows, p))
    return result


def setup_lines(scale: dict) -> list[str]:
    """Markdown lines stating the set-up: each language with its parameters, metric and lengths, the sampling, and
    the trained models' size and training budget."""
    lines = ["", "Languages:"]
    for entry in scale["languages"]:
        spec = {k: v for k, v in entry.items() if k not in ENTRY_FIELDS}
        lines.append(
            f"- {language_name(spec)} ({spec['kind']}: {language_parameters(spec)}): "
            f"{METRICS[entry['metric']][3]} at L = {', '.join(map(str, entry['lengths']))}"
            + (
                f"; trained MDM at L = {scale['train_length']}: "
                f"{training_sentence({**scale['training'], **spec.get('training', {})})}"
                if spec.get("train", False)
                else ""
            )
        )
    return lines + [
        "",
        f"Every point: {scale['num_samples']} sequences drawn at temperature 1 in one block from the "
        "empty prompt, seeded; the oracle is the exact posterior of the language.",
        "",
    ]


def _language_rows(entry: dict, scale: dict, out: Path, cache: CellCache) -> list[dict]:
    spec = {k: v for k, v in entry.items() if k not in ENTRY_FIELDS}
    language, name, metric = make_language(spec), language_name(spec), entry["metric"]
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} in {entry}: use one of {sorted(METRICS)}")
    rows = []
    for length in entry["lengths"]:
        models = {"oracle MDM": lambda: OracleDenoiser(language, mask_token_id=language.vocab_size)}
        if spec.get("train", False) and length == scale["train_length"]:
            pair = lazy_pair(language, length, scale, out, name, spec.get("training"))
            models["trained MDM"] = lambda: pair()["mdm"]
        points = [
            (s["name"], label, settings) for s in scale["samplers"] for label, settings in sampler_points(s, length)
        ]
        for model_name, model in models.items():
            for sampler, label, settings in tqdm(points, desc=f"samplers {model_name} {name} L={length}", leave=False):
                key = _cell_key(model_name, name, length, scale, settings)
                cell = cache.get(key, lambda: measure(model(), language, metric, length, settings, scale))
                rows.append(
                    {
                        "language": name,
                        "length": length,
                        "model": model_name,
                        "metric": metric,
                        "sampler": sampler,
                        "setting": label,
                        **cell,
                    }
                )
    return rows


def sampler_points(sampler: dict, length: int) -> list[tuple[str, dict]]:
    """``(label, generate() settings)`` of each value of the sampler's ``sweep`` (one point without a sweep);
    ``steps_over_length`` becomes ``steps = round(value * length)`` (at least 1)."""
    fixed = {k: v for k, v in sampler.items() if k not in ("name", "sweep")}
    sweep = sampler.get("sweep") or {}
    if len(sweep) > 1:
        raise ValueError(f"sampler {sampler['name']!r}: sweep one field at a time, got {sorted(sweep)}")
    field, values = next(iter(sweep.items())) if sweep else (None, [None])
    points = []
    for value in values:
        settings = {**fixed, **({field: value} if field else {})}
        ratio = settings.pop("steps_over_length", None)
        if ratio is not None:
            settings["steps"] = max(1, int(round(ratio * length)))
        points.append((f"{field} = {value}" if field else "", settings))
    return points


def _cell_key(model: str, language: str, length: int, scale: dict, settings: dict) -> str:
    described = json.dumps([scale["num_samples"], scale.get("seed", 0), settings], sort_keys=True)
    return f"v2|{model}|{language}|{length}|{hashlib.sha1(described.encode()).hexdigest()[:12]}"


def measure(
    model: Any, language: Any, metric: str, length: int, settings: dict, scale: dict, batch_size: int = 256
) -> dict:
    """One point: ``scale["num_samples"]`` samples drawn with ``settings`` at temperature 1, scored, with its costs
    per token on the same axes as every table: sequential forwards, positions computed (rows x positions of every
    forward) and wall-clock milliseconds (this machine, batches of ``batch_size``); the canvases computed per token
    and, for speculative decoding, the tokens accepted per round."""
    num = scale["num_samples"]
    samples, forwards, computed, positions, accepted = [], [], 0.0, 0.0, []
    start = time.perf_counter()
    for out in generate_batches(model, num, length, scale.get("seed", 0), settings, batch_size):
        samples.append(out.sequences.cpu())
        forwards.append(active_steps(out.history, int(model.config.mask_token_id)))
        computed += float(out.forward_rows)
        positions += float(out.forward_tokens)
        if getattr(out, "accepted_per_round", None) is not None:
            accepted.append(out.accepted_per_round.float().cpu())
    seconds = time.perf_counter() - start
    samples = torch.cat(samples)
    cell = METRICS[metric][0](language, samples)
    cell.update(
        distinct=distinct_fraction(samples),
        forwards_per_token=float(torch.cat(forwards).double().mean()) / length,
        computed_per_token=computed / (num * length),
        positions_per_token=positions / (num * length),
        ms_per_token=1000 * seconds / (num * length),
        num_samples=num,
    )
    if accepted:
        cell["accepted_per_round"] = float(torch.cat(accepted).mean())  # drafts accepted per round, mean over rows
    return cell


def distinct_fraction(samples: torch.Tensor) -> float:
    """The share of distinct sequences among ``samples`` (B, L): the diversity beside a mode-seeking sampler's SER
    (1.0 when no two samples repeat; a sampler that always returns the language's likeliest sequence scores 1/B)."""
    return float(torch.unique(samples, dim=0).shape[0]) / samples.shape[0]


# ----------------------------------------------------------------------------------------------------------------
# Table, verdict, plot


def samplers_table(rows: list[dict]) -> str:
    """Markdown: one line per point, grouped by language, length and model."""
    lines = [
        "| language | L | model | sampler | setting | metric | value | 95% CI | sequential forwards / token "
        "| positions computed / token | wall ms / token | canvases / token | accepted / round | distinct samples |",
        "| --- " * 14 + "|",
    ]
    for r in rows:
        _, value, (low, high), label = METRICS[r["metric"]]
        accepted = f"{r['accepted_per_round']:.2f}" if "accepted_per_round" in r else ""
        costs = " | ".join(f"{r[k]:.3f}" if k in r else "" for k in ("positions_per_token", "ms_per_token"))
        lines.append(
            f"| {r['language']} | {r['length']} | {r['model']} | {r['sampler']} | {r['setting']} | {label} | "
            f"{r[value]:.4f} | [{r[low]:.4f}, {r[high]:.4f}] | {r['forwards_per_token']:.3f} | {costs} | "
            f"{r['computed_per_token']:.3f} | {accepted} | {_distinct(r)} |"
        )
    return "\n".join(lines) + "\n"


def _distinct(r: dict) -> str:
    return f"{r['distinct']:.3f}" if "distinct" in r else ""


def paper_at(rows: list[dict], group: tuple, x: float, key: str) -> float | None:
    """The paper sampler's ``key`` of ``group`` (language, length, model) at ``x`` forwards per token, linear in
    log x between its measured points; None outside their range."""
    pts = sorted((r["forwards_per_token"], r[key]) for r in rows if _group(r) == group and r["sampler"] == PAPER)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1 and math.isfinite(y0) and math.isfinite(y1):
            w = 0.0 if x1 == x0 else (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + w * (y1 - y0)
    return None


def _group(r: dict) -> tuple:
    return (r["language"], r["length"], r["model"])


def verdict(rows: list[dict]) -> str:
    """Plain words: per sampler, the oracle's SER panels where it lies below / above the paper's sampler and its
    TER range; then per language, length and model, every point below / above the paper's at equal forwards."""
    lines = [
        "Against the paper's sampler at equal sequential forwards per token (its curve interpolated in log "
        "forwards; *below* / *above*: the point's 95% interval lies entirely below / above the paper's there; "
        "past the paper's last point, a point counts as above when it lies above that point, which spent fewer "
        "forwards). For SER below is better. For generative perplexity (GenPPL(p)/TER(q) - 1, the samples scored by "
        "the language, not the paper's TER), below 0 means samples more likely than the language's own "
        "(a mode-seeking, lower-entropy distribution), so below the paper's is not a better fit of the language: "
        "it is the cost in diversity."
    ]
    metrics = {_group(r): r["metric"] for r in rows}
    compared = {group: _compared(rows, group, METRICS[metric]) for group, metric in metrics.items()}
    lines += [
        "",
        *_headline(rows, {g: c for g, c in compared.items() if g[2] == "oracle MDM" and metrics[g] == "ser"}),
        "",
        "Every point:",
        "",
    ]
    for group, sides in compared.items():
        metric = METRICS[metrics[group]]
        below, above = (", ".join(_point(r, metric, paper) for r, paper in side) or "none" for side in sides)
        lines.append(f"- {group[0]}, L = {group[1]}, {group[2]} ({metric[3]}): below: {below}. Above: {above}.")
    return "\n".join(lines) + "\n"


def _headline(rows: list[dict], panels: dict[tuple, tuple]) -> list[str]:
    """One line per sampler: the oracle SER ``panels`` (group -> `_compared`) where some point lies below / above
    the paper's sampler, the forwards per token of its points there, and the range of its generative perplexity
    relative increase."""
    lines = []
    for name in dict.fromkeys(r["sampler"] for r in rows if r["sampler"] != PAPER):
        sides = [
            [f"{g[0]} L={g[1]}" for g, compared in panels.items() if any(r["sampler"] == name for r, _ in compared[i])]
            for i in (0, 1)
        ]
        ter = [
            r["gen_ppl_increase"]
            for r in rows
            if r["sampler"] == name and r["metric"] == "gen_ppl" and r["model"] == "oracle MDM"
        ]
        own = [r for r in rows if r["sampler"] == name and _group(r) in panels]
        if not own:
            continue
        lines.append(
            f"- **{name}** (SER, oracle): below the paper's on {', '.join(sides[0]) or 'no panel'}; above on "
            f"{', '.join(sides[1]) or 'no panel'}; {_cost_range(own, 'forwards_per_token')} sequential forwards, "
            f"{_cost_range(own, 'computed_per_token')} canvases and {_cost_range(own, 'positions_per_token')} "
            "positions computed per token"
            + (f"; GenPPL(p)/TER(q) - 1 from {min(ter):+.3f} to {max(ter):+.3f}" if ter else "")
            + f"; share of distinct samples {_cost_range(own, 'distinct')}"
            + (f" ({SPECULATIVE_NOTE})" if "speculative" in name else "")
            + "."
        )
    paper = [r for r in rows if r["sampler"] == PAPER and _group(r) in panels]
    if paper:
        lines.append(
            f"- The paper's sampler itself: {_cost_range(paper, 'forwards_per_token')} sequential forwards, "
            f"{_cost_range(paper, 'computed_per_token')} canvases and {_cost_range(paper, 'positions_per_token')} "
            "positions computed per token."
        )
    return lines


#: Why speculative decoding's SER with the oracle is 0, in words.
SPECULATIVE_NOTE = (
    "its SER of 0 with the oracle holds by construction: it keeps the model's left-to-right law, which for the "
    "oracle is the language; below the paper's compares sequential forwards only, not the canvases it computes"
)


def _cost_range(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows if key in r and math.isfinite(r[key])]
    if not values:
        return "n/a"
    return f"{min(values):.2f}" if min(values) == max(values) else f"{min(values):.2f}-{max(values):.2f}"


def _point(r: dict, metric: tuple, paper: str) -> str:
    setting = f" ({r['setting']})" if r["setting"] else ""
    return f"{r['sampler']}{setting} at {r['forwards_per_token']:.2f}: {r[metric[1]]:.3f} vs {paper}"


def _compared(rows: list[dict], group: tuple, metric: tuple) -> tuple[list[tuple], list[tuple]]:
    """``(row, the paper's value there)`` of the non-paper points of ``group`` whose interval lies below / above the
    paper's at their forwards; a point beyond the paper's last forwards is *above* when it lies above that last
    point (it loses while spending more)."""
    _, value, (low, high), _ = metric
    last = max((r for r in rows if _group(r) == group and r["sampler"] == PAPER), key=lambda r: r["forwards_per_token"])
    below, above = [], []
    for r in rows:
        if _group(r) != group or r["sampler"] == PAPER:
            continue
        x = r["forwards_per_token"]
        paper_low, paper_high, paper = (paper_at(rows, group, x, k) for k in (low, high, value))
        if paper_low is None and x > last["forwards_per_token"] and r[low] > last[high]:
            above.append((r, f"{last[value]:.3f} at {last['forwards_per_token']:.2f}"))
        elif paper_low is not None and r[high] < paper_low:
            below.append((r, f"{paper:.3f}"))
        elif paper_low is not None and r[low] > paper_high:
            above.append((r, f"{paper:.3f}"))
    return below, above


def plot_samplers(rows: list[dict], path: Path) -> None:
    """One panel per language and length: the metric against sequential forwards per token (log x), one colour per
    sampler, solid for the oracle and dashed for trained MDMs, 95% intervals as error bars; for the chain, Theorem
    4.4's SER of the paper's sampler placed at that sampler's expected forwards."""
    plt = pyplot()
    panels = list(dict.fromkeys((r["language"], r["length"]) for r in rows))
    colours = {name: f"C{i % 10}" for i, name in enumerate(dict.fromkeys(r["sampler"] for r in rows))}
    ncols = min(3, len(panels))
    fig, axes = plt.subplots(
        math.ceil(len(panels) / ncols),
        ncols,
        figsize=(5.2 * ncols, 3.8 * math.ceil(len(panels) / ncols)),
        squeeze=False,
    )
    for ax, (language, length) in zip(axes.flat, panels):
        _draw_panel(ax, [r for r in rows if (r["language"], r["length"]) == (language, length)], colours)
        if language == "chain":
            grid = [2 ** (k / 4) for k in range(-4, 45)]  # steps N from 0.5 to 2**11
            xs = [n * (1 - (1 - 1 / n) ** length) / length if n > 1 else 1 / length for n in grid]
            ax.plot(
                xs,
                [1 - math.exp(-0.75 * (length - 1) / n) for n in grid],
                "k-",
                lw=0.8,
                alpha=0.5,
                label="Thm 4.4, paper's sampler",
            )
        ax.set(title=f"{language}, L = {length}")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    handles = {label: h for ax in axes.flat for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=4, fontsize=7, frameon=False)
    save_figure(
        fig,
        path,
        "Samplers at equal sequential forwards (oracle: solid; trained MDM: dashed)",
        bottom=0.04 * math.ceil(len(handles) / 4) / axes.shape[0],
    )


def _draw_panel(ax: Any, rows: list[dict], colours: dict[str, str]) -> None:
    from matplotlib.ticker import NullFormatter

    _, value, (low, high), label = METRICS[rows[0]["metric"]]
    for sampler, model in dict.fromkeys((r["sampler"], r["model"]) for r in rows):
        pts = sorted(
            (r["forwards_per_token"], r[value], r[low], r[high])
            for r in rows
            if r["sampler"] == sampler and r["model"] == model and math.isfinite(r[value])
        )
        if not pts:
            continue
        xs, ys, lows, highs = zip(*pts)
        ax.errorbar(
            xs,
            ys,
            yerr=[[y - lo for y, lo in zip(ys, lows)], [hi - y for y, hi in zip(ys, highs)]],
            fmt="-o" if model == "oracle MDM" else "--s",
            color=colours[sampler],
            ms=3,
            capsize=2,
            label=f"{sampler} ({model})",
        )
    ax.set(xscale="log", xlabel="sequential forwards / token", ylabel=label)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
