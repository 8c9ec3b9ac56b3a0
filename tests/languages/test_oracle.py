"""OracleDenoiser against brute-force posteriors, and the paper's SER law for the chain language."""

import itertools
import math

import pytest
import torch

from hf_mdm.generation import diffusion_generate
from hf_mdm.languages import IMPOSSIBLE_LOGIT, ChainLanguage, HMMLanguage, NGramLanguage, OracleDenoiser
from hf_mdm.metrics import GenerativePerplexity, SequenceErrorRate


def all_sequences(vocab_size: int, length: int) -> torch.LongTensor:
    return torch.tensor(list(itertools.product(range(vocab_size), repeat=length)), dtype=torch.long)


def enumerated_posterior(language, x_t: torch.LongTensor, mask_id: int) -> torch.Tensor:
    """q(x^i = v | x_t) summing q over every sequence that agrees with the visible tokens."""
    sequences = all_sequences(language.vocab_size, x_t.shape[1])
    probs = language.log_prob(sequences).exp()  # log_prob itself is checked by brute force in test_languages.py
    out = torch.zeros(x_t.shape[0], x_t.shape[1], language.vocab_size, dtype=torch.float64)
    for row in range(x_t.shape[0]):
        visible = x_t[row] != mask_id
        weight = probs * (sequences[:, visible] == x_t[row, visible]).all(1)
        for i in range(x_t.shape[1]):
            out[row, i].index_add_(0, sequences[:, i], weight)
        out[row] /= weight.sum()
    return out


LANGUAGES = {
    "ngram2": (lambda: NGramLanguage.random(3, 2, seed=0, prune_threshold=0.1), 5),
    "ngram3": (lambda: NGramLanguage.random(3, 3, seed=1, prune_threshold=0.1), 5),
    "hmm": (lambda: HMMLanguage.random(4, 3, seed=0, prune_threshold=0.1), 5),
    "chain": (ChainLanguage, 4),
}


@pytest.fixture(params=sorted(LANGUAGES))
def language_and_length(request):
    make, length = LANGUAGES[request.param]
    return make(), length


def partly_masked(language, length: int, num: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x_0 = language.sample(num, length, generator)
    return torch.where(torch.rand(num, length, generator=generator) < 0.5, language.vocab_size, x_0)


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 2e-6), (torch.float64, 1e-12)])
def test_logits_are_the_log_of_the_enumerated_posterior(language_and_length, dtype, atol):
    language, length = language_and_length
    mask_id = language.vocab_size
    oracle = OracleDenoiser(language, mask_id).to(dtype)
    x_t = partly_masked(language, length, 32, seed=0)
    logits = oracle(x_t).logits
    assert logits.shape == (32, length, mask_id + 1) and logits.dtype == dtype
    expected = enumerated_posterior(language, x_t, mask_id)
    torch.testing.assert_close(logits[..., :mask_id].double().exp(), expected, rtol=0, atol=atol)
    possible = expected > 0
    log_expected = expected[possible].log()
    torch.testing.assert_close(logits[..., :mask_id][possible].double(), log_expected, rtol=0, atol=5 * atol)
    assert (logits[..., :mask_id][~possible] == IMPOSSIBLE_LOGIT).all()
    assert (logits[..., mask_id] == IMPOSSIBLE_LOGIT).all()


def test_impossible_x_t_gives_finite_proper_distributions(language_and_length):
    language, length = language_and_length
    oracle = OracleDenoiser(language)
    generator = torch.Generator().manual_seed(5)
    x_t = torch.randint(0, language.vocab_size, (64, length), generator=generator)
    x_t = torch.where(torch.rand(64, length, generator=generator) < 0.5, language.vocab_size, x_t)
    x_t[:, 0] = torch.randint(0, language.vocab_size, (64,), generator=generator)
    logits = oracle(x_t).logits
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits.softmax(-1).sum(-1), torch.ones(64, length))
    total = logits.double().exp().sum(-1)
    torch.testing.assert_close(total, torch.ones(64, length, dtype=torch.float64), atol=1e-5, rtol=0)


def test_impossible_chain_x_t_follows_the_smoothed_language():
    language = ChainLanguage()
    oracle = OracleDenoiser(language).to(torch.float64)
    x_t = torch.tensor([[0, 5, 16, 16], [16, 3, 4, 16]])  # (0,0)->(1,1) and (0,3)->(1,0): both contradict
    expected = enumerated_posterior(language.smoothed(oracle.config.smoothing), x_t, 16)
    torch.testing.assert_close(oracle(x_t).logits[..., :16].exp(), expected, rtol=1e-9, atol=1e-12)


def test_logits_to_keep(language_and_length):
    language, length = language_and_length
    oracle = OracleDenoiser(language)
    x_t = partly_masked(language, length, 8, seed=1)
    full = oracle(x_t).logits
    assert torch.equal(oracle(x_t, logits_to_keep=2).logits, full[:, -2:])
    positions = torch.tensor([3, 0, 3])
    assert torch.equal(oracle(x_t, logits_to_keep=positions).logits, full[:, positions])
    assert torch.equal(oracle(x_t, logits_to_keep=0).logits, full)
    per_row = torch.randint(0, length, (8, 3), generator=torch.Generator().manual_seed(2))  # a (B, K) extension
    expected = full.gather(1, per_row.unsqueeze(-1).expand(-1, -1, full.shape[-1]))
    assert torch.equal(oracle(x_t, logits_to_keep=per_row).logits, expected)
    with pytest.raises(ValueError, match="positions must be"):
        oracle(x_t, logits_to_keep=torch.zeros(7, 3, dtype=torch.long))


def test_mask_id_beyond_the_vocabulary_and_config():
    language = NGramLanguage.random(3, 2, seed=0, prune_threshold=0.1)
    oracle = OracleDenoiser(language, mask_token_id=6)
    assert oracle.config.vocab_size == 7 and oracle.config.mask_token_id == 6
    assert oracle.config.logits_shift == 0 and oracle.config.max_position_embeddings >= 1 << 20
    assert oracle.device == torch.device("cpu") and oracle.dtype == torch.float32
    x_t = partly_masked(language, 5, 4, seed=2)
    x_t = torch.where(x_t == 3, 6, x_t)  # mask id 3 -> 6
    logits = oracle(x_t).logits
    assert logits.shape == (4, 5, 7) and (logits[..., 3:] == IMPOSSIBLE_LOGIT).all()
    expected = enumerated_posterior(language, x_t, 6)
    torch.testing.assert_close(logits[..., :3].double().exp(), expected, rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="is a token of the language"):
        OracleDenoiser(language, mask_token_id=2)


def test_padding_is_removed_from_the_sequence():
    language = ChainLanguage()
    oracle = OracleDenoiser(language)
    x_t = partly_masked(language, 6, 4, seed=3)
    pad = 99
    left_padded = torch.cat([torch.full((4, 2), pad), x_t], 1)
    attention_mask = torch.cat([torch.zeros(4, 2, dtype=torch.long), torch.ones(4, 6, dtype=torch.long)], 1)
    logits = oracle(left_padded, attention_mask=attention_mask).logits
    assert torch.equal(logits[:, 2:], oracle(x_t).logits)
    assert torch.isfinite(logits).all()
    kept = oracle(left_padded, attention_mask=attention_mask, logits_to_keep=3).logits
    assert torch.equal(kept, logits[:, -3:])


def paper_sampler(oracle: OracleDenoiser, num: int, length: int, steps: int, seed: int) -> torch.LongTensor:
    """The paper's sampler through hf_mdm's own: stochastic transfer, random order, linear schedule, tokens drawn
    from the oracle's posterior (every masked position revealed independently at each step)."""
    out = diffusion_generate(
        oracle,
        torch.zeros(num, 0, dtype=torch.long),
        max_new_tokens=length,
        steps=steps,
        transfer="stochastic",
        strategy="random",
        schedule="linear",
        temperature=1.0,
        seed=seed,
    )
    assert (out != oracle.config.mask_token_id).all()
    return out


@pytest.mark.parametrize("length, steps", [(32, 32), (32, 128), (128, 128), (32, 8)])
def test_chain_ser_follows_the_theorem(length, steps):
    """SER = 1 - (1 - 3/(4N))^(L-1) ~ 1 - exp(-(3/4)(L-1)/N): depends on L/N only (0.52 at N = L for every L)."""
    language, num = ChainLanguage(), 1000
    x = paper_sampler(OracleDenoiser(language), num, length, steps, seed=length + steps)
    ser = evaluate_ser(x, language)
    predicted = ChainLanguage.predicted_ser(length, steps)
    assert abs(predicted - (1 - math.exp(-0.75 * (length - 1) / steps))) < 0.01
    assert abs(ser - predicted) <= 4 * math.sqrt(predicted * (1 - predicted) / num)


def evaluate_ser(x: torch.LongTensor, language) -> float:
    return SequenceErrorRate().compute(predictions=x.tolist(), language=language)["ser"]


def test_bigram_generative_perplexity_increase_depends_on_steps_not_length():
    """With a perfect denoiser the generative perplexity relative increase at N steps is the same for L = 32 and
    128, and falls as N grows (unpruned 2-gram, so every sample is in the support); the paper's TER: test_ter.py."""
    language = NGramLanguage.random(vocab_size=8, n=2, seed=0, prune_threshold=0.0)
    oracle, metric = OracleDenoiser(language, mask_token_id=8), GenerativePerplexity()
    increase = {}
    for length in (32, 128):
        for steps in (4, 16, 64):
            x = paper_sampler(oracle, 1000, length, steps, seed=steps)
            result = metric.compute(predictions=x.tolist(), language=language)
            assert result["num_out_of_support"] == 0
            increase[length, steps] = result["relative_increase"]
    for steps in (4, 16, 64):
        a, b = increase[32, steps], increase[128, steps]
        assert abs(a - b) <= 0.25 * max(a, b) + 0.005, (steps, a, b)
    for length in (32, 128):
        assert increase[length, 4] > increase[length, 16] > increase[length, 64] > 0


def test_per_row_logits_to_keep_path_gives_the_same_samples():
    """The sampler asks models that support it for (B, K) positions per row; the result must not change."""

    class ColumnsOnly(torch.nn.Module):  # the same oracle, without per-row logits_to_keep
        def __init__(self, oracle):
            super().__init__()
            self.oracle, self.config = oracle, oracle.config

        def forward(self, input_ids, logits_to_keep=0, **kwargs):
            return self.oracle(input_ids, logits_to_keep=logits_to_keep)

    oracle = OracleDenoiser(ChainLanguage())
    a = paper_sampler(oracle, 64, 24, 12, seed=3)
    b = paper_sampler(ColumnsOnly(oracle), 64, 24, 12, seed=3)
    assert torch.equal(a, b)


def test_predicted_ser_matches_the_paper_numbers():
    assert abs(ChainLanguage.predicted_ser(512, 512) - 0.52) < 0.01
    assert abs(ChainLanguage.predicted_ser(512, 128) - 0.95) < 0.01
    assert abs(ChainLanguage.predicted_ser(512, 16 * 512) - 0.05) < 0.01
    assert ChainLanguage.predicted_ser(10, 1) == pytest.approx(1 - 0.25**9)
