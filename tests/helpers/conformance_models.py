"""Tiny configs of every model class hf_mdm registers (`TINY`, one per class, on a vocabulary of `VOCAB` with
`MASK` its mask id) and `build`, a seeded tiny model of a class with an attention implementation and block size: the
models the conformance tests check, and the generation tests run."""

import torch

import hf_mdm  # noqa: F401  registers MDMForMaskedDiffusion
import hf_mdm.models  # noqa: F401  registers LLaDA and Dream
from hf_mdm import MDMConfig, MDMForMaskedDiffusion
from hf_mdm.models import (
    DreamConfig,
    DreamModel,
    LLaDA2MoeConfig,
    LLaDA2MoeModelLM,
    LLaDA21MoeConfig,
    LLaDA21MoeModelLM,
    LLaDAConfig,
    LLaDAModelLM,
)

VOCAB, MASK = 31, 30
TINY = {
    MDMForMaskedDiffusion: lambda: MDMConfig(
        vocab_size=VOCAB,
        mask_token_id=MASK,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
    ),
    LLaDAModelLM: lambda: LLaDAConfig(
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        n_layers=2,
        mlp_hidden_size=48,
        vocab_size=VOCAB,
        embedding_size=VOCAB,
        mask_token_id=MASK,
        eos_token_id=1,
        pad_token_id=1,
        weight_tying=False,
    ),
    DreamModel: lambda: DreamConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        mask_token_id=MASK,
        pad_token_id=1,
        bos_token_id=1,
        eos_token_id=1,
    ),
}
_LLADA2 = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts=4,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    moe_intermediate_size=16,
    num_shared_experts=1,
    first_k_dense_replace=1,
    use_qkv_bias=True,
    mask_token_id=MASK,
    pad_token_id=1,
    eos_token_id=1,
    max_position_embeddings=64,
)
TINY[LLaDA2MoeModelLM] = lambda: LLaDA2MoeConfig(**_LLADA2)
TINY[LLaDA21MoeModelLM] = lambda: LLaDA21MoeConfig(**_LLADA2)


def build(model_class, block_size=None, implementation="sdpa"):
    torch.manual_seed(0)
    config = TINY[model_class]()
    config.block_size = block_size
    model = model_class(config).eval()
    model.set_attn_implementation(implementation)
    assert model.config._attn_implementation == implementation
    return model
