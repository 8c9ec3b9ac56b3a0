"""A2D: an autoregressive Llama or Qwen2 checkpoint turned into hf_mdm's masked diffusion model, ready to train.

hf_mdm's `MDMForMaskedDiffusion` is the Llama layout (RMSNorm, RoPE, grouped-query attention, SwiGLU, the same
parameter names), so the conversion copies every weight as it is and changes what makes the model a diffusion
model:

- a [MASK] token: a new id (the AR vocabulary's size, one more embedding and LM-head row, both set to the mean of
  the existing rows) unless ``mask_token_id`` names an id the model already has rows for (a tokenizer's spare id);
- the attention: bidirectional (``block_size=None``) or block-causal (blocks of ``block_size``: a block diffusion
  model; ``block_size=1`` is the AR model's own causal attention);
- the logits shift: 1 (Dream's recipe, the default) keeps the AR head's alignment, position i read from the logits
  at i - 1, so the converted model starts from the AR model's next-token predictions; 0 reads position i from its
  own logits (the head must relearn the alignment).

Qwen2's query/key/value biases are kept (the output projection gets a zero bias, `MDMConfig.attention_bias` covering
all four); a checkpoint with scaled RoPE (``rope_type`` other than ``"default"``, e.g. Llama-3.1's ``"llama3"``) or a
head size other than ``hidden_size / num_attention_heads`` is refused with a ValueError (hf_mdm's MDM has plain RoPE
and that head size). With ``block_size=1`` and shift 1 the converted model's logits equal the AR model's
(`tests/finetune/test_a2d.py`); train it with the MDM or block-diffusion objective (`hf_mdm.training.build_trainer` with
``model=``, or ``hf-mdm sft``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..configuration_mdm import MDMConfig
from ..modeling_mdm import MDMForMaskedDiffusion

__all__ = ["a2d_config", "convert_to_mdm", "check_convertible", "CONVERTIBLE"]

CONVERTIBLE = ("llama", "qwen2")


def check_convertible(config: Any, name: str = "the checkpoint") -> None:
    """A one-line ValueError naming what ``config`` is and what A2D takes, unless it is a Llama or Qwen2 config."""
    model_type = getattr(config, "model_type", None)
    if model_type in CONVERTIBLE:
        return
    diffusion = getattr(config, "mask_token_id", None) is not None
    advice = "it is a diffusion model already: fine-tune it with `hf-mdm sft`" if diffusion else "pass one of those"
    raise ValueError(
        f"A2D converts autoregressive Llama and Qwen2 checkpoints (model_type 'llama', 'qwen2'); {name} has "
        f"model_type {model_type!r} ({type(config).__name__}): {advice}"
    )


def _rope_theta(config: Any) -> float:
    """The RoPE base of a Llama / Qwen2 config (transformers 5 keeps it in ``rope_parameters``); a ValueError for
    scaled RoPE."""
    parameters = getattr(config, "rope_parameters", None) or {}
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type != "default":
        raise ValueError(
            f"the checkpoint scales RoPE (rope_type={rope_type!r}), which hf_mdm's MDM does not: convert a checkpoint "
            "with plain RoPE (e.g. Qwen2.5, Llama-2, or a Llama trained without rope scaling)"
        )
    return float(parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def a2d_config(
    ar_config: Any, mask_token_id: Optional[int] = None, block_size: Optional[int] = None, logits_shift: int = 1
) -> MDMConfig:
    """The `MDMConfig` of the converted model (see the module docstring)."""
    check_convertible(ar_config)
    heads = ar_config.num_attention_heads
    head_dim = getattr(ar_config, "head_dim", None) or ar_config.hidden_size // heads
    if head_dim * heads != ar_config.hidden_size:
        raise ValueError(f"head_dim {head_dim} x {heads} heads != hidden_size {ar_config.hidden_size}: not convertible")
    if logits_shift not in (0, 1):
        raise ValueError(f"logits_shift must be 0 or 1, got {logits_shift!r}")
    vocab = ar_config.vocab_size
    mask = vocab if mask_token_id is None else int(mask_token_id)
    biased = ar_config.model_type == "qwen2" or bool(getattr(ar_config, "attention_bias", False))
    return MDMConfig(
        vocab_size=max(vocab, mask + 1), hidden_size=ar_config.hidden_size,
        num_hidden_layers=ar_config.num_hidden_layers, num_attention_heads=heads,
        num_key_value_heads=getattr(ar_config, "num_key_value_heads", None) or heads,
        intermediate_size=ar_config.intermediate_size, max_position_embeddings=ar_config.max_position_embeddings,
        rope_theta=_rope_theta(ar_config), rms_norm_eps=ar_config.rms_norm_eps, attention_bias=biased,
        tie_word_embeddings=bool(getattr(ar_config, "tie_word_embeddings", False)), mask_token_id=mask,
        pad_token_id=ar_config.pad_token_id, bos_token_id=ar_config.bos_token_id,
        eos_token_id=ar_config.eos_token_id, logits_shift=logits_shift, block_size=block_size,
    )  # fmt: skip


@torch.no_grad()
def convert_to_mdm(
    ar_model: Any, mask_token_id: Optional[int] = None, block_size: Optional[int] = None, logits_shift: int = 1
) -> MDMForMaskedDiffusion:
    """``ar_model`` (a Llama or Qwen2 causal LM) as an `MDMForMaskedDiffusion` with its weights (see the module
    docstring), in the AR model's dtype."""
    config = a2d_config(ar_model.config, mask_token_id, block_size, logits_shift)
    mdm = MDMForMaskedDiffusion(config).to(ar_model.dtype)
    target = mdm.state_dict()
    source = ar_model.state_dict()
    for name, tensor in target.items():
        if name in source and source[name].shape == tensor.shape:
            tensor.copy_(source[name])
        elif name.endswith("o_proj.bias"):
            tensor.zero_()  # Qwen2's output projection has no bias
        elif name in ("model.embed_tokens.weight", "lm_head.weight") and name in source:
            rows = source[name].shape[0]
            tensor[:rows] = source[name]
            tensor[rows:] = source[name].mean(0)  # the [MASK] row (never proposed by the sampler)
        else:
            raise ValueError(f"A2D: no weight for {name} in the AR checkpoint (an architecture it cannot convert)")
    missing = sorted(set(source) - set(target) - {"lm_head.weight"})
    if missing:
        raise ValueError(f"A2D: AR weights with no place in the MDM: {missing[:5]} (an architecture it cannot convert)")
    return mdm.eval()
