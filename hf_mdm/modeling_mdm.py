"""``MDMForMaskedDiffusion``: a Llama-style transformer with bidirectional attention and the MDM ELBO loss.

Self-contained (relative imports of single files only), so that ``save_pretrained`` exports this file,
``configuration_mdm.py`` and the flat modules they import (``schedules.py``, ``kv_cache.py``, ``generation*.py``,
``timer.py``) as remote code that loads with ``trust_remote_code=True`` on a machine without hf_mdm. Keys and values
can be kept across denoising steps (``cache``, ``use_cache``, ``cache_position``: see `hf_mdm.kv_cache`).
Parameter names follow Llama (``model.embed_tokens``, ``model.layers.N.self_attn.q_proj``, ...).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Cache, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .configuration_mdm import MDMConfig
from .families import DiffusionFacts, register_family
from .generation import MaskedDiffusionGenerationMixin
from .kv_cache import (
    MaskedLMOutputWithPast,
    cached_keys_values,
    cached_length,
    masked_lm_output,
    model_output_with_cache,
    new_cache,
)
from .modeling_blocks import (
    RMSNorm,
    apply_rotary,
    attention_inputs,
    eager_attention_forward,
    keep_positions,
    rotary_cos_sin,
    shift_logits,
    split_heads,
)
from .schedules import get_schedule


class MDMAttention(nn.Module):
    """Multi-head (optionally grouped-query) self-attention, bidirectional or block-causal as the mask says, through
    transformers' attention interface (``config._attn_implementation``: eager, sdpa, flex_attention, kernels)."""

    def __init__(self, config: MDMConfig, layer_idx: int = 0):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: Any,
        cache: Optional[Cache] = None,
        columns: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """hidden_states (B, l, hidden) at canvas columns ``columns`` (None: the whole canvas); keys/values through
        `hf_mdm.kv_cache.cached_keys_values`. Returns the output (B, l, hidden) and the attention weights (eager)."""
        q = split_heads(self.q_proj(hidden_states), self.head_dim)
        k = split_heads(self.k_proj(hidden_states), self.head_dim)
        v = split_heads(self.v_proj(hidden_states), self.head_dim)
        q, k = apply_rotary(q, cos, sin, hidden_states.dtype), apply_rotary(k, cos, sin, hidden_states.dtype)
        k, v = cached_keys_values(cache, self.layer_idx, k, v, columns)
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = interface(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, is_causal=False)
        out = out.reshape(*out.shape[:2], -1)
        return self.o_proj(out), weights


class MDMMLP(nn.Module):
    def __init__(self, config: MDMConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MDMDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: MDMConfig, layer_idx: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MDMAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MDMMLP(config)

    def forward(self, hidden_states, cos, sin, attention_mask, cache=None, columns=None) -> torch.Tensor:
        attended, _ = self.self_attn(self.input_layernorm(hidden_states), cos, sin, attention_mask, cache, columns)
        hidden_states = hidden_states + attended
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class MDMPreTrainedModel(PreTrainedModel):
    config_class = MDMConfig
    config: MDMConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["MDMDecoderLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    _can_record_outputs = {"hidden_states": MDMDecoderLayer, "attentions": MDMAttention}

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    if not hasattr(PreTrainedModel, "activation_checkpointing_enable"):  # its name from transformers 5.2x on

        def activation_checkpointing_enable(self, *args: Any, **kwargs: Any) -> None:
            """transformers' newer name for ``gradient_checkpointing_enable``, on releases that predate it."""
            self.gradient_checkpointing_enable(*args, **kwargs)


class MDMModel(MDMPreTrainedModel):
    """The bare transformer: embeddings, bidirectional (or block-causal) blocks, final norm. Returns hidden states
    (B, L, hidden)."""

    _keys_to_ignore_on_load_unexpected = [r"^lm_head\."]  # AutoModel on a saved MDMForMaskedDiffusion: no head here

    def __init__(self, config: MDMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(MDMDecoderLayer(config, i) for i in range(config.num_hidden_layers))
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
        noisy_length: Optional[int] = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """
        Args:
            input_ids: (B, L) token ids, [MASK] included (with ``cache_position``: (B, l), the canvas columns
                ``cache_position``).
            attention_mask: (B, L), 1 for real tokens and 0 for padding; padding is never attended to. Always the
                whole canvas. A 4-D mask (B, 1, l, L) in the form of the attention implementation is used as given.
            position_ids: (B, L) of the whole canvas; default ``cumsum(attention_mask) - 1`` so left and right
                padding give the same result as no padding, else ``0..L-1``.
            inputs_embeds: (B, L, hidden) instead of ``input_ids``.
            cache, use_cache, cache_position: keep keys/values across denoising steps (see `hf_mdm.kv_cache`;
                ``past_key_values`` is the older name of ``cache``): ``use_cache=True`` stores every layer's
                keys/values of a full forward in a new cache (returned); with ``cache`` and ``cache_position`` (l,)
                the input is those canvas columns, their keys/values replace the cached ones and attention reads the
                whole cache.
            block_size: block-causal attention over blocks of this many positions for this call (overrides
                ``config.block_size``; None: the config's, where None is bidirectional attention).
            noisy_length: block diffusion's training input (BD3-LM): ``input_ids`` is a noisy copy of the sequence
                (its first ``noisy_length`` columns) followed by the clean sequence, with ``position_ids`` of both
                (`hf_mdm.modeling_blocks.noisy_clean_mask_function`); needs a block size.
            output_hidden_states, output_attentions, return_dict: as in transformers' models (keyword or config).
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        cache = new_cache(cache, use_cache, cache_position, past_key_values)
        bsz, length = inputs_embeds.shape[:2]
        canvas = cached_length(cache) if cache_position is not None else length
        if canvas - (noisy_length or 0) > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {canvas} exceeds max_position_embeddings={self.config.max_position_embeddings}: "
                "shorten the prompt or max_new_tokens"
            )
        position_ids = self._positions(attention_mask, position_ids, bsz, canvas, inputs_embeds.device)
        mask, position_ids = attention_inputs(
            self.config, inputs_embeds, attention_mask, position_ids, cache, cache_position, block_size, noisy_length
        )
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta)
        hidden_states = inputs_embeds
        for layer in self.layers:
            hidden_states = layer(hidden_states, cos, sin, mask, cache, cache_position)
        hidden_states = self.norm(hidden_states)
        return model_output_with_cache(BaseModelOutputWithPast, cache, last_hidden_state=hidden_states)

    @staticmethod
    def _positions(attention_mask, position_ids, bsz: int, length: int, device) -> torch.Tensor:
        """The (B, L) positions of the canvas: given, else ``cumsum(attention_mask) - 1``, else ``0..L-1``."""
        if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape != (bsz, length):
            raise ValueError(
                f"attention_mask must be 2-D (batch, length) = {(bsz, length)}, got {tuple(attention_mask.shape)}"
            )
        if position_ids is not None:
            return position_ids
        if attention_mask is not None and attention_mask.dim() == 2:
            return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return torch.arange(length, device=device).expand(bsz, length)


class MDMForMaskedDiffusion(MDMPreTrainedModel, MaskedDiffusionGenerationMixin):
    """A masked diffusion LM: bidirectional transformer + LM head, ELBO loss, and ``generate`` by reverse diffusion.

    Example:

    ```python
    >>> import torch
    >>> from hf_mdm import MDMConfig, MDMForMaskedDiffusion
    >>> model = MDMForMaskedDiffusion(MDMConfig(vocab_size=17, mask_token_id=16, hidden_size=32,
    ...                                         num_attention_heads=2, intermediate_size=64))
    >>> out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=8, steps=4)
    >>> out.shape
    torch.Size([1, 11])
    ```
    """

    diffusion_facts = DiffusionFacts()

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    supports_per_row_logits_to_keep = True  # logits_to_keep may be (B, K) positions per row
    supports_diffusion_cache = True  # cache / cache_position as in hf_mdm.kv_cache

    def __init__(self, config: MDMConfig):
        super().__init__(config)
        self.model = MDMModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

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
        labels: Optional[torch.LongTensor] = None,
        t: Optional[torch.Tensor] = None,
        clean_ids: Optional[torch.LongTensor] = None,
        logits_to_keep: Union[int, torch.Tensor] = 0,
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
            input_ids: (B, L) partly masked token ids x_t.
            attention_mask: (B, L), 1 = token, 0 = padding.
            position_ids: (B, L), see `MDMModel.forward`.
            labels: (B, L) original ids x_0 at masked positions and -100 elsewhere.
            t: (B,) diffusion time of each sequence, in (0, 1]. With ``labels`` the loss is the MDM ELBO:
                cross-entropy at masked positions weighted by ``-alpha'(t) / (1 - alpha(t))`` (``1/t`` for the linear
                schedule), summed and divided by the number of tokens (non-padding positions). Without ``t`` the
                loss is the plain mean cross-entropy over labelled positions.
            clean_ids: (B, L) the clean sequence x_0 of block diffusion's training (BD3-LM): ``input_ids`` is then x_t
                with each block of ``block_size`` positions noised at its own time, ``t`` (B, L / block_size) those
                times, and the loss the block diffusion ELBO in one forward (`block_diffusion_forward`).
            logits_to_keep: ``0`` = logits at every position; an int ``k`` = the last ``k`` positions; a 1-D index
                tensor = those positions; a 2-D (B, K) tensor = K positions per row (the LM head runs only there).
                Indices count in the input (with ``cache_position``: in the span).
            cache, use_cache, cache_position: keys/values kept across denoising steps (``past_key_values``: the
                older name of ``cache``), see `MDMModel.forward` and `hf_mdm.kv_cache`.
            block_size: block-causal attention over blocks of this many positions for this call (overrides
                ``config.block_size``; None: the config's, where None is bidirectional attention).
            output_hidden_states, output_attentions, return_dict: as in transformers' models.

        Returns:
            `MaskedLMOutputWithPast` with ``logits`` (B, L or K, vocab_size), ``loss`` when ``labels`` is given and
            the cache (`hf_mdm.kv_cache.output_cache`) when one was used.
            With ``config.logits_shift == 1`` the logits at index i are those computed from hidden state i, which
            predict token i+1; the sampler and the loss apply the shift.
        """
        if clean_ids is not None:
            return self.block_diffusion_forward(input_ids, clean_ids, labels, t, attention_mask, block_size)
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
            loss = self.elbo_loss(logits, labels, t, attention_mask)
        else:
            logits = self.lm_head(keep_positions(hidden_states, logits_to_keep))
        return masked_lm_output(outputs, logits, loss)

    def block_diffusion_forward(
        self,
        noisy_ids: torch.LongTensor,
        clean_ids: torch.LongTensor,
        labels: Optional[torch.LongTensor],
        t: Optional[torch.Tensor],
        attention_mask: Optional[torch.Tensor] = None,
        block_size: Optional[int] = None,
    ) -> MaskedLMOutputWithPast:
        """Block diffusion's training forward (BD3-LM, arXiv 2503.09573): x_t (``noisy_ids``) and x_0 (``clean_ids``)
        side by side in one forward, each noisy block seeing itself and the clean blocks before it, as at sampling
        time. Logits (B, L, V) of the noisy copy; with ``labels`` the loss is the ELBO with each block's own time
        ``t`` (B, number of blocks): the weighted cross-entropy at masked positions per token (`elbo_loss`)."""
        block_size = block_size if block_size is not None else self.config.block_size
        if block_size is None:
            raise ValueError("clean_ids (block diffusion training) needs block_size, e.g. MDMConfig(block_size=4)")
        if clean_ids.shape != noisy_ids.shape:
            raise ValueError(
                f"clean_ids {tuple(clean_ids.shape)} must have the shape of input_ids {tuple(noisy_ids.shape)}"
            )
        bsz, length = noisy_ids.shape
        positions = self.model._positions(attention_mask, None, bsz, length, noisy_ids.device)
        outputs = self.model(
            input_ids=torch.cat([noisy_ids, clean_ids], 1),
            attention_mask=None if attention_mask is None else torch.cat([attention_mask, attention_mask], 1),
            position_ids=torch.cat([positions, positions], 1),
            block_size=block_size,
            noisy_length=length,
        )
        logits = self.lm_head(outputs.last_hidden_state[:, :length])
        loss = None
        if labels is not None:
            if t is not None:
                t = torch.as_tensor(t, device=logits.device).reshape(bsz, -1).gather(1, positions // block_size)
            loss = self.elbo_loss(logits, labels, t, attention_mask)
        return masked_lm_output(outputs, logits, loss)

    def elbo_loss(
        self,
        logits: torch.Tensor,
        labels: torch.LongTensor,
        t: Optional[torch.Tensor],
        attention_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """MDM ELBO (per token) from full logits (B, L, V), labels (B, L) and times t: (B,) one per sequence, or
        (B, L) one per position (block diffusion's blocks)."""
        logits = shift_logits(logits, self.config.logits_shift)
        ce = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
        if t is None:
            return ce.sum() / (labels != -100).sum().clamp(min=1)
        t = torch.as_tensor(t, device=logits.device, dtype=torch.float32)
        t = t if t.dim() == 2 and t.shape == labels.shape else t.reshape(-1, 1)
        if t.shape[0] != labels.shape[0] or bool((t <= 0).any()) or bool((t > 1).any()):
            raise ValueError(
                f"t must hold one time in (0, 1] per sequence ({labels.shape[0]}) or per position "
                f"{tuple(labels.shape)}, got {tuple(t.shape)}"
            )
        weight = get_schedule(self.config.schedule).weight(t).float()
        num_tokens = attention_mask.sum() if attention_mask is not None else labels.numel()
        return (weight * ce).sum() / num_tokens


MDMConfig.register_for_auto_class()
MDMForMaskedDiffusion.register_for_auto_class("AutoModelForMaskedLM")


register_family(MDMConfig.model_type, MDMForMaskedDiffusion.diffusion_facts)
