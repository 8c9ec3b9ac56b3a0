"""The tests' tiny random masked diffusion model: 2 layers of width 32, [MASK] the last id of a 31-token vocabulary."""

from __future__ import annotations

from typing import Any, Optional

import torch

from hf_mdm import MDMConfig, MDMForMaskedDiffusion

MASK = 30
VOCAB = MASK + 1


def tiny_mdm(block_size: Optional[int] = None, sharpen: float = 1.0, **config: Any) -> MDMForMaskedDiffusion:
    """Seeded with 0; ``block_size``: block-causal attention; ``sharpen`` scales the LM head (a sharper random network
    has fewer near-ties in its confidences); ``config``: other `MDMConfig` fields (another vocabulary, fewer layers)."""
    torch.manual_seed(0)
    fields = dict(
        vocab_size=VOCAB,
        mask_token_id=MASK,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=96,
    )
    model = MDMForMaskedDiffusion(MDMConfig(**{**fields, **config}, block_size=block_size)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model
