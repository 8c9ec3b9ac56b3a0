"""One place that builds a language from its kind and parameters: ``build_language(kind, **params)``.

Both the datasets builder (``hf_mdm.data.SyntheticLanguageConfig.build_language``) and the experiments
(``hf_mdm.experiments.make_language``, from a preset's language entry) call it, so that the same kind and
parameters give the same language everywhere:

```python
>>> from hf_mdm.languages import build_language
>>> build_language("ngram", vocab_size=4, n=2, seed=0).to_config()["prune_threshold"]  # the default
0.01
>>> build_language("chain").vocab_size
16
```
"""

from typing import Any, Callable, Dict, Tuple

from .base import SyntheticLanguage
from .hmm import HMMLanguage
from .ngram import ChainLanguage, NGramLanguage

#: The kinds ``build_language`` knows, in the order error messages list them.
LANGUAGE_KINDS = ("ngram", "hmm", "chain")
#: The parameters each kind cannot do without.
REQUIRED_PARAMETERS: Dict[str, Tuple[str, ...]] = {
    "ngram": ("vocab_size", "n"),
    "hmm": ("vocab_size", "num_states"),
    "chain": (),
}
_RANDOM: Dict[str, Callable[..., SyntheticLanguage]] = {"ngram": NGramLanguage.random, "hmm": HMMLanguage.random}


def build_language(kind: str, **params: Any) -> SyntheticLanguage:
    """The language of ``kind`` with ``params`` (deterministic: a random language comes from ``seed``).

    * ``"ngram"``: ``vocab_size``, ``n``; optional ``seed`` (default 0), ``concentration`` and ``prune_threshold``
      (``NGramLanguage.random``'s defaults: ``DEFAULT_CONCENTRATION``, ``DEFAULT_PRUNE_THRESHOLD``).
    * ``"hmm"``: ``vocab_size``, ``num_states``; the same optional ones (``HMMLanguage.random``).
    * ``"chain"``: no parameters (``ChainLanguage``, the 16-token language of Theorem 4.4).

    Raises a ValueError that names the kinds for an unknown ``kind`` and the parameter for a missing or unexpected
    one; the languages' own ValueErrors (such as ``n < 2``) pass through.
    """
    if kind not in LANGUAGE_KINDS:
        raise ValueError(f"language kind must be one of {list(LANGUAGE_KINDS)}, got {kind!r}")
    missing = [name for name in REQUIRED_PARAMETERS[kind] if name not in params]
    if missing:
        raise ValueError(f"bad parameters for a {kind} language: missing {', '.join(map(repr, missing))}")
    try:
        if kind == "chain":
            return ChainLanguage(**params)
        return _RANDOM[kind](seed=params.pop("seed", 0), **params)
    except TypeError as err:  # an unexpected parameter
        raise ValueError(f"bad parameters for a {kind} language: {err}") from None
