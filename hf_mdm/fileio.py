"""Atomic file writes: a reader never sees a half-written output, and an interrupted run leaves no partial file.

Outputs get the modes of a plain ``open`` / ``mkdir`` (``0o666`` and ``0o777`` less the umask), and their data is
on disk (``fsync``) before the rename that makes them visible, so a crash right after leaves the old or the new
output, never an empty one. `read_yaml` is the one reader of the YAML configs (experiments, compare, tune spaces):
a file that does not parse is one line naming it and where it breaks.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Union

#: Modes new outputs are created with, less the process's umask (as ``open`` and ``mkdir`` do).
FILE_MODE, FOLDER_MODE = 0o666, 0o777


def write_atomic(path: Union[str, os.PathLike], data: Union[str, bytes]) -> None:
    """Write ``data`` (text or bytes) to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temporary(path, lambda name: os.open(name, _CREATE_FLAGS, FILE_MODE))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data if isinstance(data, bytes) else data.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def write_directory_atomic(path: Union[str, os.PathLike], write: Callable[[Path], None]) -> None:
    """``write(folder)`` into a temporary folder beside ``path``, then put it in place of ``path``: an interrupted
    write leaves the previous ``path`` (if any) whole and no partial folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _, tmp = _create_temporary(path, lambda name: os.mkdir(name, FOLDER_MODE))
    tmp = Path(tmp)
    try:
        write(tmp)
        _fsync_tree(tmp)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_folder(path.parent)


_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)


def _create_temporary(path: Path, create: Callable[[str], object]) -> tuple[object, str]:
    """``(create(name), name)`` for a fresh hidden name beside ``path``; ``create`` fails on an existing name (as
    ``os.open`` with ``O_EXCL`` and ``os.mkdir`` do), and the mode it passes is reduced by the umask."""
    for _ in range(100):
        name = str(path.parent / f".{path.name}.{secrets.token_hex(4)}")
        try:
            return create(name), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}: remove the .{path.name}.* files there")


def _fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder`` to disk, then the folders themselves (not on Windows, where a file opened
    for reading cannot be synced)."""
    if os.name == "nt":
        return
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_folder(Path(root))


def _fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename into it) to disk; a no-op where folders cannot be opened (Windows) or
    synced (some file systems)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_yaml(path: Union[str, os.PathLike], what: str = "config") -> object:
    """The YAML document of ``path`` (None when empty); a missing file or one that does not parse is a one-line
    ValueError naming the file, and the line, column and problem where its YAML breaks."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no {what} at {path}: check the path")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{path}: not valid YAML{where} ({problem}): fix the indentation or syntax there") from None
