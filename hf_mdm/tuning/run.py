"""``tune``: the sampler settings that win for a model and a task, in five steps.

1. expand and check the space against the model (`space`), before anything runs;
2. time every setting, and the AR baseline when given, in interleaved rounds (`search.time_settings`);
3. measure quality on the development split, spending samples by ``search`` (`search.search`);
4. the Pareto front and the chosen setting (`front`);
5. the chosen setting once on the held-out split, then the files (`outputs`).

Cells (timings, chunks of samples) are cached in ``<output_dir>/cache.json``: the same call after a kill continues.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..experiments.common import CellCache
from .front import choose, pareto_front
from .outputs import write_outputs
from .search import describe, measured, search, time_settings
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
    settings = expand(space)  # 1
    check_settings(model, settings, task.length)
    output_dir = Path(output_dir)
    cache = CellCache(output_dir / "cache.json")
    extra = {AR_NAME: task.timed_ar_run(ar_model, timing_rows)} if ar_model is not None else None
    speeds = time_settings(model, task, settings, timing_rows, rounds, cache, extra)  # 2
    rows = search(model, task, settings, speeds, cache, how, min_samples, max_samples)  # 3
    front = pareto_front(rows)  # 4
    for row in rows:
        row["on_front"] = any(row is f for f in front)
    chosen = choose(front, tolerance, objective)
    held = measured(model, task, chosen["setting"], max_samples, min_samples, cache, "test")  # 5
    result = {
        "task": task.description,
        "quality_name": task.quality_name,
        "search": how,
        "rounds": rounds,
        "rule": "the objective's best on the front"
        if objective
        else f"the fastest on the front within {tolerance} of the best quality",
        "rows": rows,
        "chosen": chosen,
        "held_out": describe(held, task),
        "samples_used": sum(r["samples"] for r in rows),
        "baseline": _baseline(task, ar_model, max_samples, speeds, cache),
    }
    write_outputs(output_dir, result)
    return result


def _baseline(task: Any, ar_model: Any, num: int, speeds: dict, cache: CellCache) -> Optional[dict]:
    if ar_model is None:
        return None
    cell = cache.get(f"ar|{task.key}|{num}", lambda: vars(task.measure_ar(ar_model, num)))
    return {**describe(Counts(**cell), task), **speeds[AR_NAME]}
