"""Sequence Error Rate (SER): the fraction of generated sequences that the true synthetic language cannot produce.

Loadable with ``evaluate.load("<path>/hf_mdm/metrics/ser")`` as well as ``hf_mdm.metrics.SequenceErrorRate``. This
file is copied on its own by ``evaluate.load``: it imports hf_mdm absolutely, one import per line.
"""

from typing import Any, Dict, Optional, Sequence

import evaluate
import torch

from hf_mdm.metrics.common import LanguageLike
from hf_mdm.metrics.common import TokenIdInputs
from hf_mdm.metrics.common import metric_info
from hf_mdm.metrics.common import resolve_language
from hf_mdm.metrics.common import sequence_log_probs
from hf_mdm.metrics.common import wilson_interval


_DESCRIPTION = """\
Sequence Error Rate (Feng et al., 2025): SER(p) = 1 - sum of p(x) over the support of the true
language q, the probability that a model p generates a sequence q cannot produce. It is estimated by the fraction of
generated samples with q(x) = 0 (checked exactly, by the forward algorithm for HMMs), with a Wilson score interval.
q must be an hf_mdm synthetic language (n-gram, HMM or the Theorem 4.4 chain).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `int`): generated sequences, token ids in `[0, vocab_size)` of the language
        (strip prompt, padding and special tokens first; other ids, and ids that are not integers, raise a
        ValueError). Lengths may differ.
    language (`SyntheticLanguage`, `str` or `os.PathLike`): the true language q, as an object from
        `hf_mdm.languages` or the directory it was saved to with `save_pretrained` (or its `to_config()` dict).
    confidence_level (`float`, defaults to 0.95): of the Wilson interval.

Returns:
    ser (`float`): the fraction of samples outside the support of q.
    ser_ci_low (`float`), ser_ci_high (`float`): the Wilson score interval of `ser`.
    num_out_of_support (`int`): samples with q(x) = 0.
    num_sequences (`int`): samples given.

Examples:
    >>> import evaluate
    >>> from hf_mdm.languages import ChainLanguage
    >>> ser = evaluate.load("hf_mdm/metrics/ser")
    >>> # tokens are 4u + v, each next u must equal the previous v: [1, 2] breaks it (1 ends in v=1, 2 has u=0)
    >>> results = ser.compute(predictions=[[1, 4, 2, 9], [1, 2, 2, 9]], language=ChainLanguage())
    >>> results["ser"], round(results["ser_ci_low"], 4), round(results["ser_ci_high"], 4)
    (0.5, 0.0945, 0.9055)
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SequenceErrorRate(TokenIdInputs, evaluate.Metric):
    """Sequence Error Rate of generated sequences under a synthetic language (see the module docstring)."""

    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION)

    def _compute(
        self,
        predictions: Sequence[Sequence[int]],
        language: Optional[LanguageLike] = None,
        confidence_level: float = 0.95,
    ) -> Dict[str, Any]:
        log_probs, _ = sequence_log_probs(resolve_language(language), predictions)
        num_out_of_support = int((~torch.isfinite(log_probs)).sum())
        low, high = wilson_interval(num_out_of_support, len(predictions), confidence_level)
        return {
            "ser": num_out_of_support / len(predictions),
            "ser_ci_low": low,
            "ser_ci_high": high,
            "num_out_of_support": num_out_of_support,
            "num_sequences": len(predictions),
        }
