"""TER and SER, the paper's two error rates, as `evaluate` metrics scored exactly against a synthetic language.

```python
>>> from hf_mdm.languages import ChainLanguage
>>> from hf_mdm.metrics import SequenceErrorRate, TokenErrorRate
>>> round(TokenErrorRate().compute(predictions=[[1, 4, 2, 9]], language=ChainLanguage())["ter"], 4)  # 2 ** 2.5
5.6569
>>> SequenceErrorRate().compute(predictions=[[1, 4, 2, 9], [1, 2, 2, 9]], language=ChainLanguage())["ser"]
0.5
```

The same classes load with `evaluate.load("<path of hf_mdm>/metrics/ter")` and `.../metrics/ser`; `METRICS_DIR`
is that path.
"""

from pathlib import Path

from .ser.ser import SequenceErrorRate
from .ter.ter import TokenErrorRate

#: The folder holding the `ter` and `ser` metric scripts, for `evaluate.load(str(METRICS_DIR / "ter"))`.
METRICS_DIR = Path(__file__).resolve().parent

__all__ = ["METRICS_DIR", "SequenceErrorRate", "TokenErrorRate"]
