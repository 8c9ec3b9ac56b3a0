"""PyTorch LLaDA2.x (inclusionAI/LLaDA2.0-mini, -flash, their CAP variants, LLaDA2.1): a native, weight-compatible
implementation for transformers 5.

LLaDA2 is a block-diffusion mixture of experts: attention is bidirectional inside blocks of 32 positions and causal
across blocks. Its published remote code (``modeling_llada2_moe.py``, ``modeling_llada21_moe.py``) was written for
transformers 4.5x and does not import on transformers 5; this module loads those checkpoints as they are. Parameter
names, exactly as in the published safetensors:

    model.word_embeddings.weight                                   (vocab_size, hidden_size)
    model.layers.{i}.input_layernorm.weight                        RMSNorm before attention
    model.layers.{i}.attention.query_key_value.{weight,bias}       fused projection: query, key, value heads
    model.layers.{i}.attention.{query,key}_layernorm.weight        RMSNorm over head_dim (use_qk_norm)
    model.layers.{i}.attention.dense.{weight,bias}                 output projection (bias: use_bias)
    model.layers.{i}.post_attention_layernorm.weight               RMSNorm before the MLP
    model.layers.{i}.mlp.{gate,up,down}_proj.weight                SwiGLU (the first first_k_dense_replace layers)
    model.layers.{i}.mlp.gate.weight, .gate.expert_bias            router (num_experts, hidden), routing bias
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight    routed experts (SwiGLU; fused in memory, see
                                                                   `LLaDA2MoeExperts`)
    model.layers.{i}.mlp.shared_experts.{gate,up,down}_proj.weight shared expert (SwiGLU)
    model.norm.weight                                              final RMSNorm
    lm_head.weight                                                 (vocab_size, hidden_size)

There is no logits shift (position j is predicted from its own hidden state).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Cache, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter
from transformers.integrations import use_experts_implementation
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
    attention_inputs,
    eager_attention_forward,
    keep_positions,
    masked_token_loss,
    rotary_cos_sin,
    rotate_partially,
)
from .configuration_llada2 import LLaDA2MoeConfig, LLaDA21MoeConfig


def as_attention_mask(mask: Any, dtype: torch.dtype) -> Any:
    """A 4-D float mask as given (the published generate() builds it in bfloat16) in the queries' dtype, which
    torch's SDPA requires; its 0 / -inf entries are exact in every float dtype. Other masks unchanged."""
    if isinstance(mask, torch.Tensor) and mask.is_floating_point() and mask.dtype != dtype:
        return mask.to(dtype)
    return mask


class LLaDA2MoeAttention(nn.Module):
    """Grouped-query self-attention with a fused q/k/v projection, RMSNorm on queries and keys, partial RoPE."""

    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int = 0):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = config.head_dim
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        width = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, width, bias=config.use_qkv_bias)
        if config.use_qk_norm:
            self.query_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.key_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.dense = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.use_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: Any,
        cache: Optional[Cache] = None,
        columns: Optional[torch.LongTensor] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """x (B, L, hidden); cos, sin (B, L, rotary_dim) -> (B, L, hidden) and the attention weights (eager)."""
        batch, length, _ = x.shape
        qkv = self.query_key_value(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
        query, key, value = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        if self.config.use_qk_norm:
            query, key = self.query_layernorm(query), self.key_layernorm(key)
        query, key = rotate_partially(query, cos, sin), rotate_partially(key, cos, sin)
        key, value = cached_keys_values(cache, self.layer_idx, key, value, columns)
        dropout = self.config.attention_dropout if self.training else 0.0
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = interface(
            self,
            query,
            key,
            value,
            as_attention_mask(attention_mask, query.dtype),
            dropout=dropout,
            scaling=self.scaling,
            is_causal=False,
        )
        return self.dense(out.reshape(batch, length, -1)), weights


class LLaDA2MoeMLP(nn.Module):
    """SwiGLU: ``down_proj(act(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, config: LLaDA2MoeConfig, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LLaDA2MoeGate(nn.Module):
    """Group-limited sigmoid router: which experts each token goes to, and with what weight."""

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__()
        self.top_k, self.n_group, self.topk_group = config.num_experts_per_tok, config.n_group, config.topk_group
        self.routed_scaling_factor = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.LongTensor, torch.Tensor]:
        """x (N, hidden) -> experts (N, top_k) and their weights (N, top_k), float32.

        Scores are ``sigmoid(x W^T)`` in float32. The routing adds ``expert_bias``: each group of
        ``num_experts / n_group`` experts is scored by the sum of its two best, the ``topk_group`` best groups are
        kept and the ``top_k`` best experts among them chosen. The weights are the chosen experts' scores without the
        bias, normalised to sum 1 when ``top_k > 1``, times ``routed_scaling_factor``.
        """
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))
        routing = scores + self.expert_bias
        tokens = routing.shape[0]
        groups = routing.view(tokens, self.n_group, -1)
        group_scores = groups.topk(2, dim=-1).values.sum(-1)
        best_groups = group_scores.topk(self.topk_group, dim=-1, sorted=False).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
        routing = routing.masked_fill(~keep[..., None].expand_as(groups).reshape(tokens, -1), float("-inf"))
        experts = routing.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.top_k > 1:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return experts, weights * self.routed_scaling_factor


@use_experts_implementation
class LLaDA2MoeExperts(nn.Module):
    """The routed experts' SwiGLU weights, one 3-D tensor per projection as transformers' mixtures of experts keep
    them (so its experts implementations and expert-parallel plans apply): ``gate_up_proj`` (num_experts,
    2 * moe_intermediate_size, hidden), each expert's ``gate_proj`` rows then its ``up_proj`` rows, and
    ``down_proj`` (num_experts, hidden, moe_intermediate_size). Checkpoints keep the published per-expert tensors
    (``experts.{e}.{gate,up,down}_proj.weight``): the conversion registered in ``hf_mdm.models.llada2`` fuses them on
    loading and splits them again on saving.

    This forward is ``experts_implementation="eager"``; transformers' ``grouped_mm`` (the default) and ``batched_mm``
    run the same sum without data-dependent shapes.
    """

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__()
        self.num_experts = config.num_experts
        width, hidden = config.moe_intermediate_size, config.hidden_size
        self.gate_up_proj = nn.Parameter(torch.empty(config.num_experts, 2 * width, hidden))
        self.down_proj = nn.Parameter(torch.empty(config.num_experts, hidden, width))
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor, experts: torch.LongTensor, weights: torch.Tensor) -> torch.Tensor:
        """x (N, hidden), each token's experts (N, top_k) and weights (N, top_k) -> (N, hidden): the chosen experts'
        outputs weighted and summed in the weights' dtype (float32, as published). An expert id ``>= num_experts``
        is a route to another rank's experts under expert parallelism and is skipped."""
        out = torch.zeros(x.shape, dtype=weights.dtype, device=x.device)
        for index in experts[experts < self.num_experts].unique().tolist():
            token, slot = (experts == index).nonzero(as_tuple=True)
            gate, up = F.linear(x[token], self.gate_up_proj[index]).chunk(2, dim=-1)
            expert_out = F.linear(self.act_fn(gate) * up, self.down_proj[index]).to(weights.dtype)
            out.index_add_(0, token, expert_out * weights[token, slot, None])
        return out.to(x.dtype)


class LLaDA2MoeSparseMoeBlock(nn.Module):
    """Routed experts (``gate`` chooses ``num_experts_per_tok`` per token) plus the shared expert."""

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__()
        self.gate = LLaDA2MoeGate(config)
        self.experts = LLaDA2MoeExperts(config)
        if config.num_shared_experts:
            self.shared_experts = LLaDA2MoeMLP(config, config.moe_intermediate_size * config.num_shared_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, hidden) -> (B, L, hidden): each token's experts run on it, weighted and summed, then the shared
        expert added."""
        flat = x.reshape(-1, x.shape[-1])
        experts, weights = self.gate(flat)
        out = self.experts(flat, experts, weights).to(x.dtype).view_as(x)
        if hasattr(self, "shared_experts"):
            out = out + self.shared_experts(x)
        return out


class LLaDA2MoeDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block: ``x + attention(input_layernorm(x))``, then ``+ mlp(post_attention_layernorm(x))``, the MLP
    dense in the first ``first_k_dense_replace`` layers and a mixture of experts after."""

    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = LLaDA2MoeAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.num_experts is not None and layer_idx >= config.first_k_dense_replace:
            self.mlp = LLaDA2MoeSparseMoeBlock(config)
        else:
            self.mlp = LLaDA2MoeMLP(config, config.intermediate_size)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: Any,
        cache: Optional[Cache] = None,
        columns: Optional[torch.LongTensor] = None,
    ) -> torch.Tensor:
        attended, _ = self.attention(self.input_layernorm(x), cos, sin, attention_mask, cache, columns)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x))


class LLaDA2MoePreTrainedModel(PreTrainedModel):
    config_class = LLaDA2MoeConfig
    config: LLaDA2MoeConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LLaDA2MoeDecoderLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True  # with transformers' experts implementations (grouped_mm, the default)
    _can_record_outputs = {"hidden_states": LLaDA2MoeDecoderLayer, "attentions": LLaDA2MoeAttention}

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, LLaDA2MoeGate):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            module.expert_bias.zero_()
        elif isinstance(module, LLaDA2MoeExperts):
            nn.init.normal_(module.gate_up_proj, mean=0.0, std=self.config.initializer_range)
            nn.init.normal_(module.down_proj, mean=0.0, std=self.config.initializer_range)


class LLaDA2MoeModel(LLaDA2MoePreTrainedModel):
    """The LLaDA2 transformer under ``model``: embedding, decoder layers, final norm."""

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__(config)
        if config.rope_scaling is not None:
            raise ValueError(
                "LLaDA2MoeModel implements plain RoPE (rope_scaling=None, as in the published checkpoints); "
                f"got rope_scaling={config.rope_scaling}"
            )
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(LLaDA2MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.word_embeddings = value

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
            attention_mask: (B, L), 1 for tokens and 0 for padding (never attended to), combined with the
                block-causal attention of ``block_size``; or a 4-D (B, 1, L, L) mask used as given: additive (0 /
                -inf, any float dtype, as the published generate() builds it in bfloat16) or boolean (True =
                attend).
            position_ids: (B, L) RoPE positions; default 0..L-1 in every row. They also place the attention
                blocks (``position // block_size``).
            inputs_embeds: (B, L, hidden_size) instead of ``input_ids``.
            cache, use_cache, cache_position: keys/values kept across denoising steps (``past_key_values``: the
                older name of ``cache``; see `hf_mdm.kv_cache`). Under block-causal attention the keys/values of a
                completed block never change, so running a block against the cache is exact.
            block_size: attention blocks for this call (default ``config.block_size``, 32); None in both:
                bidirectional attention.
            output_hidden_states, output_attentions, return_dict: as in transformers' models.

        Returns:
            `BaseModelOutputWithPast` with ``last_hidden_state`` (B, L, hidden_size) after the final norm, and the
            cache.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        cache = new_cache(cache, use_cache, cache_position, past_key_values)
        mask, position_ids = attention_inputs(
            self.config, x, attention_mask, position_ids, cache, cache_position, block_size
        )
        cos, sin = rotary_cos_sin(position_ids, self.config.rotary_dim, self.config.rope_theta)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, cache, cache_position)
        x = self.norm(x)
        return model_output_with_cache(BaseModelOutputWithPast, cache, last_hidden_state=x)


class LLaDA2MoeModelLM(LLaDA2MoePreTrainedModel, MaskedDiffusionGenerationMixin):
    """LLaDA2.x block-diffusion model: the transformer + ``lm_head`` -> per-position logits (float32).

    The class name is the one the published ``config.json`` names (``architectures``, and ``auto_map`` for
    ``AutoModelForCausalLM``), so checkpoints load with ``AutoModel``, ``AutoModelForMaskedLM`` and
    ``AutoModelForCausalLM`` once ``hf_mdm`` is imported, without remote code. Generate with
    ``MaskedDiffusionGenerationConfig.llada2(...)`` (or ``.llada21(...)``), the published generate() as a preset.

    Example:

    ```python
    >>> import torch
    >>> from hf_mdm.models import LLaDA2MoeConfig, LLaDA2MoeModelLM
    >>> config = LLaDA2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    ...                          num_attention_heads=4, num_key_value_heads=2, num_experts=4, n_group=2,
    ...                          topk_group=1, moe_intermediate_size=16, num_shared_experts=1,
    ...                          first_k_dense_replace=1, mask_token_id=63, eos_token_id=62, pad_token_id=0)
    >>> model = LLaDA2MoeModelLM(config)
    >>> model(torch.tensor([[5, 63, 63, 9]])).logits.shape
    torch.Size([1, 4, 64])
    ```
    """

    # LLaDA2.0's generate() with its defaults (MaskedDiffusionGenerationConfig.llada2), for calls that set no transfer
    diffusion_facts = DiffusionFacts(
        sampler=(
            ("transfer", "llada2"),
            ("strategy", "confidence"),
            ("steps", 32),
            ("threshold", 0.95),
            ("whole_blocks", True),
        )
    )

    _tied_weights_keys = {"lm_head.weight": "model.word_embeddings.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}

    supports_per_row_logits_to_keep = True  # logits_to_keep may be (B, K) positions per row
    supports_diffusion_cache = True  # cache / cache_position as in hf_mdm.kv_cache

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__(config)
        self.model = LLaDA2MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.word_embeddings = value

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
            input_ids, attention_mask, position_ids, inputs_embeds, cache, past_key_values, use_cache,
                cache_position, block_size: see `LLaDA2MoeModel.forward`.
            logits_to_keep: 0 = logits at every position; an int k = the last k positions; a 1-D LongTensor of
                positions = those positions; a (B, K) tensor = K positions per row. The LM head runs only there.
            labels: (B, L) target ids at the positions to score and -100 elsewhere; the loss is their mean
                cross-entropy (no shift; ``logits_to_keep`` is ignored).

        Returns:
            `MaskedLMOutputWithPast` with float32 ``logits`` (B, K, vocab_size) at the kept positions (the published
            model returns float32 logits too), and the cache when one was used.
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
            logits = self.lm_head(hidden_states).float()
            loss = masked_token_loss(logits, labels, 0)
        else:
            logits = self.lm_head(keep_positions(hidden_states, logits_to_keep)).float()
        return masked_lm_output(outputs, logits, loss)


class LLaDA21MoeModelLM(LLaDA2MoeModelLM):
    """LLaDA2.1 (``model_type="llada21_moe"``): the LLaDA2.0 architecture; its published sampler adds token editing
    (``MaskedDiffusionGenerationConfig.llada21``)."""

    config_class = LLaDA21MoeConfig
    # LLaDA2.1's generate() with its defaults (MaskedDiffusionGenerationConfig.llada21)
    diffusion_facts = DiffusionFacts(
        sampler=(
            ("transfer", "llada21_editing"),
            ("strategy", "confidence"),
            ("threshold", 0.95),
            ("editing_threshold", 0.9),
            ("max_post_steps", 16),
            ("num_to_transfer", 1),
            ("whole_blocks", True),
            ("finish_at_eos", False),
        )
    )


__all__ = ["LLaDA21MoeModelLM", "LLaDA2MoeModel", "LLaDA2MoeModelLM", "LLaDA2MoePreTrainedModel"]


# The published checkpoints keep each routed expert's projections as separate tensors; `LLaDA2MoeExperts` holds them
# fused. transformers applies this conversion on loading and reverses it on saving, so checkpoints keep the
# published layout.
PUBLISHED_EXPERTS_LAYOUT = [
    WeightConverter(
        source_patterns=["mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight"],
        target_patterns="mlp.experts.gate_up_proj",
        operations=[MergeModulelist(dim=0), Concatenate(dim=1)],
    ),
    WeightConverter(
        source_patterns="mlp.experts.*.down_proj.weight",
        target_patterns="mlp.experts.down_proj",
        operations=[MergeModulelist(dim=0)],
    ),
]
for _config in (LLaDA2MoeConfig, LLaDA21MoeConfig):
    register_checkpoint_conversion_mapping(_config.model_type, PUBLISHED_EXPERTS_LAYOUT, overwrite=True)
register_family(LLaDA2MoeConfig.model_type, LLaDA2MoeModelLM.diffusion_facts)
register_family(LLaDA21MoeConfig.model_type, LLaDA21MoeModelLM.diffusion_facts)
