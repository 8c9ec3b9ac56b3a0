"""``hf-mdm sft`` and ``hf-mdm a2d``: the command line of `hf_mdm.finetune` (loading, arguments and the Trainer's
settings only).

    hf-mdm sft --model GSAI-ML/LLaDA-8B-Instruct --data pairs.jsonl --output-dir runs/sft \\
        --lora --gradient-checkpointing --bf16 --batch-size 4 --grad-accum 8 --max-length 1024

    hf-mdm a2d --model Qwen/Qwen2.5-0.5B --output-dir runs/qwen-mdm [--block-size 32] [--logits-shift 1]

Rerun the same sft command after a kill or Ctrl-C: it resumes from the newest readable checkpoint in ``--output-dir``
and ends with the weights the uninterrupted run would have (``--seed`` decides every random draw, LoRA's initial
adapters included). Ctrl-C exits 130 with one line naming the checkpoint kept. Under
``accelerate launch`` every process runs it (data parallel); ``--deepspeed CONFIG.json`` or ``--fsdp "full_shard
auto_wrap"`` shard a model that outgrows one device.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .argtypes import at_least, positive_float


def _sft(args: argparse.Namespace) -> int:
    from transformers import set_seed

    from .finetune import train_sft
    from .harness.launch import check_launch

    check_bf16(args.bf16)
    check_launch()  # several processes on CPUs without ACCELERATE_USE_CPU=1 would each train on everything
    set_seed(args.seed)  # before the model and its LoRA adapters are built: --seed decides their initial weights
    trainer = None
    try:
        trainer = _sft_trainer(args)
        result = train_sft(trainer)
    except KeyboardInterrupt:
        return report_interrupted(args, trainer)
    print(training_summary(result, trainer.first_step, args.output_dir))
    return 0


def _sft_trainer(args: argparse.Namespace) -> Any:
    from transformers import TrainingArguments

    from .finetune import apply_lora, checkpointing_argument, load_pairs, sft_trainer, tokenize_pairs
    from .loading import load_pretrained

    pretrained = load_pretrained(args.model, require="masked", command="hf-mdm sft")
    model, tokenizer = pretrained.model, pretrained.tokenizer
    pairs = tokenize_pairs(
        load_pairs(args.data, args.split), tokenizer, args.max_length, args.prompt_column, args.response_column,
        source=args.data,
    )  # fmt: skip
    if args.gradient_checkpointing:
        model.config.use_cache = False
    if args.lora:
        model = apply_lora(model, r=args.lora_r, alpha=args.lora_alpha)
    checkpointing = checkpointing_argument()
    training = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum, learning_rate=args.lr, num_train_epochs=args.epochs,
        max_steps=args.max_steps, save_steps=args.save_steps, logging_steps=args.logging_steps, bf16=args.bf16,
        **{checkpointing: args.gradient_checkpointing}, seed=args.seed, report_to="none",
        deepspeed=args.deepspeed, fsdp=args.fsdp or "", lr_scheduler_type="linear", warmup_steps=args.warmup_steps,
    )  # fmt: skip
    return sft_trainer(model, pairs, training, tokenizer.eos_token_id, seed=args.seed, processing_class=tokenizer)


def check_bf16(bf16: bool) -> None:
    """``--bf16`` refused up front where transformers would refuse it (no GPU with bfloat16), in this CLI's words."""
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

    if bf16 and not (is_torch_bf16_gpu_available() or is_torch_xla_available()):
        raise ValueError("--bf16 needs a GPU with bfloat16 support and there is none here: run without --bf16")


def report_interrupted(args: argparse.Namespace, trainer: Any) -> int:
    """A training command's Ctrl-C (sft, grpo): one line naming the checkpoint kept (what rerunning the same command
    resumes from), after the progress bar; exit 130."""
    import warnings

    from transformers.trainer_callback import ProgressCallback

    from .checkpoints import resumable_checkpoint

    for callback in trainer.callback_handler.callbacks if trainer is not None else ():
        if isinstance(callback, ProgressCallback) and callback.training_bar is not None:
            callback.training_bar.close()
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always")
        kept = resumable_checkpoint(args.output_dir)
    plural = "s" if len(skipped) > 1 else ""
    cut = f" (skipping {len(skipped)} newer checkpoint folder{plural} whose save was cut short)" if skipped else ""
    if kept is None:
        message = (
            f"interrupted before the first checkpoint (one every --save-steps {args.save_steps} steps){cut}: no "
            f"checkpoint is kept in {args.output_dir}; rerunning the same command starts from step 0"
        )
    else:
        message = f"interrupted: {kept[0]} (step {kept[1]}) is kept{cut}; rerun the same command to resume from it"
    print(message, file=sys.stderr)
    return 130


def training_summary(result: Any, first_step: int, output_dir: str) -> str:
    """A training command's closing line: the step reached and what the loss averages (the steps this run trained)."""
    last = result.global_step
    if first_step >= last:
        return f"already at step {last}, nothing left to train; saved to {output_dir}"
    steps = (
        f"steps 1-{last}"
        if first_step == 0
        else f"steps {first_step + 1}-{last} (this run, resumed at step {first_step})"
    )
    return f"trained to step {last}; mean loss {result.training_loss:.4f} over {steps}; saved to {output_dir}"


def _a2d(args: argparse.Namespace) -> int:
    from transformers import AutoConfig

    from .checkpoints import check_local_path
    from .fileio import write_directory_atomic
    from .finetune.a2d import check_convertible, convert_to_mdm
    from .loading import load_pretrained

    check_local_path(args.model, "--model")
    check_convertible(AutoConfig.from_pretrained(args.model), args.model)
    pretrained = load_pretrained(args.model, require="autoregressive", command="hf-mdm a2d")
    ar, tokenizer = pretrained.model, pretrained.tokenizer
    if tokenizer.mask_token is None:
        tokenizer.add_special_tokens({"mask_token": args.mask_token})
    model = convert_to_mdm(ar, tokenizer.mask_token_id, args.block_size, args.logits_shift)
    write_directory_atomic(
        args.output_dir, lambda folder: (model.save_pretrained(folder), tokenizer.save_pretrained(folder))
    )
    attention = "bidirectional" if args.block_size is None else f"block-causal (blocks of {args.block_size})"
    print(
        f"{args.output_dir}: {type(ar).__name__} -> MDMForMaskedDiffusion, [MASK] = {tokenizer.mask_token_id} "
        f"({tokenizer.mask_token}), {attention}, logits shift {args.logits_shift}"
    )
    return 0


def add_commands(commands: Any) -> None:
    """``hf-mdm sft`` and ``hf-mdm a2d``."""
    a2d = commands.add_parser("a2d", help="convert an autoregressive Llama / Qwen2 checkpoint into a diffusion model")
    a2d.add_argument("--model", required=True, help="the AR checkpoint (directory or Hub id)")
    a2d.add_argument("--output-dir", required=True, help="the converted model and its tokenizer (with [MASK])")
    a2d.add_argument(
        "--block-size", type=at_least(1), default=None, help="block-causal attention (default: bidirectional)"
    )
    a2d.add_argument("--logits-shift", type=int, choices=[0, 1], default=1, help="1: Dream's recipe (keep the AR head)")
    a2d.add_argument("--mask-token", default="<|mask|>", help="the [MASK] token added when the tokenizer has none")
    a2d.set_defaults(func=_a2d)
    sft = commands.add_parser("sft", help="supervised fine-tuning on prompt/response pairs (LLaDA's recipe, LoRA)")
    sft.add_argument("--model", required=True, help="a checkpoint (directory or Hub id) of an hf_mdm class")
    sft.add_argument("--data", required=True, help="pairs: .jsonl/.json/.csv/.parquet, a saved dataset, or a Hub name")
    sft.add_argument("--split", default="train", help="the split of a Hub dataset")
    sft.add_argument("--prompt-column", default="prompt")
    sft.add_argument("--response-column", default="response")
    sft.add_argument("--output-dir", required=True, help="checkpoints, then the model (or LoRA adapter)")
    sft.add_argument("--max-length", type=at_least(2), default=1024, help="tokens per pair at most (cut at the end)")
    sft.add_argument("--batch-size", type=at_least(1), default=8, help="pairs per device and step")
    sft.add_argument("--grad-accum", type=at_least(1), default=1, help="gradient accumulation steps")
    sft.add_argument("--lr", type=positive_float, default=1e-5, help="peak learning rate (LLaDA's SFT: 2.5e-5)")
    sft.add_argument("--epochs", type=positive_float, default=1.0)
    sft.add_argument("--max-steps", type=int, default=-1, help="optimizer steps (overrides --epochs when > 0)")
    sft.add_argument("--warmup-steps", type=at_least(0), default=0)
    sft.add_argument("--save-steps", type=at_least(1), default=500, help="a checkpoint every this many steps")
    sft.add_argument("--logging-steps", type=at_least(1), default=10)
    sft.add_argument("--lora", action="store_true", help="train LoRA adapters (PEFT) instead of every weight")
    sft.add_argument("--lora-r", type=at_least(1), default=16)
    sft.add_argument("--lora-alpha", type=at_least(1), default=32)
    sft.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in the backward")
    sft.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision")
    sft.add_argument("--deepspeed", default=None, help="a DeepSpeed config file (transformers' integration)")
    sft.add_argument("--fsdp", default=None, help="FSDP options, e.g. 'full_shard auto_wrap'")
    sft.add_argument("--seed", type=int, default=0)
    sft.set_defaults(func=_sft)
