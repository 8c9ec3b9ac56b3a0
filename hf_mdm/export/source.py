"""The checkpoint an export starts from: a model folder as hf_mdm saves it, or a LoRA adapter folder merged into its
base model; and the files beside the weights (tokenizer, generation config) that travel with it.

A model folder holds ``config.json`` and the weights (``model.safetensors`` or shards with their index). A LoRA
folder holds ``adapter_config.json`` and ``adapter_model.safetensors`` (what ``hf-mdm sft --lora`` writes through
PEFT), its ``base_model_name_or_path`` naming the base checkpoint; `load_model` loads the base, applies the adapter
and merges it into the weights (PEFT's ``merge_and_unload``), so the export holds plain weights.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

__all__ = ["Checkpoint", "read_checkpoint", "load_model", "copy_side_files", "ensure_shard_index"]

#: The files of a tokenizer (or processor) a serving engine reads from the model folder, copied when present.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
)
ADAPTER_CONFIG, CONFIG, GENERATION_CONFIG = "adapter_config.json", "config.json", "generation_config.json"
SAFE_WEIGHTS, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint to export: ``folder`` as given, ``base`` the model folder (``folder`` itself, or the base model
    of the LoRA adapter in ``folder``), ``adapter`` the adapter folder or None, ``config`` the base's
    ``config.json``."""

    folder: Path
    base: Path
    adapter: Optional[Path]
    config: dict

    @property
    def model_type(self) -> Optional[str]:
        return self.config.get("model_type")


def _read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path``; a one-line ValueError when it does not parse."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: the {what} does not read ({type(err).__name__}: {err}): check the file") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path}: the {what} is not a JSON object: check the file")
    return content


def read_checkpoint(name: str) -> Checkpoint:
    """The checkpoint in the folder ``name`` (a model folder, or a LoRA adapter folder whose base model folder
    exists); a one-line ValueError for anything else. Nothing is loaded but the JSON configs."""
    from ..checkpoints import check_local_path

    check_local_path(name, "--model")
    folder = Path(name).expanduser()
    if not folder.is_dir():
        raise ValueError(f"--model {name}: not a folder (export reads a checkpoint folder as hf_mdm saves it)")
    if (folder / ADAPTER_CONFIG).is_file():
        adapter = _read_json(folder / ADAPTER_CONFIG, "LoRA adapter config")
        base_name = adapter.get("base_model_name_or_path")
        if not base_name:
            raise ValueError(
                f"{folder / ADAPTER_CONFIG} names no base model (base_model_name_or_path): set it to the folder of "
                "the model the adapter was trained on"
            )
        base = Path(base_name).expanduser()
        if not (base / CONFIG).is_file():
            raise ValueError(
                f"--model {name} is a LoRA adapter whose base model {base_name} is not a local checkpoint folder "
                f"(no {base / CONFIG}): set base_model_name_or_path in {folder / ADAPTER_CONFIG} to the base model's "
                "folder (download it first if it is a Hub id)"
            )
        return Checkpoint(folder, base, folder, _read_json(base / CONFIG, "base model's config"))
    if not (folder / CONFIG).is_file():
        raise ValueError(
            f"--model {name}: not a checkpoint (no {CONFIG}, nor {ADAPTER_CONFIG} of a LoRA adapter): pass the "
            "folder a training run saved its model in"
        )
    return Checkpoint(folder, folder, None, _read_json(folder / CONFIG, "model config"))


def load_model(checkpoint: Checkpoint, model_class: Any, dtype: str = "auto") -> Any:
    """The checkpoint as ``model_class`` in ``dtype`` (``"auto"``: the saved one), in eval mode, with its LoRA
    adapter merged into the weights when it has one; loading errors become one-line ValueErrors."""
    try:
        model = model_class.from_pretrained(checkpoint.base, dtype=dtype)
    except (OSError, KeyError, RuntimeError) as err:
        reason = (str(err).strip().splitlines() or [""])[0]
        raise ValueError(
            f"{checkpoint.base}: the model does not load as {model_class.__name__} ({type(err).__name__}: {reason}): "
            "check that the folder holds a whole checkpoint"
        ) from None
    if checkpoint.adapter is not None:
        from peft import PeftModel

        try:
            model = PeftModel.from_pretrained(model, checkpoint.adapter).merge_and_unload()
        except (OSError, KeyError, RuntimeError, ValueError) as err:
            reason = (str(err).strip().splitlines() or [""])[0]
            raise ValueError(
                f"{checkpoint.adapter}: the LoRA adapter does not apply to its base model {checkpoint.base} "
                f"({type(err).__name__}: {reason}): check that it was trained on that model"
            ) from None
    return model.eval()


def copy_side_files(checkpoint: Checkpoint, folder: Path) -> list[str]:
    """Copy the tokenizer files and ``generation_config.json`` into ``folder`` (the adapter folder's own first, then
    the base model's), replacing what ``save_pretrained`` wrote; returns the names copied."""
    sources = [checkpoint.folder] if checkpoint.adapter is None else [checkpoint.adapter, checkpoint.base]
    copied = []
    for name in (*TOKENIZER_FILES, GENERATION_CONFIG):
        found = next((source / name for source in sources if (source / name).is_file()), None)
        if found is not None:
            shutil.copyfile(found, folder / name)
            copied.append(name)
    return copied


def ensure_shard_index(folder: Path) -> None:
    """Give a folder whose weights ``save_pretrained`` wrote as one ``model.safetensors`` (no shard index, as
    transformers does when they fit one shard) the index a sharded save has: every tensor name mapped to that
    file, and the bytes of tensor data as ``total_size``."""
    single = folder / SAFE_WEIGHTS
    if (folder / SAFE_INDEX).exists() or not single.is_file():
        return
    from safetensors import safe_open

    with safe_open(str(single), "pt") as handle:
        names = list(handle.keys())
    with open(single, "rb") as raw:
        header = int.from_bytes(raw.read(8), "little")
    index = {
        "metadata": {"total_size": single.stat().st_size - 8 - header},
        "weight_map": {name: SAFE_WEIGHTS for name in sorted(names)},
    }
    (folder / SAFE_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
