"""The learning error of a trained MDM, apart from the decoding error of its sampler.

A trained MDM's SER mixes two errors: *learning* (its denoiser is not the language's posterior) and *decoding* (the
sampler draws several tokens of a step independently). They separate on synthetic languages:

- `denoiser_kl`: the mean KL divergence, per masked position, from the language's exact posterior q(x_i | x_t) to
  the trained denoiser's p_theta(x_i | x_t), over sequences of the language masked at t ~ U(0, 1) (the training
  distribution of canvases): 0 for the oracle, so it is learning error alone, in nats per masked token, with its
  95% interval over sequences;
- the same model's SER decoding one token a step in random order (no two tokens drawn together: no decoding error
  of the paper's kind) beside its SER under parallel settings, and the oracle's SER under those settings (decoding
  error alone): `learning_sentences` states them side by side from the rows of the SER experiment.
"""

from __future__ import annotations

from typing import Any

import torch

from ..likelihood_law import token_log_probs
from ..metrics.common import mean_interval


def denoiser_kl(model: Any, language: Any, length: int, num: int, seed: int, batch_size: int = 256) -> dict[str, Any]:
    """``{"kl": mean, "kl_ci_low", "kl_ci_high", "num_sequences"}``: the KL from the language's posterior to the
    trained denoiser, in nats per masked position, averaged per sequence over its masked positions."""
    generator = torch.Generator().manual_seed(seed)
    x = language.sample(num, length, generator)
    t = torch.rand(num, 1, generator=generator, dtype=torch.float64)
    masked = torch.rand(num, length, generator=generator, dtype=torch.float64) < t
    masked[masked.sum(1) == 0, 0] = True  # every sequence scores at least one position
    mask_id = int(model.config.mask_token_id)
    x_t = torch.where(masked, torch.full_like(x, mask_id), x)
    per_sequence = []
    for start in range(0, num, batch_size):
        rows = slice(start, start + batch_size)
        log_q = language.log_posterior(x_t[rows], mask_id)  # (B, L, V) float64
        log_p = token_log_probs(model, x_t[rows], language.vocab_size, batch_size)  # what the sampler draws from
        kl = torch.where(log_q.isfinite(), log_q.exp() * (log_q - log_p), torch.zeros_like(log_q)).sum(-1)
        m = masked[rows]
        per_sequence.append((kl * m).sum(1) / m.sum(1))
    values = torch.cat(per_sequence)
    mean, low, high = mean_interval(values, 0.95)
    return {"kl": mean, "kl_ci_low": low, "kl_ci_high": high, "num_sequences": num}


def _fmt(r: dict) -> str:
    return f"{r['ser']:.3f} [{r['ser_ci_low']:.3f}, {r['ser_ci_high']:.3f}]"


def learning_sentences(rows: list[dict], fast: list[dict], learning: list[dict]) -> list[str]:
    """Per trained language: the denoiser's KL to the posterior, the trained model's SER one token a step in random
    order (learning error alone) beside its SER and the oracle's at each parallel N/L measured at that length."""
    lines = []
    for entry in learning:
        name, length = entry["language"], entry["length"]
        one = next(
            (
                r
                for r in fast
                if r["language"] == name and r["model"] == "trained MDM" and r["sampler"] == ONE_TOKEN_RANDOM
            ),
            None,
        )
        text = (
            f"{name}, L = {length}: the trained denoiser's KL to the language's posterior is {entry['kl']:.4f} "
            f"[{entry['kl_ci_low']:.4f}, {entry['kl_ci_high']:.4f}] nats per masked token (n = "
            f"{entry['num_sequences']}; 0 for the oracle)"
        )
        if one is not None:
            text += f"; decoding one token a step in random order it has SER {_fmt(one)} (learning error alone)"
        pairs = []
        for r in rows:
            if r["language"] == name and r["length"] == length and r["model"] == "trained MDM" and r["steps"] < length:
                oracle = next(
                    (
                        o
                        for o in rows
                        if o["model"] == "oracle MDM"
                        and o["language"] == name
                        and o["length"] == length
                        and o["steps"] == r["steps"]
                    ),
                    None,
                )
                if oracle is not None:
                    pairs.append(f"N = {r['steps']}: trained {_fmt(r)}, oracle {_fmt(oracle)}")
        if pairs:
            text += "; with the paper's sampler (both errors for the trained model, decoding alone for the oracle): "
            text += "; ".join(pairs)
        lines.append(text + ".")
    return lines


#: The fast-sampler row of one token a step in random order (the name the scales give it).
ONE_TOKEN_RANDOM = "random order, 1 token/step"
