"""What the fine-tuning tests train: `models_by_class`, a tiny model of every class (MDM, LLaDA, Dream, LLaDA2.0)
with `EOS` its end-of-sequence id, and `write_pairs`, a JSONL file of prompt/response pairs."""

from __future__ import annotations

import json
from pathlib import Path

import llada2_tiny
import torch
from native_checkpoints import tiny_config
from tiny_mdm import tiny_mdm
from transformers import AutoConfig, AutoModelForMaskedLM

EOS = 3


def models_by_class() -> dict[str, torch.nn.Module]:
    """A tiny model of every class: MDM, LLaDA, Dream (logits shift 1), LLaDA2.0 (block-causal, blocks of 8)."""
    out = {"mdm": tiny_mdm(vocab_size=64, mask_token_id=63)}
    for arch in ("llada", "dream"):
        config = AutoConfig.for_model(**tiny_config(arch))
        torch.manual_seed(0)
        out[arch] = AutoModelForMaskedLM.from_config(config).eval()
    config = AutoConfig.for_model(
        **llada2_tiny.CONFIGS["llada2_moe"], mask_token_id=llada2_tiny.MASK_ID, eos_token_id=EOS, block_size=8
    )
    torch.manual_seed(0)
    out["llada2"] = AutoModelForMaskedLM.from_config(config).eval()
    return out


def write_pairs(path: Path, count: int = 24) -> Path:
    with open(path, "w") as handle:
        for i in range(count):
            handle.write(json.dumps({"prompt": f"What is {i} + {i}?", "response": f"{2 * i}."}) + "\n")
    return path
