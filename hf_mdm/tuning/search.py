"""The search of ``hf-mdm tune``: which settings get how many samples.

Speed is measured once, for every setting together: ``rounds`` interleaved rounds of one `generate` call each after
a warm-up (`hf_mdm.timer.interleaved_times`), tokens/s from the median round with the range of the rounds. Quality
costs samples, so the search spends them where they decide something:

- ``grid``: every setting gets ``max_samples`` (for checking);
- ``halving``: rounds of ``min_samples``, then twice as many, ... up to ``max_samples``; after each round a setting
  is dropped when another setting at least as fast (median tokens/s) has a quality interval entirely above its own
  (dominated with 95% confidence on quality), so losing settings stop early. What a setting got is in its
  ``samples``, and the round it was dropped in its ``dropped_after``.

Every timed round and every chunk of samples is a cell of the run's cache: a killed or interrupted search redone
continues where it stopped.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Optional

from tqdm.auto import tqdm

from ..experiments.common import CellCache
from ..generation_denoiser import model_device
from ..timer import interleaved_times
from .space import setting_key
from .tasks import Counts

SEARCHES = ("halving", "grid")


def time_settings(
    model: Any, task: Any, settings: list[dict], rows: int, rounds: int, cache: CellCache, extra: Optional[dict] = None
) -> dict[str, dict]:
    """Per setting (and per entry of ``extra``: name -> a timed callable, e.g. the AR baseline), tokens/s of the
    median round and of the slowest and fastest rounds; cached as one cell, and each finished round as its own
    (`timed_rounds`), so that an interrupted timing keeps its finished rounds."""
    runs = {setting_key(s): task.timed_run(model, s, rows) for s in settings}
    runs.update(extra or {})
    key = f"timing|{task.key}|{rows}|{rounds}|" + "|".join(sorted(runs))
    tokens = rows * task.length  # the tokens a call may generate (a task stopping early is faster per token)
    return cache.get(key, lambda: _speeds(timed_rounds(runs, rounds, cache, key, model_device(model)), tokens))


def timed_rounds(runs: dict, rounds: int, cache: CellCache, key: str, device: Any) -> dict[str, list[float]]:
    """Each run's seconds in each of ``rounds`` interleaved rounds, a cached cell ``<key>|round <i>`` a round; a
    warm-up round (untimed) comes before the first round this call times."""
    warmed = []

    def one_round() -> dict[str, float]:
        times = interleaved_times(runs, 1, device=device, warmup=0 if warmed else 1)
        warmed.append(True)
        return {name: seconds[0] for name, seconds in times.items()}

    cells = [cache.get(f"{key}|round {i}", one_round) for i in range(rounds)]
    return {name: [cell[name] for cell in cells] for name in runs}


def _speeds(times: dict[str, list[float]], tokens: int) -> dict[str, dict]:
    return {
        name: {
            "tokens_per_s": tokens / statistics.median(seconds),
            "tokens_per_s_min": tokens / max(seconds),
            "tokens_per_s_max": tokens / min(seconds),
        }
        for name, seconds in times.items()
    }


def measured(model: Any, task: Any, setting: dict, upto: int, chunk: int, cache: CellCache, split: str) -> Counts:
    """The counts of the first ``upto`` samples of ``split`` with ``setting``, in cached chunks of ``chunk``."""
    total = Counts()
    for start in range(0, upto, chunk):
        num = min(chunk, upto - start)
        key = f"chunk|{task.key}|{split}|{setting_key(setting)}|{start}|{num}"
        cell = cache.get(key, lambda: vars(task.measure(model, setting, num, start, split)))
        total = total + Counts(**cell)
    return total


def dominated(row: dict, rows: list[dict]) -> bool:
    """Whether another row at least as fast has a quality interval entirely above ``row``'s."""
    return any(
        other is not row
        and other["tokens_per_s"] >= row["tokens_per_s"]
        and other["quality_ci_low"] > row["quality_ci_high"]
        for other in rows
    )


def search(
    model: Any,
    task: Any,
    settings: list[dict],
    speeds: dict[str, dict],
    cache: CellCache,
    how: str = "halving",
    min_samples: int = 32,
    max_samples: int = 256,
    progress: Callable = tqdm,
) -> list[dict]:
    """One row per setting (see the module docstring); ``how`` is "halving" or "grid"."""
    check_search(how, min_samples, max_samples)
    budgets = _budgets(min_samples, max_samples) if how == "halving" else [max_samples]
    rows = {setting_key(s): {"setting": s, "dropped_after": None} for s in settings}
    for round_, budget in enumerate(progress(budgets, desc="tuning rounds", leave=False)):
        alive = [r for r in rows.values() if r["dropped_after"] is None]
        for row in progress(alive, desc=f"{budget} samples each", leave=False):
            counts = measured(model, task, row["setting"], budget, min_samples, cache, "dev")
            row.update(describe(counts, task), **speeds[setting_key(row["setting"])])
        if how == "halving" and budget < max_samples:
            for row in [r for r in alive if dominated(r, alive)]:
                row["dropped_after"] = round_
    return list(rows.values())


def check_search(how: str, min_samples: int, max_samples: int) -> None:
    """The search's arguments, before anything runs."""
    if how not in SEARCHES:
        raise ValueError(f"unknown search {how!r}: use one of {', '.join(SEARCHES)}")
    if not 1 <= min_samples <= max_samples:
        raise ValueError(
            f"need 1 <= --min-samples <= --max-samples, got {min_samples} and {max_samples}: lower --min-samples"
        )


def _budgets(min_samples: int, max_samples: int) -> list[int]:
    budgets = [min_samples]
    while budgets[-1] < max_samples:
        budgets.append(min(2 * budgets[-1], max_samples))
    return budgets


def describe(counts: Counts, task: Any) -> dict:
    """A row's quality (the task's, with its interval), its samples and its costs per token."""
    quality, low, high = task.quality(counts)
    tokens = counts.tokens or max(counts.samples, 1) * task.length
    return {
        "quality": quality,
        "quality_ci_low": low,
        "quality_ci_high": high,
        "samples": counts.samples,
        "nfe_per_token": counts.forwards / tokens,
        "positions_per_token": counts.positions / tokens,
    }
