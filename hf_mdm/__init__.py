"""hf_mdm: masked diffusion language models for the Hugging Face ecosystem.

Importing ``hf_mdm`` registers ``MDMConfig`` / ``MDMForMaskedDiffusion`` with the transformers Auto
classes. Everything else is imported lazily, so ``import hf_mdm`` stays cheap.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "MDMConfig": "configuration_mdm",
    "MDMForMaskedDiffusion": "modeling_mdm",
    "get_schedule": "schedules",
    "MaskedDiffusionGenerationConfig": "generation",
    "MaskedDiffusionGenerateOutput": "generation",
    "MaskedDiffusionGenerationMixin": "generation",
    "diffusion_generate": "generation",
    "NGramLanguage": "languages",
    "HMMLanguage": "languages",
    "ChainLanguage": "languages",
    "OracleDenoiser": "languages",
    "load_language": "languages",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'hf_mdm' has no attribute {name!r}")


def _register_auto_classes() -> None:
    """Make AutoConfig / AutoModel / AutoModelForMaskedLM pick hf_mdm's classes for ``model_type="hf_mdm"``.

    Done here rather than in ``modeling_mdm.py``: that file is also executed as exported remote code, where
    registering would shadow the installed classes.
    """
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

    from .configuration_mdm import MDMConfig
    from .modeling_mdm import MDMForMaskedDiffusion, MDMModel

    AutoConfig.register(MDMConfig.model_type, MDMConfig, exist_ok=True)
    AutoModel.register(MDMConfig, MDMModel, exist_ok=True)
    AutoModelForMaskedLM.register(MDMConfig, MDMForMaskedDiffusion, exist_ok=True)
    from . import models  # noqa: F401  (registers the native LLaDA and Dream classes)


import_module(".quantization", __name__).quiet_import_noise()  # before transformers imports torchao
_register_auto_classes()
