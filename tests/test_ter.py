"""The paper's TER, 2^(E_{x~q}[-log2 p(x) / |x|]), against brute force: the sampler's law over sequences
enumerated step by step over canvases (a different algorithm from `exact_sampler_log_probs`, which sums over ordered
partitions), the real sampler's frequencies, the chain language's closed form, and the order-sampling estimator."""

import itertools
import math

import evaluate
import pytest
import torch

from hf_mdm.generation import diffusion_generate
from hf_mdm.languages import ChainLanguage, NGramLanguage, OracleDenoiser
from hf_mdm.metrics import METRICS_DIR, GenerativePerplexity, TokenErrorRate
from hf_mdm.sampler_likelihood import (
    RevealLaw,
    estimate_sampler_log_probs,
    exact_sampler_log_probs,
    ordered_partitions,
)


def small_ngram():
    return NGramLanguage.random(3, 2, seed=0, prune_threshold=0.1)


def oracle(language):
    return OracleDenoiser(language, dtype=torch.float64)


def canvas_walk(language, steps: int, length: int) -> dict:
    """{x: p(x)} of the paper's sampler (linear schedule) with the exact posterior, by following the distribution over
    canvases step by step: at step i (of N) each masked position is revealed with probability 1 / (N - i), its token
    drawn from q(x_j | canvas)."""
    mask = language.vocab_size
    canvases = {(mask,) * length: 1.0}
    for i in range(steps):
        reveal = 1.0 / (steps - i)
        nxt: dict = {}
        for canvas, mass in canvases.items():
            post = language.posterior(torch.tensor([canvas]), mask)[0].tolist()
            masked = [j for j in range(length) if canvas[j] == mask]
            for chosen in itertools.product([False, True], repeat=len(masked)):
                weight = mass * math.prod(reveal if c else 1 - reveal for c in chosen)
                picks = [j for j, c in zip(masked, chosen) if c]
                for tokens in itertools.product(range(language.vocab_size), repeat=len(picks)):
                    w = weight * math.prod(post[j][v] for j, v in zip(picks, tokens))
                    if w > 0:
                        new = list(canvas)
                        for j, v in zip(picks, tokens):
                            new[j] = v
                        nxt[tuple(new)] = nxt.get(tuple(new), 0.0) + w
        canvases = nxt
    return canvases


def all_sequences(vocab: int, length: int):
    return [tuple(x) for x in itertools.product(range(vocab), repeat=length)]


def test_ordered_partitions_are_the_fubini_numbers():
    assert [sum(1 for _ in ordered_partitions(tuple(range(n)))) for n in range(1, 6)] == [1, 3, 13, 75, 541]


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_exact_law_equals_the_canvas_walk(steps):
    language, length = small_ngram(), 4
    exact = exact_sampler_log_probs(oracle(language), RevealLaw(steps), length, language.vocab_size).exp()
    walk = canvas_walk(language, steps, length)
    expected = torch.tensor([walk.get(x, 0.0) for x in all_sequences(language.vocab_size, length)], dtype=torch.float64)
    assert float(expected.sum()) == pytest.approx(1.0, abs=1e-12)
    assert torch.allclose(exact, expected, atol=1e-12, rtol=1e-9)


def test_ter_both_directions_against_enumeration():
    """TER(p) = exp(sum_x q(x) (-ln p(x)) / L) and generative perplexity exp(sum_x p(x) (-ln q(x)) / L), both by hand
    from the enumerated laws; TER(p) >= TER(q) (a cross-entropy), the two relative increases differ."""
    language, length, steps = NGramLanguage.random(3, 2, seed=1, prune_threshold=0.0), 4, 2
    xs = all_sequences(language.vocab_size, length)
    walk = canvas_walk(language, steps, length)
    p = [walk.get(x, 0.0) for x in xs]
    q = language.log_prob(torch.tensor(xs)).exp().tolist()
    log_p = exact_sampler_log_probs(oracle(language), RevealLaw(steps), length, language.vocab_size)
    result = TokenErrorRate().compute(predictions=log_p.tolist(), references=xs, weights=q, language=language)
    hand = math.exp(sum(qx * -math.log(px) for qx, px in zip(q, p) if qx > 0) / length)
    entropy = -sum(qx * math.log(qx) for qx in q if qx > 0)
    assert result["exact"] and result["ter"] == pytest.approx(hand, rel=1e-10)
    assert result["ter_reference"] == pytest.approx(math.exp(entropy / length), rel=1e-10)
    assert result["relative_increase"] > 1e-3  # the sampler at 2 steps is not the language
    hand_gen = math.exp(sum(px * -math.log(qx) for qx, px in zip(q, p) if px > 0) / length)
    gen_increase = hand_gen / math.exp(entropy / length) - 1
    # the generative direction from many of the sampler's samples agrees with its enumerated value
    samples = diffusion_generate(
        oracle(language),
        torch.zeros(20000, 0, dtype=torch.long),
        max_new_tokens=length,
        seed=0,
        stop_at_eos=False,
        **RevealLaw(steps).generate_kwargs(),
    )
    gen = GenerativePerplexity().compute(predictions=samples.tolist(), language=language)
    assert gen["relative_increase_ci_low"] <= gen_increase <= gen["relative_increase_ci_high"]
    assert abs(gen_increase - result["relative_increase"]) > 1e-3


@pytest.mark.parametrize(
    "law", [RevealLaw(2), RevealLaw(3, transfer="deterministic"), RevealLaw(2, "left_to_right", "deterministic")]
)
def test_exact_law_is_what_the_sampler_draws(law):
    """Frequencies of diffusion_generate's outputs (oracle, and an untrained tiny MDM) against the exact law."""
    from hf_mdm import MDMForMaskedDiffusion
    from hf_mdm.training import mdm_config_for

    language, length, num = small_ngram(), 3, 30000
    torch.manual_seed(0)
    model = MDMForMaskedDiffusion(mdm_config_for(language.vocab_size, length, "tiny")).eval()
    for denoiser in (oracle(language), model):
        p = exact_sampler_log_probs(denoiser, law, length, language.vocab_size).exp()
        samples = diffusion_generate(
            denoiser,
            torch.zeros(num, 0, dtype=torch.long),
            max_new_tokens=length,
            seed=1,
            stop_at_eos=False,
            **law.generate_kwargs(),
        )
        assert int(samples.max()) < language.vocab_size
        index = (samples * torch.tensor([language.vocab_size**2, language.vocab_size, 1])).sum(1)
        freq = torch.bincount(index, minlength=p.numel()).double() / num
        assert float(p.sum()) == pytest.approx(1.0, abs=1e-9)
        assert bool(((freq - p).abs() <= 5 * (p * (1 - p) / num).sqrt() + 1e-3).all())


@pytest.mark.parametrize("order", ["random", "left_to_right"])
def test_one_token_a_step_with_the_oracle_is_the_language(order):
    language, length = small_ngram(), 4
    law = RevealLaw(length, order, "deterministic")
    log_p = exact_sampler_log_probs(oracle(language), law, length, language.vocab_size)
    log_q = language.log_prob(torch.tensor(all_sequences(language.vocab_size, length)))
    finite = torch.isfinite(log_q)
    assert torch.allclose(log_p[finite], log_q[finite], atol=1e-12)
    assert bool((log_p[~finite] < -1000).all())  # impossible tokens have logit -1e4: probability 0


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_chain_closed_form_equals_enumeration(steps):
    chain, length = ChainLanguage(), 3
    xs = all_sequences(16, length)
    log_p = exact_sampler_log_probs(oracle(chain), RevealLaw(steps), length, 16)
    q = chain.log_prob(torch.tensor(xs)).exp().tolist()
    result = TokenErrorRate().compute(predictions=log_p.tolist(), references=xs, weights=q, language=chain)
    assert result["relative_increase"] == pytest.approx(ChainLanguage.predicted_ter_increase(length, steps), rel=1e-9)
    valid = log_p.exp()[torch.tensor(q) > 0]
    assert float(valid.sum()) == pytest.approx(1 - ChainLanguage.predicted_ser(length, steps), rel=1e-9)


def test_estimator_is_unbiased_for_p_and_converges():
    language, length, law = small_ngram(), 4, RevealLaw(2)
    exact = exact_sampler_log_probs(oracle(language), law, length, language.vocab_size)
    x = language.sample(3, length, torch.Generator().manual_seed(0))
    index = (x * torch.tensor([27, 9, 3, 1])).sum(1)
    one = estimate_sampler_log_probs(oracle(language), law, x.repeat(4000, 1), 3, 1, torch.Generator().manual_seed(1))
    mean_p = one.exp().view(4000, 3).mean(0)  # K = 1, averaged: an unbiased estimate of p(x)
    assert torch.allclose(mean_p, exact[index].exp(), rtol=0.05)
    many = estimate_sampler_log_probs(oracle(language), law, x, 3, 4000, torch.Generator().manual_seed(2))
    assert torch.allclose(many, exact[index], atol=0.02)
    with pytest.raises(ValueError, match="num_orders"):
        estimate_sampler_log_probs(oracle(language), law, x, 3, 0)


def test_ter_metric_interval_load_and_errors():
    nll = [2.0, 3.0, 4.0, 5.0]
    refs = [[0, 1], [1, 1], [0, 0], [1, 0]]
    result = TokenErrorRate().compute(predictions=[-2 * v for v in nll], references=refs)
    half = 1.959963984540054 * math.sqrt(sum((v - 3.5) ** 2 for v in nll) / 3 / 4)
    assert (result["ter"], result["exact"]) == (pytest.approx(math.exp(3.5)), False)
    assert result["ter_ci_low"] == pytest.approx(math.exp(3.5 - half))
    assert result["ter_ci_high"] == pytest.approx(math.exp(3.5 + half))
    loaded = evaluate.load(str(METRICS_DIR / "ter"))
    assert loaded.compute(predictions=[-2 * v for v in nll], references=refs) == result
    with pytest.raises(ValueError, match="sum to 1"):
        TokenErrorRate().compute(predictions=[-1.0, -1.0], references=[[0], [1]], weights=[0.5, 0.6])
    with pytest.raises(ValueError, match="estimate_sampler_log_probs"):
        exact_sampler_log_probs(oracle(ChainLanguage()), RevealLaw(2), 6, 16)
    with pytest.raises(ValueError, match="confidence orders"):
        RevealLaw(4, order="confidence")


def test_ar_log_probs_are_the_law_sample_ar_draws_from():
    """The AR baseline's exact log p(x) (BOS removed from each conditional) sums to 1 over every sequence, and
    matches the frequencies of `sample_ar`."""
    from transformers import LlamaForCausalLM

    from hf_mdm.experiments.common import sample_ar
    from hf_mdm.experiments.ter_cells import ar_log_probs
    from hf_mdm.training import ar_config_for

    torch.manual_seed(0)
    model = LlamaForCausalLM(ar_config_for(3, 3, "tiny")).eval()
    xs = torch.tensor(all_sequences(3, 3))
    p = ar_log_probs(model, xs).exp()
    assert float(p.sum()) == pytest.approx(1.0, abs=1e-9)
    num = 20000
    samples = sample_ar(model, num, 3, seed=0)
    freq = torch.bincount((samples * torch.tensor([9, 3, 1])).sum(1), minlength=27).double() / num
    assert bool(((freq - p).abs() <= 5 * (p * (1 - p) / num).sqrt() + 1e-3).all())


def test_ter_from_samples_uses_the_kl_per_token():
    """With the language, TER(p) / TER(q) - 1 = exp(mean (ln q(x) - ln p(x)) / L) - 1 over the references, its
    interval the normal one of that mean: narrower than the one of mean -ln p(x) / L (q's own spread removed)."""
    language, length, law = NGramLanguage.random(3, 2, seed=1, prune_threshold=0.0), 4, RevealLaw(2)
    exact = exact_sampler_log_probs(oracle(language), law, length, language.vocab_size)
    x = language.sample(400, length, torch.Generator().manual_seed(3))
    index = (x * torch.tensor([27, 9, 3, 1])).sum(1)
    log_p, log_q = exact[index], language.log_prob(x)
    d = ((log_q - log_p) / length).tolist()
    mean = sum(d) / len(d)
    half = 1.959963984540054 * math.sqrt(sum((v - mean) ** 2 for v in d) / (len(d) - 1) / len(d))
    result = TokenErrorRate().compute(predictions=log_p.tolist(), references=x.tolist(), language=language)
    assert result["relative_increase"] == pytest.approx(math.expm1(mean), rel=1e-10)
    assert result["relative_increase_ci_low"] == pytest.approx(math.expm1(mean - half), rel=1e-10)
    assert result["relative_increase_ci_high"] == pytest.approx(math.expm1(mean + half), rel=1e-10)
    assert result["ter"] == pytest.approx(result["ter_reference"] * math.exp(mean), rel=1e-12)
    plain = TokenErrorRate().compute(predictions=log_p.tolist(), references=x.tolist())
    assert result["ter_ci_high"] - result["ter_ci_low"] < plain["ter_ci_high"] - plain["ter_ci_low"]
    # the exact value lies in the interval (the weighted expectation over every sequence)
    xs = all_sequences(3, length)
    q = language.log_prob(torch.tensor(xs)).exp().tolist()
    truth = TokenErrorRate().compute(predictions=exact.tolist(), references=xs, weights=q, language=language)
    assert result["relative_increase_ci_low"] <= truth["relative_increase"] <= result["relative_increase_ci_high"]
    with pytest.raises(ValueError, match="sequences of the language"):
        TokenErrorRate().compute(predictions=[-1.0], references=[[1, 2]], language=ChainLanguage())
