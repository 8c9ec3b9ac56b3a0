"""``tune``: the sampler settings that win for a model and a task, in five steps.

1. check the arguments, expand and check the space against the model (`space`) and the task's documents, before
   anything runs;
2. time every setting, and the AR baseline when given, in interleaved rounds (`search.time_settings`);
3. measure quality on the development split, spending samples by ``search`` (`search.search`);
4. the Pareto front and the chosen setting (`front`);
5. the chosen setting once on the held-out split, then the files (`outputs`), its ``generation_config.json`` the
   whole config it was measured with (`measured_config`).

Cells (timing rounds, chunks of samples) are cached in ``<output_dir>/cache.json``: the same call after a kill or
an interrupt continues.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..experiments.common import CellCache
from ..generation_config import MaskedDiffusionGenerationConfig
from .front import RESOLVING_ROUNDS, check_tolerance, choice_note, choose, pareto_front
from .outputs import write_outputs
from .search import check_search, describe, measured, search, time_settings
from .space import check_settings, expand
from .tasks import Counts

AR_NAME = "AR baseline"


def tune(
    model: Any,
    task: Any,
    space: Sequence[dict],
    output_dir: Any,
    how: str = "halving",
    min_samples: int = 32,
    max_samples: int = 256,
    tolerance: float = 0.02,
    rounds: int = 5,
    timing_rows: int = 16,
    ar_model: Optional[Any] = None,
    objective: Optional[Callable[[dict], float]] = None,
) -> dict:
    """Search ``space`` for ``model`` on ``task`` and write the answer into ``output_dir`` (see the module
    docstring); returns what ``front.json`` holds. ``objective`` (a row -> a score, higher better) picks the chosen
    row of the front instead of the tolerance rule."""
    check_arguments(how, min_samples, max_samples, tolerance, rounds, timing_rows)  # 1
    settings = expand(space)
    check_settings(model, settings, task.length)
    task.check_sizes(timing_rows, max_samples)
    output_dir = Path(output_dir)
    cache = CellCache(output_dir / "cache.json")
    extra = {AR_NAME: task.timed_ar_run(ar_model, timing_rows)} if ar_model is not None else None
    speeds = time_settings(model, task, settings, timing_rows, rounds, cache, extra)  # 2
    rows = search(model, task, settings, speeds, cache, how, min_samples, max_samples)  # 3
    front = pareto_front(rows, rounds)  # 4
    for row in rows:
        row["on_front"] = any(row is f for f in front)
    chosen = choose(rows, tolerance, objective, rounds, front)
    held = measured(model, task, chosen["setting"], max_samples, min_samples, cache, "test")  # 5
    result = {
        "task": task.description,
        "quality_name": task.quality_name,
        "search": how,
        "rounds": rounds,
        "rule": _rule(tolerance, objective),
        "why": None if objective else choice_note(front, chosen, tolerance, rounds),
        "rows": rows,
        "chosen": chosen,
        "generation_config": measured_config(model, task, chosen["setting"]),
        "held_out": describe(held, task),
        "samples_used": sum(r["samples"] for r in rows),
        "baseline": _baseline(task, ar_model, max_samples, speeds, cache),
    }
    write_outputs(output_dir, result)
    return result


def check_arguments(
    how: str, min_samples: int, max_samples: int, tolerance: float, rounds: int, timing_rows: int
) -> None:
    """The arguments of `tune` that need neither the model nor the task, before any work."""
    check_search(how, min_samples, max_samples)
    check_tolerance(tolerance)
    for flag, value in (("--rounds", rounds), ("--timing-rows", timing_rows)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")


def _rule(tolerance: float, objective: Optional[Callable]) -> str:
    if objective:
        return "the objective's best on the front"
    return (
        f"the fastest on the front within {tolerance} of the best quality; where the timing does not resolve its "
        f"speed from others' (ranges of rounds overlapping, or fewer than {RESOLVING_ROUNDS} rounds), the cheapest"
    )


def measured_config(model: Any, task: Any, setting: dict) -> dict:
    """Every generation field the measurements of ``setting`` ran with: the model's own generation config, the
    setting, and the fields the task fixes (``task.generation_fields``: temperature, max_new_tokens, ...)."""
    saved = getattr(model, "generation_config", None)
    own = MaskedDiffusionGenerationConfig.from_any(saved).explicit_values() if saved is not None else {}
    own.pop("transformers_version", None)
    return {**own, **setting, **task.generation_fields}


def _baseline(task: Any, ar_model: Any, num: int, speeds: dict, cache: CellCache) -> Optional[dict]:
    if ar_model is None:
        return None
    cell = cache.get(f"ar|{task.key}|{num}", lambda: vars(task.measure_ar(ar_model, num)))
    return {**describe(Counts(**cell), task), **speeds[AR_NAME]}
