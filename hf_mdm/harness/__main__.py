"""``hf-mdm-eval`` / ``python -m hf_mdm.harness``: lm-eval's command line with hf_mdm's models and tasks.

Everything is lm-eval 0.4's CLI (``run``, ``ls``, ``validate``, every flag, and the legacy form without a
subcommand, which means ``run``), with these additions:

- the models ``hf_mdm``, ``hf_timed``, ``hf_diffusion_gemma`` and ``hf_diffusers`` are registered;
- hf_mdm's task directory is on the include path (after any ``--include_path`` of yours);
- ``run`` evaluates through `hf_mdm.harness.simple_evaluate`, so results and samples carry timing, and indexes
  lm-eval's built-in tasks only when a requested task is not one of hf_mdm's;
- ``run --use_cache PREFIX`` is resumable: killed at any point and started again with the same command, it redoes
  only the requests that had not finished (`hf_mdm.harness.resume`); result and sample files are written whole or
  not at all; a bad argument ends in one line that names it.

Examples::

    hf-mdm-eval run --model hf_mdm --model_args pretrained=GSAI-ML/LLaDA-8B-Base,steps=256,block_length=32 \\
        --tasks mdm_gsm8k --batch_size 8 --output_path runs/llada --log_samples
    HF_ALLOW_CODE_EVAL=1 hf-mdm-eval run --model hf_timed --model_args pretrained=Qwen/Qwen2.5-1.5B \\
        --tasks mdm_humaneval --confirm_run_unsafe_code --output_path runs/qwen
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 -m hf_mdm.harness run ...

A run checks before it starts that it can finish (`hf_mdm.harness.requirements`: code-execution opt-ins, offline
data) and that ``accelerate launch`` really started the processes it was asked for (`hf_mdm.harness.launch`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import sys
from typing import Any, Iterator, Optional, Sequence

import lm_eval
import lm_eval.tasks
import yaml
from lm_eval._cli import HarnessCLI as LMEvalCLI
from lm_eval.utils import setup_logging

from .evaluator import TASKS_DIR, build_task_manager, simple_evaluate, task_names
from .launch import check_launch, close_process_group
from .requirements import check_requirements
from .resume import atomic_outputs

__all__ = ["HarnessCLI", "main"]


class HarnessCLI(LMEvalCLI):
    """lm-eval's `HarnessCLI` with hf_mdm's models and tasks (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._parser.prog = "hf-mdm-eval"

    def parse_args(self, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:  # type: ignore[override]
        """lm-eval's parsing, on ``argv`` (default ``sys.argv[1:]``): arguments without a subcommand mean ``run``."""
        argv = list(sys.argv[1:] if argv is None else argv)
        if len(argv) > 1 and argv[0] not in self._subparsers.choices:
            argv.insert(0, "run")
        elif argv == ["run"]:
            self._subparsers.choices["run"].print_help()
            raise SystemExit(0)
        return self._parser.parse_args(argv)

    def execute(self, args: argparse.Namespace) -> None:
        if hasattr(args, "include_path"):
            args.include_path = _include_paths(args)
        run = getattr(args, "command", None) == "run"
        with contextlib.ExitStack() as stack:
            if run:  # our simple_evaluate and task index; whole-or-nothing output files
                stack.enter_context(_run_hooks(args))
                stack.enter_context(atomic_outputs())
            args.func(args)


def _include_paths(args: argparse.Namespace) -> list[str]:
    """The user's include paths (flag, else the ``--config`` file's; ``:``-separated allowed), then ours."""
    user = args.include_path
    if user is None and getattr(args, "config", None):
        with open(args.config, encoding="utf-8") as handle:
            user = (yaml.safe_load(handle) or {}).get("include_path")
    paths = [] if not user else [user] if not isinstance(user, (list, tuple)) else list(user)
    paths = [part for path in paths for part in str(path).split(os.pathsep) if part]
    return paths + [str(TASKS_DIR)]


def _requested_tasks(args: argparse.Namespace) -> list[str]:
    tasks = args.tasks
    if tasks is None and getattr(args, "config", None):
        with open(args.config, encoding="utf-8") as handle:
            tasks = (yaml.safe_load(handle) or {}).get("tasks")
    if isinstance(tasks, str):
        tasks = [tasks]
    return [t for task in tasks or [] for t in str(task).split(",") if t]


@contextlib.contextmanager
def _run_hooks(args: argparse.Namespace) -> Iterator[None]:
    """For the duration of ``run``: lm-eval's CLI calls our `simple_evaluate`, and its TaskManager skips the
    built-in task index when only hf_mdm's tasks are requested (lm-eval has no plugin hooks for either)."""
    replacements: dict[str, Any] = {"simple_evaluate": simple_evaluate}
    tasks = _requested_tasks(args)
    patches = [(lm_eval, replacements)]
    if tasks and all(t in task_names() for t in tasks):
        patches.append((lm_eval.tasks, {"TaskManager": functools.partial(_our_task_manager, tasks)}))
    saved = []
    try:
        for module, attributes in patches:
            for name, value in attributes.items():
                saved.append((module, name, module.__dict__.get(name, _MISSING)))
                setattr(module, name, value)
        yield
    finally:
        for module, name, value in reversed(saved):
            if value is _MISSING:
                delattr(module, name)
            else:
                setattr(module, name, value)


_MISSING = object()


def _our_task_manager(tasks: list[str], include_path: Any = None, metadata: Optional[dict] = None, **_: Any):
    """lm-eval's ``TaskManager(include_path=..., metadata=...)`` call, answered by `build_task_manager`."""
    paths = include_path if isinstance(include_path, list) else [include_path] if include_path else []
    user = [p for p in paths if str(p) != str(TASKS_DIR)]
    return build_task_manager(tasks, include_path=user, metadata=metadata)


def _check_run(args: argparse.Namespace) -> None:
    """A ``run`` that cannot finish fails before it starts (`hf_mdm.harness.launch`, `.requirements`)."""
    check_launch()
    if getattr(args, "command", None) == "run":
        check_requirements(_requested_tasks(args), bool(getattr(args, "confirm_run_unsafe_code", False)))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``hf-mdm-eval``."""
    setup_logging()
    cli = HarnessCLI()
    args = cli.parse_args(argv)
    try:
        _check_run(args)
        cli.execute(args)
        close_process_group()
    except ValueError as err:  # bad model arguments, settings or inputs: the message says what to change
        logging.getLogger(__name__).debug("hf-mdm-eval failed", exc_info=True)
        print(f"hf-mdm-eval: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
