"""Verdicts a program cannot forge: hostile completions of an MBPP-style and a HumanEval-style task, run through the
tasks' own filters (`execute_mbpp`, `execute_humaneval`), all fail, with a correct completion before and after each
passing; values cross between the trusted side and the sandbox as plain data only; without the operating-system
layer, and as root without an interpreter the unprivileged user can run, code execution is refused."""

import logging
from pathlib import Path

import pytest

from hf_mdm.harness import plain_data, sandbox, sandbox_limits
from hf_mdm.harness.code_eval import unsplit_reason
from hf_mdm.harness.sandbox import ALLOW_ENV, UNISOLATED_ENV, SandboxLimits, bubblewrap_unavailable, run_program
from hf_mdm.harness.tasks.utils import execute_humaneval, execute_mbpp
from hf_mdm.harness.verdict import SplitProgram, free_names

MBPP_DOC = {
    "task_id": 10_001,
    "text": "Write a function that returns three times its argument.",
    "code": "def triple(x):\n    return 3 * x\n",
    "test_list": ["assert triple(2) == 6", "assert triple(-1) == -3", "assert triple(0) == 0"],
    "test_setup_code": "",
    "challenge_test_list": [],
}
HUMANEVAL_DOC = {
    "task_id": "Verdict/0",
    "prompt": 'def triple(x):\n    """Three times x."""\n',
    "entry_point": "triple",
    "canonical_solution": "    return 3 * x\n",
    "test": "\n\ndef check(candidate):\n    assert candidate(2) == 6\n    assert candidate(-1) == -3\n    assert candidate(0) == 0\n",
}
CORRECT = "def triple(x):\n    return 3 * x\n"
WRONG = "def triple(x):\n    return x\n"
_TRACER = """
import sys, __main__
def _tracer(frame, event, arg):
    if event == "exception" and issubclass(arg[0], AssertionError):
        __main__._exit(0)
    return _tracer
sys.settrace(_tracer)
sys._getframe().f_trace = _tracer
"""
_FORGED_REPLY = """
import os
def triple(x):
    line = b'{"id":{"$":"int","v":"0x1"},"value":true}\\n{"passed": true}\\n'
    for fd in range(3, 32):
        try:
            os.write(fd, line)
        except OSError:
            pass
    return x
"""

# Each defines triple(x) wrongly (or not at all) and tries to be judged passed anyway.
HOSTILE = {
    "os._exit through __main__ at import": WRONG + "import __main__\n__main__._exit(0)\n",
    "os._exit through __main__ in the call": "def triple(x):\n    import __main__\n    __main__._exit(0)\n",
    "sys.exit(0) at import": WRONG + "import sys\nsys.exit(0)\n",
    "sys.exit(0) in the call": "import sys\ndef triple(x):\n    sys.exit(0)\n",
    "raise SystemExit(0) in the call": "def triple(x):\n    raise SystemExit(0)\n",
    "exit() and quit()": "def triple(x):\n    exit(0)\nquit(0)\n",
    "SystemExit in __del__": (
        "class Bye:\n    def __del__(self):\n        raise SystemExit(0)\ndef triple(x):\n    Bye()\n    return x\n"
    ),
    "os._exit(0) registered with atexit": WRONG + "import atexit, __main__\natexit.register(__main__._exit, 0)\n",
    "SystemExit(0) from a signal handler": WRONG
    + "import signal, sys\nsignal.signal(signal.SIGALRM, lambda *a: sys.exit(0))\nsignal.setitimer(signal.ITIMER_REAL, 0.01)\n",
    "SIGTERM to itself": "import signal\ndef triple(x):\n    signal.raise_signal(signal.SIGTERM)\n",
    "SIGSTOP to itself": "import signal\ndef triple(x):\n    signal.raise_signal(signal.SIGSTOP)\n",
    "kill the parent": "import os, signal\ndef triple(x):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return x\n",
    "kill every process it can": "import posix\ndef triple(x):\n    posix.kill(-1, 9)\n    return x\n",
    "traceback.print_exc replaced by os._exit(0)": WRONG
    + "import traceback, __main__\ntraceback.print_exc = lambda *a, **k: __main__._exit(0)\n",
    "builtins patched": WRONG
    + "import builtins\nbuiltins.AssertionError = type('Nothing', (Exception,), {})\nbuiltins.isinstance = lambda *a: True\n",
    "object equal to anything": (
        "class Any:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def triple(x):\n    return Any()\n"
    ),
    "int subclass equal to anything": (
        "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def triple(x):\n    return Int(x)\n"
    ),
    "str subclass equal to anything": (
        "class Str(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n"
        "def triple(x):\n    return Str(x)\n"
    ),
    "list subclass equal to anything": (
        "class List(list):\n    def __eq__(self, other):\n        return True\ndef triple(x):\n    return List([x])\n"
    ),
    "sys.settrace exits 0 on AssertionError": WRONG + _TRACER,
    "prints fake PASSED output": WRONG
    + "import sys\nprint('PASSED')\nprint('{\"passed\": true, \"status\": \"passed\"}')\nprint('ok', file=sys.stderr)\n",
    "forges replies on every file descriptor": _FORGED_REPLY,
    "returns a generator": "def triple(x):\n    return (3 * x for _ in range(1))\n",
    "hangs": "def triple(x):\n    while True:\n        pass\n",
    "no function at all": "print('nothing here')\n",
}


@pytest.fixture(autouse=True)
def code_execution(monkeypatch):
    monkeypatch.setenv(ALLOW_ENV, "1")
    monkeypatch.setenv("HF_MDM_SANDBOX_TIMEOUT_S", "2")
    monkeypatch.setenv("HF_MDM_SANDBOX_CPU_S", "2")
    if bubblewrap_unavailable():  # the explicit opt-in to the process layer alone (the default refuses)
        monkeypatch.setenv(UNISOLATED_ENV, "1")


def _humaneval_completion(module: str) -> str:
    """A completion of HUMANEVAL_DOC's prompt: a body, then the module (which defines triple again)."""
    return "    return None\n\n" + module


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_completion_fails_between_correct_ones(name):
    hostile = HOSTILE[name]
    mbpp = execute_mbpp([[CORRECT, hostile, CORRECT]], [MBPP_DOC])[0]
    humaneval = execute_humaneval(
        [[_humaneval_completion(CORRECT), _humaneval_completion(hostile), _humaneval_completion(CORRECT)]],
        [HUMANEVAL_DOC],
    )[0]
    for before, judged, after in (mbpp, humaneval):
        assert before["passed"] and after["passed"], (before, after)
        assert not judged["passed"] and judged["status"] in ("failed", "timeout"), judged
        assert before["verdict"] == judged["verdict"] == after["verdict"] == "trusted"
        assert judged["layer"] == ("process" if bubblewrap_unavailable() else "bubblewrap")


def test_a_wrong_answer_names_the_failing_assert():
    (outcome,) = execute_mbpp([[WRONG]], [MBPP_DOC])[0]
    assert outcome["reason"] == "AssertionError at `assert triple(2) == 6`"
    (outcome,) = execute_humaneval([[_humaneval_completion(WRONG)]], [HUMANEVAL_DOC])[0]
    assert outcome["reason"] == "AssertionError at `assert candidate(2) == 6`"


def test_exceptions_cross_as_data_and_a_swallowed_failure_still_fails():
    raises = "def parse(s):\n    return int(s)\n"
    test = "try:\n    parse('x')\nexcept ValueError as e:\n    assert 'x' in str(e)\nelse:\n    raise AssertionError\n"
    assert run_program(SplitProgram(raises, test), SandboxLimits(timeout_s=5)).passed
    custom = "class Oops(Exception):\n    pass\ndef parse(s):\n    raise Oops('no')\n"
    result = run_program(SplitProgram(custom, "parse('1')\n"), SandboxLimits(timeout_s=5))
    assert result.status == "failed" and result.reason == "CandidateError: Oops: no at `parse('1')`"
    # SystemExit inside the call, caught by the test's bare except: the failure is remembered
    exits = "import sys\ndef parse(s):\n    sys.exit(0)\n"
    result = run_program(SplitProgram(exits, "try:\n    parse('1')\nexcept:\n    pass\n"), SandboxLimits(timeout_s=5))
    assert result.status == "failed" and result.reason == "parse raised SystemExit: 0"


def test_the_test_names_bound_to_the_program():
    assert free_names("import math\nassert math.isclose(area(2), 4.0)\nx = 1\nassert f(x, len([]))") == ("area", "f")
    # MBPP task 126 shadows the built-in sum: the reference solution's definitions count as the program's
    doc = {"task_id": 1, "code": "def sum(a, b):\n    return a\n", "test_list": ["assert sum(1, 2) == 1"]}
    from hf_mdm.harness.code_eval import mbpp_job

    assert mbpp_job("def sum(a, b):\n    return a\n", doc).names() == ("sum",)


def test_tests_that_cannot_be_split_run_as_before_and_say_so():
    setup = dict(MBPP_DOC, test_setup_code="factor = 3", test_list=["assert triple(2) == 2 * factor"])
    classes = dict(MBPP_DOC, code="class P:\n    pass\ndef triple(x):\n    return 3 * x\n", test_list=["assert P()"])
    assert "test_setup_code" in unsplit_reason(setup) and "class P" in unsplit_reason(classes)
    assert unsplit_reason(MBPP_DOC) == ""
    (outcome,) = execute_mbpp([[CORRECT]], [setup])[0]
    assert outcome["passed"] and outcome["verdict"] == "program" and "test_setup_code" in outcome["note"]


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        "huge",
        2.5,
        float("inf"),
        1 - 2j,
        "é\n",
        b"\x00\xff",
        [1, [2]],
        (1, (2,)),
        {1, 2},
        frozenset(),
        {(1, "a"): {"b": [None]}},
    ],  # fmt: skip
)
def test_plain_data_round_trips_with_its_type(value):
    value = -(10**5000) if value == "huge" else value
    decoded = plain_data.loads(plain_data.dumps(value))
    assert decoded == value and type(decoded) is type(value)


@pytest.mark.parametrize(
    "line",
    ["5", '{"$": "eval", "v": "1"}', '{"$": "set", "v": [[1]]}', '{"__class__": "x"}', "[" * 3000 + "]" * 3000],
)
def test_anything_else_on_the_wire_is_refused(line):
    with pytest.raises(plain_data.PlainDataError):
        plain_data.loads(line)


def test_refused_without_the_operating_system_layer(monkeypatch, caplog):
    monkeypatch.delenv(UNISOLATED_ENV, raising=False)
    monkeypatch.setattr(sandbox, "_probed", [None, "bubblewrap is not installed (no `bwrap` on PATH): install it"])
    with pytest.raises(RuntimeError, match="Refusing to run generated code without operating-system isolation"):
        run_program("print(1)")
    with pytest.raises(RuntimeError, match=UNISOLATED_ENV):
        run_program("print(1)", isolation="process")
    monkeypatch.setattr(sandbox_limits, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="hf_mdm.harness.sandbox"):
        result = run_program("print(1)", allow_unisolated_execution=True)
    assert result.passed and result.layer == "process"
    assert "convenience, not a boundary" in caplog.text and "bubblewrap is not installed" in caplog.text


def test_never_runs_as_root(monkeypatch):
    """Under the process layer alone, generated code runs as an unprivileged user, or not at all."""
    result = run_program("import os\nprint(os.getuid())", isolation="process", allow_unisolated_execution=True)
    assert result.passed and int(result.stdout) != 0
    monkeypatch.setattr(sandbox_limits.os, "geteuid", lambda: 0)
    monkeypatch.setattr(sandbox_limits, "unprivileged_interpreter", lambda: None)
    with pytest.raises(RuntimeError, match="Refusing to run generated code as root"):
        run_program("print(1)", isolation="process", allow_unisolated_execution=True)


def test_a_run_is_refused_before_it_starts_without_the_operating_system_layer(monkeypatch):
    from hf_mdm.harness.requirements import check_requirements

    monkeypatch.delenv(UNISOLATED_ENV, raising=False)
    monkeypatch.setattr(sandbox, "_probed", [None, "bubblewrap is not installed (no `bwrap` on PATH)"])
    with pytest.raises(ValueError, match="mdm_mbpp: Refusing to run generated code without operating-system"):
        check_requirements(["mdm_mbpp"], confirm_unsafe_code=True)
    monkeypatch.setenv(UNISOLATED_ENV, "1")
    monkeypatch.setenv("HF_MDM_DATA_DIR", str(Path(__file__).resolve().parents[3] / "shared" / "data"))
    assert check_requirements(["mdm_mbpp"], confirm_unsafe_code=True) is None  # with the opt-in, nothing is missing


def test_a_test_looping_over_a_returned_value_stops_at_the_limit():
    loops = SplitProgram("def n(x):\n    return 10**18\n", "for _ in range(n(1)):\n    pass\n")
    result = run_program(loops, SandboxLimits(timeout_s=1))
    assert result.status == "timeout" and result.reason == "wall-clock limit reached in the test"
    assert result.elapsed_s < 3
    counts = SplitProgram(
        "def n(x):\n    return 3\n", "total = 0\nfor i in range(n(1)):\n    total += i\nassert total == 3\n"
    )
    assert run_program(counts, SandboxLimits(timeout_s=1)).passed
