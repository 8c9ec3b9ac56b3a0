"""Configuration of ``MDMForMaskedDiffusion`` (self-contained: exported as remote code by ``save_pretrained``)."""

from __future__ import annotations

from typing import Any, Optional

from transformers import PretrainedConfig


class MDMConfig(PretrainedConfig):
    r"""Configuration of a masked diffusion language model: a Llama-style transformer with bidirectional attention.

    Args:
        vocab_size (`int`, defaults to 32):
            Number of token ids, the [MASK] token included.
        hidden_size (`int`, defaults to 128): width of the residual stream.
        num_hidden_layers (`int`, defaults to 2): number of transformer blocks.
        num_attention_heads (`int`, defaults to 4): attention heads.
        num_key_value_heads (`int`, *optional*): key/value heads for grouped-query attention (default: all).
        intermediate_size (`int`, defaults to 512): width of the SwiGLU MLP.
        max_position_embeddings (`int`, defaults to 2048): longest sequence the model accepts.
        rope_theta (`float`, defaults to 10000.0): RoPE base.
        rms_norm_eps (`float`, defaults to 1e-6): RMSNorm epsilon.
        initializer_range (`float`, defaults to 0.02): std of the normal weight init.
        attention_bias (`bool`, defaults to `False`): biases on the q/k/v/o projections.
        mask_token_id (`int`, **required**): id of the [MASK] token.
        pad_token_id, bos_token_id, eos_token_id (`int`, *optional*): special tokens.
        tie_word_embeddings (`bool`, defaults to `False`): share the input embedding and the LM head.
        logits_shift (`int`, defaults to 0): 0 means position i is predicted from hidden state i;
            1 means from hidden state i-1 (Dream's convention). Applied by the sampler and the loss.
        schedule (`str` or `dict`, defaults to `"linear"`): masking schedule used by the ELBO loss
            (see `hf_mdm.schedules`); a dict ``{"name": ..., **kwargs}`` carries schedule arguments.
        block_size (`int`, *optional*): None for bidirectional attention; b for block-causal attention
            (bidirectional inside each block of b positions, causal across blocks; b = 1 is causal attention).

    Example:

    ```python
    >>> from hf_mdm import MDMConfig, MDMForMaskedDiffusion
    >>> config = MDMConfig(vocab_size=17, mask_token_id=16, hidden_size=64, num_hidden_layers=2,
    ...                    num_attention_heads=4, intermediate_size=128)
    >>> model = MDMForMaskedDiffusion(config)
    ```
    """

    model_type = "hf_mdm"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    has_no_defaults_at_init = True  # mask_token_id has no default (transformers < 5.24 builds cls() otherwise)
    # Tensor parallelism (``from_pretrained(..., tp_plan="auto")``): heads and MLP columns split across devices.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }
    base_model_pp_plan = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }

    def __init__(
        self,
        vocab_size: int = 32,
        hidden_size: int = 128,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: Optional[int] = None,
        intermediate_size: int = 512,
        max_position_embeddings: int = 2048,
        rope_theta: float = 10000.0,
        rms_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        attention_bias: bool = False,
        mask_token_id: Optional[int] = None,
        pad_token_id: Optional[int] = None,
        bos_token_id: Optional[int] = None,
        eos_token_id: Optional[int] = None,
        tie_word_embeddings: bool = False,
        logits_shift: int = 0,
        schedule: Any = "linear",
        block_size: Optional[int] = None,
        **kwargs: Any,
    ):
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        _check_dimensions(vocab_size, hidden_size, num_attention_heads, num_key_value_heads, mask_token_id)
        _check_attention(logits_shift, block_size)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.attention_bias = attention_bias
        self.mask_token_id = mask_token_id
        self.logits_shift = logits_shift
        self.schedule = schedule
        self.block_size = block_size
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def _check_dimensions(vocab_size: int, hidden_size: int, heads: int, kv_heads: int, mask_token_id: Any) -> None:
    """Clear errors for a [MASK] id outside the vocabulary and heads that do not divide the model."""
    if mask_token_id is None:
        raise ValueError("MDMConfig needs mask_token_id: the id of the [MASK] token (e.g. vocab_size - 1)")
    if not 0 <= mask_token_id < vocab_size:
        raise ValueError(f"mask_token_id={mask_token_id} must be in [0, vocab_size={vocab_size})")
    if hidden_size % heads:
        raise ValueError(f"hidden_size={hidden_size} must be divisible by num_attention_heads={heads}")
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads={heads} must be a multiple of num_key_value_heads={kv_heads}")


def _check_attention(logits_shift: Any, block_size: Any) -> None:
    """Clear errors for a logits shift other than 0 or 1 and a block size that is not a positive integer."""
    if logits_shift not in (0, 1):
        raise ValueError(f"logits_shift must be 0 or 1, got {logits_shift}")
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1):
        raise ValueError(f"block_size must be None (bidirectional) or an integer >= 1, got {block_size!r}")
