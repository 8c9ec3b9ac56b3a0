"""Tiny LLaDA2.x models for the tests, shared with ``tests/reference/llada2_published.py``.

Both sides build the same weights without sharing code with either implementation: `fill_weights` walks a model's
state dict in sorted name order and draws every tensor from one seeded generator, so the published classes (run in
their own environment by the reference script) and hf_mdm's classes get bit-identical parameters exactly when their
parameter names and shapes agree. ``checksums`` (one float per tensor) are stored with the reference outputs and
checked before any comparison.

The random draws are sized so that the tiny models are confident enough for the samplers' thresholds to matter:
the LM head is scaled up (``HEAD_SCALE``), giving top probabilities spread over (0, 1), and its [MASK] row is zero
so that [MASK] is never the top token (the published samplers could propose it, hf_mdm's never does).
"""

from __future__ import annotations

import torch

VOCAB = 48
MASK_ID = 47
HEAD_SCALE = 6.0

# Architecture fields of the published config.json (configuration_llada2_moe.py), tiny sizes. Two variants cover the
# optional parts: biases on the fused projection and the output projection, and a second dense layer.
CONFIGS = {
    "llada2_moe": dict(
        model_type="llada2_moe",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        hidden_act="silu",
        use_qkv_bias=True,
        use_qk_norm=True,
        use_bias=True,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        max_position_embeddings=256,
        rope_theta=10000.0,
        partial_rotary_factor=0.5,
        pad_token_id=0,
        num_experts=8,
        num_shared_experts=1,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        moe_intermediate_size=16,
        first_k_dense_replace=1,
    ),
    "llada21_moe": dict(
        model_type="llada21_moe",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        hidden_act="silu",
        use_qkv_bias=False,
        use_qk_norm=True,
        use_bias=False,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        max_position_embeddings=256,
        rope_theta=600000.0,
        partial_rotary_factor=0.5,
        pad_token_id=0,
        num_experts=8,
        num_shared_experts=1,
        num_experts_per_tok=4,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.0,
        moe_intermediate_size=16,
        first_k_dense_replace=2,
    ),
}
# Settings that are not architecture but change the numbers: no dropout in eval mode anyway, set for clarity.
RUNTIME = dict(embedding_dropout=0.0, attention_dropout=0.0, output_dropout=0.0)


def _scale(name: str) -> tuple[float, float]:
    """(mean, std) of the draw for a parameter: norms around 1, the router's expert bias small, the LM head wide."""
    if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
        return 1.0, 0.1
    if name.endswith("expert_bias"):
        return 0.0, 0.05
    if name.startswith("lm_head"):
        return 0.0, HEAD_SCALE / 32**0.5
    if name.endswith("bias"):
        return 0.0, 0.05
    return 0.0, 0.25


@torch.no_grad()
def fill_weights(model: torch.nn.Module | dict[str, torch.Tensor], seed: int) -> list[float]:
    """Overwrite every tensor of ``model.state_dict()`` (parameters and persistent buffers), or of a state dict in
    the published layout, from one generator, in sorted name order; returns the per-tensor checksums (sum of
    absolute values, float64)."""
    generator = torch.Generator().manual_seed(seed)
    state = model if isinstance(model, dict) else model.state_dict()
    checksums = []
    for name in sorted(state):
        tensor = state[name]
        mean, std = _scale(name)
        values = torch.randn(tensor.shape, generator=generator, dtype=torch.float32) * std + mean
        if name == "lm_head.weight":
            values[MASK_ID] = 0.0  # [MASK]'s logit 0, below the top logit of the others: never proposed
        tensor.copy_(values.to(tensor.dtype))
        checksums.append(float(values.double().abs().sum()))
    return checksums


def block_causal_additive_mask(length: int, block_length: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The published generate()'s attention mask over ``length`` positions: (1, 1, L, L), 0 where a query may attend
    (a key in its block or an earlier one), -inf elsewhere, in bfloat16 as published."""
    blocks = torch.arange(length) // block_length
    allowed = blocks[None, :] <= blocks[:, None]
    return torch.zeros(length, length).masked_fill(~allowed, float("-inf")).to(dtype)[None, None]


# generate() cases: (name, model type, prompt length, keyword arguments of the published generate()). eos_id is
# filled in by the reference script where the case says "eos": a token the model generates inside a block.
GENERATE_CASES = [
    ("short_prompt", "llada2_moe", 5, dict(gen_length=24, block_length=8, steps=8, threshold=0.95)),
    ("long_prompt", "llada2_moe", 13, dict(gen_length=20, block_length=8, steps=4, threshold=0.9)),
    ("default_block", "llada2_moe", 6, dict(gen_length=40, steps=32)),
    ("threshold_never", "llada2_moe", 5, dict(gen_length=16, block_length=8, steps=3, threshold=1.0)),
    ("threshold_always", "llada2_moe", 5, dict(gen_length=16, block_length=8, steps=3, threshold=0.0)),
    ("steps_not_dividing", "llada2_moe", 8, dict(gen_length=24, block_length=8, steps=5, threshold=0.8)),
    ("more_steps_than_block", "llada2_moe", 3, dict(gen_length=16, block_length=8, steps=12, threshold=1.0)),
    ("minimal_topk", "llada2_moe", 5, dict(gen_length=16, block_length=8, steps=8, minimal_topk=3, threshold=1.0)),
    ("eos_in_block", "llada2_moe", 5, dict(gen_length=32, block_length=8, steps=8, threshold=1.0, eos="eos")),
    (
        "eos_early_stop",
        "llada2_moe",
        5,
        dict(gen_length=32, block_length=8, steps=8, threshold=1.0, eos="eos", eos_early_stop=True),
    ),
    ("edit_fires", "llada21_moe", 5, dict(gen_length=24, block_length=8, threshold=0.7, editing_threshold=0.3)),
    ("edit_never", "llada21_moe", 5, dict(gen_length=24, block_length=8, threshold=0.7, editing_threshold=1.0)),
    (
        "edit_post_steps",
        "llada21_moe",
        13,
        dict(gen_length=20, block_length=8, threshold=0.5, editing_threshold=0.2, max_post_steps=2, num_to_transfer=2),
    ),
    ("edit_default_block", "llada21_moe", 6, dict(gen_length=40)),
    (
        "edit_eos_early_stop",
        "llada21_moe",
        5,
        dict(gen_length=32, block_length=8, threshold=0.7, editing_threshold=0.5, eos="eos", eos_early_stop=True),
    ),
    (
        "edit_eos",
        "llada21_moe",
        5,
        dict(gen_length=32, block_length=8, threshold=0.7, editing_threshold=0.5, eos="eos"),
    ),
]
SEEDS = {"llada2_moe": 1234, "llada21_moe": 4321}


def prompt_ids(length: int, seed: int = 7) -> torch.Tensor:
    """(1, length) prompt tokens in [1, MASK_ID - 2]: never [MASK] (the last id) nor the pad id 0."""
    generator = torch.Generator().manual_seed(seed + length)
    return torch.randint(1, MASK_ID - 1, (1, length), generator=generator)
