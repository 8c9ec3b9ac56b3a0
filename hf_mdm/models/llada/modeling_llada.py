"""PyTorch LLaDA (GSAI-ML/LLaDA-8B-Base, -Instruct): a native, weight-compatible implementation for transformers 5.

LLaDA is a Llama-shaped masked diffusion model (RMSNorm, SwiGLU, RoPE) without a causal mask, published with
OLMo's parameter names and remote code written for transformers 4.38. This module loads those checkpoints as they
are, without remote code. Parameter names, exactly as in the published safetensors:

    model.transformer.wte.weight                                  (embedding_size, d_model)
    model.transformer.blocks.{i}.attn_norm.weight                 RMSNorm before attention
    model.transformer.blocks.{i}.{q,k,v}_proj.weight              attention projections
    model.transformer.blocks.{i}.attn_out.weight                  attention output projection
    model.transformer.blocks.{i}.ff_norm.weight                   RMSNorm before the MLP
    model.transformer.blocks.{i}.ff_proj.weight                   SwiGLU gate: act(ff_proj(x)) * up_proj(x)
    model.transformer.blocks.{i}.up_proj.weight                   SwiGLU up projection
    model.transformer.blocks.{i}.ff_out.weight                    SwiGLU down projection
    model.transformer.ln_f.weight                                 final RMSNorm
    model.transformer.ff_out.weight                               output layer (absent with ``weight_tying``)

The first half of the file holds the small building blocks that Dream (``hf_mdm.models.dream``) shares: RMSNorm,
rotary embeddings, the padding mask, bidirectional SDPA attention, ``logits_to_keep`` and the masked-token loss.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Cache, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast

from ...generation import MaskedDiffusionGenerationMixin
from ...kv_cache import (
    MaskedLMOutputWithPast,
    cached_keys_values,
    model_output_with_cache,
    new_cache,
    output_cache,
    span_position_ids,
)

from .configuration_llada import LLaDAConfig

# ----------------------------------------------------------------------------------------------------------------
# Building blocks shared with Dream
# ----------------------------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x**2) + eps)``, normalised in float32 and cast back before the weight (Llama, OLMo)."""

    def __init__(self, hidden_size: int, eps: float):
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


def default_position_ids(input_shape: tuple[int, int], device: torch.device) -> torch.LongTensor:
    """Absolute positions 0..L-1 for every row: (B, L)."""
    batch, length = input_shape
    return torch.arange(length, device=device).expand(batch, length)


def rotary_cos_sin(position_ids: torch.LongTensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE angles in float32 for positions (B, L): ``cos`` and ``sin``, each (B, L, head_dim).

    Frequencies ``theta ** (-2i / head_dim)``, with the two halves of the head repeated (the "rotate half"
    convention of Llama, OLMo and Qwen2). Computed from the positions on every call: no buffer to initialise.
    """
    exponent = torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponent)
    angles = position_ids.float()[..., None] * inv_freq
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


def padding_attention_mask(
    attention_mask: Optional[torch.Tensor], input_shape: tuple[int, int]
) -> Optional[torch.Tensor]:
    """Turn a 2-D padding mask into the mask SDPA takes, or None when nothing is padded.

    Args:
        attention_mask: (B, L) with 1 for real tokens and 0 for padding. A 4-D mask (B, 1, L, L) (boolean, True =
            may attend, or additive float) is passed through unchanged.
        input_shape: (B, L) of the input ids.

    Returns:
        Boolean (B, 1, 1, L): query i may attend to key j iff j is a real token. Padding is never attended to;
        padding queries still attend to the real tokens, and a row without any real token attends to all of its
        positions, so that no row of the softmax is empty (no NaN).
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() == 4:
        return attention_mask
    if tuple(attention_mask.shape) != tuple(input_shape):
        raise ValueError(
            f"attention_mask must be 2-D (batch, length) = {tuple(input_shape)} with 1 for tokens and 0 for "
            f"padding, got shape {tuple(attention_mask.shape)}"
        )
    keep = attention_mask.bool()
    if bool(keep.all()):
        return None
    keep = keep | ~keep.any(dim=-1, keepdim=True)
    return keep[:, None, None, :]


def bidirectional_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
) -> torch.Tensor:
    """Scaled dot-product attention without a causal mask.

    Args:
        query: (B, heads, L, head_dim).
        key, value: (B, kv_heads, L, head_dim); kv_heads divides heads (grouped-query attention: query head h reads
            key/value head ``h // (heads // kv_heads)``).
        attention_mask: from `padding_attention_mask`, or None.
        dropout: attention dropout probability.

    Returns:
        (B, L, heads * head_dim).
    """
    batch, heads, length, head_dim = query.shape
    output = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        is_causal=False,
        enable_gqa=key.shape[1] != heads,
    )
    return output.transpose(1, 2).reshape(batch, length, heads * head_dim)


def canvas_inputs(
    attention_mask: Optional[torch.Tensor], position_ids: Optional[torch.LongTensor], input_shape: tuple[int, int],
    device: torch.device, cache: Optional[Cache], cache_position: Optional[torch.LongTensor],
) -> tuple[Optional[torch.Tensor], torch.LongTensor]:  # fmt: skip
    """The SDPA mask and the (B, l) RoPE positions of a forward. ``attention_mask`` and ``position_ids`` describe
    the whole canvas: the input itself, or with ``cache_position`` the cached canvas whose columns the input is
    (see `hf_mdm.kv_cache`); a 4-D mask then keeps the rows of the input's columns."""
    batch, length = input_shape
    canvas = (batch, cache.get_seq_length()) if cache_position is not None else input_shape
    mask = padding_attention_mask(attention_mask, canvas)
    if mask is not None and cache_position is not None and mask.shape[-2] > 1:
        mask = mask[:, :, cache_position]
    if position_ids is None:
        position_ids = default_position_ids(canvas, device)
    return mask, span_position_ids(cache, cache_position, attention_mask, position_ids)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, heads * head_dim) -> (B, heads, L, head_dim)."""
    batch, length, _ = x.shape
    return x.view(batch, length, heads, -1).transpose(1, 2)


def keep_positions(hidden_states: torch.Tensor, logits_to_keep: Union[int, torch.Tensor]) -> torch.Tensor:
    """Positions where the LM head runs, as in transformers: 0 = all, an int k = the last k, a 1-D index tensor =
    those positions, and (hf_mdm's extension) a (B, K) tensor = K positions per row. (B, L, H) -> (B, K, H)."""
    if isinstance(logits_to_keep, int):
        return hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states
    if logits_to_keep.dim() == 2:
        return hidden_states.gather(1, logits_to_keep[..., None].expand(-1, -1, hidden_states.shape[-1]))
    return hidden_states[:, logits_to_keep]


def masked_token_loss(logits: torch.Tensor, labels: torch.LongTensor, logits_shift: int) -> torch.Tensor:
    """Mean cross-entropy over the labelled positions (labels != -100) of logits (B, L, V).

    With ``logits_shift=1`` (Dream) the token at position j is scored with the logits computed at j - 1, the shift
    the samplers apply; position 0 reuses its own logits.
    """
    if logits_shift:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)


# ----------------------------------------------------------------------------------------------------------------
# LLaDA
# ----------------------------------------------------------------------------------------------------------------


def check_supported(config: LLaDAConfig) -> None:
    """Refuse OLMo variants that no LLaDA checkpoint uses, with a message that names the key."""
    norm_bias = config.include_bias if config.bias_for_layer_norm is None else config.bias_for_layer_norm
    unsupported = {
        "block_type": config.block_type != "llama",
        "layer_norm_type": config.layer_norm_type != "rms",
        "layer_norm_with_affine": not config.layer_norm_with_affine,
        "bias_for_layer_norm": bool(norm_bias),
        "activation_type": config.activation_type not in ("silu", "gelu", "relu"),
        "rope": not config.rope,
        "alibi": config.alibi,
        "attention_layer_norm": config.attention_layer_norm,
        "block_group_size": config.block_group_size != 1,
    }
    bad = [f"{key}={getattr(config, key)!r}" for key, is_bad in unsupported.items() if is_bad]
    if bad:
        raise ValueError(
            "LLaDAModelLM implements LLaDA's architecture (block_type='llama', layer_norm_type='rms' with weight and "
            "no bias, activation_type='silu', rope=True, alibi=False, attention_layer_norm=False, "
            f"block_group_size=1); this config has {', '.join(bad)}"
        )


class LLaDALlamaBlock(GradientCheckpointingLayer):
    """OLMo's "llama" block: ``x + attn_out(attn(attn_norm(x)))``, then ``+ ff_out(act(ff_proj(h)) * up_proj(h))``
    with ``h = ff_norm(x)``. Attention is bidirectional."""

    def __init__(self, config: LLaDAConfig, layer_idx: int = 0):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        d_model, head_dim = config.d_model, config.head_dim
        kv_dim = config.effective_n_kv_heads * head_dim
        qkv_bias = bool(config.include_bias or config.include_qkv_bias)
        hidden = config.effective_mlp_hidden_size
        self.attn_norm = RMSNorm(d_model, config.rms_norm_eps)
        self.q_proj = nn.Linear(d_model, d_model, bias=qkv_bias)
        self.k_proj = nn.Linear(d_model, kv_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=qkv_bias)
        self.attn_out = nn.Linear(d_model, d_model, bias=config.include_bias)
        self.ff_norm = RMSNorm(d_model, config.rms_norm_eps)
        self.ff_proj = nn.Linear(d_model, hidden, bias=config.include_bias)
        self.up_proj = nn.Linear(d_model, hidden, bias=config.include_bias)
        self.ff_out = nn.Linear(hidden, d_model, bias=config.include_bias)
        self.act = ACT2FN[config.activation_type]
        self.dropout = nn.Dropout(config.residual_dropout)

    def attention(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention_mask: Optional[torch.Tensor],
        cache: Optional[Cache] = None, columns: Optional[torch.LongTensor] = None,
    ) -> torch.Tensor:  # fmt: skip
        """(B, L, d_model) normalised input -> (B, L, d_model) attention output (before the residual); keys/values
        through `hf_mdm.kv_cache.cached_keys_values` (the input at canvas ``columns``, None: the whole canvas)."""
        config = self.config
        query = split_heads(self.q_proj(x), config.n_heads)
        key = split_heads(self.k_proj(x), config.effective_n_kv_heads)
        value = split_heads(self.v_proj(x), config.effective_n_kv_heads)
        rope_dtype = torch.float32 if config.rope_full_precision else x.dtype
        query, key = apply_rotary(query, cos, sin, rope_dtype), apply_rotary(key, cos, sin, rope_dtype)
        key, value = cached_keys_values(cache, self.layer_idx, key, value, columns)
        dropout = config.attention_dropout if self.training else 0.0
        return self.attn_out(bidirectional_attention(query, key, value, attention_mask, dropout))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention_mask: Optional[torch.Tensor],
        cache: Optional[Cache] = None, columns: Optional[torch.LongTensor] = None,
    ) -> torch.Tensor:  # fmt: skip
        """x (B, L, d_model); cos, sin (B, L, head_dim) float32; attention_mask from `padding_attention_mask`."""
        x = x + self.dropout(self.attention(self.attn_norm(x), cos, sin, attention_mask, cache, columns))
        h = self.ff_norm(x)
        return x + self.dropout(self.ff_out(self.act(self.ff_proj(h)) * self.up_proj(h)))


class LLaDAPreTrainedModel(PreTrainedModel):
    config_class = LLaDAConfig
    config: LLaDAConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LLaDALlamaBlock"]
    _supports_sdpa = True


class LLaDAModel(LLaDAPreTrainedModel):
    """The LLaDA transformer under ``model.transformer``: embedding, blocks, final norm and output layer.

    ``forward`` returns the final hidden states; `compute_logits` applies the output layer.
    """

    def __init__(self, config: LLaDAConfig):
        super().__init__(config)
        check_supported(config)
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.effective_embedding_size, config.d_model),
                "blocks": nn.ModuleList(LLaDALlamaBlock(config, i) for i in range(config.n_layers)),
                "ln_f": RMSNorm(config.d_model, config.rms_norm_eps),
            }
        )
        if not config.weight_tying:
            self.transformer["ff_out"] = nn.Linear(
                config.d_model, config.effective_embedding_size, bias=config.include_bias
            )
        self.embedding_dropout = nn.Dropout(config.embedding_dropout)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.transformer["wte"]

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.transformer["wte"] = value

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        inputs_embeds: Optional[torch.FloatTensor] = None,
        output_hidden_states: bool = False,
        cache: Optional[Cache] = None,
        past_key_values: Optional[Cache] = None,
        use_cache: Optional[bool] = None,
        cache_position: Optional[torch.LongTensor] = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """
        Args:
            input_ids: (B, L) token ids, [MASK] included.
            attention_mask: (B, L), 1 for tokens and 0 for padding; padding is never attended to.
            position_ids: (B, L) RoPE positions; default 0..L-1 in every row, padding included, as the published
                model does (RoPE is shift-invariant, so left padding does not change a row's result).
            inputs_embeds: (B, L, d_model) instead of ``input_ids``.
            output_hidden_states: also return the input of every block and the final normalised state.
            cache, use_cache, cache_position: keys/values kept across denoising steps (``past_key_values``: the
                older name of ``cache``; see
                `hf_mdm.kv_cache`): with ``cache_position`` (l,) the input is those canvas columns, while
                ``attention_mask`` and ``position_ids`` still describe the whole canvas.

        Returns:
            `BaseModelOutputWithPast` with ``last_hidden_state`` (B, L, d_model) after ``ln_f`` and the cache.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.transformer["wte"](input_ids) if inputs_embeds is None else inputs_embeds
        if self.config.input_emb_norm:
            x = x * (self.config.d_model**0.5)
        x = self.embedding_dropout(x)
        cache = new_cache(cache, use_cache, cache_position, past_key_values)
        mask, position_ids = canvas_inputs(attention_mask, position_ids, tuple(x.shape[:2]), x.device, cache,
                                           cache_position)  # fmt: skip
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta)
        hidden_states = [] if output_hidden_states else None
        for block in self.transformer["blocks"]:
            if hidden_states is not None:
                hidden_states.append(x)
            x = block(x, cos, sin, mask, cache, cache_position)
        x = self.transformer["ln_f"](x)
        if hidden_states is not None:
            hidden_states.append(x)
        hidden = tuple(hidden_states) if hidden_states else None
        return model_output_with_cache(BaseModelOutputWithPast, cache, last_hidden_state=x, hidden_states=hidden)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Final hidden states (B, K, d_model) -> logits (B, K, embedding_size) in the model dtype."""
        if self.config.weight_tying:
            logits = F.linear(hidden_states, self.transformer["wte"].weight)
        else:
            logits = self.transformer["ff_out"](hidden_states)
        if self.config.scale_logits:
            logits = logits * (1 / math.sqrt(self.config.d_model))
        return logits


class LLaDAModelLM(LLaDAPreTrainedModel, MaskedDiffusionGenerationMixin):
    """LLaDA masked diffusion model with its output layer: bidirectional transformer -> per-position logits.

    The class name is the one in the published ``config.json`` (``architectures`` and ``auto_map``), so checkpoints
    load with ``AutoModel`` / ``AutoModelForMaskedLM`` once ``hf_mdm.models`` is imported, without remote code.

    Example:

    ```python
    >>> import torch
    >>> from hf_mdm.models import LLaDAConfig, LLaDAModelLM
    >>> config = LLaDAConfig(d_model=32, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=64,
    ...                      vocab_size=128, embedding_size=128, mask_token_id=127, eos_token_id=1, pad_token_id=1)
    >>> model = LLaDAModelLM(config)
    >>> model(torch.tensor([[5, 127, 127, 9]])).logits.shape
    torch.Size([1, 4, 128])
    ```
    """

    supports_per_row_logits_to_keep = True  # logits_to_keep may be (B, K) positions per row
    supports_diffusion_cache = True  # cache / cache_position as in hf_mdm.kv_cache

    def __init__(self, config: LLaDAConfig):
        super().__init__(config)
        self.model = LLaDAModel(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> Optional[nn.Linear]:
        return None if self.config.weight_tying else self.model.transformer["ff_out"]

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.model.transformer["ff_out"] = value

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        logits_to_keep: Union[int, torch.Tensor] = 0,
        labels: Optional[torch.LongTensor] = None,
        inputs_embeds: Optional[torch.FloatTensor] = None,
        output_hidden_states: bool = False,
        cache: Optional[Cache] = None,
        past_key_values: Optional[Cache] = None,
        use_cache: Optional[bool] = None,
        cache_position: Optional[torch.LongTensor] = None,
        **kwargs: Any,
    ) -> MaskedLMOutputWithPast:
        r"""
        Args:
            input_ids: (B, L) partly masked token ids.
            attention_mask: (B, L), 1 = token, 0 = padding (never attended to). Left or right padding.
            position_ids: (B, L); default 0..L-1, see `LLaDAModel.forward`.
            cache, use_cache, cache_position: keys/values kept across denoising steps (``past_key_values``: the
                older name of ``cache``), see
                `LLaDAModel.forward`; ``logits_to_keep`` then counts in the input span.
            logits_to_keep: 0 = logits at every position; an int k = the last k positions; a 1-D LongTensor of
                positions = those positions; a (B, K) tensor = K positions per row. The output layer runs only there.
            labels: (B, L) target ids at the positions to score and -100 elsewhere; the loss is their mean
                cross-entropy (logits at every position are computed, ``logits_to_keep`` is ignored).
            inputs_embeds: (B, L, d_model) instead of ``input_ids``.
            kwargs: ignored (other generation keywords).

        Returns:
            `MaskedLMOutputWithPast` with ``logits`` (B, K, embedding_size), K = L or the kept positions (the logits
            at position i predict the token at position i), and the cache (`hf_mdm.kv_cache.output_cache`) when one
            was used.
        """
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            cache=cache,
            past_key_values=past_key_values,
            use_cache=use_cache,
            cache_position=cache_position,
        )
        hidden_states = outputs.last_hidden_state
        loss = None
        if labels is not None:
            logits = self.model.compute_logits(hidden_states)
            loss = masked_token_loss(logits, labels, self.config.logits_shift)
        else:
            logits = self.model.compute_logits(keep_positions(hidden_states, logits_to_keep))
        return model_output_with_cache(
            MaskedLMOutputWithPast, output_cache(outputs), loss=loss, logits=logits, hidden_states=outputs.hidden_states
        )


__all__ = ["LLaDAModel", "LLaDAModelLM", "LLaDAPreTrainedModel"]
