"""Prompt batches the sampler tests share."""

import torch


def left_padded_prompts(high: int, bsz: int = 3, length: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask)``: ``bsz`` random prompts of ids in [2, ``high``), the second left-padded by two and
    the third by one."""
    ids = torch.randint(2, high, (bsz, length), generator=torch.Generator().manual_seed(seed))
    attention = torch.ones_like(ids)
    attention[1, :2] = 0
    attention[2, :1] = 0
    return ids, attention
