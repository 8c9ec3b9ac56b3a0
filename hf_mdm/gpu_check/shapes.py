"""The models of the GPU check: the shapes of the released checkpoints, with random weights, and tiny stand-ins.

Timing a fixed-step sampler does not depend on the weights' values: every step runs the same forwards whatever the
tokens. It does where the sampler adapts to the logits (threshold decoding reveals as many positions a step as are
confident, and stops at EOS): random weights make few tokens confident, so those rows time a worst case of the
sampler, not the checkpoint's speed. Shapes (``config.json`` of each release):

- LLaDA-8B: `LLaDAConfig`'s defaults (hidden 4096, 32 layers, vocabulary 126,464);
- Dream-7B: `DreamConfig`'s defaults (Qwen2.5-7B's shape: hidden 3584, 28 layers, vocabulary 152,064);
- LLaDA2.0-mini: hidden 2048, 20 layers, 256 experts of width 512 (8 a token, one shared), vocabulary 157,184
  (16B parameters, about 1.4B active);
- Qwen2.5-7B and Llama-3-8B (autoregressive baselines, transformers' own classes).

``tiny=True`` gives the same classes at a few thousand parameters, for the CPU run of ``make test``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from ..models import DreamConfig, DreamModel, LLaDA2MoeConfig, LLaDA2MoeModelLM, LLaDAConfig, LLaDAModelLM

__all__ = ["Shape", "shapes"]

LLADA2_MINI = dict(
    hidden_size=2048, num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=4, head_dim=128,
    intermediate_size=5120, moe_intermediate_size=512, num_experts=256, num_experts_per_tok=8, num_shared_experts=1,
    n_group=8, topk_group=4, first_k_dense_replace=1, vocab_size=157184, partial_rotary_factor=0.5,
    rope_theta=600000.0, max_position_embeddings=32768,
)  # fmt: skip
QWEN25_7B = dict(
    hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
    vocab_size=152064, rope_theta=1000000.0, max_position_embeddings=32768, tie_word_embeddings=False,
)  # fmt: skip
LLAMA3_8B = dict(
    hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
    vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192, tie_word_embeddings=False,
)  # fmt: skip
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
TINY_IDS = dict(vocab_size=512, mask_token_id=500, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@dataclass(frozen=True)
class Shape:
    """A model of the check: its name, ``kind`` ("diffusion" or "ar"), and ``build(dtype, device)`` (random weights)."""

    name: str
    kind: str
    build: Callable[[torch.dtype, Any], torch.nn.Module]
    block_causal: bool = False
    token_ids: tuple[tuple[str, int], ...] = ()  # ids generate needs besides the family's (the tiny vocabularies')


def _builder(cls: type, config: Callable[[], Any]) -> Callable[[torch.dtype, Any], torch.nn.Module]:
    """Built on the device in the dtype (a 16B model never exists in float32 nor on the host), seeded with 0."""

    def build(dtype: torch.dtype, device: Any) -> torch.nn.Module:
        torch.manual_seed(0)
        with torch.device(device):
            return cls._from_config(config(), dtype=dtype).eval()  # transformers builds it in that dtype

    return build


def shapes(tiny: bool = False, names: Optional[list[str]] = None) -> list[Shape]:
    """The check's models, in order; ``names`` keeps those."""
    llada = dict(
        d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=128, vocab_size=512, embedding_size=512
    )
    moe = dict(TINY, head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, n_group=2)
    moe.update(topk_group=1, num_shared_experts=1, first_k_dense_replace=1, **TINY_IDS)
    all_shapes = [
        Shape("LLaDA-8B", "diffusion", _builder(LLaDAModelLM, lambda: LLaDAConfig(**(llada if tiny else {})))),
        Shape("Dream-7B", "diffusion", _builder(DreamModel, lambda: DreamConfig(**(dict(TINY, **TINY_IDS) if tiny else {})))),
        Shape(
            "LLaDA2.0-mini",
            "diffusion",
            _builder(LLaDA2MoeModelLM, lambda: LLaDA2MoeConfig(**(moe if tiny else dict(LLADA2_MINI, mask_token_id=156895)))),
            block_causal=True,
        ),
        Shape("Qwen2.5-7B", "ar", _builder(Qwen2ForCausalLM, lambda: Qwen2Config(**(dict(TINY, vocab_size=512) if tiny else QWEN25_7B)))),
        Shape("Llama-3-8B", "ar", _builder(LlamaForCausalLM, lambda: LlamaConfig(**(dict(TINY, vocab_size=512) if tiny else LLAMA3_8B)))),
    ]  # fmt: skip
    if tiny:
        ids = (("mask_token_id", TINY_IDS["mask_token_id"]), ("eos_token_id", TINY_IDS["eos_token_id"]))
        all_shapes = [dataclasses.replace(s, token_ids=ids) for s in all_shapes]
    return [s for s in all_shapes if names is None or s.name in names]
