"""Keys and values kept across denoising steps: the approximate block caches of masked diffusion (Fast-dLLM).

An MDM attends bidirectionally, so nothing it computed stays exact once a token changes; Fast-dLLM (arXiv
2505.22618) keeps the keys/values anyway, refreshed at the start of every semi-autoregressive block, because the
ones of the tokens far from the block change little. The models of this package support it through two forward
arguments, in transformers' vocabulary (a `transformers.DynamicCache` holds the keys/values, one layer each):

- ``cache=None, use_cache=True``: a full forward; every layer's keys/values (after RoPE) are stored in a new
  cache, returned in the output (`output_cache`);
- ``cache=cache, cache_position=columns``: the input ids are the canvas columns ``columns`` (1-D, the
  same in every row); their fresh keys/values replace the cache's entries there, and attention reads the whole
  cache (the canvas' other columns as cached). ``attention_mask`` and ``position_ids`` describe the whole canvas
  (B, L) as in a full forward, so RoPE positions stay absolute and padding stays unattended.

The cache keyword and output field are called ``cache`` since transformers 5.24 and ``past_key_values`` before it.
The models take both keywords (``past_key_values`` as the older name of ``cache``); their outputs carry the cache
under the installed transformers' name (`CACHE_FIELD`), and `output_cache` reads it under either.

A cache holds the whole canvas: its length is its keys' (`cached_length`, a Python int, so that a forward traced by
``torch.compile`` has no branch on a tensor). It may be a `transformers.DynamicCache` or a cache of
`transformers.cache_utils.StaticLayer` buffers allocated at the canvas' length (`hf_mdm.generation_static.static_copy`:
what CUDA graphs need, a span forward then writing into buffers of fixed addresses); `StaticLayer.get_seq_length`,
a tensor, is never read.

Running the block and everything after it is the *prefix* cache; the block alone, the *dual* cache. The sampler's
use of it is in `hf_mdm.generation_denoiser`. This module imports only torch and transformers (it is exported with
``modeling_mdm.py`` as remote code).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from transformers import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, MaskedLMOutput

__all__ = [
    "CACHE_FIELD",
    "MaskedLMOutputWithPast",
    "cached_keys_values",
    "cached_length",
    "masked_lm_output",
    "model_output_with_cache",
    "new_cache",
    "output_cache",
    "span_position_ids",
]

# The name of the cache field of transformers' model outputs: "cache" from transformers 5.24 on, else the older one.
CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"

if CACHE_FIELD == "cache":

    @dataclass
    class MaskedLMOutputWithPast(MaskedLMOutput):
        """`transformers.modeling_outputs.MaskedLMOutput` with the keys/values cache (``cache``) of the call."""

        cache: Optional[Cache] = None

else:

    @dataclass
    class MaskedLMOutputWithPast(MaskedLMOutput):
        """`transformers.modeling_outputs.MaskedLMOutput` with the keys/values cache (``past_key_values``) of the
        call."""

        past_key_values: Optional[Cache] = None


def model_output_with_cache(output_class: type, cache: Optional[Cache], **fields: Any):
    """``output_class(**fields)`` with ``cache`` under the installed transformers' field name (`CACHE_FIELD`)."""
    return output_class(**fields, **{CACHE_FIELD: cache})


def masked_lm_output(outputs: Any, logits: torch.Tensor, loss: Optional[torch.Tensor] = None) -> MaskedLMOutputWithPast:
    """The head's output: ``logits`` and ``loss`` with the cache, hidden states and attentions of the base model's
    ``outputs``."""
    return model_output_with_cache(
        MaskedLMOutputWithPast,
        output_cache(outputs),
        loss=loss,
        logits=logits,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
    )


def output_cache(output: Any) -> Optional[Cache]:
    """The keys/values cache a model output carries, under either name (``cache``, or ``past_key_values`` before
    transformers 5.24 and in outputs of other packages); None when it has none."""
    for name in ("cache", "past_key_values"):
        if name in getattr(output, "__dataclass_fields__", ()):
            return getattr(output, name)
    return None


def cached_length(cache: Cache) -> int:
    """The canvas columns ``cache`` holds, a Python int read from its first layer's keys (B, kv_heads, L, head_dim)
    (the whole buffer of a `StaticLayer`, allocated at the canvas' length); 0 before a forward filled it."""
    layer = cache.layers[0] if cache.layers else None
    if layer is None or not layer.is_initialized or layer.keys is None or layer.keys.dim() < 3:
        return 0
    return layer.keys.shape[-2]


def new_cache(
    cache: Optional[Cache],
    use_cache: Optional[bool],
    cache_position: Optional[torch.Tensor],
    past_key_values: Optional[Cache] = None,
) -> Optional[Cache]:
    """The cache a forward reads and writes: the given one (``cache``, or its older name ``past_key_values``), a new
    `DynamicCache` with ``use_cache``, else None."""
    if past_key_values is not None:
        if cache is not None:
            raise ValueError("pass the keys/values cache once: as cache (past_key_values is its older name)")
        cache = past_key_values
    if cache is None:
        if cache_position is not None:
            raise ValueError("cache_position needs a cache (cache=...) holding the canvas' keys/values")
        return DynamicCache() if use_cache else None
    if not isinstance(cache, Cache):
        raise ValueError(f"cache must be a transformers Cache (e.g. DynamicCache), got {type(cache).__name__}")
    filled = cached_length(cache) > 0
    if cache_position is None and filled:
        raise ValueError(
            "the cache already holds keys/values: pass cache_position (the canvas columns of input_ids) to run a span "
            "against it, or use_cache=True without a cache for a new full forward"
        )
    if cache_position is not None and not filled:
        raise ValueError("cache_position needs a cache holding the canvas' keys/values (a full forward first)")
    return cache


def span_position_ids(
    cache: Optional[Cache],
    cache_position: Optional[torch.Tensor],
    attention_mask: Optional[torch.Tensor],
    position_ids: torch.Tensor,
) -> torch.Tensor:
    """The (B, l) RoPE positions of the input: ``position_ids`` (B, L) of the whole canvas at the columns
    ``cache_position`` for a span forward (checked against the cache), else ``position_ids`` unchanged."""
    if cache_position is None:
        return position_ids
    if cache_position.dim() != 1:
        raise ValueError(
            f"cache_position must be 1-D (the canvas columns of the input), got {tuple(cache_position.shape)}"
        )
    length = cached_length(cache)
    if attention_mask is not None and attention_mask.shape[-1] != length:
        raise ValueError(
            f"with cache_position, attention_mask must cover the whole canvas ({length} columns, as cached), got "
            f"{attention_mask.shape[-1]}"
        )
    return position_ids[:, cache_position]


def cached_keys_values(
    cache: Optional[Cache], layer_idx: int, key: torch.Tensor, value: torch.Tensor, columns: Optional[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys/values (B, kv_heads, L, head_dim) a layer attends to: the fresh ``key``/``value`` without a cache;
    stored as the layer's entries by a full forward (``columns`` None); else written over the cached entries at
    ``columns`` and the layer's whole cached keys/values returned."""
    if cache is None:
        return key, value
    if columns is None:
        return cache.update(key, value, layer_idx)
    layer = cache.layers[layer_idx]
    layer.keys.index_copy_(2, columns, key.to(layer.keys.dtype))
    layer.values.index_copy_(2, columns, value.to(layer.values.dtype))
    return layer.keys, layer.values
