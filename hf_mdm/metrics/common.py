"""What the metric scripts share: resolving the language, exact log-likelihoods, the intervals.

Imported absolutely by `hf_mdm/metrics/ter/ter.py`, `.../generative_perplexity/generative_perplexity.py` and
`.../ser/ser.py`, since `evaluate.load` copies a
metric script on its own into a cache folder, where relative imports would not resolve.
"""

import math
import numbers
import os
from collections import defaultdict
from statistics import NormalDist
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

import torch

from hf_mdm.languages import PAPER_CITATION, SyntheticLanguage, load_language

CITATION = PAPER_CITATION


#: Sequences scored by one ``log_prob`` call; bounds the memory of a batch of long sequences.
LOG_PROB_BATCH_SIZE = 4096

LanguageLike = Union[SyntheticLanguage, str, os.PathLike, Mapping[str, Any]]


def resolve_language(language: LanguageLike) -> SyntheticLanguage:
    """A language object as is; a directory written by ``save_pretrained`` or a ``to_config()`` dict via
    ``load_language``."""
    if language is None:
        raise ValueError(
            "Pass the true language: compute(predictions=..., language=<a hf_mdm.languages language, or the "
            "directory it was saved to with save_pretrained>)."
        )
    if isinstance(language, SyntheticLanguage):
        return language
    if isinstance(language, (str, os.PathLike, Mapping)):
        return load_language(dict(language) if isinstance(language, Mapping) else os.fspath(language))
    raise TypeError(f"language must be a SyntheticLanguage, a directory or a config dict, got {type(language)}.")


def sequence_log_probs(
    language: SyntheticLanguage, predictions: Sequence[Sequence[int]]
) -> Tuple[torch.DoubleTensor, torch.LongTensor]:
    """``log q(x)`` (natural log, ``-inf`` outside the support) and the length of every prediction.

    Sequences are grouped by length and scored in batches of ``LOG_PROB_BATCH_SIZE``. Returns two tensors of shape
    ``(num_sequences,)``.
    """
    if len(predictions) == 0:
        raise ValueError("predictions is empty: pass at least one generated sequence.")
    by_length: Dict[int, List[int]] = defaultdict(list)
    for index, sequence in enumerate(predictions):
        if len(sequence) == 0:
            raise ValueError(f"predictions[{index}] is empty; every sequence needs at least one token.")
        by_length[len(sequence)].append(index)
    log_probs = torch.empty(len(predictions), dtype=torch.float64)
    lengths = torch.empty(len(predictions), dtype=torch.long)
    for length, indices in by_length.items():
        for start in range(0, len(indices), LOG_PROB_BATCH_SIZE):
            batch = indices[start : start + LOG_PROB_BATCH_SIZE]
            x = torch.as_tensor([list(predictions[i]) for i in batch], dtype=torch.long)
            log_probs[batch] = language.log_prob(x).cpu()
            lengths[batch] = length
    return log_probs, lengths


def reference_ter(
    language: SyntheticLanguage, lengths: torch.LongTensor, num_samples: int = 10_000, seed: int = 0
) -> Tuple[float, float]:
    """``TER(q)`` for samples of these lengths, and its standard error (0.0 when exact).

    One length L: ``exp(H(q_L) / L)`` with ``H`` from ``language.expected_nll(L)``. Several lengths: ``exp(sum_L
    w_L H(q_L) / L)`` with ``w_L`` the fraction of samples of length L, i.e. the value of ``exp(mean -log q(x)/|x|)``
    expected if the samples came from ``q`` with the same lengths. Monte Carlo standard errors (HMMs) are carried by
    the delta method, summed over lengths (an upper bound, since the estimates share their seed).
    """
    exponent, spread = 0.0, 0.0
    values, counts = torch.unique(lengths, return_counts=True)
    for length, count in zip(values.tolist(), counts.tolist()):
        weight = count / len(lengths)
        entropy = language.expected_nll(length, num_samples=num_samples, seed=seed)
        exponent += weight * entropy.value / length
        spread += weight * entropy.stderr / length
    ter = math.exp(exponent)
    return ter, ter * spread


def mean_interval(values: torch.Tensor, confidence_level: float = 0.95) -> Tuple[float, float, float]:
    """``(mean, low, high)`` of ``values`` (1-D): the mean and its normal interval, mean +- z * std / sqrt(n) (the
    interval is the mean itself for one value; all three infinite when a value is +inf)."""
    values = values.double()
    mean = float(values.mean())
    if not math.isfinite(mean) or values.numel() < 2:
        return mean, mean, mean
    z = NormalDist().inv_cdf(0.5 + confidence_level / 2)
    half = z * float(values.std()) / math.sqrt(values.numel())
    return mean, mean - half, mean + half


def wilson_interval(successes: int, trials: int, confidence_level: float = 0.95) -> Tuple[float, float]:
    """The Wilson score interval of a binomial proportion ``successes / trials``."""
    if trials < 1:
        raise ValueError("The Wilson interval needs at least one trial.")
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level}.")
    z = NormalDist().inv_cdf(0.5 + confidence_level / 2)
    p, n = successes / trials, trials
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, center - half)  # exact at the edges, free of rounding
    high = 1.0 if successes == trials else min(1.0, center + half)
    return low, high


def check_token_ids(sequences: Any, name: str = "predictions") -> None:
    """A ValueError naming the first entry of ``sequences`` (token-id sequences: lists, tensors or arrays) that is
    not an integer token id, e.g. a float: `evaluate` casts its inputs to int64, which would truncate 1.5 to 1."""
    if _integer_dtype(sequences, name):
        return
    for index, sequence in enumerate(sequences):
        check_token_sequence(sequence, f"{name}[{index}]")


def check_token_sequence(sequence: Any, name: str) -> None:
    """`check_token_ids` of one sequence; anything that is not a sequence is left to `evaluate`'s own check."""
    if isinstance(sequence, (str, bytes)) or not hasattr(sequence, "__iter__") or _integer_dtype(sequence, name):
        return
    for index, value in enumerate(sequence):
        if type(value) is int or _integer_dtype(value, f"{name}[{index}]"):  # numpy and torch scalars have a dtype
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(
                f"{name}[{index}] is {value!r}, not an integer token id: pass token ids as integers "
                "(e.g. tensor.long().tolist())"
            )


def _integer_dtype(values: Any, name: str) -> bool:
    """True for a tensor or array of integers, a ValueError for one of floats (or booleans), False otherwise (no
    dtype, or numpy's ``object``: check the values one by one)."""
    dtype = getattr(values, "dtype", None)
    if isinstance(dtype, torch.dtype):
        integer = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    elif dtype is not None and getattr(dtype, "kind", "O") != "O":
        integer = dtype.kind in "iu"
    else:
        return False
    if not integer:
        raise ValueError(
            f"{name} holds {dtype} values, not integer token ids: convert them (tensor.long(), array.astype(int))"
        )
    return True


class TokenIdInputs:
    """Checks the token-id inputs named in ``token_id_inputs`` with `check_token_ids` before `evaluate` casts them
    (a mix-in, before ``evaluate.Metric`` in the bases)."""

    token_id_inputs: Tuple[str, ...] = ("predictions",)

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """Add a batch of inputs, after checking their token ids."""
        inputs = {"predictions": predictions, "references": references}
        for name in self.token_id_inputs:
            if inputs[name] is not None:
                check_token_ids(inputs[name], name)
        return super().add_batch(predictions=predictions, references=references, **kwargs)

    def add(self, *, prediction=None, reference=None, **kwargs):
        """Add one input, after checking its token ids."""
        inputs = {"predictions": prediction, "references": reference}
        for name in self.token_id_inputs:
            if inputs[name] is not None:
                check_token_sequence(inputs[name], name[:-1])
        return super().add(prediction=prediction, reference=reference, **kwargs)


def metric_info(description: str, inputs_description: str, features: Any = None) -> Any:
    """The `evaluate.MetricInfo` of hf_mdm's metrics: ``features`` (default: token-id sequences as predictions)
    in, the paper's citation and address."""
    import datasets
    import evaluate

    if features is None:
        features = datasets.Features({"predictions": datasets.Sequence(datasets.Value("int64"))})
    return evaluate.MetricInfo(
        module_type="metric",
        description=description,
        citation=CITATION,
        inputs_description=inputs_description,
        features=features,
        reference_urls=["https://arxiv.org/abs/2502.09622"],
    )
