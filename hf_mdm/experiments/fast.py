"""What fast sampling costs on the synthetic languages: KV caches and parallel decoding, against the exact language.

Fast-dLLM's block caches (``kv_cache="prefix"`` / ``"dual"``) approximate the network's output; threshold and
entropy-bound decoding reveal several tokens per forward. On a synthetic language the cost of each is measured
against the language's exact likelihood: the generative perplexity and SER of its samples (estimates from
``num_samples`` samples, with 95% intervals), next to the same sampler without the speed-up.
A scale's ``fast_samplers`` section (in ``ter_vs_steps.yaml`` and ``ser_vs_steps.yaml``) lists the samplers, as
`MaskedDiffusionGenerationConfig` fields, run at ``train_length`` in blocks of ``block_length`` at temperature 1
(samples, not argmax, so that generative perplexity and SER measure the distribution). Every sampler runs on the
trained MDM; those without a cache also on the exact-posterior oracle (which has no keys/values), where the
difference to the one-token-a-step row is the parallel rule's own cost, free of learning error. Sampler names say
their order and transfer rule. The table's baseline (``fast_samplers.baseline``) is an exact sampler: random order, one
token a step, whose law with the oracle is the language itself (any order of exact conditionals is the chain rule).
Every row reports its costs on the same three axes: sequential forwards per token (the steps in which a row revealed
something, over L), positions computed per token (rows x positions of every forward, over the tokens generated)
and wall-clock milliseconds per token (this machine, batches of 256). Cells are cached with the experiment's.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from tqdm.auto import tqdm

from ..generation import diffusion_generate
from ..generation_denoiser import model_device
from ..languages import OracleDenoiser
from .common import CellCache, language_name, lazy_pair, make_language

#: The costs of each cell, and their names in tables.
FAST_COSTS = {
    "forwards_per_token": "sequential forwards / token",
    "positions_per_token": "positions computed / token",
    "ms_per_token": "wall ms / token",
}


def fast_rows(scale: dict, out: Path, cache: CellCache, score: Callable[[Any, torch.Tensor], dict]) -> list[dict]:
    """Rows of every fast sampler of ``scale["fast_samplers"]`` for every language entry of the scale (oracle
    rows for cache-free samplers, trained-MDM rows for languages with ``train``); [] without that section.
    ``score(language, samples)`` gives a cell's metric values."""
    section = scale.get("fast_samplers")
    if not section:
        return []
    rows: list[dict] = []
    for spec in scale["languages"]:
        language, name = make_language(spec), language_name(spec)
        models = {"oracle MDM": lambda: OracleDenoiser(language, mask_token_id=language.vocab_size)}
        if spec.get("train", False):
            pair = lazy_pair(language, scale["train_length"], scale, out, name, spec.get("training"))
            models["trained MDM"] = lambda: pair()["mdm"]
        for sampler in tqdm(section["samplers"], desc=f"fast samplers {name}", leave=False):
            for model_name, model in models.items():
                if model_name == "oracle MDM" and sampler.get("kv_cache"):
                    continue
                cell = cache.get(
                    _cell_key(model_name, name, scale["train_length"], section, sampler),
                    lambda: _measure(model(), language, scale, section, sampler, score),
                )
                rows.append(
                    {
                        "language": name,
                        "length": scale["train_length"],
                        "model": model_name,
                        "sampler": sampler["name"],
                        **cell,
                    }
                )
    return rows


def _cell_key(model: str, language: str, length: int, section: dict, sampler: dict) -> str:
    settings = json.dumps([section.get("block_length"), section.get("seed", 0), dict(sampler)], sort_keys=True)
    return f"fast|{model}|{language}|{length}|{hashlib.sha1(settings.encode()).hexdigest()[:10]}"


def _measure(model: Any, language: Any, scale: dict, section: dict, sampler: dict, score) -> dict:
    settings = {k: v for k, v in sampler.items() if k != "name"}
    samples, costs = sample_with(model, scale["num_samples"], scale["train_length"], section, settings)
    return {**score(language, samples), **costs, "num_samples": int(samples.shape[0])}


def generate_batches(
    model: Any, num: int, length: int, seed: int, settings: dict, batch_size: int = 256
) -> Iterator[Any]:
    """The outputs, batch by batch, of drawing ``num`` sequences of ``length`` tokens from the empty prompt with
    ``settings`` (default ``steps=None``) at temperature 1, each batch seeded ``seed`` + its first row and carrying
    its step canvases (``output_history``)."""
    kwargs = {"steps": None, **settings, "temperature": 1.0}
    for start in range(0, num, batch_size):
        empty = torch.zeros(min(batch_size, num - start), 0, dtype=torch.long, device=model_device(model))
        yield diffusion_generate(
            model,
            empty,
            max_new_tokens=length,
            seed=seed + start,
            stop_at_eos=False,
            output_history=True,
            return_dict_in_generate=True,
            **kwargs,
        )


def sample_with(
    model: Any, num: int, length: int, section: dict, settings: dict, batch_size: int = 256
) -> tuple[torch.Tensor, dict[str, float]]:
    """``num`` samples of ``length`` tokens drawn with ``settings`` (default ``steps=None``) at temperature 1 in
    blocks of ``section["block_length"]``, and their costs per token generated (`FAST_COSTS`): a row's mean
    forwards in which it revealed something, the positions the forwards computed, the wall-clock milliseconds."""
    settings = {**settings, "block_length": section.get("block_length")}
    samples, forwards, positions = [], [], 0
    batches = generate_batches(model, num, length, section.get("seed", 0), settings, batch_size)
    start = time.perf_counter()
    for out in batches:
        samples.append(out.sequences.cpu())
        forwards.append(active_steps(out.history, int(model.config.mask_token_id)))
        positions += int(out.forward_tokens)
    seconds = time.perf_counter() - start
    tokens = num * length
    return torch.cat(samples), {
        "forwards_per_token": float(torch.cat(forwards).float().mean()) / length,
        "positions_per_token": positions / tokens,
        "ms_per_token": 1000 * seconds / tokens,
    }


def active_steps(history: tuple, mask_id: int) -> torch.Tensor:
    """(B,) the steps in which each row revealed at least one token (its forwards), from the step canvases."""
    canvases = torch.stack([torch.full_like(history[0], mask_id), *history])
    revealed = (canvases[:-1] == mask_id) & (canvases[1:] != mask_id)  # a remasking step may also take tokens back
    return revealed.any(-1).sum(0)


def fast_table(rows: list[dict], scale: dict, value: str, interval: tuple[str, str], label: str) -> str:
    """Markdown: one line per fast-sampling row: the metric with its 95% interval, the costs (`FAST_COSTS`), and
    the change against the scale's ``fast_samplers.baseline`` sampler (exact in law with the oracle) of the same
    language and model."""
    if not rows:
        return ""
    baseline = scale["fast_samplers"]["baseline"]
    base = {(r["language"], r["model"]): r[value] for r in rows if r["sampler"] == baseline}
    lines = [
        "",
        f"Fast sampling at L = {rows[0]['length']} (temperature 1, blocks of "
        f"{scale['fast_samplers'].get('block_length')}, {rows[0]['num_samples']} samples per row); {label}; "
        f"baseline: {baseline} (with the oracle its law is the language's; its value here is estimated from the same samples as every row).",
        "",
        f"| language | model | sampler | value | 95% CI | {' | '.join(FAST_COSTS.values())} | change vs baseline |",
        "| --- " * (6 + len(FAST_COSTS)) + "|",
    ]
    for r in rows:
        ref = base.get((r["language"], r["model"]))
        change = f"{r[value] - ref:+.4f}" if ref is not None and math.isfinite(r[value]) else ""
        costs = " | ".join(f"{r[k]:.3f}" if k in r else "" for k in FAST_COSTS)
        lines.append(
            f"| {r['language']} | {r['model']} | {r['sampler']} | {r[value]:.4f} | "
            f"[{r[interval[0]]:.4f}, {r[interval[1]]:.4f}] | {costs} | {change} |"
        )
    return "\n".join(lines) + "\n"
