"""Serving on this device: concurrent requests through joined calls against one batched call.

For LLaDA-8B (no cache) and LLaDA2.0-mini (its exact block cache), ``n`` concurrent requests of one prompt length
(1, 8 and 32; 1 and 3 with ``--tiny``): each request its own ``generate`` call in a thread of its own, their
forwards batched by `hf_mdm.serve.forwards.SharedForwards` (what ``hf-mdm serve --scheduler join`` runs), against
the same requests as one batched ``generate`` call (what the micro-batcher runs). Tokens per second of each, their
ratio, and how many joined rows got the batched call's tokens (on the CPU in float32 every one: the rows are not
padded and the kernels batch invariantly; on a GPU in bfloat16 cuBLAS may move the last bits).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..serve.forwards import SharedForwards
from .shapes import Shape

__all__ = ["Serving", "measure_serving", "SERVED_MODELS"]

SERVED_MODELS = ("LLaDA-8B", "LLaDA2.0-mini")


@dataclass
class Serving:
    model: str
    concurrent: int
    joined_tokens_per_s: float
    batched_tokens_per_s: float
    rows_equal: int
    note: str = ""


def _synced(device: Any, work: Any) -> tuple[Any, float]:
    """``work()`` and its seconds, the device synchronised on both sides."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    out = work()
    sync()
    return out, time.perf_counter() - start


def _joined(model: Any, shared: SharedForwards, ids: torch.Tensor, settings: dict) -> torch.Tensor:
    """Each row its own generate call, every call registered before any forward (rows of one shape: one batch)."""
    gate = threading.Barrier(ids.shape[0])

    def one(b: int) -> torch.Tensor:
        with shared.member():
            gate.wait(timeout=600)
            return model.generate(ids[b : b + 1], **settings)

    with ThreadPoolExecutor(ids.shape[0]) as pool:
        return torch.cat(list(pool.map(one, range(ids.shape[0]))))


@torch.no_grad()
def measure_serving(
    shape: Shape,
    device: Any,
    dtype: torch.dtype,
    prompt: int,
    new_tokens: int,
    counts: tuple,
    deadline: float,
    steps: Optional[int] = None,
) -> list[Serving]:
    """One model's rows (see the module docstring), each call with ``steps`` (default: one token a step); rows
    started past ``deadline`` are skipped."""
    model = shape.build(dtype, device)
    vocab = int(getattr(model.config, "vocab_size", 512))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, min(vocab, 30000) - 2, (max(counts), prompt), generator=generator).to(device)
    settings = dict(
        max_new_tokens=new_tokens, steps=steps or new_tokens, block_length=min(32, new_tokens), **dict(shape.token_ids)
    )
    if shape.block_causal:
        settings["kv_cache"] = "prefix"  # the exact block cache, kept per request
    shared = SharedForwards(model)
    rows = []
    for n in counts:
        if time.monotonic() > deadline:
            rows.append(Serving(shape.name, n, 0.0, 0.0, 0, "skipped: time budget"))
            continue
        batch = ids[:n]
        model.generate(batch, **settings)  # warm-up
        batched, batched_s = _synced(device, lambda: model.generate(batch, **settings))
        joined, joined_s = _synced(device, lambda: _joined(model, shared, batch, settings))
        tokens = n * new_tokens
        equal = int((joined[:, prompt:] == batched[:, prompt:]).all(1).sum())
        rows.append(Serving(shape.name, n, tokens / joined_s, tokens / batched_s, equal))
    return rows


def serving_lines(rows: list[Serving]) -> list[str]:
    """The serving table of the report."""
    if not rows:
        return []
    lines = [
        "",
        "Serving: n concurrent requests of one prompt length, each its own generate call with its forwards batched "
        "(hf-mdm serve --scheduler join), against one batched generate call (the micro-batcher's); LLaDA2.0-mini "
        "with its exact block cache.",
        "",
        "| model | concurrent | joined tokens/s | batched tokens/s | joined / batched | rows equal | note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ratio = f"{r.joined_tokens_per_s / r.batched_tokens_per_s:.2f}x" if r.batched_tokens_per_s else "-"
        lines.append(
            f"| {r.model} | {r.concurrent} | {r.joined_tokens_per_s:.1f} | {r.batched_tokens_per_s:.1f} | {ratio} | "
            f"{r.rows_equal} of {r.concurrent} | {r.note} |"
        )
    return lines
