"""Continuous batching at block boundaries, for block-causal models (LLaDA2.x, an MDM with ``block_size``).

A block-causal model's block attends only to the blocks before it, so generating a request one attention block
per call gives the tokens and forwards of one call for the whole request (the blocks' steps as that call splits
them: `block_plan`), up to the last bit of attention sums over a shorter canvas (a near tie between two
confidences may then break the other way, as in a padded batch). The scheduler runs the running requests one block at a time; between blocks a request that arrived
joins, and a request that is done (EOS, its length, a stop string, its client gone) leaves at once, so a short
request never waits for a long one. Requests with one generation config (all but length and steps) share the calls;
rows whose next block has another size or step count (a first, partial block) run in a call of their own. A request
of at most two blocks runs whole in its first call (`call_shape`): one round of calls, not two.

Only samplers whose draws are per-row token draws at masked positions join (`joins_at_blocks`): then a seeded row
draws the same numbers in any batch (`hf_mdm.generation_random.RowGenerators`). Others use the micro-batcher.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ..families import attention_block_size
from ..generation_transfer import build_transfer
from .batcher import Scheduler
from .engine import Answer, Engine, Job

__all__ = ["BlockScheduler", "joins_at_blocks", "block_plan", "call_shape"]

WHOLE = 2  # a request of at most this many blocks runs whole in one call (`call_shape`)
UNJOINABLE_STRATEGIES = ("random", "origin")  # their scores are uniforms over the canvas: its width is the batch's


def joins_at_blocks(engine: Engine, job: Job) -> bool:
    """Whether ``job`` runs block by block: a block-causal diffusion model, a sampler whose only draws are tokens
    at masked positions (no random order, stochastic counts, ReMDM, reference sampler, speculative drafts), and no
    ``batch_invariant`` (which groups rows its own way)."""
    config = job.config
    if not engine.diffusion or engine.uniform or attention_block_size(engine.model) is None:
        return False
    return (
        not config.batch_invariant
        and config.reference in (None, "none")
        and config.remdm is None
        and config.transfer not in ("stochastic", "speculative")
        and config.strategy not in UNJOINABLE_STRATEGIES
    )


def block_plan(config: Any, prompt_length: int, new_tokens: int, block: int) -> list[tuple[int, int]]:
    """(tokens, steps) of each block of one call that generates ``new_tokens`` after ``prompt_length`` in attention
    blocks of ``block`` positions counted from 0: the blocks' sizes, and the steps the call's transfer gives them."""
    sizes, position, end = [], prompt_length, prompt_length + new_tokens
    while position < end:
        size = min((position // block + 1) * block, end) - position
        sizes.append(size)
        position += size
    return list(zip(sizes, build_transfer(config).block_steps(config.steps, sizes)))


@dataclass
class _Row:
    job: Job
    future: asyncio.Future
    plan: list[tuple[int, int]]
    generator: Optional[torch.Generator]
    tokens: list[int] = field(default_factory=list)
    done: int = 0  # blocks generated


class BlockScheduler(Scheduler):
    """Runs joinable jobs one block at a time (see the module docstring); the `MicroBatcher`'s interface."""

    def __init__(self, engine: Engine, max_batch: int, max_queue: int, on_batch: Optional[Callable] = None):
        super().__init__(engine, max_batch, max_queue, on_batch, "hf-mdm-blocks")
        self.rows: list[_Row] = []

    @property
    def running_jobs(self) -> int:
        return len(self.rows)

    async def submit(self, job: Job) -> Answer:
        self.check_room()
        block = job.config.block_length or attention_block_size(self.engine.model)
        generator = None if job.seed is None else torch.Generator().manual_seed(job.seed)
        plan = block_plan(job.config, len(job.ids), job.max_tokens, int(block))
        row = _Row(job, asyncio.get_running_loop().create_future(), plan, generator)
        if job.stream is not None:
            job.stream.put(torch.tensor(job.ids))  # the prompt first, as a streamer receives it
        self.waiting.append(row)
        self._wake.set()
        return await row.future

    def _admit(self) -> None:
        """Waiting rows join the running ones (the same config but length), up to ``max_batch``."""
        key = _shared_key(self.rows[0].job) if self.rows else None
        for row in list(self.waiting):
            if len(self.rows) >= self.max_batch:
                break
            if key is None or _shared_key(row.job) == key:
                key = _shared_key(row.job)
                self.waiting.remove(row)
                self.rows.append(row)

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._admit()
            self.rows = [row for row in self.rows if not self._left(row)]
            if not self.rows:
                self._wake.clear()
                if not self.waiting:
                    await self._wake.wait()
                continue
            rows, start = list(self.rows), time.monotonic()
            try:
                blocks = await loop.run_in_executor(self._executor, self._step, rows)
            except Exception as err:  # a failure of the step is every running request's
                for row in rows:
                    if not row.future.done():
                        row.future.set_exception(err)
                self.rows = [row for row in self.rows if row not in rows]
                continue
            for row, (tokens, count) in zip(rows, blocks):
                self._advance(row, tokens, count)
            if self.on_batch is not None:
                self.on_batch(len(rows), time.monotonic() - start)

    def _left(self, row: _Row) -> bool:
        if row.job.cancelled.is_set() and not row.future.done():
            row.future.cancel()
        return row.future.done()

    def _advance(self, row: _Row, tokens: list[int], blocks: int) -> None:
        """A row's next ``blocks`` blocks: appended and streamed; the row answered when it is done."""
        row.tokens += tokens
        row.done += blocks
        if row.job.stream is not None and tokens:
            row.job.stream.put(torch.tensor(tokens))
        eos = self.engine.eos_ids
        _, reason, _ = self.engine.text_of(row.job, row.tokens, final=False)
        if row.done == len(row.plan) or any(t in eos for t in tokens) or reason:
            if row.job.stream is not None:
                row.job.stream.end()
            if not row.future.done():
                row.future.set_result(self.engine.answer(row.job, row.tokens))

    def _step(self, rows: list[_Row]) -> list[tuple[list[int], int]]:
        """Every row's next call (tokens, blocks), rows with one call shape (`call_shape`) in one call (the
        generation thread)."""
        by_shape: dict[tuple[int, int, int], list[int]] = {}
        for i, row in enumerate(rows):
            by_shape.setdefault(call_shape(row.plan, row.done, row.job.config.steps), []).append(i)
        out: list[tuple[list[int], int]] = [([], 0) for _ in rows]
        for (size, steps, blocks), members in by_shape.items():
            group = [rows[i] for i in members]
            prefixes = [row.job.ids + row.tokens for row in group]
            generators = [row.generator for row in group]
            for i, tokens in zip(
                members, self.engine.run_block(group[0].job.config, prefixes, size, steps, generators)
            ):
                out[i] = (tokens, blocks)
        return out


def call_shape(plan: list[tuple[int, int]], done: int, steps: Optional[int]) -> tuple[int, int, int]:
    """(tokens, steps, blocks) of a row's next call: its next block; a request of at most ``WHOLE`` blocks (a
    short one: its first block partial, then one whole) whole in its first call, as generating it alone does (the
    request's own ``steps``), so a short request waits for one round of calls, not two."""
    if done == 0 and 1 < len(plan) <= WHOLE:
        return sum(size for size, _ in plan), steps if steps is not None else sum(s for _, s in plan), len(plan)
    return (*plan[done], 1)


def _shared_key(job: Job) -> str:
    own = ("max_new_tokens", "max_length", "steps")  # a row's own: its blocks and their steps are in its plan
    settings = {k: v for k, v in json.loads(job.key).items() if k not in own}
    return json.dumps(settings, sort_keys=True)
