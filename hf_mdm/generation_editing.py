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
from .generation_sampler import Sampler, propose_at
from .generation_stopping import stops_inside_block
from .generation_strategy import choose
from .generation_transfer import Transfer, even_split, register_transfer


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
        mask_steps = torch.zeros_like(post_steps)  # forwards that started with masks left, per row
        while True:
            masked = (x[:, keep] == mask_id) & region[:, keep]
            post_steps += (~masked.any(1)).long()
            running &= (post_steps <= self.post_step_limit) & (mask_steps < self.step_budget)
            if not bool(running.any()):
                return
            proposals = propose_at(sampler, rows, keep, running[:, None].expand(-1, keep.numel()))
            floor = self.reveal_floor(mask_steps)
            revealed = self._reveals(sampler, proposals, keep, masked & running[:, None], x.shape[1], floor)
            edited = region[:, keep] & ~masked & running[:, None]
            edited &= (proposals.confidence > self.editing_threshold) & (proposals.tokens != x[:, keep])
            written = revealed | edited
            x[:, keep] = torch.where(written, proposals.tokens, x[:, keep])
            # a position's scores are those of the step that last wrote it
            sampler.record(rows, None, keep, proposals, written)
            on_step()
            mask_steps += masked.any(1).long()
            running &= (masked.any(1) | edited.any(1)) & ~self._stops_at_eos(sampler, rows, keep, written)

    @property
    def post_step_limit(self) -> int:
        """The most forwards a row runs after its block has no mask left (LLaDA2.1: ``max_post_steps``)."""
        return self.max_post_steps

    step_budget = float("inf")  # forwards a block may run while masks are left (LLaDA2.1: none)

    def reveal_floor(self, mask_steps: torch.Tensor) -> torch.Tensor:
        """(B,) the fewest masked positions a row reveals at this step (the most confident when too few are above
        ``threshold``), given the forwards each row ran with masks left: ``num_to_transfer``."""
        return torch.full_like(mask_steps, self.num_to_transfer)

    @staticmethod
    def _stops_at_eos(sampler: Sampler, rows: Rows, keep: torch.Tensor, written: torch.Tensor) -> torch.Tensor:
        """(B,) with ``eos_early_stop``: rows that wrote an EOS at this step with nothing generated before their
        first EOS still masked (`stops_inside_block`); none otherwise."""
        if sampler.early_stop_eos is None:
            return torch.zeros(written.shape[0], dtype=torch.bool, device=written.device)
        at = torch.zeros(rows.x.shape, dtype=torch.bool, device=written.device)
        at[:, keep] = written
        return stops_inside_block(rows, at, sampler.early_stop_eos, sampler.mask_id)

    def _reveals(self, sampler: Sampler, proposals, keep: torch.Tensor, masked: torch.Tensor, length: int, floor):
        """(B, K) masked positions revealed: above ``threshold`` when at least ``floor`` (B,), else the ``floor``
        best by the strategy's scores (confidence)."""
        confident = (proposals.confidence > self.threshold) & masked
        counts = confident.sum(1)
        counts = torch.where(counts >= floor, counts, torch.minimum(masked.sum(1), floor))
        scores = sampler.strategy.scores(proposals, keep, length, sampler.generator)
        candidates = torch.zeros(masked.shape[0], length, dtype=torch.bool, device=masked.device)
        candidates[:, keep] = masked
        return choose(scores, candidates, counts)[:, keep]


@register_transfer
class BlockRefinementTransfer(LLaDA21EditingTransfer):
    """diffusers' ``BlockRefinementScheduler`` as ``LLaDA2Pipeline`` runs it (mask mode, editing on): LLaDA2.1's
    reveals and edits (`LLaDA21EditingTransfer`) with LLaDA2.0's step budget and shares: a block runs at most
    ``steps`` forwards while masks are left, and a row's i-th of them reveals every masked position above
    ``threshold`` when there are at least ``share[i]`` of them, else the ``share[i]`` most confident, ``share``
    being the even split of ``block_length`` over ``steps`` (`even_split`); after its last mask a row runs at
    most ``max_post_steps + 1`` forwards, stopping after one that edits nothing."""

    name = "block_refinement"
    parameters = ("threshold", "editing_threshold", "max_post_steps")

    def __init__(self, threshold: float, editing_threshold: float, max_post_steps: int, steps: int, block_length: int):
        super().__init__(threshold, editing_threshold, max_post_steps, num_to_transfer=1)
        self.step_budget = int(steps)
        self.share = torch.tensor(even_split(int(block_length), int(steps)))

    @classmethod
    def from_config(cls, config: Any) -> "Transfer":
        values = (config.threshold, config.editing_threshold, config.max_post_steps, config.steps, config.block_length)
        if any(value is None for value in values):
            raise ValueError(
                "transfer='block_refinement' needs threshold, editing_threshold, max_post_steps, steps and "
                "block_length: build the config with MaskedDiffusionGenerationConfig.llada2_pipeline(...)"
            )
        return cls(*values)

    @property
    def post_step_limit(self) -> int:
        return self.max_post_steps + 1

    def reveal_floor(self, mask_steps: torch.Tensor) -> torch.Tensor:
        share = self.share.to(mask_steps.device)
        return share[mask_steps.clamp(max=share.numel() - 1)]


__all__ = ["BlockRefinementTransfer", "LLaDA21EditingTransfer"]
