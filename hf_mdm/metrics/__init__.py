"""The paper's error rates as `evaluate` metrics, scored exactly against a synthetic language, and generative
perplexity under its own name.

- `TokenErrorRate` (the paper's TER): TER(p) = 2^(E_{x~q}[-log2 p(x) / |x|]), q the language and p the model's law
  over generated sequences: inputs are the language's samples and the model's log p of each
  (`hf_mdm.likelihood_law` computes them for a sampler, exactly for small L).
- `GenerativePerplexity`: 2^(E_{x~p}[-log2 q(x) / |x|]): the model's samples scored by the language.
- `SequenceErrorRate` (the paper's SER): 1 - p(support of q), the fraction of samples q cannot produce.

```python
>>> from hf_mdm.languages import ChainLanguage
>>> from hf_mdm.metrics import GenerativePerplexity, SequenceErrorRate, TokenErrorRate
>>> round(GenerativePerplexity().compute(predictions=[[1, 4, 2, 9]], language=ChainLanguage())["reference"], 4)
5.6569
>>> TokenErrorRate().compute(predictions=[-4 * 0.6931471805599453], references=[[1, 4, 2, 9]])["ter"]  # 2 ** (4/4)
2.0
>>> SequenceErrorRate().compute(predictions=[[1, 4, 2, 9], [1, 2, 2, 9]], language=ChainLanguage())["ser"]
0.5
```

The same classes load with `evaluate.load("<path of hf_mdm>/metrics/ter")`, `.../metrics/generative_perplexity`
and `.../metrics/ser`; `METRICS_DIR` is that path.
"""

from pathlib import Path

from .generative_perplexity.generative_perplexity import GenerativePerplexity
from .ser.ser import SequenceErrorRate
from .ter.ter import TokenErrorRate

#: The folder holding the metric scripts, for `evaluate.load(str(METRICS_DIR / "ter"))`.
METRICS_DIR = Path(__file__).resolve().parent

__all__ = ["METRICS_DIR", "GenerativePerplexity", "SequenceErrorRate", "TokenErrorRate"]
