"""Reproducible lm-eval runs: a stable seed per request, and rows generated alone.

A sampled answer should not depend on which requests share its batch nor on how many processes share the run.
Each request gets a seed of its own, `request_seed`: a hash of the run's seed (the model's ``seed`` argument, else
the torch seed lm-eval's ``--seed`` set before the model was built), the request's task, document, repeat,
context and generation kwargs. ``hf_mdm`` draws every row from its request's seed (``seed=[...]`` of
`hf_mdm.generation.diffusion_generate`); with ``batch_invariant=True`` each row's forwards are also its own (rows of
one length batched where the device's kernels allow, else alone: `hf_mdm.generation_rows`), so its tokens do not
depend on the batch even in bfloat16. ``hf_timed`` (transformers' ``generate``, which has one random
stream for the batch) takes ``batch_invariant=True`` the same way: each request generated alone, as a batch of one
without padding, its draws from its own seed (`generate_alone`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Optional, Sequence

import torch

from .timing import RequestTag

__all__ = ["request_seed", "run_seed", "generate_alone", "reproducibility_info"]


def run_seed(seed: Optional[int]) -> int:
    """The run's seed: ``seed`` when given, else the seed of torch's default generator (lm-eval's ``--seed`` sets it,
    1234 by default, before it builds the model)."""
    return int(seed) if seed is not None else int(torch.initial_seed())


def request_seed(base: int, tag: RequestTag, context: str, gen_kwargs: Any) -> int:
    """A 63-bit seed of one request, the same at any batch size and process count (see the module docstring)."""
    key = json.dumps([base, tag.task, tag.doc_id, tag.repeat, context, gen_kwargs], sort_keys=True, default=str)
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") >> 1


def generate_alone(
    generate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    seeds: Sequence[int],
    pad_token_id: int,
) -> tuple[torch.Tensor, list[int]]:
    """``generate(row, ones)`` for each left-padded row alone (its padding dropped), torch's random stream seeded
    with the row's seed for the call and restored after; the rows' generated tokens (after their prompts) padded on
    the right into one (B, T) tensor, and each row's decoding steps."""
    outputs, steps = [], []
    devices = [input_ids.device.index or 0] if input_ids.device.type == "cuda" else []
    for b, seed in enumerate(seeds):
        row = input_ids[b][attention_mask[b].bool()][None]
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(seed))
            out = generate(row, torch.ones_like(row))
        outputs.append(out[0, row.shape[1] :])
        steps.append(outputs[-1].shape[0])
    tokens = torch.nn.utils.rnn.pad_sequence(outputs, batch_first=True, padding_value=pad_token_id)
    return tokens, steps


def reproducibility_info(batch_invariant: bool, seeds: str, base: int, batching: Optional[str] = None) -> dict:
    """What a run's results JSON records of its mode (``config.reproducibility``); with ``batch_invariant``,
    ``batching`` says how rows ran and what that guarantees on the run's device
    (`hf_mdm.generation_rows.invariance_guarantee`)."""
    info: dict[str, Any] = {"batch_invariant": bool(batch_invariant), "seeds": seeds, "seed": base}
    if batch_invariant and batching is not None:
        info["batching"] = batching
    return info
