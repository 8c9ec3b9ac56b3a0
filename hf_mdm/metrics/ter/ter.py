"""Token Error Rate (TER), as the paper defines it: the perplexity of the true language's samples under the model.

Loadable with ``evaluate.load("<path>/hf_mdm/metrics/ter")`` as well as ``hf_mdm.metrics.TokenErrorRate``. The
model's log-likelihoods of the language's samples come from `hf_mdm.likelihood_law` (exact for small L,
estimated otherwise). This file is copied on its own by ``evaluate.load``: it imports hf_mdm absolutely, one
import per line.
"""

import math
from typing import Any, Dict, Optional, Sequence

import datasets
import evaluate
import torch

from hf_mdm.metrics.common import LanguageLike
from hf_mdm.metrics.common import TokenIdInputs
from hf_mdm.metrics.common import mean_interval
from hf_mdm.metrics.common import metric_info
from hf_mdm.metrics.common import reference_ter
from hf_mdm.metrics.common import resolve_language
from hf_mdm.metrics.common import sequence_log_probs


_DESCRIPTION = """\
Token Error Rate (Feng et al., 2025): TER(p) = 2^(E_{x~q}[-log2 p(x) / |x|]), with q the true language and p the
model's distribution over the sequences it generates: the perplexity of the language's samples under the model (a
cross-entropy, so TER(p) >= TER(q) = 2^(H(q_L) / L), with equality only for p = q). Base 2 inside and out gives
the same number as exp(E[-ln p(x) / |x|]), which is what is computed. Inputs: sequences x drawn from q
(`references`) and the model's log p(x) of each (`predictions`, natural log). Without `weights` the expectation is
the mean over the references, with a 95% interval (the normal interval of the mean, mapped through exp); with
`weights` = q(x) of references that enumerate the support of q, it is exact. With the language, the exponent is
computed as H(q_L)/L (from the language) plus the mean of (ln q(x) - ln p(x)) / |x| (the KL divergence per token):
the same expectation, with q's own spread removed from the interval (a control variate). Reported with TER(q) and
the relative increase TER(p) / TER(q) - 1 = exp(KL(q || p) / L) - 1 (the paper's epsilon_total).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `float`): log p(x) <= 0, natural log, of each reference sequence under the model (the
        sampler's law: `hf_mdm.likelihood_law.exact_sampler_log_probs` or `estimate_sampler_log_probs`);
        `-inf` where p(x) = 0. Positive values and NaN raise a ValueError naming the first.
    references (`list` of `list` of `int`): the sequences x, drawn from the true language q (or, with `weights`,
        every sequence of the support). Lengths may differ.
    language (`SyntheticLanguage`, `str` or `os.PathLike`, optional): the true language q, for TER(q) and the
        relative increase (an object from `hf_mdm.languages`, a `save_pretrained` directory or a config dict).
    weights (`list` of `float`, optional): q(x) of each reference, summing to 1: the expectation over q is then
        computed exactly, and the interval is the value itself.
    confidence_level (`float`, defaults to 0.95): of the interval.
    reference_num_samples (`int`, defaults to 10000), reference_seed (`int`, defaults to 0): the Monte Carlo
        estimate of H(q_L) for languages without an exact one (HMMs at long lengths).

Returns:
    ter (`float`): exp(mean of -ln p(x) / |x|) (weighted by `weights` when given; with `language`, TER(q) exp(mean
        of (ln q(x) - ln p(x)) / |x|)); `inf` if p(x) = 0 for a reference x (with positive weight).
    ter_ci_low (`float`), ter_ci_high (`float`): its interval.
    exact (`bool`): whether `weights` made the expectation exact.
    ter_reference (`float`), ter_reference_stderr (`float`): TER(q) and its standard error (0.0 when exact),
        with `language` only.
    relative_increase (`float`), relative_increase_ci_low (`float`), relative_increase_ci_high (`float`):
        TER(p) / TER(q) - 1 = exp(mean of (ln q(x) - ln p(x)) / |x|) - 1 and its interval, with `language` only.
    num_sequences (`int`): references given.

Examples:
    >>> import evaluate
    >>> from hf_mdm.languages import ChainLanguage
    >>> ter = evaluate.load("hf_mdm/metrics/ter")
    >>> # a model that puts probability 2^-12 on each of two length-4 chains of the language
    >>> results = ter.compute(predictions=[-12 * 0.6931471805599453] * 2, references=[[1, 4, 2, 9], [0, 0, 0, 0]],
    ...                       language=ChainLanguage())
    >>> round(results["ter"], 4), round(results["ter_reference"], 4), round(results["relative_increase"], 4)
    (8.0, 5.6569, 0.4142)
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TokenErrorRate(TokenIdInputs, evaluate.Metric):
    """The paper's Token Error Rate of a model on a synthetic language (see the module docstring)."""

    token_id_inputs = ("references",)

    def _info(self) -> evaluate.MetricInfo:
        features = datasets.Features(
            {"predictions": datasets.Value("float64"), "references": datasets.Sequence(datasets.Value("int64"))}
        )
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, features)

    def _compute(
        self,
        predictions: Sequence[float],
        references: Sequence[Sequence[int]],
        language: Optional[LanguageLike] = None,
        weights: Optional[Sequence[float]] = None,
        confidence_level: float = 0.95,
        reference_num_samples: int = 10_000,
        reference_seed: int = 0,
    ) -> Dict[str, Any]:
        if len(references) == 0:
            raise ValueError("references is empty: pass the language's sequences and the model's log p of each.")
        lengths = torch.tensor([len(x) for x in references], dtype=torch.float64)
        if bool((lengths == 0).any()):
            raise ValueError("every reference needs at least one token.")
        nll = -_log_probs(predictions) / lengths
        offset, reference, stderr = 0.0, None, None
        if language is not None:
            language = resolve_language(language)
            log_q, _ = sequence_log_probs(language, references)
            kept = torch.ones_like(log_q, dtype=torch.bool) if weights is None else torch.tensor(list(weights)) > 0
            if not bool(torch.isfinite(log_q[kept]).all()):
                raise ValueError("references must be sequences of the language: q(x) = 0 for some (with weight > 0).")
            reference, stderr = reference_ter(language, lengths.long(), reference_num_samples, reference_seed)
            nll = nll + torch.where(kept, log_q, torch.zeros_like(log_q)) / lengths  # the KL per token
            offset = math.log(reference)
        if weights is None:
            mean, low, high = mean_interval(nll, confidence_level)
        else:
            mean = low = high = _weighted_mean(nll, weights)
        result: Dict[str, Any] = {
            "ter": _exp(offset + mean),
            "ter_ci_low": _exp(offset + low),
            "ter_ci_high": _exp(offset + high),
            "exact": weights is not None,
            "num_sequences": len(references),
        }
        if reference is not None:
            result.update(
                ter_reference=reference,
                ter_reference_stderr=stderr,
                relative_increase=math.expm1(mean),
                relative_increase_ci_low=math.expm1(low),
                relative_increase_ci_high=math.expm1(high),
            )
        return result


#: How far above 0 a log-probability may round (an exact log p(x) = 0 summed from several terms).
LOG_PROB_TOLERANCE = 1e-9


def _log_probs(predictions: Sequence[float]) -> torch.Tensor:
    """The predictions as a float64 tensor; a ValueError naming the first that is not a log-probability (NaN, or
    above 0 by more than ``LOG_PROB_TOLERANCE``)."""
    log_p = torch.tensor(list(predictions), dtype=torch.float64)
    bad = torch.isnan(log_p) | (log_p > LOG_PROB_TOLERANCE)
    if bool(bad.any()):
        index = int(bad.nonzero()[0])
        raise ValueError(
            f"predictions[{index}] is {float(log_p[index])}, not a log-probability: predictions must be the model's "
            "natural-log probabilities log p(x) <= 0 of each reference (-inf where p(x) = 0), not probabilities, "
            "negative log-likelihoods or NaN"
        )
    return log_p


def _weighted_mean(nll: torch.Tensor, weights: Sequence[float]) -> float:
    """sum w(x) nll(x) over the references with w(x) > 0; weights must be q(x) and sum to 1."""
    w = torch.tensor(list(weights), dtype=torch.float64)
    if w.shape != nll.shape or bool((w < 0).any()) or not math.isclose(float(w.sum()), 1.0, rel_tol=1e-9):
        raise ValueError(
            f"weights must hold q(x) >= 0 of each of the {nll.numel()} references and sum to 1 (got "
            f"{w.numel()} weights summing to {float(w.sum()):.6g}); leave weights out for samples drawn from q."
        )
    kept = w > 0
    return float((w[kept] * nll[kept]).sum())


def _exp(value: float) -> float:
    return math.exp(value) if math.isfinite(value) else value
