"""``python -m hf_mdm.harness.model_args MODEL``: every argument hf_mdm's lm-eval model MODEL takes, by kind (its own,
the sampler's, lm-eval HFLM's). The one-line errors about a misspelled argument point here
(`hf_mdm.harness.argument_checks`)."""

from __future__ import annotations

import sys
from typing import Optional

from .argument_checks import LIST_COMMAND
from .models import DiffusersPipelineLM, DiffusionGemmaLM, MaskedDiffusionLM, TimedHFLM

__all__ = ["model_arguments"]

MODELS = (MaskedDiffusionLM, TimedHFLM, DiffusionGemmaLM, DiffusersPipelineLM)


def model_arguments(model: str) -> dict[str, list[str]]:
    """Every argument hf_mdm's lm-eval model ``model`` takes, by kind (its own, the sampler's, lm-eval HFLM's)."""
    known = {cls.registered_name: cls for cls in MODELS}
    if model not in known:
        raise ValueError(f"{model}: not one of hf_mdm's lm-eval models ({', '.join(known)})")
    return known[model].known_arguments()


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m hf_mdm.harness.model_args MODEL``: every argument of the lm-eval model MODEL, one kind a line."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: {LIST_COMMAND} MODEL (hf_mdm, hf_timed, ...)", file=sys.stderr)
        return 2
    try:
        known = model_arguments(argv[0])
    except ValueError as err:
        print(f"model_args: error: {err}", file=sys.stderr)
        return 2
    for kind, names in known.items():
        print(f"{kind}: {', '.join(sorted(names))}")
    print("other names are passed to from_pretrained and must be fields of the checkpoint's config")
    return 0


if __name__ == "__main__":
    sys.exit(main())
