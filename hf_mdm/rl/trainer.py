"""GRPO for masked diffusion LMs through TRL: `DiffusionGRPOTrainer` is TRL's `GRPOTrainer` with two parts
replaced, where diffusion differs from autoregression, and everything else TRL's own (rewards and their weights,
group advantages, the clipped objective and its loss types, the KL term against the reference, logging,
checkpoints, ``accelerate launch``, PEFT: the reference is the base with the adapters disabled):

1. Rollouts come from hf_mdm's ``generate`` with a `MaskedDiffusionGenerationConfig` (any preset, cache,
   threshold, block diffusion), its length TRL's ``max_completion_length`` and its temperature TRL's
   ``temperature`` unless the rollout settings name their own. Each rollout batch draws from a seed made of
   ``args.seed``, the step and the process, and its settings, seed and tokens are appended to
   ``<output_dir>/rollouts-<process>.jsonl``.
2. Per-token log-likelihoods come from a `hf_mdm.rl.estimators` estimator (``one_step``, ``coupled``, ``elbo``),
   each row's masks drawn from a generator seeded by the row's own tokens, so the old, reference and current
   log-likelihoods of one rollout use the same masks (the ratio is exactly 1 before the first update).

`grpo_trainer` builds one from a model, rewards and a dataset; `hf-mdm grpo` is its command line.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
from typing import Any, Iterator, Optional

import torch
import trl
import trl.trainer.grpo_trainer as grpo_module
from trl import GRPOConfig, GRPOTrainer

from ..generation_config import MaskedDiffusionGenerationConfig
from ..generation_presets import preset_config
from ..likelihood import stable_seed
from .estimators import build_estimator, inner_model
from .rewards import checked_reward

__all__ = ["DiffusionGRPOConfig", "DiffusionGRPOTrainer", "grpo_trainer", "rollout_config"]


@dataclasses.dataclass
class DiffusionGRPOConfig(GRPOConfig):
    """TRL's `GRPOConfig` and the diffusion settings: ``estimator`` (a name in
    `hf_mdm.rl.estimators.ESTIMATORS`) with its ``estimator_options``, and the rollouts' ``rollout`` settings
    (`MaskedDiffusionGenerationConfig` fields; ``preset`` names one of its presets)."""

    estimator: str = dataclasses.field(default="one_step", metadata={"help": "one_step, coupled or elbo"})
    estimator_options: dict = dataclasses.field(default_factory=dict, metadata={"help": "the estimator's options"})
    rollout: dict = dataclasses.field(default_factory=dict, metadata={"help": "generate settings of the rollouts"})


def rollout_config(args: DiffusionGRPOConfig, model: Any) -> MaskedDiffusionGenerationConfig:
    """The rollouts' generation config: the model's own defaults, the ``preset`` named in ``args.rollout``, then
    its other settings; ``max_new_tokens`` from ``max_completion_length`` and ``temperature`` from TRL's unless
    named. Invalid settings raise the errors ``generate`` raises."""
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


def estimator_options(args: DiffusionGRPOConfig, rollout: MaskedDiffusionGenerationConfig) -> dict:
    """The estimator's options; the ``decoding`` estimator takes the rollouts' steps, transfer, order and schedule
    unless they are named."""
    options = dict(args.estimator_options)
    if args.estimator == "decoding":
        for name, field in (
            ("steps", "steps"),
            ("transfer", "transfer"),
            ("order", "strategy"),
            ("schedule", "schedule"),
        ):
            value = getattr(rollout, field, None)
            value = rollout.max_new_tokens if field == "steps" and value is None else value  # one token a step
            if name not in options and value is not None:
                options[name] = value
    return options


@contextlib.contextmanager
def reference_as_copy(model: Any) -> Iterator[None]:
    """The one place hf_mdm reaches into TRL's module: while ``GRPOTrainer.__init__`` runs, its
    ``create_model_from_path`` (which builds a full fine-tune's reference by loading the model's path again through
    ``AutoModelForCausalLM``, which maps no masked diffusion class, and a model built in memory has no path) returns
    a frozen copy of ``model``; restored after. TRL's range is pinned in the ``rl`` extra; a TRL without that
    function is refused by name rather than patched blindly."""
    original = getattr(grpo_module, "create_model_from_path", None)
    if original is None:
        raise RuntimeError(
            f"trl {trl.__version__}'s GRPOTrainer no longer builds its reference with create_model_from_path: "
            "install the TRL range of hf_mdm's rl extra (pip install 'hf_mdm[rl]')"
        )
    grpo_module.create_model_from_path = lambda *_, **__: copy.deepcopy(model)
    try:
        yield
    finally:
        grpo_module.create_model_from_path = original


class DiffusionGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` for hf_mdm's masked diffusion classes (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        model = kwargs.get("model", args[0] if args else None)
        with reference_as_copy(model):
            super().__init__(*args, **kwargs)
        config = self.args
        self.rollout_generation_config = rollout_config(config, inner_model(self.model))
        self.estimator = build_estimator(config.estimator, **estimator_options(config, self.rollout_generation_config))
        self._rollouts = 0

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """Completions of the (already repeated) prompts by hf_mdm's ``generate``; each cut after its first EOS."""
        device = self.accelerator.device
        pad = self._tokenizer.pad_token_id
        width = max(len(ids) for ids in prompt_ids)
        ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompt_ids):
            ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = torch.tensor(prompt), 1
        seed = stable_seed(self.args.seed, [self.state.global_step, self.accelerator.process_index], [self._rollouts])
        model = self.accelerator.unwrap_model(self.model)
        with torch.no_grad():
            out = model.generate(
                ids.to(device), attention_mask=mask.to(device), generation_config=self.rollout_generation_config,
                seed=seed % (2**31),
            )  # fmt: skip
        completions = [_cut_after_eos(row, self.eos_token_ids) for row in out[:, width:].tolist()]
        self._record(seed, prompt_ids, completions)
        self._rollouts += 1
        return completions, None

    def _record(self, seed: int, prompt_ids: list, completions: list) -> None:
        """One JSON line per rollout batch: step, seed, the generation settings, prompts' and completions' ids."""
        if not self.args.output_dir:
            return
        os.makedirs(self.args.output_dir, exist_ok=True)
        line = {
            "step": self.state.global_step,
            "seed": seed % (2**31),
            "settings": self.rollout_generation_config.to_diff_dict(),
            "estimator": {"name": self.estimator.name, **dataclasses.asdict(self.estimator)},
            "prompt_ids": [list(p) for p in prompt_ids],
            "completion_ids": completions,
        }
        path = os.path.join(self.args.output_dir, f"rollouts-{self.accelerator.process_index}.jsonl")
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **_: Any,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor], None]:  # fmt: skip
        """The estimator's (B, C) per-token log-likelihoods of the last ``logits_to_keep`` columns (and the token
        law's entropies), in chunks of ``batch_size`` rows; every row's masks seeded by its own tokens."""
        batch_size = batch_size or input_ids.shape[0]
        input_ids = input_ids.long()  # an empty prompt comes as a float tensor from TRL's padding
        logps, entropies = [], []
        for start in range(0, input_ids.shape[0], batch_size):
            rows = input_ids[start : start + batch_size]
            generators = [self._row_generator(row, attention_mask[start + i]) for i, row in enumerate(rows)]
            with self.accelerator.autocast():
                logp, entropy = self.estimator.per_token(
                    model, rows, attention_mask[start : start + batch_size], logits_to_keep, generators,
                    float(self.rollout_generation_config.temperature or 1.0),
                )  # fmt: skip
            logps.append(logp)
            entropies.append(entropy)
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def _row_generator(self, row: torch.Tensor, mask: torch.Tensor) -> torch.Generator:
        tokens = row[mask.bool()].tolist()
        return torch.Generator().manual_seed(stable_seed(self.args.seed, tokens, []) % (2**63))


def _cut_after_eos(tokens: list[int], eos_ids: Any) -> list[int]:
    """``tokens`` up to and including the first EOS (TRL's completion mask ends there)."""
    eos = set(eos_ids if isinstance(eos_ids, (list, tuple, set)) else [eos_ids])
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def grpo_trainer(
    model: Any,
    rewards: Any,
    train_dataset: Any,
    args: DiffusionGRPOConfig,
    tokenizer: Any,
    lora: Optional[dict] = None,
) -> DiffusionGRPOTrainer:
    """A `DiffusionGRPOTrainer` for one of hf_mdm's masked diffusion models (a ValueError before any work when it
    has no [MASK] id, or when the estimator or rollout settings are invalid), with LoRA adapters of ``lora``
    (`hf_mdm.finetune.apply_lora`'s arguments) when given: the reference is then the base, adapters disabled."""
    from ..families import facts_of
    from ..finetune.trainer import apply_lora, require_mask_token

    facts = facts_of(inner_model(model))
    if facts is not None and facts.corruption == "uniform":
        raise ValueError(
            f"{type(inner_model(model)).__name__} corrupts with uniform random tokens, not [MASK]: the GRPO "
            "log-likelihood estimators are for masked diffusion models (MDM, LLaDA, Dream, LLaDA2.x)"
        )
    require_mask_token(inner_model(model).config)
    build_estimator(args.estimator, **estimator_options(args, rollout_config(args, model)))
    if "prompt" not in getattr(train_dataset, "column_names", ["prompt"]):
        raise ValueError(f"the GRPO dataset needs a 'prompt' column; it has {train_dataset.column_names}")
    if lora is not None:
        model = apply_lora(model, **lora)
    rewards = [checked_reward(r) for r in (rewards if isinstance(rewards, (list, tuple)) else [rewards])]
    return DiffusionGRPOTrainer(
        model=model, reward_funcs=rewards, args=args, train_dataset=train_dataset, processing_class=tokenizer
    )
