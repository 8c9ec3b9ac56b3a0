"""Which config a call runs with: `resolve_config`, one precedence order over every level that can set a field.

A field of `MaskedDiffusionGenerationConfig` is *set* when the instance holds a value for it (not None); each unset
field of the config a call runs with comes from the highest level that sets it (highest first):

1. the call's keyword arguments;
2. the generation config given to the call;
3. the model's generation config (a checkpoint's ``generation_config.json``);
4. the model config: ``schedule`` (the one the model was trained with), ``mask_token_id``, ``logits_shift``,
   ``eos_token_id``, ``pad_token_id``; for a block-causal model (``config.block_size`` b) ``block_length`` b and
   ``kv_cache="prefix"`` (exact under block-causal attention; not with speculative decoding, which keeps none);
   the settings of the family's own sampler (`hf_mdm.families.DiffusionFacts.sampler`: LLaDA2's), unless the call
   names another ``transfer`` or ``strategy`` (or ReMDM remasking, or speculative decoding's ``draft_length``);
5. the caller's fallback for token ids (e.g. a tokenizer) and the entry point's own defaults (e.g. ``hf-mdm
   sample``'s paper sampler);
6. the field defaults (`hf_mdm.generation_config`).

A config that selects a reference sampler (``reference="llada"`` / ``"dream"``, from levels 1-3) is complete as
built: lower levels give it only the model's own ids and logits shift (`MODEL_FIELDS`).

Two checks need the resolved config and the model: a parameter of one transfer rule that the call itself sets
(levels 1-2, e.g. ``threshold``) while another rule runs is a ValueError, since it would change nothing
(`hf_mdm.generation_transfer.check_transfer_parameters`; a lower level's, e.g. a checkpoint's generation config
naming its own transfer, is not); and so is a ``block_length`` that cuts across a block-causal model's attention
blocks (`check_block_length`).

Exported with the model as remote code.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

from transformers import GenerationConfig

from .families import attention_block_size, facts_of
from .generation_config import DIFFUSION_FIELDS, MaskedDiffusionGenerationConfig
from .generation_denoiser import logits_shift_of, supports_kv_cache
from .generation_processors import apply_do_sample, check_generation_fields
from .generation_reference import REFERENCES
from .generation_remask import apply_remdm_defaults
from .generation_speculative import SPECULATIVE
from .generation_transfer import check_transfer_parameters

TOKEN_ID_FIELDS = ("mask_token_id", "eos_token_id", "pad_token_id")
MODEL_FIELDS = TOKEN_ID_FIELDS + ("logits_shift",)  # the model's own: every level gives them, to any config


def resolve_config(
    model: Any,
    generation_config: Optional[GenerationConfig],
    kwargs: dict[str, Any],
    fallback: Any = None,
    defaults: Optional[dict[str, Any]] = None,
) -> MaskedDiffusionGenerationConfig:
    """The config a call runs with, validated: each field from the highest level that sets it (see the module
    docstring): ``kwargs`` (None values are not settings), ``generation_config``, the model's generation config,
    the model config (trained ``schedule``, ids, ``logits_shift``), ``fallback``'s token ids (e.g. a tokenizer),
    ``defaults`` (the entry point's own), the field defaults."""
    config = MaskedDiffusionGenerationConfig.from_any(generation_config)
    unknown = [k for k in kwargs if not hasattr(config, k)]
    if unknown:
        raise ValueError(
            f"unknown generation argument(s) {unknown}: see MaskedDiffusionGenerationConfig for the accepted fields"
        )
    config.update(**{k: v for k, v in kwargs.items() if v is not None})
    named = _named_settings(config)
    saved = getattr(model, "generation_config", None)
    if saved is not None:
        _fill(config, MaskedDiffusionGenerationConfig.from_any(saved).explicit_values())
    _fill(config, _model_config_values(model, config))
    _fill(config, {name: getattr(fallback, name, None) for name in TOKEN_ID_FIELDS})
    _fill(config, defaults or {})
    if config.reference == "none":
        config.reference = None
    if config.kv_cache == "none":  # set explicitly: no cache, even where the model's default is one
        config.kv_cache = None
    uniform = getattr(facts_of(model), "corruption", "mask") == "uniform"  # random-token noise: no [MASK]
    if config.mask_token_id is None and not uniform:
        raise ValueError(
            "no mask token id: pass mask_token_id=... (to generate, or in --model_args) or set config.mask_token_id "
            "on the model (e.g. 126336 for LLaDA, 151666 for Dream)"
        )
    apply_do_sample(config)
    apply_remdm_defaults(config)
    check_generation_fields(config, DIFFUSION_FIELDS)
    config.validate_diffusion()
    if config.reference is None and not uniform:  # the uniform sampler reads entropy_bound without a transfer
        check_transfer_parameters(config.transfer, named, config.remdm)
    check_block_length(model, config.block_length)
    return config


def _named_settings(config: MaskedDiffusionGenerationConfig) -> dict[str, Any]:
    """The diffusion fields the call's own config sets to something else than their default (levels 1-2)."""
    return {
        name: value
        for name, value in config.explicit_values().items()
        if name in DIFFUSION_FIELDS and value != getattr(MaskedDiffusionGenerationConfig, name)
    }


def check_block_length(model: Any, block_length: Optional[int]) -> None:
    """A ValueError for a block-causal model's ``block_length`` that does not nest with its attention blocks
    (``config.block_size`` b): a multiple of b decodes whole attention blocks, a divisor of b decodes an attention
    block in parts (LLaDA2's published generate() takes such a block_length); any other length cuts across them."""
    block = attention_block_size(model)
    if block is None or block_length is None or block % block_length == 0:
        return
    if block_length % block == 0:
        if block_length > block:  # legal, but every forward recomputes the attention blocks before the last
            warnings.warn(
                f"block_length={block_length} spans {block_length // block} attention blocks of this block-causal "
                f"model (model.config.block_size={block}): each forward computes all {block_length} positions, "
                f"where block_length={block} (the default) computes {block} with the exact block cache",
                stacklevel=3,
            )
        return
    divisors = [d for d in range(1, block) if block % d == 0]
    raise ValueError(
        f"block_length={block_length} cuts across the attention blocks of this block-causal model "
        f"(model.config.block_size={block}): pass block_length={block} (the default, leave it unset), a multiple "
        f"of {block} ({2 * block}, {3 * block}, ...) or a divisor of {block} ({', '.join(map(str, divisors))})"
    )


def _fill(config: MaskedDiffusionGenerationConfig, values: dict[str, Any]) -> None:
    """Set the fields ``config`` leaves unset from ``values`` (None values skipped); a reference config takes
    only `MODEL_FIELDS`."""
    complete = config.reference in REFERENCES
    for name, value in values.items():
        if value is not None and config.__dict__.get(name) is None and (not complete or name in MODEL_FIELDS):
            setattr(config, name, value)


def _model_config_values(model: Any, config: MaskedDiffusionGenerationConfig) -> dict[str, Any]:
    """What the model config says about sampling: the schedule it was trained with, its ids and logits shift, and
    for a block-causal model its block length and exact cache (unless ``config``'s sampler keeps no cache)."""
    model_config = getattr(model, "config", None)
    values = {name: getattr(model_config, name, None) for name in TOKEN_ID_FIELDS}
    values.update(schedule=getattr(model_config, "schedule", None), logits_shift=logits_shift_of(model))
    facts = facts_of(model)
    block = attention_block_size(model)
    if facts is not None and config.remdm is None and config.draft_length is None:  # those name their own sampler
        family = facts.sampler_defaults(config.__dict__.get("transfer"), config.__dict__.get("strategy"))
        if block is None:  # made bidirectional (config.block_size=None): no attention blocks to fill
            family.pop("whole_blocks", None)
        values.update(family)
    if block is not None:
        values["block_length"] = block
        if supports_kv_cache(model) and config.transfer != SPECULATIVE:
            values["kv_cache"] = "prefix"
    return values
