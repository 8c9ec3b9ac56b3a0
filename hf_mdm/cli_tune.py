"""``hf-mdm tune``: the command line of `hf_mdm.tuning.tune` (loading and argument checks only)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .argtypes import at_least


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(model, language, AR baseline or None): ``--model oracle`` is the language's exact-posterior oracle."""
    from .languages import OracleDenoiser, load_language
    from .loading import load_pretrained

    folder = Path(args.language) if args.language else Path(args.model) / "language"
    if not folder.is_dir():
        raise ValueError(f"no language at {folder}: pass --language (a saved language directory)")
    language = load_language(folder)
    if args.model == "oracle":
        model = OracleDenoiser(language, mask_token_id=language.vocab_size)
    else:
        model = load_pretrained(args.model, require="masked", command="hf-mdm tune", tokenizer=False).model
    ar = None
    if args.ar_model:
        ar = load_pretrained(
            args.ar_model, require="autoregressive", command="hf-mdm tune", flag="--ar-model", tokenizer=False
        ).model
    return model, language, ar


def _space(path: str) -> list:
    """The space of the YAML file ``path``, checked (`hf_mdm.tuning.expand`) as it is read."""
    from .fileio import read_yaml
    from .tuning import expand

    if not Path(path).is_file():
        raise ValueError(f"--space {path}: no such file (a YAML list of groups, each field: [values])")
    space = read_yaml(path, "space")
    space = space.get("space", space) if isinstance(space, dict) else space
    try:
        expand(space)
    except ValueError as err:
        raise ValueError(f"--space {path}: {err}") from None
    return space


def _task(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(model, task, AR baseline or None): an lm-eval task with ``--task``, else the synthetic language."""
    from .tuning import LmEvalTask, SyntheticTask
    from .tuning.tasks import check_documents, load_lm_eval_task

    if args.task:
        from .harness.evaluator import create_lm

        if args.model == "oracle":
            raise ValueError("--task runs a checkpoint through lm-eval: pass --model PATH, not oracle")
        models = [("--model", args.model)] + ([("--ar-model", args.ar_model)] if args.ar_model else [])
        manager = _check_task_inputs(args.task, models)
        start = args.test_start if args.test_start is not None else args.max_samples
        check_documents(load_lm_eval_task(manager, args.task), args.task, args.timing_rows, args.max_samples, start)
        lm = create_lm("hf_mdm", {"pretrained": args.model}, batch_size=args.batch_size)
        ar = create_lm("hf_timed", {"pretrained": args.ar_model}, batch_size=args.batch_size) if args.ar_model else None
        task = LmEvalTask(lm, args.task, start, args.metric, args.max_gen_toks, manager)
        return lm.model, task, ar
    if args.length is None:
        raise ValueError("--length is needed with a synthetic language (or pass --task for an lm-eval task)")
    model, language, ar = _load(args)
    return model, SyntheticTask(language, args.length, batch_size=args.batch_size, quality=args.quality), ar


def _check_task_inputs(task: str, models: list[tuple[str, str]]) -> Any:
    """Before any model loads: the task is one lm-eval knows, and each local checkpoint (flag, path) has a tokenizer
    to read it. Returns the task manager."""
    from .harness.evaluator import build_task_manager
    from .loading import check_tokenizer

    manager = build_task_manager([task])
    if task not in manager.all_tasks:
        raise ValueError(f"--task {task}: no such lm-eval task (hf_mdm's: mdm_gsm8k, mdm_gsm8k_chain, mdm_mbpp, ...)")
    for flag, model in models:
        check_tokenizer(model, flag)  # --task reads and writes text
    return manager


def _tune(args: argparse.Namespace) -> int:
    from .tuning.run import check_arguments

    if args.save_to_model and args.model == "oracle":
        raise ValueError(
            "--save-to-model writes the chosen setting into the --model folder, and the oracle has none: drop "
            f"--save-to-model (the setting is written to {args.output_dir}/generation_config.json either way)"
        )
    check_arguments(args.search, args.min_samples, args.max_samples, args.tolerance, args.rounds, args.timing_rows)
    space = _space(args.space)
    try:
        result, task = _run(args, space)
    except KeyboardInterrupt:
        print(f"hf-mdm tune: interrupted; {_kept(Path(args.output_dir) / 'cache.json')}", file=sys.stderr)
        return 130
    print((Path(args.output_dir) / "front.md").read_text())
    if args.save_to_model:
        _save_to_model(args, task)
    print(f"samples used: {result['samples_used']}; files in {args.output_dir}")
    return 0


def _run(args: argparse.Namespace, space: list) -> tuple[dict, Any]:
    """(what `hf_mdm.tuning.tune` returns, the task)."""
    from .tuning import tune

    model, task, ar = _task(args)
    result = tune(
        model,
        task,
        space,
        args.output_dir,
        how=args.search,
        min_samples=args.min_samples,
        max_samples=args.max_samples,
        tolerance=args.tolerance,
        rounds=args.rounds,
        timing_rows=args.timing_rows,
        ar_model=ar,
    )
    return result, task


def _save_to_model(args: argparse.Namespace, task: Any) -> None:
    from .fileio import write_atomic

    config = (Path(args.output_dir) / "generation_config.json").read_text()
    write_atomic(Path(args.model) / "generation_config.json", config)
    fixed = ", ".join(f"{k}={v}" for k, v in task.generation_fields.items())
    print(
        f"{args.model}/generation_config.json now holds the chosen setting with every field it was measured with "
        f"({fixed}): generate uses it by default"
    )


def _kept(cache: Path) -> str:
    """What an interrupted run kept in its cache, and how to go on."""
    try:
        cells = json.loads(cache.read_text()) if cache.is_file() else {}
    except ValueError:
        cells = {}
    rounds = sum("|round " in key for key in cells)
    chunks = sum(key.startswith(("chunk|", "ar|")) for key in cells)
    if not rounds and not chunks:
        return "no measurement had finished: rerun the same command to start again"
    return (
        f"kept {rounds} timed round(s) and {chunks} chunk(s) of samples in {cache}: rerun the same command to "
        "resume from them"
    )


def add_commands(commands: Any) -> None:
    """``hf-mdm tune``."""
    tune = commands.add_parser("tune", help="the sampler settings that win for a model on a language or lm-eval task")
    tune.add_argument("--model", required=True, help="an MDM checkpoint directory, or `oracle`")
    tune.add_argument("--language", default=None, help="saved language directory (default: the model's language/)")
    tune.add_argument("--space", required=True, help="YAML: a list of groups, each mapping generate fields to values")
    tune.add_argument("--length", type=at_least(1), default=None, help="tokens per sample (synthetic languages)")
    tune.add_argument(
        "--quality",
        choices=["valid", "likelihood"],
        default="valid",
        help="synthetic languages: the share of valid samples (1 - SER), or their mean log q(x) per token",
    )
    tune.add_argument("--task", default=None, help="an lm-eval generation task (e.g. mdm_gsm8k) instead of a language")
    tune.add_argument("--metric", default="exact_match", help="--task: the 0/1 metric whose share is the quality")
    tune.add_argument("--max-gen-toks", type=at_least(1), default=256, help="--task: tokens generated at most")
    tune.add_argument(
        "--test-start",
        type=at_least(0),
        default=None,
        help="--task: the first held-out document (default --max-samples)",
    )
    tune.add_argument("--output-dir", required=True, help="front.json/csv/md/png, generation_config.json, cache")
    tune.add_argument("--search", choices=["halving", "grid"], default="halving")
    tune.add_argument("--min-samples", type=at_least(1), default=32, help="samples each setting gets first")
    tune.add_argument("--max-samples", type=at_least(1), default=256, help="samples of the settings never dropped")
    tune.add_argument("--tolerance", type=float, default=0.02, help="quality the chosen setting may give up")
    tune.add_argument("--rounds", type=at_least(1), default=5, help="interleaved timing rounds")
    tune.add_argument("--timing-rows", type=at_least(1), default=16, help="samples (documents) per timed call")
    tune.add_argument("--batch-size", type=at_least(1), default=64)
    tune.add_argument(
        "--ar-model",
        default=None,
        help="an AR checkpoint timed and scored as the reference (with --task: through hf_timed)",
    )
    tune.add_argument(
        "--save-to-model", action="store_true", help="also write the chosen generation_config.json into --model"
    )
    tune.set_defaults(func=_tune)
