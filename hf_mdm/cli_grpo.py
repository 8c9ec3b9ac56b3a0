"""``hf-mdm grpo``: the command line of `hf_mdm.rl` (loading, arguments and the trainer's settings only).

    hf-mdm grpo --model runs/sft --data gsm8k_prompts.jsonl --reward gsm8k --output-dir runs/grpo \\
        --estimator one_step --rollout steps=64 --rollout block_length=32 --num-generations 8 --lora --lr 3e-6

    hf-mdm grpo --model runs/chain-mdm --language runs/chain --reward language --output-dir runs/grpo-chain \\
        --rollout steps=4 --rollout transfer=stochastic --rollout strategy=random --estimator elbo --lr 3e-4

Rerun the same command after a kill: it resumes from the newest readable checkpoint in ``--output-dir``. Under
``accelerate launch`` every process runs it (data parallel; on CPUs with ``ACCELERATE_USE_CPU=1``).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from .argtypes import at_least, key_value_pairs, positive_float


def _grpo(args: argparse.Namespace) -> int:
    from transformers import set_seed

    from .checkpoints import resumable_checkpoint
    from .cli_finetune import check_bf16, report_interrupted, training_summary
    from .harness.launch import check_launch
    from .training import train

    check_bf16(args.bf16)
    check_launch()
    set_seed(args.seed)
    trainer = None
    try:
        trainer = _grpo_trainer(args)
        kept = resumable_checkpoint(args.output_dir)
        if kept is not None and kept[1] >= args.max_steps:  # TRL's loop would take one more step from there
            print(f"already at step {kept[1]}, nothing left to train; saved to {args.output_dir}")
            return 0
        result = train(trainer)
        trainer.save_model(args.output_dir)
    except KeyboardInterrupt:
        return report_interrupted(args, trainer)
    print(training_summary(result, kept[1] if kept else 0, args.output_dir))
    return 0


def _grpo_trainer(args: argparse.Namespace) -> Any:
    """Everything that can be checked without the weights is checked first (the task, the rewards; the estimator
    and its options against the rollouts as the config is built), then the model loads (refused by kind before its
    weights)."""
    from .loading import load_pretrained
    from .rl.rewards import reward_by_name
    from .rl.trainer import DiffusionGRPOConfig, grpo_trainer

    if args.data is None and args.language is None:
        raise ValueError("give --data (rows with a prompt column) or --language (a saved synthetic language)")
    language = _language(args.language) if args.language else None
    rewards = [reward_by_name(name, language) for name in args.reward]
    config = DiffusionGRPOConfig(
        output_dir=args.output_dir, per_device_train_batch_size=args.batch_size, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, learning_rate=args.lr, max_steps=args.max_steps,
        beta=args.beta, temperature=args.temperature, save_steps=args.save_steps, logging_steps=args.logging_steps,
        seed=args.seed, report_to="none", estimator=args.estimator, save_total_limit=args.save_total_limit,
        estimator_options=key_value_pairs(args.estimator_option, "--estimator-option"),
        rollout=key_value_pairs(args.rollout, "--rollout"), gradient_accumulation_steps=args.grad_accum,
        bf16=args.bf16,
    )  # fmt: skip
    # a language model's ids are the language's tokens: no tokenizer saved with it (language_tokenizer instead)
    pretrained = load_pretrained(args.model, require="masked", command="hf-mdm grpo", tokenizer=language is None)
    tokenizer = pretrained.tokenizer
    if language is not None:
        from .rl.language_task import language_tokenizer

        check_vocabulary(pretrained.model.config, language.vocab_size, args.model)
        tokenizer = language_tokenizer(language.vocab_size, pretrained.model.config.mask_token_id)
    lora = {"r": args.lora_r, "alpha": args.lora_alpha} if args.lora else None
    return grpo_trainer(pretrained.model, rewards, _prompts(args, language), config, tokenizer, lora)


def check_vocabulary(config: Any, language_size: int, model: str) -> None:
    """A ValueError when the model cannot embed the language's tokens, a warning when its vocabulary is not the
    language's tokens and [MASK] (a model trained on the language has exactly those:
    `hf_mdm.training.mdm_config_for`)."""
    if config.vocab_size < language_size:
        raise ValueError(
            f"--model {model} has {config.vocab_size} token ids, fewer than the --language's {language_size} tokens: "
            "give a model trained on this language (hf-mdm train)"
        )
    if config.vocab_size != language_size + 1:
        warnings.warn(
            f"--model {model} has {config.vocab_size} token ids, the --language {language_size} tokens and [MASK] "
            f"({language_size + 1}): was the model trained on this language?",
            stacklevel=2,
        )


def _language(path: str) -> Any:
    from .checkpoints import check_local_path
    from .languages import load_language

    check_local_path(path, "--language")
    return load_language(path)


def _prompts(args: argparse.Namespace, language: Any) -> Any:
    if language is not None:
        from .rl.language_task import language_prompts

        return language_prompts(args.prompts)
    from .finetune import load_pairs

    return load_pairs(args.data, args.split)


#: --lr has no default: the rate that learns depends on the model's size by orders of magnitude.
LR_HELP = (
    "the learning rate (required): the small models of a synthetic-language task (docs/rl.md) learn at about 3e-4; a "
    "checkpoint of billions of parameters needs rates orders of magnitude smaller (start near 1e-6, LoRA a little "
    "higher)"
)


def add_commands(commands: Any) -> None:
    """``hf-mdm grpo``."""
    from .rl.estimators import estimator_help

    grpo = commands.add_parser(
        "grpo",
        help="reinforcement learning (TRL's GRPO) for a masked diffusion model",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,  # --help shows every default
    )
    grpo.add_argument("--model", required=True, help="a checkpoint (directory or Hub id) of an hf_mdm class")
    grpo.add_argument("--reward", action="append", required=True,
                      help="language, gsm8k, code or module:function (repeat to add rewards)")  # fmt: skip
    grpo.add_argument("--data", default=None, help="prompts (a prompt column, and the rewards' columns): a file, "
                      "a saved dataset or a Hub name")  # fmt: skip
    grpo.add_argument("--split", default="train", help="the split of --data")
    grpo.add_argument("--language", default=None, help="a saved synthetic language: the task is to generate it")
    grpo.add_argument("--prompts", type=at_least(1), default=256, help="with --language: rows of the dataset")
    grpo.add_argument("--output-dir", required=True, help="checkpoints, rollouts-<process>.jsonl, then the model")
    grpo.add_argument("--estimator", default="one_step", help=f"the per-token log-likelihood: {estimator_help()}")
    grpo.add_argument("--estimator-option", action="append", default=[],
                      help="key=value (e.g. draws=8); decoding takes its options from the --rollout settings")  # fmt: skip
    grpo.add_argument("--rollout", action="append", default=[], help="a generate setting key=value (e.g. steps=64)")
    grpo.add_argument("--num-generations", type=at_least(2), default=8, help="completions per prompt (a group)")
    grpo.add_argument("--max-completion-length", type=at_least(1), default=256, help="tokens a rollout generates")
    grpo.add_argument("--temperature", type=positive_float, default=1.0, help="the rollouts' temperature")
    grpo.add_argument("--beta", type=float, default=0.0, help="weight of the KL term against the reference")
    grpo.add_argument("--batch-size", type=at_least(1), default=8, help="completions per device and step")
    grpo.add_argument("--grad-accum", type=at_least(1), default=1, help="gradient accumulation steps")
    grpo.add_argument("--lr", type=positive_float, required=True, help=LR_HELP)
    grpo.add_argument("--max-steps", type=at_least(1), default=100, help="optimizer steps")
    grpo.add_argument("--save-steps", type=at_least(1), default=50, help="a checkpoint every this many steps")
    grpo.add_argument("--save-total-limit", type=at_least(1), default=2,
                      help="checkpoints kept (the newest; older ones deleted), so a resume can fall back one")  # fmt: skip
    grpo.add_argument("--logging-steps", type=at_least(1), default=10, help="log every this many steps")
    grpo.add_argument("--lora", action="store_true", help="train LoRA adapters (the reference: adapters disabled)")
    grpo.add_argument("--lora-r", type=at_least(1), default=16, help="LoRA rank (with --lora)")
    grpo.add_argument("--lora-alpha", type=at_least(1), default=32, help="LoRA alpha (with --lora)")
    grpo.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision (float32 without it)")
    grpo.add_argument("--seed", type=int, default=0, help="the run's seed (rollouts and masks follow from it)")
    grpo.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        return _grpo(args)
    except ImportError as err:
        if "trl" not in str(err):
            raise
        print("hf-mdm grpo needs TRL: pip install 'hf-mdm[rl]'", file=sys.stderr)
        return 2
