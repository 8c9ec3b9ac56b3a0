"""Supervised fine-tuning through transformers' `Trainer`: LLaDA's SFT loss (`hf_mdm.finetune.objective`) on any of
hf_mdm's classes (MDM, block-diffusion MDM, LLaDA, Dream, LLaDA2.x), with what `Trainer` gives every model:
mixed precision (``bf16``), gradient checkpointing, gradient accumulation, multi-process data parallelism under
``accelerate launch``, DeepSpeed (``deepspeed=CONFIG``) and FSDP (``fsdp=...``) by configuration, checkpoints every
``save_steps`` that a killed run resumes from; and LoRA through PEFT (`apply_lora`).

A resumed run trains what the uninterrupted run trained (the same weights, bit for bit): the Trainer restores its
own random stream (dropout, LoRA's included) from the checkpoint, and `SFTTrainer` puts the collator's stream at the
first batch after the checkpoint (the Trainer skips the batches before it without collating them).

A block-causal model (``config.block_size``) is trained with the block-diffusion form of the objective; every other
model with LLaDA's. Dream's logits shift is read from the family's facts: position j is scored from the logits at
j - 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import has_length

from ..families import attention_block_size
from ..generation_denoiser import logits_shift_of
from ..training import train
from .objective import SFTCollator, block_diffusion_inputs, masked_positions, sft_loss

__all__ = [
    "SFTTrainer",
    "sft_step_loss",
    "apply_lora",
    "sft_trainer",
    "train_sft",
    "base_model",
    "checkpointing_argument",
    "batches_before",
    "require_mask_token",
]


def base_model(model: Any) -> Any:
    """The model under a PEFT wrapper (itself when unwrapped)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def sft_step_loss(model: Any, inputs: dict[str, torch.Tensor], block_size: Optional[int] = None) -> torch.Tensor:
    """The SFT loss of one batch of `SFTCollator`: one forward, the LM head at the masked positions only (a model
    without per-row ``logits_to_keep`` computes every position's logits, gathered after)."""
    labels = inputs["labels"]
    positions, real = masked_positions(labels)
    targets = labels.gather(1, positions).clamp(min=0)
    p_mask = inputs["p_mask"].gather(1, positions)
    if block_size is not None:
        kwargs = block_diffusion_inputs(inputs["input_ids"], inputs["clean_ids"], block_size)
    else:
        kwargs = {"input_ids": inputs["input_ids"]}
        if "attention_mask" in inputs:
            kwargs["attention_mask"] = inputs["attention_mask"]
    query = (positions - logits_shift_of(base_model(model))).clamp(min=0)
    if getattr(base_model(model), "supports_per_row_logits_to_keep", False):
        logits = model(**kwargs, logits_to_keep=query).logits
    else:
        logits = model(**kwargs).logits
        logits = logits.gather(1, query[..., None].expand(-1, -1, logits.shape[-1]))
    return sft_loss(logits, targets, p_mask, inputs["answer_lengths"], real)


class SFTTrainer(Trainer):
    """`transformers.Trainer` whose loss is `sft_step_loss` (``block_size``: the block-diffusion form).
    ``first_step``: the step the last ``train()`` started from (a resumed run's checkpoint step, else 0)."""

    def __init__(self, *args: Any, block_size: Optional[int] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.block_size = block_size
        self.first_step = 0
        self.add_callback(_CollatorAtTheStep(self))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = sft_step_loss(model, inputs, self.block_size)
        return (loss, {}) if return_outputs else loss  # no outputs beside the loss (evaluation reads the loss)

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """The Trainer's evaluation, drawing from a fresh copy of the collator: every evaluation scores the same
        masks, and the training stream stays where it is."""
        training = self.data_collator
        if isinstance(training, SFTCollator):
            self.data_collator = dataclasses.replace(training)
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self.data_collator = training


def batches_before(step: int, per_epoch: int, accumulation: int, skip_data: bool = True) -> int:
    """The batches the Trainer has drawn before optimizer step ``step`` + 1: ``per_epoch`` an epoch (its last step
    takes the remainder), ``accumulation`` a step; the partial epoch's not counted without ``skip_data`` (the
    Trainer's ``ignore_data_skip``)."""
    epochs, within = divmod(step, -(-per_epoch // accumulation))
    return epochs * per_epoch + within * accumulation * skip_data


class _CollatorAtTheStep(TrainerCallback):
    """At the start of ``train()``: records the step it starts from and sets an `SFTCollator`'s batch count to the
    batches drawn before it, so that a resumed run draws the uninterrupted run's masks and times."""

    def __init__(self, trainer: SFTTrainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.trainer.first_step = state.global_step
        collator = self.trainer.data_collator
        if isinstance(collator, SFTCollator) and train_dataloader is not None and has_length(train_dataloader):
            accumulation, skip = args.gradient_accumulation_steps, not args.ignore_data_skip
            collator.batches = batches_before(state.global_step, len(train_dataloader), accumulation, skip)


def checkpointing_argument() -> str:
    """transformers' `TrainingArguments` name of the activation-checkpointing switch (``gradient_checkpointing``
    on releases before ``activation_checkpointing``)."""
    import dataclasses

    names = {field.name for field in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def apply_lora(model: Any, r: int = 16, alpha: int = 32, dropout: float = 0.05, target_modules: Any = "all-linear"):
    """``model`` wrapped by PEFT with LoRA adapters of rank ``r`` on ``target_modules`` (every linear layer but the
    LM head by default; a mixture of experts' fused expert tensors are not linear layers and stay frozen)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:  # pragma: no cover - peft is a dependency
        raise ImportError("LoRA needs peft: pip install peft") from error
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules)
    return get_peft_model(model, config)


def require_mask_token(config: Any, name: Optional[str] = None) -> None:
    """A ValueError saying what to do when ``config`` (of the checkpoint ``name``, when given) has no
    ``mask_token_id`` (`hf_mdm.loading.require_kind`'s words: an autoregressive Llama / Qwen2 is converted with A2D
    first, DiffusionGemma's noise is uniform, any other model needs its [MASK] id in its config)."""
    if getattr(config, "mask_token_id", None) is not None:
        return
    from ..loading import require_kind

    require_kind(config, "masked", name, "masked diffusion fine-tuning (SFT, GRPO)")


def sft_trainer(
    model: Any,
    train_dataset: Any,
    args: TrainingArguments,
    eos_token_id: int,
    eval_dataset: Any = None,
    seed: Optional[int] = None,
    processing_class: Any = None,
) -> SFTTrainer:
    """An `SFTTrainer` for ``model`` on tokenised pairs (`hf_mdm.finetune.data.tokenize_pairs`), its collator built
    from the model's [MASK] id and block size and seeded with ``seed`` (``args.seed`` when None); ``args`` keeps
    the dataset's ``prompt_length`` column."""
    config = base_model(model).config
    require_mask_token(config)
    args.remove_unused_columns = False  # prompt_length is not a forward argument, the collator reads it
    block_size = attention_block_size(base_model(model))
    seed = args.seed if seed is None else seed
    collator = SFTCollator(config.mask_token_id, eos_token_id, block_size=block_size, seed=seed)
    return SFTTrainer(
        model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset, data_collator=collator,
        processing_class=processing_class, block_size=block_size,
    )  # fmt: skip


def train_sft(trainer: SFTTrainer, resume: bool = True) -> Any:
    """Train, resuming from the newest readable checkpoint in ``args.output_dir`` (`hf_mdm.training.train`), then
    save the model (or the LoRA adapter) and the tokenizer there."""
    result = train(trainer, resume=resume)
    trainer.save_model(trainer.args.output_dir)
    return result
