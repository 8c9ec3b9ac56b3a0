"""A2D (`hf_mdm.finetune.a2d`, ``hf-mdm a2d``): an AR Llama / Qwen2 turned into hf_mdm's masked diffusion model."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForMaskedLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from hf_mdm.finetune import convert_to_mdm
from hf_mdm.generation import diffusion_generate
from hf_mdm.modeling_blocks import shift_logits

VOCAB = 50
SIZES = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip


def ar_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    classes = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen2": (Qwen2ForCausalLM, Qwen2Config)}
    model_class, config_class = classes[kind]
    return model_class(config_class(**SIZES)).eval()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_causal_conversion_reproduces_the_ar_model_as_the_shift_says(kind):
    """With block_size=1 (causal attention) the converted model's logits are the AR model's; with shift 1 the
    sampler reads position i + 1 from the logits at i, the AR model's next-token prediction."""
    ar = ar_model(kind)
    ids = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(1))
    expected = ar(ids).logits
    mdm = convert_to_mdm(ar, block_size=1, logits_shift=1)
    assert mdm.config.mask_token_id == VOCAB and mdm.config.vocab_size == VOCAB + 1
    logits = mdm(input_ids=ids).logits
    assert torch.allclose(logits[..., :VOCAB], expected, atol=1e-5)
    read = shift_logits(logits, mdm.config.logits_shift)  # what predicts each position
    assert torch.allclose(read[:, 1:, :VOCAB], expected[:, :-1], atol=1e-5)
    unshifted = convert_to_mdm(ar, block_size=1, logits_shift=0)
    assert torch.allclose(shift_logits(unshifted(input_ids=ids).logits, 0)[..., :VOCAB], expected, atol=1e-5)
    embeddings = mdm.get_input_embeddings().weight
    assert torch.allclose(embeddings[VOCAB], ar.get_input_embeddings().weight.mean(0))  # the new [MASK] row


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_bidirectional_conversion_attends_to_the_future_and_samples(kind):
    ar = ar_model(kind)
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(2))
    mdm = convert_to_mdm(ar)
    assert mdm.config.block_size is None
    logits = mdm(input_ids=ids).logits[..., :VOCAB]
    assert not torch.allclose(logits[:, :-1], ar(ids).logits[:, :-1], atol=1e-3)  # earlier positions see later ones
    out = diffusion_generate(mdm, ids[:, :4], max_new_tokens=6, steps=6, return_dict_in_generate=True)
    assert out.sequences.shape == (2, 10) and not bool((out.sequences == VOCAB).any())
    blocks = convert_to_mdm(ar, block_size=4)
    assert blocks.config.block_size == 4


def test_refusals_say_what_to_change():
    ar = ar_model("llama")
    ar.config.rope_parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
    with pytest.raises(ValueError, match="scales RoPE"):
        convert_to_mdm(ar)
    with pytest.raises(ValueError, match="logits_shift"):
        convert_to_mdm(ar_model("llama"), logits_shift=2)
    other = ar_model("llama")
    other.config.model_type = "gpt2"
    with pytest.raises(ValueError, match="converts"):
        convert_to_mdm(other)


def test_a2d_command_writes_a_loadable_diffusion_model(tmp_path):
    from hf_mdm.cli import main
    from hf_mdm.harness.tiny import build_tiny_models

    llama = build_tiny_models(tmp_path / "tiny")["llama"]
    out = tmp_path / "converted"
    assert main(["a2d", "--model", str(llama), "--output-dir", str(out), "--block-size", "8"]) == 0
    model = AutoModelForMaskedLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.mask_token_id == tokenizer.mask_token_id and model.config.block_size == 8
    assert model.config.logits_shift == 1
    ids = torch.tensor([tokenizer("2 + 3 =")["input_ids"]])
    assert diffusion_generate(model, ids, max_new_tokens=8, steps=8).shape == (1, ids.shape[1] + 8)
