"""Process limits of the sandbox (`hf_mdm.harness.sandbox`): resource limits, the count of a user's tasks, an
interpreter the unprivileged user can run (generated code never runs as root), the pids cgroup for root, and the
warnings."""

from __future__ import annotations

import logging
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from . import bubblewrap

logger = logging.getLogger("hf_mdm.harness.sandbox")

NOBODY_UID = bubblewrap.NOBODY
CGROUP_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))


def user_namespace_counts_own_tasks() -> bool:
    """Since Linux 5.14, RLIMIT_NPROC inside a user namespace counts the tasks of that namespace only."""
    try:
        major, minor = (int(part) for part in platform.release().split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def rlimits(limits: Any, tasks_now: Optional[int]) -> dict[str, tuple[int, int]]:
    import resource

    rlimits = {
        "RLIMIT_CPU": (limits.cpu_time_s, limits.cpu_time_s + 1),
        "RLIMIT_AS": (limits.memory_bytes, limits.memory_bytes),
        "RLIMIT_FSIZE": (limits.max_file_bytes, limits.max_file_bytes),
        "RLIMIT_NOFILE": (limits.max_open_files, limits.max_open_files),
        "RLIMIT_CORE": (0, 0),
    }
    if tasks_now is not None:
        nproc = tasks_now + limits.max_processes
        current = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        if current != resource.RLIM_INFINITY:
            nproc = min(nproc, current)
        rlimits["RLIMIT_NPROC"] = (nproc, nproc)
    return rlimits


def tasks_of_user(uid: int) -> Optional[int]:
    """Tasks (processes and threads) whose real uid is ``uid``: what RLIMIT_NPROC counts. None off Linux."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = dict(line.split(":", 1) for line in (entry / "status").read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1").strip() or 1)
    return total


def interpreter_candidates() -> list[str]:
    """Pythons that may run generated code under the process layer: this one, its base interpreter, and the system's
    (``python3`` on the default ``PATH``), without repeats."""
    found = [sys.executable, getattr(sys, "_base_executable", "") or ""]
    found += [os.path.join(folder, "python3") for folder in os.defpath.split(os.pathsep) if folder]
    unique: list[str] = []
    for path in found:
        if path and os.path.isfile(path) and os.path.realpath(path) not in map(os.path.realpath, unique):
            unique.append(path)
    return unique


@lru_cache(maxsize=None)
def unprivileged_interpreter() -> Optional[str]:
    """Under root: the first of `interpreter_candidates` that the user ``nobody`` can run (Python 3.8 or newer), else
    None. The bootstrap needs the standard library only, so any such interpreter will do."""
    if os.geteuid() != 0:
        return None
    for interpreter in interpreter_candidates():
        try:
            probe = subprocess.run(
                [interpreter, "-I", "-S", "-c", "import sys, json, resource; assert sys.version_info >= (3, 8)"],
                user=NOBODY_UID,
                group=NOBODY_UID,
                extra_groups=[],
                cwd="/",
                env={"PATH": os.defpath},
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return interpreter
    return None


def process_layer_interpreter() -> tuple[str, Optional[int]]:
    """The Python and the uid that run programs under the process layer alone: as root, an interpreter that the user
    ``nobody`` can run, and that user; a RuntimeError when there is none (generated code never runs as root)."""
    if os.geteuid() != 0:
        return sys.executable, None
    found = unprivileged_interpreter()
    if found is None:
        raise RuntimeError(
            "Refusing to run generated code as root: no Python interpreter here can be run by the unprivileged user "
            f"'nobody' (uid {NOBODY_UID}); tried {', '.join(interpreter_candidates())}. "
            "Install bubblewrap (`make system-deps`), install a system Python (e.g. `apt-get install python3`), "
            "or run as an unprivileged user."
        )
    return found, NOBODY_UID


_warned: set[str] = set()
_warn_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message)


class PidsCgroup:
    """A pids cgroup (v1 ``/sys/fs/cgroup/pids`` or v2 with the pids controller) capping one program's tasks."""

    _counter = 0
    _lock = threading.Lock()

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, max_tasks: int) -> Optional["PidsCgroup"]:
        with cls._lock:
            cls._counter += 1
            name = f"hf_mdm_sandbox_{os.getpid()}_{cls._counter}"
        for root in CGROUP_ROOTS:
            if not (root / "cgroup.procs").exists():
                continue
            path = root / name
            try:
                path.mkdir()
            except OSError:
                continue
            try:
                (path / "pids.max").write_text(str(max_tasks))
                return cls(path)
            except OSError:
                path.rmdir()
        return None

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def destroy(self) -> None:
        """Kill every task left in the cgroup, then remove it."""
        for _ in range(100):
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.01)
        logger.warning("could not remove the sandbox cgroup %s", self.path)
