"""A2D on a synthetic language: an AR model converted into a masked diffusion model against an MDM trained from
scratch at equal training tokens, over several seeds: the ``a2d`` part of ``block_diffusion``.

For each seed of ``seeds`` (a new training sample, initialisation and masking draws each): an AR model (the matched
Llama of `hf_mdm.training`) is trained for ``ar_training_steps`` steps; it is converted (`hf_mdm.finetune.a2d`:
bidirectional attention, Dream's logits shift, its BOS row the [MASK] row) and trained ``diffusion_training_steps``
more steps on the MDM objective; an MDM of the same size is trained from scratch for ``ar_training_steps +
diffusion_training_steps`` steps, so both diffusion models have seen the same training tokens. Every model is judged
by one decoding law (`hf_mdm.experiments.decoding`): one token a step from left to right, which for the AR model is
its ancestral sampling: its exact NLL per token over the language's entropy, minus 1, on held-out sequences, and the
SER of ``num_samples`` samples; the paper's sampler's SER at N = L and the ELBO's bound are shown beside them. Means
with 95% Student-t intervals over the seeds; the converted model's differences to the scratch MDM and to the AR model
it started from, paired by seed, each called only where its interval excludes 0: the same law and exact likelihoods
on both sides, so what the conversion keeps of the AR model can be read.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..finetune.a2d import convert_to_mdm
from .budget import BESIDE, QUANTITIES, beside_cell, difference_verdict, mean_interval
from .common import CellCache, language_name, make_language, trained_model
from .decoding import judged_cell

AR, CONVERTED, SCRATCH = "AR", "A2D (AR converted, then MDM-trained)", "MDM from scratch"


def a2d_rows(section: dict, out: Path, cache: CellCache) -> list[dict]:
    """One row per model and seed: its training steps and tokens, validation gap and SER."""
    spec = section["language"]
    language, name = make_language(spec), language_name(spec)
    described = {k: v for k, v in section.items() if k != "seeds"}
    digest = hashlib.sha1(json.dumps(described, sort_keys=True, default=dict).encode()).hexdigest()[:12]
    rows = []
    for seed in tqdm(section["seeds"], desc="A2D against an MDM from scratch", leave=False):
        cells = cache.get(f"a2d3|seed {seed}|{digest}", lambda: _seed_cells(language, name, section, seed, out))
        rows.extend({"language": name, "length": section["length"], "seed": seed, **cell} for cell in cells)
    return rows


def _seed_cells(language: Any, name: str, section: dict, seed: int, out: Path) -> list[dict]:
    length, ar_steps, mdm_steps = section["length"], section["ar_training_steps"], section["diffusion_training_steps"]
    tag, tokens = f"{name}-a2d", section["training"]["batch_size"] * length
    ar = trained_model(
        "ar", language, length, section, out, tag, {"seed": seed, "max_steps": ar_steps, "ar_max_steps": ar_steps}
    )
    vocab = language.vocab_size  # the AR model's BOS id, whose row becomes [MASK]
    converted = trained_model(
        "mdm", language, length, section, out, tag,
        {"seed": seed, "max_steps": mdm_steps, "init": f"a2d of the AR model of seed {seed}, {ar_steps} steps"},
        initial=lambda: convert_to_mdm(ar["ar"], mask_token_id=vocab).train(),
    )  # fmt: skip
    scratch = trained_model(
        "mdm", language, length, section, out, tag, {"seed": seed, "max_steps": ar_steps + mdm_steps}
    )
    cells = [
        (AR, judged_cell("ar", ar, language, section, seed), ar_steps),
        (CONVERTED, judged_cell("mdm", converted, language, section, seed), ar_steps + mdm_steps),
        (SCRATCH, judged_cell("mdm", scratch, language, section, seed), ar_steps + mdm_steps),
    ]
    return [{"model": label, **cell, "steps": steps, "tokens": steps * tokens} for label, cell, steps in cells]


def a2d_summary(rows: list[dict]) -> list[dict]:
    """Per model: each quantity's mean over the seeds with its interval; for the converted model also its
    seed-paired difference to the scratch MDM (``d_<key>``) and to the AR model it started from (``ar_<key>``)."""
    by_seed = {m: {r["seed"]: r for r in rows if r["model"] == m} for m in (AR, CONVERTED, SCRATCH)}
    summary = []
    for model, seeds in by_seed.items():
        entry = {"model": model, "seeds": len(seeds), "tokens": next(iter(seeds.values()))["tokens"]}
        for key, _ in QUANTITIES + BESIDE:
            values = [r[key] for r in seeds.values() if r.get(key) is not None]
            if not values:
                continue
            entry[key], entry[f"{key}_low"], entry[f"{key}_high"] = mean_interval(values)
            if model == CONVERTED and (key, _) in QUANTITIES:
                for other, prefix in ((SCRATCH, "d"), (AR, "ar")):
                    paired = [seeds[s][key] - by_seed[other][s][key] for s in sorted(seeds)]
                    entry[f"{prefix}_{key}"], entry[f"{prefix}_{key}_low"], entry[f"{prefix}_{key}_high"] = (
                        mean_interval(paired)
                    )
        summary.append(entry)
    return summary


def a2d_text(section: dict, rows: list[dict]) -> str:
    """The markdown: set-up, the table over the seeds, the findings against the scratch MDM and the AR model."""
    summary = a2d_summary(rows)
    lines = [
        f"A2D ({rows[0]['language']}, L = {section['length']}, size {section['training']['size']!r}): an AR model "
        f"trained {section['ar_training_steps']} steps, converted (bidirectional attention, logits shift 1) and trained "
        f"{section['diffusion_training_steps']} steps on the MDM objective, against an MDM trained from scratch for "
        f"{section['ar_training_steps'] + section['diffusion_training_steps']} steps (the same training tokens), seeds "
        f"{section['seeds']}. Every model is judged by one decoding law, one token a step from left to right (for AR "
        f"its ancestral sampling): its exact NLL per token on {section.get('nll_sequences', 1024)} held-out sequences "
        f"and the SER of {section['num_samples']} samples per seed; beside them, without verdicts, the SER one token a "
        "step in a random order, the paper's sampler's SER at N = L and the ELBO's upper bound. Means with 95% Student-t intervals; differences paired by "
        "seed.",
        "",
        "| model | training tokens | exact NLL / entropy - 1 | 95% CI | SER, left to right | 95% CI "
        "| SER, random order | SER, paper's sampler (N = L) | ELBO bound / entropy - 1 |",
        "| --- " * 9 + "|",
    ]
    for e in summary:
        lines.append(
            f"| {e['model']} | {e['tokens']:,} | {e['gap']:+.4f} | [{e['gap_low']:+.4f}, {e['gap_high']:+.4f}] | "
            f"{e['ser']:.3f} | [{e['ser_low']:.3f}, {e['ser_high']:.3f}] | {beside_cell(e, 'ser_random')} | "
            f"{beside_cell(e, 'ser_paper')} | "
            f"{beside_cell(e, 'elbo_gap', 4, True)} |"
        )
    converted = next(e for e in summary if e["model"] == CONVERTED)
    against = "; ".join(difference_verdict(converted, key, name, "the scratch MDM's") for key, name in QUANTITIES)
    ar = "; ".join(difference_verdict(converted, key, name, "the AR model's", "ar") for key, name in QUANTITIES)
    lines += ["", f"- Converted against the scratch MDM: {against}.", f"- Converted against the AR model: {ar}."]
    return "\n".join(lines) + "\n"
