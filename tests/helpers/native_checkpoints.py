"""Tiny LLaDA and Dream checkpoints as published, for the native classes to load: `ARCHS` (each architecture's
fixture, shape arithmetic, class and tiny sizes), `tiny_config` (the published config.json, every key kept, tiny
sizes), `random_weights` (under the published parameter names) and `write_checkpoint` (one safetensors file or
shards with an index)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from published_formats import dream_shapes, llada_shapes, published_config
from safetensors.torch import save_file

from hf_mdm.models import DreamModel, LLaDAModelLM

ARCHS = {
    "llada": dict(
        fixture="llada_8b_base",
        shapes=llada_shapes,
        model_class=LLaDAModelLM,
        tiny=dict(
            d_model=32,
            n_heads=4,
            n_kv_heads=4,
            n_layers=2,
            mlp_hidden_size=48,
            vocab_size=96,
            embedding_size=128,
            max_sequence_length=64,
            rope_theta=10000.0,
            mask_token_id=95,
            eos_token_id=1,
            pad_token_id=1,
        ),
    ),
    "dream": dict(
        fixture="dream_v0_base_7b",
        shapes=dream_shapes,
        model_class=DreamModel,
        tiny=dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=48,
            vocab_size=128,
            max_position_embeddings=64,
            rope_theta=10000.0,
            mask_token_id=127,
            pad_token_id=1,
            bos_token_id=1,
            eos_token_id=1,
        ),
    ),
}


def tiny_config(arch: str) -> dict:
    """The published config.json, every key kept, with tiny sizes."""
    return published_config(ARCHS[arch]["fixture"]) | ARCHS[arch]["tiny"]


def random_weights(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Norm weights near 1, biases near 0, matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=gen)
        if name.endswith("bias"):
            tensors[name] = 0.1 * noise
        elif len(shape) == 1:
            tensors[name] = 1.0 + 0.1 * noise
        elif "wte" in name or "embed_tokens" in name:
            tensors[name] = noise
        else:
            tensors[name] = noise / math.sqrt(shape[1])
    return tensors


def write_checkpoint(path: Path, config: dict, tensors: dict[str, torch.Tensor], shards: int = 1) -> Path:
    """A checkpoint directory as published: config.json plus one safetensors file, or shards and an index json."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        return path
    names = sorted(tensors)
    weight_map = {}
    for shard in range(shards):
        filename = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[shard::shards]}
        save_file(part, str(path / filename), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, filename)
    total_size = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return path
