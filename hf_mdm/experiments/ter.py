"""Experiment a: the paper's TER against the number of sampling steps (the paper's table; Theorem 4.2).

``ter_vs_steps`` measures, for the paper's sampler (stochastic transfer, random order, linear schedule) at N steps,
on n-gram languages at several lengths L, with the exact-posterior oracle (no learning error) and with trained MDMs
(the trained AR model as reference), two quantities under their own names (`ter_cells`):

- the paper's TER relative increase TER(p)/TER(q) - 1 (its epsilon_total), TER(p) = 2^(E_{x~q}[-log2 p(x)/L]),
  estimated (``ter_samples`` sequences of the language, at most ``ter_particles`` particles a run;
  `ter_cells.TER_ESTIMATOR`), exact for AR;
- the generative perplexity relative increase GenPPL(p)/TER(q) - 1 from ``num_samples`` samples.

Exact references beside them: at the small length ``exact["length"]`` both quantities of the oracle computed exactly
by enumerating the sampler's law (with the estimate beside them, to show its bias), and the chain language's closed
form (`ChainLanguage.predicted_ter_increase`) at every length and N. Theorem 4.2: the increase depends on N, not on
L. Writes ``ter_vs_steps.{json,md,png}``; cells are cached in ``<out>/cache/ter_vs_steps*.json``.
"""

from __future__ import annotations

import functools
import itertools
import math
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..languages import ChainLanguage, OracleDenoiser
from ..likelihood_law import RevealLaw, exact_sampler_log_probs
from ..likelihood_smc import MAX_PARTICLES
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
from .plotting import ar_lines, language_panels, mdm_curves
from .ter_cells import (
    GEN_PPL_MEANING,
    TER_ESTIMATOR,
    ar_ter_cell,
    exact_ter_cell,
    gen_ppl_cell,
    sampler_ter_cell,
)

#: Relative increases are drawn on a log axis, at least this.
PLOT_FLOOR = 1e-5
#: Defaults of the scale's paper-TER keys: sequences of the language per cell, most particles a run.
TER_SAMPLES, TER_PARTICLES = 128, MAX_PARTICLES
#: Seed of the language's sequences scored for the paper's TER (apart from the samplers' seeds).
TER_SEED = 10_000
#: The quantities of a row, by key prefix, and their names in tables.
QUANTITIES = {"ter": "TER(p)/TER(q) - 1 (the paper's TER)", "gen_ppl": "GenPPL(p)/TER(q) - 1 (generative perplexity)"}


def ter_vs_steps(scale: dict, out: Path) -> dict[str, Any]:
    """Run (or resume) the experiment with ``scale`` and write its outputs into ``out``; returns the JSON dict."""
    steps_list = scale["steps"]
    rows = measure_languages(
        "ter_vs_steps_gen_ppl", scale, out, cell=gen_ppl_cell, steps_for=lambda length: steps_list, label="GenPPL"
    )
    cache = CellCache(out / "cache" / "ter_vs_steps.json")
    add_paper_ter(rows, scale, out, cache)
    exact = exact_rows(scale, cache)
    chain = chain_rows(scale["lengths"], steps_list)
    fast = fast_rows(scale, out, cache, gen_ppl_cell)
    result = experiment_result("ter_vs_steps", scale, rows, exact_rows=exact, chain_rows=chain, fast_rows=fast)
    table = "\n".join(
        [
            *setup_lines(scale),
            f"Paper's TER, estimated: {TER_ESTIMATOR} Here n = {scale.get('ter_samples', TER_SAMPLES)}, "
            f"at most {scale.get('ter_particles', TER_PARTICLES)} particles a run; the trained AR model's p(x) is exact (its "
            "chain rule), its mean over the same n sequences an estimate with the same kind of interval.",
            "",
            ter_table(rows, steps_list, "ter"),
            f"{GEN_PPL_MEANING} {scale['num_samples']} samples per cell.",
            "",
            ter_table(rows, steps_list, "gen_ppl"),
            *validation_table(rows),
            exact_table(exact),
            chain_table(chain, steps_list),
            fast_table(fast, scale, "gen_ppl_increase", ("gen_ppl_ci_low", "gen_ppl_ci_high"), QUANTITIES["gen_ppl"]),
        ]
    )
    write_outputs(out, "ter_vs_steps", result, table, lambda p: plot_ter(rows, p))
    return result


def add_paper_ter(rows: list[dict], scale: dict, out: Path, cache: CellCache) -> None:
    """Adds the paper's TER (``ter_*`` keys) to every oracle row, and to the trained MDM and AR rows at the lengths
    ``scale["ter_trained_lengths"]`` (default: the training length, where AR is measured too), in place: a trained
    model's estimate costs a particle filter of transformer forwards."""
    num, particles = scale.get("ter_samples", TER_SAMPLES), scale.get("ter_particles", TER_PARTICLES)
    trained_lengths = scale.get("ter_trained_lengths", [scale["train_length"]])
    specs = {language_name(spec): spec for spec in scale["languages"]}
    languages = {name: make_language(spec) for name, spec in specs.items()}
    pairs = {
        name: lazy_pair(languages[name], scale["train_length"], scale, out, name, spec.get("training"))
        for name, spec in specs.items()
        if spec.get("train", False)
    }
    scored = [
        r
        for r in rows
        if r["model"] == "oracle MDM"
        or (r["model"] in ("trained MDM", "trained AR") and r["length"] in trained_lengths)
    ]
    for r in tqdm(scored, desc="paper's TER", leave=False):
        name = r["language"]
        key = f"{r['model']}|{name}|{r['length']}|{r['steps']}|{num}|smc{particles}"
        compute = functools.partial(paper_ter, r, languages[name], pairs.get(name), num, particles)
        r.update(cache.get(key, compute))


def paper_ter(row: dict, language: Any, pair: Any, num: int, particles: int) -> dict[str, Any]:
    """The paper's TER cell of a row: the oracle or trained MDM with the paper's sampler at the row's steps
    (estimated), or the trained AR model (exact p(x)); ``pair`` gives the trained models."""
    if row["model"] == "trained AR":
        return ar_ter_cell(pair()["ar"], language, row["length"], num, TER_SEED)
    model = (
        OracleDenoiser(language, mask_token_id=language.vocab_size) if row["model"] == "oracle MDM" else pair()["mdm"]
    )
    return sampler_ter_cell(model, language, RevealLaw(row["steps"]), row["length"], num, particles, TER_SEED)


def exact_rows(scale: dict, cache: CellCache) -> list[dict]:
    """At ``scale["exact"]["length"]``, per language and each N of ``scale["exact"]["steps"]``: the oracle's
    paper TER and generative perplexity, both exact (the sampler's law enumerated), and the estimate of the paper's
    TER (``ter_samples``, ``ter_particles``) beside them; [] without an ``exact`` section."""
    section = scale.get("exact")
    if not section:
        return []
    length, num, particles = (
        section["length"],
        scale.get("ter_samples", TER_SAMPLES),
        scale.get("ter_particles", TER_PARTICLES),
    )
    rows = []
    for spec in scale["languages"]:
        language, name = make_language(spec), language_name(spec)
        oracle = OracleDenoiser(language, mask_token_id=language.vocab_size)
        for steps in section["steps"]:
            law = RevealLaw(steps)
            exact = cache.get(f"exact|{name}|{length}|{steps}", lambda: exact_both(oracle, language, law, length))
            estimate = cache.get(
                f"estimate|{name}|{length}|{steps}|{num}|smc{particles}",
                lambda: sampler_ter_cell(oracle, language, law, length, num, particles, TER_SEED),
            )
            rows.append(
                {
                    "language": name,
                    "length": length,
                    "steps": steps,
                    **exact,
                    "estimate": estimate,
                    "max_particles": particles,
                }
            )
    return rows


def exact_both(model: Any, language: Any, law: RevealLaw, length: int) -> dict[str, Any]:
    """The paper's TER and the generative perplexity of the sampler, both exact, as relative increases, and the
    probability the sampler puts outside the support of q."""
    cell = exact_ter_cell(model, language, law, length)
    xs = torch.tensor(list(itertools.product(range(language.vocab_size), repeat=length)))
    p = exact_sampler_log_probs(model, law, length, language.vocab_size).exp()
    log_q = language.log_prob(xs)
    outside = float(p[~torch.isfinite(log_q)].sum())
    inside = torch.isfinite(log_q)
    gen = math.inf if outside > 0 else math.exp(float((p[inside] * -log_q[inside]).sum()) / length)
    reference = math.exp(language.expected_nll(length).value / length)
    return {**cell, "gen_ppl_increase": gen / reference - 1.0, "p_outside": outside}


def chain_rows(lengths: list[int], steps_list: list[int]) -> list[dict]:
    """The chain language's paper TER and SER of the paper's sampler with the oracle, in closed form (exact)."""
    return [
        {
            "length": length,
            "steps": steps,
            "ter_increase": ChainLanguage.predicted_ter_increase(length, steps),
            "ser": ChainLanguage.predicted_ser(length, steps),
        }
        for length in lengths
        for steps in steps_list
    ]


def _cell(r: dict, key: str) -> str:
    value, low, high = r[f"{key}_increase"], r[f"{key}_ci_low"], r[f"{key}_ci_high"]
    if r.get(f"{key}_kind") == "exact":
        return f"{100 * value:.3f}% (exact)"
    if r.get(f"{key}_kind") == "upper bound":
        return f"<= {100 * high:.2f}% (bound)"
    return f"{100 * value:.2f}% [{100 * low:.2f}, {100 * high:.2f}]"


def ter_table(rows: list[dict], steps_list: list[int], key: str) -> str:
    """Markdown: the relative increase ``key`` (``ter`` or ``gen_ppl``) with its 95% interval (in %) per language,
    length and model against N; AR (which takes L steps) in its own column."""
    lines = [
        f"{QUANTITIES[key]}, in %, 95% intervals in brackets:",
        "",
        "| language | L | model | " + " | ".join(f"N={s}" for s in steps_list) + " | trained AR (L steps) |",
        "| --- | --- | --- |" + " --- |" * (len(steps_list) + 1),
    ]
    groups: dict[tuple, dict[int, str]] = {}
    for r in rows:
        if r["model"] in ("oracle MDM", "trained MDM") and f"{key}_increase" in r:
            groups.setdefault((r["language"], r["length"], r["model"]), {})[r["steps"]] = _cell(r, key)
    ar = {
        (r["language"], r["length"]): _cell(r, key)
        for r in rows
        if r["model"] == "trained AR" and f"{key}_increase" in r
    }
    for (name, length, model), by_steps in groups.items():
        cells = [by_steps.get(s, "") for s in steps_list] + [
            ar.get((name, length), "") if model == "trained MDM" else ""
        ]
        lines.append(f"| {name} | {length} | {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def exact_table(rows: list[dict]) -> str:
    """Markdown: the exact rows, both directions, and the estimate of the paper's TER beside the exact value."""
    if not rows:
        return ""
    r0 = rows[0]
    lines = [
        "",
        f"Exact, oracle with the paper's sampler at L = {r0['length']} (every sequence enumerated), in %; the "
        f"estimator of the tables above beside it (n = {r0['estimate']['ter_num_sequences']}, at most "
        f"{r0['max_particles']} particles a run; its interval should hold the exact value):",
        "",
        "| language | N | TER(p)/TER(q) - 1 (exact) | estimate [95% CI] | GenPPL(p)/TER(q) - 1 (exact) "
        "| p(outside q) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        e = r["estimate"]
        lines.append(
            f"| {r['language']} | {r['steps']} | {100 * r['ter_increase']:.3f}% | {100 * e['ter_increase']:.3f}% "
            f"[{100 * e['ter_ci_low']:.3f}, {100 * e['ter_ci_high']:.3f}] | {100 * r['gen_ppl_increase']:.3f}% | "
            f"{r['p_outside']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def chain_table(rows: list[dict], steps_list: list[int]) -> str:
    """Markdown: the chain language's closed forms against L and N (exact)."""
    lines = [
        "",
        "Chain language (Theorem 4.4), oracle with the paper's sampler, closed form (exact): TER(p)/TER(q) - 1 = "
        "(1 - 3/(4N))^(-(L-1)/L) - 1 (flat in L) beside SER = 1 - (1 - 3/(4N))^(L-1) (growing with L):",
        "",
        "| L | " + " | ".join(f"N={s}: TER / SER" for s in steps_list) + " |",
        "| --- |" + " --- |" * len(steps_list),
    ]
    for length in dict.fromkeys(r["length"] for r in rows):
        by = {r["steps"]: r for r in rows if r["length"] == length}
        cells = [f"{100 * by[s]['ter_increase']:.2f}% / {by[s]['ser']:.3f}" for s in steps_list]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_ter(rows: list[dict], path: Path) -> None:
    """One log-log panel per language: the paper's TER relative increase against N, one curve per model and
    length, 95% intervals as bands; a cell holding only an upper bound is left off its curve and drawn as a
    downward triangle at the bound."""

    def clip(value: float) -> float:
        return max(value, PLOT_FLOOR)

    estimates = [r for r in rows if r.get("ter_kind") != "upper bound"]

    def draw(ax: Any, name: str) -> None:
        mdm_curves(ax, estimates, name, "steps", "ter_increase", clip, interval=("ter_ci_low", "ter_ci_high"))
        ar_lines(ax, estimates, name, "ter_increase", clip, interval=("ter_ci_low", "ter_ci_high"))
        bounds = [r for r in rows if r["language"] == name and r.get("ter_kind") == "upper bound"]
        if bounds:
            ax.plot(
                [r["steps"] for r in bounds],
                [clip(r["ter_ci_high"]) for r in bounds],
                "kv",
                ms=6,
                fillstyle="none",
                label="upper bound only",
            )
            ax.legend(fontsize=7)
        ax.set(xscale="log", yscale="log", xlabel="sampling steps N", ylabel="TER(p)/TER(q) - 1", title=name)

    language_panels(
        rows,
        path,
        4.2,
        "The paper's TER relative increase vs steps (Theorem 4.2: depends on N, not L)\nbands: 95% intervals; "
        f"values below {PLOT_FLOOR:g} drawn at {PLOT_FLOOR:g}; triangles: upper bounds only",
        draw,
    )
