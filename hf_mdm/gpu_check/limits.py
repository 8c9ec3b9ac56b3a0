"""What a forward must cost on the GPU at best: the two limits each row of the GPU check is set against.

A forward cannot run faster than its floating-point work at the GPU's matrix rate, nor faster than the bytes it must
read at the memory's bandwidth. The rates are those of one H200: dense bfloat16 matrix work at ``PEAK_FLOPS`` (790
TFLOP/s, what these machines reach; the datasheet says 990) and HBM3e at ``PEAK_BANDWIDTH`` (4.8 TB/s, datasheet).

The work comes from the model's shape (`model_size`, read off a model built on any device, the ``meta`` device
included) and the positions a forward computes and attends to (`positions`):

- FLOPs = 2 x computed parameters x positions computed (a multiply and an add for every weight a position passes
  through: every parameter but the input embeddings, a lookup; a mixture of experts' routed experts at the share a
  token uses, ``num_experts_per_tok / num_experts``) + 4 x layers x attention width x positions computed x positions
  attended (the scores and the weighted sum of the values). The LM head is counted at every computed position, an
  upper bound where the sampler asks for fewer logits.
- Bytes = the weights once (at their stored size: quantized weights count less) + the keys and values of the
  positions attended, read once a layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..quantization import weight_bytes

__all__ = [
    "PEAK_FLOPS",
    "PEAK_BANDWIDTH",
    "ModelSize",
    "Work",
    "model_size",
    "forward_work",
    "positions",
    "limits_ms",
    "limit_ratio",
]

PEAK_FLOPS = 790e12  # dense bfloat16 matrix work a second on these H200s (measured; datasheet 990e12)
PEAK_BANDWIDTH = 4.8e12  # HBM3e bytes a second on one H200 (datasheet)


@dataclass(frozen=True)
class ModelSize:
    """The numbers of a model's shape the limits need."""

    parameters: int  # all of them
    computed_parameters: int  # those a position is multiplied by (see the module docstring)
    weight_bytes: int  # the parameters at their stored size
    layers: int
    attention_width: int  # query heads x head dimension
    kv_width: int  # key (and value) heads x head dimension
    kv_bytes: int = 2  # bytes of one key or value element (bfloat16)


@dataclass(frozen=True)
class Work:
    """One forward's floating-point operations and the bytes it must read."""

    flops: float
    bytes: float


def _config_number(config, *names: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if value:
            return int(value)
    raise ValueError(f"{type(config).__name__} has none of {names}: the limits cannot read its shape")


def model_size(model: torch.nn.Module, kv_bytes: int = 2) -> ModelSize:
    """``model``'s `ModelSize`, from its parameters and config (a model built on the ``meta`` device will do)."""
    config = model.config
    layers = _config_number(config, "num_hidden_layers", "n_layers")
    hidden = _config_number(config, "hidden_size", "d_model")
    heads = _config_number(config, "num_attention_heads", "n_heads")
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or getattr(config, "n_kv_heads", None) or heads
    experts = getattr(config, "num_experts", None)
    share = config.num_experts_per_tok / experts if experts else 1.0
    lookup, head = model.get_input_embeddings().weight, model.get_output_embeddings()
    parameters, computed = 0, 0.0
    for parameter in model.parameters():
        parameters += parameter.numel()
        if parameter is lookup and (head is None or head.weight is not lookup):
            continue  # a lookup only (tied to the LM head, it is multiplied there)
        routed = experts and parameter.dim() == 3 and parameter.shape[0] == experts
        computed += parameter.numel() * (share if routed else 1.0)
    return ModelSize(
        parameters, int(computed), weight_bytes(model), layers, heads * head_dim, int(kv_heads) * head_dim, kv_bytes
    )


def forward_work(size: ModelSize, batch: int, computed: float, attended: float) -> Work:
    """The FLOPs and bytes of one forward of ``batch`` rows, each computing ``computed`` positions that attend to
    ``attended`` positions (the module docstring's two sums)."""
    flops = 2 * size.computed_parameters * batch * computed
    flops += 4 * size.layers * size.attention_width * batch * computed * attended
    kv_read = 2 * size.layers * size.kv_width * batch * attended * size.kv_bytes
    return Work(float(flops), float(size.weight_bytes + kv_read))


def positions(cache: str, prompt: int, new_tokens: int, block: int, steps: int) -> tuple[float, float]:
    """The positions a forward computes and attends to, averaged over a generate call's forwards, for ``cache``:

    - ``"none"``: the whole canvas, every forward (also the paper's and threshold samplers);
    - ``"prefix"``: a block's first forward the whole canvas, the others the block and what follows it;
    - ``"dual"``: a block's first forward the whole canvas, the others the block alone;
    - ``"exact"`` (a block-causal model's block cache): the block, attending to what precedes it and itself;
    - ``"loop"`` (LLaDA2's published loop): the canvas up to the block's end, attending to itself;
    - ``"ar"`` (autoregressive decoding, one new position a forward): one position, attending to those before it.
    """
    length, blocks = prompt + new_tokens, max(new_tokens // block, 1)
    per_block = max(steps // blocks, 1)
    ends = [prompt + (k + 1) * block for k in range(blocks)]
    if cache == "none":
        return float(length), float(length)
    if cache in ("prefix", "dual"):
        rest = [length - (end - block) if cache == "prefix" else block for end in ends]
        computed = sum(length + (per_block - 1) * r for r in rest) / (blocks * per_block)
        return computed, float(length)
    if cache == "exact":
        return float(block), sum(ends) / blocks
    if cache == "loop":
        return sum(ends) / blocks, sum(ends) / blocks
    if cache == "ar":
        return 1.0, prompt + (new_tokens + 1) / 2
    raise ValueError(f"unknown cache {cache!r}: one of none, prefix, dual, exact, loop, ar")


def limits_ms(work: Work) -> tuple[float, float]:
    """Milliseconds of ``work`` at ``PEAK_FLOPS`` and at ``PEAK_BANDWIDTH``."""
    return 1000 * work.flops / PEAK_FLOPS, 1000 * work.bytes / PEAK_BANDWIDTH


def limit_ratio(measured_ms: Optional[float], work: Work) -> Optional[float]:
    """Measured ms over the nearer (the larger) of the two limits: 1.0 is at the limit."""
    return None if measured_ms is None else measured_ms / max(limits_ms(work))
