"""PyTorch Dream (Dream-org/Dream-v0-Base-7B, -Instruct-7B): a native, weight-compatible implementation for
transformers 5.

Dream is Qwen2.5 (grouped-query attention with q/k/v biases, SwiGLU, RMSNorm, RoPE) run without a causal mask,
published with remote code written for transformers 4.46. This module loads those checkpoints as they are, without
remote code. Parameter names, exactly as in the published safetensors:

    model.embed_tokens.weight                                     (vocab_size, hidden_size)
    model.layers.{i}.input_layernorm.weight                       RMSNorm before attention
    model.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias}         attention projections (with biases)
    model.layers.{i}.self_attn.o_proj.weight                      attention output projection (no bias)
    model.layers.{i}.post_attention_layernorm.weight              RMSNorm before the MLP
    model.layers.{i}.mlp.{gate,up,down}_proj.weight               SwiGLU: down(act(gate(x)) * up(x))
    model.norm.weight                                             final RMSNorm
    lm_head.weight                                                (vocab_size, hidden_size)

Dream predicts the token at position j from the hidden state at j - 1 (``config.logits_shift == 1``).
``DreamModel.forward`` returns the plain per-position logits ``lm_head(h_j)``; the sampler applies the shift.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
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
from .configuration_dream import DreamConfig


class DreamAttention(nn.Module):
    """Bidirectional grouped-query self-attention with q/k/v biases (Qwen2 without the causal mask)."""

    def __init__(self, config: DreamConfig, layer_idx: int = 0):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        hidden, kv_dim = config.hidden_size, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, config.num_attention_heads * self.head_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(hidden, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(hidden, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, hidden, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: Any,
        cache: Optional[Cache] = None,
        columns: Optional[torch.LongTensor] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """x (B, L, hidden); cos, sin (B, L, head_dim) -> (B, L, hidden) and the attention weights (eager). RoPE is
        applied in the model dtype; keys and values through `hf_mdm.kv_cache.cached_keys_values`."""
        query = split_heads(self.q_proj(x), self.head_dim)
        key = split_heads(self.k_proj(x), self.head_dim)
        value = split_heads(self.v_proj(x), self.head_dim)
        query, key = apply_rotary(query, cos, sin, x.dtype), apply_rotary(key, cos, sin, x.dtype)
        key, value = cached_keys_values(cache, self.layer_idx, key, value, columns)
        dropout = self.config.attention_dropout if self.training else 0.0
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = interface(
            self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling, is_causal=False
        )
        out = out.reshape(*out.shape[:2], -1)
        return self.o_proj(out), weights


class DreamMLP(nn.Module):
    """SwiGLU: ``down_proj(act(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, config: DreamConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DreamDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block: ``x + self_attn(input_layernorm(x))``, then ``+ mlp(post_attention_layernorm(x))``."""

    def __init__(self, config: DreamConfig, layer_idx: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DreamAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DreamMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: Any,
        cache: Optional[Cache] = None,
        columns: Optional[torch.LongTensor] = None,
    ) -> torch.Tensor:
        attended, _ = self.self_attn(self.input_layernorm(x), cos, sin, attention_mask, cache, columns)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x))


class DreamPreTrainedModel(PreTrainedModel):
    config_class = DreamConfig
    config: DreamConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DreamDecoderLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    _can_record_outputs = {"hidden_states": DreamDecoderLayer, "attentions": DreamAttention}


class DreamBaseModel(DreamPreTrainedModel):
    """The Dream transformer under ``model``: embedding, decoder layers without causal mask, final norm."""

    def __init__(self, config: DreamConfig):
        super().__init__(config)
        if config.rope_scaling is not None:
            raise ValueError(
                "DreamModel implements plain RoPE (rope_scaling=None, as in the published checkpoints); "
                f"got rope_scaling={config.rope_scaling}"
            )
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(DreamDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

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
            attention_mask: (B, L), 1 for tokens and 0 for padding; padding is never attended to.
            position_ids: (B, L) RoPE positions; default 0..L-1 in every row. Dream's reference sampler uses
                ``cumsum(attention_mask) - 1`` (padding set to 1) when the batch is padded: pass those to reproduce
                it (with left padding the two differ by a shift per row, which RoPE ignores up to rounding).
            inputs_embeds: (B, L, hidden_size) instead of ``input_ids``.
            cache, use_cache, cache_position: keys/values kept across denoising steps (``past_key_values``: the
                older name of ``cache``; see `hf_mdm.kv_cache`): with ``cache_position`` (l,) the input is those
                canvas columns, while ``attention_mask`` and ``position_ids`` still describe the whole canvas.
            block_size: block-causal attention over blocks of this many positions for this call (overrides
                ``config.block_size``; None: the config's, where None is bidirectional attention).
            output_hidden_states, output_attentions, return_dict: as in transformers' models (keyword or config);
                the hidden states are the input of every layer and the final normalised state.

        Returns:
            `BaseModelOutputWithPast` with ``last_hidden_state`` (B, L, hidden_size) after the final norm, and the
            cache.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        cache = new_cache(cache, use_cache, cache_position, past_key_values)
        mask, position_ids = attention_inputs(
            self.config, x, attention_mask, position_ids, cache, cache_position, block_size
        )
        head_dim = self.config.hidden_size // self.config.num_attention_heads
        cos, sin = rotary_cos_sin(position_ids, head_dim, self.config.rope_theta)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, cache, cache_position)
        x = self.norm(x)
        return model_output_with_cache(BaseModelOutputWithPast, cache, last_hidden_state=x)


class DreamModel(DreamPreTrainedModel, MaskedDiffusionGenerationMixin):
    """Dream masked diffusion model: bidirectional Qwen2 transformer + ``lm_head`` -> per-position logits.

    The class name is the one in the published ``config.json`` (``architectures`` and ``auto_map``), so checkpoints
    load with ``AutoModel`` / ``AutoModelForMaskedLM`` once ``hf_mdm.models`` is imported, without remote code.

    Example:

    ```python
    >>> import torch
    >>> from hf_mdm.models import DreamConfig, DreamModel
    >>> config = DreamConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2, mask_token_id=127,
    ...                      pad_token_id=1, bos_token_id=1, eos_token_id=1)
    >>> model = DreamModel(config)
    >>> model(torch.tensor([[5, 127, 127, 9]])).logits.shape
    torch.Size([1, 4, 128])
    ```
    """

    diffusion_facts = DiffusionFacts(logits_shift=1, reference="dream")

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}

    supports_per_row_logits_to_keep = True  # logits_to_keep may be (B, K) positions per row
    supports_diffusion_cache = True  # cache / cache_position as in hf_mdm.kv_cache

    def __init__(self, config: DreamConfig):
        super().__init__(config)
        self.model = DreamBaseModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

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
            position_ids: (B, L); default 0..L-1, see `DreamBaseModel.forward`.
            logits_to_keep: 0 = logits at every position; an int k = the last k positions; a 1-D LongTensor of
                positions = those positions; a (B, K) tensor = K positions per row. The LM head runs only there.
                With the shift, the token at position j needs the logits kept at j - 1.
            labels: (B, L) target ids at the positions to score and -100 elsewhere; the loss is their mean
                cross-entropy with the logits shifted by one (the token at j is scored with the logits at j - 1;
                logits at every position are computed, ``logits_to_keep`` is ignored).
            inputs_embeds: (B, L, hidden_size) instead of ``input_ids``.
            cache, use_cache, cache_position: keys/values kept across denoising steps (``past_key_values``: the
                older name of ``cache``), see
                `DreamBaseModel.forward`; ``logits_to_keep`` then counts in the input span.
            block_size: block-causal attention over blocks of this many positions for this call (overrides
                ``config.block_size``; None: the config's, where None is bidirectional attention).
            output_hidden_states, output_attentions, return_dict: as in transformers' models.

        Returns:
            `MaskedLMOutputWithPast` with unshifted ``logits`` (B, K, vocab_size) = ``lm_head(h)`` at the kept
            positions, and the cache (`hf_mdm.kv_cache.output_cache`) when one was used.
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
            logits = self.lm_head(hidden_states)
            loss = masked_token_loss(logits, labels, self.config.logits_shift)
        else:
            logits = self.lm_head(keep_positions(hidden_states, logits_to_keep))
        return masked_lm_output(outputs, logits, loss)


__all__ = ["DreamBaseModel", "DreamModel", "DreamPreTrainedModel"]


register_family(DreamConfig.model_type, DreamModel.diffusion_facts)
