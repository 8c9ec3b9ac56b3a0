"""What hf_mdm relies on in the installed transformers, checked directly so that a release that changes it fails
here by name: the cache's name in model outputs and forward keywords (``cache`` from 5.24 on, ``past_key_values``
before), the `DynamicCache` layout the block caches write into, `GenerationConfig`'s validate signature and field
storage, and the Auto mappings the harness reads."""

import inspect

import pytest
import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache, GenerationConfig
from transformers.modeling_outputs import BaseModelOutputWithPast

from hf_mdm import MDMConfig, MDMForMaskedDiffusion
from hf_mdm.generation import MaskedDiffusionGenerationConfig
from hf_mdm.kv_cache import CACHE_FIELD, MaskedLMOutputWithPast, cached_keys_values, output_cache
from hf_mdm.models import DreamConfig, DreamModel, LLaDAConfig, LLaDAModelLM

MASK, VOCAB = 30, 31
NEW_CACHE_NAME = Version(transformers.__version__) >= Version("5.24")


def build(name):
    torch.manual_seed(0)
    if name == "mdm":
        return MDMForMaskedDiffusion(
            MDMConfig(
                vocab_size=VOCAB,
                mask_token_id=MASK,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
            )
        ).eval()
    if name == "llada":
        return LLaDAModelLM(
            LLaDAConfig(
                d_model=32,
                n_heads=4,
                n_kv_heads=2,
                n_layers=2,
                mlp_hidden_size=64,
                vocab_size=VOCAB,
                embedding_size=VOCAB,
                mask_token_id=MASK,
                eos_token_id=1,
                pad_token_id=1,
            )
        ).eval()
    return DreamModel(
        DreamConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            mask_token_id=MASK,
            pad_token_id=1,
            bos_token_id=1,
            eos_token_id=1,
        )
    ).eval()


@pytest.fixture(scope="module", params=["mdm", "llada", "dream"])
def model(request):
    return build(request.param)


def test_cache_field_is_the_installed_transformers_name():
    assert CACHE_FIELD == ("cache" if NEW_CACHE_NAME else "past_key_values")
    assert CACHE_FIELD in BaseModelOutputWithPast.__dataclass_fields__
    assert CACHE_FIELD in MaskedLMOutputWithPast.__dataclass_fields__


def test_forward_returns_the_cache_under_the_installed_name(model):
    x = torch.tensor([[3, MASK, 5, MASK, 7, 8]])
    out = model(x, use_cache=True)
    cache = output_cache(out)
    assert isinstance(cache, DynamicCache) and cache.get_seq_length() == x.shape[1]
    assert getattr(out, CACHE_FIELD) is cache
    if NEW_CACHE_NAME:
        assert out.cache is cache and out["cache"] is cache
    else:
        assert out.past_key_values is cache
    assert output_cache(model(x)) is None  # no cache asked, none returned


@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
def test_forward_takes_the_cache_under_either_name(model, keyword):
    """A span forward against a full forward's cache gives the full forward's logits at the span, whether the cache
    is passed as ``cache`` (5.24's name) or as ``past_key_values`` (the older one)."""
    x = torch.tensor([[3, MASK, 5, MASK, 7, 8]])
    full = model(x, use_cache=True)
    columns = torch.arange(2, 6)
    span = model(x[:, columns], **{keyword: output_cache(full)}, cache_position=columns)
    torch.testing.assert_close(span.logits, full.logits[:, columns])


def test_forward_refuses_the_cache_under_both_names(model):
    x = torch.tensor([[3, MASK, 5]])
    cache = output_cache(model(x, use_cache=True))
    with pytest.raises(ValueError, match="pass the keys/values cache once"):
        model(x[:, 1:], cache=cache, past_key_values=cache, cache_position=torch.arange(1, 3))


def test_dynamic_cache_layout_the_block_caches_write_into():
    """`cached_keys_values` writes a span's keys/values into ``cache.layers[i].keys/.values`` (B, heads, L, dim) in
    place and attends to them: the layout of transformers' DynamicLayer."""
    cache = DynamicCache()
    keys, values = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    cached_keys_values(cache, 0, keys, values, None)
    assert torch.equal(cache.layers[0].keys, keys) and torch.equal(cache.layers[0].values, values)
    new_keys, new_values = torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4)
    got_keys, got_values = cached_keys_values(cache, 0, new_keys, new_values, torch.tensor([1, 3]))
    expected = keys.clone()
    expected[:, :, [1, 3]] = new_keys
    assert torch.equal(got_keys, expected) and torch.equal(cache.layers[0].keys, expected)
    assert torch.equal(got_values[:, :, [1, 3]], new_values) and cache.get_seq_length() == 5


def test_generation_config_internals_the_diffusion_config_relies_on():
    """`MaskedDiffusionGenerationConfig.validate` forwards ``strict`` / ``user_set_attributes`` and hides fields by
    editing the instance ``__dict__``; unset fields read class defaults."""
    parameters = inspect.signature(GenerationConfig.validate).parameters
    assert "strict" in parameters  # user_set_attributes is forwarded where the installed version takes it
    config = GenerationConfig(max_new_tokens=5)
    assert config.__dict__["max_new_tokens"] == 5
    diffusion = MaskedDiffusionGenerationConfig(max_new_tokens=0, steps=4)
    diffusion.validate(strict=True)  # max_new_tokens 0 is legal here, rejected by transformers' own check
    assert diffusion.max_new_tokens == 0 and diffusion.temperature == 0.0 and "temperature" not in diffusion.__dict__
    with pytest.raises(ValueError):
        GenerationConfig(max_new_tokens=0).validate(strict=True)


def test_auto_mappings_know_the_registered_classes():
    import hf_mdm.models  # noqa: F401  registers LLaDA and Dream

    for config_class, model_class in (
        (MDMConfig, MDMForMaskedDiffusion),
        (LLaDAConfig, LLaDAModelLM),
        (DreamConfig, DreamModel),
    ):
        assert transformers.MODEL_FOR_MASKED_LM_MAPPING[config_class] is model_class
