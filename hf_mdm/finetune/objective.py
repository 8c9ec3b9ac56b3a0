"""The supervised fine-tuning objective of a masked diffusion LM: LLaDA's SFT recipe, and its block-diffusion form.

LLaDA's recipe (arXiv 2502.09992, Section 2.3 and Appendix B): a pair (prompt p, response r) is one sequence;
short pairs of a batch are padded at the end with EOS, which counts as a response token (masked, scored: the
model learns to end its answers with EOS, and the sampler's padding after EOS is what it learned). Each row draws
a time t ~ U(eps, 1]; every response position is masked with probability t; the prompt is never masked. The loss
is the cross-entropy at the masked positions, each weighted 1/t, summed per row, divided by the row's response
length, averaged over the rows:

    loss = 1/B sum_rows 1/|r| sum_{i masked} -log p(x_i | x_t) / t

For a block-causal model (``config.block_size`` b: hf_mdm's block diffusion MDM, LLaDA2) the block-diffusion form
(BD3-LM's objective on the response): every block of b positions (counted from the sequence's first position)
draws its own time, its response positions are masked with it, and a masked position is predicted from the noisy
copy of its own block and the clean blocks before it. All blocks are scored in one forward over the noisy and the
clean sequence side by side (2L positions, `block_diffusion_inputs`); `block_by_block_loss` computes the same
value one block at a time, the definition the tests check it against.

The LM head runs only at the masked positions (per-row ``logits_to_keep``, which hf_mdm's classes take): the
(B, L, V) float32 logits of a full forward are the largest tensor of a fine-tuning step at real vocabularies, and
the loss reads only these rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..modeling_blocks import noisy_clean_mask_function

__all__ = ["SFTCollator", "sft_loss", "block_diffusion_inputs", "block_by_block_loss", "masked_positions"]


@dataclass
class SFTCollator:
    """Rows ``{"input_ids", "prompt_length"}`` -> a batch of LLaDA's SFT objective (see the module docstring).

    Args:
        mask_token_id, eos_token_id: the model's [MASK] and EOS ids; rows are padded with EOS to the batch's
            longest (``pad_token_id`` instead, when given: padding then leaves the loss and attention).
        block_size: None for one time per row, else one time per block of this many positions (block diffusion).
        eps: times are drawn in [eps, 1] (the weight 1/t stays finite).
        seed: the collator's own random stream (times and masks), for reproducible runs: batch k draws from a
            generator seeded with (seed, k), k counted in ``batches``, so a run resumed at batch k (`SFTTrainer`
            sets ``batches`` on resume) draws what the uninterrupted run drew. None: torch's global stream.

    Returns ``input_ids`` x_t (B, L), ``clean_ids`` x_0, ``labels`` (x_0 at the masked response positions, -100
    elsewhere), ``p_mask`` (B, L) each position's masking probability (its time), ``answer_lengths`` (B,) and, with
    ``pad_token_id``, ``attention_mask``.
    """

    mask_token_id: int
    eos_token_id: int
    block_size: Optional[int] = None
    eps: float = 1e-3
    pad_token_id: Optional[int] = None
    seed: Optional[int] = None
    batches: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {self.eps}")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise ValueError(f"block_size must be an integer >= 1 or None, got {self.block_size!r}")

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        x0, real, response = self._pad(features)
        if bool((x0 == self.mask_token_id).any()):
            raise ValueError(f"a row holds the mask token id {self.mask_token_id}: the data must not contain [MASK]")
        bsz, length = x0.shape
        generator = self._next_generator()
        if self.block_size is None:
            p_mask = self._times(bsz, generator)[:, None].expand(bsz, length)
        else:
            blocks = -(-length // self.block_size)
            times = self._times(bsz * blocks, generator).view(bsz, blocks)
            p_mask = times[:, torch.arange(length) // self.block_size]
        masked = (torch.rand(x0.shape, generator=generator) < p_mask) & response
        batch = {
            "input_ids": x0.masked_fill(masked, self.mask_token_id),
            "clean_ids": x0,
            "labels": x0.masked_fill(~masked, -100),
            "p_mask": p_mask.contiguous(),
            "answer_lengths": response.sum(1),
        }
        if self.pad_token_id is not None:
            batch["attention_mask"] = real.long()
        return batch

    def _next_generator(self) -> Optional[torch.Generator]:
        """This batch's generator, seeded with (seed, batches so far) mixed into one 32-bit seed (what torch's CPU
        generator reads); None without a seed."""
        if self.seed is None:
            return None
        key = np.random.SeedSequence([self.seed % 2**64, self.batches]).generate_state(1)
        self.batches += 1
        return torch.Generator().manual_seed(int(key[0]))

    def _times(self, n: int, generator: Optional[torch.Generator]) -> torch.Tensor:
        return self.eps + (1.0 - self.eps) * torch.rand(n, generator=generator)

    def _pad(self, features: Sequence[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x_0, real positions, response positions), each (B, L): rows padded at the end with EOS (a response
        token) or ``pad_token_id`` (not a token)."""
        rows = [list(f["input_ids"]) for f in features]
        prompts = [int(f["prompt_length"]) for f in features]
        for row, prompt in zip(rows, prompts):
            if not 0 <= prompt < len(row):
                raise ValueError(f"prompt_length {prompt} leaves no response in a row of {len(row)} tokens")
        length = max(len(row) for row in rows)
        fill = self.eos_token_id if self.pad_token_id is None else self.pad_token_id
        x0 = torch.tensor([row + [fill] * (length - len(row)) for row in rows], dtype=torch.long)
        columns = torch.arange(length)[None, :]
        sizes = torch.tensor([len(row) for row in rows])[:, None]
        real = columns < sizes if self.pad_token_id is not None else torch.ones_like(x0, dtype=torch.bool)
        response = (columns >= torch.tensor(prompts)[:, None]) & real
        return x0, real, response


def masked_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, K) column indices of each row's labelled positions, padded with column 0, and (B, K) which are real:
    the rows of the LM head a step needs."""
    scored = labels != -100
    k = max(int(scored.sum(1).max()), 1)
    order = torch.argsort((~scored).to(torch.uint8), dim=1, stable=True)[:, :k]
    real = scored.gather(1, order)
    return order.masked_fill(~real, 0), real


def sft_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    p_mask: torch.Tensor,
    answer_lengths: torch.Tensor,
    real: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """LLaDA's SFT loss from logits (B, K, V) at K positions a row, their ``targets`` (B, K), masking
    probabilities ``p_mask`` (B, K) and ``real`` (B, K) (False: a padding slot of a row with fewer masked
    positions), and the rows' ``answer_lengths`` (B,): 1/B sum_rows sum_k CE / p / |r|."""
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)
    if real is not None:
        ce = ce * real
    weights = 1.0 / (p_mask * answer_lengths[:, None].clamp(min=1).to(p_mask.dtype))
    return (ce * weights).sum() / targets.shape[0]


def block_diffusion_inputs(x_t: torch.Tensor, x_0: torch.Tensor, block_size: int) -> dict[str, torch.Tensor]:
    """One forward's inputs for every block at once: the noisy then the clean sequence (B, 2L), positions
    0..L-1 twice, and the (B, 1, 2L, 2L) boolean mask of `hf_mdm.modeling_blocks.noisy_clean_mask_function` (a
    noisy query sees its own noisy block and the clean blocks before it)."""
    bsz, length = x_0.shape
    positions = torch.arange(length, device=x_0.device).repeat(2).expand(bsz, 2 * length)
    noisy = torch.arange(2 * length, device=x_0.device) < length
    allowed = noisy_clean_mask_function(positions // block_size, noisy)
    index = torch.arange(2 * length, device=x_0.device)
    mask = allowed(torch.arange(bsz, device=x_0.device)[:, None, None, None], 0, index[:, None], index[None, :])
    return {"input_ids": torch.cat([x_t, x_0], 1), "position_ids": positions, "attention_mask": mask}


def block_by_block_loss(model: Any, batch: dict[str, torch.Tensor], block_size: int) -> torch.Tensor:
    """The block-diffusion SFT loss by its definition, one forward per block: block k's masked positions predicted
    from the clean blocks before it followed by its noisy copy, under block-causal attention."""
    x_t, x_0, labels = batch["input_ids"], batch["clean_ids"], batch["labels"]
    total = torch.zeros((), dtype=torch.float32, device=x_0.device)
    for start in range(0, x_0.shape[1], block_size):
        end = min(start + block_size, x_0.shape[1])
        block_labels = labels[:, start:end]
        if not bool((block_labels != -100).any()):
            continue
        ids = torch.cat([x_0[:, :start], x_t[:, start:end]], 1)
        logits = model(input_ids=ids, block_size=block_size).logits[:, start:end]
        scored = block_labels != -100
        total = total + sft_loss(
            logits, block_labels.clamp(min=0), batch["p_mask"][:, start:end], batch["answer_lengths"], scored
        )
    return total
