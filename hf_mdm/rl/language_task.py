"""A synthetic language as a GRPO task: its tokenizer and its prompt dataset.

A model trained on a synthetic language (`hf_mdm.training.mdm_config_for`) generates sequences of exactly L
tokens from nothing: its ids are the language's tokens 0..V-1 and [MASK] = V. GRPO on it needs what TRL needs of
any task: a tokenizer (`language_tokenizer`: one word ``t<i>`` per token, [MASK] as the padding, no EOS) and a
dataset with a ``prompt`` column (`language_prompts`: empty prompts, one row per rollout group).
"""

from __future__ import annotations

from typing import Optional

import datasets
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

__all__ = ["language_tokenizer", "language_prompts"]

MASK = "[MASK]"


def language_tokenizer(vocab_size: int, mask_id: Optional[int] = None) -> PreTrainedTokenizerFast:
    """Token i is the word ``t<i>``; [MASK] (id ``mask_id``, default ``vocab_size``) is the mask and the padding."""
    mask_id = vocab_size if mask_id is None else int(mask_id)
    vocab = {f"t{i}": i for i in range(max(vocab_size, mask_id + 1)) if i != mask_id} | {MASK: mask_id}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=MASK))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, mask_token=MASK, pad_token=MASK, unk_token=MASK)


def language_prompts(rows: int) -> datasets.Dataset:
    """``rows`` empty prompts (the model generates a whole sequence)."""
    return datasets.Dataset.from_dict({"prompt": [""] * rows})
