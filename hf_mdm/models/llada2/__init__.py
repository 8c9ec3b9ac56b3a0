"""LLaDA2.0 and LLaDA2.1 (inclusionAI, block-diffusion mixtures of experts) as native transformers classes."""

from .configuration_llada2 import LLaDA2MoeConfig, LLaDA21MoeConfig
from .modeling_llada2 import LLaDA2MoeModel, LLaDA2MoeModelLM, LLaDA2MoePreTrainedModel, LLaDA21MoeModelLM

__all__ = [
    "LLaDA21MoeConfig",
    "LLaDA21MoeModelLM",
    "LLaDA2MoeConfig",
    "LLaDA2MoeModel",
    "LLaDA2MoeModelLM",
    "LLaDA2MoePreTrainedModel",
]
