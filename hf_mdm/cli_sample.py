"""``hf-mdm sample`` and ``hf-mdm score``: drawing sequences from an MDM, an AR model or the exact-posterior oracle,
and scoring them against a synthetic language."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .argtypes import at_least, positive_float


def _load_sampler_model(args: argparse.Namespace):
    """(model, kind, language): ``--model oracle`` needs ``--language``; checkpoints carry ``language/``. A
    checkpoint of the wrong ``--kind`` (or a uniform-noise one) is refused before its weights load."""
    from transformers import AutoConfig

    from .checkpoints import check_local_path
    from .languages import OracleDenoiser, load_language
    from .loading import checkpoint_kind, load_pretrained, require_kind

    language = load_language(args.language) if args.language else None
    if args.model == "oracle":
        if language is None:
            raise ValueError("--model oracle needs --language (a saved language directory)")
        return OracleDenoiser(language, mask_token_id=language.vocab_size), "mdm", language
    check_local_path(args.model, "--model")
    if language is None and (Path(args.model) / "language").is_dir():
        language = load_language(Path(args.model) / "language")
    config = AutoConfig.from_pretrained(args.model)
    kind = checkpoint_kind(config)
    if args.kind == "ar":
        require_kind(config, "autoregressive", args.model, "hf-mdm sample --kind ar", hint=": pass --kind mdm")
    elif args.kind == "mdm" or kind == "uniform":
        hint = "; or pass --kind ar to sample it as one" if kind == "autoregressive" else ""
        require_kind(config, "masked", args.model, "hf-mdm sample", hint=hint)
    if kind == "autoregressive":
        _reject_diffusion_flags(args, config.model_type)
    model = load_pretrained(args.model, tokenizer=False).model
    if kind == "masked" and args.schedule and hasattr(config, "schedule"):
        from .schedules import get_schedule

        if get_schedule(args.schedule) != get_schedule(config.schedule):
            raise ValueError(
                f"--schedule {args.schedule!r} differs from the schedule the model was trained with "
                f"({config.schedule!r}): drop --schedule or pass the training schedule"
            )
    return model, "mdm" if kind == "masked" else "ar", language


SAMPLER_FLAGS = (
    "steps",
    "transfer",
    "strategy",
    "schedule",
    "temperature",
    "draft_length",
    "remdm",
    "remdm_eta",
    "remdm_t_on",
    "remdm_t_off",
    "remdm_alpha_on",
)


def _reject_diffusion_flags(args: argparse.Namespace, model_type: str) -> None:
    """A ValueError naming the sampler flags given for an autoregressive checkpoint, which samples ancestrally at
    temperature 1 and would ignore them."""
    given = [f"--{name.replace('_', '-')}" for name in SAMPLER_FLAGS if getattr(args, name) is not None]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise ValueError(
            f"{' '.join(given)} {verb} to diffusion models only: --model {args.model} is an autoregressive "
            f"checkpoint ({model_type!r}), sampled ancestrally at temperature 1; drop {' '.join(given)}"
        )


def _sample(args: argparse.Namespace) -> int:
    """MDMs sample with the sampler's own resolution: the flags given, then the model's generation config and
    training schedule, then the paper's sampler (`PAPER_SAMPLER`)."""
    import torch

    from .experiments import PAPER_SAMPLER, sample_ar
    from .fileio import write_atomic
    from .generation import diffusion_generate, resolve_config

    model, kind, _ = _load_sampler_model(args)
    sampler: dict[str, Any] = {}
    if kind == "ar":
        samples = sample_ar(model, args.num, args.length, seed=args.seed)
    else:
        given = {name: getattr(args, name) for name in SAMPLER_FLAGS}
        defaults = dict(PAPER_SAMPLER)
        if given["transfer"] == "speculative":  # it samples the left-to-right order: no strategy to default
            defaults.pop("strategy")
        config = resolve_config(
            model, None, {**given, "max_new_tokens": args.length, "stop_at_eos": False}, defaults=defaults
        )
        sampler = {name: getattr(config, name) for name in SAMPLER_FLAGS}
        samples = diffusion_generate(
            model, torch.zeros(args.num, 0, dtype=torch.long), generation_config=config, seed=args.seed
        )
    write_atomic(
        Path(args.output),
        json.dumps(
            {"model": args.model, "kind": kind, "steps": args.steps, "sampler": sampler, "samples": samples.tolist()},
            default=str,
        ),
    )
    used = "".join(f", {name} {value}" for name, value in sampler.items() if value is not None)
    print(f"wrote {samples.shape[0]} samples of length {samples.shape[1]} to {args.output}{used}")
    if kind == "mdm":
        _print_generate_difference(model, {name: sampler[name] for name in defaults if given[name] is None})
    return 0


def _print_generate_difference(model: Any, defaulted: dict[str, Any]) -> None:
    """Says which of the settings this command defaulted (to the paper's sampler, `PAPER_SAMPLER`) differ from what
    ``model.generate`` would use (its generation config's)."""
    from .generation import resolve_config

    plain = resolve_config(model, None, {"max_new_tokens": 1})
    differ = [f"{name}={getattr(plain, name)!r}" for name, value in defaulted.items() if getattr(plain, name) != value]
    if differ:
        print(
            "note: this command defaults to the paper's sampler; model.generate() without these flags would use "
            + ", ".join(differ)
            + " (pass --transfer/--strategy/--temperature to choose)"
        )


def _score(args: argparse.Namespace) -> int:
    from .languages import load_language
    from .metrics import GenerativePerplexity, SequenceErrorRate

    samples = read_samples(Path(args.samples))
    language = load_language(args.language)
    gen = GenerativePerplexity().compute(
        predictions=samples, language=language, skip_out_of_support=args.skip_out_of_support
    )
    ser = SequenceErrorRate().compute(predictions=samples, language=language)
    print(json.dumps(_json_scores({**gen, **ser}, args.skip_out_of_support), indent=1, allow_nan=False))
    return 0


def read_samples(path: Path) -> list:
    """The samples of a file ``hf-mdm sample --output`` wrote (``{"samples": [[ids], ...], ...}``) or a JSON list of
    id lists; a ValueError naming the file (and the line and column of invalid JSON) for anything else."""
    payload = _read_json(path, "--samples")
    if isinstance(payload, dict) and "samples" not in payload:
        keys = ", ".join(map(repr, payload)) or "none"
        raise ValueError(
            f"--samples {path}: no `samples` key (its keys: {keys}): pass the file hf-mdm sample --output wrote, "
            "or a JSON list of token-id lists"
        )
    samples = payload["samples"] if isinstance(payload, dict) else payload
    if not isinstance(samples, list):
        raise ValueError(
            f"--samples {path}: the samples are of type {type(samples).__name__}, not a list of token-id lists"
        )
    bad = next((i for i, row in enumerate(samples) if not isinstance(row, list)), None)
    if bad is not None:
        raise ValueError(
            f"--samples {path}: sample {bad} is of type {type(samples[bad]).__name__}, not a list of token ids"
        )
    return samples


def _read_json(path: Path, flag: str) -> Any:
    """The JSON value in ``path``; a ValueError naming the flag, the file and where its JSON breaks."""
    if not path.is_file():
        raise ValueError(f"{flag} {path}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{flag} {path}: not valid JSON at line {err.lineno}, column {err.colno} ({err.msg})"
        ) from None
    except UnicodeDecodeError:
        raise ValueError(f"{flag} {path}: not a JSON text file") from None


def _json_scores(scores: dict[str, Any], skipped: bool) -> dict[str, Any]:
    """Scores as JSON allows: an infinite or undefined value becomes null, with a note saying why."""
    import math

    finite = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in scores.items()}
    outside, total = scores["num_out_of_support"], scores["num_sequences"]
    if finite["generative_perplexity"] is None and not skipped:
        finite["note"] = (
            f"{outside} of {total} samples are outside the language's support, so their generative perplexity is "
            "infinite (null here): pass --skip-out-of-support for that of the samples inside it"
        )
    elif finite["generative_perplexity"] is None:
        finite["note"] = (
            f"all {total} samples are outside the language's support: generative perplexity is undefined (null)"
        )
    return finite


# ----------------------------------------------------------------------------------------------------------------
# push / compare


def add_commands(commands: Any) -> None:
    """``hf-mdm sample`` and ``hf-mdm score``."""
    sample = commands.add_parser("sample", help="sample from an MDM, an AR model or the exact-posterior oracle")
    sample.add_argument("--model", required=True, help="a checkpoint directory, or `oracle`")
    sample.add_argument("--kind", choices=["mdm", "ar"], default=None, help="check the checkpoint is of this kind")
    sample.add_argument("--language", default=None, help="saved language directory (needed for --model oracle)")
    sample.add_argument("--num", type=at_least(1), default=256)
    sample.add_argument("--length", type=at_least(1), required=True)
    unset = "default: the model's generation config, else the paper's sampler"
    sample.add_argument(
        "--steps", type=at_least(1), default=None, help="default: the model's generation config, else one per token"
    )
    sample.add_argument("--transfer", default=None, help=f"{unset} (stochastic)")
    sample.add_argument("--strategy", default=None, help=f"{unset} (random)")
    sample.add_argument(
        "--draft-length",
        type=at_least(1),
        default=None,
        help="drafts per round of --transfer speculative (exact speculative decoding)",
    )
    sample.add_argument(
        "--remdm",
        choices=["cap", "rescale", "conf", "loop"],
        default=None,
        help="ReMDM remasking on the paper's sampler (with --remdm-eta; loop: --remdm-t-on/--remdm-t-off and "
        "--remdm-alpha-on; published loop: 0.55/0.05, alpha_on 0.9, eta 0.02)",
    )
    sample.add_argument("--remdm-eta", type=at_least(0.0, float), default=None)
    sample.add_argument("--remdm-t-on", type=positive_float, default=None)
    sample.add_argument("--remdm-t-off", type=positive_float, default=None)
    sample.add_argument("--remdm-alpha-on", type=positive_float, default=None)
    sample.add_argument("--schedule", default=None, help="default: the model's training schedule, which it must match")
    sample.add_argument("--temperature", type=at_least(0.0, float), default=None, help=f"{unset} (1.0)")
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--output", required=True)
    sample.set_defaults(func=_sample)

    score = commands.add_parser(
        "score",
        help="generative perplexity and SER of samples under the true language (the paper's TER: hf_mdm.metrics)",
    )
    score.add_argument("--samples", required=True)
    score.add_argument("--language", required=True)
    score.add_argument("--skip-out-of-support", action="store_true")
    score.set_defaults(func=_score)
