"""Batch invariance that keeps the batch (`hf_mdm.generation_rows`, `hf_mdm.generation_random`): rows of one length
run as one batch without padding, each drawing from its own generator inside the batched step, and every row's
tokens still equal those it gets alone: every transfer and strategy, the caches, every family, left and right
padding around them, batch sizes 1 to 16; the groups are real (one group's forwards, not one per row); where the
kernels choose their reduction by the number of rows (bfloat16 under AMX, CUDA) the rows run alone."""

from __future__ import annotations

import pytest
import torch
from tiny_mdm import tiny_mdm

from hf_mdm import MaskedDiffusionGenerationConfig, generation_rows
from hf_mdm.generation_rows import RowLayout, batches_invariantly, plan_rows
from hf_mdm.gpu_check.shapes import shapes

VOCAB, MASK = 64, 63
NEW = dict(max_new_tokens=16, steps=8, block_length=8)


def equal_length_batch(count: int, length: int, seed: int, pads: tuple = (0, 2, 5)):
    """``count`` prompts of ``length`` tokens, padded left or right by 0-5 columns in turn (pad id 0) beside a row
    that fills the width: (ids, attention mask, the prompts)."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, MASK - 1, (length,), generator=generator) for _ in range(count)]
    width = length + max(pads)
    ids = torch.zeros((count, width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        pad = pads[i % len(pads)]
        start = pad if i % 2 == 0 else width - length - pad  # left padding, then right padding
        ids[i, start : start + length], attention[i, start : start + length] = p, 1
    return ids, attention, prompts


def alone(model, prompts, seeds, **settings) -> list[list[int]]:
    return [model.generate(p[None], seed=s, **settings)[0, len(p) :].tolist() for p, s in zip(prompts, seeds)]


@pytest.fixture(scope="module")
def mdm():
    return tiny_mdm(vocab_size=VOCAB, mask_token_id=MASK, hidden_size=64, intermediate_size=128)


SETTINGS = {
    "confidence, T=1": dict(temperature=1.0),
    "random order, T=1": dict(strategy="random", temperature=1.0),
    "left to right, T=1": dict(strategy="left_to_right", temperature=1.0),
    "margin, T=1, prefix cache": dict(strategy="margin", temperature=1.0, kv_cache="prefix"),
    "entropy, T=1, dual cache": dict(strategy="entropy", temperature=1.0, kv_cache="dual"),
    "stochastic, T=1": dict(transfer="stochastic", temperature=1.0),
    "paper's sampler": dict(transfer="stochastic", strategy="random", temperature=1.0),
    "threshold, T=1": dict(transfer="threshold", threshold=0.2, temperature=1.0),
    "entropy bound, T=1": dict(transfer="entropy_bound", entropy_bound=1.0, temperature=1.0),
    "llada2, T=1": dict(transfer="llada2", threshold=0.3, temperature=1.0),
    "ReMDM, T=1": dict(remdm="cap", remdm_eta=0.1, temperature=1.0),
    "top-k top-p, T=0.7": dict(temperature=0.7, top_k=20, top_p=0.9),
    "T=0": dict(),
    "speculative, T=0": dict(transfer="speculative", draft_length=3, steps=None, block_length=None),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_equal_length_rows_keep_the_batch_and_their_own_tokens(mdm, name):
    settings = {**NEW, **SETTINGS[name], "return_dict_in_generate": True}
    ids, attention, prompts = equal_length_batch(6, 7, seed=len(name))
    seeds = [200 + i for i in range(6)]
    out = mdm.generate(ids, attention_mask=attention, batch_invariant=True, seed=seeds, **settings)
    expected = [mdm.generate(p[None], seed=s, **settings) for p, s in zip(prompts, seeds)]
    assert out.sequences[:, ids.shape[1] :].tolist() == [e.sequences[0, 7:].tolist() for e in expected]
    assert out.nfe == max(int(e.nfe) for e in expected)  # one batch: the forwards of its longest row, not a sum


@pytest.mark.parametrize("size", [1, 2, 5, 16])
def test_any_batch_size_and_a_mix_of_lengths(mdm, size):
    """Rows of three lengths in one call: each length is a group; every row its own tokens."""
    parts = [equal_length_batch(size, n, seed=n) for n in (4, 6, 9)]
    prompts = [p for part in parts for p in part[2]][:size]
    width = max(len(p) for p in prompts) + 1
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], attention[i, width - len(p) :] = p, 1
    seeds = list(range(len(prompts)))
    settings = {**NEW, "strategy": "random", "transfer": "stochastic", "temperature": 1.0}
    out = mdm.generate(ids, attention_mask=attention, batch_invariant=True, seed=seeds, **settings)
    assert out[:, width:].tolist() == alone(mdm, prompts, seeds, **settings)


def test_one_seed_per_row_without_the_mode_keeps_the_batch_too(mdm):
    ids, attention, prompts = equal_length_batch(8, 5, seed=1)
    settings = {**NEW, "temperature": 1.0, "return_dict_in_generate": True}
    out = mdm.generate(ids, attention_mask=attention, seed=list(range(8)), **settings)
    assert out.sequences[:, ids.shape[1] :].tolist() == alone(mdm, prompts, list(range(8)), **NEW, temperature=1.0)
    assert out.nfe == 8  # one batch: 8 steps
    other = mdm.generate(ids, attention_mask=attention, seed=[9] + list(range(1, 8)), **settings)
    assert other.sequences[1:].tolist() == out.sequences[1:].tolist()
    assert other.sequences[0].tolist() != out.sequences[0].tolist()


FAMILIES = {s.name: s for s in shapes(tiny=True) if s.kind == "diffusion"}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family(name):
    shape = FAMILIES[name]
    model = shape.build(torch.float32, "cpu")
    ids_of = dict(shape.token_ids)
    settings = dict(max_new_tokens=16, steps=8, block_length=8, temperature=1.0, **ids_of)
    caches = [None, "dual"] if not shape.block_causal else [None]
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 400, (9,), generator=generator) for _ in range(5)]
    ids = torch.stack(prompts)
    for cache in caches:
        out = model.generate(ids, batch_invariant=True, seed=list(range(5)), kv_cache=cache, **settings)
        assert out[:, 9:].tolist() == alone(model, prompts, list(range(5)), kv_cache=cache, **settings), cache


def test_block_causal_model_with_exact_cache_and_editing_at_temperature_one():
    model = tiny_mdm(block_size=8, vocab_size=VOCAB, mask_token_id=MASK)
    ids, attention, prompts = equal_length_batch(6, 5, seed=3)
    for config in (
        MaskedDiffusionGenerationConfig.llada2(max_new_tokens=16, block_length=8, threshold=0.5, temperature=1.0),
        MaskedDiffusionGenerationConfig.llada21(
            max_new_tokens=16, block_length=8, threshold=0.5, editing_threshold=0.3, temperature=1.0
        ),
    ):
        out = model.generate(ids, attention_mask=attention, generation_config=config, batch_invariant=True, seed=7)
        expected = [model.generate(p[None], generation_config=config, seed=7)[0, 5:].tolist() for p in prompts]
        assert out[:, ids.shape[1] :].tolist() == expected


def test_bfloat16_keeps_the_batch_where_amx_is_off(mdm, monkeypatch):
    """With AMX off (a CPU without it, or ONEDNN_MAX_CPU_ISA below it) bfloat16 rows of one length run as one batch,
    each its own tokens (the tiny model's products give a row the same bits at any number of rows)."""
    model = tiny_mdm(vocab_size=VOCAB, mask_token_id=MASK, hidden_size=64, intermediate_size=128).to(torch.bfloat16)
    monkeypatch.setattr(generation_rows, "_amx_in_use", lambda: False)
    ids, attention, prompts = equal_length_batch(8, 6, seed=4)
    settings = {**NEW, "strategy": "random", "temperature": 1.0, "return_dict_in_generate": True}
    out = model.generate(ids, attention_mask=attention, batch_invariant=True, seed=list(range(8)), **settings)
    assert out.nfe == 8
    expected = alone(
        model, prompts, list(range(8)), **{k: v for k, v in settings.items() if k != "return_dict_in_generate"}
    )
    assert out.sequences[:, ids.shape[1] :].tolist() == expected


def test_where_rows_run_alone(monkeypatch):
    """The device policy: float32 on the CPU batches; bfloat16 under AMX and anything on CUDA runs rows alone; and
    samplers whose draws are not per row (a reference sampler's, speculative decoding's) run rows alone."""
    assert batches_invariantly("cpu", torch.float32)
    assert not batches_invariantly("cuda", torch.float32)
    monkeypatch.setattr(generation_rows, "_amx_in_use", lambda: True)
    assert not batches_invariantly("cpu", torch.bfloat16)
    monkeypatch.setattr(generation_rows, "_amx_in_use", lambda: False)
    assert batches_invariantly("cpu", torch.bfloat16)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    monkeypatch.undo()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert not generation_rows._amx_in_use()
    ids, attention, _ = equal_length_batch(4, 5, seed=5)
    layout = RowLayout(ids, attention, MASK)
    config = MaskedDiffusionGenerationConfig(**NEW, temperature=1.0, batch_invariant=True)
    assert plan_rows(config, 1, None, layout, "cpu", torch.float32) == [[0, 1, 2, 3]]
    assert plan_rows(config, 1, None, layout, "cuda", torch.float32) == [[0], [1], [2], [3]]
    # one seed per row without the mode: its own draws in the batch's forwards, on any device
    seeds = MaskedDiffusionGenerationConfig(**NEW, temperature=1.0)
    assert plan_rows(seeds, [1, 2, 3, 4], None, layout, "cuda", torch.bfloat16) == [[0, 1, 2, 3]]
    reference = MaskedDiffusionGenerationConfig.llada(gen_length=16, steps=8, block_length=8, temperature=1.0)
    reference.batch_invariant = True
    assert plan_rows(reference, 1, None, layout, "cpu", torch.float32) == [[0], [1], [2], [3]]
    # a prompt [MASK] at another column is another layout: its own group
    ids[1, attention[1].bool().nonzero()[0]] = MASK
    assert plan_rows(config, 1, None, RowLayout(ids, attention, MASK), "cpu", torch.float32) == [[0, 2, 3], [1]]


def test_diffusion_gemma_rows_alone():
    """DiffusionGemma's rows share the canvas draws, so with batch_invariant=True every row runs alone, its padding
    dropped: each row's tokens those it gets alone with the seed."""
    from test_diffusion_gemma_sampler import SETTINGS, prompts, tiny_diffusion_gemma

    from hf_mdm.generation import diffusion_generate

    model = tiny_diffusion_gemma()
    ids, mask = prompts(4)
    config = MaskedDiffusionGenerationConfig.diffusion_gemma(**SETTINGS)
    out = diffusion_generate(model, ids, attention_mask=mask, generation_config=config, seed=3, batch_invariant=True)
    batched = diffusion_generate(model, ids, attention_mask=mask, generation_config=config, seed=3)
    assert out.sequences.shape == batched.sequences.shape
    for b in range(4):
        row = ids[b][mask[b].bool()][None]
        own = diffusion_generate(model, row, generation_config=config, seed=3).sequences[0, row.shape[1] :]
        assert out.sequences[b, ids.shape[1] :].tolist() == own.tolist()
    assert batched.sequences[1:, ids.shape[1] :].tolist() != out.sequences[1:, ids.shape[1] :].tolist()
    with pytest.raises(ValueError, match="needs seed="):
        diffusion_generate(model, ids, attention_mask=mask, generation_config=config, batch_invariant=True)
