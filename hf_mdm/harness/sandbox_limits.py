"""Process limits of the sandbox (`hf_mdm.harness.sandbox`): resource limits, the count of a user's tasks, the
unprivileged user, the pids cgroup for root, and the warnings when a limit cannot be enforced."""

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


@lru_cache(maxsize=None)
def unprivileged_user() -> Optional[int]:
    """Under root: the uid of ``nobody`` if this interpreter runs as that user, else None."""
    if os.geteuid() != 0:
        return None
    try:
        probe = subprocess.run(
            [sys.executable, "-I", "-S", "-c", "pass"],
            user=NOBODY_UID,
            group=NOBODY_UID,
            extra_groups=[],
            cwd="/",
            env={"PATH": os.defpath},
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return NOBODY_UID if probe.returncode == 0 else None


_warned: set[str] = set()
_warn_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message)


def warn_unlimited_processes() -> None:
    warn_once(
        "nproc",
        f"Running generated code as root: the interpreter {sys.executable} is not usable by the user 'nobody' and no "
        "pids cgroup is writable, so the kernel does not enforce the process limit (RLIMIT_NPROC does not apply to "
        "root). Install bubblewrap or run as an unprivileged user for full protection.",
    )


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
