"""Tiny LLaDA and Dream checkpoints in the published formats (``config.json`` with every published key, tiny sizes;
safetensors with the published parameter names, random weights), each with hf_mdm's tiny byte-level tokenizer saved
beside it and output rows that make the models write text: what the lm-eval model and the guides' examples load."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from published_formats import dream_shapes, llada_shapes, published_config
from safetensors.torch import save_file

from hf_mdm.harness.tiny import EOS, MASK


def tiny_config(arch: str, tokenizer) -> dict:
    """The published config.json (every key), tiny sizes, the tokenizer's vocabulary and special ids."""
    vocab = len(tokenizer)
    eos, pad, mask = tokenizer.convert_tokens_to_ids([EOS, "<|pad|>", MASK])
    if arch == "llada":  # as published: pad_token_id = EOS
        sizes = dict(
            d_model=32,
            n_heads=4,
            n_kv_heads=4,
            n_layers=2,
            mlp_hidden_size=48,
            vocab_size=vocab,
            embedding_size=vocab,
            max_sequence_length=1024,
            rope_theta=10000.0,
            mask_token_id=mask,
            eos_token_id=eos,
            pad_token_id=eos,
        )
        return published_config("llada_8b_base") | sizes
    sizes = dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=48,
        vocab_size=vocab,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        mask_token_id=mask,
        pad_token_id=pad,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    return published_config("dream_v0_base_7b") | sizes


def random_weights(shapes: dict[str, tuple[int, ...]], output: str, keep: list[int], eos: int, seed: int) -> dict:
    """Norms near 1, biases near 0, matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1); the output rows of every token
    but printable ASCII, newline and EOS zeroed (as hf_mdm.harness.tiny does), so that the models write text."""
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
    rows = torch.ones(shapes[output][0], dtype=torch.bool)
    rows[keep] = False
    tensors[output][rows] = 0.0
    tensors[output][eos] *= 0.8  # EOS now and then, not everywhere
    return tensors


def write_checkpoint(path: Path, arch: str, tokenizer, seed: int = 0) -> Path:
    config = tiny_config(arch, tokenizer)
    shapes = llada_shapes(config) if arch == "llada" else dream_shapes(config)
    output = "model.transformer.ff_out.weight" if arch == "llada" else "lm_head.weight"
    text = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(chr(b))[0]) for b in [10, *range(32, 127)]]
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    tensors = random_weights(shapes, output, text + [tokenizer.eos_token_id], tokenizer.eos_token_id, seed)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(path)
    return path
