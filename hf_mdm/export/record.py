"""What an exported folder records about itself: ``export.json`` (machine-readable) and ``README.md`` (for a person),
written beside the weights by `hf_mdm.export.export_for_serving`.

Both name the engine the folder targets and the release whose loader it was checked against, the command that serves
it, and how the weights were produced: the source checkpoint (its folder, base model and ``model_type``), whether a LoRA
adapter was merged into them, the dtype written, the notes on settings the engine takes differently, and the hf_mdm
version that wrote it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Optional

RECORD, README = "export.json", "README.md"


def export_record(
    checkpoint: Any, target: str, engine_version: str, launch: list[str], dtype: str, notes: list[str]
) -> dict[str, Any]:
    """The record of one export: ``checkpoint`` an `hf_mdm.export.source.Checkpoint`, ``launch`` the argv that serves
    the folder."""
    from .. import __version__

    adapter: Optional[Path] = checkpoint.adapter
    return {
        "target": target,
        "engine_version": engine_version,
        "launch": launch,
        "source": {
            "checkpoint": str(checkpoint.folder),
            "base_model": str(checkpoint.base),
            "model_type": checkpoint.model_type,
            "lora_adapter": None if adapter is None else str(adapter),
            "lora_merged": adapter is not None,
        },
        "dtype": dtype,
        "notes": list(notes),
        "hf_mdm_version": __version__,
    }


def readme_text(record: dict[str, Any]) -> str:
    """``README.md`` of the exported folder: the record in prose."""
    source = record["source"]
    merged = f"with the LoRA adapter {source['lora_adapter']} merged into it" if source["lora_merged"] else "as saved"
    lines = [
        f"# Exported for {record['target']} {record['engine_version']}",
        "",
        f"Checked against the loader of {record['target']} {record['engine_version']}; serve it with:",
        "",
        "```bash",
        shlex.join(record["launch"]),
        "```",
        "",
        f"Weights: {source['base_model']} ({source['model_type']}), {merged}; dtype {record['dtype']}.",
        f"Written by hf_mdm {record['hf_mdm_version']} (`hf-mdm export`); the same facts are in {RECORD}.",
    ]
    if record["notes"]:
        lines += ["", "Notes:", "", *[f"- {note}" for note in record["notes"]]]
    return "\n".join(lines) + "\n"


def write_record(folder: Path, record: dict[str, Any]) -> None:
    """``export.json`` and ``README.md`` into ``folder`` (a folder being written atomically)."""
    (folder / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    (folder / README).write_text(readme_text(record), encoding="utf-8")
