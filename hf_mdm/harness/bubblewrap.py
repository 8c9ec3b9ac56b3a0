"""The sandbox's operating-system layer: the command line that runs one program under bubblewrap (``bwrap``).

bubblewrap (https://github.com/containers/bubblewrap; Debian/Ubuntu ``apt-get install bubblewrap``, Fedora
``dnf install bubblewrap``) is the unprivileged sandboxing tool of Flatpak. Under it a program sees:

- a root file system that is an empty tmpfs holding, read-only, ``/usr`` (with ``/bin``, ``/sbin`` and ``/lib*`` as
  on the host: links or read-only binds), ``/etc/ld.so.cache``, and the folders of the Python installation that
  runs it (``sys.base_prefix``: for a pyenv or conda Python inside a home folder, only that folder); its own
  ``/proc``; a minimal ``/dev`` (null, zero, full, random, urandom, tty); and ``/tmp``, a private tmpfs of
  ``disk_bytes`` that is its working directory and its ``HOME``. Nothing else: no ``/home``, ``/root``, ``/etc``,
  ``/var``, ``/run``, ``/sys``, and no folder of the project or of the caller;
- new pid, network, IPC, UTS and cgroup namespaces: it sees only its own processes, every one of them dies when
  the program ends (the namespace's init exits), and its network is a loopback of its own (nothing outside it is
  reachable, nothing it listens on is reachable from outside);
- the unprivileged uid and gid 65534 (``nobody``) with no capabilities, killed when its parent dies
  (``--die-with-parent``); the sandbox starts bwrap in a new session (no controlling terminal). As root, bwrap runs
  without a user namespace (so that the read-only binds of a Python inside ``/root`` work) and the sandbox's bootstrap
  drops to 65534 with ``setresuid`` before it reads the program; as any other user, a user namespace maps uid 65534 on
  the caller (unprivileged already).

`locate` finds ``bwrap`` and the Python to run; `Bubblewrap.command` builds the command line. Whether the layer
works on this machine is probed once by `hf_mdm.harness.sandbox`, which refuses to run generated code where it does
not (saying what is missing), unless the user opts in to its process-level limits alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

__all__ = ["NOBODY", "WORKDIR", "INSTALL_HINT", "Bubblewrap", "locate"]

NOBODY = 65534
WORKDIR = "/tmp"
INSTALL_HINT = (
    "install bubblewrap (`make system-deps`, or Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: "
    "`sudo dnf install bubblewrap`); as a non-root user it also needs unprivileged user namespaces "
    "(Ubuntu 24.04: `sysctl kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile for bwrap)"
)
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class Bubblewrap:
    """How to run a program under bubblewrap on this machine.

    Attributes:
        executable: the ``bwrap`` binary.
        interpreter: the Python binary run inside (the base interpreter: the sandbox runs ``python -I -S``).
        binds: host folders bound read-only at the same path, beyond ``/usr``.
        links: ``(path, target)`` symbolic links to create (``/bin -> usr/bin`` on merged-/usr systems).
        as_root: bwrap is run by root: no user namespace, the bootstrap drops to `NOBODY` itself.
    """

    executable: str
    interpreter: str
    binds: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    as_root: bool

    def command(self, argv: Sequence[str], env: Mapping[str, str], disk_bytes: int) -> list[str]:
        """The bwrap command line running ``argv`` (its first element: `interpreter`) with environment ``env``."""
        cmd = [
            self.executable,
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--hostname",
            "sandbox",
            "--clearenv",
        ]
        if not self.as_root:
            cmd += ["--unshare-user", "--disable-userns", "--uid", str(NOBODY), "--gid", str(NOBODY)]
        cmd += ["--ro-bind", "/usr", "/usr"]
        for path, target in self.links:
            cmd += ["--symlink", target, path]
        made: set[str] = set()
        for folder in self.binds:
            for parent in reversed(Path(folder).parents):
                if str(parent) != "/" and str(parent) not in made:  # readable by NOBODY, unlike e.g. /root
                    made.add(str(parent))
                    cmd += ["--perms", "0755", "--dir", str(parent)]
            cmd += ["--ro-bind", folder, folder]
        cmd += [
            "--perms",
            "0755",
            "--dir",
            "/etc",
            "--ro-bind-try",
            "/etc/ld.so.cache",
            "/etc/ld.so.cache",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--perms",
            "1777",
            "--size",
            str(int(disk_bytes)),
            "--tmpfs",
            WORKDIR,
            "--chdir",
            WORKDIR,
        ]
        for name, value in env.items():
            cmd += ["--setenv", name, value]
        return cmd + ["--", *argv]


def locate() -> tuple[Optional[Bubblewrap], str]:
    """bubblewrap for this machine, or None and the reason (what is missing, how to install it).

    ``HF_MDM_BWRAP`` names the binary if it is not ``bwrap`` on ``PATH``."""
    executable = os.environ.get("HF_MDM_BWRAP") or shutil.which("bwrap")
    if not executable or not os.access(executable, os.X_OK):
        return None, f"bubblewrap is not installed (no `bwrap` on PATH): {INSTALL_HINT}"
    if not sys.platform.startswith("linux"):
        return None, "bubblewrap needs Linux"
    try:
        subprocess.run([executable, "--version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"`{executable} --version` failed ({error}): {INSTALL_HINT}"
    interpreter = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    folders = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(interpreter))}
    binds = tuple(sorted(f for f in folders if not _covered(f) and os.path.isdir(f)))
    links, extra = [], []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            extra.append(path)
    return Bubblewrap(executable, interpreter, _outermost(binds + tuple(extra)), tuple(links), os.geteuid() == 0), ""


def _covered(folder: str) -> bool:
    return folder == "/usr" or folder.startswith("/usr/") or folder == "/"


def _outermost(folders: Sequence[str]) -> tuple[str, ...]:
    """Drop folders inside another one of the list."""
    kept: list[str] = []
    for folder in sorted(set(folders), key=len):
        if not any(folder.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(folder)
    return tuple(sorted(kept))
