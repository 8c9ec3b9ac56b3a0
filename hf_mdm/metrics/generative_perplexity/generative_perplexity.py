"""Generative perplexity: the perplexity of a model's samples under the true synthetic language.

Not the paper's TER (`hf_mdm.metrics.TokenErrorRate`, which scores the language's samples under the model): here the
model generates and the language scores. Loadable with ``evaluate.load("<path>/hf_mdm/metrics/generative_perplexity")``
as well as ``hf_mdm.metrics.GenerativePerplexity``. This file is copied on its own by ``evaluate.load``: it imports
hf_mdm absolutely, one import per line.
"""

import math
from typing import Any, Dict, Optional, Sequence

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
Generative perplexity under the true language: GenPPL(p) = 2^(E_{x~p}[-log2 q(x) / |x|]), sequences x generated
by a model p, scored by the true language q. Estimated from samples as exp(mean over samples of -ln q(x) / |x|),
with a 95% interval (the normal interval of the mean exponent, mapped through exp). It is reported with the
language's own value TER(q) = 2^(H(q_L) / L) (the perplexity of q's samples under q; equal to the paper's TER of a
perfect model) and the relative increase GenPPL / TER(q) - 1. Unlike the paper's TER (E over x ~ q of the model's
-log p(x)), it rewards a model that generates only the language's likeliest sequences: it can fall below TER(q).
It is infinite when a sample has q(x) = 0, unless such samples are skipped; their number is always reported.
q must be an hf_mdm synthetic language (n-gram, HMM or the Theorem 4.4 chain), whose likelihoods are exact.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `int`): generated sequences, token ids in `[0, vocab_size)` of the language
        (strip prompt, padding and special tokens first; other ids, and ids that are not integers, raise a
        ValueError). Lengths may differ.
    language (`SyntheticLanguage`, `str` or `os.PathLike`): the true language q, as an object from
        `hf_mdm.languages` or the directory it was saved to with `save_pretrained` (or its `to_config()` dict).
    skip_out_of_support (`bool`, defaults to `False`): drop the samples with q(x) = 0 instead of returning an
        infinite value. With every sample dropped, `generative_perplexity` is NaN.
    reference_num_samples (`int`, defaults to 10000), reference_seed (`int`, defaults to 0): the Monte Carlo
        estimate of H(q_L) for languages without an exact one (HMMs at long lengths).

Returns:
    generative_perplexity (`float`): exp(mean over the (kept) samples of -ln q(x) / |x|); `inf` if a sample is
        outside the support and `skip_out_of_support` is False.
    relative_increase_ci_low (`float`), relative_increase_ci_high (`float`): the 95% interval of
        `relative_increase` (from the normal interval of the mean of -ln q(x) / |x|).
    reference (`float`): TER(q) = exp(H(q_L) / L) from `language.expected_nll(L)` at the samples' length. When
        lengths differ: exp(sum_L w_L H(q_L) / L), w_L the fraction of (kept) samples of length L.
    reference_stderr (`float`): its standard error when H(q_L) is a Monte Carlo estimate, else 0.0.
    relative_increase (`float`): generative_perplexity / reference - 1.
    num_out_of_support (`int`): samples with q(x) = 0.
    num_sequences (`int`): samples given.

Examples:
    >>> import evaluate
    >>> from hf_mdm.languages import ChainLanguage
    >>> gen_ppl = evaluate.load("hf_mdm/metrics/generative_perplexity")
    >>> # tokens are 4u + v; each next u must equal the previous v: 1=(0,1) 4=(1,0) 2=(0,2) 9=(2,1)
    >>> results = gen_ppl.compute(predictions=[[1, 4, 2, 9]], language=ChainLanguage())
    >>> round(results["generative_perplexity"], 4), round(results["reference"], 4)
    (5.6569, 5.6569)
    >>> gen_ppl.compute(predictions=[[1, 4, 2, 9], [1, 2, 2, 9]], language=ChainLanguage())["generative_perplexity"]
    inf
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class GenerativePerplexity(TokenIdInputs, evaluate.Metric):
    """Generative perplexity of generated sequences under a synthetic language (see the module docstring)."""

    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION)

    def _compute(
        self,
        predictions: Sequence[Sequence[int]],
        language: Optional[LanguageLike] = None,
        skip_out_of_support: bool = False,
        reference_num_samples: int = 10_000,
        reference_seed: int = 0,
    ) -> Dict[str, Any]:
        language = resolve_language(language)
        log_probs, lengths = sequence_log_probs(language, predictions)
        in_support = torch.isfinite(log_probs)
        kept = in_support if skip_out_of_support else torch.ones_like(in_support)
        reference_lengths = lengths[kept] if bool(kept.any()) else lengths
        reference, stderr = reference_ter(language, reference_lengths, reference_num_samples, reference_seed)
        if bool(kept.any()):
            mean, low, high = mean_interval(-log_probs[kept] / lengths[kept])
        else:
            mean = low = high = math.nan
        value = math.exp(mean) if math.isfinite(mean) else (math.inf if mean == math.inf else math.nan)
        return {
            "generative_perplexity": value,
            "reference": reference,
            "reference_stderr": stderr,
            "relative_increase": value / reference - 1.0,
            "relative_increase_ci_low": _increase(low, reference),
            "relative_increase_ci_high": _increase(high, reference),
            "num_out_of_support": int((~in_support).sum()),
            "num_sequences": len(predictions),
        }


def _increase(log_value: float, reference: float) -> float:
    """exp(log_value) / reference - 1, infinite for an infinite log value."""
    return math.exp(log_value) / reference - 1.0 if math.isfinite(log_value) else log_value
