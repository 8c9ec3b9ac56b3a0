"""The cells of the ``block_diffusion`` experiment: a model sampled at one block size (`measure`: SER, generative
perplexity and the costs of a token), the AR model's cell (`ar_cell`), and the names of the models compared.

Shared by the oracle's measurement (`hf_mdm.experiments.blocks`), the trained models
(`hf_mdm.experiments.blocks_trained`), the judged decoding law (`hf_mdm.experiments.decoding`) and the equal-FLOPs
comparison (`hf_mdm.experiments.budget`).
"""

from __future__ import annotations

from typing import Any

import torch

from .common import sample_ar
from .fast import active_steps, generate_batches
from .ser import ser_cell
from .ter_cells import gen_ppl_cell

AR = "AR (KV cache)"
PAPER_SAMPLER = {"transfer": "stochastic", "strategy": "random"}


def model_label(block: int, length: int) -> str:
    return f"MDM (b = L = {length})" if block == length else f"block diffusion (b = {block})"


def block_sizes(section: dict) -> list[int]:
    """L (the MDM), then every block size of ``section`` below L that divides it."""
    length = section["length"]
    return [length, *[b for b in section["block_sizes"] if b < length and length % b == 0]]


def generate_settings(block: int, length: int, settings: dict) -> dict:
    """The `diffusion_generate` fields of a point: blocks of ``block``, ``steps_per_block`` (or ``steps_over_block``,
    a fraction of the block) times the number of blocks as ``steps``."""
    fields = dict(settings)
    per_block = fields.pop("steps_per_block", None)
    ratio = fields.pop("steps_over_block", None)
    if ratio is not None:
        per_block = max(1, int(round(ratio * block)))
    if per_block is not None:
        fields["steps"] = per_block * (length // block)
    return {**fields, "block_length": block}


def measure(model: Any, language: Any, length: int, block: int, settings: dict, scale: dict) -> dict:
    """One point: ``scale["num_samples"]`` samples at temperature 1, their SER and generative perplexity with 95%
    intervals, the sequential forwards per token and the positions computed per token with the exact block cache."""
    num, fields = scale["num_samples"], generate_settings(block, length, settings)
    samples, forwards, canvases = [], [], 0.0
    for out in generate_batches(model, num, length, scale.get("seed", 0), fields, scale.get("batch_size", 256)):
        samples.append(out.sequences.cpu())
        forwards.append(active_steps(out.history, int(model.config.mask_token_id)).double())
        if fields.get("transfer") == "speculative":
            canvases += float(out.forward_rows)  # every canvas a round verifies
    samples, forwards = torch.cat(samples), torch.cat(forwards)
    per_row = canvases / num if canvases else float(forwards.mean())
    ser = ser_cell(language, samples)
    gen_ppl = gen_ppl_cell(language, samples)
    return {
        "block_size": block,
        "steps": fields.get("steps"),
        **ser,
        "gen_ppl_increase": gen_ppl["gen_ppl_increase"],
        "gen_ppl_ci_low": gen_ppl["gen_ppl_ci_low"],
        "gen_ppl_ci_high": gen_ppl["gen_ppl_ci_high"],
        "forwards_per_token": float(forwards.mean()) / length,
        "positions_per_token": positions_per_token(length, block, per_row),
        "num_samples": num,
    }


def positions_per_token(length: int, block: int, canvases: float) -> float:
    """Positions computed per token with the exact block cache: every canvas of a row computes its block
    (``block`` positions), and each block but the first recomputes the completed block before it once
    (``length - block`` positions in all), over ``length``. Blocks of equal size."""
    return (block * canvases + (length - block)) / length


def ar_cell(model: Any, language: Any, section: dict) -> dict:
    samples = sample_ar(model, section["num_samples"], section["length"], seed=section.get("seed", 0))
    gen_ppl = gen_ppl_cell(language, samples)
    return {
        **ser_cell(language, samples),
        **{k: gen_ppl[k] for k in ("gen_ppl_increase", "gen_ppl_ci_low", "gen_ppl_ci_high")},
        "forwards_per_token": 1.0,
        "positions_per_token": 1.0,  # the KV cache: each forward computes the new token only
        "num_samples": section["num_samples"],
    }
