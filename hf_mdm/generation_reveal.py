"""Writing tokens at the positions a step reveals: the model's logits there, a proposal at each, the token written.

- `reveal_rows`: at the ``chosen`` (B, L) positions, whatever their number per row: the model runs only on rows
  with one, and asks logits only there (per-row positions, or the union of their columns); the shapes follow the
  choice, so the host reads it (a transfer's own step-by-step `count_rule`);
- `reveal_top`: at each row's ``counts`` best-scored candidates with the largest count known on the host: logits at
  (B, kmax) per-row positions, fixed shapes, nothing read back (the positional strategies under fixed counts);
- `reveal_where`: `reveal_top` at given positions, left to right (the paper's sampler and ReMDM).

Exported with the model as remote code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from .generation_denoiser import Rows
from .generation_strategy import get_strategy

if TYPE_CHECKING:
    from .generation_sampler import Sampler


def reveal_rows(sampler: Sampler, rows: Rows, chosen: torch.Tensor, confidence: Optional[torch.Tensor] = None) -> None:
    """Propose and write tokens at the ``chosen`` (B, L) positions, running the model only on rows with one;
    ``confidence`` (B, L), when given, receives the probability of each written token (`Proposer`'s)."""
    active = chosen.any(1)
    if bool(active.all()) or not sampler.denoiser.row_subsets:
        return _reveal_chosen(sampler, rows, chosen, confidence)
    sub = active.nonzero().flatten()  # rows never see each other: the others need no forward
    subset = rows.select(sub)
    sub_confidence = None if confidence is None else confidence[sub]
    with sampler.drawing_for(sub):
        _reveal_chosen(sampler, subset, chosen[sub], sub_confidence)
    rows.x[sub] = subset.x
    if confidence is not None:
        confidence[sub] = sub_confidence


def _reveal_chosen(sampler: Sampler, rows: Rows, chosen: torch.Tensor, confidence: Optional[torch.Tensor]) -> None:
    x = rows.x
    if sampler.denoiser.per_row_logits:
        flat_rows, cols = chosen.nonzero(as_tuple=True)  # row-major
        per_row = chosen.sum(1)
        first = per_row.cumsum(0) - per_row
        slot = torch.arange(flat_rows.numel(), device=x.device) - first[flat_rows]
        positions = cols.new_zeros((x.shape[0], int(per_row.max())))  # unused slots ask for position 0
        positions[flat_rows, slot] = cols
        logits = sampler.denoiser.logits(rows, positions)[flat_rows, slot]
    else:
        keep = chosen.any(0).nonzero().flatten()
        flat_rows, k = chosen[:, keep].nonzero(as_tuple=True)
        cols = keep[k]
        logits = sampler.denoiser.logits(rows, keep)[flat_rows, k]
    proposals = sampler.proposer(logits, sampler.proposer.processor_ids(x, flat_rows, cols), drawn=(flat_rows, None))
    x[flat_rows, cols] = proposals.tokens
    sampler.record(rows, flat_rows, cols, proposals)
    if confidence is not None:
        confidence[flat_rows, cols] = proposals.confidence.to(confidence.dtype)


def reveal_top(
    sampler: Sampler,
    rows: Rows,
    scores: torch.Tensor,
    candidates: torch.Tensor,
    counts: torch.Tensor,
    kmax: int,
    confidence: Optional[torch.Tensor] = None,
) -> None:
    """Propose and write tokens at the ``counts`` (B,) best-``scores`` (B, L) ``candidates`` of each row (the
    positions `hf_mdm.generation_strategy.choose` takes), ``kmax`` the largest count: logits at every row's
    ``kmax`` best positions (B, kmax), each row writing its first ``counts`` of them (``confidence`` as
    `reveal_rows`'). Every row runs, whether it reveals anything or not, and nothing is read back."""
    x, bsz = rows.x, rows.x.shape[0]
    positions = torch.topk(scores.masked_fill(~candidates, -float("inf")), kmax, dim=-1).indices
    take = (torch.arange(kmax, device=x.device)[None, :] < counts[:, None]) & candidates.gather(1, positions)
    logits = _logits_at(sampler, rows, positions.masked_fill(~take, 0))  # unused slots: position 0, in any span
    flat_rows, cols = torch.arange(bsz, device=x.device).repeat_interleave(kmax), positions.flatten()
    ids = sampler.proposer.processor_ids(x, flat_rows, cols)
    flat = sampler.proposer(logits.flatten(0, 1), ids, drawn=(flat_rows, take.flatten()))
    proposals = type(flat)(*(None if v is None else v.view(bsz, kmax, *v.shape[1:]) for v in flat))
    x.scatter_(1, positions, torch.where(take, proposals.tokens, x.gather(1, positions)))
    sampler.record(rows, None, positions, proposals, take)
    if confidence is not None:
        written = proposals.confidence.to(confidence.dtype)
        confidence.scatter_(1, positions, torch.where(take, written, confidence.gather(1, positions)))


def _logits_at(sampler: Sampler, rows: Rows, positions: torch.Tensor) -> torch.Tensor:
    """Logits (B, K, V) at per-row ``positions`` (B, K): asked so of a model that takes per-row positions
    (``Denoiser.per_row_logits``), else taken from the logits at every column (fixed shapes either way)."""
    if sampler.denoiser.per_row_logits:
        return sampler.denoiser.logits(rows, positions)
    logits = sampler.denoiser.logits(rows, torch.arange(rows.x.shape[1], device=positions.device))
    return logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))


def reveal_where(
    sampler: Sampler,
    rows: Rows,
    chosen: torch.Tensor,
    counts: torch.Tensor,
    kmax: int,
    confidence: Optional[torch.Tensor] = None,
) -> None:
    """Propose and write tokens at the ``chosen`` (B, L) positions, ``counts`` (B,) of them per row and ``kmax``
    at most, left to right, with fixed shapes (`reveal_top`)."""
    left_to_right = get_strategy("left_to_right").positional_scores(rows.x.shape, None, rows.x.device)
    reveal_top(sampler, rows, left_to_right, chosen, counts, kmax, confidence)
