"""When a generation ends, and what a call records as it runs: EOS, stopping criteria, streaming, the trace.

Between semi-autoregressive blocks a row whose revealed prefix holds an EOS (with nothing masked before it) or
meets a user stopping criterion is finished and skips the remaining blocks (`finished_rows`). At the end, tokens
after the first generated EOS become padding when ``stop_at_eos`` (`finalize_eos`). With ``eos_early_stop`` a row
also stops inside a block, at the step that writes its EOS (`stops_inside_block`). `Streamer` feeds a
transformers streamer with the leftmost generated prefix as it becomes final; `Trace` counts the steps, keeps the
canvas after each (``output_history``) and streams. ``max_time`` is transformers' `MaxTimeCriteria` among the
stopping criteria (`with_max_time`).

Exported with the model as remote code (imports only torch and transformers).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from transformers.generation.stopping_criteria import MaxTimeCriteria, StoppingCriteriaList

from .tokens import after_first_eos


def eos_tensor(config: Any, device: Any) -> Optional[torch.Tensor]:
    """The EOS ids (E,) generation stops at, or None (no EOS, or ``stop_at_eos`` off)."""
    eos = config.eos_token_id
    if eos is None or not config.stop_at_eos:
        return None
    eos = [eos] if isinstance(eos, int) else list(eos)
    return torch.tensor(eos, device=device)


def with_max_time(stopping_criteria: Any, max_time: Optional[float]) -> Any:
    """``stopping_criteria`` with transformers' `MaxTimeCriteria` (``max_time`` seconds from now) when given."""
    if max_time is None:
        return stopping_criteria
    return StoppingCriteriaList([*(stopping_criteria or []), MaxTimeCriteria(float(max_time))])


def finished_rows(x, gen_mask0, upto: int, eos_ids, stopping_criteria, still_masked) -> torch.Tensor:
    """(B,) rows whose revealed prefix up to column ``upto`` contains EOS or meets a stopping criterion."""
    done = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    if eos_ids is not None:
        region = gen_mask0[:, :upto]
        is_eos = torch.isin(x[:, :upto], eos_ids) & region
        first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full_like(done, upto, dtype=torch.long))
        cols = torch.arange(upto, device=x.device)[None, :]
        masked_before = (still_masked[:, :upto] & (cols < first_eos[:, None])).any(1)
        done |= is_eos.any(1) & ~masked_before
    if stopping_criteria is not None and len(stopping_criteria):
        done |= stopping_criteria(x[:, :upto], None).to(done.device).bool()
    return done


def missing_positions(x, gen_mask0, eos_ids, mask_id: int) -> torch.Tensor:
    """(B, L) positions to generate that are still [MASK] before the row's first generated EOS (anywhere without
    EOS ids): the tokens a row lacks when generation stopped before it finished (``max_time``, a stopping
    criterion). Positions after a row's EOS are padding, not missing."""
    missing = (x == mask_id) & gen_mask0
    if eos_ids is not None:
        missing &= (torch.isin(x, eos_ids) & gen_mask0).long().cumsum(1) == 0
    return missing


def warn_unfinished(missing: torch.Tensor, stopped: torch.Tensor, max_time: float, pad_id: int, mask_id: int) -> None:
    """A UserWarning when rows ``stopped`` (B,) early with positions of ``missing`` (B, L) not generated: under
    ``max_time`` the output would otherwise look complete."""
    missing = missing & stopped[:, None]
    rows = missing.any(1)
    if not bool(rows.any()):
        return
    held = "[MASK]" if pad_id == mask_id else f"pad_token_id={pad_id}"
    warnings.warn(
        f"generation stopped before it finished (max_time={max_time} s): {int(missing.sum())} position(s) in "
        f"{int(rows.sum())} row(s) were not generated and hold {held}; raise max_time, or pass "
        "return_dict_in_generate=True and read the output's `unfinished` rows",
        UserWarning,
        stacklevel=2,
    )


def finalize_eos(x, gen_mask0, eos_ids, pad_id, unfilled) -> torch.Tensor:
    """Tokens after the first generated EOS become ``pad_id`` (in place); returns generated-token counts (B,),
    not counting ``unfilled`` positions (masks of rows that stopped early, set to padding)."""
    generated = gen_mask0 & ~unfilled
    if eos_ids is not None:
        after = after_first_eos(x, eos_ids, gen_mask0) & gen_mask0
        x.masked_fill_(after, pad_id)
        generated &= ~after
    return generated.sum(1)


class Streamer:
    """Feeds streamers with tokens as the leftmost generated prefix of a row becomes final: a transformers streamer
    (batch size 1, as in transformers), or a list with one per row (None for a row nobody streams), each receiving
    its row's prompt, then its final tokens."""

    def __init__(self, streamer, x, gen_mask0, mask_id, width: Optional[int] = None):
        self.mask_id = mask_id
        self.width = width  # columns of the output (the canvas may run further: ``whole_blocks``)
        per_row = isinstance(streamer, (list, tuple))
        if streamer is not None and not per_row and x.shape[0] != 1:
            raise ValueError("streamer supports batch size 1 only, as in transformers (or pass a list, one per row)")
        if per_row and len(streamer) != x.shape[0]:
            raise ValueError(f"a list of {len(streamer)} streamers for {x.shape[0]} rows: pass one per row (or None)")
        self.streamers = list(streamer) if per_row else [streamer] + [None] * (x.shape[0] - 1)
        self.pos = [x.shape[1]] * x.shape[0]
        for b, row_streamer in enumerate(self.streamers):
            if row_streamer is not None:
                cols = gen_mask0[b].nonzero().flatten()
                self.pos[b] = int(cols[0]) if cols.numel() else x.shape[1]
                row_streamer.put(x[b, : self.pos[b]].cpu())

    @property
    def active(self) -> bool:
        return any(s is not None for s in self.streamers)

    def update(self, x, upto: Optional[int] = None):
        """Send each streamed row the tokens from the last one sent to the first still masked (or to column
        ``upto``, before which tokens are final while a transfer that edits runs its block)."""
        ends = [end for end in (upto, self.width) if end is not None]
        for b, row_streamer in enumerate(self.streamers):
            if row_streamer is None:
                continue
            row = x[b, self.pos[b] : min(ends, default=None)]
            masked = (row == self.mask_id).nonzero()
            stop = int(masked[0]) if masked.numel() else row.shape[0]
            if stop > 0:
                row_streamer.put(row[:stop].cpu())
                self.pos[b] += stop

    def end(self, x):
        self.update(x)
        for row_streamer in self.streamers:
            if row_streamer is not None:
                row_streamer.end()


@dataclass
class Trace:
    """What a call records as it runs: the steps taken, the canvas after each (``output_history``), the stream."""

    stream: Streamer
    keep_history: bool = False
    steps: int = 0
    history: list[torch.Tensor] = field(default_factory=list)
    accepted_per_round: Optional[torch.Tensor] = None  # (B,) speculative decoding's drafts accepted per round

    @property
    def needs_canvas(self) -> bool:
        """Whether every step must see the whole canvas (history or streaming)."""
        return self.keep_history or self.stream.active

    def step(self, x: torch.Tensor, final_before: Optional[int] = None) -> None:
        """A step ran: count it, keep the canvas, stream what is final (up to ``final_before`` if given)."""
        self.steps += 1
        if self.keep_history:
            self.history.append(x.clone())
        self.stream.update(x, final_before)


def stops_inside_block(rows: Any, block_mask: torch.Tensor, eos_ids: torch.Tensor, mask_id: int) -> torch.Tensor:
    """(B,) rows that stop at this step (LLaDA2's ``eos_early_stop``): the step revealed an EOS (at a position of
    ``block_mask``, the block's masked positions before it) and nothing generated before the row's first EOS is
    still masked."""
    x, generated = rows.x, ~rows.prompt_mask
    revealed_eos = (torch.isin(x, eos_ids) & block_mask).any(1)
    is_eos = torch.isin(x, eos_ids) & generated
    first = torch.where(is_eos.any(1), is_eos.long().argmax(1), x.shape[1])
    before_first = torch.arange(x.shape[1], device=x.device)[None, :] < first[:, None]
    return revealed_eos & ~((x == mask_id) & generated & before_first).any(1)
