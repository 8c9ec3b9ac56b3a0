"""LLaDA2.1's token editing: a block's steps may also rewrite tokens revealed earlier (`LLaDA21EditingTransfer`).

LLaDA2.1's published generate() (modeling_llada21_moe.py) runs each block until it is done, with no step budget:

1. a forward gives a proposal and its confidence at every position of the block;
2. masked positions: those whose confidence is above ``threshold`` (strictly) are revealed when there are at least
   ``num_to_transfer`` of them, else the ``num_to_transfer`` most confident (all that are left if fewer);
3. editing: every position of the block revealed before this step (not the prompt) whose proposal differs from its
   token and whose confidence is above ``editing_threshold`` takes the proposal;
4. the block is done after a step that started with no mask and edited nothing, or once ``max_post_steps``
   forwards have run since its last mask was revealed.

Rows of a batch run their own steps (a row that is done keeps its tokens while the others go on), so each row gets
the tokens it gets alone. Under block-causal attention editing touches only the current block, whose keys/values
the exact cache recomputes on every forward anyway. With ``output_scores`` / ``output_logits`` a position's scores
are those of the step that last wrote it (an edit replaces the reveal's). Exported with the model as remote code.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .generation_denoiser import Rows
from .generation_sampler import Sampler, _propose_at
from .generation_strategy import choose
from .generation_transfer import Transfer, register_transfer


@register_transfer
class LLaDA21EditingTransfer(Transfer):
    """LLaDA2.1's mask-to-token reveals with token-to-token edits (see the module docstring): ``threshold``,
    ``num_to_transfer``, ``editing_threshold``, ``max_post_steps``. Its own block loop (`denoise`)."""

    name, edits = "llada21_editing", True
    parameters = ("threshold", "editing_threshold", "max_post_steps", "num_to_transfer")

    def __init__(
        self,
        threshold: float = 0.95,
        editing_threshold: float = 0.9,
        max_post_steps: int = 16,
        num_to_transfer: int = 1,
    ):
        self.threshold, self.editing_threshold = float(threshold), float(editing_threshold)
        self.max_post_steps, self.num_to_transfer = int(max_post_steps), int(num_to_transfer)
        self.block_denoiser = self.denoise

    @classmethod
    def from_config(cls, config: Any) -> "Transfer":
        values = (config.threshold, config.editing_threshold, config.max_post_steps, config.num_to_transfer)
        if any(value is None for value in values):
            raise ValueError(
                "transfer='llada21_editing' needs threshold, editing_threshold, max_post_steps and num_to_transfer: "
                "build the config with MaskedDiffusionGenerationConfig.llada21(...)"
            )
        return cls(*values)

    def block_steps(self, steps, block_counts: list[int]) -> list[int]:
        """No step budget: a block runs until it is done (any non-zero count runs it)."""
        return [1 if count > 0 else 0 for count in block_counts]

    def denoise(
        self, sampler: Sampler, rows: Rows, region: torch.Tensor, num_steps: int, on_step: Callable[[], None]
    ) -> None:
        """The steps of one block (``region`` (B, L): its generated positions), in place on ``rows.x``."""
        mask_id, x = sampler.mask_id, rows.x
        keep = region.any(0).nonzero().flatten()
        running = region.any(1)
        post_steps = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        while True:
            masked = (x[:, keep] == mask_id) & region[:, keep]
            post_steps += (~masked.any(1)).long()
            running &= post_steps <= self.max_post_steps
            if not bool(running.any()):
                return
            proposals = _propose_at(sampler, rows, keep)
            revealed = self._reveals(sampler, proposals, keep, masked & running[:, None], x.shape[1])
            edited = region[:, keep] & ~masked & running[:, None]
            edited &= (proposals.confidence > self.editing_threshold) & (proposals.tokens != x[:, keep])
            written = revealed | edited
            x[:, keep] = torch.where(written, proposals.tokens, x[:, keep])
            # a position's scores are those of the step that last wrote it
            sampler.record(rows, None, keep, proposals, written)
            on_step()
            running &= masked.any(1) | edited.any(1)

    def _reveals(self, sampler: Sampler, proposals, keep: torch.Tensor, masked: torch.Tensor, length: int):
        """(B, K) masked positions revealed: above ``threshold`` when at least ``num_to_transfer``, else the
        ``num_to_transfer`` best by the strategy's scores (confidence)."""
        confident = (proposals.confidence > self.threshold) & masked
        counts = confident.sum(1)
        counts = torch.where(
            counts >= self.num_to_transfer, counts, torch.clamp(masked.sum(1), max=self.num_to_transfer)
        )
        scores = sampler.strategy.scores(proposals, keep, length, sampler.generator)
        candidates = torch.zeros(masked.shape[0], length, dtype=torch.bool, device=masked.device)
        candidates[:, keep] = masked
        return choose(scores, candidates, counts)[:, keep]


__all__ = ["LLaDA21EditingTransfer"]
