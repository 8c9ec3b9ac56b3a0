"""What ``hf-mdm serve MODEL`` loads: the model with the auto class its family takes, its tokenizer, and the
generation config it serves with (``--preset`` or ``--generation-config``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ..families import facts_of
from ..generation import MaskedDiffusionGenerationConfig

__all__ = ["load_model", "serving_config"]


def load_model(name: str, dtype: str = "auto", device: str = "cpu", trust_remote_code: bool = False) -> tuple:
    """(model, tokenizer) from a local folder or Hub id: a masked diffusion family with ``AutoModelForMaskedLM``
    (hf_mdm's, LLaDA, Dream, LLaDA2), DiffusionGemma with transformers' ``AutoModelForImageTextToText``, anything
    else as an autoregressive ``AutoModelForCausalLM``."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
    if getattr(config, "model_type", None) == "diffusion_gemma":
        auto = transformers.AutoModelForImageTextToText
    elif facts_of(config) is not None:
        auto = transformers.AutoModelForMaskedLM
    else:
        auto = transformers.AutoModelForCausalLM
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    model = auto.from_pretrained(name, dtype=torch_dtype, trust_remote_code=trust_remote_code).to(device).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    return model, tokenizer


def serving_config(
    preset: Optional[str], generation_config: Optional[str]
) -> Optional[MaskedDiffusionGenerationConfig]:
    """The config requests start from: a preset with its defaults, a saved generation config (a JSON file or a folder
    holding ``generation_config.json``, e.g. ``hf-mdm tune``'s), or None (the checkpoint's own)."""
    if preset and generation_config:
        raise ValueError("pass --preset or --generation-config, not both")
    if generation_config:
        path = Path(generation_config)
        if path.is_file():
            return MaskedDiffusionGenerationConfig.from_pretrained(str(path.parent), config_file_name=path.name)
        return MaskedDiffusionGenerationConfig.from_pretrained(str(path))
    if preset:
        from .engine import PRESETS

        if preset not in PRESETS:
            raise ValueError(f"--preset {preset!r}: one of {list(PRESETS)}")
        try:
            return getattr(MaskedDiffusionGenerationConfig, preset)()
        except TypeError as err:
            raise ValueError(
                f"--preset {preset!r} needs arguments ({err}): save its config with the arguments and pass "
                "--generation-config FILE"
            ) from err
    return None
