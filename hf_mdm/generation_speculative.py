"""Exact speculative decoding with the model as its own drafter (``transfer="speculative"``, ``draft_length=k``).

The law sampled is the model's left-to-right factorisation: position i (the i-th generated position of a row, in
column order) drawn from p(x_i | x_<i, the rest masked), what ``strategy="left_to_right"`` with one token a step
samples. A *round* of a row whose first i positions are revealed:

1. draft: d_i, ..., d_{i+m-1}, each drawn from the marginal q_j the sampler already holds for position j (the
   processed distribution at j in the previous round's forward, on the canvas that revealed x_<i-1); m = min(k,
   positions held, positions left in the block - 1), so the first round drafts nothing;
2. verify: ONE forward over the m + 1 canvases that reveal 0..m of the drafts; canvas c reveals x_<i and
   d_i..d_{i+c-1} and gives the target p_{i+c} = p(x_{i+c} | x_<i, d_i..d_{i+c-1}) at its first masked position;
3. accept (Leviathan et al. 2023, Chen et al. 2023): d_j is kept with probability min(1, p_j(d_j) / q_j(d_j)),
   left to right; at the first rejection the token is drawn from max(0, p_j - q_j) renormalised, and when all m
   drafts are kept one more token is drawn from p_{i+m}. So a round reveals (accepted drafts) + 1 positions, and
   each revealed token has exactly the left-to-right law: the output distribution is left-to-right decoding's;
4. hold: the canvas of the accepted prefix also gave the marginals of the k positions after its target: the next
   round's q (they condition on every revealed token but the last).

Temperature, top-k, top-p and the user's logits processors act on p and q alike (`Proposer.distribution`). At
temperature 0 both are one-hot at the argmax, a draft is kept iff it is the argmax, and the tokens are exactly
those of ``strategy="left_to_right"`` with one token a step. Blocks: a round never drafts past the end of the
current block, and rows finished by EOS or a stopping criterion stop as in the default loop (EOS ends a row at once,
the criteria are checked between blocks), so the output equals left-to-right's; ``steps`` and the schedule are not
read. Batches: rows advance by different amounts, and each round forwards only the canvases its rows need.

Reads: a round reads back one small tensor, which fixes its shapes (`_plan_round`): the rows still running in the
block, the most drafts of one of them (the round's width) and the canvases to stack. The rest of the round runs on
fixed shapes, so a call reads one value per round plus a few per block. Every row draws a draft for each of the
round's width slots (those past its own count are drawn from the uniform law and ignored): the law is the same, but
at temperature > 0, when rows draft different counts, a seed may give other tokens than when only each row's own
drafts were drawn.

Costs: ``nfe`` counts the rounds (one forward each), ``forward_rows`` the canvases they ran and ``forward_tokens``
the positions (rows x length). Exported with the model as remote code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .generation_canvas import Canvas, plan_blocks
from .generation_denoiser import KV_CACHES, Rows
from .generation_sampler import Sampler
from .generation_stopping import Trace, finished_rows
from .generation_strategy import canonical_strategy
from .generation_transfer import SpeculativeTransfer, register_transfer

SPECULATIVE = "speculative"


def validate_speculative(config: Any) -> None:
    """ValueErrors naming the field for speculative decoding's combinations (``draft_length``'s own range is checked
    with the other fields' ranges)."""
    if config.transfer != SPECULATIVE:
        if config.draft_length is not None:
            raise ValueError(
                f"draft_length={config.draft_length!r} is read only by transfer='speculative' (exact speculative "
                "decoding): pass transfer='speculative' or drop draft_length"
            )
        return
    if config.draft_length is None:
        raise ValueError(
            "transfer='speculative' needs draft_length >= 1 (tokens drafted per round), e.g. draft_length=4"
        )
    unsupported = (
        ("kv_cache", config.kv_cache in KV_CACHES, "drop kv_cache"),
        ("cfg_scale", bool(config.cfg_scale), "set cfg_scale=0"),
        ("reference", config.reference not in (None, "none"), "drop reference (or use reference without it)"),
    )
    for name, given, fix in unsupported:
        if given:
            raise ValueError(
                f"{name}={getattr(config, name)!r} is not supported with transfer='speculative' (exact speculative "
                f"decoding verifies against the plain model's left-to-right conditionals): {fix}"
            )
    strategy = config.__dict__.get("strategy")  # unset: the class default, which speculative decoding does not read
    if strategy is not None and canonical_strategy(strategy) != "left_to_right":
        raise ValueError(
            f"strategy={strategy!r} does not apply to transfer='speculative', which samples the left-to-right "
            "factorisation: pass strategy='left_to_right' or leave strategy unset"
        )


@register_transfer
class SpeculativeDecoding(SpeculativeTransfer):
    """``transfer="speculative"`` with its loop over the canvas (`speculative_sample`), registered in the place of
    `hf_mdm.generation_transfer.SpeculativeTransfer`: rounds of ``draft_length`` drafts, block by block."""

    def __init__(self, draft_length: int):
        self.draft_length = draft_length

    @classmethod
    def from_config(cls, config: Any) -> "SpeculativeDecoding":
        return cls(config.draft_length)

    def canvas_loop(
        self, sampler: Sampler, canvas: Canvas, trace: Trace, block_length: Optional[int], eos_ids, stopping: Any
    ) -> torch.Tensor:
        """`speculative_sample` on the canvas, in place; the (B,) rows that finished early."""
        return speculative_sample(sampler, canvas, trace, self.draft_length, block_length, eos_ids, stopping)


@dataclass
class Rounds:
    """What the sampler holds between rounds, per row of the canvas (B rows, G = most generated positions)."""

    order: torch.Tensor  # (B, G) columns of each row's generated positions, left to right (then padding columns)
    total: torch.Tensor  # (B,) generated positions of each row
    done: torch.Tensor  # (B,) positions revealed: the next one is order[b, done[b]]
    held: torch.Tensor  # (B,) positions done.. whose draft law is held in q
    q: Optional[torch.Tensor]  # (B, k, V) draft laws of the positions done, done + 1, ... (the first `held` valid)
    rounds: torch.Tensor  # (B,) rounds each row took part in
    accepted: torch.Tensor  # (B,) drafts accepted, summed over rounds

    @classmethod
    def start(cls, gen_mask0: torch.Tensor) -> "Rounds":
        order = torch.argsort((~gen_mask0).to(torch.uint8), dim=1, stable=True)
        zeros = torch.zeros(gen_mask0.shape[0], dtype=torch.long, device=gen_mask0.device)
        return cls(order, gen_mask0.sum(1), zeros, zeros.clone(), None, zeros.clone(), zeros.clone())

    def columns(self, rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Columns of the ``index``-th (clamped to the last) generated position of ``rows``; broadcasts."""
        last = (self.total[rows] - 1).clamp(min=0)
        return self.order[rows].gather(1, torch.minimum(index, last[:, None]))


def speculative_sample(
    sampler: Sampler,
    canvas: Canvas,
    trace: Trace,
    draft_length: int,
    block_length: Optional[int],
    eos_ids: Optional[torch.Tensor],
    stopping_criteria: Any,
) -> torch.Tensor:
    """Decode the canvas left to right by speculative rounds, block by block, in place; returns the (B,) rows that
    finished early and records each row's mean accepted drafts per round in ``trace.accepted_per_round``."""
    state = Rounds.start(canvas.gen_mask0)
    finished = torch.zeros(canvas.x.shape[0], dtype=torch.bool, device=canvas.x.device)
    done_mask = torch.zeros_like(canvas.gen_mask0)
    for block in plan_blocks(canvas, block_length, sampler.denoiser.block_causal):
        done_mask |= block.region
        limit, end = done_mask.sum(1), block.end  # generated positions of each row up to the block's end
        while True:
            active, width, stacked = _plan_round(state, limit, finished, draft_length)
            if active is None:
                break
            _round(sampler, canvas, state, active, draft_length, limit[active] - state.done[active], width, stacked)
            trace.step(canvas.x)
            finished |= finished_rows(canvas.x, canvas.gen_mask0, end, eos_ids, None, canvas.x == sampler.mask_id)
        finished |= finished_rows(
            canvas.x, canvas.gen_mask0, end, eos_ids, stopping_criteria, canvas.x == sampler.mask_id
        )
        if bool(finished.all()):
            break
    trace.accepted_per_round = state.accepted.double() / state.rounds.clamp(min=1)
    return finished


def _num_drafts(held: torch.Tensor, left: torch.Tensor, k: int) -> torch.Tensor:
    """Drafts of a round for rows with ``held`` laws and ``left`` positions before the block's end: min(k, held,
    left - 1)."""
    return torch.minimum(torch.minimum(held, left - 1), torch.full_like(left, k))


def _plan_round(state: Rounds, limit, finished, k: int) -> tuple[Optional[torch.Tensor], int, int]:
    """The round's one read: the rows (A,) still running in the block (None when none is), the most drafts of one
    of them (the round's ``width``) and the canvases the round stacks (the sum of their drafts + 1)."""
    left = limit - state.done
    running = (left > 0) & ~finished
    stacked = torch.where(running, _num_drafts(state.held, left, k) + 1, 0)
    *flags, width, total = torch.cat([running.long(), torch.stack([stacked.max() - 1, stacked.sum()])]).tolist()
    rows = [b for b, flag in enumerate(flags) if flag]
    if not rows:
        return None, 0, 0
    return torch.tensor(rows, dtype=torch.long, device=limit.device), width, total


def _round(sampler: Sampler, canvas: Canvas, state: Rounds, active, k: int, left, width: int, stacked: int) -> None:
    """One round on the rows ``active`` (A,), each with ``left`` (A,) positions before the block's end, ``width``
    the most drafts of one row and ``stacked`` the canvases of all (read with the rows by `_plan_round`)."""
    num_drafts = _num_drafts(state.held[active], left, k)
    drafts = _draft(sampler, state, active, num_drafts, width)
    rows, owner, slot, first = _stack(canvas, state, active, drafts, num_drafts, stacked)
    # verify: each canvas gives the law of its first masked position (its target) and of the k positions after it
    start = state.done[active][owner] + slot
    laws = _laws(sampler, rows, state.columns(active[owner], start[:, None] + torch.arange(k + 1, device=start.device)))
    accepted, token = _accept(sampler, state, active, drafts, num_drafts, laws[:, 0], first)
    _write(canvas, state, active, drafts, accepted, token)
    # hold: the canvas of the accepted prefix gives the laws of the next round's drafts
    if state.q is None:
        state.q = laws.new_zeros((canvas.x.shape[0], k, laws.shape[-1]))
    state.q[active] = laws[first + accepted, 1:]
    state.held[active] = torch.clamp(state.total[active] - state.done[active], max=k)


def _draft(sampler: Sampler, state: Rounds, active, num_drafts: torch.Tensor, width: int) -> torch.Tensor:
    """Drafts (A, width) drawn from the held laws q; entries past a row's own count are drawn from the uniform law
    in their place and never read."""
    if width == 0:
        return torch.zeros((active.numel(), 0), dtype=torch.long, device=num_drafts.device)
    q = state.q[active][:, :width]
    valid = torch.arange(width, device=q.device)[None, :] < num_drafts[:, None]
    laws = torch.where(valid[..., None], q, torch.full_like(q, 1.0 / q.shape[-1]))
    return sampler.proposer.draw(laws.flatten(0, 1)).view(active.numel(), width)


def _stack(
    canvas: Canvas, state: Rounds, active, drafts, num_drafts, stacked: int
) -> tuple[Rows, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The m_a + 1 canvases of each row a (``stacked`` in all), stacked as rows of one batch: canvas c is row
    owner[c] with its first slot[c] drafts revealed; ``first`` (A,) is each row's canvas revealing no draft."""
    counts = num_drafts + 1
    owner = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts, output_size=stacked)
    first = torch.cumsum(counts, 0) - counts
    slot = torch.arange(stacked, device=owner.device) - first[owner]
    x = canvas.x[active][owner]
    index = torch.arange(drafts.shape[1], device=x.device)[None, :]
    cols = state.columns(active[owner], state.done[active][owner][:, None] + index)
    x.scatter_(1, cols, torch.where(index < slot[:, None], drafts[owner], x.gather(1, cols)))
    attn = None if canvas.attn is None else canvas.attn[active][owner]
    return Rows(x, attn, canvas.prompt_mask[active][owner]), owner, slot, first


def _laws(sampler: Sampler, rows: Rows, positions: torch.Tensor) -> torch.Tensor:
    """Sampling laws (N, K, V), float32, at per-row ``positions`` (N, K): one forward, processed by the proposer."""
    logits = sampler.denoiser.logits_at(rows, positions)
    n, k, vocab = logits.shape
    flat = logits.reshape(n * k, vocab).to(torch.float32, copy=True)
    ids, _ = sampler.proposer.grid_inputs(rows.x, positions)
    return sampler.proposer.distribution(flat, ids).view(n, k, vocab)


def _accept(sampler: Sampler, state: Rounds, active, drafts, num_drafts, targets, first) -> tuple[torch.Tensor, ...]:
    """The speculative-sampling rule. ``targets`` (N, V) are the canvases' target laws p. Returns the accepted
    drafts (A,) of each row and the token (A,) drawn after them (from max(0, p - q) at a rejection, else from p)."""
    width = drafts.shape[1]
    index = torch.arange(width, device=drafts.device)[None, :]
    valid = index < num_drafts[:, None]
    canvas = (first[:, None] + index).clamp(max=targets.shape[0] - 1)  # canvas revealing j drafts: p_j
    # no drafts: one zero law, which the residual below reads and leaves unused
    q = state.q[active][:, :width] if width else targets.new_zeros((drafts.shape[0], 1, targets.shape[-1]))
    p_draft = targets[canvas].gather(2, drafts[..., None]).squeeze(2).double()
    q_draft = q[:, :width].gather(2, drafts[..., None]).squeeze(2).double()
    if sampler.proposer.temperature:
        u = torch.rand(q_draft.shape, generator=sampler.proposer.generator, dtype=torch.float64, device=q.device)
    else:
        u = torch.zeros_like(q_draft)  # one-hot laws: kept iff the draft is the argmax
    kept = (u * q_draft < p_draft) & valid
    accepted = kept.long().cumprod(1).sum(1)
    target = targets[first + accepted].double()
    at = accepted.clamp(max=q.shape[1] - 1)[:, None, None].expand(-1, 1, q.shape[-1])
    residual = (target - q.gather(1, at).squeeze(1).double()).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    from_residual = (accepted < num_drafts)[:, None] & (mass > 0)  # a rejection, and mass to renormalise
    target = torch.where(from_residual, residual / mass.clamp(min=1e-300), target)
    return accepted, sampler.proposer.draw(target)


def _write(canvas: Canvas, state: Rounds, active, drafts, accepted, token) -> None:
    """Reveal the accepted drafts and the drawn token of each row; advance the counters."""
    start = state.done[active]
    index = torch.arange(drafts.shape[1], device=drafts.device)[None, :]
    cols = state.columns(active, start[:, None] + index)
    rows = active[:, None].expand_as(cols)
    canvas.x[rows, cols] = torch.where(index < accepted[:, None], drafts, canvas.x[rows, cols])
    canvas.x[active, state.columns(active, (start + accepted)[:, None])[:, 0]] = token
    state.done[active] += accepted + 1
    state.rounds[active] += 1
    state.accepted[active] += accepted
