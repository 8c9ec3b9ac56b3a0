"""The learning error of a trained denoiser (`hf_mdm.experiments.learning`): its KL to the language's posterior against
a direct computation, 0 for the oracle, and the sentences that set it beside the decoding error."""

import math

import pytest
import torch
from tiny_mdm import tiny_mdm

from hf_mdm.experiments.learning import ONE_TOKEN_RANDOM, denoiser_kl, learning_sentences
from hf_mdm.languages import NGramLanguage, OracleDenoiser


def test_kl_is_zero_for_the_oracle_and_matches_a_direct_sum_for_a_random_model():
    language = NGramLanguage.random(4, 2, seed=0, prune_threshold=0.0)
    oracle = OracleDenoiser(language, mask_token_id=30, dtype=torch.float64)
    assert denoiser_kl(oracle, language, 6, 64, seed=0)["kl"] == pytest.approx(0.0, abs=1e-9)
    model = tiny_mdm(vocab_size=31)
    result = denoiser_kl(model, language, 6, 64, seed=0, batch_size=7)
    # the same draws, computed one sequence and one masked position at a time
    generator = torch.Generator().manual_seed(0)
    x = language.sample(64, 6, generator)
    t = torch.rand(64, 1, generator=generator, dtype=torch.float64)
    masked = torch.rand(64, 6, generator=generator, dtype=torch.float64) < t
    masked[masked.sum(1) == 0, 0] = True
    per_sequence = []
    for row, m in zip(x, masked):
        canvas = torch.where(m, torch.full_like(row, 30), row)[None]
        q = language.posterior(canvas, 30)[0]
        logits = model(input_ids=canvas).logits[0].double()
        p = torch.softmax(logits[:, :30], -1)[:, :4]  # the tokens' law with [MASK] removed, over the 30 ids
        terms = [sum(q[i, v] * math.log(q[i, v] / p[i, v]) for v in range(4) if q[i, v] > 0) for i in range(6) if m[i]]
        per_sequence.append(sum(terms) / len(terms))
    expected = sum(per_sequence) / len(per_sequence)
    assert result["kl"] == pytest.approx(float(expected), rel=1e-6)
    assert result["kl"] > 0.1 and result["kl_ci_low"] < result["kl"] < result["kl_ci_high"]


def test_learning_sentences_set_learning_beside_decoding():
    ser = {"ser_ci_low": 0.1, "ser_ci_high": 0.3}
    rows = [
        {"language": "hmm", "length": 16, "model": "trained MDM", "steps": 4, "ser": 0.6, **ser},
        {"language": "hmm", "length": 16, "model": "oracle MDM", "steps": 4, "ser": 0.2, **ser},
        {"language": "hmm", "length": 16, "model": "trained MDM", "steps": 16, "ser": 0.5, **ser},
    ]
    fast = [{"language": "hmm", "model": "trained MDM", "sampler": ONE_TOKEN_RANDOM, "ser": 0.45, **ser}]
    learning = [
        {"language": "hmm", "length": 16, "kl": 0.05, "kl_ci_low": 0.04, "kl_ci_high": 0.06, "num_sequences": 9}
    ]
    (line,) = learning_sentences(rows, fast, learning)
    assert "KL to the language's posterior is 0.0500 [0.0400, 0.0600]" in line
    assert "SER 0.450 [0.100, 0.300] (learning error alone)" in line
    assert "N = 4: trained 0.600 [0.100, 0.300], oracle 0.200 [0.100, 0.300]" in line
    assert "N = 16" not in line  # one token a step at N = L is not a parallel setting
