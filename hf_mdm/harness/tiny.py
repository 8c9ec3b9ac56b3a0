"""Tiny local checkpoints for trying the harness without downloads: a byte-level tokenizer, a masked diffusion
model (`MDMForMaskedDiffusion`), a LLaDA2 block-diffusion mixture of experts (`LLaDA2MoeModelLM`, sampled with its
published generate() as the default), transformers' DiffusionGemma (`DiffusionGemmaForBlockDiffusion`, with a
minimal vision tower it never uses for text) and a Llama, randomly initialised from a seed.

`build_tiny_models(directory)` writes ``<directory>/mdm``, ``<directory>/llada2``, ``<directory>/diffusion_gemma``
and ``<directory>/llama`` (each with the tokenizer) and returns their paths; it is idempotent, so configs and tests can
call it before every run. The models are untrained (their output layer only allows printable ASCII, newline and EOS, so
they write random text): they exercise loading, batching, sampling, stop strings, scoring and timing, not accuracy.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Union

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from ..configuration_mdm import MDMConfig
from ..modeling_mdm import MDMForMaskedDiffusion
from ..models.llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM

__all__ = ["build_tokenizer", "build_tiny_models", "TINY_SIZES"]

EOS, PAD, MASK = "<|endoftext|>", "<|pad|>", "<|mask|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TINY_SIZES = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "initializer_range": 0.3,
}
# LLaDA2's mixture of experts at the same width: dense first layer, then 4 experts (2 per token, groups of 2) and a
# shared one; partial RoPE over half of each 16-dim head, grouped-query attention.
TINY_LLADA2 = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "moe_intermediate_size": 32,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 4096,
    "initializer_range": 0.3,
}
# DiffusionGemma: the same width, 4 experts (2 per token), one sliding-window and one global layer, canvases of 16
# tokens; its vision tower (needed by the class, unused for text) as small as it goes.
TINY_DIFFUSION_GEMMA_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 16,
    "num_experts": 4,
    "top_k_experts": 2,
    "moe_intermediate_size": 32,
    "sliding_window": 64,
    "max_position_embeddings": 4096,
    "initializer_range": 0.3,
}
TINY_VISION = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "position_embedding_size": 64,
}
TINY_CANVAS = 16
_VERSION = 4  # bump when the checkpoints change


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer (one token per UTF-8 byte, 256 tokens) plus EOS, PAD and MASK, with a chat template."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=PAD,
        mask_token=MASK,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_models(directory: Union[str, os.PathLike], seed: int = 0) -> dict[str, str]:
    """Write the tiny MDM and Llama (with the tokenizer) under ``directory`` unless already there.

    Returns ``{"mdm": path, "llada2": path, "diffusion_gemma": path, "llama": path}``.
    """
    root = Path(directory)
    names = ("mdm", "llada2", "diffusion_gemma", "llama")
    paths = {name: root / name for name in names}
    stamp = root / "tiny_models.json"
    built = stamp.is_file() and json.loads(stamp.read_text()).get("version") == _VERSION
    if built and all(p.is_dir() for p in paths.values()):
        return {name: str(path) for name, path in paths.items()}
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (("eos", EOS), ("pad", PAD), ("mask", MASK))}
    vocab_size = len(tokenizer)
    torch.manual_seed(seed)
    mdm = MDMForMaskedDiffusion(
        MDMConfig(
            vocab_size=vocab_size,
            mask_token_id=ids["mask"],
            eos_token_id=ids["eos"],
            bos_token_id=ids["eos"],
            pad_token_id=ids["pad"],
            **TINY_SIZES,
        )
    )
    torch.manual_seed(seed)
    llada2 = LLaDA2MoeModelLM(
        LLaDA2MoeConfig(
            vocab_size=vocab_size,
            mask_token_id=ids["mask"],
            eos_token_id=ids["eos"],
            bos_token_id=ids["eos"],
            pad_token_id=ids["pad"],
            **TINY_LLADA2,
        )
    )
    torch.manual_seed(seed)
    special = dict(eos_token_id=ids["eos"], bos_token_id=ids["eos"], pad_token_id=ids["pad"])
    diffusion_gemma = DiffusionGemmaForBlockDiffusion(
        DiffusionGemmaConfig(
            text_config={"vocab_size": vocab_size, **special, **TINY_DIFFUSION_GEMMA_TEXT},
            vision_config=TINY_VISION,
            canvas_length=TINY_CANVAS,
            **special,
        )
    )
    torch.manual_seed(seed)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab_size,
            eos_token_id=ids["eos"],
            bos_token_id=ids["eos"],
            pad_token_id=ids["pad"],
            tie_word_embeddings=False,
            **TINY_SIZES,
        )
    )
    for name, model in (("mdm", mdm), ("llada2", llada2), ("diffusion_gemma", diffusion_gemma), ("llama", llama)):
        _speak_text(model, tokenizer)
        _save_atomically(model, tokenizer, paths[name])
    stamp.write_text(json.dumps({"version": _VERSION, "seed": seed}))
    return {name: str(path) for name, path in paths.items()}


@torch.no_grad()
def _speak_text(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> None:
    """Zero the output rows of every token but printable ASCII, newline and EOS, so that the untrained models
    write (random) text rather than invalid UTF-8 bytes; with the large initializer range it varies along the
    sequence, which gives stop strings something to find."""
    text_ids = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(chr(byte))[0]) for byte in [10, *range(32, 127)]]
    keep = torch.zeros(len(tokenizer), dtype=torch.bool)
    keep[text_ids + [tokenizer.eos_token_id]] = True
    model.get_output_embeddings().weight[~keep] = 0.0


def _save_atomically(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    """Save into a sibling temporary directory, then rename it into place (concurrent builders do not clash)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(path, ignore_errors=True)  # an outdated version
    try:
        os.replace(staging, path)
    except OSError:  # another process finished first: keep its copy
        shutil.rmtree(staging, ignore_errors=True)
