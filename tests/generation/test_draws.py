"""The token draws of the sampler (`hf_mdm.generation_random`): `exponential_like` gives the numbers of torch's
``exponential_`` kernel, `draw_one` the indices of ``torch.multinomial(probs, 1)`` with the generator left where it
leaves it, and the proposer's tokens and confidences at temperature > 0 are those of a softmax copied, [MASK] zeroed
and ``torch.multinomial``."""

import pytest
import torch
from transformers.generation.logits_process import LogitsProcessorList

from hf_mdm.generation_random import draw_one, exponential_like
from hf_mdm.generation_strategy import ProcessorIds, Proposer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1,), (7, 33), (3, 5, 1031)])
def test_exponential_like_gives_the_kernels_numbers(dtype, shape):
    like = torch.zeros(shape, dtype=dtype)
    for seed in (0, 3):
        ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        drawn = exponential_like(like, ours)
        assert drawn.dtype == dtype and drawn.shape == like.shape
        assert torch.equal(drawn, torch.empty_like(like).exponential_(1, generator=theirs))
        assert torch.equal(ours.get_state(), theirs.get_state())
    torch.manual_seed(5)  # no generator: torch's global one
    drawn = exponential_like(like, None)
    torch.manual_seed(5)
    assert torch.equal(drawn, torch.empty_like(like).exponential_(1))


def test_draw_one_is_multinomial_to_the_bit():
    logits = torch.randn(40, 2000, generator=torch.Generator().manual_seed(0)) * 4
    logits[:5, 100:1900] = -float("inf")
    probs = torch.softmax(logits, -1)
    for seed in range(4):
        ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert torch.equal(draw_one(probs, ours), torch.multinomial(probs, 1, generator=theirs).squeeze(1))
        assert torch.equal(ours.get_state(), theirs.get_state())


@pytest.mark.parametrize("need_probs", [False, True])
def test_sampled_proposals_are_softmax_and_multinomial(need_probs):
    """What the proposer computed before it drew without copying the distributions: the same tokens, confidences and
    (when asked) distributions, [MASK] never drawn."""
    vocab, mask = 300, 299
    logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(1)) * 3
    logits[:, mask] += 4.0  # [MASK] likely, never drawn
    proposer = Proposer(mask, 1.0, LogitsProcessorList(), LogitsProcessorList(), torch.Generator().manual_seed(2))
    got = proposer(logits.clone(), ProcessorIds(), need_probs)
    probs = torch.softmax(logits, -1)
    sample = probs.clone()
    sample[:, mask] = 0.0
    tokens = torch.multinomial(sample, 1, generator=torch.Generator().manual_seed(2)).squeeze(1)
    assert torch.equal(got.tokens, tokens) and not (tokens == mask).any()
    assert torch.equal(got.confidence, probs.gather(1, tokens[:, None]).squeeze(1))
    assert (got.probs is None) if not need_probs else torch.equal(got.probs, probs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_confidence_is_the_published_softmax(dtype):
    """At temperature 0 the confidence is LLaDA's ``softmax(logits).gather(argmax)`` bit for bit (Dream's
    ``softmax(logits).max``): the argmax with [MASK] left out, its probability under the softmax of all logits."""
    vocab, mask = 1031, 1030
    logits = (torch.randn(48, vocab, generator=torch.Generator().manual_seed(3)) * 3).to(dtype)
    logits[:8, mask] += 20.0  # [MASK] the largest logit of some rows: never proposed, still in the normaliser
    got = Proposer(mask, 0.0, LogitsProcessorList(), LogitsProcessorList())(logits.clone(), ProcessorIds())
    without_mask = logits.clone()
    without_mask[:, mask] = -float("inf")
    tokens = without_mask.argmax(-1)
    assert torch.equal(got.tokens, tokens) and not (tokens == mask).any()
    assert torch.equal(got.confidence, torch.softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1))
    assert got.confidence.dtype == dtype and bool((got.confidence[:8] < 0.01).all())
