"""What a trained model is judged by: one decoding law for every model, its SER and its exact NLL, and the paper's
sampler beside it.

A verdict about training (block sizes at equal FLOPs, A2D, AR against the MDM) must not measure a sampler instead:
the paper's sampler at N = L reveals a random number of tokens a step, and with the exact denoiser its SER is far
above 0 on the HMM language, so part of any difference would be the sampler's own. The law every model is judged by
here (``LEARNED``) decodes one token a step from left to right at temperature 1: exact for the oracle (SER 0), so
what errs is what the model learned; for an autoregressive model it is its ancestral sampling. Its likelihood is
exact (`hf_mdm.likelihood.left_to_right_log_probs`; `ar_log_probs` for the AR model), so the diffusion models' NLL
can stand beside the AR model's; the ELBO, an upper bound on the NLL, is kept beside it as a bound only. The order is
part of the law: a model trained for left to right (AR; block diffusion across its blocks) is judged in its own
order, the MDM, trained for every order, in one of them; the SER in a random order is shown beside (no verdict).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..generation_denoiser import model_device
from ..likelihood import left_to_right_log_probs
from .block_cells import PAPER_SAMPLER, ar_cell, measure

#: One token a step, left to right (with ``steps_per_block`` = the block size: N = L in all).
LEARNED = {"transfer": "deterministic", "strategy": "left_to_right"}
#: One token a step in a random order: also exact for the oracle, the order the MDM's objective averages over; its
#: SER is shown beside, since the judged law's order favours a model trained for it (AR; block diffusion across
#: blocks) over one trained for every order (the MDM).
RANDOM_ORDER = {"transfer": "deterministic", "strategy": "random"}
#: The columns of the judged cell: (row key, name). The first two are judged; the last two are shown beside them.
LEARNED_SER = ("ser", "SER, one token a step left to right (AR: ancestral)")
EXACT_GAP = ("gap", "exact NLL / entropy - 1 (one token a step left to right; AR: its own)")
PAPER_SER = ("ser_paper", "SER, the paper's sampler at N = L")
RANDOM_SER = ("ser_random", "SER, one token a step in random order")
ELBO_GAP = ("elbo_gap", "ELBO bound / entropy - 1")


def ar_log_probs(model: Any, sequences: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """(n,) float64: the exact log p(x) of each row under the AR model's ancestral sampling (BOS first, BOS
    suppressed: `hf_mdm.experiments.common.sample_ar`)."""
    bos, device, parts = int(model.config.bos_token_id), model_device(model), []
    with torch.no_grad():
        for start in range(0, sequences.shape[0], batch_size):
            x = sequences[start : start + batch_size].to(device)
            ids = torch.cat([torch.full_like(x[:, :1], bos), x], dim=1)
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, :-1].double()
            logits[..., bos] = -math.inf
            parts.append(torch.log_softmax(logits, -1).gather(2, x[:, :, None]).squeeze(2).sum(1).cpu())
    return torch.cat(parts)


def held_out(language: Any, length: int, section: dict, seed: int) -> torch.Tensor:
    """The sequences every model of one seed is scored on: ``nll_sequences`` (default 1024) fresh draws of the
    language, seeded apart from the training and validation samples."""
    generator = torch.Generator().manual_seed(1_000_003 + seed)
    return language.sample(section.get("nll_sequences", 1024), length, generator=generator)


def exact_nll(kind: str, model: Any, language: Any, section: dict, seed: int) -> dict:
    """``exact_nll``: the exact NLL per token of ``LEARNED`` (AR: ancestral sampling) on `held_out` sequences, and
    ``exact_gap``: it over the language's entropy per token, minus 1."""
    length = section["length"]
    sequences = held_out(language, length, section, seed)
    log_p = ar_log_probs(model, sequences) if kind == "ar" else left_to_right_log_probs(model, sequences)
    nll = -float(log_p.mean()) / length
    return {"exact_nll": nll, "exact_gap": nll / (language.expected_nll(length).value / length) - 1.0}


def judged_cell(kind: str, trained: dict, language: Any, section: dict, seed: int, block: int | None = None) -> dict:
    """A trained model's cell: the SER and exact NLL of ``LEARNED`` (AR: ancestral), and for a diffusion model the
    paper's sampler's SER at N = L and the ELBO's bound beside them. ``block``: the block size it decodes in (None:
    the whole length; AR ignores it)."""
    length, model = section["length"], trained[kind]
    measured = {"num_samples": section["num_samples"], "seed": seed, "batch_size": section.get("batch_size", 256)}
    exact = exact_nll(kind, model, language, section, seed)
    judged = {"gap": exact["exact_gap"], "nll": exact["exact_nll"]}
    if kind == "ar":
        ser = ar_cell(model, language, {**measured, "length": length})["ser"]
        return {"ser": ser, **judged, "ser_paper": None, "ser_random": None, "elbo_gap": None}
    block = block or length
    learned = measure(model, language, length, block, {**LEARNED, "steps_per_block": block}, measured)
    paper = measure(model, language, length, block, {**PAPER_SAMPLER, "steps_per_block": block}, measured)
    random = measure(model, language, length, block, {**RANDOM_ORDER, "steps_per_block": block}, measured)
    beside = {"ser_paper": paper["ser"], "ser_random": random["ser"], "elbo_gap": float(trained[f"{kind}_gap"])}
    return {"ser": learned["ser"], **judged, **beside}
