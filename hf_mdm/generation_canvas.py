"""The canvas of a call, from its inputs to the output, and the loop over its blocks.

0. `check_inputs`: the one gate of a call's inputs, before anything is built or run; each mistake is a ValueError
   that says what to change: the prompt (2-D integer ids: `check_prompt`), its attention mask (same shape, no
   all-zero row: `check_attention_mask`), something to generate (`check_something_to_generate`), the canvas within
   the model's positions (`position_limit`, `new_tokens`), the ids against the vocabulary (`check_token_ids`), and the
   reference samplers' settings (`hf_mdm.generation_reference`). A uniform-corruption model (DiffusionGemma) has no
   [MASK]: only the reference settings are checked, its own sampler takes its inputs as transformers does;
1. `prepare_canvas`: the prompt followed by ``max_new_tokens`` [MASK] tokens (`new_tokens`: else what ``max_length``
   leaves after the prompt). Masks already inside the prompt are generated too (infilling); padding (2-D
   ``attention_mask``, left or right) is never attended to nor generated;
2. ``whole_blocks`` grows each row to the end of its last attention block (`fill_last_blocks`, `whole_block_length`):
   the columns past the output's ``width`` are the block tail (``hide_block_tail`` hides it from attention:
   `hf_mdm.generation_denoiser`);
3. `sample_blocks`: the generation region (from the first masked column to the end) is cut into blocks of
   ``block_length`` columns, denoised left to right (`plan_blocks`; for a block-causal model the blocks are its
   attention blocks, counted in positions from each row's first token); ``steps`` are split over the blocks in
   proportion to their masked counts (`hf_mdm.generation_transfer.split_steps`); a block's steps are the
   sampler's (`hf_mdm.generation_sampler.denoise_block`, or a transfer's or ReMDM's own). Between blocks, rows that
   finished skip the rest (`hf_mdm.generation_stopping`);
4. `finish_canvas`: the canvas cut back to its ``width``, masks left in rows that finished early and tokens after
   the first generated EOS made padding.

The loop mutates the `Canvas` and records into a `hf_mdm.generation_stopping.Trace`; the model is reached only
through the sampler's `Denoiser`. Exported with the model as remote code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .families import attention_block_size
from .generation_denoiser import Rows
from .generation_reference import reject_inert_reference_args, reject_reference_inputs
from .generation_sampler import BlockDenoiser, Sampler, block_loop
from .generation_stopping import Trace, finalize_eos, finished_rows, missing_positions

__all__ = [
    "check_inputs",
    "check_token_ids",
    "new_tokens",
    "position_limit",
    "Canvas",
    "prepare_canvas",
    "fill_last_blocks",
    "whole_block_length",
    "Block",
    "plan_blocks",
    "block_spans",
    "sample_blocks",
    "finish_canvas",
]


@dataclass
class Canvas:
    """The canvas of one call: ids ``x`` (B, L) (prompt, then masks; written in place as tokens are revealed),
    ``attn`` (B, L) or None when nothing is padded, ``gen_mask0`` (B, L) the positions to generate, ``width`` the
    columns of the output (None: every column; ``whole_blocks`` may run the canvas further)."""

    x: torch.Tensor
    attn: Optional[torch.Tensor]
    gen_mask0: torch.Tensor
    width: Optional[int] = None

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

    def output(self) -> "Canvas":
        """The canvas cut back to its ``width`` (whole blocks: the block tail goes); itself when it has no more."""
        if self.width is None or self.x.shape[1] == self.width:
            return self
        attn = None if self.attn is None else self.attn[:, : self.width]
        attn = None if attn is not None and bool(attn.all()) else attn
        return Canvas(self.x[:, : self.width], attn, self.gen_mask0[:, : self.width], self.width)


def check_inputs(
    model: Any,
    config: Any,
    call_kwargs: dict[str, Any],
    input_ids: Any,
    attention_mask: Optional[torch.Tensor],
    logits_processor: Any,
    stopping_criteria: Any,
    uniform: bool,
) -> None:
    """Every check of a call's inputs (the module docstring), in one place; ``call_kwargs`` the settings the call
    named, ``uniform`` whether the model's noise is uniform random tokens."""
    reject_inert_reference_args(config, call_kwargs)
    if uniform:
        return
    check_prompt(input_ids)
    bsz, prompt_len = input_ids.shape
    length, positions = new_tokens(config, input_ids), position_limit(model)
    if length < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {length}")
    if positions is not None and prompt_len + length > positions:
        raise ValueError(
            f"prompt ({prompt_len}) + max_new_tokens ({length}) = {prompt_len + length} "
            f"exceeds the model's max_position_embeddings={positions}: shorten one of them"
        )
    if attention_mask is not None:
        check_attention_mask(attention_mask, bsz, prompt_len)
    check_something_to_generate(config, input_ids, attention_mask, length)
    check_token_ids(model, config.mask_token_id, input_ids, config.eos_token_id)
    reject_reference_inputs(config, logits_processor, stopping_criteria)


def check_prompt(input_ids: Any) -> None:
    """ValueErrors for a prompt that is not a 2-D tensor of integer token ids."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a 2-D LongTensor (batch, prompt_length), got {shape}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise ValueError(
            f"input_ids must hold integer token ids (torch.long), got {input_ids.dtype}: pass the "
            "tokenizer's ids or input_ids.long()"
        )


def new_tokens(config: Any, input_ids: torch.Tensor) -> int:
    """Masks appended: ``max_new_tokens``, else what ``max_length`` leaves after the prompt, else 0."""
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    prompt_len = input_ids.shape[1] if input_ids is not None and input_ids.dim() == 2 else 0
    if config.max_length is not None and config.max_length > prompt_len:
        return config.max_length - prompt_len
    return 0


def position_limit(model: Any) -> Optional[int]:
    """The longest canvas the model takes (``max_position_embeddings`` or ``max_sequence_length``), or None."""
    model_config = getattr(model, "config", None)
    return getattr(model_config, "max_position_embeddings", None) or getattr(model_config, "max_sequence_length", None)


def check_attention_mask(attention_mask: torch.Tensor, bsz: int, prompt_len: int) -> None:
    """ValueErrors for an attention mask of another shape than the prompt's, or with an all-zero row."""
    if tuple(attention_mask.shape) != (bsz, prompt_len):
        raise ValueError(
            f"attention_mask must be 2-D (batch, prompt_length) = {(bsz, prompt_len)} like input_ids, "
            f"got {tuple(attention_mask.shape)}"
        )
    attention_mask = attention_mask.bool()
    empty = (~attention_mask.any(1)).nonzero().flatten() if prompt_len else attention_mask.new_zeros(0)
    if empty.numel():
        raise ValueError(
            f"attention_mask is all zeros in row(s) {empty.tolist()}: every row needs at least one prompt token "
            "(1 = token, 0 = padding); drop those rows, or pass an empty prompt (prompt_length 0) to sample "
            "unconditionally"
        )


def check_something_to_generate(
    config: Any, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], length: int
) -> None:
    """A ValueError when no length is set (``length``, `new_tokens`, is 0) and the prompt holds no [MASK] (outside
    its padding) to infill; the prompt is read only then."""
    if config.max_new_tokens is not None or length > 0:
        return
    infill = input_ids == config.mask_token_id
    if attention_mask is not None:
        infill &= attention_mask.to(input_ids.device).bool()
    if not bool(infill.any()):
        raise ValueError(
            f"nothing to generate: input_ids hold no [MASK] (id {config.mask_token_id}) and no length is set "
            f"(max_new_tokens is unset in the call, the generation config and the model's generation config"
            + (f"; max_length={config.max_length} leaves no room after the prompt" if config.max_length else "")
            + "): pass max_new_tokens=..., or set model.generation_config.max_new_tokens"
        )


def check_token_ids(
    model: Any, mask_token_id: int, input_ids: Optional[torch.Tensor] = None, eos_token_id: Any = None
) -> None:
    """ValueErrors for a [MASK] id, EOS ids or prompt ids outside the model's vocabulary (which would otherwise fail
    inside the embedding, or never match a generated token); nothing when the model does not say its vocabulary
    size."""
    vocab_size = vocab_size_of(model)
    if vocab_size is None:
        return
    if not 0 <= mask_token_id < vocab_size:
        raise ValueError(
            f"mask_token_id={mask_token_id} is outside the model's vocabulary (vocab_size={vocab_size}): pass the "
            "[MASK] id of this model (its config's or tokenizer's mask_token_id)"
        )
    eos_ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    outside = [int(i) for i in eos_ids if not 0 <= int(i) < vocab_size]
    if outside:
        raise ValueError(
            f"eos_token_id {outside} is outside the model's vocabulary (vocab_size={vocab_size}), so generation "
            "would never stop at it: pass this model's EOS id (its tokenizer's eos_token_id), or eos_token_id=None"
        )
    if input_ids is not None and input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size):
        raise ValueError(
            f"input_ids hold ids outside the model's vocabulary [0, {vocab_size}): min {int(input_ids.min())}, max "
            f"{int(input_ids.max())}: encode the prompt with this model's tokenizer"
        )


def vocab_size_of(model: Any) -> Optional[int]:
    """Rows of the input embedding (else ``config.vocab_size``), or None when the model says neither."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    return int(rows) if rows is not None else getattr(getattr(model, "config", None), "vocab_size", None)


def prepare_canvas(
    input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], max_new_tokens: int, mask_id: int
) -> Canvas:
    """The prompt followed by ``max_new_tokens`` masks; the attention mask extended (None when nothing is padded).
    Prompt ids of any integer dtype are taken as ``torch.long`` (the canvas' dtype). The inputs were checked by
    `check_inputs`."""
    input_ids = input_ids.long()  # int32 / int16 / uint8 ids: the same tokens
    bsz = input_ids.shape[0]
    if attention_mask is not None:
        attention_mask = attention_mask.to(input_ids.device).bool()
    x = torch.cat([input_ids, input_ids.new_full((bsz, max_new_tokens), mask_id)], dim=1)
    attn = None
    if attention_mask is not None and not bool(attention_mask.all()):
        attn = torch.cat([attention_mask, attention_mask.new_ones((bsz, max_new_tokens))], dim=1)
    gen_mask = x == mask_id
    if attn is not None:
        gen_mask &= attn
    return Canvas(x, attn, gen_mask, x.shape[1])


def whole_block_length(model: Any, config: Any) -> int:
    """The attention block ``whole_blocks`` fills rows to: ``block_length``, else the model's own; a ValueError for a
    model that is not block-causal."""
    block = config.block_length if config.block_length is not None else attention_block_size(model)
    if block is None or attention_block_size(model) is None:
        raise ValueError(
            "whole_blocks=True needs a block-causal model (config.block_size set, e.g. LLaDA2) and its block_length"
        )
    return int(block)


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
    return Canvas(x, attn if not bool(attn.all()) else None, gen_mask0, canvas.width)


@dataclass
class Block:
    """One block of the reverse process: ``region`` (B, L) its positions to generate, ``start``/``end`` the columns
    it spans in any row (rows padded on the left differently may place an aligned block at other columns)."""

    start: int
    end: int
    region: torch.Tensor


def block_spans(gen_mask: torch.Tensor, block_length: Optional[int]) -> list[tuple[int, int]]:
    """(start, end) columns of the blocks, from the first masked column to the end."""
    columns = gen_mask.any(0).nonzero().flatten()
    if columns.numel() == 0:
        return []
    start, end = int(columns[0]), gen_mask.shape[1]
    size = end - start if block_length is None else block_length
    return [(b, min(b + size, end)) for b in range(start, end, size)]


def plan_blocks(canvas: Canvas, block_length: Optional[int], aligned: bool = False) -> list[Block]:
    """The blocks of a call. Unaligned: ``block_length`` columns each from the first masked column (`block_spans`).
    Aligned (block-causal models): the attention blocks, ``block_length`` positions each counted from each row's
    position 0 (`Canvas.positions`), so a prompt may end inside a block, as LLaDA2's and BD3-LM's generate."""
    gen_mask0 = canvas.gen_mask0
    if not aligned or block_length is None:
        blocks = []
        for start, end in block_spans(gen_mask0, block_length):
            region = torch.zeros_like(gen_mask0)
            region[:, start:end] = gen_mask0[:, start:end]
            blocks.append(Block(start, end, region))
        return blocks
    block_of = canvas.positions() // block_length
    real = canvas.attn if canvas.attn is not None else torch.ones_like(gen_mask0)
    blocks = []
    for k in torch.unique(block_of[gen_mask0]).tolist():
        columns = ((block_of == k) & real).any(0).nonzero().flatten()
        blocks.append(Block(int(columns[0]), int(columns[-1]) + 1, gen_mask0 & (block_of == k)))
    return blocks


def sample_blocks(
    sampler: Sampler,
    canvas: Canvas,
    trace: Trace,
    steps: Optional[int],
    block_length: Optional[int],
    eos_ids: Optional[torch.Tensor],
    stopping_criteria: Any,
    denoise: Optional[BlockDenoiser] = None,
) -> torch.Tensor:
    """Denoise the canvas block by block, in place, each block with ``denoise`` (default `denoise_block`); returns
    the (B,) rows that finished early. Blocks are aligned to the model's attention blocks when it has them."""
    gen_mask0 = canvas.gen_mask0
    blocks = plan_blocks(canvas, block_length, sampler.denoiser.block_causal)
    masked = torch.stack([block.region.sum(1).max() for block in blocks]).tolist() if blocks else []
    steps_per_block = sampler.transfer.block_steps(steps, masked)
    denoise = denoise or block_loop(sampler)
    finished = torch.zeros(canvas.x.shape[0], dtype=torch.bool, device=canvas.x.device)
    for block, num_steps in zip(blocks, steps_per_block):
        if num_steps == 0:
            continue
        active = (~finished).nonzero().flatten()  # the one read of the loop per block
        if active.numel() == 0:
            break
        _denoise_active_rows(sampler, canvas, active, block, num_steps, trace, denoise)
        x = canvas.x
        finished |= finished_rows(x, gen_mask0, block.end, eos_ids, stopping_criteria, x == sampler.mask_id)
    return finished


def _denoise_active_rows(
    sampler: Sampler,
    canvas: Canvas,
    active: torch.Tensor,
    block: Block,
    num_steps: int,
    trace: Trace,
    denoise: BlockDenoiser,
) -> None:
    """Denoise one block on the rows ``active`` (the others finished): the model sees only those rows, or under
    static shapes every row (`hf_mdm.generation_denoiser.Denoiser.fixed_rows`: one batch shape for every forward),
    the finished rows' results dropped."""
    all_rows = active.numel() == canvas.x.shape[0]
    fixed_rows = sampler.denoiser.fixed_rows and not all_rows
    run = torch.arange(canvas.x.shape[0], device=active.device) if fixed_rows else active
    rows = canvas.rows() if all_rows else canvas.rows().select(run)
    sampler.denoiser.begin_block(block.start, block.end)
    region = block.region if all_rows else block.region[run]

    final_before = block.start if sampler.transfer.edits else None  # an editing block is final once done

    def write_back() -> None:
        canvas.x[active] = rows.x[active] if fixed_rows else rows.x

    def on_step() -> None:
        if not all_rows and trace.needs_canvas:
            write_back()
        trace.step(canvas.x, final_before)

    with sampler.drawing_for(run):
        denoise(sampler, rows, region, num_steps, on_step)
    if not all_rows:
        write_back()
    trace.stream.update(canvas.x)


def finish_canvas(
    canvas: Canvas, finished: torch.Tensor, eos_ids: Optional[torch.Tensor], pad_id: int, mask_id: int
) -> tuple[Canvas, torch.Tensor, torch.Tensor]:
    """The canvas at the end of the reverse process: cut back to its ``width`` (`Canvas.output`), the positions it
    lacks noted (`missing_positions`: still [MASK] before the row's first EOS), then masks left in the rows
    ``finished`` (B,) early and tokens after the first generated EOS made ``pad_id`` (in place). Returns the canvas,
    the generated tokens of each row (B,) and the missing positions (B, L)."""
    canvas = canvas.output()
    missing = missing_positions(canvas.x, canvas.gen_mask0, eos_ids, mask_id)
    unfilled = (canvas.x == mask_id) & canvas.gen_mask0 & finished[:, None]
    canvas.x.masked_fill_(unfilled, pad_id)
    return canvas, finalize_eos(canvas.x, canvas.gen_mask0, eos_ids, pad_id, unfilled), missing
