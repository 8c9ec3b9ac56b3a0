"""The exact log-likelihood of a sequence under one-token-a-step left-to-right decoding
(`hf_mdm.likelihood.left_to_right_log_probs`): the language's own for its oracle, the enumerated sampler law's for a
trained-like model, and the hand computation with a logits shift and block-causal attention."""

import math

import pytest
import torch
from tiny_mdm import tiny_mdm

from hf_mdm.languages import HMMLanguage, OracleDenoiser
from hf_mdm.likelihood import left_to_right_log_probs
from hf_mdm.likelihood_law import RevealLaw, exact_sampler_log_probs


def test_the_oracle_decoded_left_to_right_has_the_language_likelihood():
    language = HMMLanguage.random(num_states=3, vocab_size=5, seed=0)
    x = language.sample(64, 6, generator=torch.Generator().manual_seed(1))
    oracle = OracleDenoiser(language, mask_token_id=5, dtype=torch.float64)
    torch.testing.assert_close(left_to_right_log_probs(oracle, x), language.log_prob(x), atol=1e-9, rtol=0)


def test_a_random_model_matches_the_enumerated_sampler_law():
    """Every sequence of V^L: the sum over the sampler's groupings (one position a step, left to right)."""
    model = tiny_mdm(vocab_size=5, mask_token_id=4).double()
    length, vocab = 3, 4
    exact = exact_sampler_log_probs(model, RevealLaw(length, "left_to_right", "deterministic"), length, vocab)
    every = torch.cartesian_prod(*[torch.arange(vocab)] * length)
    torch.testing.assert_close(left_to_right_log_probs(model, every, batch_size=7), exact, atol=1e-9, rtol=0)
    assert torch.logsumexp(exact, 0).item() == pytest.approx(0.0, abs=1e-9)  # a distribution over V^L


@pytest.mark.parametrize("shift, block", [(1, None), (0, 2)])
def test_by_hand_with_a_logits_shift_and_blocks(shift, block):
    model = tiny_mdm(vocab_size=6, mask_token_id=5, logits_shift=shift, block_size=block).double()
    x = torch.tensor([[0, 3, 1, 4], [2, 2, 0, 1]])
    expected = torch.zeros(2, dtype=torch.float64)
    for r in range(2):
        for i in range(4):
            canvas = x[r].clone()
            canvas[i:] = 5
            logits = model(canvas[None]).logits[0, max(i - shift, 0)].clone()
            logits[5] = -math.inf
            expected[r] += torch.log_softmax(logits, -1)[x[r, i]]
    torch.testing.assert_close(left_to_right_log_probs(model, x), expected)


def test_the_judging_law_is_exact_for_the_oracle_where_the_papers_sampler_is_not():
    """HMM, L = 16, blocks of 4: one token a step left to right draws from the language itself (SER 0); the paper's
    sampler at N = L reveals a random number of tokens a step and errs with the same exact denoiser."""
    from hf_mdm.experiments.blocks import measure
    from hf_mdm.experiments.blocks_trained import PAPER_SAMPLER
    from hf_mdm.experiments.decoding import LEARNED

    language = HMMLanguage.random(16, 16, 0, concentration=0.5, prune_threshold=0.1)
    oracle = OracleDenoiser(language, mask_token_id=16)
    preset = {"num_samples": 128, "seed": 0, "batch_size": 128}
    learned = measure(oracle, language, 16, 4, {**LEARNED, "steps_per_block": 4}, preset)
    paper = measure(oracle, language, 16, 4, {**PAPER_SAMPLER, "steps_per_block": 4}, preset)
    assert learned["ser"] == 0.0 and learned["forwards_per_token"] == 1.0
    assert paper["ser_ci_low"] > 0.1


def test_the_ar_law_is_a_distribution_without_bos():
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_mdm.experiments.decoding import ar_log_probs

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    model = LlamaForCausalLM(config).eval()
    model.config.bos_token_id = 3
    every = torch.cartesian_prod(*[torch.arange(3)] * 3)
    log_p = ar_log_probs(model.double(), every, batch_size=5)
    assert torch.logsumexp(log_p, 0).item() == pytest.approx(0.0, abs=1e-9)
    with torch.no_grad():
        logits = model(torch.tensor([[3, 2, 0]])).logits[0].double()
    logits[:, 3] = -math.inf
    by_hand = torch.log_softmax(logits, -1)[0, 2] + torch.log_softmax(logits, -1)[1, 0]
    assert ar_log_probs(model, torch.tensor([[2, 0]])).item() == pytest.approx(by_hand.item(), abs=1e-9)
