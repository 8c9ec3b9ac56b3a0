"""lm-eval models, registered on import: ``hf_mdm`` (masked diffusion LMs), ``hf_timed`` (lm-eval's HF causal LM),
``hf_diffusion_gemma`` (transformers' DiffusionGemma through its own generate) and ``hf_diffusers`` (diffusers'
LLaDA2Pipeline; diffusers is an optional dependency, imported when the model is built).

All four subclass lm-eval's `HFLM`, so loading (``pretrained``, ``dtype``, ``device``, ``trust_remote_code``,
``parallelize``, ``peft``, ...), tokenisation, chat templates and data parallelism under ``accelerate launch``
are lm-eval's own, and all are timed per request (`hf_mdm.harness.timing`). The pieces:

- `hf_mdm.harness.timed`: the shared ``generate_until`` (batching, stop strings, timing) and ``hf_timed``;
- `hf_mdm.harness.mdm`: ``hf_mdm`` (`MaskedDiffusionLM`): sampling with `hf_mdm.generation.diffusion_generate`,
  ``loglikelihood`` with `hf_mdm.likelihood`;
- `hf_mdm.harness.sampler_config`: model arguments and request kwargs -> the sampler's config;
- `hf_mdm.harness.diffusion_gemma`: ``hf_diffusion_gemma`` (`DiffusionGemmaLM`);
- `hf_mdm.harness.diffusers_pipelines`: ``hf_diffusers`` (`DiffusersPipelineLM`).
"""

from .diffusers_pipelines import DiffusersPipelineLM
from .diffusion_gemma import DiffusionGemmaLM
from .mdm import MaskedDiffusionLM
from .timed import StopStringCriteria, TimedGeneration, TimedHFLM, tokens_until_stop

__all__ = [
    "DiffusersPipelineLM",
    "DiffusionGemmaLM",
    "MaskedDiffusionLM",
    "TimedHFLM",
    "TimedGeneration",
    "StopStringCriteria",
    "tokens_until_stop",
]
