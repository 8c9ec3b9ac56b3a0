"""Static shapes (``compile_config.dynamic=False``, what CUDA graphs need): a compiled generate of 8 blocks builds at
most 3 graphs for every model family and cache kind (the forward over the canvas, a cached span's forward, the
step's proposals), a second call builds none, and the tokens and forwards are eager's in float32; with a cache, its
keys/values stay in the same `StaticLayer` buffers, written in place, from the call's first forward to its last.
Dynamo's graphs are counted with a `CompileCounter` backend (static shapes, not the backend, decide the count)."""

import llada2_tiny as tiny
import pytest
import torch
from cache_spy import assert_one_static_cache, spy_on_caches
from tiny_mdm import tiny_dream, tiny_llada, tiny_mdm
from torch._dynamo.testing import CompileCounter
from transformers import AutoConfig, AutoModel, CompileConfig

from hf_mdm.generation_denoiser import Denoiser
from hf_mdm.generation_static import fixed_width, take_rows, window

BLOCK = 4
SETTINGS = dict(max_new_tokens=8 * BLOCK, block_length=BLOCK, steps=16, seed=3, return_dict_in_generate=True)
SAMPLERS = {
    "confidence": {},
    "threshold": dict(transfer="threshold", threshold=0.6, steps=None),
    "paper": dict(transfer="stochastic", strategy="random"),
    "guidance": dict(cfg_scale=1.5),  # the confidence sampler with classifier-free guidance (a batch of 2B rows)
    # LLaDA2's generate(): the last block's columns past the output computed but hidden from attention
    "hidden tail": dict(whole_blocks=True, hide_block_tail=True, max_new_tokens=8 * BLOCK - 2),
}
MAX_GRAPHS = 3


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _build(family: str) -> torch.nn.Module:
    """A sharper random network than the default: fewer near-ties among the confidences."""
    if family in ("mdm", "llada", "dream"):
        return {"mdm": tiny_mdm, "llada": tiny_llada, "dream": tiny_dream}[family](sharpen=20)
    fields = dict(tiny.CONFIGS["llada2_moe"], mask_token_id=tiny.MASK_ID, eos_token_id=tiny.MASK_ID - 1)
    model = AutoModel.from_config(AutoConfig.for_model(**fields)).eval()
    tiny.fill_weights(model, tiny.SEEDS["llada2_moe"])
    return model


@pytest.fixture(scope="module")
def models() -> dict:
    return {family: _build(family) for family in ("mdm", "llada", "dream", "llada2")}


# (family, kv_cache, sampler): every family under each of its cache kinds (LLaDA2: none and its exact block cache),
# the confidence sampler; the threshold and the paper's sampler on the MDM; guidance and a hidden block tail
CASES = [
    *[(family, cache, "confidence") for family in ("mdm", "llada", "dream") for cache in ("none", "prefix", "dual")],
    ("llada2", "none", "confidence"),
    ("llada2", "prefix", "confidence"),
    *[("mdm", cache, sampler) for cache in ("none", "prefix", "dual") for sampler in ("threshold", "paper")],
    ("mdm", "dual", "guidance"),
    ("llada2", "prefix", "guidance"),  # a row meets its EOS blocks before the other: it stays in the batch
    ("llada2", "prefix", "hidden tail"),
]


@pytest.mark.parametrize("family, cache, sampler", CASES)
def test_eight_blocks_compile_at_most_three_graphs_and_give_eager_tokens(models, family, cache, sampler):
    model = models[family]
    prompt = torch.randint(1, 28, (2, 5), generator=torch.Generator().manual_seed(1))
    settings = {**SETTINGS, "kv_cache": cache, **SAMPLERS[sampler]}
    eager = model.generate(prompt, **settings)
    counter = CompileCounter()
    static = CompileConfig(backend=counter, dynamic=False, fullgraph=True)
    with pytest.MonkeyPatch.context() as patch:
        buffers = spy_on_caches(patch)
        first = model.generate(prompt, compile_forward=True, compile_config=static, **settings)
    graphs = counter.frame_count
    second = model.generate(prompt, compile_forward=True, compile_config=static, **settings)
    assert 1 <= graphs <= MAX_GRAPHS, f"{graphs} graphs for {eager.nfe} forwards"
    assert counter.frame_count == graphs  # the second call replays the first's graphs
    assert torch.equal(first.sequences, eager.sequences) and torch.equal(second.sequences, eager.sequences)
    assert first.nfe == second.nfe == eager.nfe
    assert not bool((first.sequences == model.config.mask_token_id).any())
    if cache != "none":  # one set of StaticLayer buffers for every forward: a span forward reads the refreshed ones
        assert_one_static_cache(buffers, first.nfe // (2 if "cfg_scale" in settings else 1))


def test_dynamic_shapes_keep_asking_the_still_masked_positions(models):
    """Without static shapes nothing changes: the compiled forward is asked what eager asks (logits at the
    still-masked positions only), so a dynamic compile's LM head runs over fewer rows as the block fills."""
    asked, original = [], Denoiser._forward

    def forward(self, inputs, kwargs):
        asked.append((self.static_shapes, kwargs["logits_to_keep"].shape[-1]))
        return original(self, inputs, kwargs)

    prompt = torch.randint(1, 28, (1, 5), generator=torch.Generator().manual_seed(1))
    settings = dict(max_new_tokens=8, block_length=4, steps=8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Denoiser, "_forward", forward)
        models["mdm"].generate(prompt, compile_forward=True, compile_config=CompileConfig(backend="eager"), **settings)
        dynamic, asked[:] = list(asked), []
        static = CompileConfig(backend="eager", dynamic=False)
        models["mdm"].generate(prompt, compile_forward=True, compile_config=static, **settings)
    assert dynamic == [(False, 4), (False, 3), (False, 2), (False, 1)] * 2
    assert asked == [(True, 4)] * 8


def test_window_holds_the_block_at_a_fixed_width():
    assert window(5, 9, 4, 37) == (5, 9)
    assert window(36, 37, 4, 37) == (33, 37)  # a short last block: the columns before it
    assert window(2, 4, 8, 6) == (0, 6)  # never wider than the input
    assert window(3, 9, 4, 20) == (3, 9)  # never narrower than the block


def test_fixed_width_pads_a_span_with_its_last_column():
    assert fixed_width(torch.arange(5, 9), 6).tolist() == [5, 6, 7, 8, 8, 8]
    assert fixed_width(torch.arange(5, 9), 3).tolist() == [5, 6, 7, 8]


def test_take_rows_reads_the_asked_positions_of_the_fixed_rows():
    logits = torch.arange(2 * 4, dtype=torch.float32).view(1, 4, 2).expand(2, -1, -1)  # rows 10..13 of the input
    rows = torch.arange(10, 14)
    assert take_rows(logits, rows, torch.tensor([11, 13]))[0, :, 0].tolist() == [2.0, 6.0]
    per_row = take_rows(logits, rows, torch.tensor([[13, 10], [12, 0]]))  # 0: outside, clamped to the first row
    assert per_row[..., 0].tolist() == [[6.0, 0.0], [4.0, 0.0]]
