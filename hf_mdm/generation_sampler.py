"""The sampler of a call and the steps of a block: how many positions a step reveals, which, and the tokens written.

- `Sampler`: the pieces of one call's sampler: the model call (`hf_mdm.generation_denoiser.Denoiser`), the
  proposals (`Proposer`), the strategy and the transfer rule, the schedule, the draws and the records;
- `denoise_block`: the steps of one block, in place: a step asks the `Denoiser` for logits at the block's
  still-masked positions (`still_masked_positions`), proposes tokens (`Proposer`), and reveals as many positions
  per row as the transfer rule says, chosen by the strategy; revealed tokens stay. A transfer with its own block
  loop (`hf_mdm.generation_editing`) and the remasking samplers (`hf_mdm.generation_remask`) run their own steps
  in its place;
- writing the tokens a step reveals: `reveal_rows` at chosen positions, whatever their number per row (the model
  runs only on rows with one, the host reads the choice); `reveal_top` at each row's ``counts`` best-scored
  candidates with the largest count known on the host (fixed shapes, nothing read back: the positional strategies
  under fixed counts); `reveal_where` at given positions, left to right (the paper's sampler and ReMDM).

The loop over the blocks of the canvas is `hf_mdm.generation_canvas.sample_blocks`; the model is reached only
through the `Denoiser`. Exported with the model as remote code.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Optional

import torch

from .generation_denoiser import Denoiser, Rows
from .generation_processors import ScoreRecorder
from .generation_random import only_rows, select_rows
from .generation_stopping import stops_inside_block
from .generation_strategy import Proposals, Proposer, Strategy, choose, get_strategy
from .generation_transfer import Transfer, reveal_steps


@dataclass
class Sampler:
    """The pieces of one call's default sampler: the model call, the proposals, and the transfer and strategy."""

    denoiser: Denoiser
    proposer: Proposer
    strategy: Strategy
    transfer: Transfer
    schedule: Any
    generator: Optional[torch.Generator] = None
    recorder: Optional[ScoreRecorder] = None  # output_scores / output_logits
    early_stop_eos: Optional[torch.Tensor] = None  # (E,) EOS ids a row stops at inside a block (eos_early_stop)
    # a step asks logits only at each row's still-masked positions (`still_masked_positions`); False: at every
    # column of the block, as before that was known (kept for `evaluation/bench_lm_head.py`'s comparison)
    gather_still_masked: ClassVar[bool] = True

    def record(self, rows: Rows, index: Optional[torch.Tensor], cols, proposals: Proposals, written=None) -> None:
        """Keep the scores and logits of the tokens written at (``index``, ``cols``) of ``rows`` (broadcast to one
        shape; ``index`` None: every row, against (B, K) ``cols``), only where ``written`` is True when it is given
        (`ScoreRecorder.record`). Nothing runs unless the call records."""
        if self.recorder is None:
            return
        if index is None:
            index = torch.arange(rows.x.shape[0], device=rows.x.device)[:, None]
        self.recorder.record(rows.canvas_rows(index), cols, written, scores=proposals.scores, logits=proposals.logits)

    @contextlib.contextmanager
    def drawing_for(
        self, index: Optional[torch.Tensor] = None, drawing: Optional[torch.Tensor] = None
    ) -> Iterator[None]:
        """For the duration, the draws of the rows ``index`` only (with one generator per row, theirs), or of the
        rows where ``drawing`` (B,) is True (the others draw nothing)."""
        saved = self.generator
        draws = only_rows(saved, drawing) if index is None else select_rows(saved, index)
        self.generator = self.proposer.generator = draws
        try:
            yield
        finally:
            self.generator = self.proposer.generator = saved

    @property
    def mask_id(self) -> int:
        return self.denoiser.mask_id

    @property
    def needs_distributions(self) -> bool:
        """Whether a step needs the whole proposal distributions (margin, entropy, the entropy bound)."""
        return self.strategy.needs_distributions or self.transfer.needs_distributions


# denoise(sampler, rows, region, num_steps, on_step): the steps of one block, in place on rows.x (`denoise_block`)
BlockDenoiser = Callable[[Sampler, Rows, torch.Tensor, int, Callable[[], None]], None]


def denoise_block(
    sampler: Sampler, rows: Rows, region: torch.Tensor, num_steps: int, on_step: Callable[[], None]
) -> None:
    """Denoise the masked positions of ``region`` (B, L) in ``num_steps`` steps, in place on ``rows.x``, with the loop
    of the sampler's mode (`block_mode`, `BLOCK_LOOPS`). A step asks the model for logits at each row's still-masked
    positions, as many as the most any row still has, a number the host knows (`still_masked_positions`): a fixed
    rule's counts are decided at the block's start, so every step's number is too and no step reads anything back
    from the device (`_denoise_block_by_table`); an adaptive rule's come from each step's proposals, so a step reads
    one value, the most positions a row still has masked (the block is done at 0) (`_denoise_block_adaptively`). A
    transfer with neither (a `count_rule` of its own) runs step by step, each step reading the columns still masked.
    With ``eos_early_stop``, a row that stops leaves the block's region, and a fixed rule's step reads whether any
    row still runs."""
    BLOCK_LOOPS[block_mode(sampler)](sampler, rows, region, num_steps, on_step)


def block_mode(sampler: Sampler) -> str:
    """The mode of a block's steps: ``"independent"`` (the paper's sampler: stochastic counts of random positions,
    each position's step drawn up front), ``"adaptive"`` (an adaptive transfer: the counts come from each step's
    proposals), else ``"counted"`` (a fixed rule: its counts decided at the block's start, or step by step)."""
    if sampler.transfer.name == "stochastic" and sampler.strategy.name == "random":
        return "independent"
    return "adaptive" if sampler.transfer.adaptive else "counted"


def block_loop(sampler: Sampler) -> BlockDenoiser:
    """The loop of a block: a transfer's own (``block_denoiser``: LLaDA2.1's editing), else `denoise_block`."""
    return sampler.transfer.block_denoiser or denoise_block


def _denoise_block_counted(
    sampler: Sampler, rows: Rows, region: torch.Tensor, num_steps: int, on_step: Callable[[], None]
) -> None:
    """A fixed rule's steps: by its table of counts where it has one (`_denoise_block_by_table`), else step by step."""
    m0 = ((rows.x == sampler.mask_id) & region).sum(1)
    region = region.clone()  # rows that stop inside the block (eos_early_stop) leave it
    table = sampler.transfer.count_table(sampler.schedule, num_steps, m0, sampler.generator)
    if table is not None:
        return _denoise_block_by_table(sampler, rows, region, table, on_step)
    counts_at = sampler.transfer.count_rule(sampler.schedule, num_steps, m0, sampler.generator)
    for i in range(num_steps):
        block_mask = (rows.x == sampler.mask_id) & region
        keep = block_mask.any(0).nonzero().flatten()
        if keep.numel() == 0:
            break
        counts = counts_at(i, block_mask)
        if counts is not None and int(counts.max()) == 0:
            continue  # nothing to reveal: skipping the forward changes no token
        _step(sampler, rows, block_mask, keep, counts, num_steps - i)
        on_step()
        _stop_rows(sampler, rows, region, block_mask)


def _stop_rows(sampler: Sampler, rows: Rows, region: torch.Tensor, block_mask: torch.Tensor) -> bool:
    """With ``eos_early_stop``, take the rows that stop at this step out of ``region`` (in place, on the device);
    returns whether that can happen."""
    if sampler.early_stop_eos is None:
        return False
    region &= ~stops_inside_block(rows, block_mask, sampler.early_stop_eos, sampler.mask_id)[:, None]
    return True


def _denoise_block_by_table(
    sampler: Sampler, rows: Rows, region: torch.Tensor, table: torch.Tensor, on_step: Callable[[], None]
) -> None:
    """The steps of a block whose counts ``table`` (B, S) are decided at its start, with no host read inside the
    block: two reads at its start, the block's columns and, for each step, its largest count (a step that reveals
    nothing skips its forward, the others take that many top scores) and the most positions a row still has masked
    before it (the logits, and at temperature > 0 the draws, are asked at each row's still-masked positions, that
    many a row, fixed by the table: `still_masked_positions`). The stochastic counts are drawn at the block's
    start: the same law as drawing them step by step, with another random stream. The tokens and forwards are those
    of the step-by-step loop, but for scores tied within a rounding error: the LM head's matrix product may round a
    column's logits differently when it computes another number of columns, so such a tie may break the other
    way. With ``eos_early_stop`` a step also reads whether
    a row still runs (the block ends when none does)."""
    block_mask = (rows.x == sampler.mask_id) & region
    keep = block_mask.any(0).nonzero().flatten()
    num_steps = table.shape[1]
    still = block_mask.sum(1)[:, None] - (table.cumsum(1) - table)  # (B, S) each row's masked before each step
    for i, (most, width) in enumerate(torch.stack([table.amax(0), still.amax(0)], 1).tolist()):
        if most == 0:
            continue  # nothing to reveal: skipping the forward changes no token
        _step(sampler, rows, block_mask, keep, table[:, i], num_steps - i, most, width)
        on_step()
        if _stop_rows(sampler, rows, region, block_mask) and not bool(region.any()):
            break
        block_mask = (rows.x == sampler.mask_id) & region


def _denoise_block_adaptively(
    sampler: Sampler, rows: Rows, region: torch.Tensor, num_steps: int, on_step: Callable[[], None]
) -> None:
    """The steps of a block under an adaptive rule: the block's columns read once at its start, then one read per
    step, after it: the most positions a row still has to reveal (the block is done at 0), which is also how many
    positions a row the next step asks logits at."""
    region = region.clone()  # rows that stop inside the block (eos_early_stop) leave it
    m0 = ((rows.x == sampler.mask_id) & region).sum(1)
    sampler.transfer.count_rule(sampler.schedule, num_steps, m0, sampler.generator)  # sets up the block (LLaDA2)
    block_mask = (rows.x == sampler.mask_id) & region
    keep = block_mask.any(0).nonzero().flatten()
    if keep.numel() == 0:
        return
    width = int(block_mask.sum(1).max())
    for i in range(num_steps):
        _step(sampler, rows, block_mask, keep, None, num_steps - i, keep.numel(), width)
        on_step()
        _stop_rows(sampler, rows, region, block_mask)
        block_mask = (rows.x == sampler.mask_id) & region
        width = int(block_mask.sum(1).max())  # the step's one read: whether the block is done, and its width
        if width == 0:
            break


def _denoise_block_independently(sampler: Sampler, rows: Rows, region, num_steps: int, on_step) -> None:
    """The paper's sampler: every masked position revealed independently with probability
    (alpha(s) - alpha(t)) / (1 - alpha(t)) at each step (the law of a Binomial count of uniformly random
    positions). Each position's step is drawn up front, with the table (B, S) of each row's reveals per step: one
    read at the block's start (the largest count of each step); a step then writes its positions left to right
    with fixed shapes (`reveal_where`)."""
    x = rows.x
    step_of = reveal_steps(sampler.schedule, num_steps, x.shape, sampler.generator, x.device)
    step_of.masked_fill_(~((x == sampler.mask_id) & region), -1)
    table = torch.zeros((x.shape[0], num_steps + 1), dtype=torch.long, device=x.device)
    table.scatter_add_(1, step_of + 1, torch.ones_like(step_of))  # column 0 counts the positions never revealed
    for i, most in enumerate(table[:, 1:].amax(0).tolist()):
        if most:
            reveal_where(sampler, rows, step_of == i, table[:, i + 1], most)
            on_step()


#: The loop of each block mode (`block_mode`).
BLOCK_LOOPS: dict[str, BlockDenoiser] = {
    "independent": _denoise_block_independently,
    "counted": _denoise_block_counted,
    "adaptive": _denoise_block_adaptively,
}


def _step(
    sampler: Sampler,
    rows: Rows,
    block_mask,
    keep,
    counts: Optional[torch.Tensor],
    steps_left: int,
    most: Optional[int] = None,
    width: Optional[int] = None,
) -> None:
    """One denoising step on ``rows``, in place. ``block_mask`` (B, L) marks the block's masked positions, ``keep``
    (K,) columns that hold every one of them, ``counts`` (B,) the tokens each row reveals (None for the adaptive
    transfers, which decide from the proposals), ``most`` their largest when the host knows it (else it is read:
    the step-by-step loop of a transfer with its own `count_rule`), ``width`` the most positions a row still has
    masked when the host knows it: the model is then asked for logits, and proposals drawn, only at each row's
    still-masked positions (`still_masked_positions`). A row whose count is 0 draws nothing (alone it skips the
    step)."""
    with sampler.drawing_for(drawing=None if counts is None else counts > 0):
        _reveal_step(sampler, rows, block_mask, keep, counts, steps_left, most, width)


def _reveal_step(sampler: Sampler, rows: Rows, block_mask, keep, counts, steps_left: int, most, width) -> None:
    remaining = block_mask.sum(1)
    if counts is not None and sampler.strategy.positional:
        # positions first, then logits only at their columns and proposals only where they are revealed
        scores = sampler.strategy.positional_scores(rows.x.shape, sampler.generator, rows.x.device)
        counts = torch.minimum(counts, remaining)
        if most is not None:
            return reveal_top(sampler, rows, scores, block_mask, counts, most)  # fixed shapes
        return reveal_rows(sampler, rows, choose(scores, block_mask, counts, most))
    block = sampler.denoiser.fixed_columns(rows.x.shape[1])  # static shapes: the block's columns, one shape
    if block is not None:
        keep = torch.arange(*block, device=keep.device)
    gather = sampler.gather_still_masked and block is None
    positions = still_masked_positions(block_mask, keep, width if gather else None)
    masked = block_mask.gather(1, positions)
    proposals = propose_at(sampler, rows, positions, masked)
    scores = sampler.strategy.scores(proposals, positions, rows.x.shape[1], sampler.generator)
    if counts is None:
        counts = sampler.transfer.adaptive_counts(
            proposals.confidence, proposals.probs, scores.gather(1, positions), masked, steps_left
        )
    counts = torch.minimum(counts, remaining)  # a step reveals exactly counts
    chosen = choose(scores, block_mask, counts, most).gather(1, positions)  # only proposed positions can be chosen
    rows.x.scatter_(1, positions, torch.where(chosen, proposals.tokens, rows.x.gather(1, positions)))
    sampler.record(rows, None, positions, proposals, chosen)


def still_masked_positions(block_mask: torch.Tensor, keep: torch.Tensor, width: Optional[int]) -> torch.Tensor:
    """(B, W) the columns a step proposes at: each row's ``width`` first still-masked columns of ``keep`` (K,),
    left to right, a row with fewer filling its last slots with other columns of ``keep`` (never chosen: not
    masked); every column of ``keep`` when ``width`` is unknown or not smaller. Always (B, W), so that a compiled
    forward sees one kind of positions. Fixed shapes, nothing read."""
    bsz, k = block_mask.shape[0], keep.numel()
    if width is None or width >= k:
        return keep.expand(bsz, -1)
    masked_first = block_mask.index_select(1, keep).sort(dim=1, descending=True, stable=True).indices
    return keep.take(masked_first[:, : max(int(width), 1)])


def propose_at(sampler: Sampler, rows: Rows, positions: torch.Tensor, drawing: torch.Tensor) -> Proposals:
    """Proposals (B, K) at the columns ``positions`` (K,) of every row, or at per-row columns (B, K) (distributions
    (B, K, V) when the strategy needs them); with one generator per row a row draws only where ``drawing`` (B, K)
    is True (where it draws alone: `hf_mdm.generation_random.multinomial`)."""
    bsz = rows.x.shape[0]
    denoiser = sampler.denoiser
    logits = denoiser.logits(rows, positions) if positions.dim() == 1 else denoiser.logits_at(rows, positions)
    k, vocab = logits.shape[1], logits.shape[2]
    grid = positions if positions.dim() == 2 else positions.expand(bsz, -1)
    ids, drawn = sampler.proposer.grid_inputs(rows.x, grid, drawing)
    flat = sampler.proposer(logits.reshape(bsz * k, vocab), ids, sampler.needs_distributions, drawn)
    return Proposals(*(None if v is None else v.view(bsz, k, *v.shape[1:]) for v in flat))


def reveal_rows(sampler: Sampler, rows: Rows, chosen: torch.Tensor, confidence: Optional[torch.Tensor] = None) -> None:
    """Propose and write tokens at the ``chosen`` (B, L) positions, running the model only on rows with one;
    ``confidence`` (B, L), when given, receives the probability of each written token (`Proposer`'s)."""
    active = chosen.any(1)
    if bool(active.all()) or not sampler.denoiser.row_subsets:
        return _reveal_chosen(sampler, rows, chosen, confidence)
    sub = active.nonzero().flatten()  # rows never see each other: the others need no forward
    subset = rows.select(sub)
    sub_confidence = None if confidence is None else confidence[sub]
    with sampler.drawing_for(sub):
        _reveal_chosen(sampler, subset, chosen[sub], sub_confidence)
    rows.x[sub] = subset.x
    if confidence is not None:
        confidence[sub] = sub_confidence


def _reveal_chosen(sampler: Sampler, rows: Rows, chosen: torch.Tensor, confidence: Optional[torch.Tensor]) -> None:
    x = rows.x
    if sampler.denoiser.per_row_logits:
        flat_rows, cols = chosen.nonzero(as_tuple=True)  # row-major
        per_row = chosen.sum(1)
        first = per_row.cumsum(0) - per_row
        slot = torch.arange(flat_rows.numel(), device=x.device) - first[flat_rows]
        positions = cols.new_zeros((x.shape[0], int(per_row.max())))  # unused slots ask for position 0
        positions[flat_rows, slot] = cols
        logits = sampler.denoiser.logits(rows, positions)[flat_rows, slot]
    else:
        keep = chosen.any(0).nonzero().flatten()
        flat_rows, k = chosen[:, keep].nonzero(as_tuple=True)
        cols = keep[k]
        logits = sampler.denoiser.logits(rows, keep)[flat_rows, k]
    proposals = sampler.proposer(logits, sampler.proposer.processor_ids(x, flat_rows, cols), drawn=(flat_rows, None))
    x[flat_rows, cols] = proposals.tokens
    sampler.record(rows, flat_rows, cols, proposals)
    if confidence is not None:
        confidence[flat_rows, cols] = proposals.confidence.to(confidence.dtype)


def reveal_top(
    sampler: Sampler,
    rows: Rows,
    scores: torch.Tensor,
    candidates: torch.Tensor,
    counts: torch.Tensor,
    kmax: int,
    confidence: Optional[torch.Tensor] = None,
) -> None:
    """Propose and write tokens at the ``counts`` (B,) best-``scores`` (B, L) ``candidates`` of each row (the
    positions `hf_mdm.generation_strategy.choose` takes), ``kmax`` the largest count: logits at every row's
    ``kmax`` best positions (B, kmax), each row writing its first ``counts`` of them (``confidence`` as
    `reveal_rows`'). Every row runs, whether it reveals anything or not, and nothing is read back. Under static
    shapes every step asks the block's width of positions a row (``kmax`` at least; one shape a block)."""
    x, bsz = rows.x, rows.x.shape[0]
    block = sampler.denoiser.fixed_columns(x.shape[1])
    kmax = kmax if block is None else max(kmax, block[1] - block[0])
    positions = torch.topk(scores.masked_fill(~candidates, -float("inf")), kmax, dim=-1).indices
    take = (torch.arange(kmax, device=x.device)[None, :] < counts[:, None]) & candidates.gather(1, positions)
    logits = _logits_at(sampler, rows, positions.masked_fill(~take, 0))  # unused slots: position 0, in any span
    ids, drawn = sampler.proposer.grid_inputs(x, positions, take)
    flat = sampler.proposer(logits.flatten(0, 1), ids, drawn=drawn)
    proposals = type(flat)(*(None if v is None else v.view(bsz, kmax, *v.shape[1:]) for v in flat))
    x.scatter_(1, positions, torch.where(take, proposals.tokens, x.gather(1, positions)))
    sampler.record(rows, None, positions, proposals, take)
    if confidence is not None:
        written = proposals.confidence.to(confidence.dtype)
        confidence.scatter_(1, positions, torch.where(take, written, confidence.gather(1, positions)))


def _logits_at(sampler: Sampler, rows: Rows, positions: torch.Tensor) -> torch.Tensor:
    """Logits (B, K, V) at per-row ``positions`` (B, K): asked so of a model that takes per-row positions
    (``Denoiser.per_row_logits``), else taken from the logits at every column (fixed shapes either way)."""
    if sampler.denoiser.per_row_logits:
        return sampler.denoiser.logits(rows, positions)
    logits = sampler.denoiser.logits(rows, torch.arange(rows.x.shape[1], device=positions.device))
    return logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))


def reveal_where(
    sampler: Sampler,
    rows: Rows,
    chosen: torch.Tensor,
    counts: torch.Tensor,
    kmax: int,
    confidence: Optional[torch.Tensor] = None,
) -> None:
    """Propose and write tokens at the ``chosen`` (B, L) positions, ``counts`` (B,) of them per row and ``kmax``
    at most, left to right, with fixed shapes (`reveal_top`)."""
    left_to_right = get_strategy("left_to_right").positional_scores(rows.x.shape, None, rows.x.device)
    reveal_top(sampler, rows, left_to_right, chosen, counts, kmax, confidence)
