"""Run generated Python programs in a separate, isolated, limited process (the only place hf_mdm executes model output).

Code execution is opt-in twice: the environment variable ``HF_ALLOW_CODE_EVAL=1`` (checked here, before anything
runs) and lm-eval's ``--confirm_run_unsafe_code`` (checked by lm-eval for tasks with ``unsafe_code: true``).

Two layers protect the machine; every result says which ran (`ExecutionResult.layer`, ``"layer"`` in lm-eval's
samples log, ``results["sandbox"]`` in the results JSON):

1. Operating-system isolation, ``layer="bubblewrap"`` (`hf_mdm.harness.bubblewrap`): the program runs under
   bubblewrap with no network, no view of other processes, of the caller's environment or of any file but a
   read-only Python installation and ``/usr``, a private size-limited ``/tmp`` as working directory and home, and
   the unprivileged uid 65534. Used whenever ``bwrap`` is installed and works here (probed once); otherwise code
   execution is refused with an error that says what is missing and how to install it (``make system-deps``),
   unless the user opts in with ``HF_MDM_ALLOW_UNISOLATED_EXECUTION=1`` (``allow_unisolated_execution=True``):
   then programs run with layer 2 alone (``layer="process"``) and a warning says once what that means.
   ``HF_MDM_SANDBOX_ISOLATION=process`` asks for layer 2 alone (with the same opt-in).
2. Process limits and a guard (both layers): each program runs in its own fresh interpreter (``python -I -S``:
   isolated mode, standard library only), started with:

   - an empty temporary working directory (removed afterwards) and a minimal environment (PATH, LANG, HOME and
     TMPDIR pointing at that directory);
   - wall-clock and CPU-time limits (the process group is killed at the wall limit; RLIMIT_CPU sends SIGXCPU,
     then SIGKILL a second later), an address-space limit (RLIMIT_AS), a file-size limit (RLIMIT_FSIZE, which
     also caps what the program prints) and an open-files limit, all set with soft = hard so the program cannot
     raise them;
   - a process-count limit: RLIMIT_NPROC (tasks of the user: counted now, plus ``max_processes``; in bubblewrap's
     user namespace, its own tasks). Generated code never runs as root: under root it runs as the unprivileged
     user ``nobody`` (with layer 1 always; with layer 2 alone, in the first Python that user can run, e.g.
     ``/usr/bin/python3``, or not at all), and with layer 2 alone also inside a pids cgroup
     (``pids.max = max_processes``) when the cgroup file system is writable;
   - a new session (process group); afterwards the whole group, and every process left in the cgroup, is killed;
   - a guard, installed before the program's first line: destructive and process-creating functions of ``os``,
     ``posix``, ``shutil`` and ``subprocess`` are set to None (``os.kill``, ``os.system``, ``os.remove``,
     ``os.unlink``, ``os.rmdir``, ``os.rename``, ``os.fork``, ``os.exec*``, ``os.spawn*``, ``os.setuid``,
     ``os._exit``, ``shutil.rmtree``, ``shutil.move``, ``subprocess.Popen``, ...), and ``ctypes``,
     ``_posixsubprocess``, ``multiprocessing``, ``pty``, ``resource`` and ``socket`` cannot be imported; ``open``
     and ``os.open`` refuse to write outside the working directory.

The guard is a convenience against the accidents of generated code (a stray ``shutil.rmtree``), not a boundary: a
program can undo it from inside Python; the operating-system layer and the limits are what hold against an adversary.

Who decides the verdict (`ExecutionResult.verdict`): for a `SplitProgram` (the benchmarks' tasks,
`hf_mdm.harness.code_eval`) the program runs here as a worker answering calls with plain data and its test runs in
this process (``"trusted"``, `hf_mdm.harness.verdict`): nothing the program does to its own process can pass a
failing test. A program given as one source (program and test together, ``"program"``) passes when it runs to its
end: an exception, ``exit()``, a signal, a limit or the timeout fail it, but a hostile program can fake that end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from . import bubblewrap, plain_data, sandbox_guard, sandbox_limits, verdict
from .bubblewrap import Bubblewrap
from .verdict import SplitProgram

__all__ = [
    "ALLOW_ENV",
    "ISOLATION_ENV",
    "UNISOLATED_ENV",
    "SplitProgram",
    "SandboxLimits",
    "ExecutionResult",
    "code_execution_allowed",
    "require_code_execution",
    "isolation_layer",
    "unisolated_execution_allowed",
    "isolation_report",
    "bubblewrap_unavailable",
    "run_program",
    "run_programs",
]

logger = logging.getLogger(__name__)

ALLOW_ENV = "HF_ALLOW_CODE_EVAL"
ISOLATION_ENV = "HF_MDM_SANDBOX_ISOLATION"
UNISOLATED_ENV = "HF_MDM_ALLOW_UNISOLATED_EXECUTION"
Program = Union[str, SplitProgram]


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one program run.

    Args:
        timeout_s: wall-clock seconds before the process group is killed.
        cpu_time_s: CPU seconds (RLIMIT_CPU).
        memory_bytes: address space (RLIMIT_AS).
        max_processes: processes and threads the program may add (RLIMIT_NPROC / pids cgroup).
        max_file_bytes: size of any file written, stdout and stderr included (RLIMIT_FSIZE).
        max_open_files: file descriptors (RLIMIT_NOFILE).
        max_output_chars: characters of stdout / stderr kept in the result.
        max_disk_bytes: size of the private ``/tmp`` (working directory and home) under bubblewrap.
    """

    timeout_s: float = 10.0
    cpu_time_s: int = 10
    memory_bytes: int = 1 << 30
    max_processes: int = 16
    max_file_bytes: int = 16 << 20
    max_open_files: int = 64
    max_output_chars: int = 4000
    max_disk_bytes: int = 64 << 20

    @classmethod
    def from_env(cls) -> "SandboxLimits":
        """Defaults, overridden by ``HF_MDM_SANDBOX_TIMEOUT_S``, ``HF_MDM_SANDBOX_CPU_S``,
        ``HF_MDM_SANDBOX_MEMORY_MB`` and ``HF_MDM_SANDBOX_MAX_PROCESSES``."""
        env = os.environ
        defaults = cls()
        return cls(
            timeout_s=float(env.get("HF_MDM_SANDBOX_TIMEOUT_S", defaults.timeout_s)),
            cpu_time_s=int(env.get("HF_MDM_SANDBOX_CPU_S", defaults.cpu_time_s)),
            memory_bytes=int(float(env.get("HF_MDM_SANDBOX_MEMORY_MB", defaults.memory_bytes >> 20)) * (1 << 20)),
            max_processes=int(env.get("HF_MDM_SANDBOX_MAX_PROCESSES", defaults.max_processes)),
        )


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one program: ``status`` is ``"passed"``, ``"failed"`` or ``"timeout"``; ``reason`` says why;
    ``layer`` is the isolation it ran under (``"bubblewrap"`` or ``"process"``, see the module docstring);
    ``verdict`` who decided: ``"trusted"`` (the test ran in this process against the sandboxed program,
    `hf_mdm.harness.verdict`) or ``"program"`` (program and test ran together in the sandbox, and its exit status
    decided); ``note`` why a benchmark's test ran with the program (set by `hf_mdm.harness.code_eval`)."""

    status: str
    reason: str
    returncode: Optional[int]
    stdout: str
    stderr: str
    elapsed_s: float
    layer: str = "process"
    verdict: str = "program"
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return asdict(self)


def code_execution_allowed() -> bool:
    """True when the user opted in with ``HF_ALLOW_CODE_EVAL=1``."""
    return os.environ.get(ALLOW_ENV, "") == "1"


def require_code_execution() -> None:
    """Raise a PermissionError explaining the opt-in unless ``HF_ALLOW_CODE_EVAL=1``."""
    if not code_execution_allowed():
        raise PermissionError(
            "This task executes model-generated code. hf_mdm runs it only in its sandbox (a separate process with "
            "time, memory and process limits in an empty temporary directory) and only when you opt in: set "
            f"{ALLOW_ENV}=1 and pass --confirm_run_unsafe_code (confirm_run_unsafe_code=True in Python)."
        )


def unisolated_execution_allowed(allow: Optional[bool] = None) -> bool:
    """Whether the user opted in to running generated code without the operating-system layer: ``allow`` when given,
    else ``HF_MDM_ALLOW_UNISOLATED_EXECUTION=1``."""
    return allow if allow is not None else os.environ.get(UNISOLATED_ENV, "") == "1"


def run_program(
    program: Program,
    limits: SandboxLimits = SandboxLimits(),
    *,
    guard: bool = True,
    isolation: Optional[str] = None,
    allow_unisolated_execution: Optional[bool] = None,
) -> ExecutionResult:
    """Run one Python program in the sandbox and report whether it passed.

    Args:
        program: Python source that passes when it runs to its end (program and test together, ``verdict="program"``),
            or a `SplitProgram`: the program runs in the sandbox, its test here (``verdict="trusted"``).
        limits: resource limits.
        guard: install the guard of disabled functions (always on for benchmarks; off only to test that the
            operating-system layer and limits hold by themselves).
        isolation: ``"auto"`` (bubblewrap where it works, else a refusal), ``"bubblewrap"`` or ``"process"`` (the
            process layer alone); default ``HF_MDM_SANDBOX_ISOLATION`` or ``"auto"``.
        allow_unisolated_execution: opt in to the process layer alone where bubblewrap is unavailable (or with
            ``isolation="process"``); default ``HF_MDM_ALLOW_UNISOLATED_EXECUTION=1``.
    """
    require_code_execution()
    bwrap = _bubblewrap_for(isolation_layer(isolation, allow_unisolated_execution))
    return _execute(program, limits, guard, bwrap)


def run_programs(
    programs: Sequence[Program],
    limits: SandboxLimits = SandboxLimits(),
    max_workers: Optional[int] = None,
    *,
    isolation: Optional[str] = None,
    allow_unisolated_execution: Optional[bool] = None,
) -> list[ExecutionResult]:
    """Run programs concurrently (each in its own sandboxed process), results in input order (see `run_program`).

    ``max_workers`` defaults to ``HF_MDM_SANDBOX_WORKERS`` or the number of CPUs (at most 8).
    """
    require_code_execution()
    if not programs:
        return []
    bwrap = _bubblewrap_for(isolation_layer(isolation, allow_unisolated_execution))
    if max_workers is None:
        max_workers = int(os.environ.get("HF_MDM_SANDBOX_WORKERS", 0)) or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(programs)))) as pool:
        return list(pool.map(lambda p: _execute(p, limits, True, bwrap), programs))


def isolation_layer(requested: Optional[str] = None, allow_unisolated_execution: Optional[bool] = None) -> str:
    """The layer programs run under here: ``"bubblewrap"`` or ``"process"`` (see the module docstring).

    ``requested`` (default ``HF_MDM_SANDBOX_ISOLATION``, else ``"auto"``): ``"auto"`` and ``"bubblewrap"`` raise a
    RuntimeError naming what is missing where bubblewrap does not work, unless ``"auto"`` comes with the opt-in
    (`unisolated_execution_allowed`), which falls back to ``"process"`` with a warning; ``"process"`` needs it too."""
    choice = (requested or os.environ.get(ISOLATION_ENV) or "auto").strip().lower()
    if choice not in ("auto", "bubblewrap", "process"):
        raise ValueError(f"{ISOLATION_ENV}={choice!r}: use auto, bubblewrap or process")
    allowed = unisolated_execution_allowed(allow_unisolated_execution)
    reason = None if choice == "process" else bubblewrap_unavailable()
    if choice != "process" and reason is None:
        return "bubblewrap"
    if choice == "bubblewrap" or not allowed:
        what = "the process layer alone was requested" if choice == "process" else reason
        raise RuntimeError(
            "Refusing to run generated code without operating-system isolation: "
            f"{what}. Install bubblewrap (`make system-deps`), or opt in to unisolated execution with "
            f"{UNISOLATED_ENV}=1 (allow_unisolated_execution=True in Python) if you accept that the program can "
            "read what the user it runs as can read and use the network."
        )
    sandbox_limits.warn_once(
        "fallback",
        f"Generated code runs WITHOUT operating-system isolation ({UNISOLATED_ENV}=1): process limits and a "
        "Python-level guard are a convenience, not a boundary; a hostile program can undo the guard, read anything "
        "its (unprivileged) user can read, reach the network and local services, and leave files in shared places"
        + (f" ({reason})" if reason else "")
        + ".",
    )
    return "process"


def bubblewrap_unavailable() -> Optional[str]:
    """None when the bubblewrap layer works on this machine, else why not (what is missing, how to install it).
    Probed once per process."""
    return _probe_bubblewrap()[1]


def isolation_report(requested: Optional[str] = None, allow_unisolated_execution: Optional[bool] = None) -> dict:
    """What the results JSON says about the sandbox: the layer, what it isolates, and why not where it fell back.
    (Per program, the samples log says the layer and who decided the verdict: `ExecutionResult`.)"""
    layer = isolation_layer(requested, allow_unisolated_execution)
    report = {"layer": layer}
    if layer == "bubblewrap":
        bwrap = _probe_bubblewrap()[0]
        report["isolation"] = (
            "bubblewrap: no network, own pid namespace, read-only /usr and Python, private /tmp, "
            f"uid {sandbox_limits.NOBODY_UID}; with process limits and the guard"
        )
        report["bwrap"] = bwrap.executable
    else:
        report["isolation"] = (
            f"process limits and the Python-level guard only (opted in with {UNISOLATED_ENV}=1): a convenience, "
            "not a boundary"
        )
        reason = bubblewrap_unavailable()
        if reason:
            report["why_not_bubblewrap"] = reason
    return report


# ----------------------------------------------------------------------------------------------------------------

_PROBE = "import os, json, re, math, hashlib, collections\nprint(os.getuid(), os.getgid(), os.listdir('.'))"
_probe_lock = threading.Lock()
_probed: list = []


def _probe_bubblewrap() -> tuple[Optional[Bubblewrap], Optional[str]]:
    """Find bwrap and run a program under it once: (the layer, None) or (None, the reason)."""
    with _probe_lock:
        if not _probed:
            bwrap, reason = bubblewrap.locate()
            if bwrap is not None:
                probe = _execute(_PROBE, SandboxLimits(timeout_s=60, cpu_time_s=30), True, bwrap)
                if probe.stdout.strip() != f"{sandbox_limits.NOBODY_UID} {sandbox_limits.NOBODY_UID} []":
                    detail = (probe.stderr.strip() or probe.reason or probe.stdout.strip()).splitlines()
                    reason = (
                        f"`{bwrap.executable}` is installed but could not run Python in a sandbox "
                        f"({detail[-1] if detail else probe.status}); {bubblewrap.INSTALL_HINT}"
                    )
                    bwrap = None
            _probed[:] = [bwrap, reason or None]
        return _probed[0], _probed[1]


def _bubblewrap_for(layer: str) -> Optional[Bubblewrap]:
    return _probe_bubblewrap()[0] if layer == "bubblewrap" else None


def _execute(program: Program, limits: SandboxLimits, guard: bool, bwrap: Optional[Bubblewrap]) -> ExecutionResult:
    """One program under ``bwrap`` (its working directory a private tmpfs) or the process layer alone (an empty
    temporary directory, removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="hf_mdm_sandbox_io_") as io_dir:
        if bwrap is not None:
            return _run(program, limits, guard, None, Path(io_dir), bwrap)
        workdir = Path(tempfile.mkdtemp(prefix="hf_mdm_sandbox_"))
        try:
            return _run(program, limits, guard, workdir, Path(io_dir), None)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def _settings(limits: SandboxLimits, guard: bool, bwrap: Optional[Bubblewrap], user: Optional[int], serve) -> dict:
    """What the bootstrap in the child needs (`hf_mdm.harness.sandbox_guard.BOOTSTRAP`)."""
    count_inside = bwrap is not None and not bwrap.as_root and sandbox_limits.user_namespace_counts_own_tasks()
    tasks_now = None if count_inside else sandbox_limits.tasks_of_user(user if user is not None else os.getuid())
    return {
        "rlimits": sandbox_limits.rlimits(limits, tasks_now),
        "drop_to": sandbox_limits.NOBODY_UID if bwrap is not None and bwrap.as_root else None,
        "nproc_inside": limits.max_processes if count_inside else None,
        "guard": guard,
        "disabled_os": sandbox_guard.DISABLED_OS,
        "disabled_shutil": sandbox_guard.DISABLED_SHUTIL,
        "disabled_subprocess": sandbox_guard.DISABLED_SUBPROCESS,
        "blocked_modules": sandbox_guard.BLOCKED_MODULES,
        "serve": None if serve is None else plain_data.SOURCE + verdict.WORKER,
        "reply_fd": serve,
        "max_depth": plain_data.MAX_DEPTH,
    }


def _command(
    interpreter: str, settings: dict, limits: SandboxLimits, workdir: Optional[Path], bwrap: Optional[Bubblewrap]
) -> tuple[list[str], dict]:
    """The command line that starts the bootstrap, and the working directory and environment to start it with."""
    argv = [interpreter, "-I", "-S", "-c", sandbox_guard.BOOTSTRAP, json.dumps(settings)]
    home = bubblewrap.WORKDIR if bwrap is not None else str(workdir)
    env = {"PATH": os.defpath, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": home, "TMPDIR": home}
    if bwrap is not None:
        return bwrap.command(argv, env, limits.max_disk_bytes), {"cwd": "/", "env": {"PATH": os.defpath}}
    return argv, {"cwd": workdir, "env": env}


def _run(
    program: Program,
    limits: SandboxLimits,
    guard: bool,
    workdir: Optional[Path],
    io_dir: Path,
    bwrap: Optional[Bubblewrap],
) -> ExecutionResult:
    root = os.geteuid() == 0
    if bwrap is None:
        interpreter, user = sandbox_limits.process_layer_interpreter()
    else:
        interpreter, user = bwrap.interpreter, (sandbox_limits.NOBODY_UID if bwrap.as_root else None)
    # Under bubblewrap the program never runs as root and its pid namespace ends with it, so RLIMIT_NPROC suffices
    # (moving a process into a cgroup v1 costs ~25 ms of waiting; bwrap forks at once, so it would have to be
    # moved before it starts).
    cgroup = sandbox_limits.PidsCgroup.create(limits.max_processes) if root and bwrap is None else None
    split = program if isinstance(program, SplitProgram) else None
    reply_read, reply_write = os.pipe() if split is not None else (None, None)
    argv, extra = _command(interpreter, _settings(limits, guard, bwrap, user, reply_write), limits, workdir, bwrap)
    if bwrap is None and user is not None:
        os.chown(workdir, user, user)
        extra.update(user=user, group=user, extra_groups=[])
    stdout_path, stderr_path = io_dir / "stdout", io_dir / "stderr"
    start = time.perf_counter()
    judgement, timed_out = None, False
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
            pass_fds=() if split is None else (reply_write,),
            umask=0o077,
            **extra,
        )
        try:
            if cgroup is not None:
                cgroup.add(process.pid)  # before the program is sent: nothing it starts escapes the limit
            if split is None:
                timed_out = _communicate(process, program, limits.timeout_s)
            else:
                os.close(reply_write)
                judgement = verdict.judge(split, process, reply_read, limits.timeout_s)
                if judgement.reason == verdict.PROCESS_ENDED:  # let bwrap report how it ended, before the kill
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=0.5)
        finally:
            _end(process, reply_read, cgroup)
    elapsed = time.perf_counter() - start
    stdout, stderr = _read_tail(stdout_path, limits.max_output_chars), _read_tail(stderr_path, limits.max_output_chars)
    result = _outcome(judgement, process.returncode, timed_out, stdout, stderr, elapsed, bubblewrap=bwrap is not None)
    return result if bwrap is None else replace(result, layer="bubblewrap")


def _outcome(
    judgement: Any,
    returncode: Optional[int],
    timed_out: bool,
    stdout: str,
    stderr: str,
    elapsed: float,
    bubblewrap: bool,
) -> ExecutionResult:
    """The result of a run: from the exit status (a program judged in the sandbox), or from the trusted side's
    judgement, with how the process ended where that is the reason."""
    if bubblewrap and returncode is not None and returncode > 128:
        returncode = 128 - returncode  # bwrap exits with 128 + N when its command is killed by signal N
    if judgement is None:
        return _result(returncode, timed_out, stdout, stderr, elapsed)
    reason = judgement.reason
    if reason == verdict.PROCESS_ENDED:  # say how: a limit, a signal, an exit status
        reason = f"{reason} ({_result(returncode, False, stdout, stderr, elapsed).reason or 'exit status 0'})"
    return ExecutionResult(judgement.status, reason, returncode, stdout, stderr, elapsed, verdict="trusted")


def _end(process: subprocess.Popen, reply_read: Optional[int], cgroup: Optional[sandbox_limits.PidsCgroup]) -> None:
    """Kill the program's process group (and cgroup), close the pipes to it."""
    _kill_group(process)
    with contextlib.suppress(OSError):
        process.stdin.close()
    if reply_read is not None:
        os.close(reply_read)
    if cgroup is not None:
        cgroup.destroy()


def _communicate(process: subprocess.Popen, program: str, timeout_s: float) -> bool:
    """Send the program, wait for the process; True if the wall-clock limit was reached."""
    try:
        process.stdin.write(program.encode("utf-8", errors="replace"))
        process.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the child died before reading (e.g. a limit): its return code tells
    try:
        process.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        _kill_group(process)
        process.wait()
        return True


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.poll() is None:
        process.kill()
        process.wait()


def _result(returncode: int, timed_out: bool, stdout: str, stderr: str, elapsed: float) -> ExecutionResult:
    if timed_out:
        return ExecutionResult("timeout", "wall-clock limit reached", returncode, stdout, stderr, elapsed)
    if returncode == 0:
        return ExecutionResult("passed", "", returncode, stdout, stderr, elapsed)
    if returncode < 0:
        reason = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else "signal"
        reason = {"SIGXCPU": "CPU-time limit reached", "SIGXFSZ": "file-size limit reached"}.get(reason, reason)
    else:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else f"exit status {returncode}"
    return ExecutionResult("failed", reason[:300], returncode, stdout, stderr, elapsed)


def _read_tail(path: Path, max_chars: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 4 * max_chars))
        text = handle.read().decode("utf-8", errors="replace")
    return text[-max_chars:]
