"""The ``hf-mdm`` command line."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _reproduce(args: argparse.Namespace) -> int:
    print(
        "hf-mdm reproduce: the end-to-end reproduction of the paper's synthetic experiments (training MDM and AR "
        "models, TER/SER vs steps, wall-clock vs length) is not part of this release yet.\n"
        "Available now: the model and sampler (see README), and `python evaluation/bench_sampler.py`."
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-mdm", description="Masked diffusion language models: tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    reproduce = commands.add_parser("reproduce", help="reproduce the paper's synthetic experiments")
    reproduce.set_defaults(func=_reproduce)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
