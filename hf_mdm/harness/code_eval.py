"""Functional correctness of generated code: programs for MBPP and HumanEval, and the unbiased pass@k.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): with n samples of a problem of
which c pass, the probability that at least one of k samples drawn without replacement passes,

    pass@k = 1 - C(n - c, k) / C(n, k),

computed as 1 - prod_{i = n - c + 1}^{n} (1 - k / i) for numerical stability. Programs run only in
`hf_mdm.harness.sandbox`.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

from .sandbox import ExecutionResult, SandboxLimits, run_programs

__all__ = [
    "pass_at_k",
    "pass_at_k_of_outcomes",
    "mbpp_program",
    "humaneval_program",
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


def reference_programs(data_dir: Optional[str] = None) -> dict[str, str]:
    """Every MBPP (all 974 problems, every split) and HumanEval (164) reference solution with its tests, as the
    benchmarks run them: ``{"mbpp/<task_id>" | "HumanEval/<n>": program}``. Data from `hf_mdm.harness.data`."""
    from . import data

    programs = {}
    for split in data.load_mbpp(data_dir).values():
        programs.update({f"mbpp/{doc['task_id']}": mbpp_program(doc["code"], doc) for doc in split})
    for doc in data.load_humaneval(data_dir)["test"]:
        programs[doc["task_id"]] = humaneval_program(doc["canonical_solution"], doc)
    return programs


def outcome(result: ExecutionResult) -> dict:
    """The part of an `ExecutionResult` kept in lm-eval's samples log."""
    return {
        "passed": result.passed,
        "status": result.status,
        "reason": result.reason,
        "elapsed_s": round(result.elapsed_s, 4),
        "layer": result.layer,
    }


def execute(programs: Sequence[Sequence[str]], limits: Optional[SandboxLimits] = None) -> list[list[dict]]:
    """Run every program (grouped per problem) in the sandbox, concurrently; outcomes in the same grouping.

    ``limits`` defaults to `SandboxLimits.from_env`."""
    limits = limits or SandboxLimits.from_env()
    flat = [p for group in programs for p in group]
    results = iter(run_programs(flat, limits))
    return [[outcome(next(results)) for _ in group] for group in programs]


def pass_at_k_of_outcomes(outcomes: Iterable[Mapping], ks: Sequence[int]) -> dict[str, float]:
    """pass@k for each k from the outcomes of one problem's samples."""
    outcomes = list(outcomes)
    passed = sum(bool(o["passed"]) for o in outcomes)
    return {f"pass@{k}": pass_at_k(len(outcomes), passed, k) for k in ks}
