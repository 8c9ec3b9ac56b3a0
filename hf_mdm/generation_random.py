"""The random draws of a call: one stream for the batch, or one stream per row inside the batched step.

Every draw of the default sampler goes through `rand`, `binomial` and `multinomial`. With a `torch.Generator` (or
None: torch's global stream) they are torch's own calls on the batch's shape. With `RowGenerators`, one generator
per row, each row draws from its own generator exactly what it draws alone: a draw shaped (B, ...) is drawn row by
row as (1, ...); a token draw over N scored positions (N, V) is drawn, for each row, at that row's positions that
it draws at alone (``valid``: the positions it reveals or still has masked, in its own left-to-right order), so
the positions a batched step adds for its shapes (another row's width) take nothing from the row's stream. So a row
of a batch draws the numbers it draws alone, whatever its neighbours, as long as its shapes are its own
(`hf_mdm.generation_rows` batches rows of one length and layout together for that).

Exported with the model as remote code.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, Optional, Sequence, Union

import torch

__all__ = [
    "RowGenerators",
    "Draws",
    "rand",
    "binomial",
    "multinomial",
    "select_rows",
    "only_rows",
    "draw_one",
    "first_argmax",
    "exponential_like",
]


class RowGenerators:
    """One `torch.Generator` per row of a batch (``seeds`` on ``device``); `select` keeps some rows (the batch's
    rows that still run), in their order; `only` keeps every row but lets only some draw (a row whose step reveals
    nothing skips the step alone, so it draws nothing: None in place of its generator)."""

    def __init__(self, seeds: Sequence[int], device: Any = "cpu", generators: Optional[list] = None):
        if generators is None:
            generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        self.generators = generators

    def __len__(self) -> int:
        return len(self.generators)

    def __iter__(self) -> Iterator[torch.Generator]:
        return iter(self.generators)

    def select(self, index: torch.Tensor) -> "RowGenerators":
        return RowGenerators((), generators=[self.generators[i] for i in index.tolist()])

    def only(self, drawing: torch.Tensor) -> "RowGenerators":
        return RowGenerators((), generators=[g if d else None for g, d in zip(self.generators, drawing.tolist())])


Draws = Union[None, torch.Generator, RowGenerators]


def rand(shape: Sequence[int], generator: Draws, device: Any, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Uniforms of ``shape`` (B, ...): one call on the shape, or each row's (1, ...) from its own generator."""
    if not isinstance(generator, RowGenerators):
        return torch.rand(shape, generator=generator, device=device, dtype=dtype)
    _check_rows(generator, shape[0])
    one = (1, *shape[1:])
    return torch.cat(
        [
            torch.zeros(one, device=device, dtype=dtype)
            if g is None
            else torch.rand(one, generator=g, device=device, dtype=dtype)
            for g in generator
        ]
    )


def binomial(count: torch.Tensor, probs: torch.Tensor, generator: Draws) -> torch.Tensor:
    """Binomial(``count``, ``probs``) draws (B,) (float64): one call, or each row's from its own generator."""
    if not isinstance(generator, RowGenerators):
        return torch.binomial(count, probs, generator=generator)
    _check_rows(generator, count.shape[0])
    return torch.cat(
        [
            count[b : b + 1] if g is None else torch.binomial(count[b : b + 1], probs[b : b + 1], generator=g)
            for b, g in enumerate(generator)
        ]
    )


def multinomial(
    probs: torch.Tensor, generator: Draws, rows: Optional[torch.Tensor] = None, valid: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """A token (N,) from each law ``probs`` (N, V). With `RowGenerators`, ``rows`` (N,) says the row of each law and
    ``valid`` (N,) which laws the row draws from alone (the others are filled with their argmax, never written);
    each row then draws its valid laws, in order, from its own generator."""
    if not isinstance(generator, RowGenerators):
        return draw_one(probs, generator)
    if rows is None:
        raise RuntimeError(
            "a draw with one generator per row needs the row of each law: this sampler cannot keep the batch "
            "with one seed per row (hf_mdm.generation_rows runs its rows alone)"
        )
    tokens = probs.argmax(-1)
    drawn = rows if valid is None else torch.where(valid.bool(), rows, -1)
    for b, g in enumerate(generator):
        index = (drawn == b).nonzero().flatten()
        if g is not None and index.numel():
            tokens[index] = draw_one(probs[index], g)
    return tokens


def draw_one(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """(N,) an index per row of ``probs`` (N, V) (non-negative weights, not necessarily normalised): on the CPU and
    CUDA, the operations of ``torch.multinomial(probs, 1, generator=generator)`` (argmax of probs / q, q ~ Exp(1)
    drawn in probs' shape: the same random numbers and indices, the generator left where it leaves it) without its
    checks of ``probs``; elsewhere ``torch.multinomial`` itself. A row of zeros, which multinomial refuses, gives
    index 0."""
    if probs.device.type not in ("cpu", "cuda"):
        return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
    q = exponential_like(probs, generator)
    return first_argmax(torch.div(probs, q, out=q))


def first_argmax(values: torch.Tensor) -> torch.Tensor:
    """``torch.argmax(values, dim=-1)``: the first index of the largest value (of the first NaN, if any); on the CPU
    read off ``torch.max(values, dim=-1)``, which gives the same indices faster."""
    if values.device.type == "cpu":
        return torch.max(values, dim=-1).indices
    return torch.argmax(values, dim=-1)


def exponential_like(values: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """Exp(1) numbers in the shape, dtype and device of ``values``: those of
    ``torch.empty_like(values).exponential_(1, generator=generator)``. torch's CPU kernel draws each as
    -log1p(-u) from a float64 uniform u, one element at a time; drawn here as the same uniforms (``torch.rand`` in
    float64), then -log1p(-u) vectorised, about twice as fast, where this build's kernel is checked to give these
    numbers (`_vectorised_exponential_matches`), else by the kernel itself."""
    if values.device.type != "cpu" or not _vectorised_exponential_matches(values.dtype):
        return torch.empty_like(values).exponential_(1, generator=generator)
    return _vectorised_exponential(values.shape, values.dtype, generator)


def _vectorised_exponential(shape: Sequence[int], dtype: torch.dtype, generator) -> torch.Tensor:
    u = torch.rand(shape, dtype=torch.float64, generator=generator)
    return u.neg_().log1p_().neg_().to(dtype)


@functools.lru_cache(maxsize=None)
def _vectorised_exponential_matches(dtype: torch.dtype) -> bool:
    """Whether `_vectorised_exponential` gives, on this build of torch, the numbers of the CPU ``exponential_``
    kernel in ``dtype`` and leaves the generator where it does (checked once per dtype and process, on a few
    thousand draws)."""
    if not dtype.is_floating_point:
        return False
    ours, theirs = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    expected = torch.empty(4099, dtype=dtype).exponential_(1, generator=theirs)
    drawn = _vectorised_exponential((4099,), dtype, ours)
    return torch.equal(drawn, expected) and torch.equal(ours.get_state(), theirs.get_state())


def select_rows(generator: Draws, index: torch.Tensor) -> Draws:
    """The draws of the rows ``index`` of a batch: their generators, or the batch's one stream."""
    return generator.select(index) if isinstance(generator, RowGenerators) else generator


def only_rows(generator: Draws, drawing: Optional[torch.Tensor]) -> Draws:
    """The draws of a step in which only the rows ``drawing`` (B,) take part (None: every row)."""
    return generator.only(drawing) if isinstance(generator, RowGenerators) and drawing is not None else generator


def _check_rows(generator: RowGenerators, batch: int) -> None:
    if len(generator) != batch:
        raise RuntimeError(f"{len(generator)} row generators for a draw over {batch} rows")
