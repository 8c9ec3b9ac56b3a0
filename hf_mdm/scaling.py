"""The accelerate configuration files shipped with hf_mdm (``hf_mdm/configs/accelerate``): ``multi_cpu`` (data
parallelism on CPU processes), ``fsdp``, ``deepspeed_zero2``, ``deepspeed_zero3`` (sharded training on GPUs). Each
file's header says what it is for and the command that uses it. In an installed package,

    accelerate launch --config_file "$(python -m hf_mdm.scaling fsdp)" --num_processes 8 -m hf_mdm.cli sft ...

``python -m hf_mdm.scaling`` with no name lists the paths of all of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["ACCELERATE_CONFIGS", "accelerate_config"]

ACCELERATE_CONFIGS = Path(__file__).resolve().parent / "configs" / "accelerate"


def accelerate_config(name: str) -> Path:
    """The path of the shipped accelerate config ``name`` (with or without ``.yaml``); a ValueError naming the
    shipped ones otherwise."""
    path = ACCELERATE_CONFIGS / f"{name.removesuffix('.yaml')}.yaml"
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in ACCELERATE_CONFIGS.glob("*.yaml")))
        raise ValueError(f"no shipped accelerate config {name!r}: the configs are {shipped}")
    return path


def main(argv: list[str]) -> int:
    try:
        paths = [accelerate_config(name) for name in argv] or sorted(ACCELERATE_CONFIGS.glob("*.yaml"))
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    print("\n".join(str(path) for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
