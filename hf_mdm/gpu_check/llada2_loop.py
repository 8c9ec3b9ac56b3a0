"""LLaDA2's published generate() loop, restated for timing against hf_mdm's exact block cache (no code of it copied).

The published loop, at temperature 0, runs every forward on the canvas up to the end of the current block (no
cache): a block of ``block_length`` positions is revealed in ``steps`` steps, each taking the positions whose
confidence is above ``threshold``, or the step's share of the block (`hf_mdm.generation_transfer.even_split`) of the
most confident when fewer are; generation stops after the block where an EOS appears. One row.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..generation_transfer import even_split

__all__ = ["published_loop", "cut_at_eos"]


@torch.no_grad()
def published_loop(model, prompt, gen_length: int, block_length: int, steps: int, threshold: float):
    """The published generate()'s algorithm at temperature 0, without a cache: every forward runs the canvas up to
    the end of the current block. Returns the generated tokens, forwards and positions computed."""
    mask_id, eos_id, length = model.config.mask_token_id, model.config.eos_token_id, prompt.shape[1]
    num_blocks = -(-(length + gen_length) // block_length)
    x = torch.full((1, num_blocks * block_length), mask_id, dtype=torch.long, device=prompt.device)
    x[:, :length] = prompt
    share, forwards, positions = even_split(block_length, steps), 0, 0
    for block in range(length // block_length, num_blocks):
        end = (block + 1) * block_length
        window = x[0, end - block_length : end]
        for step in range(steps):
            masked = window == mask_id
            if not bool(masked.any()):
                break
            logits = model(x[:, :end], block_size=block_length).logits[0, -block_length:]
            forwards, positions = forwards + 1, positions + end
            confidence, tokens = logits.softmax(-1).max(-1)
            confidence = torch.where(masked, confidence, -torch.inf)
            take = confidence > threshold
            if int(take.sum()) < share[step]:
                take = torch.zeros_like(masked)
                take[confidence.topk(min(share[step], int(masked.sum()))).indices] = True
            window[take] = tokens[take]
        if bool((x[0, length:end] == eos_id).any()):
            break
    return x[0, length : length + gen_length], forwards, positions


def cut_at_eos(tokens: torch.Tensor, eos_id: Optional[int]) -> list[int]:
    """The tokens through the first EOS (all of them without one): what the published loop and the preset must
    agree on (after its EOS a row's tokens are padding in one and left as decoded in the other)."""
    row = tokens.flatten().tolist()
    return row[: row.index(eos_id) + 1] if eos_id is not None and eos_id in row else row
