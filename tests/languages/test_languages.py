"""hf_mdm.languages against brute force: every sequence of a tiny language enumerated; n-gram tables too large are
refused before allocating."""

import itertools
import json
import math

import pytest
import torch

from hf_mdm.languages import (
    LANGUAGE_CONFIG_NAME,
    LANGUAGE_KINDS,
    ChainLanguage,
    ExpectedNLL,
    HMMLanguage,
    NGramLanguage,
    build_language,
    load_language,
)
from hf_mdm.languages.inference import MarkovBridge, forward_backward

LENGTH = 5  # vocab 3 -> 243 sequences; the chain at length 4 -> 65536


def all_sequences(vocab_size: int, length: int) -> torch.LongTensor:
    return torch.tensor(list(itertools.product(range(vocab_size), repeat=length)), dtype=torch.long)


def brute_force_probs(language, x: torch.LongTensor) -> torch.DoubleTensor:
    """q(x) straight from the definition of each language (no forward algorithm, no log tables)."""
    if isinstance(language, ChainLanguage):
        valid = (x[:, 1:] // 4 == x[:, :-1] % 4).all(1)
        return valid.double() / 16 * 0.25 ** (x.shape[1] - 1)
    if isinstance(language, NGramLanguage):
        p = language.initial[x[:, 0]].clone()
        for i in range(1, x.shape[1]):
            k = min(i, language.n - 1)
            context = torch.zeros(x.shape[0], dtype=torch.long)
            for j in range(i - k, i):
                context = context * language.vocab_size + x[:, j]
            p *= language.transitions[k - 1][context, x[:, i]]
        return p
    # HMM: sum over every hidden path
    paths = all_sequences(language.num_states, x.shape[1])
    weight = language.initial[paths[:, 0]].clone()
    for i in range(1, x.shape[1]):
        weight *= language.transition[paths[:, i - 1], paths[:, i]]
    emissions = torch.ones(paths.shape[0], x.shape[0], dtype=torch.float64)
    for i in range(x.shape[1]):
        emissions *= language.emission[paths[:, i]][:, x[:, i]]
    return weight @ emissions


def brute_force_posterior(probs, sequences, x_t, mask_id: int, vocab: int) -> torch.Tensor:
    """q(x^i = v | x_t) by summing q over the sequences that agree with x_t's visible tokens."""
    out = torch.zeros(x_t.shape[0], x_t.shape[1], vocab, dtype=torch.float64)
    for row in range(x_t.shape[0]):
        visible = x_t[row] != mask_id
        weight = probs * (sequences[:, visible] == x_t[row, visible]).all(1)
        for i in range(x_t.shape[1]):
            out[row, i].index_add_(0, sequences[:, i], weight)
        out[row] /= weight.sum()
    return out


def entropy(probs: torch.Tensor) -> float:
    return float(-(probs * torch.where(probs > 0, probs.log(), 0.0)).sum())


TINY = {
    "ngram2": (lambda: NGramLanguage.random(3, 2, seed=0, prune_threshold=0.1), LENGTH),
    "ngram3": (lambda: NGramLanguage.random(3, 3, seed=1, prune_threshold=0.1), LENGTH),
    "hmm": (lambda: HMMLanguage.random(4, 3, seed=0, prune_threshold=0.1), LENGTH),
    "chain": (ChainLanguage, 4),
}


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request):
    """(language, length, every sequence, brute-force q of every sequence)."""
    make, length = TINY[request.param]
    language = make()
    sequences = all_sequences(language.vocab_size, length)
    return language, length, sequences, brute_force_probs(language, sequences)


def test_log_prob_matches_brute_force_and_sums_to_one(tiny):
    language, _, sequences, probs = tiny
    log_prob = language.log_prob(sequences)
    assert log_prob.dtype == torch.float64 and log_prob.shape == (sequences.shape[0],)
    torch.testing.assert_close(log_prob.exp(), probs, rtol=1e-12, atol=1e-15)
    assert math.isclose(float(probs.sum()), 1.0, abs_tol=1e-12)
    assert torch.equal(torch.isneginf(log_prob), probs == 0)


def test_in_support_is_finite_log_prob(tiny):
    language, _, sequences, probs = tiny
    support = language.in_support(sequences)
    assert torch.equal(support, torch.isfinite(language.log_prob(sequences)))
    assert torch.equal(support, probs > 0)
    assert (~support).any(), "the tiny languages are pruned so that some sequences are impossible"


def test_sample_frequencies_match_probabilities(tiny):
    language, length, sequences, probs = tiny
    num = 20_000
    x = language.sample(num, length, torch.Generator().manual_seed(0))
    assert x.shape == (num, length) and x.dtype == torch.long
    assert language.in_support(x).all()
    index = (x * language.vocab_size ** torch.arange(length - 1, -1, -1)).sum(1)
    freq = torch.bincount(index, minlength=sequences.shape[0]).double() / num
    total_variation = 0.5 * float((freq - probs).abs().sum())
    # E|freq - p| <= sqrt(p / num) per sequence
    assert total_variation <= 0.5 * float((probs / num).sqrt().sum())


@pytest.mark.parametrize("mask_rate", [0.3, 0.6, 0.9, 1.0])
def test_posterior_matches_enumeration(tiny, mask_rate):
    language, length, sequences, probs = tiny
    mask_id = language.vocab_size
    generator = torch.Generator().manual_seed(1)
    x_0 = language.sample(24, length, generator)
    x_t = torch.where(torch.rand(24, length, generator=generator) < mask_rate, mask_id, x_0)
    expected = brute_force_posterior(probs, sequences, x_t, mask_id, language.vocab_size)
    posterior = language.posterior(x_t, mask_id)
    assert posterior.shape == (24, length, language.vocab_size) and posterior.dtype == torch.float64
    torch.testing.assert_close(posterior, expected, rtol=1e-10, atol=1e-12)
    log_posterior = language.log_posterior(x_t, mask_id)
    assert torch.equal(torch.isneginf(log_posterior), expected == 0)
    positions = torch.tensor([length - 1, 0, 2])
    subset = language.posterior(x_t, mask_id, positions)
    torch.testing.assert_close(subset, expected[:, positions], rtol=1e-10, atol=1e-12)


def test_forward_backward_matches_enumeration_for_two_grams():
    """The general engine (used for n >= 3 and HMMs) on a 2-gram, where the default path is the power tables."""
    language = NGramLanguage.random(3, 2, seed=0, prune_threshold=0.1)
    sequences = all_sequences(3, LENGTH)
    probs = brute_force_probs(language, sequences)
    x_0 = language.sample(16, LENGTH, torch.Generator().manual_seed(2))
    x_t = torch.where(torch.rand(16, LENGTH, generator=torch.Generator().manual_seed(3)) < 0.5, 3, x_0)
    log_post, log_evidence = forward_backward(language.hidden_chain(), x_t, x_t != 3, None, 3, torch.float64)
    expected = brute_force_posterior(probs, sequences, x_t, 3, 3)
    torch.testing.assert_close(log_post.exp(), expected, rtol=1e-10, atol=1e-12)
    assert torch.isfinite(log_evidence).all()


@pytest.mark.parametrize("length", [1, 2, 3, 7])
@pytest.mark.parametrize("n", [2, 3])
def test_ngram_expected_nll_is_the_enumerated_entropy(n, length):
    """Also checks log_prob and the posterior at lengths shorter than the context (L < n - 1)."""
    language = NGramLanguage.random(3, n, seed=4, prune_threshold=0.1)
    sequences = all_sequences(3, length)
    probs = brute_force_probs(language, sequences)
    result = language.expected_nll(length)
    assert isinstance(result, ExpectedNLL) and result.stderr == 0.0
    assert math.isclose(result.value, entropy(probs), rel_tol=1e-12)
    torch.testing.assert_close(language.log_prob(sequences).exp(), probs, rtol=1e-12, atol=1e-15)
    x_0 = sequences[torch.randperm(len(sequences), generator=torch.Generator().manual_seed(length))[:8]]
    x_t = torch.where(torch.rand(x_0.shape, generator=torch.Generator().manual_seed(length)) < 0.5, 3, x_0)
    x_t[0] = 3
    expected = brute_force_posterior(probs, sequences, x_t, 3, 3)
    valid = ~torch.isnan(expected).flatten(1).any(1)
    torch.testing.assert_close(language.posterior(x_t[valid], 3), expected[valid], rtol=1e-10, atol=1e-12)


def test_expected_nll_exact_for_tiny_languages(tiny):
    language, length, _, probs = tiny
    value, stderr = language.expected_nll(length)
    assert stderr == 0.0
    assert math.isclose(value, entropy(probs), rel_tol=1e-12)


def test_chain_expected_nll_closed_form():
    assert math.isclose(ChainLanguage().expected_nll(512).value, math.log(16) + 511 * math.log(4), rel_tol=1e-12)


def test_hmm_expected_nll_monte_carlo_covers_the_exact_entropy():
    language = HMMLanguage.random(4, 3, seed=0, prune_threshold=0.1)
    length = 11  # 3**11 > MAX_ENUMERATED_SEQUENCES: estimated
    result = language.expected_nll(length, num_samples=4000, seed=0)
    assert result.stderr > 0
    exact = entropy(language.log_prob(all_sequences(3, length)).exp())
    assert abs(result.value - exact) <= 4 * result.stderr
    assert result == language.expected_nll(length, num_samples=4000, seed=0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: NGramLanguage.random(3, 3, seed=5, prune_threshold=0.1),
        lambda: HMMLanguage.random(4, 3, seed=5, prune_threshold=0.1),
        ChainLanguage,
    ],
)
def test_save_and_load_round_trip(tmp_path, make):
    language = make()
    language.save_pretrained(tmp_path)
    config = json.loads((tmp_path / LANGUAGE_CONFIG_NAME).read_text())
    assert config["language_class"] == type(language).__name__
    assert config == language.to_config()
    loaded_languages = [type(language).from_pretrained(tmp_path), load_language(tmp_path)]
    for loaded in loaded_languages + [load_language(language.to_config())]:
        assert type(loaded) is type(language)
        assert loaded.to_config() == language.to_config()
        sequences = all_sequences(language.vocab_size, 4)
        assert torch.equal(loaded.log_prob(sequences), language.log_prob(sequences))


def test_from_pretrained_rejects_another_class(tmp_path):
    ChainLanguage().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="load_language"):
        HMMLanguage.from_pretrained(tmp_path)


def test_random_languages_are_deterministic_in_the_seed():
    a, b, c = (NGramLanguage.random(5, 3, seed=s) for s in (7, 7, 8))
    assert all(torch.equal(a.tensors()[k], b.tensors()[k]) for k in a.tensors())
    assert not torch.equal(a.tensors()["transition_2"], c.tensors()["transition_2"])
    h1, h2 = HMMLanguage.random(6, 5, seed=3), HMMLanguage.random(6, 5, seed=3)
    assert all(torch.equal(h1.tensors()[k], h2.tensors()[k]) for k in h1.tensors())
    for language in (a, h1):
        x1 = language.sample(8, 16, torch.Generator().manual_seed(11))
        x2 = language.sample(8, 16, torch.Generator().manual_seed(11))
        assert torch.equal(x1, x2)


def test_random_rows_are_pruned_dirichlet():
    language = NGramLanguage.random(16, 2, seed=0)  # defaults: concentration 0.5, prune_threshold 0.01
    table = language.transitions[0]
    torch.testing.assert_close(table.sum(1), torch.ones(16, dtype=torch.float64))
    zero = table == 0
    assert 0.05 < zero.double().mean() < 0.6  # some but not most entries pruned
    assert ((table == 0) | (table >= 0.01)).all()
    assert (table.max(1).values > 0).all()
    hmm = HMMLanguage.random(4, 16, seed=0, prune_threshold=0.2)  # every entry below 0.2 pruned but the largest
    assert ((hmm.emission == 0).sum(1) <= 15).all() and (hmm.emission.max(1).values > 0).all()


@pytest.mark.parametrize(
    "make",
    [
        lambda: NGramLanguage.random(16, 2, seed=0),
        lambda: NGramLanguage.random(3, 3, seed=1, prune_threshold=0.1),
        lambda: HMMLanguage.random(4, 6, seed=0, prune_threshold=0.1),
        ChainLanguage,
    ],
)
def test_numerically_safe_at_length_8192(make):
    language = make()
    length = 8192
    generator = torch.Generator().manual_seed(0)
    x = language.sample(2, length, generator)
    log_prob = language.log_prob(x)
    assert torch.isfinite(log_prob).all() and (log_prob < 0).all()
    x_t = torch.where(torch.rand(2, length, generator=generator) < 0.5, language.vocab_size, x)
    posterior = language.posterior(x_t, language.vocab_size)
    assert not torch.isnan(posterior).any()
    torch.testing.assert_close(posterior.sum(-1), torch.ones(2, length, dtype=torch.float64))
    # the revealed tokens themselves are possible under the posterior
    assert (posterior.gather(-1, x.unsqueeze(-1)) > 0).all()


def test_impossible_x_t_uses_the_smoothed_language():
    language = ChainLanguage()
    x_t = torch.tensor([[0, 5, 16, 16]])  # 0 = (0, 0) then 5 = (1, 1): u != previous v
    assert not language.in_support(torch.tensor([[0, 5, 0, 0]])).all()
    smoothed = language.smoothed(1e-6)
    sequences = all_sequences(16, 4)
    expected = brute_force_posterior(smoothed.log_prob(sequences).exp(), sequences, x_t, 16, 16)
    torch.testing.assert_close(language.posterior(x_t, 16), expected, rtol=1e-9, atol=1e-12)
    assert torch.isnan(language.log_posterior(x_t, 16, smoothing=0.0)).all()


def test_bad_inputs_raise_value_errors():
    language = NGramLanguage.random(3, 2, seed=0)
    with pytest.raises(ValueError, match="Token ids must be in"):
        language.log_prob(torch.tensor([[0, 3]]))
    with pytest.raises(ValueError, match="is a token of the language"):
        language.posterior(torch.tensor([[0, 1]]), mask_token_id=1)
    with pytest.raises(ValueError, match="x_t may hold only"):
        language.posterior(torch.tensor([[0, 5]]), mask_token_id=3)
    with pytest.raises(ValueError, match="x_t may hold only"):
        language.posterior(torch.tensor([[0, 4, 6]]), mask_token_id=6)
    with pytest.raises(ValueError, match="x_t may hold only"):
        language.posterior(torch.tensor([[0, -1]]), mask_token_id=3)
    assert language.posterior(torch.tensor([[0, 6, 2]]), mask_token_id=6).shape == (1, 3, 3)
    with pytest.raises(ValueError, match="n must be >= 2"):
        NGramLanguage.random(3, 1, seed=0)
    with pytest.raises(TypeError, match="ChainLanguage"):
        ChainLanguage.random(16, 2, 0)


def same_language(a, b) -> bool:
    """The same class, hyper-parameters and matrices."""
    same_tensors = a.tensors().keys() == b.tensors().keys() and all(
        torch.equal(a.tensors()[k], b.tensors()[k]) for k in a.tensors()
    )
    return type(a) is type(b) and a.to_config() == b.to_config() and same_tensors


@pytest.mark.parametrize(
    "kind, params, expected",
    [
        ("ngram", {"vocab_size": 4, "n": 2}, lambda: NGramLanguage.random(4, 2, 0)),
        (
            "ngram",
            {"vocab_size": 5, "n": 3, "seed": 3, "concentration": 1.0, "prune_threshold": 0.0},
            lambda: NGramLanguage.random(5, 3, 3, concentration=1.0, prune_threshold=0.0),
        ),
        ("hmm", {"vocab_size": 6, "num_states": 4, "seed": 1}, lambda: HMMLanguage.random(4, 6, 1)),
        (
            "hmm",
            {"num_states": 4, "vocab_size": 6, "prune_threshold": 0.1},
            lambda: HMMLanguage.random(4, 6, 0, prune_threshold=0.1),
        ),
        ("chain", {}, ChainLanguage),
    ],
)
def test_build_language_is_the_constructor_of_its_kind_with_its_defaults(kind, params, expected):
    assert kind in LANGUAGE_KINDS
    assert same_language(build_language(kind, **params), expected())


def test_build_language_errors_name_the_kind_or_the_parameter():
    with pytest.raises(ValueError, match=r"language kind must be one of \['ngram', 'hmm', 'chain'\], got 'trigram'"):
        build_language("trigram", n=3)
    with pytest.raises(ValueError, match="bad parameters for a hmm language: missing 'num_states'"):
        build_language("hmm", vocab_size=4)
    with pytest.raises(ValueError, match="bad parameters for a ngram language: missing 'vocab_size', 'n'"):
        build_language("ngram")
    with pytest.raises(ValueError, match="bad parameters for a chain language: .*unexpected keyword argument 'seed'"):
        build_language("chain", seed=0)
    with pytest.raises(ValueError, match="bad parameters for a ngram language: .*unexpected keyword argument 'm'"):
        build_language("ngram", vocab_size=4, n=2, m=1)
    with pytest.raises(ValueError, match="n must be >= 2"):
        build_language("ngram", vocab_size=4, n=1)


@pytest.mark.parametrize("joint", [True, False], ids=["joint-table", "embedding-bag"])
@pytest.mark.parametrize(
    "make, length",
    [(lambda: NGramLanguage.random(3, 2, seed=0, prune_threshold=0.1), 5), (ChainLanguage, 4)],
    ids=["ngram2", "chain"],
)
def test_two_gram_tables_match_enumeration(monkeypatch, make, length, joint):
    """Both table layouts of the 2-gram fast path, on possible and impossible rows (those follow the smoothed
    language), and a second, longer length that regrows the tables."""
    if not joint:
        monkeypatch.setattr(MarkovBridge, "JOINT_TABLE_MAX_ELEMENTS", 0)
    language = make()
    mask_id = language.vocab_size
    smoothed = language.smoothed(1e-6)
    for length in (length, length + 4) if language.vocab_size == 3 else (length,):
        sequences = all_sequences(language.vocab_size, length)
        generator = torch.Generator().manual_seed(length)
        x_0 = language.sample(6, length, generator)  # possible, then random (mostly impossible)
        x_0 = torch.cat([x_0, torch.randint(0, mask_id, (6, length), generator=generator)])
        x_t = torch.where(torch.rand(12, length, generator=generator) < 0.5, mask_id, x_0)
        expected = brute_force_posterior(brute_force_probs(language, sequences), sequences, x_t, mask_id, mask_id)
        impossible = torch.isnan(expected).flatten(1).any(1)
        fallback = brute_force_posterior(smoothed.log_prob(sequences).exp(), sequences, x_t, mask_id, mask_id)
        expected[impossible] = fallback[impossible]
        assert impossible.any() and (~impossible).any()
        torch.testing.assert_close(language.posterior(x_t, mask_id), expected, rtol=1e-9, atol=1e-12)


def test_ngram_refuses_tables_too_large_before_allocating():
    import time

    from hf_mdm.languages import NGramLanguage, build_language
    from hf_mdm.languages.ngram import MAX_TABLE_ENTRIES

    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"vocab_size=16 and n=8 needs 4,581,298,448 table entries .* 34 GiB") as err:
        NGramLanguage.random(vocab_size=16, n=8, seed=0)
    assert "lower n to 6 or less" in str(err.value) and f"{MAX_TABLE_ENTRIES:,}" in str(err.value)
    with pytest.raises(ValueError, match="MAX_TABLE_ENTRIES"):
        build_language("ngram", n=3, vocab_size=1024, seed=0)
    assert time.perf_counter() - start < 1.0
    assert NGramLanguage.random(vocab_size=4, n=4, seed=0).n == 4  # the experiments' sizes stay well inside
