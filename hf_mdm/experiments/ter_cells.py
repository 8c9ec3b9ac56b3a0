"""The two TER-like quantities of a cell, each under its own name (`hf_mdm.metrics`):

- the paper's TER, 2^(E_{x~q}[-log2 p(x) / |x|]): sequences drawn from the language, scored by the sampler's law p.
  For the paper's sampler p(x) is estimated by `estimate_sampler_log_probs` (a twisted particle filter, bias
  corrected; `TER_ESTIMATOR`), or only bounded where its variance is too large for the correction (the cell's
  ``ter_kind`` is then ``"upper bound"``); for AR it is exact (the chain rule of its conditionals), and at small L
  it is exact for the sampler too (`exact_ter_cell`, every sequence enumerated);
- generative perplexity, 2^(E_{x~p}[-log2 q(x) / |x|]): the sampler's samples scored by the language.

Cells are dicts of plain numbers; every relative increase is X / TER(q) - 1 with its 95% interval.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from ..generation_denoiser import model_device
from ..likelihood_law import RevealLaw, estimate_sampler_log_probs, exact_sampler_log_probs
from ..likelihood_smc import ESTIMATE_VARIANCE_LIMIT
from ..metrics import GenerativePerplexity, TokenErrorRate

#: How the paper's TER of a sampler is estimated where it is not exact, in words (printed with every such table).
TER_ESTIMATOR = (
    "TER(p) = 2^(E_{x~q}[-log2 p(x)/L]) is estimated from n sequences drawn from the language: for each, log p(x) "
    "comes from 4 independent runs of a twisted particle filter over the sampler's steps (hf_mdm.likelihood_smc; the "
    "twist is the language's exact conditional for the oracle, a pseudo-likelihood for a trained model), corrected "
    "for the bias of the log by half the runs' variance; its 95% interval is over the n sequences and carries the "
    "estimator's own noise. Its calibration is measured in evaluation/ter_calibration.py (coverage of the exact "
    "value on the chain language's closed form and on enumeration, against the runs' variance). Where the runs' mean "
    "variance exceeds the limit that calibration sets "
    f"({ESTIMATE_VARIANCE_LIMIT['exact']:g} nat^2 with the exact twist, {ESTIMATE_VARIANCE_LIMIT['pseudo-likelihood']:g} "
    "with a trained model's) "
    "the correction is not trusted and the cell shows an upper bound of TER instead (marked <=), which no finding "
    "uses."
)

#: What the generative perplexity of a cell is, in words.
GEN_PPL_MEANING = (
    "Generative perplexity GenPPL(p) = 2^(E_{x~p}[-log2 q(x)/L]): the sampler's samples scored by the language "
    "(not the paper's TER; it falls below TER(q) when the sampler prefers the language's likeliest sequences)."
)


def gen_ppl_cell(language: Any, samples: torch.Tensor) -> dict[str, Any]:
    """Generative perplexity of ``samples`` (B, L): the relative increase against TER(q) with its 95% interval, the
    samples outside the support and the sample count."""
    r = GenerativePerplexity().compute(predictions=samples.tolist(), language=language)
    return {
        "gen_ppl": r["generative_perplexity"],
        "gen_ppl_increase": r["relative_increase"],
        "gen_ppl_ci_low": r["relative_increase_ci_low"],
        "gen_ppl_ci_high": r["relative_increase_ci_high"],
        "ter_q": r["reference"],
        "num_out_of_support": r["num_out_of_support"],
        "num_samples": int(samples.shape[0]),
    }


def _ter_values(result: dict, kind: str, **extra: Any) -> dict[str, Any]:
    return {
        "ter": result["ter"],
        "ter_increase": result["relative_increase"],
        "ter_ci_low": result["relative_increase_ci_low"],
        "ter_ci_high": result["relative_increase_ci_high"],
        "ter_kind": kind,  # "exact", "estimate" (bias-corrected, or AR's exact p(x) averaged) or "upper bound"
        **extra,
    }


def sampler_ter_cell(
    model: Any, language: Any, law: RevealLaw, length: int, num: int, max_particles: int, seed: int
) -> dict[str, Any]:
    """The paper's TER of the sampler ``law`` with ``model``: ``num`` sequences of the language, log p(x) estimated
    with at most ``max_particles`` particles a run (`TER_ESTIMATOR`); an upper bound where the estimate is not
    reliable (``ter_kind``)."""
    x = language.sample(num, length, torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed + 1)
    est = estimate_sampler_log_probs(
        model, law, x, language.vocab_size, generator=generator, max_particles=max_particles
    )
    log_p, kind = est.reported()
    result = TokenErrorRate().compute(predictions=log_p.tolist(), references=x.tolist(), language=language)
    return _ter_values(
        result,
        kind,
        ter_num_sequences=num,
        ter_num_particles=est.num_particles,
        ter_num_replicates=est.num_replicates,
        ter_twist_power=est.twist_power,
        ter_log_z_variance=float(est.variance.mean()),
        ter_forwards=est.forwards,
    )


@torch.no_grad()
def ar_log_probs(model: Any, x: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """(B,) log p(x) of the AR baseline for rows of ``x`` (B, L) after its BOS, exact: the sum of its conditionals
    with BOS removed from each (as `sample_ar` samples)."""
    bos = int(model.config.bos_token_id)
    device = model_device(model)
    out = []
    for start in range(0, x.shape[0], batch_size):
        rows = x[start : start + batch_size].to(device)
        inputs = torch.cat([torch.full_like(rows[:, :1], bos), rows], dim=1)
        logits = model(input_ids=inputs[:, :-1], attention_mask=torch.ones_like(inputs[:, :-1])).logits.double()
        logits[..., bos] = -math.inf
        out.append(torch.log_softmax(logits, -1).gather(2, rows[:, :, None]).squeeze(2).sum(1).cpu())
    return torch.cat(out)


def ar_ter_cell(model: Any, language: Any, length: int, num: int, seed: int) -> dict[str, Any]:
    """The paper's TER of the AR baseline: ``num`` sequences of the language, p(x) exact (its chain rule)."""
    x = language.sample(num, length, torch.Generator().manual_seed(seed))
    result = TokenErrorRate().compute(
        predictions=ar_log_probs(model, x).tolist(), references=x.tolist(), language=language
    )
    return _ter_values(result, "estimate", ter_num_sequences=num, ter_num_particles=0)  # p(x) exact, the mean over n


def exact_ter_cell(model: Any, language: Any, law: RevealLaw, length: int) -> dict[str, Any]:
    """The paper's TER of the sampler ``law`` with ``model`` at a small ``length``, exact: every sequence of V^L
    enumerated and weighted by q(x)."""
    xs = torch.tensor(list(itertools.product(range(language.vocab_size), repeat=length)))
    log_p = exact_sampler_log_probs(model, law, length, language.vocab_size)
    q = language.log_prob(xs).exp()
    result = TokenErrorRate().compute(
        predictions=log_p.tolist(), references=xs.tolist(), weights=(q / q.sum()).tolist(), language=language
    )
    return _ter_values(result, "exact", ter_num_sequences=int(xs.shape[0]), ter_num_particles=0)
