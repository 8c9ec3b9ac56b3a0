"""Continuous batching for every masked diffusion family: requests join the running ones at their next forward.

Requests that arrive together with one generation config (`Job.key`) form a *cohort*: after waiting at most
``max_wait_ms`` from the oldest's arrival for more, up to the free slots, they run as one ``generate`` call
(`Engine.run_joined`, the call the micro-batcher makes) in a generation thread of its own. The cohorts running at
once share their forwards (`hf_mdm.serve.forwards.SharedForwards`): a cohort that arrives while others run joins them
at their next forward (no cache: the next step; with a prefix or dual cache, or a block-causal model's exact block
cache, its own keys/values, kept for its whole life), and a cohort that is done leaves after its last forward, so a
short request never waits for a long one to finish. Within a cohort, a finished row leaves at its block's end and a
row whose client left at the next block boundary; a cohort whose clients all left stops at its next forward.

Tokens: every request gets its cohort's call, which is its ``generate`` call alone wherever its cohort's rows have
one prompt length (no padding; bit for bit where batched forwards are row-invariant, the CPU in float32), and with
``batch_invariant`` always (the call then groups its rows by length, and forwards are batched only where the device
keeps rows invariant). Rows of other lengths in one cohort are left-padded as in the micro-batcher: equal to the
row alone up to the last bits, so a near tie may break the other way.

Admission: at most ``max_batch`` requests run; a request whose call keeps keys/values holds its canvas' positions
(`Engine.cache_tokens`) against the ``max_cache_tokens`` budget while it runs: one that does not fit beside the
running ones waits (oldest first), one that can never fit is refused when it arrives (a 400 saying why). A cohort
whose call raises runs again request by request, so only a request at fault gets the error.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from .batcher import Scheduler, Waiting
from .engine import Answer, Engine, Job
from .forwards import RowLeft
from .protocol import ApiError

__all__ = ["JoinScheduler"]


class JoinScheduler(Scheduler):
    """Runs cohorts of requests as calls whose forwards are shared (see the module docstring); the interface of
    `hf_mdm.serve.batcher.MicroBatcher`. ``on_batch(rows, calls)`` observes every forward run."""

    def __init__(
        self,
        engine: Engine,
        max_batch: int,
        max_wait_ms: float,
        max_queue: int,
        max_cache_tokens: int,
        on_batch: Optional[Callable] = None,
    ):
        super().__init__(engine, max_batch, max_queue, on_batch, "hf-mdm-join")
        self._executor = ThreadPoolExecutor(max_workers=max_batch, thread_name_prefix="hf-mdm-join")
        self.max_wait, self.max_cache_tokens = max_wait_ms / 1000.0, max_cache_tokens
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
        waiting = Waiting(job, asyncio.get_running_loop().create_future(), cache_tokens=need)
        self.waiting.append(waiting)
        self._wake.set()
        return await waiting.future

    async def _work(self) -> None:
        while True:
            self._start(await self._next_cohort())

    def _fits(self, waiting: Waiting, rows: int = 0, tokens: int = 0) -> bool:
        return (
            self.running_jobs + rows < self.max_batch
            and self.cache_in_use + tokens + waiting.cache_tokens <= self.max_cache_tokens
        )

    async def _next_cohort(self) -> list[Waiting]:
        """The oldest waiting job's cohort: once it fits, after waiting out ``max_wait`` for more of its config
        (or until they fill the free slots), the jobs of its config that fit, oldest first."""
        while True:
            self._drop_left()
            if not self.waiting or not self._fits(self.waiting[0]):
                self._wake.clear()
                await self._wake.wait()
                continue
            head = self.waiting[0]
            same = [w for w in self.waiting if w.job.key == head.job.key]
            left = head.arrived + self.max_wait - time.monotonic()
            if len(same) >= self.max_batch - self.running_jobs or left <= 0:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass
        cohort: list[Waiting] = []
        for waiting in same:
            if not self._fits(waiting, len(cohort), sum(w.cache_tokens for w in cohort)):
                break
            cohort.append(waiting)
            self.waiting.remove(waiting)
        return cohort

    def _drop_left(self) -> None:
        """Waiting jobs whose client left are dropped."""
        for waiting in list(self.waiting):
            if waiting.job.cancelled.is_set() or waiting.future.done():
                self.waiting.remove(waiting)
                waiting.future.cancel()

    def _start(self, cohort: list[Waiting]) -> None:
        self.running_jobs += len(cohort)
        self.cache_in_use += sum(w.cache_tokens for w in cohort)
        call = asyncio.get_running_loop().run_in_executor(
            self._executor, self.engine.run_joined, [w.job for w in cohort]
        )
        call.add_done_callback(lambda done: self._finished(cohort, done))

    def _finished(self, cohort: list[Waiting], done: asyncio.Future) -> None:
        self.running_jobs -= len(cohort)
        self.cache_in_use -= sum(w.cache_tokens for w in cohort)
        self._wake.set()
        error = None if done.cancelled() else done.exception()
        if error is None and not done.cancelled():
            for waiting, answer in zip(cohort, done.result()):
                if not waiting.future.done():
                    waiting.future.set_result(answer)
            return
        for waiting in cohort:
            stream = waiting.job.stream
            if waiting.future.done():
                continue
            if done.cancelled() or isinstance(error, RowLeft) or waiting.job.cancelled.is_set():
                waiting.future.cancel()
            elif len(cohort) > 1 and (stream is None or stream.restart()):
                self._start([waiting])  # again alone: only a request at fault gets the error
            else:
                waiting.future.set_exception(error)
