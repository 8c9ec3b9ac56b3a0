"""``hf-mdm export``: the command line of `hf_mdm.export` (arguments and printing only). It prints the command that
serves the exported folder:

    hf-mdm export --model runs/sft --output-dir serve/llada2 --target sglang
    python -m sglang.launch_server --model-path serve/llada2 --trust-remote-code --dllm-algorithm LowConfidence \\
        --dllm-algorithm-config serve/llada2/dllm_algorithm.yaml
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

TARGET_HELP = (
    "the serving engine: sglang (LLaDA2.0/2.1 and DiffusionGemma) or vllm (DiffusionGemma, in transformers' format)"
)


def _export(args: argparse.Namespace) -> int:
    from .export import export_for_serving

    result = export_for_serving(
        args.model,
        args.output_dir,
        target=args.target,
        overwrite=args.overwrite,
        max_shard_size=args.max_shard_size,
        dtype=args.dtype,
    )
    for note in result.notes:
        print(f"hf-mdm export: warning: {note}", file=sys.stderr)
    merged = " (LoRA adapter merged)" if result.adapter_merged else ""
    print(f"exported {args.model}{merged} for {args.target} to {result.output_dir}")
    print("serve it with:")
    print(f"  {result.launch_line}")
    if args.target == "sglang":
        print("(add --tp-size N to split it over N GPUs, --max-running-requests N to decode N requests at once)")
    return 0


def add_commands(commands: Any) -> None:
    """``hf-mdm export``."""
    export = commands.add_parser(
        "export",
        help="write a checkpoint as a serving engine loads it (SGLang: LLaDA2.x, DiffusionGemma; vLLM: DiffusionGemma)",
    )
    export.add_argument("--model", required=True, help="a checkpoint folder, or a LoRA adapter folder (merged)")
    export.add_argument("--output-dir", required=True, help="the folder to write (written whole, or not at all)")
    export.add_argument("--target", required=True, help=TARGET_HELP)
    export.add_argument("--overwrite", action="store_true", help="replace --output-dir when it exists and is not empty")
    export.add_argument("--max-shard-size", default="5GB", help="the largest safetensors shard (default 5GB)")
    export.add_argument(
        "--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto", help="default: as saved"
    )
    export.set_defaults(func=_export)
