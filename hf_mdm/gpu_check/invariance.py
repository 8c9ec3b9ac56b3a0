"""Whether rows of one length batched together get, on this device, the bits each gets alone: the question that
decides where ``batch_invariant=True`` may keep the batch (`hf_mdm.generation_rows.batches_invariantly`).

For each diffusion model of the check: eight prompts of one length (no padding), one forward of the batch against
each row's own forward (rows whose logits are bitwise equal, the largest difference), and the default sampler at
temperature 0 on the batch against each row alone (rows whose tokens are equal). On CUDA, cuBLAS may choose its
kernels (split-K) by the number of rows, so this is measured rather than assumed; the mode runs rows alone there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .shapes import Shape

__all__ = ["Invariance", "measure_invariance"]

ROWS = 8


@dataclass
class Invariance:
    model: str
    dtype: str
    rows: int
    logits_equal_rows: int
    max_logit_difference: float
    token_equal_rows: int


@torch.no_grad()
def measure_invariance(
    shape: Shape, device: Any, dtype: torch.dtype, prompt: int, new_tokens: int, steps: Optional[int] = None
) -> Invariance:
    """One model's row (see the module docstring); its weights random, seeded by the shape's builder; the sampler
    takes ``steps`` (default: one token a step)."""
    model = shape.build(dtype, device)
    ids_of = dict(shape.token_ids)
    vocab = int(getattr(model.config, "vocab_size", 512))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, min(vocab, 30000) - 2, (ROWS, prompt), generator=generator).to(device)
    batched = model(ids).logits
    alone = torch.cat([model(ids[b : b + 1]).logits for b in range(ROWS)])
    equal = (batched == alone).flatten(1).all(1)
    settings = dict(max_new_tokens=new_tokens, steps=steps or new_tokens, block_length=min(32, new_tokens), **ids_of)
    together = model.generate(ids, **settings)[:, prompt:]
    own = torch.cat([model.generate(ids[b : b + 1], **settings)[:, prompt:] for b in range(ROWS)])
    difference = float((batched.float() - alone.float()).abs().max())
    del model
    return Invariance(
        shape.name, str(dtype).removeprefix("torch."), ROWS, int(equal.sum()), difference,
        int((together == own).all(1).sum()),
    )  # fmt: skip
