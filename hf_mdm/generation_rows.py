"""Batch-invariant generation and per-row seeds, keeping the batch where the kernels allow.

A row of a batch is not computed as it is alone: its padding changes the length every attention and matrix product
reduces over, so in bfloat16 its logits round differently and a near tie breaks the other way (see the README's
"Reproducible at any batch size"), and the rows of a batch share one random stream. `generate_rows` is the cure:

1. rows are grouped (`RowLayout.groups`) so that no row is padded: rows whose prompts have one length and one layout
   of [MASK] tokens run as one batch, each without its padding, so each has its own shapes (canvas, blocks, steps);
2. every row draws from its own generator inside the batched step (`hf_mdm.generation_random.RowGenerators`: a row
   draws exactly the numbers it draws alone, and none at a step it would skip alone);
3. the outputs are put back in the batch's layout.

A group's rows get the bits they get alone where the kernels do not choose their reduction order by the number of
rows (`batches_invariantly`): on the CPU in float32 (MKL's products, torch's attention; every family tested), and in
bfloat16 without AMX. oneDNN's AMX bfloat16 products change a row's bits with the number of rows (measured), and
cuBLAS picks kernels by size (split-K), so there ``batch_invariant`` runs every row alone, the guarantee that holds on
every device (``make gpu-check`` measures whether equal-length batches are invariant on a GPU). Samplers whose draws
are not per row (a reference sampler's, speculative decoding's, ``no_repeat_ngram_size``'s, a compiled step's) run
their rows alone when they draw.

It runs when ``batch_invariant=True``, and when ``seed`` is a list (one per row) and the call draws random numbers
(`draws_random_numbers`): then each row draws its own numbers in its group's batched forwards on any device (the
forwards equal the row's own where the device batches invariantly). A call that draws none gives the same tokens
under any seed and runs as one batch.

Exported with the model as remote code.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import time
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from .generation_config import MaskedDiffusionGenerateOutput
from .generation_random import RowGenerators
from .generation_reference import reference_draws
from .generation_strategy import get_strategy
from .generation_transfer import TRANSFER_REGISTRY

__all__ = [
    "Seeds",
    "check_seed",
    "draws_random_numbers",
    "batches_invariantly",
    "invariance_guarantee",
    "draws_in_batch",
    "plan_rows",
    "rows_of_call",
    "call_generator",
    "RowLayout",
    "require_own_draws",
    "generate_rows",
]

Seeds = Union[None, int, Sequence[int]]


def check_seed(seed: Seeds, batch_size: int, generator: Optional[torch.Generator]) -> None:
    """ValueErrors for a seed that is not an integer or a list of one integer per row, and for a list with a
    generator (which of the two would draw is ambiguous)."""
    if seed is None:
        return
    values = list(seed) if isinstance(seed, (list, tuple)) else [seed]
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in values):
        raise ValueError(
            f"seed must be an integer or a list of integers (one per row), got {seed!r} (or pass "
            "generator=torch.Generator().manual_seed(n))"
        )
    if isinstance(seed, (list, tuple)):
        if len(values) != batch_size:
            raise ValueError(f"seed is a list of {len(values)} seeds for {batch_size} rows: pass one seed per row")
        if generator is not None:
            raise ValueError("pass either generator= or a list of seeds (one per row), not both")


def draws_random_numbers(config: Any) -> bool:
    """Whether a call with ``config`` draws random numbers (so its tokens depend on the seed): sampling (temperature
    > 0), a random strategy or a random transfer (pieces that say so: ``draws``), ReMDM's remasking, or a reference
    sampler's own draws."""
    if config.reference not in (None, "none"):
        return reference_draws(config)
    strategy = get_strategy(config.strategy) if config.strategy is not None else None
    transfer = TRANSFER_REGISTRY.get(config.transfer)
    return (
        bool(config.temperature)
        or config.remdm is not None
        or bool(getattr(strategy, "draws", False))
        or bool(getattr(transfer, "draws", False))
    )


def batches_invariantly(device: Any, dtype: torch.dtype) -> bool:
    """Whether rows of one length batched together get, on ``device`` in ``dtype``, the bits each gets alone: the
    kernels must not choose their reduction order by the number of rows. On the CPU, MKL's float32 products and
    torch's attention do not (`tests/generation/test_batch_invariance.py` checks every family); oneDNN's
    bfloat16/float16 products do on CPUs with AMX (measured: a 1024 -> 256 product changes bits from 280 rows), so there
    the rows run alone, unless AMX is switched off (``ONEDNN_MAX_CPU_ISA`` below ``AVX512_CORE_AMX``). On CUDA cuBLAS
    picks its kernels by the problem's size (split-K), so rows run alone; ``make gpu-check`` measures whether
    equal-length batches stay invariant there."""
    if torch.device(device).type != "cpu":
        return False
    if dtype in (torch.float32, torch.float64):
        return True
    return not _amx_in_use()


def invariance_guarantee(device: Any, dtype: torch.dtype) -> str:
    """What ``batch_invariant=True`` does and guarantees on ``device`` in ``dtype``, in words (a run records it)."""
    if batches_invariantly(device, dtype):
        return "rows of one length batched without padding, each its own draws: bitwise as alone on this device"
    return "every row alone, without its padding, with its own draws: bitwise as alone on any device"


def _amx_in_use() -> bool:
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).upper()
    if isa and "AMX" not in isa and isa != "ALL":
        return False
    is_amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return True if is_amx is None else bool(is_amx())


def draws_in_batch(config: Any) -> bool:
    """Whether every draw of a call with ``config`` can come from one generator per row inside the batched step
    (`hf_mdm.generation_random`): the default sampler's, the paper's sampler's and ReMDM's; not a reference
    sampler's, speculative decoding's, ``no_repeat_ngram_size``'s or a compiled step's (their rows run alone)."""
    return (
        config.reference in (None, "none")
        and config.transfer != "speculative"
        and not config.no_repeat_ngram_size
        and not config.compile_forward
    )


def plan_rows(
    config: Any, seed: Seeds, generator: Optional[torch.Generator], rows: "RowLayout", device: Any, dtype: Any
) -> Optional[list[list[int]]]:
    """The groups of rows a call runs as (each a batch without padding), or None to run the batch as given:
    ``batch_invariant`` groups rows of one length and layout where they batch invariantly (`batches_invariantly`,
    `draws_in_batch`), else runs every row alone; one seed per row without it (a call that draws) groups them
    wherever the draws allow: each row draws its own numbers, the forwards are the batch's (equal to the row's own
    where the device batches invariantly). A ValueError for ``batch_invariant`` with a draw that no seed makes a
    row's own."""
    draws = draws_random_numbers(config)
    if not config.batch_invariant and not (isinstance(seed, (list, tuple)) and draws):
        return None
    if config.batch_invariant and draws:
        require_own_draws(seed, generator)
    invariant = batches_invariantly(device, dtype) or not config.batch_invariant  # seeds alone: own draws
    together = invariant and (not draws or draws_in_batch(config))
    return rows.groups() if together else rows.alone()


def rows_of_call(
    model: Any, config: Any, seed: Seeds, generator: Optional[torch.Generator], input_ids: torch.Tensor, attention_mask
) -> tuple["RowLayout", Optional[list[list[int]]]]:
    """The rows of a call: ``seed`` checked (`check_seed`), each row's prompt without its padding (`RowLayout`), and
    the groups of rows the call runs as (`plan_rows`), or None: the batch as given (so too a batch of one row without
    padding)."""
    check_seed(seed, input_ids.shape[0], generator)
    mask_id = -1 if config.mask_token_id is None else int(config.mask_token_id)  # uniform corruption: no [MASK]
    layout = RowLayout(input_ids.long(), attention_mask, mask_id)
    if input_ids.shape[0] == 1 and (attention_mask is None or bool(attention_mask.all())):
        return layout, None
    dtype = next(iter(model.parameters()), torch.empty(0)).dtype if hasattr(model, "parameters") else torch.float32
    return layout, plan_rows(config, seed, generator, layout, input_ids.device, dtype)


def call_generator(generator: Optional[torch.Generator], seed: Seeds, device: Any) -> Optional[torch.Generator]:
    """The draws of a call that runs its batch as given: ``generator``, else one seeded with ``seed`` (checked by
    `check_seed`; of a list, its first: one row, or a call that draws nothing), else None."""
    if generator is None and seed is not None:
        first = seed[0] if isinstance(seed, (list, tuple)) else seed
        generator = torch.Generator(device=device).manual_seed(int(first))
    return generator


def require_own_draws(seed: Seeds, generator: Optional[torch.Generator]) -> None:
    """A ValueError for ``batch_invariant`` with draws that no seed makes a row's own (a generator, or no seed)."""
    if generator is not None or seed is None:
        raise ValueError(
            "batch_invariant=True with a sampler that draws random numbers needs seed= (one integer for every row, "
            "or a list with one per row), so that each row's draws depend on its own seed only: "
            + ("a generator is shared by the rows" if generator is not None else "no seed was given")
        )


class RowLayout:
    """Each row's prompt without its padding (``keep``), and the groups of rows that share one length and one
    layout of [MASK] tokens (so that batched together each has its own shapes: its canvas, blocks and steps)."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], mask_id: int):
        self.input_ids = input_ids
        self.keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        self.keep = self.keep.to(input_ids.device)
        self.size = input_ids.shape[0]
        self.mask_id = mask_id

    def prompt(self, b: int) -> torch.Tensor:
        return self.input_ids[b][self.keep[b]]

    def alone(self) -> list[list[int]]:
        return [[b] for b in range(self.size)]

    def groups(self) -> list[list[int]]:
        by_key: dict[tuple, list[int]] = {}
        for b in range(self.size):
            prompt = self.prompt(b)
            key = (prompt.numel(), tuple((prompt == self.mask_id).nonzero().flatten().tolist()))
            by_key.setdefault(key, []).append(b)
        return list(by_key.values())


def generate_rows(
    generate: Callable[..., Any],
    rows: RowLayout,
    groups: list[list[int]],
    config: Any,
    new_tokens: Optional[int],
    seed: Seeds,
    stopping_criteria: Any = None,
    streamer: Any = None,
) -> Union[torch.Tensor, MaskedDiffusionGenerateOutput]:
    """``generate(group, generation_config=..., seed=... | generator=..., stopping_criteria=...)`` for every group of
    ``groups``, one after the other, each a batch of its rows' prompts without their padding, each row drawing from
    its own seed (the row's of a list, else ``seed``: a `RowGenerators` for a group of several rows), and the
    outputs in the batch's layout: the prompt columns as given (a prompt [MASK] the row infilled written at its
    column), the ``new_tokens`` generated columns after the prompt. Stopping criteria see each row in the batch's
    layout (`_InBatchLayout`: a criterion built for the batch, e.g. one that reads the columns after the batch's
    prompt, reads the same columns). With ``return_dict_in_generate`` the costs are the groups' sums (they ran one
    after the other) and ``elapsed_s`` the whole call's."""
    _reject_unmergeable(config)
    seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * rows.size
    row_config = config.__class__.from_any(config)
    row_config.batch_invariant = False
    if new_tokens is not None:  # None: as many as the sampler writes (whole canvases: the outputs say)
        row_config.max_new_tokens = new_tokens
    deadline = None if config.max_time is None else time.monotonic() + float(config.max_time)
    outputs, start = [], time.perf_counter()
    with _deterministic(rows.input_ids.device):
        for group in groups:
            if deadline is not None:
                row_config.max_time = max(deadline - time.monotonic(), 0.0)
            ids = torch.stack([rows.prompt(b) for b in group])
            draws = _draws(group, seeds, ids.device)
            criteria = (
                None
                if not stopping_criteria
                else StoppingCriteriaList([_InBatchLayout(stopping_criteria, rows, group)])
            )
            streamers = _streamers_of(streamer, group, rows.size)
            outputs.append(
                generate(ids, generation_config=row_config, stopping_criteria=criteria, streamer=streamers, **draws)
            )
    order = [b for group in groups for b in group]
    if new_tokens is None:
        new_tokens = _sequences(outputs[0]).shape[1] - int(rows.keep[groups[0][0]].sum())
    sequences = _assemble(rows, order, [_sequences(out) for out in outputs], new_tokens)
    if not config.return_dict_in_generate:
        return sequences
    return _merged_output(sequences, outputs, order, time.perf_counter() - start)


def _streamers_of(streamer: Any, group: list[int], batch: int) -> Any:
    """A group's streamers: its rows' of a list (None when none of them streams), a batch of one's own streamer."""
    if streamer is None:
        return None
    if not isinstance(streamer, (list, tuple)):
        if batch != 1:
            raise ValueError("streamer supports batch size 1 only, as in transformers (or pass a list, one per row)")
        return streamer
    mine = [streamer[b] for b in group]
    return None if all(s is None for s in mine) else mine


def _draws(group: list[int], seeds: list, device: Any) -> dict[str, Any]:
    """The draws of a group: its one row's seed, or one generator per row (no seed: none)."""
    if len(group) == 1 or seeds[group[0]] is None:
        return {"seed": seeds[group[0]]}
    return {"generator": RowGenerators([seeds[b] for b in group], device)}


class _InBatchLayout(StoppingCriteria):
    """Stopping criteria called on a group of rows generated without their padding as if on their rows of the
    batch: each prompt at its row's columns of the batch (its padding ids kept), what follows the prompt after the
    batch's prompt width."""

    def __init__(self, criteria: Any, rows: "RowLayout", group: list[int]):
        self.criteria, self.batch_rows, self.keep = criteria, rows.input_ids[group].long(), rows.keep[group]

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        n = int(self.keep[0].sum())
        prompts = self.batch_rows.to(input_ids.device).clone()
        prompts[self.keep.to(input_ids.device)] = input_ids[:, :n].flatten()
        return self.criteria(torch.cat([prompts, input_ids[:, n:]], 1), scores, **kwargs)


def _reject_unmergeable(config: Any) -> None:
    if config.output_history:
        raise ValueError(
            "output_history=True cannot be returned when rows run alone (batch_invariant=True or one seed per row): "
            "each row takes its own steps; generate the rows one at a time to keep each row's history"
        )


@contextlib.contextmanager
def _deterministic(device: torch.device) -> Iterator[None]:
    """On CUDA, torch's deterministic algorithms (warnings where an op has none) for the duration; nothing on the
    CPU, whose kernels are deterministic for a given shape and thread count."""
    if torch.device(device).type != "cuda":
        yield
        return
    enabled, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _sequences(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.sequences


def _assemble(rows: RowLayout, order: list[int], outputs: list[torch.Tensor], new_tokens: int) -> torch.Tensor:
    """(B, P + new_tokens): the groups' outputs (g, n + new_tokens), their rows ``order`` in the batch, each row at
    its prompt's kept columns and after the prompt; padding columns keep the input's ids."""
    input_ids, keep = rows.input_ids, rows.keep
    bsz, prompt_len = input_ids.shape
    out = torch.cat([input_ids.long(), input_ids.new_zeros((bsz, new_tokens), dtype=torch.long)], dim=1)
    for b, row in zip(order, (row for group in outputs for row in group)):
        n = int(keep[b].sum())
        out[b, :prompt_len][keep[b]] = row[:n].to(out.device)
        out[b, prompt_len:] = row[n : n + new_tokens].to(out.device)
    return out


def _merged_output(
    sequences: torch.Tensor, outputs: list[Any], order: list[int], seconds: float
) -> MaskedDiffusionGenerateOutput:
    """One output for the groups' outputs: per-row fields in the batch's order, counts summed, each row's forwards
    those of its group (``row_nfe``)."""
    nfe = sum(int(o.nfe) for o in outputs)
    back = torch.argsort(torch.tensor(order))  # the batch's row b is the back[b]-th row of the groups, in order
    num_generated = torch.cat([o.num_generated_tokens.reshape(-1) for o in outputs])[back]
    row_nfe = torch.cat([_row_nfe(o) for o in outputs])[back]
    return MaskedDiffusionGenerateOutput(
        sequences=sequences,
        steps=sum(int(o.steps) for o in outputs),
        nfe=nfe,
        row_nfe=row_nfe,
        forward_rows=sum(int(o.forward_rows) for o in outputs),
        forward_tokens=sum(int(o.forward_tokens) for o in outputs),
        elapsed_s=seconds,
        num_generated_tokens=num_generated,
        unfinished=torch.cat([o.unfinished.reshape(-1) for o in outputs])[back],
        tokens_per_forward=float(num_generated.sum()) / max(nfe, 1),
        accepted_per_round=_cat_rows([o.accepted_per_round for o in outputs], back),
        history=None,
        scores=_cat_columns([o.scores for o in outputs], back),
        logits=_cat_columns([o.logits for o in outputs], back),
    )


def _row_nfe(output: Any) -> torch.Tensor:
    rows = output.num_generated_tokens.reshape(-1).shape[0]
    return output.row_nfe.reshape(-1).cpu() if output.row_nfe is not None else torch.full((rows,), int(output.nfe))


def _cat_rows(values: list[Optional[torch.Tensor]], back: torch.Tensor) -> Optional[torch.Tensor]:
    if any(v is None for v in values):
        return None
    return torch.cat([v.reshape(-1) for v in values])[back.to(values[0].device)]


def _cat_columns(values: list[Optional[tuple]], back: torch.Tensor) -> Optional[tuple]:
    """Per generated column, the groups' (g, V) tensors stacked into (B, V), in the batch's row order."""
    if any(v is None for v in values):
        return None
    return tuple(torch.cat(columns)[back.to(columns[0].device)] for columns in zip(*values))
