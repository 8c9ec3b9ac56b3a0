"""The fence between hf_mdm and TRL: the one module that reaches into `trl.GRPOTrainer` beyond its public arguments,
saying what it replaces and why. Everything else of GRPO is TRL's own and used as TRL documents it.

What this module replaces (written against the TRL range that the ``rl`` extra of ``pyproject.toml`` pins, and
checked against the installed TRL when a trainer is built, `check_trl`):

- ``_generate_single_turn`` (a private hook): TRL's rollouts call ``model.generate`` as an autoregressive model;
  a masked diffusion model's rollouts come from hf_mdm's sampler (`FencedGRPOTrainer.generate_rollouts`).
- ``_get_per_token_logps_and_entropies`` (a private hook): TRL reads log pi(y_i | x, y_<i) from one causal forward;
  a masked diffusion model has no such factorisation, so its per-token terms come from a log-likelihood estimator
  (`FencedGRPOTrainer.log_likelihoods`).
- ``trl.trainer.grpo_trainer.create_model_from_path`` (a module function), swapped only while
  ``GRPOTrainer.__init__`` runs (`reference_as_copy`): TRL builds a full fine-tune's reference by loading the
  model's path again through ``AutoModelForCausalLM``, which maps no masked diffusion class, and a model built in
  memory has no path; the reference is a frozen copy of the model instead.
- ``GRPOTrainer._step`` (a private counter of micro-steps) is read, never written, for the micro-step of a rollout
  within its optimizer step (`FencedGRPOTrainer.rollout_key`): rollout seeds and estimator masks are functions of
  the global step and that micro-step, so a resumed run draws what the uninterrupted run drew.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import inspect
from typing import Any, Iterator, Optional

import torch
import trl
import trl.trainer.grpo_trainer as grpo_module
from trl import GRPOTrainer

__all__ = ["OVERRIDDEN_HOOKS", "FencedGRPOTrainer", "check_trl", "reference_as_copy", "signature_mismatches"]

#: Each private hook of `GRPOTrainer` that hf_mdm overrides, with the signature the installed TRL must give it.
OVERRIDDEN_HOOKS: dict[str, str] = {
    "_generate_single_turn": "(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False)",
    "_get_per_token_logps_and_entropies": (
        "(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, "
        "compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, pixel_attention_mask=None, "
        "spatial_shapes=None, num_tiles=None, image_sizes=None, token_type_ids=None, mm_token_type_ids=None, "
        "image_position_ids=None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]"
    ),
}
#: TRL's module function swapped while `GRPOTrainer.__init__` runs (`reference_as_copy`).
SWAPPED_FUNCTION = "create_model_from_path"


def signature_mismatches() -> list[str]:
    """What the installed TRL changed of what this module relies on: a line per hook whose signature differs from
    `OVERRIDDEN_HOOKS`, and one if `SWAPPED_FUNCTION` is gone (empty: the fence holds)."""
    problems = []
    for hook, expected in OVERRIDDEN_HOOKS.items():
        found = getattr(GRPOTrainer, hook, None)
        signature = "missing" if found is None else str(inspect.signature(found))
        if signature != expected:
            problems.append(f"GRPOTrainer.{hook}{signature} (hf_mdm overrides {hook}{expected})")
    if not callable(getattr(grpo_module, SWAPPED_FUNCTION, None)):
        problems.append(f"trl.trainer.grpo_trainer.{SWAPPED_FUNCTION} is gone (hf_mdm swaps it for the reference)")
    return problems


def check_trl() -> None:
    """A RuntimeError naming every change of the installed TRL that the fence does not hold against."""
    problems = signature_mismatches()
    if problems:
        raise RuntimeError(
            f"trl {trl.__version__} changed what hf_mdm's GRPO overrides: {'; '.join(problems)}. Install the TRL "
            "range of hf_mdm's rl extra (pip install 'hf-mdm[rl]')"
        )


@contextlib.contextmanager
def reference_as_copy(model: Any) -> Iterator[None]:
    """While the block runs, TRL's ``create_model_from_path`` returns a frozen copy of ``model`` (the reference of a
    full fine-tune); restored after. A TRL without that function is refused by name rather than patched blindly."""
    original = getattr(grpo_module, SWAPPED_FUNCTION, None)
    if original is None:
        raise RuntimeError(
            f"trl {trl.__version__}'s GRPOTrainer no longer builds its reference with {SWAPPED_FUNCTION}: "
            "install the TRL range of hf_mdm's rl extra (pip install 'hf-mdm[rl]')"
        )
    setattr(grpo_module, SWAPPED_FUNCTION, lambda *_, **__: copy.deepcopy(model))
    try:
        yield
    finally:
        setattr(grpo_module, SWAPPED_FUNCTION, original)


class FencedGRPOTrainer(GRPOTrainer, metaclass=abc.ABCMeta):
    """`GRPOTrainer` with the two private hooks routed to public methods a subclass defines: `generate_rollouts`
    and `log_likelihoods` (abstract: a subclass without them cannot be built); its reference a copy of the model
    (`reference_as_copy`); built only on a TRL the fence holds against (`check_trl`)."""

    def __init__(self, *args: Any, **kwargs: Any):
        check_trl()
        self.drawn_at: dict[str, tuple[int, int, str]] = {}  # mode -> `rollout_key` of its latest rollouts
        model = kwargs.get("model", args[0] if args else None)
        with reference_as_copy(model):
            super().__init__(*args, **kwargs)

    @abc.abstractmethod
    def generate_rollouts(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        """The completions' ids of the (already repeated) prompts' ids, each ending at its first EOS."""

    @abc.abstractmethod
    def log_likelihoods(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion: int, batch_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C) per-token log-likelihood terms of the last ``completion`` columns, and (B, C) entropies."""

    def rollout_key(self) -> tuple[int, int, str]:
        """(global step, micro-step within it, "train" or "eval") of the rollouts being drawn or scored: equal in a
        resumed run and the uninterrupted one (TRL's micro-step counter restarts at 0 on resume, at a step's start)."""
        micro = self._step % max(1, int(self.args.gradient_accumulation_steps))
        return self.state.global_step, micro, "train" if self.model.training else "eval"

    def scored_key(self) -> tuple[int, int, str]:
        """The `rollout_key` at which the rollouts now scored were drawn: TRL scores the old and reference policy
        when it draws them and the current policy in later micro-steps (and steps, with ``num_iterations > 1``) on
        that same batch, so all three see the same masks, and each new batch new ones."""
        key = self.rollout_key()
        return self.drawn_at.get(key[2], key)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's hook: hf_mdm's sampler instead of autoregressive ``generate`` (no per-token sampling log-probs)."""
        key = self.rollout_key()
        self.drawn_at[key[2]] = key
        return self.generate_rollouts(prompt_ids), None

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **_: Any,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor], None]:  # fmt: skip
        """TRL's hook: the estimator's per-token terms instead of one causal forward (no multimodal inputs, no
        mixture-of-experts auxiliary loss)."""
        logps, entropies = self.log_likelihoods(
            model, input_ids.long(), attention_mask, logits_to_keep, batch_size or input_ids.shape[0]
        )  # (an empty prompt comes as a float tensor from TRL's padding)
        return logps, entropies if compute_entropy else None, None
