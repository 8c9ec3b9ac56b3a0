"""The same answer at any batch size (`hf_mdm.generation_rows`): with ``batch_invariant=True`` every row's tokens are
those it gets alone, whatever its neighbours, the batch size, the padding side and length, under every transfer rule,
with and without the caches, in float32 and bfloat16, at temperature 0 and with one seed per row; a list of seeds
gives each row its own draws; `draws_random_numbers` against brute force."""

from __future__ import annotations

import pytest
import torch
from tiny_mdm import tiny_mdm

from hf_mdm import MaskedDiffusionGenerationConfig
from hf_mdm.generation_rows import draws_random_numbers
from hf_mdm.generation_transfer import TRANSFER_REGISTRY

VOCAB, MASK = 64, 63
NEW = dict(max_new_tokens=16, steps=8, block_length=8)


def random_prompts(count: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 13, (count,), generator=generator).tolist()
    return [torch.randint(0, MASK - 1, (n,), generator=generator) for n in lengths]


def padded(prompts: list[torch.Tensor], side: str, extra: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts in one batch, padded on ``side`` to the longest + ``extra`` (pad id 0)."""
    width = max(len(p) for p in prompts) + extra
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        span = slice(width - len(p), width) if side == "left" else slice(0, len(p))
        ids[i, span], attention[i, span] = p, 1
    return ids, attention


def rows_alone(model, prompts, seeds, **settings) -> list[list[int]]:
    """Each prompt's generated tokens from a call of its own."""
    return [
        model.generate(p[None], seed=s, **settings)[0, len(p) :].tolist()
        for p, s in zip(prompts, seeds if isinstance(seeds, list) else [seeds] * len(prompts))
    ]


def generated(out: torch.Tensor, width: int) -> list[list[int]]:
    return out[:, width:].tolist()


@pytest.fixture(scope="module")
def models():
    fp32 = tiny_mdm(vocab_size=VOCAB, mask_token_id=MASK, hidden_size=64, intermediate_size=128)
    bf16 = tiny_mdm(vocab_size=VOCAB, mask_token_id=MASK, hidden_size=64, intermediate_size=128).to(torch.bfloat16)
    return {"float32": fp32, "bfloat16": bf16}


TRANSFER_SETTINGS = {
    "deterministic": {},
    "stochastic": {},
    "threshold": dict(threshold=0.2),
    "entropy_bound": dict(entropy_bound=1.0),
    "speculative": dict(draft_length=3, steps=None, block_length=None),
    "llada2": dict(threshold=0.3),
}


def test_every_transfer_rule_is_covered():
    # block-causal editing rules, tested on LLaDA2 (test_llada2.py, test_peer_llada2_pipeline.py: rows as alone)
    assert set(TRANSFER_REGISTRY) - set(TRANSFER_SETTINGS) == {"llada21_editing", "block_refinement"}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("transfer", list(TRANSFER_SETTINGS))
def test_rows_equal_rows_alone_under_every_transfer(models, dtype, transfer):
    model = models[dtype]
    prompts = random_prompts(6, seed=len(transfer))
    for temperature, cache in [(0.0, None), (1.0, "dual")]:
        if transfer == "speculative" and cache:
            cache = None  # speculative decoding keeps no cache
        seeds = [100 + i for i in range(len(prompts))]
        settings = {**NEW, "transfer": transfer, **TRANSFER_SETTINGS[transfer], "temperature": temperature}
        settings["kv_cache"] = cache
        alone = rows_alone(model, prompts, seeds, **settings)
        for side, extra in [("left", 0), ("right", 3)]:
            ids, attention = padded(prompts, side, extra)
            out = model.generate(ids, attention_mask=attention, batch_invariant=True, seed=seeds, **settings)
            assert generated(out, ids.shape[1]) == alone, (side, temperature, cache)


def test_in_bfloat16_the_default_mode_differs_where_the_mode_does_not(models):
    """The setting above exercises the problem: batched in bfloat16 without the mode, some row differs from itself
    alone (padding changes what attention and the matrix products reduce over)."""
    model = models["bfloat16"]
    prompts = random_prompts(8, seed=3)
    ids, attention = padded(prompts, "left")
    alone = rows_alone(model, prompts, None, **NEW)
    assert generated(model.generate(ids, attention_mask=attention, **NEW), ids.shape[1]) != alone
    assert generated(model.generate(ids, attention_mask=attention, batch_invariant=True, **NEW), ids.shape[1]) == alone


def test_any_batch_size_and_neighbours(models):
    model = models["bfloat16"]
    prompts = random_prompts(8, seed=5)
    settings = {**NEW, "strategy": "random", "temperature": 1.0}
    seeds = list(range(8))
    alone = rows_alone(model, prompts, seeds, **settings)
    for size in (2, 3, 8):
        for start in range(0, 8, size):
            chunk = slice(start, start + size)
            ids, attention = padded(prompts[chunk], "left")
            out = model.generate(ids, attention_mask=attention, batch_invariant=True, seed=seeds[chunk], **settings)
            assert generated(out, ids.shape[1]) == alone[chunk]


def test_one_integer_seed_is_every_rows_seed(models):
    model = models["float32"]
    prompts = random_prompts(3, seed=7)
    settings = {**NEW, "temperature": 1.0}
    ids, attention = padded(prompts, "left")
    out = model.generate(ids, attention_mask=attention, batch_invariant=True, seed=11, **settings)
    assert generated(out, ids.shape[1]) == rows_alone(model, prompts, 11, **settings)


def test_block_causal_model_with_exact_cache_and_editing():
    model = tiny_mdm(block_size=8, vocab_size=VOCAB, mask_token_id=MASK).to(torch.bfloat16)
    prompts = random_prompts(4, seed=9)
    for config in (
        MaskedDiffusionGenerationConfig.llada2(max_new_tokens=16, block_length=8, threshold=0.5),
        MaskedDiffusionGenerationConfig.llada21(
            max_new_tokens=16, block_length=8, threshold=0.5, editing_threshold=0.3
        ),
        MaskedDiffusionGenerationConfig(max_new_tokens=16, steps=8),
    ):
        alone = [model.generate(p[None], generation_config=config)[0, len(p) :].tolist() for p in prompts]
        ids, attention = padded(prompts, "left")
        out = model.generate(ids, attention_mask=attention, generation_config=config, batch_invariant=True)
        assert generated(out, ids.shape[1]) == alone


def test_a_list_of_seeds_gives_each_row_its_own_draws(models):
    """Without the mode, too: a row's draws depend on its own seed only (float32, where the batched forward equals
    the row's own on this model)."""
    model = models["float32"]
    prompts = random_prompts(4, seed=2)
    settings = {**NEW, "strategy": "random", "transfer": "stochastic", "temperature": 1.0}
    ids, attention = padded(prompts, "left")
    first = generated(model.generate(ids, attention_mask=attention, seed=[1, 2, 3, 4], **settings), ids.shape[1])
    assert first == rows_alone(model, prompts, [1, 2, 3, 4], **settings)
    swapped = generated(model.generate(ids, attention_mask=attention, seed=[9, 2, 3, 4], **settings), ids.shape[1])
    assert swapped[1:] == first[1:] and swapped[0] != first[0]


def test_merged_output_costs_and_scores(models):
    model = models["float32"]
    prompts = random_prompts(3, seed=4)
    ids, attention = padded(prompts, "left")
    settings = {**NEW, "return_dict_in_generate": True, "output_scores": True}
    out = model.generate(ids, attention_mask=attention, batch_invariant=True, **settings)
    alone = [model.generate(p[None], **settings) for p in prompts]
    assert out.nfe == sum(a.nfe for a in alone) and out.steps == sum(a.steps for a in alone)
    assert out.num_generated_tokens.tolist() == [int(a.num_generated_tokens) for a in alone]
    assert len(out.scores) == 16 and out.scores[0].shape == (3, VOCAB)
    for b, a in enumerate(alone):
        assert torch.equal(torch.stack(out.scores)[:, b], torch.stack(a.scores)[:, 0])


def test_clear_errors(models):
    model = models["float32"]
    ids, attention = padded(random_prompts(2, seed=1), "left")
    with pytest.raises(ValueError, match="needs seed="):
        model.generate(ids, attention_mask=attention, batch_invariant=True, temperature=1.0, **NEW)
    with pytest.raises(ValueError, match="one seed per row"):
        model.generate(ids, attention_mask=attention, seed=[1, 2, 3], temperature=1.0, **NEW)
    with pytest.raises(ValueError, match="not both"):
        model.generate(ids, attention_mask=attention, seed=[1, 2], generator=torch.Generator(), **NEW)
    with pytest.raises(ValueError, match="output_history"):
        model.generate(ids, attention_mask=attention, batch_invariant=True, output_history=True, **NEW)
    with pytest.raises(ValueError, match="batch_invariant must be True or False"):
        model.generate(ids, attention_mask=attention, batch_invariant="yes", **NEW)


C = MaskedDiffusionGenerationConfig
CONFIGS = {
    "default": C(**NEW),
    "T=1": C(**NEW, temperature=1.0),
    "random order": C(**NEW, strategy="random"),
    "stochastic": C(**NEW, transfer="stochastic"),
    "margin+threshold": C(**NEW, strategy="margin", transfer="threshold", threshold=0.3),
    "left_to_right": C(**NEW, strategy="left_to_right"),
    "remdm": C(**NEW, remdm="cap", remdm_eta=0.1),
    "speculative": C(max_new_tokens=16, transfer="speculative", draft_length=2),
    "llada low_confidence": C.llada(gen_length=16, steps=8, block_length=8),
    "llada random": C.llada(gen_length=16, steps=8, block_length=8, remasking="random"),
    "dream entropy": C.dream(max_new_tokens=16, steps=8, alg="entropy"),
    "dream origin": C.dream(max_new_tokens=16, steps=8),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_draws_random_numbers_against_brute_force(models, name):
    """A call said to draw nothing gives the same tokens under any seed and leaves torch's global stream alone; one
    said to draw gives other tokens under some seed."""
    model = models["float32"]
    prompt = torch.tensor([[1, 2, 3]])
    config = CONFIGS[name]
    outputs = set()
    for seed in range(6):
        torch.manual_seed(0)
        before = torch.get_rng_state()
        outputs.add(tuple(model.generate(prompt, generation_config=config, seed=seed)[0].tolist()))
        untouched = torch.equal(torch.get_rng_state(), before)
        if not draws_random_numbers(config):
            assert untouched
    assert (len(outputs) > 1) == draws_random_numbers(config)
