"""Native classes for the published masked diffusion checkpoints LLaDA and Dream, registered with the Auto classes.

Importing this package registers

    model_type "llada" -> LLaDAConfig, LLaDAModelLM   (GSAI-ML/LLaDA-8B-Base, -Instruct)
    model_type "Dream" -> DreamConfig, DreamModel     (Dream-org/Dream-v0-Base-7B, -Instruct-7B)
    model_type "llada2_moe" -> LLaDA2MoeConfig, LLaDA2MoeModelLM    (inclusionAI/LLaDA2.0-mini, -flash, CAP)
    model_type "llada21_moe" -> LLaDA21MoeConfig, LLaDA21MoeModelLM (inclusionAI/LLaDA2.1-mini, -flash)

with ``AutoConfig``, ``AutoModel`` and ``AutoModelForMaskedLM`` (LLaDA2.x also with ``AutoModelForCausalLM``, the
Auto class its published ``auto_map`` names), so that

    >>> import hf_mdm.models  # doctest: +SKIP
    >>> model = AutoModel.from_pretrained("GSAI-ML/LLaDA-8B-Base", dtype=torch.bfloat16)  # doctest: +SKIP

loads the checkpoint as published (its ``config.json`` and safetensors shards, unchanged) into these classes,
without running the checkpoint's own code.

The published ``config.json`` files carry an ``auto_map`` that points at the checkpoint's remote code. In
transformers 5 a registered class whose module is outside ``transformers`` counts as "explicit local code" and
wins over ``auto_map``: without ``trust_remote_code`` the native class is used (no prompt, nothing downloaded), and
with ``trust_remote_code=True`` it is used as well, for ``AutoConfig``, ``AutoModel`` and ``AutoModelForMaskedLM``.
The remote code is still what an Auto class that is not registered here resolves to with
``trust_remote_code=True`` (e.g. ``AutoModelForCausalLM``, which the published ``auto_map`` also names); that code
does not run on transformers 5, and without ``trust_remote_code`` that Auto class raises "Unrecognized
configuration class".
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

from .dream import DreamBaseModel, DreamConfig, DreamModel, DreamPreTrainedModel
from .llada import LLaDAConfig, LLaDAModel, LLaDAModelLM, LLaDAPreTrainedModel
from .llada2 import (
    LLaDA2MoeConfig,
    LLaDA2MoeModel,
    LLaDA2MoeModelLM,
    LLaDA2MoePreTrainedModel,
    LLaDA21MoeConfig,
    LLaDA21MoeModelLM,
)


def register_auto_classes() -> None:
    """Register LLaDA, Dream and LLaDA2.x with AutoConfig, AutoModel and AutoModelForMaskedLM, LLaDA2.x also with
    AutoModelForCausalLM (idempotent)."""
    llada2 = ((LLaDA2MoeConfig, LLaDA2MoeModelLM), (LLaDA21MoeConfig, LLaDA21MoeModelLM))
    for config_class, model_class in ((LLaDAConfig, LLaDAModelLM), (DreamConfig, DreamModel), *llada2):
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        AutoModel.register(config_class, model_class, exist_ok=True)
        AutoModelForMaskedLM.register(config_class, model_class, exist_ok=True)
    for config_class, model_class in llada2:
        AutoModelForCausalLM.register(config_class, model_class, exist_ok=True)


register_auto_classes()

__all__ = [
    "DreamBaseModel",
    "DreamConfig",
    "DreamModel",
    "DreamPreTrainedModel",
    "LLaDA21MoeConfig",
    "LLaDA21MoeModelLM",
    "LLaDA2MoeConfig",
    "LLaDA2MoeModel",
    "LLaDA2MoeModelLM",
    "LLaDA2MoePreTrainedModel",
    "LLaDAConfig",
    "LLaDAModel",
    "LLaDAModelLM",
    "LLaDAPreTrainedModel",
    "register_auto_classes",
]
