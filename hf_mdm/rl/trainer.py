"""GRPO for masked diffusion LMs through TRL: `DiffusionGRPOTrainer` is TRL's `GRPOTrainer` with two parts
replaced, where diffusion differs from autoregression (through `hf_mdm.rl.trl_fence`, which says how), and
everything else TRL's own (rewards and their weights, group advantages, the clipped objective and its loss types,
the KL term against the reference, logging, checkpoints, ``accelerate launch``, PEFT: the reference is the base with
the adapters disabled):

1. Rollouts come from hf_mdm's ``generate`` with a `MaskedDiffusionGenerationConfig` (any preset, cache,
   threshold, block diffusion), its length TRL's ``max_completion_length`` and its temperature TRL's
   ``temperature`` unless the rollout settings name their own. Each rollout batch draws from a seed made of
   ``args.seed``, the global step, the micro-step within it and the process, and its settings, seed and tokens are
   appended to ``<output_dir>/rollouts-<process>.jsonl`` (cut back to the checkpoint's step when a run resumes, so
   the log holds each step once).
2. Per-token log-likelihoods come from a `hf_mdm.rl.estimators` estimator (``one_step``, ``coupled``, ``elbo``,
   ``decoding``), each row's masks drawn from a generator seeded by the row's tokens and the step its rollout was
   drawn at: the old, reference and current log-likelihoods of one rollout use the same masks (the ratio is exactly
   1 before the first update), and each training step draws new ones.

Seeds and masks are functions of the step, not of counters, so a run resumed from a checkpoint draws exactly what
the uninterrupted run drew (when its checkpoints fall where TRL draws new rollouts: every ``num_iterations *
steps_per_generation / gradient_accumulation_steps`` steps). `grpo_trainer` builds one from a model, rewards and a
dataset; `hf-mdm grpo` is its command line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Any, Optional

import torch
from transformers import TrainerCallback
from trl import GRPOConfig

from ..generation_config import MaskedDiffusionGenerationConfig
from ..generation_presets import preset_config
from ..generation_resolve import resolve_config
from ..likelihood import stable_seed
from ..tokens import cut_at_eos, left_pad
from .estimators import (
    ESTIMATORS,
    LogLikelihoodEstimator,
    build_estimator,
    estimator_help,
    estimator_options,
    inner_model,
)
from .rewards import checked_reward
from .trl_fence import FencedGRPOTrainer

__all__ = ["DiffusionGRPOConfig", "DiffusionGRPOTrainer", "grpo_trainer", "rollout_config"]


@dataclasses.dataclass
class DiffusionGRPOConfig(GRPOConfig):
    """TRL's `GRPOConfig` and the diffusion settings: ``estimator`` (a name in
    `hf_mdm.rl.estimators.ESTIMATORS`) with its ``estimator_options``, and the rollouts' ``rollout`` settings
    (`MaskedDiffusionGenerationConfig` fields; ``preset`` names one of its presets). Validated when built, as TRL's
    own settings are: a ValueError names the setting to change."""

    estimator: str = dataclasses.field(default="one_step", metadata={"help": estimator_help()})
    estimator_options: dict = dataclasses.field(default_factory=dict, metadata={"help": "the estimator's options"})
    rollout: dict = dataclasses.field(default_factory=dict, metadata={"help": "generate settings of the rollouts"})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.log_likelihood_estimator(self.generation_config())
        if self.num_iterations > 1 and self.importance_sampling_level == "token":
            if not ESTIMATORS[self.estimator].per_token_log_probs:
                raise ValueError(
                    f"estimator {self.estimator!r} with num_iterations={self.num_iterations}: its per-token terms "
                    "are not log-probabilities (only their sum estimates the log-likelihood), so a per-token ratio "
                    "across updates is not a probability ratio; set importance_sampling_level='sequence' (the "
                    "ratio of the summed estimates) or num_iterations=1"
                )
        period = self.num_iterations * self.steps_per_generation // self.gradient_accumulation_steps
        if self.save_strategy == "steps" and period > 1 and self.save_steps % period:
            warnings.warn(
                f"save_steps={self.save_steps} is not a multiple of {period}, the steps between new rollouts "
                "(num_iterations * steps_per_generation / gradient_accumulation_steps): a run resumed from such a "
                "checkpoint draws new rollouts there, where the uninterrupted run reused its batch",
                stacklevel=2,
            )

    def generation_config(self) -> MaskedDiffusionGenerationConfig:
        """The rollouts' generation config (`rollout_config`)."""
        return rollout_config(self)

    def log_likelihood_estimator(self, rollout: MaskedDiffusionGenerationConfig) -> LogLikelihoodEstimator:
        """The estimator of these settings for rollouts drawn with ``rollout`` (`estimator_options`)."""
        return build_estimator(self.estimator, **estimator_options(self.estimator, self.estimator_options, rollout))


def rollout_config(args: DiffusionGRPOConfig) -> MaskedDiffusionGenerationConfig:
    """The rollouts' generation config: the ``preset`` named in ``args.rollout``, then its other settings;
    ``max_new_tokens`` from ``max_completion_length`` and ``temperature`` from TRL's unless named (the model's own
    defaults fill what is left unset when it generates). Invalid settings raise the errors ``generate`` raises."""
    settings = dict(args.rollout)
    settings.setdefault("max_new_tokens", args.max_completion_length)
    settings.setdefault("temperature", args.temperature)
    settings["do_sample"] = float(settings["temperature"]) > 0
    preset = settings.pop("preset", None)
    if preset is not None:
        length = settings.pop("max_new_tokens")
        try:
            config = preset_config(MaskedDiffusionGenerationConfig, preset, length, settings)
        except ValueError as err:
            raise ValueError(f"rollout settings: {err}") from None
        config.update(**settings)  # the other settings override the preset's
    else:
        config = MaskedDiffusionGenerationConfig(**settings)
    config.validate()
    return config


def rollout_log_path(output_dir: str, process: int) -> str:
    """The rollout log of one process."""
    return os.path.join(output_dir, f"rollouts-{process}.jsonl")


class RolloutLogResume(TrainerCallback):
    """When training begins, cuts the rollout log back to the steps before the one training starts at (all of it
    on a fresh start), so a resumed run's log holds each step once."""

    def __init__(self, path: str):
        self.path = path

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="utf-8") as handle:
            kept = [line for line in handle if line.strip() and json.loads(line)["step"] < state.global_step]
        with open(self.path, "w", encoding="utf-8") as handle:
            handle.writelines(kept)


class DiffusionGRPOTrainer(FencedGRPOTrainer):
    """TRL's `GRPOTrainer` for hf_mdm's masked diffusion classes (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rollout_generation_config = self.args.generation_config()
        model = inner_model(self.model)
        resolved = resolve_config(model, self.rollout_generation_config, {})  # what generate runs with
        self.estimator = self.args.log_likelihood_estimator(resolved)
        self.estimator.check_model(model)
        if self.args.output_dir:
            self.add_callback(RolloutLogResume(rollout_log_path(self.args.output_dir, self.accelerator.process_index)))

    def rollout_seed(self, salt: str) -> int:
        """A 31-bit seed from ``args.seed``, the `rollout_key` (step, micro-step, mode), the process and ``salt``."""
        step, micro, mode = self.rollout_key()
        return stable_seed(self.args.seed, [step, micro, self.accelerator.process_index], [mode, salt]) % (2**31)

    def generate_rollouts(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        """Completions of the (already repeated) prompts by hf_mdm's ``generate``; each cut after its first EOS."""
        device = self.accelerator.device
        ids, mask = left_pad(prompt_ids, self.processing_class.pad_token_id)
        seed = self.rollout_seed("rollout")
        model = self.accelerator.unwrap_model(self.model)
        with torch.no_grad():
            out = model.generate(
                ids.to(device), attention_mask=mask.to(device), generation_config=self.rollout_generation_config,
                seed=seed,
            )  # fmt: skip
        completions = [cut_at_eos(row, self.eos_token_ids) for row in out[:, ids.shape[1] :].tolist()]
        self._record(seed, prompt_ids, completions)
        return completions

    def _record(self, seed: int, prompt_ids: list, completions: list) -> None:
        """One JSON line per rollout batch: step, seed, the generation settings, prompts' and completions' ids."""
        if not self.args.output_dir:
            return
        os.makedirs(self.args.output_dir, exist_ok=True)
        line = {
            "step": self.state.global_step,
            "seed": seed,
            "settings": self.rollout_generation_config.to_diff_dict(),
            "estimator": {"name": self.estimator.name, **dataclasses.asdict(self.estimator)},
            "prompt_ids": [list(p) for p in prompt_ids],
            "completion_ids": completions,
        }
        path = rollout_log_path(self.args.output_dir, self.accelerator.process_index)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")

    def log_likelihoods(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion: int, batch_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The estimator's (B, C) per-token log-likelihoods of the last ``completion`` columns (and the token law's
        entropies), in chunks of ``batch_size`` rows; every row's masks seeded by its tokens and the step."""
        logps, entropies = [], []
        for start in range(0, input_ids.shape[0], batch_size):
            rows = input_ids[start : start + batch_size]
            generators = [self.row_generator(row, attention_mask[start + i]) for i, row in enumerate(rows)]
            with self.accelerator.autocast():
                logp, entropy = self.estimator.per_token(
                    model, rows, attention_mask[start : start + batch_size], completion, generators,
                    float(self.rollout_generation_config.temperature or 1.0),
                )  # fmt: skip
            logps.append(logp)
            entropies.append(entropy)
        return torch.cat(logps), torch.cat(entropies)

    def row_generator(self, row: torch.Tensor, mask: torch.Tensor) -> torch.Generator:
        """The generator of one row's masks: seeded by its tokens and the step its rollouts were drawn at
        (`scored_key`: the same for the old, reference and current policy, new with each rollout batch)."""
        tokens = row[mask.bool()].tolist()
        return torch.Generator().manual_seed(stable_seed(self.args.seed, tokens, list(self.scored_key())) % (2**63))


def grpo_trainer(
    model: Any,
    rewards: Any,
    train_dataset: Any,
    args: DiffusionGRPOConfig,
    tokenizer: Any,
    lora: Optional[dict] = None,
) -> DiffusionGRPOTrainer:
    """A `DiffusionGRPOTrainer` for one of hf_mdm's masked diffusion models (a ValueError before any work when it
    has no [MASK] id or corrupts with uniform noise; ``args`` validated its settings when it was built), with LoRA
    adapters of ``lora`` (`hf_mdm.finetune.apply_lora`'s arguments) when given: the reference is then the base, adapters
    disabled."""
    from ..families import facts_of
    from ..finetune.trainer import apply_lora, require_mask_token

    facts = facts_of(inner_model(model))
    if facts is not None and facts.corruption == "uniform":
        raise ValueError(
            f"{type(inner_model(model)).__name__} corrupts with uniform random tokens, not [MASK]: the GRPO "
            "log-likelihood estimators are for masked diffusion models (MDM, LLaDA, Dream, LLaDA2.x)"
        )
    require_mask_token(inner_model(model).config)
    if "prompt" not in getattr(train_dataset, "column_names", ["prompt"]):
        raise ValueError(f"the GRPO dataset needs a 'prompt' column; it has {train_dataset.column_names}")
    if lora is not None:
        model = apply_lora(model, **lora)
    rewards = [checked_reward(r) for r in (rewards if isinstance(rewards, (list, tuple)) else [rewards])]
    return DiffusionGRPOTrainer(
        model=model, reward_funcs=rewards, args=args, train_dataset=train_dataset, processing_class=tokenizer
    )
