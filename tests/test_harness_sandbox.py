"""The sandbox: hostile programs fail their problem and leave the machine as it was; pass@k is unbiased."""

import itertools
import math
import os
import tempfile
from pathlib import Path

import pytest

from hf_mdm.harness.code_eval import pass_at_k
from hf_mdm.harness.sandbox import ALLOW_ENV, SandboxLimits, run_program, run_programs

LIMITS = SandboxLimits(timeout_s=3.0, cpu_time_s=2, memory_bytes=512 << 20, max_processes=8)
_BOOTSTRAP_MARK = "settings = json.loads(sys.argv[1])"


@pytest.fixture(autouse=True)
def allow_code(monkeypatch, tmp_path):
    """Opt in, and put the sandbox's working directories under this test's tmp_path (to find leftovers)."""
    monkeypatch.setenv(ALLOW_ENV, "1")
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
    """Processes of this test's sandboxes (bootstrap command line, working directory under ``root``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                running = _BOOTSTRAP_MARK in (entry / "cmdline").read_bytes().decode(errors="replace")
                if running and Path(os.readlink(entry / "cwd")).is_relative_to(root):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


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
    result = run_program("import os\nprint(os.listdir('.'), sorted(os.environ))", LIMITS)
    assert result.passed
    assert result.stdout.strip() == "[] ['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']"


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
    """With the guard off, the operating-system limit (RLIMIT_NPROC / pids cgroup) stops a fork loop."""
    program = (
        "import os, time\ncount = 0\ntry:\n    for _ in range(40):\n        if os.fork() == 0:\n"
        "            time.sleep(3)\n            os._exit(0)\n        count += 1\nfinally:\n    print(count, flush=True)"
    )
    before = _leftovers()
    result = run_program(program, LIMITS, guard=False)
    assert not result.passed and "Resource temporarily unavailable" in result.reason
    assert int(result.stdout.split()[-1]) < LIMITS.max_processes
    assert _leftovers() == before == ((), (), ())  # the sleeping children were killed (process group / cgroup)


def test_memory_limit_holds_without_the_guard():
    result = run_program("blob = bytearray(6 * 1024 ** 3)", LIMITS, guard=False)
    assert result.status == "failed" and "MemoryError" in result.reason


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
