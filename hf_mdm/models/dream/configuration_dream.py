"""Dream configuration: the Qwen2-style ``config.json`` of Dream-org/Dream-v0-Base-7B and -Instruct-7B."""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import PreTrainedConfig


class DreamConfig(PreTrainedConfig):
    r"""Configuration of [`DreamModel`], with the key names of the published Dream checkpoints.

    The published ``config.json`` files (transformers 4.46 era) are read as they are: every key below is a field,
    and any other key (``use_cache``, ``use_mrope``, ``auto_map``, ``head_dim``, ...) is kept as a plain attribute
    and written back by ``save_pretrained``. RoPE keeps the published flat keys ``rope_theta`` and ``rope_scaling``
    (not transformers 5's ``rope_parameters``), so saved configs stay readable by the published code. Defaults
    describe Dream-v0-7B (the Hub's class defaults to another Qwen2 shape; this only matters for a ``config.json``
    that omits keys, and the published ones omit none).

    Args:
        vocab_size (`int`, defaults to 152064): rows of the embedding and of ``lm_head`` (Qwen2.5-7B's padded size;
            the tokenizer defines ids up to the mask id 151666).
        hidden_size (`int`, defaults to 3584): hidden size.
        intermediate_size (`int`, defaults to 18944): SwiGLU width.
        num_hidden_layers (`int`, defaults to 28): decoder layers.
        num_attention_heads (`int`, defaults to 28): query heads; head_dim = hidden_size // num_attention_heads.
        num_key_value_heads (`int`, *optional*, defaults to 4): key/value heads (grouped-query attention);
            `None` = `num_attention_heads`.
        hidden_act (`str`, defaults to `"silu"`): activation of the gate projection.
        max_position_embeddings (`int`, defaults to 131072): context length (informative; RoPE is not bounded).
        initializer_range (`float`, defaults to 0.02): std of the normal init of new (not loaded) weights.
        rms_norm_eps (`float`, defaults to 1e-6): RMSNorm epsilon.
        tie_word_embeddings (`bool`, defaults to `False`): share ``lm_head`` with ``model.embed_tokens``.
        rope_theta (`float`, defaults to 1000000.0): RoPE base.
        rope_scaling (`dict`, *optional*): must be `None` (plain RoPE), as in every published Dream checkpoint.
        attention_bias (`bool`, defaults to `True`): biases on the q/k/v projections (the published modeling always
            has them; ``o_proj`` never has one). Not a key of the published configs.
        use_sliding_window, sliding_window, max_window_layers: kept for the format; the published SDPA attention
            never uses a sliding window, and neither does this one.
        attention_dropout (`float`, defaults to 0.0): attention dropout in training mode.
        mask_token_id (`int`, defaults to 151666): id of the [MASK] token.
        pad_token_id, bos_token_id, eos_token_id (`int`, default 151643): special tokens (all ``<|endoftext|>``).

    Attributes:
        logits_shift (`int`, class constant 1): Dream predicts the token at position j from the hidden state at
            j - 1. ``DreamModel.forward`` returns unshifted per-position logits ``lm_head(h_j)``; samplers and the
            loss apply the shift.

    Example:

    ```python
    >>> import torch
    >>> from hf_mdm.models import DreamConfig, DreamModel
    >>> with torch.device("meta"):
    ...     model = DreamModel(DreamConfig())  # Dream-v0-7B, no memory used
    >>> model.num_parameters()
    7615616512
    ```
    """

    model_type = "Dream"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    # Tensor parallelism (``from_pretrained(..., tp_plan="auto")``), as Qwen2's: heads and MLP columns split.
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
    logits_shift: ClassVar[int] = 1

    vocab_size: int = 152064
    hidden_size: int = 3584
    intermediate_size: int = 18944
    num_hidden_layers: int = 28
    num_attention_heads: int = 28
    num_key_value_heads: int | None = 4
    hidden_act: str = "silu"
    max_position_embeddings: int = 131072
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_theta: float = 1000000.0
    rope_scaling: dict | None = None
    attention_bias: bool = True
    use_sliding_window: bool = False
    sliding_window: int | None = None
    max_window_layers: int = 28
    attention_dropout: float = 0.0
    mask_token_id: int | None = 151666
    pad_token_id: int | None = 151643
    bos_token_id: int | None = 151643
    eos_token_id: int | list[int] | None = 151643

    def __post_init__(self, **kwargs: Any) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        super().__post_init__(**kwargs)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be divisible by num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )


__all__ = ["DreamConfig"]
