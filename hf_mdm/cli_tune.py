"""``hf-mdm tune``: the command line of `hf_mdm.tuning.tune` (loading and argument checks only)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(model, language, AR baseline or None): ``--model oracle`` is the language's exact-posterior oracle."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from .checkpoints import check_local_path
    from .languages import OracleDenoiser, load_language

    folder = Path(args.language) if args.language else Path(args.model) / "language"
    if not folder.is_dir():
        raise ValueError(f"no language at {folder}: pass --language (a saved language directory)")
    language = load_language(folder)
    if args.model == "oracle":
        model = OracleDenoiser(language, mask_token_id=language.vocab_size)
    else:
        check_local_path(args.model, "--model")
        model = AutoModelForMaskedLM.from_pretrained(args.model).eval()
    ar = None
    if args.ar_model:
        check_local_path(args.ar_model, "--ar-model")
        ar = AutoModelForCausalLM.from_pretrained(args.ar_model).eval()
    return model, language, ar


def _space(path: str) -> list:
    import yaml

    if not Path(path).is_file():
        raise ValueError(f"--space {path}: no such file (a YAML list of groups, each field: [values])")
    space = yaml.safe_load(Path(path).read_text())
    return space.get("space", space) if isinstance(space, dict) else space


def _tune(args: argparse.Namespace) -> int:
    from .fileio import write_atomic
    from .tuning import SyntheticTask, tune

    space = _space(args.space)
    model, language, ar = _load(args)
    task = SyntheticTask(language, args.length, batch_size=args.batch_size)
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
        ar_model=ar,
    )
    print((Path(args.output_dir) / "front.md").read_text())
    if args.save_to_model and args.model != "oracle":
        config = (Path(args.output_dir) / "generation_config.json").read_text()
        write_atomic(Path(args.model) / "generation_config.json", config)
        print(f"{args.model}/generation_config.json now holds the chosen setting: generate uses it by default")
    print(f"samples used: {result['samples_used']}; files in {args.output_dir}")
    return 0


def add_tune_command(commands: Any, at_least: Callable) -> None:
    """``hf-mdm tune`` (``at_least``: the command line's integer-range type)."""
    tune = commands.add_parser("tune", help="the sampler settings that win for a model and a synthetic language")
    tune.add_argument("--model", required=True, help="an MDM checkpoint directory, or `oracle`")
    tune.add_argument("--language", default=None, help="saved language directory (default: the model's language/)")
    tune.add_argument("--space", required=True, help="YAML: a list of groups, each mapping generate fields to values")
    tune.add_argument("--length", type=at_least(1), required=True, help="tokens per sample")
    tune.add_argument("--output-dir", required=True, help="front.json/csv/md/png, generation_config.json, cache")
    tune.add_argument("--search", choices=["halving", "grid"], default="halving")
    tune.add_argument("--min-samples", type=at_least(1), default=32, help="samples each setting gets first")
    tune.add_argument("--max-samples", type=at_least(1), default=256, help="samples of the settings never dropped")
    tune.add_argument("--tolerance", type=float, default=0.02, help="quality the chosen setting may give up")
    tune.add_argument("--rounds", type=at_least(1), default=5, help="interleaved timing rounds")
    tune.add_argument("--batch-size", type=at_least(1), default=64)
    tune.add_argument("--ar-model", default=None, help="an AR checkpoint timed and scored as the reference")
    tune.add_argument(
        "--save-to-model", action="store_true", help="also write the chosen generation_config.json into --model"
    )
    tune.set_defaults(func=_tune)
