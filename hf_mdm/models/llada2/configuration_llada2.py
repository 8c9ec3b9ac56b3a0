"""LLaDA2.x configuration: the ``config.json`` of inclusionAI's LLaDA2.0 (``model_type="llada2_moe"``) and LLaDA2.1
(``"llada21_moe"``) block-diffusion mixtures of experts, read natively."""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import PreTrainedConfig


class LLaDA2MoeConfig(PreTrainedConfig):
    r"""Configuration of [`LLaDA2MoeModelLM`], with the key names and defaults of the published
    ``configuration_llada2_moe.py``; every key of a published ``config.json`` is a field, any other key is kept as a
    plain attribute and written back by ``save_pretrained``.

    Args:
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads: the usual sizes.
        num_key_value_heads (`int`): key/value heads (grouped-query attention); 0 or None = ``num_attention_heads``.
        head_dim (`int`, *optional*): per-head size (default ``hidden_size // num_attention_heads``).
        partial_rotary_factor (`float`, defaults to 0.5): RoPE rotates the first ``int(head_dim * factor)`` dims of
            every head and leaves the rest as they are.
        rope_theta (`float`), rope_scaling (`dict`, must be None): plain RoPE.
        use_qkv_bias (`bool`): a bias on the fused ``query_key_value`` projection; use_bias (`bool`): on the output
            projection ``dense``; use_qk_norm (`bool`): RMSNorm over head_dim on queries and keys before RoPE.
        intermediate_size (`int`): SwiGLU width of the dense layers (the first ``first_k_dense_replace`` layers).
        num_experts, num_experts_per_tok, n_group, topk_group, routed_scaling_factor, moe_intermediate_size,
        num_shared_experts: the mixture of experts of the other layers: sigmoid router scores, experts chosen among
            the ``topk_group`` best of ``n_group`` groups (a group scored by its two best experts, after adding the
            router's ``expert_bias``), weights = the chosen scores (without the bias) normalised to sum 1 (when more
            than one expert is chosen), times ``routed_scaling_factor``; plus ``num_shared_experts`` experts' worth of
            a shared SwiGLU every token goes through.
        rms_norm_eps, hidden_act, initializer_range, max_position_embeddings, tie_word_embeddings: as usual.
        embedding_dropout, attention_dropout, output_dropout, norm_head, use_sliding_window, sliding_window,
        max_window_layers, output_router_logits: kept for the format (the published attention never uses a sliding
        window; dropout only in training mode, attention dropout only).
        mask_token_id (`int`, defaults to 156895), eos_token_id (`int`, defaults to 156892): the ids the published
            generate() uses by default (not keys of the published config).
        block_size (`int`, defaults to 32): the attention blocks (bidirectional inside a block of 32 positions
            counted from 0, causal across blocks), as the published generate() builds its mask; a forward without a
            4-D mask uses them. ``None``: bidirectional attention.
    """

    model_type = "llada2_moe"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    # Tensor parallelism (``from_pretrained(..., tp_plan="auto")``): the MLPs, dense and shared, split by columns then
    # rows, and every routed expert split the same way across the devices (each device holds a slice of all experts).
    # The fused GQA projection ``query_key_value`` (query, key and value heads side by side, of unequal widths)
    # cannot be split by one column cut, so attention stays replicated.
    base_model_tp_plan = {
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
        "layers.*.mlp.experts.gate_up_proj": "packed_colwise",
        "layers.*.mlp.experts.down_proj": "rowwise",
        "layers.*.mlp.experts": "moe_tp_experts",
        "layers.*.mlp.shared_experts.gate_proj": "colwise",
        "layers.*.mlp.shared_experts.up_proj": "colwise",
        "layers.*.mlp.shared_experts.down_proj": "rowwise",
    }
    # Expert parallelism (``distributed_config=DistributedConfig(ep_size=n, ...)``): whole experts per device,
    # ``num_experts / n`` each, the tokens brought to them by transformers' expert-parallel implementations.
    base_model_ep_plan = {
        "layers.*.mlp.experts.gate_up_proj": "grouped_gemm",
        "layers.*.mlp.experts.down_proj": "grouped_gemm",
        "layers.*.mlp.experts": "ep_dispatch_experts",
    }
    base_model_pp_plan = {
        "word_embeddings": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }
    logits_shift: ClassVar[int] = 0

    vocab_size: int = 30592
    hidden_size: int = 1024
    intermediate_size: int | None = None
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 0
    hidden_act: str = "silu"
    use_qkv_bias: bool = False
    use_qk_norm: bool = True
    use_bias: bool = True
    rms_norm_eps: float = 1e-05
    norm_head: bool = False
    tie_word_embeddings: bool = False
    embedding_dropout: float = 0.1
    attention_dropout: float = 0.1
    output_dropout: float = 0.1
    initializer_range: float = 0.02
    max_position_embeddings: int = 16384
    rope_theta: float = 10000.0
    use_sliding_window: bool = False
    sliding_window: int | None = 4096
    max_window_layers: int = 28
    rope_scaling: dict | None = None
    pad_token_id: int | None = 126081
    num_experts: int | None = 16
    num_shared_experts: int | None = 0
    num_experts_per_tok: int = 2
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    moe_intermediate_size: int | None = None
    first_k_dense_replace: int = 0
    head_dim: int | None = None
    output_router_logits: bool = False
    partial_rotary_factor: float = 0.5
    mask_token_id: int | None = 156895
    eos_token_id: int | list[int] | None = 156892
    block_size: int | None = 32

    def __post_init__(self, **kwargs: Any) -> None:
        if not self.num_key_value_heads:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        super().__post_init__(**kwargs)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.num_experts and self.num_experts % self.n_group:
            raise ValueError(f"num_experts={self.num_experts} must be a multiple of n_group={self.n_group}")

    @property
    def rotary_dim(self) -> int:
        """The dims of each head RoPE rotates: ``int(head_dim * partial_rotary_factor)``."""
        return int(self.head_dim * self.partial_rotary_factor)


class LLaDA21MoeConfig(LLaDA2MoeConfig):
    """Configuration of LLaDA2.1 (``model_type="llada21_moe"``): the architecture and keys of LLaDA2.0."""

    model_type = "llada21_moe"


__all__ = ["LLaDA21MoeConfig", "LLaDA2MoeConfig"]
