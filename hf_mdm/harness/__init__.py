"""hf_mdm's lm-eval harness: timed models, GSM8K / MBPP / HumanEval tasks, sandboxed code execution.

Four lm-eval models, registered when `hf_mdm.harness.models` is imported (which `simple_evaluate`, the
``hf-mdm-eval`` CLI, ``hf-mdm compare`` and the names below do):

- ``hf_mdm``: any masked diffusion checkpoint, sampled by `hf_mdm.generation.diffusion_generate` (every sampler
  setting is a model argument) and scored by its Monte Carlo ELBO (`MaskedDiffusionLM`);
- ``hf_timed``: lm-eval's HF causal LM with the same per-request timing (`TimedHFLM`);
- ``hf_diffusion_gemma``: transformers' DiffusionGemma through its own ``generate``, timed the same way
  (`DiffusionGemmaLM`);
- ``hf_diffusers``: diffusers' ``LLaDA2Pipeline`` on a LLaDA2.x checkpoint, timed the same way
  (`DiffusersPipelineLM`).

lm-eval has no plugin discovery, so ``hf-mdm-eval`` (and ``python -m hf_mdm.harness``) is lm-eval's own CLI with
these models and hf_mdm's task directory registered (tasks ``mdm_gsm8k``, ``mdm_gsm8k_chain``, ``mdm_mbpp``,
``mdm_humaneval``; see ``tasks/README.md``); in Python, `simple_evaluate` is ``lm_eval.simple_evaluate`` with the
same additions. Results carry the timing of every request (`hf_mdm.harness.timing`). ``hf-mdm compare``
(`hf_mdm.harness.compare`) runs a matrix of models, settings and tasks and plots accuracy against time.

Names are imported lazily, so that ``hf_mdm.harness.sandbox``, ``.arithmetic`` and ``.compare`` load without
lm-eval's model code.
"""

from importlib import import_module
from typing import Any

_LAZY = {
    "TASKS_DIR": "evaluator",
    "build_task_manager": "evaluator",
    "create_lm": "evaluator",
    "simple_evaluate": "evaluator",
    "task_names": "evaluator",
    "DiffusersPipelineLM": "models",
    "DiffusionGemmaLM": "models",
    "MaskedDiffusionLM": "models",
    "TimedHFLM": "models",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'hf_mdm.harness' has no attribute {name!r}")
