"""Verdicts the program under test cannot forge: its tests run on the trusted side, the program in the sandbox.

A benchmark's test (MBPP's asserts, HumanEval's ``check(candidate)``) is split from the generated program. The program
alone runs in the sandbox (`hf_mdm.harness.sandbox`), as a worker that executes it once and then answers calls: the
name of one of its functions and the arguments, as plain data (`hf_mdm.harness.plain_data`: numbers, strings, bytes,
lists, tuples, dicts, sets, None, booleans; nothing is pickled). The test runs in the harness's own process, with
every name it takes from the program bound to a `CandidateFunction` that sends the call to the worker and returns
the decoded reply: a value of a built-in type, or the exception the function raised (a built-in exception type is
raised again as itself, any other as `CandidateError`). The comparisons of the test therefore happen here, on plain
data, and the verdict is the test's: it passes when the test code runs to its end and no call failed. Every reply is
awaited at most until the program's wall-clock limit (`SandboxLimits.timeout_s`, for the program as a whole). Whatever
the program prints, returns or does to its own process, it can only answer calls: a value that is not plain data, a
malformed reply, a process that ends, ``SystemExit`` or a call past the time limit fail the test (a `CandidateFailure`,
a BaseException that the test's own ``except Exception`` cannot swallow, and remembered even if a bare ``except``
does).

Where a test cannot be split (it needs code of the program's module besides its functions, e.g. MBPP's
``test_setup_code``), `hf_mdm.harness.code_eval` runs program and test together as before and the result says so
(``verdict="program"`` and the reason).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import os
import select
import subprocess
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from . import plain_data

__all__ = [
    "SplitProgram",
    "CandidateFunction",
    "CandidateFailure",
    "CandidateError",
    "Judgement",
    "WORKER",
    "judge",
    "free_names",
    "parse",
]

MAX_REPLY_BYTES = 16 << 20
PROCESS_ENDED = "the program's process ended"
TRUSTED_FILES = ("<trusted test>", "<trusted setup>")
_BUILTIN_EXCEPTIONS = {
    name: value
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, Exception) and not issubclass(value, Warning)
}
# Standard-library modules that a test may use without importing them (the program imported them for it).
_UNSAFE_MODULES = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "__hello__", "__phello__"}


@dataclass(frozen=True)
class SplitProgram:
    """A program to judge on the trusted side.

    Attributes:
        program: the code run in the sandbox (HumanEval: prompt + completion; MBPP: the completion).
        test: trusted code run here after ``setup``, at module level (MBPP: the asserts; HumanEval:
            ``check(entry_point)``).
        setup: trusted code run here first (HumanEval: the prompt, for its helper functions, and the test's
            ``check``); the names in ``calls`` are then bound to the program's functions.
        calls: names bound to `CandidateFunction`; default: the free names of ``test`` (`free_names`).
    """

    program: str
    test: str
    setup: str = ""
    calls: Optional[tuple[str, ...]] = None

    def names(self) -> tuple[str, ...]:
        return self.calls if self.calls is not None else free_names(self.test)


@dataclass
class Judgement:
    """The trusted side's verdict: ``status`` ``"passed"``, ``"failed"`` or ``"timeout"``, and why."""

    status: str
    reason: str = ""
    calls: int = 0


class CandidateFailure(BaseException):
    """A call to the program did not return plain data or an exception (a BaseException: the test cannot catch it
    with ``except Exception``; the channel also remembers it)."""


class CandidateError(Exception):
    """The program's function raised an exception whose type is not a built-in one (its name is in the message)."""


def free_names(test: str) -> tuple[str, ...]:
    """The names ``test`` uses but neither defines nor imports nor finds among the built-ins: the program's."""
    tree = parse(test)
    used, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return tuple(sorted(used - bound - set(vars(builtins)) - set(sys.stdlib_module_names)))


class Channel:
    """The trusted side of one worker: requests on its stdin, replies (lines of JSON) on a pipe."""

    def __init__(self, process: subprocess.Popen, reply_fd: int, deadline: float):
        self.process, self.reply_fd, self.deadline = process, reply_fd, deadline
        self.buffer = b""
        self.failure: Optional[str] = None
        self.timed_out = False
        self.calls = 0

    def fail(self, reason: str) -> CandidateFailure:
        self.failure = self.failure or reason
        return CandidateFailure(reason)

    def send(self, line: str) -> None:
        try:
            self.process.stdin.write(line.encode("ascii") + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise self.fail(PROCESS_ENDED) from None

    def receive(self) -> Any:
        while b"\n" not in self.buffer:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.timed_out = True
                raise self.fail("wall-clock limit reached")
            ready, _, _ = select.select([self.reply_fd], [], [], remaining)
            chunk = os.read(self.reply_fd, 1 << 16) if ready else b""
            if ready and not chunk:
                raise self.fail(PROCESS_ENDED)
            self.buffer += chunk
            if len(self.buffer) > MAX_REPLY_BYTES:
                raise self.fail(f"a reply longer than {MAX_REPLY_BYTES} bytes")
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            return plain_data.loads(line)
        except plain_data.PlainDataError as error:
            raise self.fail(f"the program returned something other than plain data ({error})") from None

    def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        if self.failure:
            raise CandidateFailure(self.failure)
        self.calls += 1
        try:
            line = plain_data.dumps({"id": self.calls, "name": name, "args": list(args), "kwargs": kwargs})
        except plain_data.PlainDataError as error:
            raise self.fail(f"the test passes {name} an argument that is not plain data ({error})") from None
        self.send(line)
        reply = self.receive()
        if type(reply) is not dict or reply.get("id") != self.calls:
            raise self.fail("a malformed reply")
        if "value" in reply:
            return reply["value"]
        raise _exception(self, name, reply.get("raised"))


def _exception(channel: Channel, name: str, raised: Any) -> BaseException:
    """The exception a reply reports, to raise on the trusted side."""
    if type(raised) is not dict or type(raised.get("type")) is not str or type(raised.get("message")) is not str:
        return channel.fail("a malformed reply")
    kind, message = raised["type"], raised["message"]
    if raised.get("builtin") is True and kind in _BUILTIN_EXCEPTIONS:
        return _BUILTIN_EXCEPTIONS[kind](message)
    if raised.get("exception") is not True:  # SystemExit, KeyboardInterrupt, ...: the program would have ended
        return channel.fail(f"{name} raised {kind}: {message}"[:300])
    return CandidateError(f"{kind}: {message}")


@dataclass(frozen=True)
class CandidateFunction:
    """Stands for the program's function ``name`` on the trusted side: calls go to the sandboxed worker."""

    name: str
    channel: Channel = field(repr=False, compare=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.channel.call(self.name, args, kwargs)


def judge(split: SplitProgram, process: subprocess.Popen, reply_fd: int, timeout_s: float) -> Judgement:
    """Send the program to the worker, run the test here against it, and decide the verdict."""
    channel = Channel(process, reply_fd, time.monotonic() + timeout_s)
    try:
        channel.send(plain_data.dumps({"program": split.program}))
        ready = channel.receive()
        if type(ready) is not dict or ready.get("ready") is not True:
            raised = ready.get("raised") if type(ready) is dict else None
            detail = f"{raised['type']}: {raised['message']}" if _well_formed(raised) else "no answer"
            return Judgement("failed", f"the program did not run to its end ({detail})"[:300])
        namespace: dict[str, Any] = {"__name__": "__test__", "__builtins__": builtins}
        exec(_compile(split.setup, "<trusted setup>"), namespace)
        for name in split.names():
            namespace[name] = CandidateFunction(name, channel)
        _import_used_modules(split.test, namespace)
        with _deadline(channel):
            exec(_compile(split.test, "<trusted test>"), namespace)
    except CandidateFailure:
        pass  # recorded in channel.failure
    except BaseException as error:  # the test failed: an assert, or an exception it did not expect
        if isinstance(error, KeyboardInterrupt):
            raise
        return Judgement("failed", _describe(error, split)[:300], channel.calls)
    if channel.failure:
        return Judgement("timeout" if channel.timed_out else "failed", channel.failure[:300], channel.calls)
    return Judgement("passed", "", channel.calls)


@contextlib.contextmanager
def _deadline(channel: Channel):
    """Stop the trusted code at the program's wall-clock limit too (a test looping over a value the program
    returned, ``for _ in range(candidate(x))``): its lines are traced in this thread, and past the limit the next
    one raises a `CandidateFailure`. Library code it calls is not traced (nor stopped)."""

    def trace(frame, event, arg):
        if frame.f_code.co_filename not in TRUSTED_FILES:
            return None
        if event == "line" and time.monotonic() > channel.deadline:
            channel.timed_out = True
            raise channel.fail("wall-clock limit reached in the test")
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
    finally:
        sys.settrace(previous)


def _describe(error: BaseException, split: SplitProgram) -> str:
    """The exception and the line of the trusted code it came from."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    sources = dict(zip(TRUSTED_FILES, (split.test, split.setup)))
    for frame, line in reversed(list(traceback.walk_tb(error.__traceback__))):
        source = sources.get(frame.f_code.co_filename, "").splitlines()
        if 0 < line <= len(source):
            return f"{text} at `{source[line - 1].strip()}`"
    return text


_compile_lock = threading.Lock()


def _compile(source: str, filename: str) -> Any:
    """Compile trusted test code without the warnings about its string escapes (one thread at a time: the warning
    filters are global)."""
    with _compile_lock, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile(source, filename, "exec")


def parse(source: str) -> ast.Module:
    """`ast.parse` without the warnings about string escapes of the benchmarks' code."""
    with _compile_lock, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source)


def _well_formed(raised: Any) -> bool:
    return type(raised) is dict and type(raised.get("type")) is str and type(raised.get("message")) is str


def _import_used_modules(test: str, namespace: dict) -> None:
    """Import the standard-library modules that ``test`` uses without importing them (e.g. ``math.isclose``)."""
    used = {node.id for node in ast.walk(parse(test)) if isinstance(node, ast.Name)}
    for name in sorted(used & set(sys.stdlib_module_names) - _UNSAFE_MODULES):
        if name not in namespace:
            namespace[name] = __import__(name)


# The worker, run by the sandbox's bootstrap after its guard (`hf_mdm.harness.sandbox_guard`), with `plain_data.SOURCE`
# and `requests` (the sandbox's stdin), `reply` (writes one line to the reply pipe) and `stderr` in its namespace.
WORKER = r"""
def _raised(error):
    kind = type(error)
    return {"type": kind.__name__, "message": str(error)[:1000], "exception": isinstance(error, Exception),
            "builtin": kind.__module__ == "builtins"}


def _serve(source):
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(source, "<program>", "exec"), namespace)
    except BaseException as error:
        import traceback
        traceback.print_exc(file=stderr)
        reply(dumps({"ready": False, "raised": _raised(error)}))
        return
    reply(dumps({"ready": True}))
    for line in requests:
        request = loads(line)
        function = namespace.get(request["name"])
        try:
            if not callable(function):
                raise NameError(f"name {request['name']!r} is not a function of the program")
            value = function(*request["args"], **request["kwargs"])
            try:
                answer = dumps({"id": request["id"], "value": value})
            except PlainDataError as error:
                answer = dumps({"id": request["id"], "raised": {"type": "TypeError", "builtin": False,
                                "exception": False, "message": f"returned {error}"}})
        except BaseException as error:
            answer = dumps({"id": request["id"], "raised": _raised(error)})
        reply(answer)


_serve(loads(requests.readline())["program"])
"""
