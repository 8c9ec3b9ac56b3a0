"""What ``hf-mdm serve MODEL`` loads: the model with the auto class its family takes, its tokenizer, and the
generation config it serves with (``--generation-config``; ``--preset`` is a setting of every request,
`hf_mdm.serve.settings.ServeSettings.preset`). What cannot be loaded is a ValueError saying what and why, in one
line (the command's error)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ..families import facts_of
from ..generation import MaskedDiffusionGenerationConfig
from ..generation_presets import PRESET_NAMES

__all__ = ["load_model", "serving_config"]


def load_model(
    name: str,
    dtype: str = "auto",
    device: str = "cpu",
    trust_remote_code: bool = False,
    quantization: Optional[str] = None,
) -> tuple:
    """(model, tokenizer) from a local folder or Hub id: a masked diffusion family with ``AutoModelForMaskedLM``
    (hf_mdm's, LLaDA, Dream, LLaDA2), DiffusionGemma with transformers' ``AutoModelForImageTextToText``, anything
    else as an autoregressive ``AutoModelForCausalLM``; a ValueError naming ``name`` and the reason otherwise.
    ``quantization`` (``"int8"``, ``"int4"``): weight-only through torchao (`hf_mdm.quantization`), the weights
    quantized as they load onto ``device``."""
    try:
        return _load(name, dtype, device, trust_remote_code, quantization)
    except Exception as err:
        raise ValueError(f"cannot load the model {name!r}: {_one_line(err)}") from err


def _load(name: str, dtype: str, device: str, trust_remote_code: bool, quantization: Optional[str]) -> tuple:
    import transformers

    from ..quantization import quantization_config

    quantized = quantization_config(quantization, device)
    extra = {} if quantized is None else {"quantization_config": quantized, "device_map": device}

    config = transformers.AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
    if getattr(config, "model_type", None) == "diffusion_gemma":
        auto = transformers.AutoModelForImageTextToText
    elif facts_of(config) is not None:
        auto = transformers.AutoModelForMaskedLM
    else:
        auto = transformers.AutoModelForCausalLM
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    model = auto.from_pretrained(name, dtype=torch_dtype, trust_remote_code=trust_remote_code, **extra)
    model = model.eval() if quantized is not None else model.to(device).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    return model, tokenizer


def serving_config(
    preset: Optional[str], generation_config: Optional[str]
) -> Optional[MaskedDiffusionGenerationConfig]:
    """The config requests start from: a saved generation config (a JSON file or a folder holding
    ``generation_config.json``, e.g. ``hf-mdm tune``'s), or None (the checkpoint's own, or the ``preset``'s, which
    is built for each request from its length and settings). Checks ``preset``'s name."""
    if preset and generation_config:
        raise ValueError("pass --preset or --generation-config, not both")
    if preset and preset not in PRESET_NAMES:
        raise ValueError(f"--preset {preset!r}: one of {list(PRESET_NAMES)}")
    if not generation_config:
        return None
    path = Path(generation_config)
    if not path.exists():
        raise ValueError(f"--generation-config {generation_config}: no such file or folder")
    try:
        if path.is_file():
            return MaskedDiffusionGenerationConfig.from_pretrained(str(path.parent), config_file_name=path.name)
        return MaskedDiffusionGenerationConfig.from_pretrained(str(path))
    except Exception as err:
        raise ValueError(f"--generation-config {generation_config}: {_one_line(err)}") from err


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
