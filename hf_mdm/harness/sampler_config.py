"""lm-eval model arguments and request kwargs -> the `MaskedDiffusionGenerationConfig` of a request.

The ``hf_mdm`` model samples with one of two samplers, chosen by the model argument ``reference``:

- ``none``: hf_mdm's sampler; every `MaskedDiffusionGenerationConfig` field is a model argument, on top of the
  checkpoint's generation config, and a request's ``--gen_kwargs`` override them;
- ``llada`` / ``dream``: the reference sampler of that family, built with `MaskedDiffusionGenerationConfig.llada`
  / `.dream` from the settings the reference has (`hf_mdm.generation_reference.REFERENCE_ARGS`, the sampler's
  own table) and the reference's defaults (one block, one token per step); a setting it lacks is a ValueError;
- ``auto`` (default): the checkpoint generation config's ``reference`` if set, else the reference the model's family
  declares (`hf_mdm.families`: ``llada`` for LLaDA, ``dream`` for Dream), else ``none``.

Model arguments ``temperature``, ``top_k`` and ``top_p`` win over a request's (lm-eval tasks always send
temperature 0). A run's ``--gen_kwargs`` are checked by name before any request (`check_gen_kwargs`): a key no
sampler has is a ValueError, where a task's own generation kwargs that are no sampler setting are ignored with a
warning. Every check and table here is the sampler's own (`hf_mdm.generation_reference`); this module only
maps lm-eval's names onto them.
"""

from __future__ import annotations

import copy
import difflib
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ..families import facts_of
from ..generation import MaskedDiffusionGenerationConfig
from ..generation_config import DIFFUSION_FIELDS
from ..generation_presets import preset_config
from ..generation_reference import (
    REFERENCE_ARGS,
    REFERENCE_ONLY_ARGS,
    REFERENCE_TOKEN_ARGS,
    check_llada_lengths,
)

logger = logging.getLogger(__name__)

REFERENCE_CHOICES = ("auto", "llada", "dream", "none")
LM_EVAL_ONLY_KWARGS = ("do_sample",)  # request kwargs that are not sampler settings
LM_EVAL_REQUEST_KWARGS = ("until", "max_gen_toks", *LM_EVAL_ONLY_KWARGS)  # taken by lm-eval's side of a request
SAMPLING_FIELDS = frozenset({"temperature", "top_k", "top_p", "eos_token_id", "pad_token_id"})
EXPLICIT_WINS = frozenset({"temperature", "top_k", "top_p"})  # model arguments that win over a request's value
RUN_ARGS = ("compile_forward", "batch_invariant")  # how the model runs, not how it samples: every sampler takes them
_REFERENCE_NAMES = {"llada": "LLaDA's generate()", "dream": "Dream's diffusion_generate()"}


def diffusion_fields() -> frozenset[str]:
    """Fields of `MaskedDiffusionGenerationConfig` that a plain `transformers.GenerationConfig` does not have."""
    return frozenset(DIFFUSION_FIELDS)


def sampler_fields() -> frozenset[str]:
    """Every model argument / request kwarg that is a sampler setting (``reference`` is chosen on its own)."""
    return (diffusion_fields() | SAMPLING_FIELDS) - {"reference"}


def canonical_reference(value: Any) -> str:
    """``value`` as one of `REFERENCE_CHOICES` (lm-eval parses ``reference=none`` in --model_args to None)."""
    name = "none" if value is None else str(value).strip().lower()
    if name not in REFERENCE_CHOICES:
        raise ValueError(f"unknown reference {value!r}: use one of {list(REFERENCE_CHOICES)}")
    return name


def resolve_reference(choice: str, generation_config: Any, model: Any) -> str:
    """The sampler ``reference=auto`` stands for (see the module docstring); other choices stay."""
    if choice != "auto":
        return choice
    saved = getattr(generation_config, "reference", None)
    if saved in REFERENCE_ARGS:
        return saved
    facts = facts_of(model)
    return facts.reference if facts is not None and facts.reference is not None else "none"


def foreign_message(reference: str, names: Sequence[str], what: str) -> str:
    return (
        f"{what}: reference={reference} runs {_REFERENCE_NAMES[reference]}, which has no {', '.join(names)} (its "
        f"settings: {', '.join(REFERENCE_ARGS[reference] + REFERENCE_TOKEN_ARGS)}). Pass reference=none to sample "
        f"with hf_mdm's own sampler and its settings (transfer, strategy, schedule, ...), or drop {', '.join(names)}"
    )


def check_reference_args(reference: str, overrides: dict[str, Any], how: str) -> None:
    """Model arguments that are sampler settings the reference does not have: a ValueError naming them."""
    foreign = sorted(set(overrides) - set(REFERENCE_ARGS[reference] + REFERENCE_TOKEN_ARGS + RUN_ARGS))
    if foreign:
        given = ", ".join(f"{name}={overrides[name]!r}" for name in foreign)
        raise ValueError(
            foreign_message(reference, foreign, f"model argument(s) {given} with reference={reference} ({how})")
        )


def check_no_reference_args(overrides: dict[str, Any], model_type: Optional[str]) -> None:
    """hf_mdm's sampler ignores the reference samplers' own settings: refuse them instead of ignoring them."""
    given = sorted(set(overrides) & {name for args in REFERENCE_ONLY_ARGS.values() for name in args})
    if given:
        owners = sorted({r for name in given for r, args in REFERENCE_ONLY_ARGS.items() if name in args})
        raise ValueError(
            f"{', '.join(given)}: setting(s) of reference={' / '.join(owners)}, but this model samples with "
            f"reference=none (hf_mdm's sampler; reference=auto picks none for model_type {model_type!r}): pass "
            f"reference={owners[0]} to sample as that reference, or use hf_mdm's strategy= / transfer= settings"
        )


def request_kwargs(reference: str = "auto") -> list[str]:
    """The generation kwargs a request takes with sampler ``reference``: lm-eval's own (``until``,
    ``max_gen_toks``, ``do_sample``) and the settings of that sampler (of every sampler for ``auto``)."""
    if reference in REFERENCE_ARGS:
        settings = set(REFERENCE_ARGS[reference] + REFERENCE_TOKEN_ARGS + RUN_ARGS)
    else:
        settings = set(sampler_fields())
    return sorted(settings | set(LM_EVAL_REQUEST_KWARGS))


def check_gen_kwargs(gen_kwargs: Mapping[str, Any], reference: str = "auto", where: str = "--gen_kwargs") -> None:
    """Generation kwargs given for a run (``where``), before any request: a key no sampler has is a ValueError
    naming it, the nearest accepted key and every accepted one; a setting of hf_mdm's sampler that the reference
    sampler lacks is the ValueError that says to pass ``reference=none``."""
    accepted = request_kwargs(reference)
    for key, value in gen_kwargs.items():
        if key in accepted or reference == "llada" and _neutral_top(key, value):
            continue
        if key in sampler_fields():
            raise ValueError(foreign_message(reference, [key], f"{where} {key}={value!r}"))
        near = difflib.get_close_matches(key, accepted, n=1, cutoff=0.6)
        raise ValueError(
            f"unknown generation kwarg {key!r} in {where} for --model hf_mdm"
            + (f" (did you mean {near[0]!r}?)" if near else "")
            + f": with reference={reference} a request takes {', '.join(accepted)}"
        )


def check_model_args(kwargs: dict[str, Any], **own: Any) -> None:
    """The ``hf_mdm`` model's own arguments (``max_gen_toks``, ``mc_num``, ``greedy_check``, ``seed``,
    ``per_request_seeds``): a ValueError naming the argument, before anything is loaded."""
    rules = {
        "max_gen_toks": (lambda v: v is None or _is_int(v) and v >= 1, "an integer >= 1 (or unset)"),
        "mc_num": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
        "greedy_check": (lambda v: isinstance(v, bool), "True or False"),
        "seed": (lambda v: v is None or _is_int(v), "an integer (or unset: lm-eval's --seed)"),
        "per_request_seeds": (lambda v: isinstance(v, bool), "True or False"),
    }
    for name, value in own.items():
        valid, expected = rules[name]
        if not valid(value):
            raise ValueError(f"model argument {name} must be {expected}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _neutral_top(key: str, value: Any) -> bool:
    """A top_k / top_p that keeps every token (None, top_k 0, top_p 1)."""
    if key == "top_k":
        return value is None or value == 0
    return key == "top_p" and (value is None or float(value) >= 1.0)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r} (model argument or --gen_kwargs {name}=...)")
    return value


@dataclass
class RequestConfigs:
    """Builds each request's config from the model's settings.

    ``base``: the resolved generation config (checkpoint config + model arguments, token ids filled in);
    ``overrides``: the sampler settings given as model arguments; ``stop_ids``: EOS ids generations are cut at;
    ``pad_token_id``: the tokenizer's (left padding)."""

    reference: str
    base: MaskedDiffusionGenerationConfig
    overrides: dict[str, Any]
    stop_ids: list[int]
    pad_token_id: Optional[int]
    ignored: set[str] = field(default_factory=set)

    @property
    def explicit(self) -> dict[str, Any]:
        return {k: v for k, v in self.overrides.items() if k in EXPLICIT_WINS}

    def __call__(self, max_gen_toks: int, kwargs: dict) -> MaskedDiffusionGenerationConfig:
        if self.reference in REFERENCE_ARGS:
            return self._reference_config(max_gen_toks, kwargs)
        config = copy.deepcopy(self.base)
        config.max_new_tokens = max_gen_toks
        config.return_dict_in_generate = True
        for key, value in self._request_kwargs(kwargs).items():
            if key not in sampler_fields():
                self._ignore(key, "is not a sampler setting")
                continue
            setattr(config, key, value)
        config.validate_diffusion()
        return config

    def _request_kwargs(self, kwargs: dict) -> dict[str, Any]:
        """The request's kwargs that apply: lm-eval's own and those an explicit model argument wins over dropped."""
        return {k: v for k, v in kwargs.items() if k not in LM_EVAL_ONLY_KWARGS and k not in self.explicit}

    def _ignore(self, key: str, why: str) -> None:
        if key not in self.ignored:
            self.ignored.add(key)
            logger.warning("hf_mdm: generation kwarg %r %s; ignored", key, why)

    def _reference_config(self, max_gen_toks: int, kwargs: dict) -> MaskedDiffusionGenerationConfig:
        """The reference's preset (`MaskedDiffusionGenerationConfig.llada` / `.dream`, through `preset_config`) from
        the model arguments of the reference, the request's kwargs of the reference, the reference's defaults;
        generations padded after the first EOS."""
        values = self._reference_values(kwargs)
        settings = {
            **values,
            "steps": _positive_int("steps", values.get("steps", max_gen_toks)),
            "eos_token_id": values.get("eos_token_id") or self.stop_ids or None,
            "pad_token_id": values.get("pad_token_id", self.pad_token_id),
            "stop_at_eos": True,
            "return_dict_in_generate": True,
        }
        mask_id = settings.pop("mask_token_id", self.base.mask_token_id)
        if self.reference == "llada":
            settings["block_length"] = _positive_int("block_length", settings.get("block_length", max_gen_toks))
            check_llada_lengths(
                max_gen_toks,
                settings["steps"],
                settings["block_length"],
                length_name="max_gen_toks",
                length_note=" (the max_gen_toks model argument, else the task's)",
                where=" (model argument or --gen_kwargs)",
            )
        settings["mask_id" if self.reference == "llada" else "mask_token_id"] = mask_id
        config = preset_config(MaskedDiffusionGenerationConfig, self.reference, max_gen_toks, settings)
        config.update(**settings)  # the settings the preset does not name (pad_token_id, stop_at_eos, ...)
        return config

    def _reference_values(self, kwargs: dict) -> dict[str, Any]:
        """The reference's settings: model arguments, then the request's kwargs of the reference (None dropped)."""
        allowed = REFERENCE_ARGS[self.reference] + REFERENCE_TOKEN_ARGS + RUN_ARGS
        values = {k: v for k, v in self.overrides.items() if k in allowed}
        for key, value in self._request_kwargs(kwargs).items():
            if key in allowed:
                values[key] = value
            elif self.reference == "llada" and _neutral_top(key, value):
                continue  # an autoregressive task's top_k / top_p that filters nothing: nothing to apply
            elif key in sampler_fields():
                raise ValueError(
                    foreign_message(self.reference, [key], f"the request's generation kwarg {key}={value!r}")
                )
            else:
                self._ignore(key, f"is not a setting of reference={self.reference}")
        return {k: v for k, v in values.items() if v is not None}
