"""Atomic writes (`hf_mdm.fileio`): files and folders get the modes the umask gives, the data is synced before the
rename, and an interrupted write leaves nothing behind."""

import os
import stat
from pathlib import Path
from unittest import mock

import pytest

from hf_mdm.fileio import write_atomic, write_directory_atomic


@pytest.fixture(params=[0o022, 0o077])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_writes_honour_the_umask(tmp_path, umask):
    write_atomic(tmp_path / "a.json", "{}")
    write_atomic(tmp_path / "a.json", b"{}")  # replacing keeps the umask's mode too
    write_directory_atomic(tmp_path / "folder", lambda folder: (folder / "x.txt").write_text("x"))
    write_directory_atomic(tmp_path / "folder", lambda folder: (folder / "y.txt").write_text("y"))
    assert _mode(tmp_path / "a.json") == 0o666 & ~umask
    assert _mode(tmp_path / "folder") == 0o777 & ~umask
    assert _mode(tmp_path / "folder" / "y.txt") == 0o666 & ~umask
    assert (tmp_path / "a.json").read_text() == "{}" and not (tmp_path / "folder" / "x.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "folder"]  # no temporary left


def test_atomic_write_syncs_before_the_rename(tmp_path):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    with (
        mock.patch("os.fsync", side_effect=lambda fd: events.append("fsync") or real_fsync(fd)),
        mock.patch("os.replace", side_effect=lambda a, b: events.append("replace") or real_replace(a, b)),
    ):
        write_atomic(tmp_path / "a.txt", "x")
    assert events[:2] == ["fsync", "replace"] and events.count("fsync") >= 1


def test_an_interrupted_atomic_write_leaves_nothing(tmp_path):
    def fail(folder):
        (folder / "half").write_text("x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_directory_atomic(tmp_path / "out", fail)
    assert list(tmp_path.iterdir()) == []
