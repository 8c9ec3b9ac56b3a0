"""``no_repeat_ngram_size`` in any reveal order: no n-gram occurs twice in the returned sequence.

transformers' `NoRepeatNGramLogitsProcessor` bans, at the next position of a left-to-right decoder, every token that
would complete an n-gram already in the sequence. A masked diffusion model reveals positions in any order and several
at a step, so a position's left context alone does not protect the sequence: a token may complete an n-gram with its
right neighbours, and two positions revealed at the same step may complete one together. `NoRepeatNGram` bans, at a
position, every token that would complete an n-gram on *either* side (each window of n positions through it whose
other n - 1 positions hold tokens) equal to an n-gram already complete in the row or to another window it completes
(``a t a`` with t = a completes the bigram (a, a) twice); and the positions proposed in one
call are decided one after the other in column order, each seeing the tokens proposed before it in its row, so no two
of one step's reveals complete equal n-grams. A proposal that is not revealed still constrained the later ones (more
bans, never fewer). Every n-gram complete in the returned sequence was thus checked when its last position was
written. A position where every token is banned is left unbanned (as transformers' processor would leave no token).

Exported with the model as remote code.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["NoRepeatNGram"]


class NoRepeatNGram:
    """Bans the tokens that would repeat an n-gram of size ``size`` in a canvas row holding [MASK] ``mask_id``."""

    def __init__(self, size: int, mask_id: int):
        self.size, self.mask_id = int(size), int(mask_id)

    def propose(
        self,
        logits: torch.Tensor,
        canvas: torch.Tensor,
        rows: torch.Tensor,
        cols: torch.Tensor,
        pick: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Tokens (N,) for the N positions (``rows``, ``cols``) of ``canvas`` (B, L), picked by ``pick`` from their
        ``logits`` (N, V) after the bans (written into ``logits``: -inf at a banned token), rank by rank: a row's
        positions in column order, each seeing the tokens picked before it."""
        work = canvas.clone()
        tokens = torch.empty(cols.shape, dtype=torch.long, device=cols.device)
        order = torch.argsort(rows * (canvas.shape[1] + 1) + cols, stable=True)
        counts = torch.bincount(rows, minlength=canvas.shape[0])
        first = counts.cumsum(0) - counts
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=order.device) - first[rows[order]]
        for k in range(int(counts.max()) if counts.numel() else 0):
            at = (rank == k).nonzero().flatten()
            self.ban(logits, work[rows[at]], cols[at], at)
            tokens[at] = pick(logits[at])
            fill = work[rows[at], cols[at]] == self.mask_id  # a prompt column (an unused slot) is never written
            work[rows[at][fill], cols[at][fill]] = tokens[at][fill]
        return tokens

    def ban(self, logits: torch.Tensor, canvas: torch.Tensor, cols: torch.Tensor, at: torch.Tensor) -> None:
        """-inf in ``logits[at]`` at every token that would complete, at column ``cols`` (M,) of its row ``canvas``
        (M, L), an n-gram already complete in that row (the column itself read as [MASK])."""
        n, length = self.size, canvas.shape[1]
        if length < n or at.numel() == 0:
            return
        canvas = canvas.clone()
        canvas[torch.arange(canvas.shape[0], device=canvas.device), cols] = self.mask_id
        windows = canvas.unfold(1, n, 1)  # (M, S, n)
        complete = (windows != self.mask_id).all(-1)
        vocab = logits.shape[1]
        banned = torch.zeros((at.numel(), vocab + 1), dtype=torch.bool, device=logits.device)
        offsets = torch.arange(n, device=canvas.device)
        patterns, valids = [], []
        for o in range(n):  # the window with the column at offset o, against the complete ones
            start = cols - o
            valid = (start >= 0) & (start + n <= length)
            index = (start.clamp(0, length - n)[:, None] + offsets[None, :]).clamp(max=length - 1)
            pattern = canvas.gather(1, index)  # (M, n), the hole at o
            others = offsets != o
            valid &= (pattern[:, others] != self.mask_id).all(-1)
            match = ((windows == pattern[:, None, :]) | ~others).all(-1) & complete & valid[:, None]
            banned.scatter_(1, torch.where(match, windows[..., o], vocab), True)
            patterns.append(pattern)
            valids.append(valid)
        for o1 in range(n):  # two windows through the column, equal to each other once the token is in both
            for o2 in range(o1 + 1, n):
                p1, p2 = patterns[o1], patterns[o2]
                rest = (offsets != o1) & (offsets != o2)
                equal = ((p1 == p2) | ~rest).all(-1) & (p1[:, o2] == p2[:, o1]) & valids[o1] & valids[o2]
                banned.scatter_(1, torch.where(equal, p2[:, o1], vocab)[:, None], True)
        banned = banned[:, :vocab]
        banned[:, self.mask_id] = False
        banned &= ~(banned | (torch.arange(vocab, device=logits.device) == self.mask_id)).all(-1, keepdim=True)
        logits[at] = logits[at].masked_fill(banned, -float("inf"))
