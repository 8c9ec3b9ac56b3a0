"""Supervised fine-tuning through transformers' `Trainer`: LLaDA's SFT loss (`hf_mdm.finetune.objective`) on any of
hf_mdm's classes (MDM, block-diffusion MDM, LLaDA, Dream, LLaDA2.x), with what `Trainer` gives every model:
mixed precision (``bf16``), gradient checkpointing, gradient accumulation, multi-process data parallelism under
``accelerate launch``, DeepSpeed (``deepspeed=CONFIG``) and FSDP (``fsdp=...``) by configuration, checkpoints every
``save_steps`` that a killed run resumes from; and LoRA through PEFT (`apply_lora`).

A block-causal model (``config.block_size``) is trained with the block-diffusion form of the objective; every other
model with LLaDA's. Dream's logits shift is read from the family's facts: position j is scored from the logits at
j - 1.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from transformers import Trainer, TrainingArguments

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
    """`transformers.Trainer` whose loss is `sft_step_loss` (``block_size``: the block-diffusion form)."""

    def __init__(self, *args: Any, block_size: Optional[int] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.block_size = block_size

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = sft_step_loss(model, inputs, self.block_size)
        return (loss, None) if return_outputs else loss


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
    from the model's [MASK] id and block size; ``args`` keeps the dataset's ``prompt_length`` column."""
    config = base_model(model).config
    if getattr(config, "mask_token_id", None) is None:
        raise ValueError("the model config has no mask_token_id: set config.mask_token_id (e.g. 126336 for LLaDA)")
    args.remove_unused_columns = False  # prompt_length is not a forward argument, the collator reads it
    block_size = attention_block_size(base_model(model))
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
