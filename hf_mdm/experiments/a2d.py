"""A2D on a synthetic language: an AR model converted into a masked diffusion model against an MDM trained from
scratch at equal training tokens, over several seeds: the ``a2d`` part of ``block_diffusion``.

For each seed of ``seeds`` (a new training sample, initialisation and masking draws each): an AR model (the matched
Llama of `hf_mdm.training`) is trained for ``ar_training_steps`` steps; it is converted (`hf_mdm.finetune.a2d`: bidirectional
attention, Dream's logits shift, its BOS row the [MASK] row) and trained ``diffusion_training_steps`` more steps on the MDM
objective; an MDM of the same size is trained from scratch for ``ar_training_steps + diffusion_training_steps`` steps, so both diffusion
models have seen the same training tokens. Measured: the validation NLL per token over the language's entropy,
minus 1 (the ELBO's bound for the diffusion models), and the SER of ``num_samples`` samples decoded one token a step
(AR: ancestral). Means with 95% Student-t intervals over the seeds; the converted model's difference to the scratch
MDM paired by seed, called only where its interval excludes 0; and what the conversion keeps of the AR model's
quality: the converted model's gap and SER beside the AR model's it started from.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..finetune.a2d import convert_to_mdm
from .blocks_trained import PAPER_SAMPLER, ar_cell
from .budget import QUANTITIES, difference_verdict, mean_interval
from .common import CellCache, language_name, make_language, trained_model

AR, CONVERTED, SCRATCH = "AR", "A2D (AR converted, then MDM-trained)", "MDM from scratch"


def a2d_rows(section: dict, out: Path, cache: CellCache) -> list[dict]:
    """One row per model and seed: its training steps and tokens, validation gap and SER."""
    spec = section["language"]
    language, name = make_language(spec), language_name(spec)
    described = {k: v for k, v in section.items() if k != "seeds"}
    digest = hashlib.sha1(json.dumps(described, sort_keys=True, default=dict).encode()).hexdigest()[:12]
    rows = []
    for seed in tqdm(section["seeds"], desc="A2D against an MDM from scratch", leave=False):
        cells = cache.get(f"a2d|seed {seed}|{digest}", lambda: _seed_cells(language, name, section, seed, out))
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
    measured = {"num_samples": section["num_samples"], "seed": seed, "batch_size": section.get("batch_size", 256)}
    one_a_step = {**PAPER_SAMPLER, "steps_per_block": length}
    from .blocks import measure  # the oracle's measurement, applied to a trained model

    cells = [(AR, ar["ar_gap"], ar_cell(ar["ar"], language, {**measured, "length": length}), ar_steps)]
    for label, trained, steps in (
        (CONVERTED, converted, ar_steps + mdm_steps),
        (SCRATCH, scratch, ar_steps + mdm_steps),
    ):
        cells.append(
            (label, trained["mdm_gap"], measure(trained["mdm"], language, length, length, one_a_step, measured), steps)
        )
    return [
        {"model": label, "gap": float(gap), "ser": cell["ser"], "steps": steps, "tokens": steps * tokens}
        for label, gap, cell, steps in cells
    ]


def a2d_summary(rows: list[dict]) -> list[dict]:
    """Per model: each quantity's mean over the seeds with its interval; for the converted model also its
    seed-paired difference to the scratch MDM (``d_<key>``) and to the AR model it started from (``ar_<key>``)."""
    by_seed = {m: {r["seed"]: r for r in rows if r["model"] == m} for m in (AR, CONVERTED, SCRATCH)}
    summary = []
    for model, seeds in by_seed.items():
        entry = {"model": model, "seeds": len(seeds), "tokens": next(iter(seeds.values()))["tokens"]}
        for key, _ in QUANTITIES:
            entry[key], entry[f"{key}_low"], entry[f"{key}_high"] = mean_interval([r[key] for r in seeds.values()])
            if model == CONVERTED:
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
        f"{section['ar_training_steps'] + section['diffusion_training_steps']} steps (the same training tokens), seeds {section['seeds']}; "
        f"SER from {section['num_samples']} samples per seed decoded one token a step. Means with 95% Student-t "
        "intervals; differences paired by seed.",
        "",
        "| model | training tokens | NLL / entropy - 1 | 95% CI | SER | 95% CI |",
        "| --- " * 6 + "|",
    ]
    for e in summary:
        lines.append(
            f"| {e['model']} | {e['tokens']:,} | {e['gap']:+.4f} | [{e['gap_low']:+.4f}, {e['gap_high']:+.4f}] | "
            f"{e['ser']:.3f} | [{e['ser_low']:.3f}, {e['ser_high']:.3f}] |"
        )
    converted = next(e for e in summary if e["model"] == CONVERTED)
    against = "; ".join(difference_verdict(converted, key, name, "the scratch MDM's") for key, name in QUANTITIES)
    # against the AR model only the gap, and only as a bound: the converted model's is the ELBO's (an upper bound on
    # its NLL), the AR model's its exact NLL; the SERs come from different samplers (one token a step, ancestral)
    bound = difference_verdict(converted, "gap", "the ELBO bound's gap", "the AR model's exact gap", "ar")
    lines += ["", f"- Converted against the scratch MDM: {against}.", f"- Converted against the AR model: {bound}."]
    return "\n".join(lines) + "\n"
