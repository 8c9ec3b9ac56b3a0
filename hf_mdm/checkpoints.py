"""A checkpoint name checked before it is loaded: a local path that does not exist is said to be one.

``from_pretrained`` takes a local directory or a Hub id (``name`` or ``namespace/name``); a mistyped local path
would otherwise end in a Hub error ("Repo id must be in the form ..." or "couldn't connect to huggingface.co").
A name is taken as a local path when it cannot be a Hub id (it starts with ``/``, ``.`` or ``~``, or has more than
one ``/``) or when its first component is a local directory.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

__all__ = ["looks_local", "check_local_path"]


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
