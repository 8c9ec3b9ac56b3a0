"""Generative perplexity and SER against hand computations: log q(x) by enumeration from the language's tables, the
reference TER(q) from the enumerated entropy, and the Wilson interval written out. The paper's TER (the other
direction, the language's samples scored by the model): tests/metrics/test_ter.py. The metrics' input checks: no
positive or NaN log-probabilities, integer token ids in every form."""

import itertools
import math
from pathlib import Path

import evaluate
import pytest
import torch

from hf_mdm.languages import ChainLanguage, HMMLanguage, NGramLanguage
from hf_mdm.metrics import METRICS_DIR, GenerativePerplexity, SequenceErrorRate

LENGTH = 5
Z_95 = 1.959963984540054  # the 0.975 quantile of the standard normal


def ngram2_prob(language: NGramLanguage, x) -> float:
    """q(x) of a 2-gram language, from its tables."""
    p = float(language.initial[x[0]])
    for a, b in zip(x[:-1], x[1:]):
        p *= float(language.transitions[0][a, b])
    return p


def hmm_prob(language: HMMLanguage, x) -> float:
    """q(x) of an HMM, summing over every path of hidden states."""
    total = 0.0
    for z in itertools.product(range(language.num_states), repeat=len(x)):
        p = float(language.initial[z[0]] * language.emission[z[0], x[0]])
        for i in range(1, len(x)):
            p *= float(language.transition[z[i - 1], z[i]] * language.emission[z[i], x[i]])
        total += p
    return total


LANGUAGES = {
    "ngram2": (lambda: NGramLanguage.random(3, 2, seed=0, prune_threshold=0.1), ngram2_prob),
    "hmm": (lambda: HMMLanguage.random(2, 3, seed=0, prune_threshold=0.2), hmm_prob),
}


def enumerate_language(name: str, length: int):
    """(language, {sequence: q(sequence)}) over all vocab**length sequences, by hand."""
    make, prob = LANGUAGES[name]
    language = make()
    table = {x: prob(language, x) for x in itertools.product(range(language.vocab_size), repeat=length)}
    assert math.isclose(sum(table.values()), 1.0, rel_tol=1e-12)
    return language, table


def entropy(table) -> float:
    return -sum(p * math.log(p) for p in table.values() if p > 0)


def hand_generative_perplexity(samples, table) -> float:
    return math.exp(sum(-math.log(table[tuple(x)]) / len(x) for x in samples) / len(samples))


def hand_wilson(k: int, n: int):
    p = k / n
    center = (p + Z_95**2 / (2 * n)) / (1 + Z_95**2 / n)
    half = Z_95 / (1 + Z_95**2 / n) * math.sqrt(p * (1 - p) / n + Z_95**2 / (4 * n * n))
    return center - half, center + half


def some_samples(language, table, num: int = 40, seed: int = 0):
    """``num`` samples of the language and two sequences it cannot produce."""
    samples = language.sample(num, LENGTH, torch.Generator().manual_seed(seed)).tolist()
    impossible = [list(x) for x, p in table.items() if p == 0][:2]
    assert len(impossible) == 2, "the test language should have impossible sequences"
    return samples, impossible


@pytest.mark.parametrize("name", sorted(LANGUAGES))
def test_generative_perplexity_equals_hand_computation(name):
    language, table = enumerate_language(name, LENGTH)
    samples, _ = some_samples(language, table)
    result = GenerativePerplexity().compute(predictions=samples, language=language)
    reference = math.exp(entropy(table) / LENGTH)
    assert result["generative_perplexity"] == pytest.approx(hand_generative_perplexity(samples, table), rel=1e-10)
    assert result["reference"] == pytest.approx(reference, rel=1e-10)
    assert result["reference_stderr"] == 0.0  # exact: enumeration for this HMM, propagation for n-grams
    assert result["relative_increase"] == pytest.approx(
        hand_generative_perplexity(samples, table) / reference - 1, abs=1e-10
    )
    nll = [-math.log(table[tuple(x)]) / len(x) for x in samples]
    mean = sum(nll) / len(nll)
    half = Z_95 * math.sqrt(sum((v - mean) ** 2 for v in nll) / (len(nll) - 1) / len(nll))
    assert result["relative_increase_ci_low"] == pytest.approx(math.exp(mean - half) / reference - 1, abs=1e-10)
    assert result["relative_increase_ci_high"] == pytest.approx(math.exp(mean + half) / reference - 1, abs=1e-10)
    assert (result["num_out_of_support"], result["num_sequences"]) == (0, len(samples))


@pytest.mark.parametrize("name", sorted(LANGUAGES))
def test_generative_perplexity_out_of_support_is_infinite_unless_skipped(name):
    language, table = enumerate_language(name, LENGTH)
    samples, impossible = some_samples(language, table)
    predictions = samples[:10] + impossible + samples[10:]
    result = GenerativePerplexity().compute(predictions=predictions, language=language)
    assert result["generative_perplexity"] == math.inf and result["relative_increase"] == math.inf
    assert (result["num_out_of_support"], result["num_sequences"]) == (2, len(predictions))

    skipped = GenerativePerplexity().compute(predictions=predictions, language=language, skip_out_of_support=True)
    assert skipped["generative_perplexity"] == pytest.approx(hand_generative_perplexity(samples, table), rel=1e-10)
    assert (skipped["num_out_of_support"], skipped["num_sequences"]) == (2, len(predictions))

    none_left = GenerativePerplexity().compute(predictions=impossible, language=language, skip_out_of_support=True)
    assert math.isnan(none_left["generative_perplexity"]) and none_left["num_out_of_support"] == 2


def test_generative_perplexity_reference_with_mixed_lengths():
    language, table4 = enumerate_language("ngram2", 4)
    _, table5 = enumerate_language("ngram2", 5)
    short = language.sample(30, 4, torch.Generator().manual_seed(1)).tolist()
    long = language.sample(10, 5, torch.Generator().manual_seed(2)).tolist()
    result = GenerativePerplexity().compute(predictions=long + short, language=language)
    nll = [-math.log(table5[tuple(x)]) / 5 for x in long] + [-math.log(table4[tuple(x)]) / 4 for x in short]
    assert result["generative_perplexity"] == pytest.approx(math.exp(sum(nll) / 40), rel=1e-10)
    # weighted by the number of samples of each length
    exponent = 0.75 * entropy(table4) / 4 + 0.25 * entropy(table5) / 5
    assert result["reference"] == pytest.approx(math.exp(exponent), rel=1e-10)


def test_generative_perplexity_reference_stderr_for_monte_carlo_entropy():
    language = HMMLanguage.random(2, 3, seed=0, prune_threshold=0.2)
    length = 12  # 3**12 sequences: too many to enumerate, so expected_nll is a Monte Carlo estimate
    samples = language.sample(20, length, torch.Generator().manual_seed(0)).tolist()
    result = GenerativePerplexity().compute(predictions=samples, language=language, reference_num_samples=2000)
    estimate = language.expected_nll(length, num_samples=2000, seed=0)
    assert estimate.stderr > 0
    assert result["reference"] == pytest.approx(math.exp(estimate.value / length), rel=1e-12)
    # delta method: d exp(m) = exp(m) dm
    assert result["reference_stderr"] == pytest.approx(result["reference"] * estimate.stderr / length)


@pytest.mark.parametrize("name", sorted(LANGUAGES))
def test_ser_equals_hand_computation(name):
    language, table = enumerate_language(name, LENGTH)
    samples, impossible = some_samples(language, table, num=18)
    predictions = impossible + samples
    result = SequenceErrorRate().compute(predictions=predictions, language=language)
    k = sum(table[tuple(x)] == 0 for x in predictions)
    assert k == 2
    low, high = hand_wilson(k, len(predictions))
    assert result["ser"] == k / len(predictions) == 0.1
    assert result["ser_ci_low"] == pytest.approx(low, rel=1e-12)
    assert result["ser_ci_high"] == pytest.approx(high, rel=1e-12)
    assert (result["num_out_of_support"], result["num_sequences"]) == (2, 20)


def test_ser_wilson_edges_and_level():
    chain = ChainLanguage()
    valid = [[1, 4, 2, 9]] * 10  # 1=(0,1) 4=(1,0) 2=(0,2) 9=(2,1): a chain
    result = SequenceErrorRate().compute(predictions=valid, language=chain)
    assert result["ser"] == 0.0 and result["ser_ci_low"] == 0.0
    assert result["ser_ci_high"] == pytest.approx(Z_95**2 / (10 + Z_95**2))  # Wilson upper bound at k = 0
    invalid = [[1, 2, 2, 9]] * 10
    assert SequenceErrorRate().compute(predictions=invalid, language=chain)["ser_ci_high"] == pytest.approx(1.0)
    z90 = 1.6448536269514722
    narrow = SequenceErrorRate().compute(predictions=valid, language=chain, confidence_level=0.9)
    assert narrow["ser_ci_high"] == pytest.approx(z90**2 / (10 + z90**2))


def test_language_from_a_directory_and_accumulated_batches(tmp_path):
    language, table = enumerate_language("hmm", LENGTH)
    samples, impossible = some_samples(language, table)
    language.save_pretrained(tmp_path / "language")
    expected = GenerativePerplexity().compute(predictions=samples, language=language)
    assert GenerativePerplexity().compute(predictions=samples, language=str(tmp_path / "language")) == expected
    assert GenerativePerplexity().compute(predictions=samples, language=tmp_path / "language") == expected

    metric = SequenceErrorRate()
    for batch in (samples[:15], impossible, samples[15:]):
        metric.add_batch(predictions=batch)
    assert metric.compute(language=language)["num_out_of_support"] == 2


@pytest.mark.parametrize("folder, cls", [("generative_perplexity", GenerativePerplexity), ("ser", SequenceErrorRate)])
def test_evaluate_load_gives_the_same_numbers(folder, cls):
    language, table = enumerate_language("ngram2", LENGTH)
    samples, impossible = some_samples(language, table)
    loaded = evaluate.load(str(METRICS_DIR / folder))
    assert type(loaded).__name__ == cls.__name__ and isinstance(loaded, evaluate.Metric)
    assert loaded.info.features == cls().info.features
    assert "2502.09622" in loaded.info.citation
    for predictions in (samples, samples + impossible):
        assert loaded.compute(predictions=predictions, language=language) == cls().compute(
            predictions=predictions, language=language
        )


def test_metric_scripts_are_loadable_on_their_own():
    """evaluate copies the script alone and scans its imports: one module per line, no relative import."""
    for folder in ("ter", "generative_perplexity", "ser"):
        lines = Path(METRICS_DIR, folder, f"{folder}.py").read_text().splitlines()
        assert all("," not in line for line in lines if line.startswith("import "))
        assert not any(line.startswith("from .") for line in lines)
        assert "from hf_mdm.metrics.common import resolve_language" in lines


def test_bad_input_says_what_to_change():
    chain = ChainLanguage()
    with pytest.raises(ValueError, match="language="):
        GenerativePerplexity().compute(predictions=[[1, 4]])
    with pytest.raises(ValueError, match="empty"):
        SequenceErrorRate().compute(predictions=[[1, 4], []], language=chain)
    with pytest.raises(ValueError, match="Strip special tokens"):
        GenerativePerplexity().compute(predictions=[[1, 16]], language=chain)  # 16 is not a token of the chain language


@pytest.mark.parametrize(
    "log_p, shown", [([-2.0, 0.5], r"predictions\[1\] is 0.5"), ([float("nan"), -3.0], r"predictions\[0\] is nan")]
)
def test_ter_refuses_positive_and_nan_log_probabilities(log_p, shown):
    from hf_mdm.languages import ChainLanguage
    from hf_mdm.metrics import TokenErrorRate

    references = [[1, 4, 2, 9], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match=shown + ", not a log-probability"):
        TokenErrorRate().compute(predictions=log_p, references=references, language=ChainLanguage())
    exact = TokenErrorRate().compute(predictions=[-12 * math.log(2)] * 2, references=references)
    assert exact["ter"] == pytest.approx(8.0)  # log p = 0 up to rounding stays allowed below
    assert TokenErrorRate().compute(predictions=[1e-12], references=[[0]])["ter"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "predictions, shown",
    [
        ([[1, 4, 2, 9], [1.5, 4, 2, 9]], r"predictions\[1\]\[0\] is 1.5, not an integer token id"),
        ([[1, 4, 2, 9.0]], r"predictions\[0\]\[3\] is 9.0"),
        (torch.tensor([[1.0, 4.0, 2.0, 9.0]]), r"predictions holds torch.float32 values"),
        ([torch.tensor([1.0, 4.0])], r"predictions\[0\] holds torch.float32 values"),
    ],
)
def test_ser_and_generative_perplexity_refuse_non_integer_token_ids(predictions, shown):
    from hf_mdm.languages import ChainLanguage
    from hf_mdm.metrics import GenerativePerplexity, SequenceErrorRate

    for metric in (SequenceErrorRate(), GenerativePerplexity()):
        with pytest.raises(ValueError, match=shown):
            metric.compute(predictions=predictions, language=ChainLanguage())


def test_metrics_accept_integer_token_ids_in_every_form():
    import numpy as np

    from hf_mdm.languages import ChainLanguage
    from hf_mdm.metrics import SequenceErrorRate, TokenErrorRate

    ser = SequenceErrorRate()
    for rows in ([[1, 4, 2, 9]], torch.tensor([[1, 4, 2, 9]]), np.array([[1, 4, 2, 9]]), [np.array([1, 4, 2, 9])]):
        assert ser.compute(predictions=rows, language=ChainLanguage())["ser"] == 0.0
    ser.add(prediction=[1, 2, 2, 9])
    with pytest.raises(ValueError, match=r"prediction\[1\] is 2.5"):
        ser.add(prediction=[1, 2.5, 2, 9])
    assert ser.compute(language=ChainLanguage())["ser"] == 1.0
    with pytest.raises(ValueError, match=r"references\[0\]\[1\] is 0.5"):
        TokenErrorRate().compute(predictions=[-1.0], references=[[0, 0.5]])
