"""Loading a checkpoint for any hf_mdm command: the model with the class its family takes, its tokenizer and its
family's facts (`hf_mdm.families`), with one set of refusals, said before the weights load.

A checkpoint is of one of three kinds (`checkpoint_kind`), read from its config alone: ``"masked"`` (a registered
masked diffusion family with a [MASK] id: hf_mdm's MDM, LLaDA, Dream, LLaDA2.x), ``"uniform"`` (a family whose noise
is random tokens, not [MASK]: transformers' DiffusionGemma) or ``"autoregressive"`` (anything else). `auto_class`
is the transformers Auto class each kind loads with, `require_kind` the refusal of a checkpoint of the wrong kind
(an autoregressive Llama or Qwen2 asked for diffusion work is pointed to ``hf-mdm a2d``; DiffusionGemma asked for
masked diffusion work is told its noise is uniform), and `load_pretrained` does all of it: serve, sft, grpo, sample,
tune and the lm-eval models (`hf_mdm.harness`) load through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .families import DiffusionFacts, facts_of

__all__ = [
    "KINDS",
    "Pretrained",
    "auto_class",
    "check_tokenizer",
    "checkpoint_kind",
    "load_pretrained",
    "one_line",
    "require_kind",
]

#: The kinds of checkpoint (see the module docstring).
KINDS = ("masked", "uniform", "autoregressive")
#: The masked diffusion families hf_mdm's commands name when they refuse another kind.
MASKED_FAMILIES = "MDM, LLaDA, Dream, LLaDA2.x"
#: The files of which a folder holding a tokenizer has at least one.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


@dataclass(frozen=True)
class Pretrained:
    """What `load_pretrained` returns: the model (eval mode), its tokenizer (None when not asked for), its family's
    facts (None for an autoregressive model) and its kind (one of `KINDS`)."""

    model: Any
    tokenizer: Any
    facts: Optional[DiffusionFacts]
    kind: str


def checkpoint_kind(config: Any) -> str:
    """``"masked"``, ``"uniform"`` or ``"autoregressive"`` for a config (or a model), from its family's facts."""
    facts = facts_of(config)
    if facts is not None and facts.corruption == "uniform":
        return "uniform"
    config = getattr(config, "config", config)
    if facts is not None and getattr(config, "mask_token_id", None) is not None:
        return "masked"
    return "autoregressive"


def auto_class(config: Any, trust_remote_code: bool = False) -> type:
    """The transformers Auto class that loads a checkpoint of ``config``: DiffusionGemma's
    ``AutoModelForImageTextToText``; for a masked diffusion family the first of ``AutoModelForMaskedLM``,
    ``AutoModelForCausalLM`` and ``AutoModel`` that maps its config; with ``trust_remote_code``, the first of them
    that the checkpoint's remote code offers (its ``auto_map``); else ``AutoModelForCausalLM``."""
    import transformers

    if checkpoint_kind(config) == "uniform":
        return transformers.AutoModelForImageTextToText
    names = ("AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModel")
    for name in names if facts_of(config) is not None else ():
        if type(config) in getattr(transformers, name)._model_mapping:
            return getattr(transformers, name)
    auto_map = getattr(config, "auto_map", None) or {}
    for name in names if trust_remote_code else ():
        if name in auto_map:
            return getattr(transformers, name)
    return transformers.AutoModelForCausalLM


def require_kind(
    config: Any, kind: str, name: Optional[str], command: str, flag: str = "--model", hint: str = ""
) -> None:
    """A one-line ValueError, before any weights load, when ``config`` (or a model) is not of ``kind``
    (``"masked"`` or ``"autoregressive"``): ``flag`` and ``name`` name the checkpoint (``--model runs/x``,
    ``pretrained=runs/x``; ``name`` None: a model in memory),
    ``command`` the work asked for (``hf-mdm grpo``), ``hint`` is added at the end (another command that takes
    this kind)."""
    found = checkpoint_kind(config)
    if found == kind:
        return
    what = "the model" if name is None else f"{flag}{'' if flag.endswith('=') else ' '}{name}"
    model_type = getattr(getattr(config, "config", config), "model_type", None)
    if kind == "autoregressive":
        raise ValueError(f"{what} is a {found} diffusion model ({model_type!r}), not an autoregressive one{hint}")
    if found == "uniform":
        raise ValueError(
            f"{what} is a {model_type!r} model, whose noise is uniform random tokens, not [MASK]: {command} works on "
            f"masked diffusion models ({MASKED_FAMILIES}), whose objectives and samplers mask tokens{hint}"
        )
    from .finetune.a2d import CONVERTIBLE

    if model_type in CONVERTIBLE:
        convert = "hf_mdm.finetune.convert_to_mdm (`hf-mdm a2d`)"
        if name is not None:
            convert = f"`hf-mdm a2d --model {name} --output-dir DIR`, then pass DIR"
        raise ValueError(
            f"{what} is an autoregressive {model_type} model (no [MASK] token): {command} works on masked diffusion "
            f"models; convert it first with {convert}{hint}"
        )
    raise ValueError(
        f"{what} (model_type {model_type!r}) has no mask_token_id in its config: {command} works on masked diffusion "
        f"models ({MASKED_FAMILIES}); convert an autoregressive Llama or Qwen2 with `hf-mdm a2d` first, or set "
        f"mask_token_id in its config.json to the tokenizer's [MASK] id{hint}"
    )


def check_tokenizer(name: str, flag: str = "--model") -> None:
    """A ValueError when the local folder ``name`` holds no tokenizer (a Hub id is left to the loading)."""
    folder = Path(name).expanduser()
    if folder.is_dir() and not any((folder / file).exists() for file in TOKENIZER_FILES):
        raise ValueError(
            f"{flag} {name} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): save the tokenizer beside the "
            "model (tokenizer.save_pretrained(FOLDER))"
        )


def load_pretrained(
    name: str,
    *,
    require: Optional[str] = None,
    command: str = "hf-mdm",
    flag: str = "--model",
    hint: str = "",
    tokenizer: bool = True,
    dtype: Any = "auto",
    device: Optional[str] = None,
    trust_remote_code: bool = False,
    quantization: Optional[str] = None,
) -> Pretrained:
    """The checkpoint ``name`` (a local folder or a Hub id) as `Pretrained`. Before the weights load: a mistyped
    local path, a checkpoint not of the kind ``require`` names (`require_kind`, with ``command`` and ``hint`` in
    its words) and, with ``tokenizer``, a local folder without one are ValueErrors naming ``flag``. ``dtype``: a
    torch dtype or its name (``"auto"``: as saved); ``device``: where the model goes (None: where it loads);
    ``quantization`` (``"int8"``, ``"int4"``): weight-only through torchao (`hf_mdm.quantization`), quantized as
    the weights load onto ``device``. A failure of the loading itself is a one-line ValueError naming ``name``."""
    from transformers import AutoConfig

    from .checkpoints import check_local_path

    try:
        check_local_path(name, flag)
        config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
    except Exception as err:
        raise ValueError(f"cannot load the model {name!r}: {one_line(err)}") from err
    if require is not None:
        require_kind(config, require, name, command, flag, hint)
    if tokenizer:
        check_tokenizer(name, flag)
    try:
        return _load(name, config, tokenizer, dtype, device, trust_remote_code, quantization)
    except Exception as err:
        raise ValueError(f"cannot load the model {name!r}: {one_line(err)}") from err


def _load(
    name: str,
    config: Any,
    with_tokenizer: bool,
    dtype: Any,
    device: Optional[str],
    trust_remote_code: bool,
    quantization: Optional[str],
) -> Pretrained:
    import torch
    from transformers import AutoTokenizer

    from .quantization import quantization_config

    quantized = quantization_config(quantization, device or "cpu")
    extra = {} if quantized is None else {"quantization_config": quantized, "device_map": device or "cpu"}
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else dtype
    model = auto_class(config, trust_remote_code).from_pretrained(
        name, dtype=torch_dtype, trust_remote_code=trust_remote_code, **extra
    )
    if device is not None and quantized is None:
        model = model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code) if with_tokenizer else None
    return Pretrained(model.eval(), tokenizer, facts_of(model), checkpoint_kind(model))


def one_line(err: BaseException) -> str:
    """An error's message on one line (its type's name where it has none): what the commands print."""
    return " ".join(str(err).split()) or type(err).__name__
