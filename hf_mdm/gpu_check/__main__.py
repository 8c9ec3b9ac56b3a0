"""``python -m hf_mdm.gpu_check`` (``make gpu-check``): see `hf_mdm.gpu_check`."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from . import run
from .schedule import BUDGET_S
from .shapes import shapes


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf_mdm.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (with --tiny)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU run of make test)")
    parser.add_argument("--quick", action="store_true", help="batch 1 only")
    parser.add_argument("--output-dir", type=Path, default=Path("results/gpu"))
    parser.add_argument(
        "--budget-s",
        type=float,
        default=BUDGET_S,
        help="the plan keeps what its estimates fit in this many seconds (default 480); a part whose estimate would "
        "end past it (from the command's start) is skipped; 0 skips every part",
    )
    parser.add_argument("--models", nargs="+", choices=[s.name for s in shapes()], default=None)
    args = parser.parse_args(argv)
    refusal = refusal_of(args)
    if refusal:
        print(f"gpu-check: {refusal}", file=sys.stderr)
        return 2
    run(args.device, args.tiny, args.quick, args.output_dir, args.budget_s, models=args.models)
    return 0


def refusal_of(args: argparse.Namespace) -> str:
    """Why the check cannot run with these arguments (what to change), before anything runs; "" when it can."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        return f"--device {args.device}: the check runs on cuda (cuda:N for another GPU) or cpu (with --tiny)"
    if not args.budget_s >= 0:  # NaN too
        return f"--budget-s {args.budget_s:g}: a time budget must be >= 0 seconds (0 skips every row)"
    if args.device == "cpu" and not args.tiny:
        return (
            "--device cpu without --tiny would build the released 7-8B and 16B shapes in host memory: add --tiny "
            "(the tiny stand-ins)"
        )
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return "no CUDA device here: run it on a GPU machine, or pass --device cpu --tiny"
    return ""


if __name__ == "__main__":
    sys.exit(main())
