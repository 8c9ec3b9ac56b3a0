"""The sandbox's second layer inside the child: the bootstrap that sets the limits, installs the Python-level guard
and then reads and runs the program (`hf_mdm.harness.sandbox`), or, for a verdict decided on the trusted side, runs
the worker that executes the program and answers calls (`hf_mdm.harness.verdict`). The guard disables destructive
and process-creating functions and blocks a few modules: a convenience against the accidents of generated code, not a
boundary (a program can undo it from inside Python); the operating-system layer is the boundary."""

from __future__ import annotations

# Runs in the child, before the program: limits, guard, then the program read from stdin. Self-contained.
BOOTSTRAP = r"""
import json, os, resource, sys
settings = json.loads(sys.argv[1])
if settings["drop_to"] is not None:  # root under bubblewrap: become the unprivileged user before anything else
    os.setgroups([])
    os.setresgid(settings["drop_to"], settings["drop_to"], settings["drop_to"])
    os.setresuid(settings["drop_to"], settings["drop_to"], settings["drop_to"])
if settings["nproc_inside"] is not None:  # a user namespace counts only its own tasks: those visible now
    tasks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            tasks += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    settings["rlimits"]["RLIMIT_NPROC"] = [tasks + settings["nproc_inside"]] * 2
for name, value in settings["rlimits"].items():
    resource.setrlimit(getattr(resource, name), tuple(value))
_exit, _stdout, _stderr, _write = os._exit, sys.stdout, sys.stderr, os.write
if settings["serve"] is None:
    source = sys.stdin.read()
else:  # a worker for the trusted side: requests on a private copy of stdin, the program's own stdin empty
    _requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    import json
if settings["guard"]:
    import builtins, faulthandler, posix, shutil, subprocess
    faulthandler.disable()
    for module in (os, posix):
        for name in settings["disabled_os"]:
            if hasattr(module, name):
                setattr(module, name, None)
    for name in settings["disabled_shutil"]:
        setattr(shutil, name, None)
    for name in settings["disabled_subprocess"]:
        setattr(subprocess, name, None)
    for name in settings["blocked_modules"]:
        sys.modules[name] = None
    builtins.exit = builtins.quit = None
    import io
    _root, _open, _os_open = os.path.realpath(os.getcwd()), io.open, posix.open
    _write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def _inside(path):
        if isinstance(path, int):
            return True
        real = os.path.realpath(os.fspath(path))
        return real == _root or real.startswith(_root + os.sep)

    def _guarded_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and not _inside(file):
            raise PermissionError(f"the sandbox writes only inside its working directory: {file!r}")
        return _open(file, mode, *args, **kwargs)

    def _guarded_os_open(path, flags, *args, **kwargs):
        if flags & _write_flags and not _inside(path):
            raise PermissionError(f"the sandbox writes only inside its working directory: {path!r}")
        return _os_open(path, flags, *args, **kwargs)

    builtins.open = io.open = _guarded_open
    os.open = posix.open = _guarded_os_open
if settings["serve"] is not None:
    def _reply(line, fd=settings["reply_fd"]):
        data = (line + "\n").encode("ascii")
        while data:
            data = data[_write(fd, data):]

    _worker = {"requests": _requests, "reply": _reply, "stderr": _stderr, "MAX_DEPTH": settings["max_depth"]}
    try:
        exec(settings["serve"], _worker)
    finally:
        _stdout.flush(); _stderr.flush(); _exit(0)
try:
    exec(compile(source, "<program>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except BaseException:
    try:
        import traceback
        traceback.print_exc(file=_stderr)
    finally:
        _stdout.flush(); _stderr.flush(); _exit(1)
_stdout.flush(); _stderr.flush(); _exit(0)
"""

DISABLED_OS = (
    "kill",
    "killpg",
    "system",
    "popen",
    "fork",
    "forkpty",
    "vfork",
    "execl",
    "execle",
    "execlp",
    "execlpe",
    "execv",
    "execve",
    "execvp",
    "execvpe",
    "spawnl",
    "spawnle",
    "spawnlp",
    "spawnlpe",
    "spawnv",
    "spawnve",
    "spawnvp",
    "spawnvpe",
    "posix_spawn",
    "posix_spawnp",
    "pidfd_open",
    "remove",
    "unlink",
    "rmdir",
    "removedirs",
    "rename",
    "renames",
    "replace",
    "truncate",
    "ftruncate",
    "link",
    "symlink",
    "chmod",
    "fchmod",
    "lchmod",
    "chown",
    "fchown",
    "lchown",
    "chroot",
    "chdir",
    "fchdir",
    "mkfifo",
    "mknod",
    "putenv",
    "unsetenv",
    "setuid",
    "setgid",
    "seteuid",
    "setegid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "setsid",
    "setpgid",
    "setpgrp",
    "nice",
    "plock",
    "_exit",
    "abort",
)
DISABLED_SHUTIL = ("rmtree", "move", "chown")
DISABLED_SUBPROCESS = (
    "Popen",
    "run",
    "call",
    "check_call",
    "check_output",
    "getoutput",
    "getstatusoutput",
    "_fork_exec",
    "_posixsubprocess",
)
BLOCKED_MODULES = ("ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "pty", "resource", "socket", "_socket")
