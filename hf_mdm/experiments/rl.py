"""Experiment: what few-step correctness costs a policy trained for it (GRPO, `hf_mdm.rl`; Theorem 4.4).

Theorem 4.4: for the language's own distribution, a low sequence error rate needs the steps N to grow with the
length L. A policy trained with reinforcement learning for correctness at few steps can escape that only by moving
away from the language's distribution. ``rl_vs_steps`` measures how far: the trained MDM of a language at
``length`` (the models ``ser_vs_steps`` trains at L = 16 are reused), fine-tuned with GRPO (reward 1 when the sample
is in the language) on rollouts of the paper's sampler at each N of ``rl_steps`` (default: every N of
``rollout_steps``), one run per seed of ``seeds`` and estimator, at the KL coefficient ``grpo.beta``; the KL sweep
``kl_sweep`` (one language, estimator and N) adds runs at each of its ``betas``. Before and after, at every N of
``rollout_steps``:

- the SER of ``num_samples`` samples (95% Wilson interval), and the share of distinct samples;
- the paper's TER at the rollout N: sequences of the language scored by the policy's sampler law (`ter_cells`):
  how much of the language the policy still covers;

and the trained AR model beside it (SER, distinct share, exact TER); each run's reward curve is kept. The table,
figure and sentences are `rl_report`'s. Writes ``rl.{json,md,png}``; cells are cached in ``<out>/cache/rl.json``.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..likelihood_law import RevealLaw
from .common import (
    CellCache,
    experiment_result,
    language_name,
    lazy_pair,
    make_language,
    sample_ar,
    sample_mdm,
    write_outputs,
)
from .rl_report import plot_rl, rl_steps, rl_table
from .ser import ser_cell
from .ter_cells import ar_ter_cell, sampler_ter_cell

#: The rollouts' sampler: the paper's (stochastic transfer, random order, linear schedule), temperature 1.
PAPER_ROLLOUT = {"transfer": "stochastic", "strategy": "random", "schedule": "linear"}
TER_SEED = 7


def rl_vs_steps(scale: dict, out: Path) -> dict[str, Any]:
    """Run (or resume) the experiment with ``scale`` and write its outputs into ``out``; returns the JSON dict."""
    cache = CellCache(out / "cache" / "rl.json")
    rows = []
    for spec in scale["languages"]:
        rows += language_rows(spec, scale, out, cache)
    result = experiment_result("rl", scale, rows)
    write_outputs(out, "rl", result, rl_table(rows, scale), lambda path: plot_rl(rows, scale, path))
    return result


def language_rows(spec: dict, scale: dict, out: Path, cache: CellCache) -> list[dict]:
    """The AR row, the trained MDM before RL, and one row per (rollout N, seed) after RL, for one language."""
    language, name, length = make_language(spec), language_name(spec), scale["length"]
    pair = lazy_pair(language, length, scale, out, name, spec.get("training"))
    grpo = scale["grpo"]
    base = {"language": name, "length": length}
    rows = [
        {
            **base,
            "model": "trained AR",
            **cache.get(f"ar|{name}|{length}", lambda: ar_cell(pair()["ar"], language, scale)),
        }
    ]
    before = cache.get(
        f"before|{name}|{length}", lambda: measure(pair()["mdm"], language, scale, scale["rollout_steps"])
    )
    rows.append({**base, "model": "MDM before RL", **before})
    for estimator, steps, beta, seed in runs(scale, name):
        settings = sorted({**grpo, "estimators": estimator, "beta": beta}.items())
        key = f"after|{name}|{length}|{steps}|{seed}|{settings}"
        cell = cache.get(key, lambda: after_cell(pair()["mdm"], language, scale, (estimator, steps, beta), seed))
        rows.append({**base, "model": "MDM after RL", "estimator": estimator, "rollout_steps": steps, "beta": beta,
                     "seed": seed, **cell})  # fmt: skip
    return rows


def runs(scale: dict, name: str) -> list[tuple[str, int, float, int]]:
    """The GRPO runs of language ``name`` as (estimator, rollout N, beta, seed): every estimator and N of
    ``rl_steps`` at ``grpo.beta``, then the KL sweep's betas where it names this language."""
    beta, seeds = float(scale["grpo"].get("beta", 0.0)), scale["seeds"]
    grid = [(e, n, beta, s) for e in scale["grpo"]["estimators"] for n in rl_steps(scale) for s in seeds]
    sweep = scale.get("kl_sweep")
    if sweep and sweep["language"] == name:
        grid += [(sweep["estimator"], sweep["rollout_steps"], float(b), s) for b in sweep["betas"] for s in seeds]
    return list(dict.fromkeys(grid))


def after_cell(model: Any, language: Any, scale: dict, setting: tuple, seed: int) -> dict[str, Any]:
    """GRPO from a copy of ``model`` with ``setting`` = (estimator, rollout N, beta), then its measures (TER at that
    N only) and its reward curve."""
    policy, rewards = grpo_policy(model, language, scale, setting, seed)
    return {**measure(policy, language, scale, [setting[1]], seed=seed), "rewards": rewards}


def grpo_policy(model: Any, language: Any, scale: dict, setting: tuple, seed: int) -> tuple[Any, list[float]]:
    """A copy of ``model`` trained with GRPO (reward: the sample is in ``language``) with ``setting`` = (estimator,
    rollout N of the paper's sampler, beta); returns it and the mean reward at each logged step."""
    from ..rl.language_task import language_prompts, language_tokenizer
    from ..rl.rewards import language_membership
    from ..rl.trainer import DiffusionGRPOConfig, grpo_trainer

    grpo, (estimator, steps, beta) = scale["grpo"], setting
    policy = copy.deepcopy(model).train()
    with tempfile.TemporaryDirectory() as folder:
        args = DiffusionGRPOConfig(
            output_dir=folder, per_device_train_batch_size=grpo["batch_size"], num_generations=grpo["num_generations"],
            max_completion_length=scale["length"], max_steps=grpo["max_steps"], learning_rate=grpo["learning_rate"],
            beta=beta, estimator=estimator,
            rollout={"steps": steps, **PAPER_ROLLOUT}, bf16=False, use_cpu=not torch.cuda.is_available(),
            save_strategy="no", report_to=[], disable_tqdm=True, logging_steps=1, seed=seed,
            lr_scheduler_type="constant",
        )  # fmt: skip
        rows = grpo["max_steps"] * grpo["batch_size"] // grpo["num_generations"]
        trainer = grpo_trainer(
            policy, language_membership(language), language_prompts(rows), args, language_tokenizer(language.vocab_size)
        )
        trainer.train()
        rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return policy.eval(), rewards


def measure(model: Any, language: Any, scale: dict, ter_steps: list[int], seed: int = 0) -> dict[str, Any]:
    """SER (with its interval) and the distinct share at every rollout N, and the paper's TER at ``ter_steps``."""
    length, num = scale["length"], scale["num_samples"]
    cell: dict[str, Any] = {}
    for steps in scale["rollout_steps"]:
        samples = sample_mdm(model, num, length, steps, seed=1000 + seed)
        cell[f"n{steps}"] = {**ser_cell(language, samples), "distinct": distinct_share(samples)}
        if steps in ter_steps:
            cell[f"n{steps}"].update(
                sampler_ter_cell(
                    model, language, RevealLaw(steps), length, scale["ter_samples"], scale["ter_particles"], TER_SEED
                )  # fmt: skip
            )
    return cell


def ar_cell(model: Any, language: Any, scale: dict) -> dict[str, Any]:
    samples = sample_ar(model, scale["num_samples"], scale["length"], seed=1)
    ter = ar_ter_cell(model, language, scale["length"], scale["ter_samples"], TER_SEED)
    return {"ar": {**ser_cell(language, samples), "distinct": distinct_share(samples), **ter}}


def distinct_share(samples: torch.Tensor) -> float:
    """The share of distinct rows among ``samples`` (B, L)."""
    return torch.unique(samples, dim=0).shape[0] / samples.shape[0]
