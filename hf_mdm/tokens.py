"""Token lists as the sampler, the server, GRPO and the likelihoods batch and end them: the one rule each for left
padding (`left_pad`) and for where a generation ends at its first EOS (`eos_index`, `cut_at_eos` on a list;
`after_first_eos` on a batch of rows on the device, what the sampler makes padding).

Left padding keeps every row's last token in the last column, so a batch of prompts of different lengths gets its
generated columns at the same places; the pads are never attended to (attention mask 0). A generation ends at its
first EOS: GRPO keeps the EOS (TRL's completion mask ends on it), an answer's text drops it.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch

__all__ = ["after_first_eos", "cut_at_eos", "eos_index", "eos_set", "left_pad"]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, W), attention_mask (B, W)) long tensors of ``rows`` padded on the left with ``pad_id`` to the longest
    row's width W; the mask is 1 on a row's own tokens and 0 on its pads."""
    width = max((len(row) for row in rows), default=0)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        if len(row):
            ids[b, width - len(row) :] = torch.as_tensor(list(row), dtype=torch.long)
            mask[b, width - len(row) :] = 1
    return ids, mask


def eos_set(eos_ids: Any) -> set[int]:
    """The EOS ids as a set, from an id, an iterable of ids (None entries skipped) or None (no EOS)."""
    if eos_ids is None:
        return set()
    if isinstance(eos_ids, int):
        return {eos_ids}
    if isinstance(eos_ids, torch.Tensor):
        return {int(i) for i in eos_ids.flatten().tolist()}
    return {int(i) for i in eos_ids if i is not None}


def eos_index(tokens: Iterable[int], eos_ids: Any) -> Optional[int]:
    """The index of the first EOS in ``tokens`` (None without one)."""
    eos = eos_set(eos_ids)
    return next((i for i, token in enumerate(tokens) if token in eos), None)


def cut_at_eos(tokens: Sequence[int], eos_ids: Any, keep_eos: bool = True) -> list[int]:
    """``tokens`` up to their first EOS, the EOS kept when ``keep_eos``; all of them without an EOS."""
    at = eos_index(tokens, eos_ids)
    return list(tokens) if at is None else list(tokens[: at + 1 if keep_eos else at])


def after_first_eos(x: torch.Tensor, eos_ids: torch.Tensor, region: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(B, L) booleans: the positions of ``x`` (B, L) after each row's first EOS (one of ``eos_ids``), counting only
    EOS inside ``region`` (B, L) when given: what `cut_at_eos` drops, on the device, with no host read."""
    is_eos = torch.isin(x, eos_ids)
    if region is not None:
        is_eos &= region
    is_eos = is_eos.long()
    return (is_eos.cumsum(-1) - is_eos) > 0
