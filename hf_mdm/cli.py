"""The ``hf-mdm`` command line: datasets, training, sampling, scoring, timing, reproduction and Hub uploads.

A session strings the subcommands together, e.g.::

    hf-mdm dataset build ngram2 --length 64 --num-train 20000 --output-dir data/ngram2
    hf-mdm train --data data/ngram2 --kind mdm --output-dir runs/mdm --max-steps 600
    hf-mdm train --data data/ngram2 --kind ar --output-dir runs/ar --max-steps 600
    hf-mdm sample --model runs/mdm/final --num 256 --length 64 --steps 16 --output samples.json
    hf-mdm score --samples samples.json --language data/ngram2
    hf-mdm reproduce            # all of the paper's synthetic experiments, quick presets
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from . import cli_export, cli_finetune, cli_grpo, cli_reproduce, cli_sample, cli_serve, cli_tune
from .argtypes import at_least, positive_float
from .cli_reproduce import CONFIG_DIR, EXPERIMENT_CONFIGS  # noqa: F401  (re-exported)

#: The command modules, each registering its subcommands with ``add_commands(commands)`` (`hf_mdm.argtypes`).
COMMAND_MODULES = (cli_sample, cli_reproduce, cli_tune, cli_finetune, cli_grpo, cli_export, cli_serve)


def _fail(message: str) -> int:
    print(f"hf-mdm: error: {message}", file=sys.stderr)
    return 2


# ----------------------------------------------------------------------------------------------------------------
# dataset


def _dataset_build(args: argparse.Namespace) -> int:
    from .data import SyntheticLanguageBuilder

    overrides = {
        k: v
        for k, v in (
            ("length", args.length),
            ("num_train", args.num_train),
            ("num_validation", args.num_validation),
            ("num_test", args.num_test),
            ("seed", args.seed),
        )
        if v is not None
    }
    builder = SyntheticLanguageBuilder(config_name=args.config, cache_dir=args.cache_dir, **overrides)
    builder.download_and_prepare()
    dataset = builder.as_dataset()
    dataset.save_to_disk(args.output_dir)
    builder.language.save_pretrained(Path(args.output_dir) / "language")
    print(f"saved {', '.join(f'{k}: {len(v)}' for k, v in dataset.items())} rows to {args.output_dir}")
    return 0


def _dataset_push(args: argparse.Namespace) -> int:
    from .data import push_synthetic_datasets
    from .hub import hub_unreachable_errors

    overrides = {k: v for k, v in (("length", args.length), ("num_train", args.num_train)) if v is not None}
    try:
        push_synthetic_datasets(args.repo_id, configs=args.configs, private=args.private, **overrides)
    except hub_unreachable_errors() as err:
        return _hub_unreachable(err, "the configs pushed before it stay on the Hub, the rest were not uploaded")
    return 0


def _hub_unreachable(err: BaseException, uploaded: str) -> int:
    """One line for a Hub that could not be reached (no network, ``HF_HUB_OFFLINE``): what failed and what to do."""
    reason = (str(err).strip().splitlines() or [""])[0]
    return _fail(
        f"could not reach the Hugging Face Hub ({type(err).__name__}{': ' + reason if reason else ''}); {uploaded}: "
        "check the network connection (and that HF_HUB_OFFLINE is not set), then run the command again"
    )


# ----------------------------------------------------------------------------------------------------------------
# train / sample / score


def _load_split_data(path: str):
    from datasets import load_from_disk

    from .data import load_language_from_dataset

    dataset = load_from_disk(path)
    for split in ("train", "validation"):
        if split not in dataset:
            raise ValueError(f"--data {path}: needs a '{split}' split (build it with `hf-mdm dataset build`)")
    return dataset, load_language_from_dataset(dataset)


def _train(args: argparse.Namespace) -> int:
    """Train, write ``final`` (model and language) atomically, then evaluate it on a bounded validation sample: a
    Ctrl-C during that evaluation keeps the trained model."""
    from transformers import TrainingArguments

    from .training import build_trainer, train_save_evaluate

    if args.block_size is not None and args.kind != "mdm":
        return _fail("--block-size makes a block diffusion model: use it with --kind mdm")
    dataset, language = _load_split_data(args.data)
    length = len(dataset["train"][0]["input_ids"])
    entropy = language.expected_nll(length).value / length
    validation = dataset["validation"].select(range(min(args.eval_samples, len(dataset["validation"]))))
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps,
        lr_scheduler_type="cosine",
        save_steps=args.save_steps,
        eval_strategy="steps",
        eval_steps=args.save_steps,
        logging_steps=max(args.max_steps // 20, 1),
        report_to=[],
        seed=args.seed,
    )
    trainer = build_trainer(
        args.kind,
        dataset["train"],
        validation,
        vocab_size=language.vocab_size,
        length=length,
        args=training_args,
        size=args.size,
        schedule=args.schedule,
        entropy_per_token=entropy,
        seed=args.seed,
        block_size=args.block_size,
    )
    final = Path(args.output_dir) / "final"
    print(f"training; then the model is saved to {final} and evaluated on {len(validation)} validation sequences")
    metrics = train_save_evaluate(
        trainer, final, lambda folder: language.save_pretrained(folder / "language"), resume=not args.no_resume
    )
    if metrics is None:
        print(f"evaluation interrupted; the trained model is saved in {final}", file=sys.stderr)
        return 130
    print(json.dumps({k: round(float(v), 5) for k, v in metrics.items()}, indent=1))
    return 0


def _push(args: argparse.Namespace) -> int:
    from .hub import hub_unreachable_errors, push_model
    from .languages import load_language
    from .loading import load_pretrained

    model = load_pretrained(args.model, tokenizer=False).model
    language_dir = args.language or (
        Path(args.model) / "language" if (Path(args.model) / "language").is_dir() else None
    )
    results = json.loads(Path(args.results).read_text()) if args.results else []
    try:
        info = push_model(
            model,
            args.repo_id,
            language=load_language(language_dir) if language_dir else None,
            results=results,
            private=args.private,
            project_url=args.project_url,
        )
    except hub_unreachable_errors() as err:
        return _hub_unreachable(err, "nothing was uploaded")
    print(info)
    return 0


def _tiny_models(args: argparse.Namespace) -> int:
    from .harness.tiny import build_tiny_models

    paths = build_tiny_models(args.directory, seed=args.seed)
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    return 0


# ----------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-mdm", description="Masked diffusion language models: tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_dataset_commands(commands)
    _add_train_command(commands)
    for module in COMMAND_MODULES:
        module.add_commands(commands)
    _add_hub_and_compare_commands(commands)
    _add_threads_option(commands)
    return parser


#: The subcommands that compute with torch in this process, and so take ``--threads``.
THREAD_COMMANDS = ("train", "sample", "score", "bench", "tune", "sft", "a2d", "grpo")
THREADS_HELP = (
    "torch's CPU threads for this command (torch.set_num_threads; default: torch's own, one per core). Pass 1 on a "
    "machine with few cores or other jobs running: tiny models then train and sample several times faster than "
    "with threads competing for the cores (make reproduce runs each experiment with 1)"
)


def _add_threads_option(commands: Any) -> None:
    for name in THREAD_COMMANDS:
        commands.choices[name].add_argument("--threads", type=at_least(1), default=None, help=THREADS_HELP)


def _set_threads(threads: Optional[int]) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _add_dataset_commands(commands: Any) -> None:
    dataset = commands.add_parser("dataset", help="build or push synthetic-language datasets")
    dataset_commands = dataset.add_subparsers(dest="dataset_command", required=True)
    build = dataset_commands.add_parser("build", help="generate a synthetic dataset and save it to disk")
    build.add_argument("config", choices=["ngram2", "ngram3", "ngram4", "hmm", "chain"])
    build.add_argument("--output-dir", required=True)
    build.add_argument("--cache-dir", default=None)
    push_ds = dataset_commands.add_parser("push", help="push one config per language to the Hub")
    push_ds.add_argument("--repo-id", required=True)
    push_ds.add_argument("--configs", nargs="+", default=["ngram2", "ngram3", "ngram4", "hmm", "chain"])
    push_ds.add_argument("--private", action="store_true")
    for sub in (build, push_ds):
        sub.add_argument("--length", type=at_least(1))
        sub.add_argument("--num-train", type=at_least(1))
    build.add_argument("--num-validation", type=at_least(1))
    build.add_argument("--num-test", type=at_least(0))
    build.add_argument("--seed", type=int)
    build.set_defaults(func=_dataset_build)
    push_ds.set_defaults(func=_dataset_push)


def _add_train_command(commands: Any) -> None:
    train = commands.add_parser("train", help="train an MDM or the matched AR baseline on a built dataset")
    train.add_argument("--data", required=True, help="a directory written by `hf-mdm dataset build`")
    train.add_argument("--kind", choices=["mdm", "ar"], required=True)
    train.add_argument("--output-dir", required=True)
    train.add_argument("--size", default="tiny", help="tiny, small, base or paper")
    train.add_argument("--schedule", default="linear")
    train.add_argument("--max-steps", type=at_least(1), default=1000)
    train.add_argument("--batch-size", type=at_least(1), default=128)
    train.add_argument("--learning-rate", type=positive_float, default=3e-3)
    train.add_argument("--warmup-steps", type=at_least(0), default=50)
    train.add_argument("--save-steps", type=at_least(1), default=500)
    train.add_argument(
        "--eval-samples",
        type=at_least(1),
        default=512,
        help="validation sequences evaluated every --save-steps and at the end (default 512)",
    )
    train.add_argument(
        "--block-size",
        type=at_least(1),
        default=None,
        help="--kind mdm: a block diffusion model (block-causal attention, BD3-LM's objective) with blocks of this size",
    )
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--no-resume", action="store_true", help="start over even if checkpoints exist")
    train.set_defaults(func=_train)


def _add_hub_and_compare_commands(commands: Any) -> None:
    push = commands.add_parser("push", help="upload a trained model with its card to the Hub")
    push.add_argument("--model", required=True)
    push.add_argument("--repo-id", required=True)
    push.add_argument("--language", default=None)
    push.add_argument("--results", default=None, help="JSON list of {metric, value, setting}")
    push.add_argument("--private", action="store_true")
    push.add_argument("--project-url", default=None, help="an address the card links hf_mdm to (none by default)")
    push.set_defaults(func=_push)

    from .harness import compare as harness_compare  # stdlib and yaml only at import

    tiny_help = (
        "write the four tiny local models (an MDM, a LLaDA2 MoE, a DiffusionGemma and a Llama; untrained, byte "
        "tokenizer) that the hf-mdm-eval examples run offline"
    )
    tiny = commands.add_parser("tiny-models", help=tiny_help, description=tiny_help)
    tiny.add_argument(
        "directory", help="writes DIRECTORY/mdm, DIRECTORY/llada2, DIRECTORY/diffusion_gemma and DIRECTORY/llama"
    )
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_tiny_models)

    compare = commands.add_parser("compare", help="accuracy vs time of models x settings x tasks (lm-eval)")
    harness_compare.add_arguments(compare)
    compare.set_defaults(func=harness_compare.run)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    _set_threads(getattr(args, "threads", None))
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        return _fail(str(err))


if __name__ == "__main__":
    sys.exit(main())
