"""Native LLaDA2.0 / LLaDA2.1: the published checkpoints' format loads without remote code, and the forward and the
published generate() presets reproduce the published code.

The reference numbers (``tests/fixtures/llada2_reference.json``) come from the published ``modeling_llada2_moe.py``
and ``modeling_llada21_moe.py`` run on tiny random models in their own environment (transformers 4.56) by
``tests/reference/llada2_published.py``; `llada2_tiny` builds the same weights here (checked by checksums, which
also checks that parameter names and shapes match the published ones).
"""

from __future__ import annotations

import json
from pathlib import Path

import llada2_tiny as tiny
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

import hf_mdm  # noqa: F401  (registers the Auto classes)
from hf_mdm.models import LLaDA2MoeConfig, LLaDA2MoeModelLM, LLaDA21MoeConfig, LLaDA21MoeModelLM

REFERENCE = json.loads((Path(__file__).parent / "fixtures/llada2_reference.json").read_text())
MODEL_TYPES = list(tiny.CONFIGS)
LOGITS_ATOL = 1e-4


def build(model_type: str, attn_implementation: str = "sdpa") -> torch.nn.Module:
    """The tiny model of ``model_type`` with the reference's weights, through the Auto classes."""
    config = AutoConfig.for_model(**tiny.CONFIGS[model_type], mask_token_id=tiny.MASK_ID)
    config._attn_implementation = attn_implementation
    model = AutoModel.from_config(config).eval()
    checksums = tiny.fill_weights(model, tiny.SEEDS[model_type])
    assert checksums == pytest.approx(REFERENCE["models"][model_type]["checksums"], rel=1e-12)
    return model


@pytest.fixture(scope="module", params=MODEL_TYPES)
def model_type(request) -> str:
    return request.param


def reference_logits(model_type: str) -> tuple[torch.Tensor, int, torch.Tensor]:
    entry = REFERENCE["models"][model_type]
    return torch.tensor([entry["canvas"]]), entry["block_length"], torch.tensor(entry["logits"])


def test_classes_and_parameter_names_are_the_published_ones(model_type):
    model = build(model_type)
    expected = {"llada2_moe": (LLaDA2MoeConfig, LLaDA2MoeModelLM), "llada21_moe": (LLaDA21MoeConfig, LLaDA21MoeModelLM)}
    assert (type(model.config), type(model)) == expected[model_type]
    names = set(model.state_dict())
    assert len(names) == len(REFERENCE["models"][model_type]["checksums"])
    first_moe = tiny.CONFIGS[model_type]["first_k_dense_replace"]
    for name in (
        "model.word_embeddings.weight",
        "model.layers.0.attention.query_key_value.weight",
        "model.layers.0.attention.query_layernorm.weight",
        "model.layers.0.attention.dense.weight",
        "model.layers.0.mlp.gate_proj.weight",
        f"model.layers.{first_moe}.mlp.gate.expert_bias",
        f"model.layers.{first_moe}.mlp.experts.7.down_proj.weight",
        f"model.layers.{first_moe}.mlp.shared_experts.up_proj.weight",
        "lm_head.weight",
    ):
        assert name in names, name


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("mask_kind", ["additive_bf16", "boolean", "own_blocks"])
def test_logits_equal_the_published_code(model_type, attn_implementation, mask_kind):
    canvas, block_length, expected = reference_logits(model_type)
    model = build(model_type, attn_implementation)
    additive = tiny.block_causal_additive_mask(canvas.shape[1], block_length)
    mask = {"additive_bf16": additive, "boolean": additive == 0, "own_blocks": None}[mask_kind]
    with torch.no_grad():
        logits = model(canvas, attention_mask=mask, block_size=block_length).logits[0]
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, atol=LOGITS_ATOL, rtol=0)
    if mask_kind == "boolean":
        published_boolean = torch.tensor(REFERENCE["models"][model_type]["logits_boolean_mask"])
        torch.testing.assert_close(logits, published_boolean, atol=LOGITS_ATOL, rtol=0)


def test_block_size_changes_the_logits(model_type):
    """The reference's blocks matter: bidirectional attention, or other blocks, give other logits."""
    canvas, block_length, expected = reference_logits(model_type)
    model = build(model_type)
    with torch.no_grad():
        default = model(canvas).logits[0]  # config.block_size = 32 > the canvas: one block, bidirectional
        other = model(canvas, block_size=block_length // 2).logits[0]
    assert model.config.block_size == 32
    assert (default - expected).abs().max() > 1e-2
    assert (other - expected).abs().max() > 1e-2


def test_padding_mask_combines_with_blocks(model_type):
    """A left-padded row, its positions counted from its first token, gives the logits it has alone."""
    canvas, block_length, expected = reference_logits(model_type)
    model = build(model_type)
    pad = 3
    padded = torch.cat([torch.zeros(1, pad, dtype=torch.long), canvas], dim=1)
    attention_mask = (torch.arange(padded.shape[1]) >= pad).long()[None]
    position_ids = (torch.arange(padded.shape[1]) - pad).clamp(min=0)[None]
    with torch.no_grad():
        logits = model(padded, attention_mask=attention_mask, position_ids=position_ids, block_size=block_length)
    torch.testing.assert_close(logits.logits[0, pad:], expected, atol=LOGITS_ATOL, rtol=0)


def published_config_json(model_type: str) -> dict:
    """A config.json in the published format: the published keys (tiny sizes), ``architectures`` and ``auto_map``
    naming the remote code, no hf_mdm keys."""
    module = {"llada2_moe": "modeling_llada2_moe", "llada21_moe": "modeling_llada21_moe"}[model_type]
    configuration = module.replace("modeling", "configuration")
    return {
        **tiny.CONFIGS[model_type],
        **tiny.RUNTIME,
        "architectures": ["LLaDA2MoeModelLM"],
        "auto_map": {
            "AutoConfig": f"{configuration}.LLaDA2MoeConfig",
            "AutoModel": f"{module}.LLaDA2MoeModel",
            "AutoModelForCausalLM": f"{module}.LLaDA2MoeModelLM",
        },
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "transformers_version": "4.56.2",
        "use_cache": False,
    }


@pytest.mark.parametrize("auto_class", [AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM])
def test_published_checkpoint_loads_without_remote_code(model_type, auto_class, tmp_path):
    canvas, block_length, expected = reference_logits(model_type)
    weights = {name: tensor.clone().contiguous() for name, tensor in build(model_type).state_dict().items()}
    (tmp_path / "config.json").write_text(json.dumps(published_config_json(model_type)))
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model = auto_class.from_pretrained(tmp_path).eval()
    assert model.config.model_type == model_type
    assert model.config.mask_token_id == 156895 and model.config.block_size == 32  # the published generate()'s
    loaded = model.state_dict()
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor), name
    mask = tiny.block_causal_additive_mask(canvas.shape[1], block_length)
    with torch.no_grad():
        logits = model(canvas, attention_mask=mask).logits[0]
    torch.testing.assert_close(logits, expected, atol=LOGITS_ATOL, rtol=0)


def test_rope_scaling_is_refused():
    fields = {k: v for k, v in tiny.CONFIGS["llada2_moe"].items() if k != "model_type"}
    config = LLaDA2MoeConfig(**{**fields, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    with pytest.raises(ValueError, match="rope_scaling=None"):
        LLaDA2MoeModelLM(config)
