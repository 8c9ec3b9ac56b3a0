"""What an evaluation needs before its first request, checked up front so that a run never fails after doing work.

- tasks that execute generated code (``unsafe_code: true``: ``mdm_mbpp``, ``mdm_humaneval``) need the two opt-ins,
  ``HF_ALLOW_CODE_EVAL=1`` (`hf_mdm.harness.sandbox`) and ``--confirm_run_unsafe_code`` (lm-eval's), and the
  sandbox's operating-system layer (bubblewrap) or the opt-in to running without it
  (``HF_MDM_ALLOW_UNISOLATED_EXECUTION=1``);
- offline (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``) the benchmarks come from ``HF_MDM_DATA_DIR``, which must
  then be set (`hf_mdm.harness.data`);
- checkpoints must be local folders or models the Hub can give (`hf_mdm.harness.argument_checks.check_pretrained`).

`check_requirements` collects every unmet requirement of a whole run (``hf-mdm compare``'s matrix, or one
``hf-mdm-eval run``) into one ValueError that says what to change.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional

from .argument_checks import check_pretrained
from .data import DATA_DIR_ENV, data_dir
from .sandbox import ALLOW_ENV, code_execution_allowed, isolation_layer

__all__ = ["unsafe_tasks", "check_requirements"]

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def task_configs() -> dict[str, dict]:
    """hf_mdm's task configs by name (`hf_mdm.harness.evaluator.task_configs`, imported when first needed)."""
    from .evaluator import task_configs as configs

    return configs()


def unsafe_tasks(tasks: Iterable[str]) -> list[str]:
    """The tasks among ``tasks`` that execute generated code (hf_mdm's tasks with ``unsafe_code: true``)."""
    configs = task_configs()
    return sorted({t for t in tasks if configs.get(t, {}).get("unsafe_code")})


def _offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in OFFLINE_VARIABLES)


def _problems(tasks: list[str], confirm_unsafe_code: bool, checkpoints: Iterable[Any]) -> list[str]:
    problems = []
    unsafe = unsafe_tasks(tasks)
    if unsafe and not code_execution_allowed():
        problems.append(
            f"tasks {', '.join(unsafe)} run generated code: set {ALLOW_ENV}=1 (it runs in hf_mdm's sandbox)"
        )
    if unsafe and code_execution_allowed():
        try:
            isolation_layer()
        except (RuntimeError, ValueError) as err:
            problems.append(f"tasks {', '.join(unsafe)}: {err}")
    if unsafe and not confirm_unsafe_code:
        problems.append(
            f"tasks {', '.join(unsafe)} need lm-eval's --confirm_run_unsafe_code (in a compare config: "
            "`evaluate: {confirm_run_unsafe_code: true}`)"
        )
    ours = [t for t in tasks if t in task_configs()]
    try:
        local = data_dir()
    except FileNotFoundError as err:
        problems.append(str(err))
        local = True
    if ours and local is None and _offline():
        problems.append(
            f"tasks {', '.join(sorted(set(ours)))} read the Hub, which is offline ({' / '.join(OFFLINE_VARIABLES)}):"
            f" set {DATA_DIR_ENV} to a local copy of the benchmarks (see hf_mdm/harness/data.py)"
        )
    for checkpoint in dict.fromkeys(checkpoints):  # each once, in order
        try:
            check_pretrained(checkpoint)
        except ValueError as err:
            problems.append(str(err))
    return problems


def check_requirements(
    tasks: Iterable[str], confirm_unsafe_code: bool = False, checkpoints: Iterable[Optional[Any]] = ()
) -> None:
    """A ValueError listing every requirement of the run that is not met (see the module docstring)."""
    problems = _problems(list(tasks), bool(confirm_unsafe_code), [c for c in checkpoints if c is not None])
    if problems:
        raise ValueError("the run cannot start: " + "; ".join(problems))
