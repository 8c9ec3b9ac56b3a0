"""Functional correctness of generated code: programs for MBPP and HumanEval, and the unbiased pass@k.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): with n samples of a problem of
which c pass, the probability that at least one of k samples drawn without replacement passes,

    pass@k = 1 - C(n - c, k) / C(n, k),

computed as 1 - prod_{i = n - c + 1}^{n} (1 - k / i) for numerical stability. Programs run only in
`hf_mdm.harness.sandbox`.

The verdict is decided on the trusted side (`hf_mdm.harness.verdict`): the completion runs in the sandbox and the
task's test here, calling it with plain data (`mbpp_job`, `humaneval_job`). Where a task's test cannot be split
from the program (`unsplit_reason`: MBPP's ``test_setup_code``, and the tasks of `UNSPLIT_TASKS`, whose tests need
values that are not plain data), program and test run together in the sandbox as before and the outcome says so
(``"verdict": "program"`` and ``"note"``).
"""

from __future__ import annotations

import ast
from dataclasses import replace
from typing import Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from .sandbox import ExecutionResult, SandboxLimits, run_programs
from .verdict import SplitProgram, free_names, parse

__all__ = [
    "pass_at_k",
    "pass_at_k_of_outcomes",
    "mbpp_program",
    "humaneval_program",
    "mbpp_job",
    "humaneval_job",
    "unsplit_reason",
    "UNSPLIT_TASKS",
    "reference_programs",
    "execute",
    "outcome",
]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``n`` samples of which ``c`` pass (needs k <= n)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs at least k={k} samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mbpp_program(completion: str, doc: Mapping) -> str:
    """The solution, then ``test_setup_code``, then the asserts of ``test_list``."""
    return "\n".join([completion, doc.get("test_setup_code") or "", *doc["test_list"]]) + "\n"


def humaneval_program(completion: str, doc: Mapping) -> str:
    """Prompt + completion (the function body), then the tests and ``check(entry_point)``."""
    return f"{doc['prompt']}{completion}\n\n{doc['test']}\n\ncheck({doc['entry_point']})\n"


# Tasks whose test cannot run apart from the program: found by running every reference solution with its verdict
# on the trusted side (tests/harness/test_harness_sandbox.py::test_every_reference_solution_passes checks this list).
UNSPLIT_TASKS: dict[str, str] = {
    "mbpp/533": "its asserts pass a type (int, str, float) to the function: not plain data",
}
Job = Union[str, SplitProgram]


def unsplit_reason(doc: Mapping) -> str:
    """Why this task's test runs together with the program in the sandbox ("" when it runs on the trusted side)."""
    if doc.get("test_setup_code"):
        return "MBPP test_setup_code defines values in the program's namespace that its asserts use"
    classes = _defined_names(doc.get("code") or "", ast.ClassDef) & _used_names("\n".join(doc.get("test_list") or []))
    if classes:
        return f"its asserts build objects of the program's class {', '.join(sorted(classes))}: not plain data"
    task = f"mbpp/{doc['task_id']}" if "test_list" in doc else str(doc.get("task_id"))
    return UNSPLIT_TASKS.get(task, "")


def mbpp_job(completion: str, doc: Mapping) -> Job:
    """The completion in the sandbox and the asserts of ``test_list`` on the trusted side (or `mbpp_program` where
    `unsplit_reason` says so)."""
    if unsplit_reason(doc):
        return mbpp_program(completion, doc)
    test = "\n".join(doc["test_list"]) + "\n"
    # The program's names: those the test does not define, and those the reference solution defines (even when they
    # shadow a built-in, as ``sum`` in task 126).
    names = set(free_names(test)) | (_used_names(test) & _defined_names(doc.get("code") or "", ast.FunctionDef))
    return SplitProgram(completion + "\n", test, calls=tuple(sorted(names)))


def _defined_names(code: str, kind: type) -> set[str]:
    """Names of the top-level definitions of ``kind`` (``ast.FunctionDef``, ``ast.ClassDef``) in ``code``."""
    try:
        return {node.name for node in parse(code).body if isinstance(node, kind)}
    except SyntaxError:
        return set()


def _used_names(code: str) -> set[str]:
    return {node.id for node in ast.walk(parse(code)) if isinstance(node, ast.Name)}


def humaneval_job(completion: str, doc: Mapping) -> Job:
    """Prompt + completion in the sandbox; the prompt (for its helper functions), the tests and
    ``check(entry_point)`` on the trusted side (or `humaneval_program` where `unsplit_reason` says so)."""
    if unsplit_reason(doc):
        return humaneval_program(completion, doc)
    entry = doc["entry_point"]
    setup = f"{doc['prompt']}\n\n{doc['test']}\n"
    return SplitProgram(f"{doc['prompt']}{completion}\n", f"check({entry})\n", setup, (entry,))


def reference_programs(data_dir: Optional[str] = None, *, trusted: bool = True) -> dict[str, Job]:
    """Every MBPP (all 974 problems, every split) and HumanEval (164) reference solution with its tests, as the
    benchmarks run them (``trusted=False``: program and test together, for every task), ``{"mbpp/<task_id>" |
    "HumanEval/<n>": job}``. Data from `hf_mdm.harness.data`."""
    from . import data

    mbpp, humaneval = (mbpp_job, humaneval_job) if trusted else (mbpp_program, humaneval_program)
    programs = {}
    for split in data.load_mbpp(data_dir).values():
        programs.update({f"mbpp/{doc['task_id']}": mbpp(doc["code"], doc) for doc in split})
    for doc in data.load_humaneval(data_dir)["test"]:
        programs[doc["task_id"]] = humaneval(doc["canonical_solution"], doc)
    return programs


def outcome(result: ExecutionResult) -> dict:
    """The part of an `ExecutionResult` kept in lm-eval's samples log: the verdict, the isolation layer, and who
    decided the verdict (``"trusted"``: the test ran outside the sandbox; ``"program"``: with the program, ``note``
    says why)."""
    kept = {
        "passed": result.passed,
        "status": result.status,
        "reason": result.reason,
        "elapsed_s": round(result.elapsed_s, 4),
        "layer": result.layer,
        "verdict": result.verdict,
    }
    return kept | ({"note": result.note} if result.note else {})


def execute(
    programs: Sequence[Sequence[Job]], limits: Optional[SandboxLimits] = None, notes: Sequence[str] = ()
) -> list[list[dict]]:
    """Run every program (grouped per problem) in the sandbox, concurrently; outcomes in the same grouping.

    ``limits`` defaults to `SandboxLimits.from_env`; ``notes`` (one per problem) say why a problem's test runs with
    its program (`unsplit_reason`)."""
    limits = limits or SandboxLimits.from_env()
    flat = [p for group in programs for p in group]
    results = iter(run_programs(flat, limits))
    notes = list(notes) or [""] * len(programs)
    return [[outcome(replace(next(results), note=note)) for _ in group] for group, note in zip(programs, notes)]


def pass_at_k_of_outcomes(outcomes: Iterable[Mapping], ks: Sequence[int]) -> dict[str, float]:
    """pass@k for each k from the outcomes of one problem's samples."""
    outcomes = list(outcomes)
    passed = sum(bool(o["passed"]) for o in outcomes)
    return {f"pass@{k}": pass_at_k(len(outcomes), passed, k) for k in ks}
