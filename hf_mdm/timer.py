"""Wall-clock timing with the device synchronised: the one timer of the sampler, the harness and the experiments.

Accelerators queue work asynchronously, so a time read right after a call measures the launch, not the work.
`synchronize` waits for the device's queue (CUDA, XPU, MPS; a no-op on CPU) and `Stopwatch` does so at both ends:

```python
>>> import torch
>>> from hf_mdm.timer import Stopwatch
>>> with Stopwatch(torch.device("cpu")) as watch:
...     _ = torch.ones(8).sum()
>>> watch.seconds >= 0
True
```

This module is exported with the model as remote code (``generation.py`` imports it), so it imports only torch.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

__all__ = ["synchronize", "Stopwatch", "interleaved_medians", "interleaved_times"]


def synchronize(device: Any) -> None:
    """Wait for the device's queued work (CUDA, XPU, MPS); a no-op on CPU."""
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)
    elif device.type == "xpu" and hasattr(torch, "xpu") and torch.xpu.is_available():
        torch.xpu.synchronize(device)
    elif device.type == "mps" and hasattr(torch, "mps"):
        torch.mps.synchronize()


class Stopwatch:
    """``with Stopwatch(device) as sw: ...`` then ``sw.seconds``: wall-clock, device synchronised at both ends."""

    def __init__(self, device: Any):
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> "Stopwatch":
        synchronize(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self._start


def interleaved_medians(
    runs: dict[str, Callable[[], Any]], repeats: int, device: Any, warmup: int = 1
) -> dict[str, float]:
    """The median seconds of each of ``runs``, timed in rounds that call every run once in turn (drift and other
    load hit them alike), after ``warmup`` untimed rounds (allocator, kernels, caches)."""
    return {
        name: statistics.median(seconds) for name, seconds in interleaved_times(runs, repeats, device, warmup).items()
    }


def interleaved_times(
    runs: dict[str, Callable[[], Any]], repeats: int, device: Any, warmup: int = 1
) -> dict[str, list[float]]:
    """Every timed round's seconds of each of ``runs`` (see `interleaved_medians`), for medians with their spread."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(warmup + repeats):
        for name, fn in runs.items():
            with Stopwatch(device) as watch:
                fn()
            if round_ >= warmup:
                times[name].append(watch.seconds)
    return times
