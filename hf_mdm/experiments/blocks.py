"""Block diffusion between AR and the paper's MDM: what the block size does to Theorem 4.4, measured exactly.

A block diffusion model attends bidirectionally inside blocks of b positions and causally across them: b = 1 is an
AR order, b = L the paper's MDM. Its blocks are decoded left to right, each in s steps. The exact-posterior oracle
is already a perfect block diffusion model (the masked blocks after the current one carry no information), so the
sequence error of block-wise sampling is measured here free of learning error, against two costs:

- *sequential forwards per token*: the forwards a row needs on its own (the steps in which it revealed something,
  over L), the latency;
- *positions computed per token*: what the forwards compute with the exact block cache of a block-causal model
  (completed blocks are never recomputed; a block's forwards compute the block, its first forward also the block
  before it, whose keys/values change once it completes), over L: ``(b * canvases + L - b) / L`` for blocks of
  equal size, with ``canvases`` the row's forwards (speculative decoding: every canvas it verifies). For b = L this
  is the forwards of the bidirectional model without a cache.

For the chain language of Theorem 4.4 the paper's sampler has a closed form at every block size
(`hf_mdm.languages.ChainLanguage.predicted_block_ser`), printed beside the measurement. A scale
(``evaluation/configs/block_diffusion.yaml``) lists languages with their lengths, block sizes, the paper's steps
per block, and other samplers run at every block size (threshold, speculative, remasking, as
`MaskedDiffusionGenerationConfig` fields). Writes ``block_diffusion.{json,md,png}``; cells are cached in
``<out>/cache/block_diffusion.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..languages import ChainLanguage, OracleDenoiser
from .a2d import a2d_rows, a2d_text
from .block_cells import measure, positions_per_token  # noqa: F401  (positions_per_token: named here by its tests)
from .blocks_trained import plot_trained, timing_rows, trained_rows, trained_text
from .budget import equal_flops_rows, equal_flops_text, plot_equal_flops
from .common import CellCache, experiment_result, language_name, language_parameters, make_language, write_outputs
from .plotting import pyplot, save_figure

#: The paper's sampler, run block by block.
PAPER = "paper (stochastic, random)"
COSTS = {"forwards_per_token": "sequential forwards / token", "positions_per_token": "positions computed / token"}


def block_diffusion(scale: dict, out: Path) -> dict[str, Any]:
    """Run (or resume) the experiment with ``scale`` and write ``block_diffusion.{json,md,png}`` into ``out``."""
    cache = CellCache(out / "cache" / "block_diffusion.json")
    rows: list[dict] = []
    for entry in scale["languages"]:
        spec = _spec(entry)
        language, name = make_language(spec), language_name(spec)
        oracle = OracleDenoiser(language, mask_token_id=language.vocab_size)
        for length in entry["lengths"]:
            points = block_points(scale, length)
            for sampler, block, settings in tqdm(points, desc=f"block diffusion {name} L={length}", leave=False):
                key = _cell_key(name, length, scale, block, settings)
                cell = cache.get(key, lambda: measure(oracle, language, length, block, settings, scale))
                row = {"language": name, "length": length, "model": "oracle", "sampler": sampler, **cell}
                if name == "chain" and sampler == PAPER:
                    row["predicted"] = ChainLanguage.predicted_block_ser(length, block, settings["steps_per_block"])
                rows.append(row)
    frontiers = {f"{r[0]}|{r[1]}|{cost}": pareto(rows, r, cost) for r in _panels(rows) for cost in COSTS}
    trained, timing = _trained_parts(scale, out, cache)
    budget = scale.get("trained", {}).get("equal_flops")
    flops = equal_flops_rows(budget, out, cache) if budget else []
    conversion = scale.get("trained", {}).get("a2d")
    converted = a2d_rows(conversion, out, cache) if conversion else []
    extra = {"trained": trained, "timing": timing, "equal_flops": flops, "a2d": converted}
    result = experiment_result("block_diffusion", scale, rows, frontiers=frontiers, **extra)
    text = "\n".join(setup_lines(scale)) + "\n" + blocks_table(rows) + "\n" + findings(rows) + "\n"
    if trained or timing:
        text += "\n" + trained_text(scale, trained, timing)
        plot_trained(trained, timing, out / "block_diffusion_trained.png")
    if flops:
        text += "\n" + equal_flops_text(budget, flops)
        plot_equal_flops(flops, out / "block_diffusion_budget.png")
    if converted:
        text += "\n" + a2d_text(conversion, converted)
    write_outputs(out, "block_diffusion", result, text, lambda p: plot_blocks(rows, p))
    return result


def _trained_parts(scale: dict, out: Path, cache: CellCache) -> tuple[list[dict], list[dict]]:
    """The trained models' rows and the timing rows, where the scale asks for them."""
    section = scale.get("trained")
    trained = trained_rows(section, out, cache) if section else []
    timing = timing_rows(section["timing"], cache) if section and section.get("timing") else []
    return trained, timing


def block_points(scale: dict, length: int) -> list[tuple[str, int, dict]]:
    """``(sampler, block size, settings)`` of every point at ``length``: the paper's sampler at each block size
    dividing L and each steps-per-block value up to the block size, then every other sampler at each block size
    (``min_block``: the smallest it runs at)."""
    blocks = [b for b in scale["block_sizes"] if b <= length and length % b == 0]
    if length not in blocks:
        blocks.append(length)  # the paper's MDM
    points = []
    for b in blocks:
        for s in sorted({min(s, b) for s in scale["steps_per_block"]}):
            points.append((PAPER, b, {"transfer": "stochastic", "strategy": "random", "steps_per_block": s}))
    for sampler in scale.get("samplers", []):
        fields = {k: v for k, v in sampler.items() if k not in ("name", "min_block")}
        for b in blocks:
            if b >= sampler.get("min_block", 1):
                points.append((sampler["name"], b, fields))
    return points


def _cell_key(language: str, length: int, scale: dict, block: int, settings: dict) -> str:
    described = json.dumps([scale["num_samples"], scale.get("seed", 0), block, settings], sort_keys=True)
    return f"oracle|{language}|{length}|{hashlib.sha1(described.encode()).hexdigest()[:12]}"


def pareto(rows: list[dict], panel: tuple, cost: str) -> list[dict]:
    """The points of ``panel`` (language, length) that no other point beats on both ``cost`` and SER (lower or equal
    on both, lower on one), by increasing cost."""
    pts = [r for r in rows if (r["language"], r["length"]) == panel]
    front = [
        r
        for r in pts
        if not any(
            o[cost] <= r[cost] and o["ser"] <= r["ser"] and (o[cost] < r[cost] or o["ser"] < r["ser"]) for o in pts
        )
    ]
    keep = ("sampler", "block_size", "steps", cost, "ser", "ser_ci_low", "ser_ci_high")
    return [{k: r[k] for k in keep} for r in sorted(front, key=lambda r: r[cost])]


def _spec(entry: dict) -> dict:
    """A language entry without this experiment's own key (``lengths``)."""
    return {k: v for k, v in entry.items() if k != "lengths"}


def _panels(rows: list[dict]) -> list[tuple]:
    return list(dict.fromkeys((r["language"], r["length"]) for r in rows))


# ----------------------------------------------------------------------------------------------------------------
# Text and plot


def setup_lines(scale: dict) -> list[str]:
    languages = "; ".join(
        f"{language_name(entry)} ({entry['kind']}: {language_parameters(_spec(entry))}) at L = "
        f"{', '.join(map(str, entry['lengths']))}"
        for entry in scale["languages"]
    )
    return [
        "",
        f"Languages: {languages}. Model: the exact-posterior oracle (a perfect block diffusion model). Every point: "
        f"{scale['num_samples']} sequences drawn at temperature 1 from the empty prompt, seeded, in blocks of b "
        "positions decoded left to right; SER and generative perplexity relative increase GenPPL(p)/TER(q) - 1 "
        "(the samples scored by the language; not the paper's TER) with 95% intervals (Wilson for SER). "
        "Costs: sequential forwards per token (a row's own forwards, over L) and positions computed per token "
        "with the exact block cache of a block-causal model.",
        "",
    ]


def blocks_table(rows: list[dict]) -> str:
    """Markdown: one line per point."""
    lines = [
        "| language | L | sampler | b | steps (all blocks) | SER | 95% CI | predicted | GenPPL(p)/TER(q) - 1 | 95% CI "
        "| sequential forwards / token | positions / token |",
        "| --- " * 12 + "|",
    ]
    for r in rows:
        predicted = f"{r['predicted']:.3f}" if "predicted" in r else ""
        lines.append(
            f"| {r['language']} | {r['length']} | {r['sampler']} | {r['block_size']} | {r['steps'] or ''} | "
            f"{r['ser']:.3f} | [{r['ser_ci_low']:.3f}, {r['ser_ci_high']:.3f}] | {predicted} | "
            f"{r['gen_ppl_increase']:+.4f} | [{r['gen_ppl_ci_low']:+.4f}, {r['gen_ppl_ci_high']:+.4f}] | "
            f"{r['forwards_per_token']:.3f} | {r['positions_per_token']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def findings(rows: list[dict]) -> str:
    """Sentences computed from the rows: the closed form's agreement on the chain, then per language and length
    the points no other beats on each cost and SER (the frontier), with their intervals."""
    lines = []
    checked = [r for r in rows if "predicted" in r]
    if checked:
        inside = sum(r["ser_ci_low"] <= r["predicted"] <= r["ser_ci_high"] for r in checked)
        worst = max(abs(r["ser"] - r["predicted"]) for r in checked)
        lines.append(
            f"Chain language, the paper's sampler: the closed form lies inside the 95% interval of {inside} of "
            f"{len(checked)} measured points (largest difference {worst:.3f})."
        )
    for panel in _panels(rows):
        for cost, label in COSTS.items():
            front = pareto(rows, panel, cost)
            described = "; ".join(
                f"{p['sampler']}, b = {p['block_size']}"
                + (f", {p['steps']} steps in all" if p["steps"] else "")
                + f": {p[cost]:.2f} -> SER {p['ser']:.3f} [{p['ser_ci_low']:.3f}, {p['ser_ci_high']:.3f}]"
                for p in front
            )
            lines.append(f"- {panel[0]}, L = {panel[1]}, against {label}, the frontier: {described}.")
    return "\n".join(lines) + "\n"


def plot_blocks(rows: list[dict], path: Path) -> None:
    """Per language and length, SER with its 95% interval against each cost (log x): the paper's sampler one line
    per block size over its steps per block, the other samplers as markers coloured by block size; the chain's
    closed form dotted (in the legend)."""
    plt = pyplot()
    panels = _panels(rows)
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.8 * len(panels)), squeeze=False)
    blocks = sorted({r["block_size"] for r in rows})
    colours = {b: plt.cm.viridis(i / max(1, len(blocks) - 1)) for i, b in enumerate(blocks)}
    markers = {name: m for name, m in zip(dict.fromkeys(r["sampler"] for r in rows if r["sampler"] != PAPER), "s^vD*P")}
    for (language, length), pair in zip(panels, axes):
        here = [r for r in rows if (r["language"], r["length"]) == (language, length)]
        for ax, cost in zip(pair, COSTS):
            _draw(ax, here, cost, colours, markers)
            ax.set(
                xscale="log", xlabel=COSTS[cost], ylabel="SER", ylim=(-0.02, 1.02), title=f"{language}, L = {length}"
            )
            ax.grid(alpha=0.3)
    handles = {label: h for ax in axes.flat for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=5, fontsize=7, frameon=False)
    save_figure(
        fig,
        path,
        "Block diffusion: SER against latency and compute (oracle); error bars: 95% intervals",
        bottom=0.05 + 0.02 * len(handles) / 5,
    )


def _draw(ax: Any, rows: list[dict], cost: str, colours: dict, markers: dict) -> None:
    for b in sorted({r["block_size"] for r in rows}):
        paper = sorted(
            (r[cost], r["ser"], r.get("predicted"), r.get("ser_ci_low", r["ser"]), r.get("ser_ci_high", r["ser"]))
            for r in rows
            if r["sampler"] == PAPER and r["block_size"] == b
        )
        if paper:
            xs, ys, predicted, lows, highs = zip(*paper)
            errors = [[y - lo for y, lo in zip(ys, lows)], [hi - y for y, hi in zip(ys, highs)]]
            ax.errorbar(
                xs, ys, yerr=errors, fmt="-o", color=colours[b], ms=3, capsize=2, label=f"paper's sampler, b = {b}"
            )
            if all(p is not None for p in predicted):
                ax.plot(xs, predicted, ":", color=colours[b], lw=1, label=f"closed form (chain), b = {b}")
        for r in rows:
            if r["sampler"] != PAPER and r["block_size"] == b and math.isfinite(r["ser"]):
                yerr = [[r["ser"] - r.get("ser_ci_low", r["ser"])], [r.get("ser_ci_high", r["ser"]) - r["ser"]]]
                ax.errorbar(
                    r[cost],
                    r["ser"],
                    yerr=yerr,
                    fmt=markers[r["sampler"]],
                    color=colours[b],
                    ms=5,
                    capsize=2,
                    label=r["sampler"],
                )
