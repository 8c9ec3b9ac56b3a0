"""The micro-batcher: requests with one generation config run as one batch.

A request waits in the queue (at most ``max_queue``: the next is refused with 429); the worker takes the oldest
waiting request and, after waiting at most ``max_wait_ms`` from its arrival for more, up to ``max_batch`` waiting
requests with the same config (`Job.key`), and runs them as one call in its own thread, so the server keeps
answering meanwhile. A request whose client left before its batch started is dropped; one that leaves during its
batch stops at the next block boundary (`hf_mdm.serve.engine`).
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

from .engine import Answer, Engine, Job
from .protocol import ApiError

__all__ = ["Scheduler", "MicroBatcher", "Waiting"]


@dataclass
class Waiting:
    """A submitted job: its answer's future, when it arrived, and the positions of keys/values its call keeps (the
    join scheduler's cache budget; 0 elsewhere)."""

    job: Job
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)
    cache_tokens: int = 0


class Scheduler(ABC):
    """What the server's schedulers share: a worker task on the event loop, a generation thread, the queue limit
    (`check_room`: 429), ``busy`` (``waiting`` and ``running`` jobs), draining and closing."""

    waiting: list
    running_jobs = 0

    def __init__(self, engine: Engine, max_batch: int, max_queue: int, on_batch: Optional[Callable], name: str):
        self.engine, self.max_batch, self.max_queue, self.on_batch = engine, max_batch, max_queue, on_batch
        self.waiting = []
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._work())

    @abstractmethod
    async def _work(self) -> None:
        """The scheduler's loop: take waiting jobs, run them on the engine, answer them (each subclass's own)."""

    def check_room(self) -> None:
        if len(self.waiting) >= self.max_queue:
            raise ApiError(
                429, f"the queue is full ({self.max_queue} requests waiting): retry later", kind="rate_limit_error"
            )

    @property
    def busy(self) -> int:
        return len(self.waiting) + self.running_jobs

    async def drain(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until every submitted job has its answer."""
        deadline = time.monotonic() + timeout_s
        while self.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)


class MicroBatcher(Scheduler):
    """Batches jobs for an `Engine` (see the module docstring); ``on_batch(size, seconds)`` observes each batch."""

    def __init__(
        self, engine: Engine, max_batch: int, max_wait_ms: float, max_queue: int, on_batch: Optional[Callable] = None
    ):
        super().__init__(engine, max_batch, max_queue, on_batch, "hf-mdm-generate")
        self.max_wait = max_wait_ms / 1000.0

    async def submit(self, job: Job) -> Answer:
        """The job's answer once its batch ran; `ApiError` 429 when the queue is full."""
        self.check_room()
        waiting = Waiting(job, asyncio.get_running_loop().create_future())
        self.waiting.append(waiting)
        self._wake.set()
        return await waiting.future

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = await self._gather()
            if not batch:
                continue
            self.running_jobs, start = len(batch), time.monotonic()
            try:
                answers = await loop.run_in_executor(self._executor, self.engine.run, [w.job for w in batch])
                for waiting, answer in zip(batch, answers):
                    if not waiting.future.done():
                        waiting.future.set_result(answer)
            except Exception as err:  # each job again alone: only a request at fault gets the error
                await self._alone(batch, err)
            finally:
                self.running_jobs = 0
            if self.on_batch is not None:
                self.on_batch(len(batch), time.monotonic() - start)

    async def _alone(self, batch: list[Waiting], err: Exception) -> None:
        """Answers the jobs of a batch that raised ``err``: each job run again alone (a streamed one only if it
        streamed nothing yet), so only a request at fault gets its error."""
        loop = asyncio.get_running_loop()
        for waiting in batch:
            outcome, stream = err, waiting.job.stream
            again = len(batch) > 1 and not waiting.future.done() and not waiting.job.cancelled.is_set()
            if again and (stream is None or stream.restart()):
                try:
                    outcome = (await loop.run_in_executor(self._executor, self.engine.run, [waiting.job]))[0]
                except Exception as own:
                    outcome = own
            if not waiting.future.done():
                if isinstance(outcome, Exception):
                    waiting.future.set_exception(outcome)
                else:
                    waiting.future.set_result(outcome)

    async def _gather(self) -> list[Waiting]:
        """The next batch: the oldest job's config, up to ``max_batch`` jobs, after waiting out ``max_wait``."""
        first = self.waiting[0]
        while True:
            same = [w for w in self.waiting if w.job.key == first.job.key]
            left = first.arrived + self.max_wait - time.monotonic()
            if len(same) >= self.max_batch or left <= 0:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass
        batch = same[: self.max_batch]
        for waiting in batch:
            self.waiting.remove(waiting)
            if waiting.job.cancelled.is_set() and not waiting.future.done():
                waiting.future.cancel()  # its client left before the batch started: dropped
        return [w for w in batch if not w.future.done()]
