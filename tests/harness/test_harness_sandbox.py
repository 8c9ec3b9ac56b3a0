"""The sandbox: hostile programs fail their problem and leave the machine as it was; pass@k is unbiased.

The hostile programs of `HOSTILE` run under the operating-system layer (bubblewrap) with the guard and without it
(the layer holds by itself), and, where the process layer alone is meant to hold, under that layer too. Where
bubblewrap is not available the tests that need it are skipped with the reason (see the pytest summary).
"""

import itertools
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from hf_mdm.harness import bubblewrap
from hf_mdm.harness.code_eval import UNSPLIT_TASKS, pass_at_k, reference_programs
from hf_mdm.harness.sandbox import (
    ALLOW_ENV,
    UNISOLATED_ENV,
    ExecutionResult,
    SandboxLimits,
    bubblewrap_unavailable,
    isolation_report,
    run_program,
    run_programs,
)

LIMITS = SandboxLimits(timeout_s=3.0, cpu_time_s=2, memory_bytes=512 << 20, max_processes=8)
_BOOTSTRAP_MARK = "settings = json.loads(sys.argv[1])"


@pytest.fixture(autouse=True)
def allow_code(monkeypatch, tmp_path):
    """Opt in, and put the sandbox's working directories under this test's tmp_path (to find leftovers). Where
    bubblewrap is unavailable, opt in to the process layer alone explicitly (the tests that need bubblewrap skip)."""
    monkeypatch.setenv(ALLOW_ENV, "1")
    if bubblewrap_unavailable():
        monkeypatch.setenv(UNISOLATED_ENV, "1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.fixture
def victim():
    """A file outside the sandbox's working directory that hostile programs try to delete."""
    with tempfile.TemporaryDirectory(prefix="hf_mdm_victim_") as directory:
        path = Path(directory) / "precious.txt"
        path.write_text("keep me")
        yield path
        assert path.read_text() == "keep me"


def _sandbox_processes(root: Path) -> list[int]:
    """Processes of this test's sandboxes (bootstrap command line; working directory under ``root`` or a
    descendant of this process: under bubblewrap the working directory is a tmpfs of its own)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                running = _BOOTSTRAP_MARK in (entry / "cmdline").read_bytes().decode(errors="replace")
                if running and (Path(os.readlink(entry / "cwd")).is_relative_to(root) or _descends(int(entry.name))):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def _descends(pid: int) -> bool:
    while pid > 1:
        try:
            status = (Path("/proc") / str(pid) / "status").read_text()
        except OSError:
            return False
        pid = int(status.split("PPid:")[1].split()[0])
        if pid == os.getpid():
            return True
    return False


def _leftovers() -> tuple:
    """Sandbox processes, working directories and cgroups of this test process."""
    root = Path(tempfile.gettempdir())
    cgroups = Path("/sys/fs/cgroup/pids")
    ours = sorted(cgroups.glob(f"hf_mdm_sandbox_{os.getpid()}_*")) if cgroups.is_dir() else []
    return tuple(_sandbox_processes(root)), tuple(sorted(root.glob("hf_mdm_sandbox_*"))), tuple(ours)


def test_needs_opt_in(monkeypatch):
    monkeypatch.delenv(ALLOW_ENV)
    with pytest.raises(PermissionError, match="HF_ALLOW_CODE_EVAL"):
        run_program("print(1)")


def test_passing_and_failing_programs():
    ok, wrong, crash, quits = run_programs(
        ["assert sum([1, 2]) == 3\nprint('ok')", "assert 1 == 2", "raise ValueError('x')", "exit(0)"], LIMITS
    )
    assert ok.passed and ok.stdout.strip() == "ok"
    assert wrong.status == "failed" and "AssertionError" in wrong.reason
    assert crash.status == "failed" and "ValueError" in crash.reason
    assert quits.status == "failed"  # leaving early is not passing


def test_empty_working_directory_and_minimal_environment():
    result = run_program("import os\nprint(os.listdir('.'), sorted(set(os.environ) - {'PWD'}))", LIMITS)
    assert result.passed
    assert result.stdout.strip() == "[] ['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']"  # (bubblewrap sets PWD)


def test_hostile_programs_fail_and_harm_nothing(victim):
    before = _leftovers()
    hostile = {
        "infinite loop": "while True:\n    pass",
        "6 GB": "blob = bytearray(6 * 1024 ** 3)\nprint(len(blob))",
        "fork dozens": "import os\nfor _ in range(40):\n    if os.fork() == 0:\n        os._exit(0)",
        "subprocess": "import subprocess\nsubprocess.run(['sleep', '100'])",
        "delete": f"import os\nos.remove({str(victim)!r})",
        "rmtree": f"import shutil\nshutil.rmtree({str(victim.parent)!r})",
        "unlink": f"import pathlib\npathlib.Path({str(victim)!r}).unlink()",
        "overwrite": f"open({str(victim)!r}, 'w').write('gone')",
        "kill parent": "import os\nos.kill(os.getppid(), 9)",
    }
    results = dict(zip(hostile, run_programs(list(hostile.values()), LIMITS, max_workers=2)))
    assert not any(r.passed for r in results.values()), {k: r.reason for k, r in results.items()}
    assert results["infinite loop"].status in ("timeout", "failed") and results["infinite loop"].elapsed_s < 5
    assert "MemoryError" in results["6 GB"].reason
    assert victim.exists() and victim.read_text() == "keep me"
    assert _leftovers() == before == ((), (), ())


def test_process_limit_holds_without_the_guard():
    """With the guard off, the operating-system limit (RLIMIT_NPROC / pids cgroup) stops a fork loop. The children
    outlive the run's timeout (a child that exited while a slow loop still forked would free its slot)."""
    program = (
        "import os, time\ncount = 0\ntry:\n    for _ in range(40):\n        if os.fork() == 0:\n"
        "            time.sleep(60)\n            os._exit(0)\n        count += 1\nfinally:\n    print(count, flush=True)"
    )
    before = _leftovers()
    result = run_program(program, LIMITS, guard=False)
    assert not result.passed and "Resource temporarily unavailable" in result.reason
    assert int(result.stdout.split()[-1]) < LIMITS.max_processes
    assert _leftovers() == before == ((), (), ())  # the sleeping children were killed (process group / cgroup)


def test_memory_limit_holds_without_the_guard():
    result = run_program("blob = bytearray(6 * 1024 ** 3)", LIMITS, guard=False)
    assert result.status == "failed" and "MemoryError" in result.reason


@pytest.mark.slow
def test_every_reference_solution_passes():
    """All 974 MBPP and 164 HumanEval reference solutions pass in the sandbox, under the layer it uses here."""
    os.environ.setdefault("HF_MDM_DATA_DIR", str(PROJECT.parent / "shared" / "data"))
    programs = reference_programs()
    assert len(programs) == 974 + 164
    results = run_programs(list(programs.values()), SandboxLimits(timeout_s=30.0))
    failed = {name: r.reason for name, r in zip(programs, results) if not r.passed}
    assert not failed, failed
    assert {r.layer for r in results} == {"process" if bubblewrap_unavailable() else "bubblewrap"}
    # every test runs on the trusted side but MBPP's two with test_setup_code and the listed ones
    by_program = {name for name, r in zip(programs, results) if r.verdict == "program"}
    assert by_program == {"mbpp/367", "mbpp/927", "mbpp/601", *UNSPLIT_TASKS}, by_program


@pytest.mark.parametrize("n, c, k", [(1, 0, 1), (1, 1, 1), (5, 2, 1), (10, 3, 2), (10, 9, 5), (20, 0, 10)])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    expected = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    # brute force: probability that a random k-subset of the n samples contains a passing one
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    if len(subsets) < 50_000:
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(samples[i] for i in s) for s in subsets) / len(subsets))


def test_pass_at_k_needs_enough_samples():
    with pytest.raises(ValueError):
        pass_at_k(1, 0, 2)


# -- hostile programs: each tries one thing; none may succeed --------------------------------------------------------

PROJECT = Path(__file__).resolve().parents[2]
NEEDS_BUBBLEWRAP = "the operating-system layer (bubblewrap) is unavailable here: {}"


@dataclass
class Scene:
    """What the test sets up around a hostile program: a secret in this process's environment and in a planted
    file, a TCP server on 127.0.0.1, a free port, a unique token, and the project's folder."""

    secret: str
    planted: Path
    server_port: int
    accepted: list
    free_port: int
    token: str
    project_file: Path


@dataclass(frozen=True)
class Hostile:
    """A hostile program (``program(scene)``), whether the process layer alone (guard and limits) must hold against
    it, and the check that it did not succeed (``check(result, scene)``, after the run)."""

    name: str
    program: Callable[[Scene], str]
    process_layer_holds: bool
    check: Callable[[ExecutionResult, Scene], None]


def _no_secret(result, scene):
    assert scene.secret not in result.stdout + result.stderr


def _only_system_folders(result, scene):
    assert result.passed, result.reason  # listing / works, and shows nothing of this machine but what Python needs
    bwrap, _ = bubblewrap.locate()
    allowed = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "proc", "dev", "tmp"}
    allowed |= {Path(folder).parts[1] for folder in bwrap.binds}
    listing = eval(result.stdout.strip().splitlines()[0])
    assert set(listing) <= allowed and "work" not in listing and "home" not in listing, listing
    assert eval(result.stdout.strip().splitlines()[1]) == ["ld.so.cache"]  # /etc


def _not_host_init(result, scene):
    host = Path("/proc/1/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    assert host not in result.stdout


def _nothing_reached_server(result, scene):
    assert not result.passed and "connected" not in result.stdout
    time.sleep(0.2)
    assert scene.accepted == []


def _listener_unreachable(result, scene):
    assert not result.passed or "listening" in result.stdout  # inside its own network namespace, if at all
    assert not scene.accepted, "the host reached the program's listener"


def _daemon_gone(result, scene):
    assert not result.passed
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                assert scene.token not in (entry / "cmdline").read_bytes().decode(errors="replace"), "daemon left"
            except OSError:
                pass


def _disk_bounded(result, scene):
    assert not result.passed
    written = int(result.stdout.split()[-1]) if result.stdout.strip() else 0
    assert written <= (16 << 20) + (1 << 20), written  # the private /tmp's size (LIMITS.max_disk_bytes)


def _memory_error(result, scene):
    assert not result.passed and "MemoryError" in result.reason


def _few_processes(result, scene):
    assert not result.passed
    assert int((result.stdout.split() or ["0"])[-1]) < LIMITS.max_processes


def _failed(result, scene):
    assert not result.passed


def _project_untouched(result, scene):
    assert not result.passed and not scene.project_file.exists()


_ENVIRON = """
import os
found = []
for pid in [str(os.getppid()), "1", *os.listdir("/proc")]:
    try:
        found.append(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
    except OSError:
        pass
print(found)
"""
_CONNECT = (
    "import socket\ns = socket.create_connection(('127.0.0.1', {s.server_port}), timeout=2)\n"
    "s.sendall(b'pwned')\nprint('connected')"
)
_LISTEN = (
    "import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', {s.free_port}))\ns.listen()\n"
    "print('listening', flush=True)\ns.settimeout(2.5)\nconn, _ = s.accept()\nprint('accepted')"
)
_DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/sleep", ["sleep", "{s.token}"])
    os._exit(0)
time.sleep(0.5)
raise SystemExit(1)
"""
_FILL_DISK = """
import os
written = 0
try:
    for i in range(64):
        with open(f"fill{i}", "wb") as f:
            for _ in range(16):
                f.write(b"x" * (1 << 20))
                written += 1 << 20
finally:
    print(written, flush=True)
"""
_FORK = """
import os, time
count = 0
try:
    for _ in range(64):
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        count += 1
finally:
    print(count, flush=True)
"""
_KILL_PARENT = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\nprint('alive')"
_WRITE_PROJECT = "import _io\n_io.FileIO({s.project_file!s:!r}, 'w').write(b'pwned')\nprint('written')"

HOSTILE = [
    Hostile("read the parent's environment", lambda s: _ENVIRON, False, _no_secret),
    Hostile("read a planted file", lambda s: f"print(open({str(s.planted)!r}).read())", False, _no_secret),
    Hostile(
        "list /", lambda s: "import os\nprint(os.listdir('/'))\nprint(os.listdir('/etc'))", False, _only_system_folders
    ),
    Hostile(
        "read /proc/1/cmdline",
        lambda s: "print(open('/proc/1/cmdline').read().replace(chr(0), ' '))",
        False,
        _not_host_init,
    ),
    Hostile("connect to 127.0.0.1", lambda s: _CONNECT.format(s=s), True, _nothing_reached_server),
    Hostile("listen on 127.0.0.1", lambda s: _LISTEN.format(s=s), True, _listener_unreachable),
    Hostile("leave a daemon grandchild", lambda s: _DAEMON.format(s=s), True, _daemon_gone),
    Hostile("fill the disk of its folder", lambda s: _FILL_DISK, False, _disk_bounded),
    Hostile("allocate 10 GB", lambda s: "blob = bytearray(10 * 1024 ** 3)\nprint(len(blob))", True, _memory_error),
    Hostile("fork 64 times", lambda s: _FORK, True, _few_processes),
    Hostile("kill its parent", lambda s: _KILL_PARENT, True, _failed),
    Hostile(
        "write into the project's folder",
        lambda s: _WRITE_PROJECT.replace("{s.project_file!s:!r}", repr(str(s.project_file))),
        False,
        _project_untouched,
    ),
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def scene(monkeypatch, tmp_path, victim):
    """Set the scene, run the test, then check that the harness runs programs and nothing changed outside."""
    secret = f"hf-mdm-secret-{uuid.uuid4().hex}"
    planted = Path(tempfile.mkdtemp(prefix="hf_mdm_planted_", dir="/tmp")) / "token"
    planted.write_text(secret)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    accepted, stop = [], threading.Event()
    free_port = _free_port()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0].recv(16))
            except OSError:
                pass
            try:  # the program's listener must not be reachable from here
                with socket.create_connection(("127.0.0.1", free_port), timeout=0.1):
                    accepted.append("reached the program's listener")
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    project_file = PROJECT / f"hf_mdm_pwned_{uuid.uuid4().hex[:8]}.txt"
    before = _leftovers()
    yield Scene(
        secret, planted, server.getsockname()[1], accepted, free_port, f"9{uuid.uuid4().int % 10**8}.5", project_file
    )
    stop.set()
    thread.join()
    server.close()
    assert planted.read_text() == secret and not project_file.exists()
    project_file.unlink(missing_ok=True)
    planted.unlink()
    planted.parent.rmdir()
    deadline = time.time() + 5
    while _leftovers() != before and time.time() < deadline:
        time.sleep(0.05)
    assert _leftovers() == before == ((), (), ())
    assert run_program("print('still running')", LIMITS).stdout.strip() == "still running"  # the harness goes on


# The harness that runs a hostile program: a child process with the secret in its environment from its start (as a
# token would be; /proc/<pid>/environ shows a process's initial environment). It imports only the sandbox (a stub
# `hf_mdm` package skips the package's heavy __init__) and prints the result as JSON: output proves it kept running.
_HARNESS = """
import json, sys, types
package = types.ModuleType("hf_mdm")
package.__path__ = [sys.argv[1]]
sys.modules["hf_mdm"] = package
from hf_mdm.harness.sandbox import SandboxLimits, run_program
options = json.loads(sys.argv[2])
limits = SandboxLimits(timeout_s=3.0, cpu_time_s=2, memory_bytes=512 << 20, max_processes=8, max_disk_bytes=16 << 20)
result = run_program(
    sys.stdin.read(), limits, guard=options["guard"], isolation=options["isolation"],
    allow_unisolated_execution=options["isolation"] == "process",
)
print(json.dumps(result.to_dict()))
"""


def _harness(program: str, guard: bool, isolation: str, secret: str) -> ExecutionResult:
    options = json.dumps({"guard": guard, "isolation": isolation})
    env = dict(os.environ, HF_MDM_TEST_SECRET=secret, HF_MDM_TOKEN=secret)
    child = subprocess.run(
        [sys.executable, "-c", _HARNESS, str(PROJECT / "hf_mdm"), options],
        input=program,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, f"the harness stopped: {child.returncode}\n{child.stderr[-3000:]}"
    return ExecutionResult(**json.loads(child.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("guard", [True, False], ids=["with the guard", "without the guard"])
@pytest.mark.parametrize("hostile", HOSTILE, ids=[h.name for h in HOSTILE])
def test_hostile_program_under_bubblewrap(hostile, guard, scene):
    reason = bubblewrap_unavailable()
    if reason:
        pytest.skip(NEEDS_BUBBLEWRAP.format(reason))
    result = _harness(hostile.program(scene), guard=guard, isolation="bubblewrap", secret=scene.secret)
    assert result.layer == "bubblewrap"
    hostile.check(result, scene)


@pytest.mark.parametrize("hostile", [h for h in HOSTILE if h.process_layer_holds], ids=lambda h: h.name)
def test_hostile_program_under_the_process_layer(hostile, scene):
    """Without bubblewrap, the guard and the limits alone stop these (and only these) hostile programs."""
    result = _harness(hostile.program(scene), guard=True, isolation="process", secret=scene.secret)
    assert result.layer == "process"
    hostile.check(result, scene)


def test_the_layer_is_reported(monkeypatch):
    result = run_program("print(1)", LIMITS, isolation="process", allow_unisolated_execution=True)
    assert result.layer == "process" and result.verdict == "program"
    assert isolation_report("process", allow_unisolated_execution=True)["layer"] == "process"
    monkeypatch.setenv("HF_MDM_SANDBOX_ISOLATION", "nonsense")
    with pytest.raises(ValueError, match="HF_MDM_SANDBOX_ISOLATION"):
        run_program("print(1)", LIMITS)
    if bubblewrap_unavailable():
        with pytest.raises(RuntimeError, match="bubblewrap"):
            run_program("print(1)", LIMITS, isolation="bubblewrap")
    else:
        assert run_program("print(1)", LIMITS, isolation="bubblewrap").layer == "bubblewrap"
        assert isolation_report("auto") == isolation_report("bubblewrap")
