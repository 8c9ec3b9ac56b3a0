"""Continuous batching for every diffusion family: a request joins the running ones at their next forward.

Each admitted request runs its own ``generate`` call (`Engine.run_joined`) in a generation thread of its own;
their forwards run as batched forwards (`hf_mdm.serve.forwards.SharedForwards`), so a request that arrives joins
at the next step (no cache) or whenever its own call asks (its own prefix or dual cache, its own exact block cache on
a block-causal model: keys/values kept per request for its whole life), and a finished request leaves after its
last forward: a short request never waits for a long one to finish. Every answer is its ``generate`` call alone
(bit for bit where batched forwards are row-invariant: see `hf_mdm.serve.forwards`).

Admission: at most ``max_batch`` requests run; a request whose call keeps keys/values holds its canvas' positions
(`Engine.cache_tokens`) against the ``max_cache_tokens`` budget while it runs: one that does not fit beside the
running ones waits (oldest first), one that can never fit is refused when it arrives (a 400 saying why).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

from .batcher import Scheduler
from .engine import Answer, Engine, Job
from .forwards import RowLeft
from .requests import ApiError

__all__ = ["JoinScheduler"]


@dataclass
class _Waiting:
    job: Job
    future: asyncio.Future
    cache_tokens: int
    arrived: float = field(default_factory=time.monotonic)


class JoinScheduler(Scheduler):
    """Runs each request's own ``generate`` call as soon as it fits (see the module docstring); the interface of
    `hf_mdm.serve.batcher.MicroBatcher`. ``on_batch(rows, calls)`` observes every batched forward."""

    def __init__(
        self,
        engine: Engine,
        max_batch: int,
        max_queue: int,
        max_cache_tokens: int,
        on_batch: Optional[Callable] = None,
    ):
        super().__init__(engine, max_batch, max_queue, on_batch, "hf-mdm-join")
        self._executor = ThreadPoolExecutor(max_workers=max_batch, thread_name_prefix="hf-mdm-join")
        self.max_cache_tokens = max_cache_tokens
        self.cache_in_use = 0
        engine.share_forwards(on_batch)

    async def submit(self, job: Job) -> Answer:
        """The job's answer once its call ran; 429 when the queue is full, 400 when its cache can never fit."""
        self.check_room()
        need = self.engine.cache_tokens(job)
        if need > self.max_cache_tokens:
            raise ApiError(
                400,
                f"this request keeps keys/values for {need} positions, above this server's --max-cache-tokens "
                f"{self.max_cache_tokens}: ask fewer max_tokens, a shorter prompt, or kv_cache 'none'",
                "max_tokens",
            )
        waiting = _Waiting(job, asyncio.get_running_loop().create_future(), need)
        self.waiting.append(waiting)
        self._wake.set()
        return await waiting.future

    async def _work(self) -> None:
        while True:
            self._admit()
            self._wake.clear()
            await self._wake.wait()

    def _admit(self) -> None:
        """Waiting jobs start, oldest first, while a slot and the cache budget allow (a cancelled one is dropped)."""
        while self.waiting:
            head = self.waiting[0]
            if head.job.cancelled.is_set() or head.future.done():
                self.waiting.pop(0)
                head.future.cancel()
                continue
            if self.running_jobs >= self.max_batch or self.cache_in_use + head.cache_tokens > self.max_cache_tokens:
                return
            self.waiting.pop(0)
            self._start(head)

    def _start(self, waiting: _Waiting) -> None:
        self.running_jobs += 1
        self.cache_in_use += waiting.cache_tokens
        loop = asyncio.get_running_loop()
        task = loop.run_in_executor(self._executor, self.engine.run_joined, waiting.job)
        task.add_done_callback(lambda done: self._finished(waiting, done))

    def _finished(self, waiting: _Waiting, done: asyncio.Future) -> None:
        self.running_jobs -= 1
        self.cache_in_use -= waiting.cache_tokens
        self._wake.set()
        if waiting.future.done():
            return
        error = None if done.cancelled() else done.exception()
        if done.cancelled() or isinstance(error, RowLeft):
            waiting.future.cancel()
        elif error is not None:
            waiting.future.set_exception(error)
        else:
            waiting.future.set_result(done.result())
