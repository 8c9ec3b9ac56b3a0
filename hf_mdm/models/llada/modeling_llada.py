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

The building blocks (RMSNorm, rotary embeddings, attention through transformers' attention interface, masks from
its masking utilities) are `hf_mdm.modeling_blocks`', shared with Dream and hf_mdm's own model.
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
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from ...families import DiffusionFacts, register_family
from ...generation import MaskedDiffusionGenerationMixin
from ...kv_cache import (
    MaskedLMOutputWithPast,
    cached_keys_values,
    masked_lm_output,
    model_output_with_cache,
    new_cache,
)
from ...modeling_blocks import (
    RMSNorm,
    apply_rotary,
    attention_inputs,
    eager_attention_forward,
    keep_positions,
    masked_token_loss,
    rotary_cos_sin,
    split_heads,
)
from .configuration_llada import LLaDAConfig

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


class LLaDAAttention(nn.Module):
    """The attention core of a LLaDA block (OLMo keeps the projections on the block, so the checkpoints' parameter
    names stay ``blocks.N.q_proj``): rotated queries (B, heads, L, d) and cached keys/values through transformers'
    attention interface. Returns the heads' output (B, L, d_model) and the attention weights (eager)."""

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        self.config = config
        self.num_key_value_groups = config.n_heads // config.effective_n_kv_heads
        self.scaling = config.head_dim**-0.5
        self.is_causal = False

    def forward(self, query, key, value, attention_mask) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        dropout = self.config.attention_dropout if self.training else 0.0
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = interface(
            self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling, is_causal=False
        )
        out = out.reshape(*out.shape[:2], -1)
        return out, weights


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
        self.self_attn = LLaDAAttention(config)

    def attention(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: Any,
        cache: Optional[Cache] = None,
        columns: Optional[torch.LongTensor] = None,
    ) -> torch.Tensor:
        """(B, L, d_model) normalised input -> (B, L, d_model) attention output (before the residual); keys/values
        through `hf_mdm.kv_cache.cached_keys_values` (the input at canvas ``columns``, None: the whole canvas)."""
        config, head_dim = self.config, self.config.head_dim
        query = split_heads(self.q_proj(x), head_dim)
        key = split_heads(self.k_proj(x), head_dim)
        value = split_heads(self.v_proj(x), head_dim)
        rope_dtype = torch.float32 if config.rope_full_precision else x.dtype
        query, key = apply_rotary(query, cos, sin, rope_dtype), apply_rotary(key, cos, sin, rope_dtype)
        key, value = cached_keys_values(cache, self.layer_idx, key, value, columns)
        out, _ = self.self_attn(query, key, value, attention_mask)
        return self.attn_out(out)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: Any,
        cache: Optional[Cache] = None,
        columns: Optional[torch.LongTensor] = None,
    ) -> torch.Tensor:
        """x (B, L, d_model); cos, sin (B, L, head_dim) float32; attention_mask from
        `hf_mdm.modeling_blocks.diffusion_attention_mask`."""
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
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    _can_record_outputs = {"hidden_states": LLaDALlamaBlock, "attentions": LLaDAAttention}


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

    @capture_outputs
    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        inputs_embeds: Optional[torch.FloatTensor] = None,
        cache: Optional[Cache] = None,
        past_key_values: Optional[Cache] = None,
        use_cache: Optional[bool] = None,
        cache_position: Optional[torch.LongTensor] = None,
        block_size: Optional[int] = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """
        Args:
            input_ids: (B, L) token ids, [MASK] included.
            attention_mask: (B, L), 1 for tokens and 0 for padding; padding is never attended to. A 4-D mask in the
                form of the attention implementation is used as given.
            position_ids: (B, L) RoPE positions; default 0..L-1 in every row, padding included, as the published
                model does (RoPE is shift-invariant, so left padding does not change a row's result).
            inputs_embeds: (B, L, d_model) instead of ``input_ids``.
            cache, use_cache, cache_position: keys/values kept across denoising steps (``past_key_values``: the
                older name of ``cache``; see `hf_mdm.kv_cache`): with ``cache_position`` (l,) the input is those
                canvas columns, while ``attention_mask`` and ``position_ids`` still describe the whole canvas.
            block_size: block-causal attention over blocks of this many positions for this call (overrides
                ``config.block_size``; None: the config's, where None is bidirectional attention).
            output_hidden_states, output_attentions, return_dict: as in transformers' models (keyword or config);
                the hidden states are the input of every block and the final normalised state.

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
        mask, position_ids = attention_inputs(
            self.config, x, attention_mask, position_ids, cache, cache_position, block_size
        )
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta)
        for block in self.transformer["blocks"]:
            x = block(x, cos, sin, mask, cache, cache_position)
        x = self.transformer["ln_f"](x)
        return model_output_with_cache(BaseModelOutputWithPast, cache, last_hidden_state=x)

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

    diffusion_facts = DiffusionFacts(reference="llada")

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

    def resize_token_embeddings(self, *args: Any, **kwargs: Any) -> nn.Embedding:
        """As transformers' (new rows at the end, mean-initialised), also setting ``config.embedding_size``, which
        sizes LLaDA's embedding and output layer, so that the saved checkpoint loads."""
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        self.config.embedding_size = embeddings.num_embeddings
        return embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        logits_to_keep: Union[int, torch.Tensor] = 0,
        labels: Optional[torch.LongTensor] = None,
        inputs_embeds: Optional[torch.FloatTensor] = None,
        cache: Optional[Cache] = None,
        past_key_values: Optional[Cache] = None,
        use_cache: Optional[bool] = None,
        cache_position: Optional[torch.LongTensor] = None,
        block_size: Optional[int] = None,
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
            block_size: block-causal attention over blocks of this many positions for this call (overrides
                ``config.block_size``; None: the config's, where None is bidirectional attention).
            logits_to_keep: 0 = logits at every position; an int k = the last k positions; a 1-D LongTensor of
                positions = those positions; a (B, K) tensor = K positions per row. The output layer runs only there.
            labels: (B, L) target ids at the positions to score and -100 elsewhere; the loss is their mean
                cross-entropy (logits at every position are computed, ``logits_to_keep`` is ignored).
            inputs_embeds: (B, L, d_model) instead of ``input_ids``.
            output_hidden_states, output_attentions, return_dict: as in transformers' models.

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
            cache=cache,
            past_key_values=past_key_values,
            use_cache=use_cache,
            cache_position=cache_position,
            block_size=block_size,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        loss = None
        if labels is not None:
            logits = self.model.compute_logits(hidden_states)
            loss = masked_token_loss(logits, labels, self.config.logits_shift)
        else:
            logits = self.model.compute_logits(keep_positions(hidden_states, logits_to_keep))
        return masked_lm_output(outputs, logits, loss)


__all__ = ["LLaDAModel", "LLaDAModelLM", "LLaDAPreTrainedModel"]


register_family(LLaDAConfig.model_type, LLaDAModelLM.diffusion_facts)
