"""The LM head only where a step needs it (`hf_mdm.generation_sampler.still_masked_positions`): a count-based step
asks logits at each row's still-masked positions, as many as the most any row still has (known at the block's
start, nothing read back), an adaptive step as many as its one read says; the tokens are those of asking at every
column of the block."""

from __future__ import annotations

import pytest
import torch
from tiny_mdm import tiny_mdm

from hf_mdm.generation_sampler import Sampler, still_masked_positions


def lm_head_rows(model, **settings) -> tuple[torch.Tensor, list[int]]:
    """The output and the LM head's rows (positions) at every forward."""
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[:-1].numel()))
    try:
        out = model.generate(**settings)
    finally:
        hook.remove()
    return out, rows


def most_masked_before_each_step(out) -> list[int]:
    """From the canvases of ``output_history``: before each step, the most [MASK] a row has in the current block (of
    the two blocks of 8 after the 4-token prompt)."""
    canvases = [torch.cat([PROMPTS["input_ids"], torch.full((2, 16), 30)], 1)] + list(out.history)
    most = []
    for before in canvases[:-1]:
        block = slice(4, 12) if (before[:, 4:12] == 30).any() else slice(12, 20)
        most.append(int((before[:, block] == 30).sum(1).max()))
    return most


PROMPTS = dict(
    input_ids=torch.tensor([[1, 2, 3, 4], [0, 5, 6, 7]]), attention_mask=torch.tensor([[1] * 4, [0, 1, 1, 1]])
)


def test_count_based_steps_ask_logits_only_at_still_masked_positions():
    """Blocks of 8, 4 steps a block (2 tokens a step): the LM head runs on 8, 6, 4, 2 positions a row."""
    model = tiny_mdm(sharpen=8.0)
    _, rows = lm_head_rows(model, **PROMPTS, max_new_tokens=16, steps=8, block_length=8)
    assert rows == [2 * w for w in (8, 6, 4, 2)] * 2


def test_stochastic_counts_give_each_step_the_rows_most_still_masked():
    model = tiny_mdm(sharpen=8.0)
    settings = dict(**PROMPTS, max_new_tokens=16, steps=8, block_length=8, transfer="stochastic", seed=3)
    out, rows = lm_head_rows(model, **settings, return_dict_in_generate=True, output_history=True)
    assert rows == [2 * w for w in most_masked_before_each_step(out)]


def test_adaptive_steps_use_their_one_read():
    model = tiny_mdm(sharpen=8.0)
    settings = dict(**PROMPTS, max_new_tokens=16, steps=16, block_length=8, transfer="threshold", threshold=0.6)
    out, rows = lm_head_rows(model, **settings, return_dict_in_generate=True, output_history=True)
    assert rows == [2 * w for w in most_masked_before_each_step(out)]
    assert sum(rows) < 2 * 8 * len(rows)  # fewer than every block column


@pytest.mark.parametrize(
    "settings",
    [
        dict(steps=8),
        dict(steps=8, strategy="margin"),
        dict(steps=8, transfer="stochastic", seed=0),
        dict(steps=16, transfer="threshold", threshold=0.6),
        dict(steps=16, transfer="entropy_bound", entropy_bound=0.8),
        dict(steps=8, kv_cache="dual"),
    ],
    ids=str,
)
def test_tokens_equal_asking_at_every_block_column(settings, monkeypatch):
    model = tiny_mdm(sharpen=8.0)
    common = dict(**PROMPTS, max_new_tokens=16, block_length=8, **settings)
    gathered = model.generate(**common)
    monkeypatch.setattr(Sampler, "gather_still_masked", False)
    assert torch.equal(model.generate(**common), gathered)


def test_still_masked_positions_by_hand():
    block_mask = torch.tensor([[0, 1, 0, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    keep = torch.tensor([0, 1, 3, 4])
    assert still_masked_positions(block_mask, keep, 3).tolist() == [[1, 3, 4], [0, 1, 3]]  # row 1: one, then filler
    assert still_masked_positions(block_mask, keep, None).tolist() == [[0, 1, 3, 4]] * 2
    assert still_masked_positions(block_mask, keep, 9).tolist() == [[0, 1, 3, 4]] * 2


def test_cuda_graphs_keep_one_shape_a_block(monkeypatch):
    """A forward compiled into CUDA graphs (inductor's "reduce-overhead") is asked for logits at every column of the
    block at every step, so a block replays one graph; elsewhere the still-masked positions."""
    from transformers import CompileConfig

    from hf_mdm.generation_config import MaskedDiffusionGenerationConfig
    from hf_mdm.generation_denoiser import Denoiser, compile_options

    model = tiny_mdm(sharpen=8.0)
    graphs = MaskedDiffusionGenerationConfig(
        compile_forward=True, compile_config=CompileConfig(backend="inductor", mode="reduce-overhead")
    )
    with pytest.raises(ValueError, match="replays CUDA graphs, which need the model on a CUDA device"):
        Denoiser.for_model(model, 30, compile=compile_options(graphs))  # this model is on the CPU
    assert not Denoiser.for_model(model, 30, compile={"backend": "inductor", "dynamic": True}).cuda_graphs
    built = Denoiser.for_model.__func__

    def with_cuda_graphs(cls, *args, **kwargs):
        denoiser = built(cls, *args, **kwargs)
        denoiser.cuda_graphs = True
        return denoiser

    monkeypatch.setattr(Denoiser, "for_model", classmethod(with_cuda_graphs))
    _, rows = lm_head_rows(model, **PROMPTS, max_new_tokens=16, steps=8, block_length=8)
    assert rows == [2 * 8] * 8


@pytest.mark.parametrize("cache, block_size", [("dual", None), ("prefix", None), ("prefix", 8)])
def test_the_static_cache_of_cuda_graphs_gives_the_dynamic_caches_tokens(cache, block_size, monkeypatch):
    """Under CUDA graphs the caches keep keys/values in preallocated buffers written in place (transformers'
    `StaticLayer`s, one allocation a call) and a step asks logits at the block's columns: on the CPU, without
    graphs, the same tokens as the dynamic cache with the still-masked positions, and every refresh writes into the
    same memory."""
    from hf_mdm.generation_denoiser import Denoiser

    model = tiny_mdm(sharpen=8.0, block_size=block_size)
    settings = dict(**PROMPTS, max_new_tokens=24, steps=12, block_length=8, kv_cache=cache)
    dynamic = model.generate(**settings)
    built, seen = Denoiser.for_model.__func__, []

    def with_static_cache(cls, *args, **kwargs):
        denoiser = built(cls, *args, **kwargs)
        denoiser.cuda_graphs = True  # as a CUDA-graph compile mode sets it (its static cache), without compiling
        assert denoiser.static_cache
        seen.append(denoiser)
        return denoiser

    monkeypatch.setattr(Denoiser, "for_model", classmethod(with_static_cache))
    pointers = []
    original = Denoiser._forward

    def forward(self, inputs, kwargs):
        logits = original(self, inputs, kwargs)
        if self.static is not None:
            pointers.append(self.static.layers[0].keys.data_ptr())
        return logits

    monkeypatch.setattr(Denoiser, "_forward", forward)
    assert torch.equal(model.generate(**settings), dynamic)
    assert len(pointers) == seen[0].nfe and len(set(pointers)) == 1  # one allocation, written in place
