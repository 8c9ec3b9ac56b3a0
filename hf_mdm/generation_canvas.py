"""The canvas of a call: the prompt followed by ``max_new_tokens`` [MASK] tokens, what is padding and what is
generated. Masks already inside the prompt are generated too (infilling); padding (2-D ``attention_mask``, left or
right) is never attended to nor generated (`prepare_canvas`); ``whole_blocks`` grows each row to the end of its last
attention block (`fill_last_blocks`). Exported with the model as remote code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .generation_denoiser import Rows

__all__ = ["Canvas", "prepare_canvas", "fill_last_blocks"]


@dataclass
class Canvas:
    """The canvas of one call: ids ``x`` (B, L) (prompt, then masks; written in place as tokens are revealed),
    ``attn`` (B, L) or None when nothing is padded, ``gen_mask0`` (B, L) the positions to generate."""

    x: torch.Tensor
    attn: Optional[torch.Tensor]
    gen_mask0: torch.Tensor

    @property
    def prompt_mask(self) -> torch.Tensor:
        """(B, L) True at every position not generated (prompt and padding)."""
        return ~self.gen_mask0

    def positions(self) -> torch.Tensor:
        """(B, L) the position of each column: ``cumsum(attn) - 1`` (a row's first token is position 0, whatever
        its padding), else ``0..L-1``."""
        if self.attn is None:
            return torch.arange(self.x.shape[1], device=self.x.device).expand_as(self.x)
        return (self.attn.long().cumsum(1) - 1).clamp(min=0)

    def rows(self) -> Rows:
        return Rows(self.x, self.attn, self.prompt_mask)


def prepare_canvas(
    input_ids, attention_mask, max_new_tokens: int, mask_id: int, max_positions: Optional[int] = None
) -> Canvas:
    """The prompt followed by ``max_new_tokens`` masks; the attention mask extended (None when nothing is padded).
    Prompt ids of any integer dtype are taken as ``torch.long`` (the canvas' dtype). ValueErrors, before anything is
    allocated, for ids that are not integers, a canvas longer than ``max_positions`` (the model's positions) and a
    row whose attention mask is all zeros."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a 2-D LongTensor (batch, prompt_length), got {shape}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise ValueError(
            f"input_ids must hold integer token ids (torch.long), got {input_ids.dtype}: pass the "
            "tokenizer's ids or input_ids.long()"
        )
    input_ids = input_ids.long()  # int32 / int16 / uint8 ids: the same tokens
    bsz, prompt_len = input_ids.shape
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_positions is not None and prompt_len + max_new_tokens > max_positions:
        raise ValueError(
            f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) = {prompt_len + max_new_tokens} "
            f"exceeds the model's max_position_embeddings={max_positions}: shorten one of them"
        )
    if attention_mask is not None:
        attention_mask = _checked_attention_mask(attention_mask, bsz, prompt_len, input_ids.device)
    x = torch.cat([input_ids, input_ids.new_full((bsz, max_new_tokens), mask_id)], dim=1)
    attn = None
    if attention_mask is not None and not bool(attention_mask.all()):
        attn = torch.cat([attention_mask, attention_mask.new_ones((bsz, max_new_tokens))], dim=1)
    gen_mask = x == mask_id
    if attn is not None:
        gen_mask &= attn
    return Canvas(x, attn, gen_mask)


def _checked_attention_mask(attention_mask: torch.Tensor, bsz: int, prompt_len: int, device: Any) -> torch.Tensor:
    """The prompt's attention mask as booleans on ``device``; ValueErrors for another shape or an all-zero row."""
    if tuple(attention_mask.shape) != (bsz, prompt_len):
        raise ValueError(
            f"attention_mask must be 2-D (batch, prompt_length) = {(bsz, prompt_len)} like input_ids, "
            f"got {tuple(attention_mask.shape)}"
        )
    attention_mask = attention_mask.to(device).bool()
    empty = (~attention_mask.any(1)).nonzero().flatten() if prompt_len else attention_mask.new_zeros(0)
    if empty.numel():
        raise ValueError(
            f"attention_mask is all zeros in row(s) {empty.tolist()}: every row needs at least one prompt token "
            "(1 = token, 0 = padding); drop those rows, or pass an empty prompt (prompt_length 0) to sample "
            "unconditionally"
        )
    return attention_mask


def fill_last_blocks(canvas: Canvas, block_length: int, mask_id: int) -> Canvas:
    """The canvas grown so that every row's generation runs to the end of its last attention block of
    ``block_length`` positions (counted from the row's position 0), as LLaDA2's generate() lays out whole blocks:
    masks are appended, and each row's columns past its own last block are right padding (never attended to nor
    generated). A row then has exactly the blocks it has alone."""
    x, attn = canvas.x, canvas.attn
    lengths = x.shape[1] if attn is None else attn.long().sum(1)  # positions of each row
    lengths = torch.as_tensor(lengths, device=x.device).expand(x.shape[0])
    wanted = (lengths + block_length - 1) // block_length * block_length
    extra = int((wanted - lengths).max())
    if extra == 0:
        return canvas
    x = torch.cat([x, x.new_full((x.shape[0], extra), mask_id)], dim=1)
    if attn is None:
        attn = torch.ones(x.shape[0], x.shape[1] - extra, dtype=torch.bool, device=x.device)
    attn = torch.cat([attn, attn.new_ones((x.shape[0], extra))], dim=1)
    positions = attn.long().cumsum(1) - 1
    attn = attn & (positions < wanted[:, None])
    gen_mask0 = torch.cat([canvas.gen_mask0, canvas.gen_mask0.new_ones((x.shape[0], extra))], dim=1) & attn
    return Canvas(x, attn if not bool(attn.all()) else None, gen_mask0)
