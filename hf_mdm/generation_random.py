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

from typing import Any, Iterator, Optional, Sequence, Union

import torch

__all__ = ["RowGenerators", "Draws", "rand", "binomial", "multinomial", "select_rows", "only_rows"]


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
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
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
            tokens[index] = torch.multinomial(probs[index], 1, generator=g).squeeze(1)
    return tokens


def select_rows(generator: Draws, index: torch.Tensor) -> Draws:
    """The draws of the rows ``index`` of a batch: their generators, or the batch's one stream."""
    return generator.select(index) if isinstance(generator, RowGenerators) else generator


def only_rows(generator: Draws, drawing: Optional[torch.Tensor]) -> Draws:
    """The draws of a step in which only the rows ``drawing`` (B,) take part (None: every row)."""
    return generator.only(drawing) if isinstance(generator, RowGenerators) and drawing is not None else generator


def _check_rows(generator: RowGenerators, batch: int) -> None:
    if len(generator) != batch:
        raise RuntimeError(f"{len(generator)} row generators for a draw over {batch} rows")
