"""LLaDA configuration: the OLMo-style ``config.json`` of GSAI-ML/LLaDA-8B-Base and -Instruct, read natively."""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import PreTrainedConfig


class LLaDAConfig(PreTrainedConfig):
    r"""Configuration of [`LLaDAModelLM`], with the key names of the published LLaDA checkpoints.

    The published ``config.json`` files (transformers 4.46 era) are read as they are: every key below is a field,
    and any other key (``use_cache``, ``init_fn``, ``precision``, ``auto_map``, ...) is kept as a plain attribute and
    written back by ``save_pretrained``. Defaults describe LLaDA-8B, so ``LLaDAConfig()`` is that architecture
    (the Hub's own class defaults to an OLMo/GPT-2 shape instead; this only matters for a ``config.json`` that omits
    keys, and the published ones omit none).

    Only the variant that LLaDA uses is implemented by the model: ``block_type="llama"``, ``layer_norm_type="rms"``
    with an affine weight and no bias, ``rope=True``, ``alibi=False``, ``attention_layer_norm=False``,
    ``block_group_size=1``. Other values load into the config but [`LLaDAModelLM`] refuses them with a ValueError.

    Args:
        d_model (`int`, defaults to 4096): hidden size.
        n_heads (`int`, defaults to 32): attention heads.
        n_kv_heads (`int`, *optional*, defaults to 32): key/value heads (grouped-query attention); `None` = `n_heads`,
            or 1 with `multi_query_attention=True`.
        n_layers (`int`, defaults to 32): transformer blocks.
        mlp_hidden_size (`int`, *optional*, defaults to 12288): SwiGLU width; `None` = `mlp_ratio * d_model`.
        mlp_ratio (`int`, defaults to 4): see `mlp_hidden_size`.
        activation_type (`str`, defaults to `"silu"`): activation of the gate (`ff_proj`); `"silu"`, `"gelu"` or
            `"relu"`.
        vocab_size (`int`, defaults to 126464): tokenizer vocabulary size.
        embedding_size (`int`, *optional*, defaults to 126464): rows of the embedding and of the output layer, i.e.
            the logits width (`None` = `vocab_size`).
        max_sequence_length (`int`, defaults to 4096): training context length (informative; RoPE is not bounded).
        rope_theta (`float`, defaults to 500000.0): RoPE base.
        rope_full_precision (`bool`, defaults to `True`): apply RoPE in float32 whatever the model dtype.
        rms_norm_eps (`float`, defaults to 1e-5): RMSNorm epsilon.
        include_bias (`bool`, defaults to `False`): biases on every linear layer.
        include_qkv_bias (`bool`, defaults to `False`): biases on the q/k/v projections only.
        weight_tying (`bool`, defaults to `False`): logits from the input embedding (`model.transformer.wte`) instead
            of a separate `model.transformer.ff_out`.
        scale_logits (`bool`, defaults to `False`): multiply the logits by `1 / sqrt(d_model)`.
        input_emb_norm (`bool`, defaults to `False`): multiply the input embeddings by `sqrt(d_model)`.
        attention_dropout, residual_dropout, embedding_dropout (`float`, default 0.0): dropout in training mode.
        init_std (`float`, defaults to 0.02): std of the normal init of new (not loaded) weights.
        mask_token_id (`int`, defaults to 126336): id of the [MASK] token.
        eos_token_id (`int`, defaults to 126081): end of text; LLaDA-Instruct's end of turn (EoT) is 126348.
        pad_token_id (`int`, defaults to 126081): padding id (the EOS id, as published).

    Attributes:
        logits_shift (`int`, class constant 0): LLaDA's logits at position i predict the token at position i.

    Example:

    ```python
    >>> import torch
    >>> from hf_mdm.models import LLaDAConfig, LLaDAModelLM
    >>> with torch.device("meta"):
    ...     model = LLaDAModelLM(LLaDAConfig())  # LLaDA-8B, no memory used
    >>> model.num_parameters()
    8015581184
    ```
    """

    model_type = "llada"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    # Tensor parallelism (``from_pretrained(..., tp_plan="auto")``): heads and MLP columns split across devices;
    # the output layer's vocabulary columns split and gathered.
    base_model_tp_plan = {
        "transformer.blocks.*.q_proj": "colwise",
        "transformer.blocks.*.k_proj": "colwise",
        "transformer.blocks.*.v_proj": "colwise",
        "transformer.blocks.*.attn_out": "rowwise",
        "transformer.blocks.*.ff_proj": "colwise",
        "transformer.blocks.*.up_proj": "colwise",
        "transformer.blocks.*.ff_out": "rowwise",
        "transformer.ff_out": "colwise_gather_output",
    }
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "n_heads",
        "num_hidden_layers": "n_layers",
        "max_position_embeddings": "max_sequence_length",
    }
    logits_shift: ClassVar[int] = 0

    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int | None = 32
    n_layers: int = 32
    mlp_ratio: int = 4
    mlp_hidden_size: int | None = 12288
    activation_type: str = "silu"
    block_type: str = "llama"
    block_group_size: int = 1
    alibi: bool = False
    rope: bool = True
    rope_full_precision: bool = True
    rope_theta: float = 500000.0
    multi_query_attention: bool | None = None
    attention_layer_norm: bool = False
    layer_norm_type: str = "rms"
    layer_norm_with_affine: bool = True
    bias_for_layer_norm: bool | None = False
    rms_norm_eps: float = 1e-5
    include_bias: bool = False
    include_qkv_bias: bool | None = False
    scale_logits: bool = False
    input_emb_norm: bool = False
    weight_tying: bool = False
    vocab_size: int = 126464
    embedding_size: int | None = 126464
    max_sequence_length: int = 4096
    attention_dropout: float = 0.0
    residual_dropout: float = 0.0
    embedding_dropout: float = 0.0
    init_std: float = 0.02
    mask_token_id: int | None = 126336
    eos_token_id: int | None = 126081
    pad_token_id: int | None = 126081

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.n_heads % self.effective_n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.effective_n_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def effective_n_kv_heads(self) -> int:
        """Key/value heads, resolving `n_kv_heads=None` and `multi_query_attention` as the published code does."""
        if self.multi_query_attention:
            return 1
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def effective_mlp_hidden_size(self) -> int:
        return self.mlp_hidden_size if self.mlp_hidden_size is not None else self.mlp_ratio * self.d_model

    @property
    def effective_embedding_size(self) -> int:
        return self.embedding_size if self.embedding_size is not None else self.vocab_size


__all__ = ["LLaDAConfig"]
