"""Keys and values kept across denoising steps: the approximate block caches of masked diffusion (Fast-dLLM).

An MDM attends bidirectionally, so nothing it computed stays exact once a token changes; Fast-dLLM (arXiv
2505.22618) keeps the keys/values anyway, refreshed at the start of every semi-autoregressive block, because the
ones of the tokens far from the block change little. The models of this package support it through two forward
arguments, in transformers' vocabulary (a `transformers.DynamicCache` holds the keys/values, one layer each):

- ``past_key_values=None, use_cache=True``: a full forward; every layer's keys/values (after RoPE) are stored in a
  new cache, returned as ``output.past_key_values``;
- ``past_key_values=cache, cache_position=columns``: the input ids are the canvas columns ``columns`` (1-D, the
  same in every row); their fresh keys/values replace the cache's entries there, and attention reads the whole
  cache (the canvas' other columns as cached). ``attention_mask`` and ``position_ids`` describe the whole canvas
  (B, L) as in a full forward, so RoPE positions stay absolute and padding stays unattended.

Running the block and everything after it is the *prefix* cache; the block alone, the *dual* cache. The sampler's
use of it is in `hf_mdm.generation_denoiser`. This module imports only torch and transformers (it is exported with
``modeling_mdm.py`` as remote code).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from transformers import Cache, DynamicCache
from transformers.modeling_outputs import MaskedLMOutput

__all__ = ["MaskedLMOutputWithPast", "cached_keys_values", "new_cache", "span_position_ids"]


@dataclass
class MaskedLMOutputWithPast(MaskedLMOutput):
    """`transformers.modeling_outputs.MaskedLMOutput` with the keys/values cache (``past_key_values``) of the call."""

    past_key_values: Optional[Cache] = None


def new_cache(
    past_key_values: Optional[Cache], use_cache: Optional[bool], cache_position: Optional[torch.Tensor]
) -> Optional[Cache]:
    """The cache a forward reads and writes: the given one, a new `DynamicCache` with ``use_cache``, else None."""
    if past_key_values is None:
        if cache_position is not None:
            raise ValueError("cache_position needs past_key_values holding the canvas' keys/values")
        return DynamicCache() if use_cache else None
    if not isinstance(past_key_values, Cache):
        raise ValueError(
            f"past_key_values must be a transformers Cache (e.g. DynamicCache), got {type(past_key_values).__name__}"
        )
    filled = past_key_values.get_seq_length() > 0
    if cache_position is None and filled:
        raise ValueError(
            "past_key_values already holds keys/values: pass cache_position (the canvas columns of input_ids) to run "
            "a span against it, or use_cache=True without past_key_values for a new full forward"
        )
    if cache_position is not None and not filled:
        raise ValueError("cache_position needs past_key_values holding the canvas' keys/values (a full forward first)")
    return past_key_values


def span_position_ids(
    cache: Optional[Cache], cache_position: Optional[torch.Tensor], attention_mask: Optional[torch.Tensor],
    position_ids: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """The (B, l) RoPE positions of the input: ``position_ids`` (B, L) of the whole canvas at the columns
    ``cache_position`` for a span forward (checked against the cache), else ``position_ids`` unchanged."""
    if cache_position is None:
        return position_ids
    if cache_position.dim() != 1:
        raise ValueError(f"cache_position must be 1-D (the canvas columns of the input), got {tuple(cache_position.shape)}")
    length = cache.get_seq_length()
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
