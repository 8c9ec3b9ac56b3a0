"""``python -m hf_mdm.gpu_check`` (``make gpu-check``): see `hf_mdm.gpu_check`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from . import run
from .shapes import shapes


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf_mdm.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU run of make test)")
    parser.add_argument("--quick", action="store_true", help="batch 1 only (about 3 minutes on one H100)")
    parser.add_argument("--output-dir", type=Path, default=Path("results/gpu"))
    parser.add_argument(
        "--budget-s",
        type=float,
        default=330.0,
        help="rows started past this many seconds (from the command's start) are skipped",
    )
    parser.add_argument("--models", nargs="+", choices=[s.name for s in shapes()], default=None)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu-check: no CUDA device here: run it on a GPU machine, or pass --device cpu --tiny", file=sys.stderr)
        return 2
    run(args.device, args.tiny, args.quick, args.output_dir, args.budget_s, models=args.models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
