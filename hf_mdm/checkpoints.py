"""A checkpoint name checked before it is loaded: a local path that does not exist is said to be one.

``from_pretrained`` takes a local directory or a Hub id (``name`` or ``namespace/name``); a mistyped local path
would otherwise end in a Hub error ("Repo id must be in the form ..." or "couldn't connect to huggingface.co").
A name is taken as a local path when it cannot be a Hub id (it starts with ``/``, ``.`` or ``~``, or has more than
one ``/``) or when its first component is a local directory.

Trainer checkpoints are checked before a run resumes from them: ``resumable_checkpoint`` gives the newest
``checkpoint-<step>`` folder whose files all read (a save killed half-way leaves a cut ``model.safetensors`` or
no ``trainer_state.json``), warning about each newer one it skips.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any, Optional, Union

__all__ = ["looks_local", "check_local_path", "checkpoint_problem", "resumable_checkpoint"]

#: The Trainer's checkpoint folders, ``checkpoint-<step>``, and the file its save writes last.
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"


def looks_local(name: str) -> bool:
    """Whether ``name`` is meant as a local path rather than a Hub id (see the module docstring)."""
    if name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1:
        return True
    return "/" in name and Path(name.split("/")[0]).is_dir()


def check_local_path(name: Any, what: str = "pretrained") -> None:
    """A ValueError naming ``what`` when ``name`` is a local path that does not exist (with the nearest names in
    its folder); nothing for existing paths, Hub ids and loaded models."""
    if not isinstance(name, (str, os.PathLike)):
        return
    text = os.fspath(name)
    path = Path(text).expanduser()
    if path.exists() or not looks_local(text):
        return
    parent = next((p for p in path.parents if p.is_dir()), None)
    hint = ""
    if parent is not None:
        missing = path.relative_to(parent).parts[0]
        near = difflib.get_close_matches(missing, [p.name for p in parent.iterdir()], n=3, cutoff=0.6)
        hint = f"; {parent} has {', '.join(near)}" if near else f"; {parent} exists but has no {missing!r}"
    raise ValueError(f"{what}={text}: no such file or directory (a local path, not a Hub id{hint}): check the path")


def checkpoint_problem(folder: Union[str, os.PathLike]) -> Optional[str]:
    """Why a Trainer checkpoint folder cannot be resumed from (a missing ``trainer_state.json``, a file that does
    not read whole), or None when every file reads: JSON files parse, safetensors headers cover their files, torch
    files (``.pt``, ``.pth``, ``.bin``) are whole zip archives, and a sharded index's shards are there. Tensors
    are not loaded."""
    folder = Path(folder)
    if not (folder / TRAINER_STATE).is_file():
        return f"no {TRAINER_STATE} (its save did not finish)"
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        problem = _file_problem(path)
        if problem is not None:
            return f"{path.relative_to(folder)} {problem}"
    return None


def _file_problem(path: Path) -> Optional[str]:
    """Why one checkpoint file does not read whole, or None (files of other kinds are not checked)."""
    from safetensors import SafetensorError, safe_open

    try:
        if path.suffix == ".json":
            content = json.loads(path.read_text())
            if path.name.endswith(".index.json"):
                missing = sorted(set(content.get("weight_map", {}).values()) - {p.name for p in path.parent.iterdir()})
                return f"lists missing shards {missing}" if missing else None
        elif path.suffix == ".safetensors":
            with safe_open(str(path), "pt"):
                pass
        elif path.suffix in (".pt", ".pth", ".bin"):
            zipfile.ZipFile(path).close()
    except (ValueError, OSError, zipfile.BadZipFile, SafetensorError) as err:
        return f"does not read ({type(err).__name__}: {err})"
    return None


def resumable_checkpoint(output_dir: Union[str, os.PathLike]) -> Optional[tuple[str, int]]:
    """``(folder, step)`` of the newest ``checkpoint-<step>`` in ``output_dir`` that `checkpoint_problem` passes,
    or None (no folder, or none readable); each newer checkpoint skipped is named in a warning."""
    if not os.path.isdir(output_dir):
        return None
    found = [(int(m.group(1)), p) for p in Path(output_dir).iterdir() if (m := CHECKPOINT_NAME.match(p.name))]
    for step, folder in sorted((s, p) for s, p in found if p.is_dir())[::-1]:
        problem = checkpoint_problem(folder)
        if problem is None:
            return str(folder), step
        warnings.warn(
            f"skipping checkpoint {folder}: {problem}; resuming from an older checkpoint, or from scratch if none "
            "reads (delete the folder to silence this warning)",
            stacklevel=2,
        )
    return None
