"""Resumable evaluations: lm-eval's request cache with the timing of every request, and atomic output files.

A run with ``use_cache`` (``hf-mdm-eval run --use_cache PREFIX``; ``hf-mdm compare`` sets it for every cell) answers
each request it has answered before from lm-eval's own cache (`lm_eval.api.model.CachingLM`: an SQLite file per
process, written as each request finishes, through the ``cache_hook.add_partial`` calls of hf_mdm's models), so a
run killed at any point and started again with the same command redoes only the requests that had not finished,
and gives the results of an uninterrupted run. Two additions to lm-eval's cache:

- the cache file's name carries a fingerprint of the model and its arguments (``<PREFIX>_<fingerprint>_rank<N>.db``;
  lm-eval keys requests by their text only, so one prefix shared by two models would mix their answers);
- the timing of each request (`hf_mdm.harness.timing.RequestTiming`: wall-clock, NFE, tokens, as measured when it
  ran) is stored beside its answer and restored, marked ``from_cache``, when the answer comes from the cache, so
  the results' timing still covers every request (`TimedCachingLM`).

`atomic_outputs` makes lm-eval's result and sample files appear whole or not at all (written in a staging folder
beside them, then renamed): a run interrupted by Ctrl-C or killed leaves no half-written file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Union

import lm_eval.api.model as lm_eval_model
from lm_eval.api.model import CacheHook, CachingLM, hash_args
from lm_eval.loggers.evaluation_tracker import EvaluationTracker

from .timing import tag_requests

__all__ = ["TimedCachingLM", "cache_prefix", "caching", "atomic_outputs"]

_TIMING_KEY = "hf_mdm_timing:"
_REQUEST_METHODS = ("loglikelihood", "loglikelihood_rolling", "generate_until")


def cache_prefix(prefix: Union[str, os.PathLike], model: Any, model_args: Any, gen_kwargs: Any = None) -> str:
    """``<prefix>_<fingerprint>``: the fingerprint is a hash of the model's name and arguments and of the
    generation kwargs (lm-eval adds ``_rank<N>.db``)."""
    name = model if isinstance(model, str) else type(model).__name__
    key = json.dumps([name, model_args, gen_kwargs], sort_keys=True, default=str)
    return f"{os.fspath(prefix)}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


class _TimedCacheHook(CacheHook):
    """lm-eval's cache hook, storing with each answer the timing record the model made for it.

    hf_mdm's models record a request's timing, then report its answer through ``add_partial`` (in the same order
    within a batch), so the records added since the last answers pair with the answers first in, first out."""

    def __init__(self, caching: "TimedCachingLM"):
        super().__init__(caching)
        self.recorder = caching.recorder
        self.paired = len(self.recorder.records) if self.recorder is not None else 0

    def add_partial(self, attr: str, req: Any, res: Any) -> None:
        if self.recorder is not None and self.paired < len(self.recorder.records):
            record = self.recorder.records[self.paired]
            self.paired += 1
            if record.request_type == attr and not record.from_cache:  # before the answer: a cached answer has it
                self.dbdict[_TIMING_KEY + hash_args(attr, req)] = record.to_dict()
        super().add_partial(attr, req, res)


class TimedCachingLM(CachingLM):
    """lm-eval's `CachingLM` that also stores and restores the timing of each request (see the module docstring)."""

    def __init__(self, lm: Any, cache_db: str) -> None:
        self.recorder = getattr(lm, "timing", None)
        super().__init__(lm, cache_db)

    def get_cache_hook(self) -> CacheHook:
        return _TimedCacheHook(self)

    def __getattr__(self, attr: str) -> Any:
        method = super().__getattr__(attr)
        if attr not in _REQUEST_METHODS or self.recorder is None:
            return method

        def run(requests: list) -> list:
            self._restore_timing(attr, requests)
            hook = self.lm.cache_hook
            if isinstance(hook, _TimedCacheHook):
                hook.paired = len(self.recorder.records)  # the model's records start here
            return method(requests)

        return run

    def _restore_timing(self, attr: str, requests: list) -> None:
        """Timing records of the requests lm-eval will answer from the cache (the rule of `CachingLM`)."""
        for request, tag in zip(requests, tag_requests(requests)):
            if attr == "generate_until" and request.args[1].get("do_sample", False):
                continue
            key = hash_args(attr, request.args)
            if key in self.dbdict:
                stored = self.dbdict.get(_TIMING_KEY + key)
                if stored is not None:
                    self.recorder.restore(tag, stored)


@contextlib.contextmanager
def caching(lm: Any) -> Iterator[None]:
    """For one ``lm_eval.simple_evaluate`` call: its ``use_cache`` builds a `TimedCachingLM`; afterwards ``lm``
    writes to no cache (``hf-mdm compare`` reuses one model for several cells)."""
    saved = lm_eval_model.CachingLM
    lm_eval_model.CachingLM = TimedCachingLM
    try:
        yield
    finally:
        lm_eval_model.CachingLM = saved
        if hasattr(lm, "set_cache_hook"):
            lm.set_cache_hook(CacheHook(None))


def _staged(save: Any) -> Any:
    """An `EvaluationTracker` save method that writes into a staging folder, then renames each file into place."""

    @functools.wraps(save)
    def wrapper(self: EvaluationTracker, *args: Any, **kwargs: Any) -> Any:
        if not self.output_path:
            return save(self, *args, **kwargs)
        target = Path(self.output_path)
        root = target.parent if target.suffix == ".json" else target
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".hf_mdm_staging-", dir=root))
        self.output_path = str(staging / target.name) if target.suffix == ".json" else str(staging)
        try:
            result = save(self, *args, **kwargs)
            for path in sorted(p for p in staging.rglob("*") if p.is_file()):
                destination = root / path.relative_to(staging)
                destination.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, destination)
            return result
        finally:
            self.output_path = str(target)
            shutil.rmtree(staging, ignore_errors=True)

    return wrapper


@contextlib.contextmanager
def atomic_outputs() -> Iterator[None]:
    """For the duration: lm-eval's results and samples files are written whole, or not at all."""
    names = ("save_results_aggregated", "save_results_samples")
    saved = {name: getattr(EvaluationTracker, name) for name in names}
    try:
        for name, method in saved.items():
            setattr(EvaluationTracker, name, _staged(method))
        yield
    finally:
        for name, method in saved.items():
            setattr(EvaluationTracker, name, method)
