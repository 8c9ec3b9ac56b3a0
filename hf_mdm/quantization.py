"""Weight-only quantization through torchao: the names users pass (``"int8"``, ``"int4"``), the
`transformers.TorchAoConfig` that ``from_pretrained(..., quantization_config=...)`` takes for them, and the weights'
memory of a loaded model.

- ``"int8"``: torchao's ``Int8WeightOnlyConfig`` (one int8 per weight, a scale per output row), on every device.
- ``"int4"``: groups of ``group_size`` weights share a scale and a zero point. On the CPU torchao's
  ``PrototypeInt4WeightOnlyConfig`` (``Int4OpaqueTensor``, packed for ``aten._weight_int4pack_mm_for_cpu``): its
  stable ``Int4WeightOnlyConfig`` packs int4 for CUDA kernels only (the default ``plain`` format needs the ``mslk``
  CUDA library, ``tile_packed_to_4d`` tinygemm's CUDA kernel). On CUDA ``Int4WeightOnlyConfig`` with
  ``tile_packed_to_4d`` (tinygemm, compute capability 8.0 and above). A layer whose input width is not a multiple of
  ``group_size`` stays unquantized (torchao skips it).

transformers quantizes the weights of ``nn.Linear`` layers as they load, except the output layer (the LM head) and
whatever ``modules_to_not_convert`` names; embeddings, norms and 3-D parameters such as LLaDA2's fused routed
experts keep the dtype they load in. Activations stay in that dtype too (weight-only): load in bfloat16. torchao's
``set_inductor_config`` is off: loading a model leaves the process's ``torch._inductor.config`` as it was.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Optional

import torch

__all__ = [
    "QUANTIZATIONS",
    "quantization_config",
    "quantize_weights",
    "tensor_bytes",
    "weight_bytes",
    "linear_weight_bytes",
    "quiet_import_noise",
]

QUANTIZATIONS = ("int8", "int4")
INT4_DEVICES = ("cpu", "cuda")
INSTALL = "pip install 'hf_mdm[quant]'"


class _ImportNoise(logging.Filter):
    """Two records every process logs once torchao is imported (transformers imports it as it loads any model when
    it is installed) on a CPU build of torch, neither anything a user acts on: torchao's optional CUDA kernels that do
    not load, and torch's deprecation note on torchao's registrations of Enum classes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        kernels = message.startswith("Failed to load") and "torchao" in message
        return not kernels and "is an Enum subclass and is now natively supported" not in message


def quiet_import_noise() -> None:
    """Drops `_ImportNoise`'s records (called once, by ``import hf_mdm``); torchao's other records pass."""
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).addFilter(_ImportNoise())


def quantization_config(
    name: Optional[str], device: Any = "cpu", group_size: int = 128, modules_to_not_convert: Optional[list] = None
) -> Any:
    """The ``quantization_config`` of ``from_pretrained`` for ``name`` (one of `QUANTIZATIONS`; None or ``"none"``:
    None, no quantization), quantizing on ``device`` (where the model is loaded: int4's packing depends on it).
    ValueErrors name the choices, the missing package or the unsupported device."""
    if name is None or name == "none":
        return None
    if name not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {name!r}: one of {list(QUANTIZATIONS)} (or 'none')")
    if importlib.util.find_spec("torchao") is None:
        raise ValueError(f"quantization {name!r} needs torchao: {INSTALL}")
    from transformers import TorchAoConfig

    device_type = torch.device(device).type
    if name == "int8":
        from torchao.quantization import Int8WeightOnlyConfig

        weights = Int8WeightOnlyConfig(set_inductor_config=False)
    elif device_type == "cpu":
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig

        _check_group_size(group_size, (32, 64, 128))
        weights = PrototypeInt4WeightOnlyConfig(group_size=group_size, set_inductor_config=False)
    elif device_type == "cuda":
        from torchao.quantization import Int4WeightOnlyConfig
        from torchao.quantization.quantize_.workflows import Int4PackingFormat

        _check_group_size(group_size, (32, 64, 128, 256))
        weights = Int4WeightOnlyConfig(
            group_size=group_size, int4_packing_format=Int4PackingFormat.TILE_PACKED_TO_4D, set_inductor_config=False
        )
    else:
        raise ValueError(
            f"quantization 'int4' on {device_type!r}: torchao packs int4 weights for {list(INT4_DEVICES)} only "
            "(use 'int8', which runs on any device)"
        )
    return TorchAoConfig(weights, modules_to_not_convert=modules_to_not_convert)


def quantize_weights(model: torch.nn.Module, name: Optional[str], device: Any = "cpu", group_size: int = 128) -> None:
    """Quantizes the weights of a model already built (random weights, say: there is no checkpoint to load) in
    place, as ``from_pretrained`` with `quantization_config` would as it loads: the ``nn.Linear`` layers but the
    output layer, and for int4 only those whose input width is a multiple of ``group_size``. None or ``"none"``
    leaves the model as it is."""
    config = quantization_config(name, device, group_size)
    if config is None:
        return
    from torchao.quantization import quantize_

    head = model.get_output_embeddings()

    def converted(module: torch.nn.Module, _name: str) -> bool:
        if not isinstance(module, torch.nn.Linear) or module is head:
            return False
        return name != "int4" or module.in_features % group_size == 0

    quantize_(model, config.quant_type, filter_fn=converted)


def _check_group_size(group_size: int, choices: tuple) -> None:
    if group_size not in choices:
        raise ValueError(f"int4 group_size {group_size}: one of {list(choices)} on this device")


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes held by ``tensor``'s data: for torchao's tensor subclasses (``Int8Tensor``, ``Int4OpaqueTensor``, ...)
    the sum over the inner tensors it flattens to (the packed integers, the scales and zero points), not the
    high-precision shape it reports."""
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is not None and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, inner)) for inner in names)
    return tensor.numel() * tensor.element_size()


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s parameters (each shared tensor once, as ``parameters()`` yields it), quantized ones at
    their stored size. Buffers (rotary tables, masks) are not weights and are left out."""
    return sum(tensor_bytes(p) for p in model.parameters())


def linear_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights of ``model``'s ``nn.Linear`` layers (those weight-only quantization converts), each
    shared tensor once."""
    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += tensor_bytes(module.weight)
    return total
