"""Building blocks of hf_mdm's model classes (`MDMForMaskedDiffusion`, `LLaDAModelLM`, `DreamModel`), written once.

- `RMSNorm`; rotary embeddings (`rotary_cos_sin`, `apply_rotary`);
- `eager_attention_forward`, the plain-torch attention the models' attention classes fall back to when
  ``config._attn_implementation`` names no other entry of transformers' ``ALL_ATTENTION_FUNCTIONS`` (sdpa,
  flex_attention, kernels); each class looks its implementation up itself, as transformers' models do;
- the attention mask through transformers' masking utilities (`diffusion_attention_mask`): bidirectional with
  padding, or block-causal (``block_size`` b: bidirectional inside each block of b positions, causal across
  blocks, as BD3-LM and LLaDA2 use), also for a span of columns run against a cache (`hf_mdm.kv_cache`), with the
  RoPE positions of the input (`attention_inputs`);
- the LM head's positions (`keep_positions`), the logits shift (`shift_logits`) and the masked-token loss.

Exported with ``modeling_mdm.py`` as remote code: it imports only torch and transformers.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, create_bidirectional_mask

from .kv_cache import cached_length, span_position_ids

__all__ = [
    "RMSNorm",
    "apply_rotary",
    "block_causal_mask_function",
    "attention_inputs",
    "diffusion_attention_mask",
    "eager_attention_forward",
    "keep_positions",
    "masked_token_loss",
    "noisy_clean_mask_function",
    "rotary_cos_sin",
    "shift_logits",
    "split_heads",
]


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x**2) + eps)``, normalised in float32 and cast back before the weight (Llama, OLMo)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(..., hidden_size) -> (..., hidden_size), same dtype as the input."""
        dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        hidden_states = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * hidden_states.to(dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE angles in float32 for positions (B, L): ``cos`` and ``sin``, each (B, L, head_dim).

    Frequencies ``theta ** (-2i / head_dim)``, the two halves of the head repeated (the "rotate half" convention of
    Llama, OLMo and Qwen2). Computed from the positions on every call: no buffer to initialise.
    """
    exponent = torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim
    angles = position_ids.float()[..., None] * (1.0 / (theta**exponent))
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rotate queries or keys x (B, heads, L, head_dim) by cos, sin (B, L, head_dim), computing in ``dtype``."""
    cos, sin = cos.to(dtype)[:, None], sin.to(dtype)[:, None]
    rotated = x.to(dtype) * cos + rotate_half(x.to(dtype)) * sin
    return rotated.to(x.dtype)


def rotate_partially(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first ``cos.shape[-1]`` dims of each head of x (B, heads, L, head_dim), the rest unchanged."""
    rotary_dim = cos.shape[-1]
    rotated = apply_rotary(x[..., :rotary_dim], cos, sin, x.dtype)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def split_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, L, heads * head_dim) -> (B, heads, L, head_dim); the number of heads is read off the input, so that a
    tensor-parallel shard (a share of the heads) works unchanged."""
    batch, length, _ = x.shape
    return x.view(batch, length, -1, head_dim).transpose(1, 2)


def repeat_kv(hidden_states: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, kv_heads, L, d) -> (B, kv_heads * groups, L, d): each key/value head serves ``groups`` query heads."""
    if groups == 1:
        return hidden_states
    batch, kv_heads, length, head_dim = hidden_states.shape
    hidden_states = hidden_states[:, :, None].expand(batch, kv_heads, groups, length, head_dim)
    return hidden_states.reshape(batch, kv_heads * groups, length, head_dim)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention in plain torch: (B, L, heads, d) and the weights (B, heads, L, L_kv). ``attention_mask`` is the
    additive float mask transformers' masking utilities build for eager (a boolean one is accepted too)."""
    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            attention_mask = torch.zeros_like(attention_mask, dtype=weights.dtype).masked_fill(
                ~attention_mask, torch.finfo(weights.dtype).min
            )
        weights = weights + attention_mask
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def block_causal_mask_function(block_of: torch.Tensor, query_columns: Optional[torch.Tensor] = None) -> Callable:
    """The mask function (transformers' ``(batch, head, q_idx, kv_idx) -> bool`` form) of block-causal attention:
    in row r, query column q may attend to key column k iff ``block_of[r, k] <= block_of[r, q]``, with ``block_of``
    (B, L) the block of each canvas column's position (``position // block_size``, looked up rather than divided,
    which every backend compiles). ``query_columns`` maps the query index to its canvas column for a span of columns
    (None: the index is the column)."""

    def inner(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
        column = q_idx if query_columns is None else query_columns[q_idx]
        return block_of[batch_idx, kv_idx] <= block_of[batch_idx, column]

    return inner


def noisy_clean_mask_function(block_of: torch.Tensor, noisy: torch.Tensor) -> Callable:
    """The mask function of block diffusion's training input (BD3-LM), a noisy copy of the sequence followed by the
    clean sequence, each column with its block ``block_of`` (B, 2L) and ``noisy`` (2L,) True in the first copy: a
    noisy query attends to the noisy keys of its own block and to the clean keys of earlier blocks (what it sees at
    sampling time); a clean query attends block-causally to clean keys."""

    def inner(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
        q_block, kv_block = block_of[batch_idx, q_idx], block_of[batch_idx, kv_idx]
        q_noisy, kv_noisy = noisy[q_idx], noisy[kv_idx]
        same_noisy_block = q_noisy & kv_noisy & (kv_block == q_block)
        earlier_clean = q_noisy & ~kv_noisy & (kv_block < q_block)
        clean_causal = ~q_noisy & ~kv_noisy & (kv_block <= q_block)
        return same_noisy_block | earlier_clean | clean_causal

    return inner


def diffusion_attention_mask(
    config: Any,
    inputs_embeds: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    query_columns: Optional[torch.Tensor] = None,
    canvas_length: Optional[int] = None,
    block_size: Optional[int] = None,
    position_ids: Optional[torch.Tensor] = None,
    noisy_length: Optional[int] = None,
) -> Any:
    """The attention mask of a forward, in the form ``config._attn_implementation`` takes (None where nothing is
    masked and the implementation allows it), built by `transformers.masking_utils.create_bidirectional_mask`.

    Args:
        inputs_embeds: (B, l, hidden) of the queries (the whole canvas, or the span at ``query_columns``).
        attention_mask: (B, L) over the whole canvas, 1 = token, 0 = padding (never attended to); a 4-D mask
            (B, 1, l, L) (additive or boolean) is used as given.
        query_columns: (l,) canvas columns of the queries for a span forward against a cache (of
            ``canvas_length`` columns); None: the queries are the canvas.
        block_size: None for bidirectional attention, else block-causal attention: blocks of ``block_size``
            positions, counted from position 0 of each row (so a left-padded row has the blocks it has alone).
        position_ids: (B, L) positions of the whole canvas (default ``0..L-1``), which place the blocks.
        noisy_length: block diffusion's training input (`noisy_clean_mask_function`): the first ``noisy_length``
            columns are the noisy copy of the last ones; needs ``block_size``.
    """
    if attention_mask is not None and attention_mask.dim() == 4:
        return attention_mask
    if query_columns is not None and attention_mask is None:  # the key length is the canvas', not the span's
        if block_size is None and config._attn_implementation == "sdpa" and not torch.compiler.is_compiling():
            return None  # nothing masked: what transformers returns for sdpa, after reading back the all-ones mask
        attention_mask = torch.ones(
            inputs_embeds.shape[0], canvas_length, dtype=torch.bool, device=inputs_embeds.device
        )
    overlay = None
    if block_size is not None:
        length = attention_mask.shape[-1] if attention_mask is not None else inputs_embeds.shape[1]
        if position_ids is None:
            position_ids = torch.arange(length, device=inputs_embeds.device).expand(inputs_embeds.shape[0], length)
        if noisy_length is not None:
            noisy = torch.arange(length, device=inputs_embeds.device) < noisy_length
            overlay = noisy_clean_mask_function(position_ids // block_size, noisy)
        else:
            overlay = block_causal_mask_function(position_ids // block_size, query_columns)
    if overlay is not None and config._attn_implementation in BROADCAST_MASKS:
        return broadcast_mask(config, inputs_embeds, attention_mask, overlay)
    return create_bidirectional_mask(
        config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask, and_mask_function=overlay
    )


#: Attention implementations whose mask transformers builds by broadcasting an index-based mask function.
BROADCAST_MASKS = ("sdpa", "eager")


def broadcast_mask(
    config: Any, inputs_embeds: torch.Tensor, attention_mask: Optional[torch.Tensor], mask_function: Callable
) -> torch.Tensor:
    """The mask `create_bidirectional_mask` builds with ``and_mask_function=mask_function``, from the same mask
    interface of transformers, but by broadcasting the index tensors through ``mask_function`` (``use_vmap=False``)
    rather than with ``torch.vmap``, which transformers uses for every custom mask function and which costs about
    100 ms a forward on a CPU. hf_mdm's mask functions are index-based (tensor lookups that broadcast)."""
    batch, q_length = inputs_embeds.shape[:2]
    padding = attention_mask.to(device=inputs_embeds.device, dtype=torch.bool) if attention_mask is not None else None
    return ALL_MASK_ATTENTION_FUNCTIONS[config._attn_implementation](
        batch_size=batch,
        q_length=q_length,
        kv_length=padding.shape[-1] if padding is not None else q_length,
        mask_function=mask_function,
        attention_mask=padding,
        allow_is_causal_skip=False,
        allow_is_bidirectional_skip=False,
        dtype=inputs_embeds.dtype,
        config=config,
        use_vmap=False,
        device=inputs_embeds.device,
    )


def attention_inputs(
    config: Any,
    inputs_embeds: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    position_ids: Optional[torch.LongTensor],
    cache: Any,
    cache_position: Optional[torch.LongTensor],
    block_size: Optional[int] = None,
    noisy_length: Optional[int] = None,
) -> tuple[Any, torch.LongTensor]:
    """The attention mask (`diffusion_attention_mask`) and the (B, l) RoPE positions of a forward's input.

    ``position_ids`` (B, L) are the whole canvas' (default ``0..L-1`` in every row, as LLaDA's and Dream's published
    code), taken at the columns ``cache_position`` for a span forward. ``block_size`` (a forward's argument)
    overrides ``config.block_size``: None in both is bidirectional attention. ``noisy_length``: block diffusion's
    training input (`noisy_clean_mask_function`)."""
    batch = inputs_embeds.shape[0]
    length = cached_length(cache) if cache_position is not None else inputs_embeds.shape[1]
    if position_ids is None:
        position_ids = torch.arange(length, device=inputs_embeds.device).expand(batch, length)
    if block_size is None:
        block_size = getattr(config, "block_size", None)
    if noisy_length is not None and block_size is None:
        raise ValueError("block diffusion's training input (noisy_length) needs block_size (config.block_size)")
    mask = diffusion_attention_mask(
        config, inputs_embeds, attention_mask, cache_position, length, block_size, position_ids, noisy_length
    )
    return mask, span_position_ids(cache, cache_position, attention_mask, position_ids)


def keep_positions(hidden_states: torch.Tensor, logits_to_keep: Union[int, torch.Tensor]) -> torch.Tensor:
    """Positions where the LM head runs, as in transformers: 0 = all, an int k = the last k, a 1-D index tensor =
    those positions, and (hf_mdm's extension) a (B, K) tensor = K positions per row. (B, L, H) -> (B, K, H)."""
    if isinstance(logits_to_keep, int):
        return hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states
    if logits_to_keep.dim() == 2:
        return hidden_states.gather(1, logits_to_keep[..., None].expand(-1, -1, hidden_states.shape[-1]))
    return hidden_states[:, logits_to_keep]


def shift_logits(logits: torch.Tensor, shift: int) -> torch.Tensor:
    """The logits that predict each position (B, L, V): with ``shift = 1`` (Dream: position j is predicted from
    j - 1) the logits computed at j - 1, position 0 keeping its own; unchanged with ``shift = 0``."""
    if not shift:
        return logits
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def masked_token_loss(logits: torch.Tensor, labels: torch.LongTensor, logits_shift: int) -> torch.Tensor:
    """Mean cross-entropy over the labelled positions (labels != -100) of logits (B, L, V), after `shift_logits`."""
    logits = shift_logits(logits, logits_shift)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
