"""Prompt/response pairs for supervised fine-tuning: loaded with `datasets`, tokenised once with the chat template.

A source is a local file (``.jsonl``, ``.json``, ``.csv``, ``.parquet``), a directory written by
``Dataset.save_to_disk``, or a dataset on the Hub (``name`` or ``name:config``). Each row holds either ``prompt``
and ``response`` columns (other names with ``prompt_column`` / ``response_column``) or a ``messages`` column (a
chat: the last message, the assistant's, is the response; the ones before it the prompt). A file without rows, a
JSON line that does not parse (named by file and line) and a file the loader cannot read are ValueErrors.

Tokenisation (`tokenize_pairs`): with a chat template, the prompt is the template applied to the prompt messages
with the generation prompt, and the sequence the template applied to the whole chat; the response is what the
sequence adds to the prompt (a ValueError when the template does not extend the prompt, e.g. one that rewrites
earlier turns). Without a template the sequence is the prompt's tokens then the response's then EOS. Rows longer
than ``max_length`` are cut at the end (the prompt is kept whole; a row whose prompt alone is too long is dropped,
and the number dropped is logged). A malformed row is refused, not skipped: a ValueError naming the source and
the row (1-based) for a row without the columns, a null prompt, response or message content, or a chat that does
not end with the assistant's message.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any, Optional

from datasets import Dataset, load_dataset, load_from_disk
from datasets.exceptions import DatasetGenerationError

logger = logging.getLogger(__name__)

__all__ = ["load_pairs", "tokenize_pairs", "FILE_FORMATS"]

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def load_pairs(source: str, split: str = "train") -> Dataset:
    """The dataset of ``source`` (see the module docstring), its ``split`` for a Hub dataset."""
    path = Path(source)
    if path.is_dir():
        loaded = load_from_disk(str(path))
        return _with_rows(loaded[split] if hasattr(loaded, "keys") else loaded, source)
    if path.suffix in FILE_FORMATS:
        if not path.exists():
            raise FileNotFoundError(f"no such data file: {source}")
        return _load_file(path)
    name, _, config = source.partition(":")
    return load_dataset(name, config or None, split=split)


def _with_rows(dataset: Dataset, source: Any) -> Dataset:
    """``dataset``, or a ValueError naming ``source`` when it has no rows."""
    if len(dataset) == 0:
        raise ValueError(f"{source}: no rows: give it prompt/response (or messages) rows")
    return dataset


def _load_file(path: Path) -> Dataset:
    """A local file's rows; a ValueError naming the file (and for JSON the line) when it has none or does not read."""
    kind = FILE_FORMATS[path.suffix]
    if not _has_rows(path, header=kind == "csv"):  # datasets fails on a file without rows before it returns one
        return _with_rows(Dataset.from_dict({}), path)
    try:
        return _with_rows(load_dataset(kind, data_files=str(path), split="train"), path)
    except (ValueError, DatasetGenerationError, StopIteration) as error:
        problem = _json_problem(path) if kind == "json" else None
        reason = (str(error.__cause__ or error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(problem or f"{path}: not readable as {kind} ({reason}): check the file's format") from None


def _has_rows(path: Path, header: bool) -> bool:
    """Whether ``path`` has a non-blank line (after a CSV's header); a binary file (parquet): whether it is not
    empty."""
    if FILE_FORMATS[path.suffix] == "parquet":
        return path.stat().st_size > 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = (line for line in handle if line.strip())
        return next(itertools.islice(lines, int(header), None), None) is not None


def _json_problem(path: Path) -> Optional[str]:
    """Where a JSON-lines file (or a ``.json`` document) stops parsing: its first line that is not a JSON object,
    with the file and line number; None when it parses."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                if number == 1 and path.suffix == ".json":
                    break  # one document over several lines: parsed whole below
                return f"{path} line {number}: not valid JSON ({error.msg}, column {error.colno}): fix or remove it"
            if not isinstance(row, dict):
                return f"{path} line {number}: a row must be a JSON object, got {type(row).__name__}"
        else:
            return None
    try:
        json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as error:
        return f"{path} line {error.lineno}: not valid JSON ({error.msg}, column {error.colno}): fix it"
    return None


def _chat(row: dict[str, Any], prompt_column: str, response_column: str) -> list[dict[str, str]]:
    if "messages" in row and row["messages"]:
        messages = list(row["messages"])
        if messages[-1].get("role") != "assistant":
            raise ValueError("a chat's last message must be the assistant's (the response to learn)")
        for number, message in enumerate(messages, 1):
            if message.get("content") is None:
                raise ValueError(f"message {number}'s content is null: give it text or remove the row")
        return messages
    if prompt_column not in row or response_column not in row:
        raise ValueError(
            f"a row needs '{prompt_column}' and '{response_column}' columns or a 'messages' column; it has "
            f"{sorted(row)}: name the columns with prompt_column= / response_column="
        )
    for column in (prompt_column, response_column):
        if row[column] is None:
            raise ValueError(f"'{column}' is null: give the row a {column} or remove it")
    return [{"role": "user", "content": row[prompt_column]}, {"role": "assistant", "content": row[response_column]}]


def encode_pair(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], int]:
    """(sequence ids, prompt length) of one chat (see the module docstring)."""
    if getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True)
        whole = tokenizer.apply_chat_template(messages, tokenize=True)
        prompt, whole = _ids(prompt), _ids(whole)
        if whole[: len(prompt)] != prompt or len(whole) == len(prompt):
            raise ValueError("the chat template does not extend the prompt with the response: use a template that does")
        return whole, len(prompt)
    text = "\n".join(message["content"] for message in messages[:-1])
    prompt = tokenizer(text, add_special_tokens=True)["input_ids"]
    response = tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
    return prompt + response + [tokenizer.eos_token_id], len(prompt)


def _ids(encoded: Any) -> list[int]:
    """Token ids from what ``apply_chat_template(tokenize=True)`` returns (a list, or a mapping on newer releases)."""
    if hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    return list(encoded)


def tokenize_pairs(
    dataset: Dataset,
    tokenizer: Any,
    max_length: Optional[int] = None,
    prompt_column: str = "prompt",
    response_column: str = "response",
    source: Optional[str] = None,
) -> Dataset:
    """``input_ids`` and ``prompt_length`` for every row (``dataset.map``, cached by `datasets`), rows cut to
    ``max_length``; rows whose prompt leaves no room for a response are dropped (logged). A malformed row is a
    ValueError naming ``source`` (the data's name, e.g. its file) and the row."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token_id: SFT pads and ends responses with EOS")

    def encode(row: dict[str, Any], index: int) -> dict[str, Any]:
        try:
            ids, prompt = encode_pair(tokenizer, _chat(row, prompt_column, response_column))
        except ValueError as error:
            raise ValueError(f"{source or 'the data'} row {index + 1}: {error}") from None
        if max_length is not None:
            ids = ids[:max_length]
        return {"input_ids": ids, "prompt_length": prompt}

    encoded = dataset.map(encode, with_indices=True, remove_columns=dataset.column_names, desc="tokenising pairs")
    kept = encoded.filter(lambda row: row["prompt_length"] < len(row["input_ids"]), desc="dropping long prompts")
    if len(kept) < len(encoded):
        logger.warning(
            "dropped %d of %d rows whose prompt fills max_length=%s", len(encoded) - len(kept), len(encoded), max_length
        )
    if len(kept) == 0:
        raise ValueError(f"no row has room for a response within max_length={max_length}: raise max_length")
    return kept
