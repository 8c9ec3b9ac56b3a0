"""Synthetic languages with exact inference, and the exact-posterior ``OracleDenoiser``.

* ``NGramLanguage.random(vocab_size, n, seed, concentration=0.5, prune_threshold=0.01)``
* ``HMMLanguage.random(num_states, vocab_size, seed, concentration=0.5, prune_threshold=0.01)``
* ``ChainLanguage()``: the 16-token language of Theorem 4.4.
* ``build_language(kind, **params)``: any of them from a kind in ``LANGUAGE_KINDS`` and its parameters (the one
  builder behind ``hf_mdm.data`` and ``hf_mdm.experiments``).

Every language has ``vocab_size``, ``sample``, ``log_prob``, ``in_support``, ``expected_nll`` (an
``ExpectedNLL(value, stderr)``), ``posterior`` / ``log_posterior`` (the exact ``q_{0|t}(x^i | x_t)``),
``to_config``, ``save_pretrained`` / ``from_pretrained``; ``load_language`` loads any of them.
"""

from .base import (
    DEFAULT_CONCENTRATION,
    DEFAULT_PRUNE_THRESHOLD,
    DEFAULT_SMOOTHING,
    LANGUAGE_CONFIG_NAME,
    LANGUAGE_WEIGHTS_NAME,
    PAPER_CITATION,
    ExpectedNLL,
    SyntheticLanguage,
    load_language,
)
from .factory import LANGUAGE_KINDS, REQUIRED_PARAMETERS, build_language
from .hmm import HMMLanguage
from .ngram import ChainLanguage, NGramLanguage
from .oracle import IMPOSSIBLE_LOGIT, OracleConfig, OracleDenoiser, OracleOutput

__all__ = [
    "ChainLanguage",
    "DEFAULT_CONCENTRATION",
    "DEFAULT_PRUNE_THRESHOLD",
    "DEFAULT_SMOOTHING",
    "ExpectedNLL",
    "HMMLanguage",
    "IMPOSSIBLE_LOGIT",
    "LANGUAGE_CONFIG_NAME",
    "LANGUAGE_KINDS",
    "LANGUAGE_WEIGHTS_NAME",
    "NGramLanguage",
    "OracleConfig",
    "OracleDenoiser",
    "OracleOutput",
    "PAPER_CITATION",
    "REQUIRED_PARAMETERS",
    "SyntheticLanguage",
    "build_language",
    "load_language",
]
