"""Reinforcement learning for masked diffusion LMs through TRL's GRPO (`hf-mdm grpo`).

- `hf_mdm.rl.trainer`: `DiffusionGRPOTrainer` (TRL's `GRPOTrainer` with rollouts by hf_mdm's ``generate`` and
  per-token log-likelihood estimators) and `DiffusionGRPOConfig`;
- `hf_mdm.rl.trl_fence`: the one module that reaches into TRL's trainer (the private hooks it overrides, the
  reference it swaps, why), checked against the installed TRL;
- `hf_mdm.rl.estimators`: the estimators (d1's one-step, DiffuCoder's coupled masks, the Monte Carlo ELBO, the
  rollouts' own decoding law) and their exact expectations on small cases;
- `hf_mdm.rl.rewards`: rewards built in (membership in a synthetic language, GSM8K correctness, code that passes
  its tests in the sandbox);
- `hf_mdm.rl.language_task`: a synthetic language as a GRPO task (tokenizer, prompts).

TRL is the optional ``rl`` extra (``pip install 'hf-mdm[rl]'``); importing `hf_mdm.rl.trainer` without it raises
an ImportError that says so.
"""

from .estimators import ESTIMATORS, LogLikelihoodEstimator, build_estimator, exact_expectation
from .rewards import code_passes, gsm8k_correct, language_membership

__all__ = [
    "ESTIMATORS",
    "LogLikelihoodEstimator",
    "build_estimator",
    "exact_expectation",
    "code_passes",
    "gsm8k_correct",
    "language_membership",
]
