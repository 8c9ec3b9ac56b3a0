"""The tests' tiny random masked diffusion models: 2 layers of width 32, [MASK] the last id of a 31-token vocabulary
(hf_mdm's MDM, and LLaDA and Dream of the same sizes)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from hf_mdm import MDMConfig, MDMForMaskedDiffusion
from hf_mdm.models import DreamConfig, DreamModel, LLaDAConfig, LLaDAModelLM

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


def _sharpened(model: torch.nn.Module, head: torch.nn.Module, sharpen: float) -> torch.nn.Module:
    with torch.no_grad():
        head.weight.mul_(sharpen)
    return model.eval()


def tiny_llada(sharpen: float = 1.0, layers: int = 2) -> LLaDAModelLM:
    """LLaDA at the sizes of `tiny_mdm` (4 heads, 2 key/value heads, untied head, ``layers`` layers), seeded with 0."""
    torch.manual_seed(0)
    config = LLaDAConfig(d_model=32, n_heads=4, n_kv_heads=2, n_layers=layers, mlp_hidden_size=64, vocab_size=VOCAB,
                         embedding_size=VOCAB, mask_token_id=MASK, eos_token_id=1, pad_token_id=1, weight_tying=False)  # fmt: skip
    model = LLaDAModelLM(config)
    return _sharpened(model, model.model.transformer["ff_out"], sharpen)


def tiny_dream(sharpen: float = 1.0, layers: int = 2) -> DreamModel:
    """Dream at the sizes of `tiny_mdm` (4 heads, 2 key/value heads, ``layers`` layers), seeded with 0."""
    torch.manual_seed(0)
    config = DreamConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, mask_token_id=MASK, pad_token_id=1,
                         bos_token_id=1, eos_token_id=1)  # fmt: skip
    model = DreamModel(config)
    return _sharpened(model, model.lm_head, sharpen)
