"""Virtual environments for the suite at three points of the declared dependency ranges, and the lock.

    python tools/envs.py create .venv --versions locked    # what `make test` / `make reproduce` install
    python tools/envs.py create .venv-newest --versions newest --fresh
    python tools/envs.py create .venv-lowest --versions lowest --fresh
    python tools/envs.py lock .venv-newest                  # constraints.txt from that environment
    python tools/envs.py versions .venv-lowest              # the versions an environment holds

``locked`` installs exactly the versions in ``constraints.txt`` (the suite last passed with them); ``newest`` the
newest releases the ranges in ``pyproject.toml`` admit; ``lowest`` every direct dependency at the lower bound of its
range (``name>=X`` pinned to ``X``; what they pull in resolved by pip). ``locked`` and ``newest`` install the ``test``,
``serve``, ``peers``, ``rl``, ``quant`` and ``docs`` extras, ``lowest`` the ``test``, ``serve`` and ``quant`` extras
(diffusers, the ``peers`` extra, needs a newer huggingface_hub than hf_mdm's lower bound, and TRL, the ``rl`` extra, a
newer datasets; their tests skip with the reason). PyTorch is installed first from
``TORCH_SPEC`` (default ``torch==2.13.0``, which takes a local CPU wheel where one lies on disk), so that the rest
installs nothing more for it; the lock therefore leaves torch out. Standard library only (Python >= 3.11 for tomllib).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")
TORCH_FALLBACK = "torch>=2.4,<3"
# The packages whose versions the README reports at each end of the ranges.
WATCHED = (
    "torch",
    "transformers",
    "lm_eval",
    "accelerate",
    "datasets",
    "evaluate",
    "huggingface_hub",
    "tokenizers",
    "diffusers",
)
LOCK_HEADER = """\
# The versions `make test` and `make reproduce` install (pip constraints; torch comes from TORCH_SPEC first).
# Written by `make lock` from a fresh environment of the newest releases in which the whole suite passed.
# Edit pyproject.toml for the ranges users get; regenerate this file, never edit it by hand.
"""


def run(*args: str) -> None:
    print("+", " ".join(args), flush=True)
    subprocess.run(args, check=True)


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def direct_requirements() -> list[str]:
    """The ``dependencies`` and the ``test``, ``serve`` and ``quant`` extras of pyproject.toml."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return list(project["dependencies"]) + list(extras["test"]) + list(extras["serve"]) + list(extras["quant"])


def lower_bound_pins(requirements: list[str]) -> list[str]:
    """``name==X`` for every requirement with a lower bound ``>=X`` (torch left to TORCH_SPEC)."""
    pins = []
    for requirement in requirements:
        match = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^]]*\])?\s*([^;]*)", requirement)
        name, spec = match.group(1), match.group(2)
        lower = re.search(r">=\s*([0-9][^,\s]*)", spec)
        if lower and name.lower() != "torch":
            pins.append(f"{name}=={lower.group(1)}")
    return pins


def create(venv: Path, versions: str, fresh: bool) -> None:
    """A virtual environment at ``venv`` with torch, then hf_mdm[test] at the asked versions."""
    if fresh and venv.exists():
        shutil.rmtree(venv)
    if not python_of(venv).exists():
        run(sys.executable, "-m", "venv", str(venv))
    pip = [str(python_of(venv)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    try:
        run(*pip, TORCH_SPEC)
    except subprocess.CalledProcessError:
        run(*pip, TORCH_FALLBACK)
    package = f"{ROOT}[test,serve,quant]" if versions == "lowest" else f"{ROOT}[test,peers,serve,rl,quant,docs]"
    if versions == "locked":
        run(*pip, "-c", str(LOCK), "-e", package)
    elif versions == "newest":
        run(*pip, "--upgrade", "--upgrade-strategy", "eager", "-e", package)
    else:
        pins = venv / "lower-bounds.txt"
        pins.write_text("\n".join(lower_bound_pins(direct_requirements())) + "\n")
        run(*pip, "-c", str(pins), "-e", package)
    (venv / "versions.json").write_text(json.dumps(installed(venv), indent=1) + "\n")


def freeze(venv: Path) -> list[str]:
    out = subprocess.run(
        [str(python_of(venv)), "-m", "pip", "freeze", "--exclude-editable", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line for line in out.splitlines() if line and not line.lower().startswith("torch==")]


def installed(venv: Path) -> dict[str, str]:
    """The versions of the WATCHED packages in ``venv`` (None for one it lacks)."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def version(n):\n    try:\n        return m.version(n)\n    except m.PackageNotFoundError:\n        return None\n"
        "print(json.dumps({n: version(n) for n in sys.argv[1:]}))"
    )
    out = subprocess.run([str(python_of(venv)), "-c", code, *WATCHED], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def lock(venv: Path) -> None:
    """Writes constraints.txt (atomically) from the packages installed in ``venv``."""
    tmp = LOCK.with_suffix(".txt.tmp")
    tmp.write_text(LOCK_HEADER + "\n".join(freeze(venv)) + "\n")
    os.replace(tmp, LOCK)
    print(f"wrote {LOCK.relative_to(ROOT)}: " + ", ".join(f"{k} {v}" for k, v in installed(venv).items()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("create", help="create or update a virtual environment")
    made.add_argument("venv", type=Path)
    made.add_argument("--versions", choices=("locked", "newest", "lowest"), default="locked")
    made.add_argument("--fresh", action="store_true", help="delete the environment first")
    commands.add_parser("lock", help="write constraints.txt from an environment").add_argument("venv", type=Path)
    commands.add_parser("versions", help="print an environment's versions").add_argument("venv", type=Path)
    args = parser.parse_args(argv)
    if args.command == "create":
        create(args.venv, args.versions, args.fresh)
    elif args.command == "lock":
        lock(args.venv)
    else:
        print(" ".join(f"{name} {version}" for name, version in installed(args.venv).items()))


if __name__ == "__main__":
    main()
