"""Rows generated alone: batch-invariant generation and per-row seeds.

A row of a batch is not computed as it is alone: its padding changes the length every attention and matrix product
reduces over, so in bfloat16 its logits round differently and a near tie breaks the other way (see the README's
"Reproducible at any batch size"), and the rows of a batch share one random stream. `generate_rows` is the cure
that holds on every device: each row runs as a call of its own, without its padding, with its own generator, and the
outputs are put back in the batch's layout. So a row's tokens are those it gets alone, whatever the batch size,
padding side and length, and its neighbours, under every sampler and cache, in every dtype: the only assumption is
that a kernel gives the same bits for the same shapes (on CUDA the call runs under
``torch.use_deterministic_algorithms``, so that atomic-add kernels are replaced by deterministic ones).

It runs when ``batch_invariant=True``, and when ``seed`` is a list (one per row) and the call draws random numbers
(`draws_random_numbers`); a call that draws none gives the same tokens under any seed and runs as one batch. The cost
is the batching: rows run one after the other (``make bench`` prints it).

Exported with the model as remote code.
"""

from __future__ import annotations

import contextlib
import numbers
import time
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from .generation_config import MaskedDiffusionGenerateOutput
from .generation_reference import reference_draws
from .generation_strategy import get_strategy
from .generation_transfer import TRANSFER_REGISTRY

__all__ = ["Seeds", "check_seed", "draws_random_numbers", "runs_rows_alone", "generate_rows"]

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


def runs_rows_alone(config: Any, seed: Seeds, generator: Optional[torch.Generator]) -> bool:
    """Whether the call runs every row alone (`generate_rows`): ``batch_invariant``, or one seed per row for a call
    that draws; a ValueError for ``batch_invariant`` with a draw that no seed makes a row's own."""
    per_row_seeds = isinstance(seed, (list, tuple))
    if not config.batch_invariant:
        return per_row_seeds and draws_random_numbers(config)
    if (generator is not None or seed is None) and draws_random_numbers(config):
        raise ValueError(
            "batch_invariant=True with a sampler that draws random numbers needs seed= (one integer for every row, "
            "or a list with one per row), so that each row's draws depend on its own seed only: "
            + ("a generator is shared by the rows" if generator is not None else "no seed was given")
        )
    return True


def generate_rows(
    generate: Callable[..., Any],
    input_ids: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    config: Any,
    new_tokens: int,
    seed: Seeds,
    stopping_criteria: Any = None,
) -> Union[torch.Tensor, MaskedDiffusionGenerateOutput]:
    """``generate(row, generation_config=..., seed=..., stopping_criteria=...)`` for every row alone, without its
    padding, with its own seed (the row's of a list, else ``seed``), and the outputs in the batch's layout: the
    prompt columns as given (a prompt [MASK] the row infilled written at its column), the ``new_tokens`` generated
    columns after the prompt. Stopping criteria see each row in the batch's layout (`_InBatchLayout`: a criterion
    built for the batch, e.g. one that reads the columns after the batch's prompt, reads the same columns). With
    ``return_dict_in_generate`` the costs are the rows' sums (they ran one after the other) and ``elapsed_s`` the
    whole call's."""
    _reject_unmergeable(config)
    bsz = input_ids.shape[0]
    seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * bsz
    keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    row_config = config.__class__.from_any(config)
    row_config.batch_invariant, row_config.max_new_tokens = False, new_tokens
    deadline = None if config.max_time is None else time.monotonic() + float(config.max_time)
    outputs, start = [], time.perf_counter()
    with _deterministic(input_ids.device):
        for b in range(bsz):
            if deadline is not None:
                row_config.max_time = max(deadline - time.monotonic(), 0.0)
            row = input_ids[b][keep[b].to(input_ids.device)][None]
            criteria = (
                None
                if not stopping_criteria
                else StoppingCriteriaList([_InBatchLayout(stopping_criteria, input_ids[b], keep[b])])
            )
            outputs.append(generate(row, generation_config=row_config, seed=seeds[b], stopping_criteria=criteria))
    sequences = _assemble(input_ids, keep, [_sequences(out) for out in outputs], new_tokens)
    if not config.return_dict_in_generate:
        return sequences
    return _merged_output(sequences, outputs, time.perf_counter() - start)


class _InBatchLayout(StoppingCriteria):
    """Stopping criteria called on a row generated alone as if on its row of the batch: the prompt at the row's
    columns of the batch (its padding ids kept), what follows the prompt after the batch's prompt width."""

    def __init__(self, criteria: Any, batch_row: torch.Tensor, keep: torch.Tensor):
        self.criteria, self.batch_row, self.keep = criteria, batch_row.long(), keep.bool()

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        n = int(self.keep.sum())
        prompt = self.batch_row.to(input_ids.device).clone()
        prompt[self.keep.to(input_ids.device)] = input_ids[0, :n]
        laid_out = torch.cat([prompt, input_ids[0, n:]])[None]
        return self.criteria(laid_out, scores, **kwargs)


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


def _assemble(input_ids: torch.Tensor, keep: torch.Tensor, rows: list[torch.Tensor], new_tokens: int) -> torch.Tensor:
    """(B, P + new_tokens): each row's output (1, n_b + new_tokens) at its prompt's kept columns and after the
    prompt; padding columns keep the input's ids."""
    bsz, prompt_len = input_ids.shape
    out = torch.cat([input_ids.long(), input_ids.new_zeros((bsz, new_tokens), dtype=torch.long)], dim=1)
    for b, row in enumerate(rows):
        n = int(keep[b].sum())
        out[b, :prompt_len][keep[b]] = row[0, :n].to(out.device)
        out[b, prompt_len:] = row[0, n : n + new_tokens].to(out.device)
    return out


def _merged_output(sequences: torch.Tensor, outputs: list[Any], seconds: float) -> MaskedDiffusionGenerateOutput:
    """One output for the rows' outputs: per-row fields concatenated, counts summed."""
    nfe = sum(int(o.nfe) for o in outputs)
    num_generated = torch.cat([o.num_generated_tokens.reshape(1) for o in outputs])
    return MaskedDiffusionGenerateOutput(
        sequences=sequences,
        steps=sum(int(o.steps) for o in outputs),
        nfe=nfe,
        row_nfe=torch.tensor([int(o.nfe) for o in outputs]),
        forward_rows=sum(int(o.forward_rows) for o in outputs),
        forward_tokens=sum(int(o.forward_tokens) for o in outputs),
        elapsed_s=seconds,
        num_generated_tokens=num_generated,
        unfinished=torch.cat([o.unfinished.reshape(1) for o in outputs]),
        tokens_per_forward=float(num_generated.sum()) / max(nfe, 1),
        accepted_per_round=_cat_rows([o.accepted_per_round for o in outputs]),
        history=None,
        scores=_cat_columns([o.scores for o in outputs]),
        logits=_cat_columns([o.logits for o in outputs]),
    )


def _cat_rows(values: list[Optional[torch.Tensor]]) -> Optional[torch.Tensor]:
    return None if any(v is None for v in values) else torch.cat([v.reshape(1, *v.shape[1:]) for v in values])


def _cat_columns(values: list[Optional[tuple]]) -> Optional[tuple]:
    """Per generated column, the rows' (1, V) tensors stacked into (B, V)."""
    if any(v is None for v in values):
        return None
    return tuple(torch.cat(columns) for columns in zip(*values))
