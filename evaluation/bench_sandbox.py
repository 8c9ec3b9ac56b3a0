"""The cost of deciding verdicts on the trusted side: every MBPP and HumanEval reference solution under bubblewrap,
judged the old way ("program": program and test together in the sandbox, the exit status decides) and the new way
("trusted": the program in the sandbox answering calls, the test in this process), measured in one run.

Printed, for each method: how many of the programs pass (all must), the median seconds per program run one at a time
(programs alternate between the methods, so drift hits both alike) and the throughput with ``--workers`` programs in
parallel (`run_programs`, as the benchmarks run them; methods alternate, best of ``--repeats``); then the ratios
trusted / program.

    HF_MDM_DATA_DIR=../shared/data HF_ALLOW_CODE_EVAL=1 python evaluation/bench_sandbox.py [--limit 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from hf_mdm.harness.code_eval import reference_programs
from hf_mdm.harness.sandbox import SandboxLimits, bubblewrap_unavailable, run_program, run_programs

METHODS = ("program", "trusted")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="programs (default: all 1,138)")
    parser.add_argument("--workers", type=int, default=None, help="parallel programs (default: CPUs, at most 8)")
    parser.add_argument("--repeats", type=int, default=2, help="throughput runs per method (best is kept)")
    args = parser.parse_args()
    reason = bubblewrap_unavailable()
    if reason:
        raise SystemExit(f"bubblewrap is unavailable: {reason}")
    jobs = {method: reference_programs(trusted=method == "trusted") for method in METHODS}
    names = list(jobs["trusted"])[: args.limit]
    limits = SandboxLimits.from_env()
    workers = args.workers or int(os.environ.get("HF_MDM_SANDBOX_WORKERS", 0)) or min(8, os.cpu_count() or 1)

    seconds = {method: [] for method in METHODS}
    failed = {method: [] for method in METHODS}
    for index, name in enumerate(names):
        for method in METHODS if index % 2 == 0 else reversed(METHODS):
            result = run_program(jobs[method][name], limits)
            seconds[method].append(result.elapsed_s)
            if not result.passed:
                failed[method].append(f"{name}: {result.reason}")

    throughput = {method: 0.0 for method in METHODS}
    for _ in range(args.repeats):
        for method in METHODS:
            start = time.perf_counter()
            results = run_programs([jobs[method][n] for n in names], limits, max_workers=workers)
            throughput[method] = max(throughput[method], len(names) / (time.perf_counter() - start))
            failed[method] += [f"{n} (parallel): {r.reason}" for n, r in zip(names, results) if not r.passed]

    print(f"{len(names)} reference programs (MBPP and HumanEval), bubblewrap, {workers} workers in parallel\n")
    print(f"{'verdict':<9} {'passed':>8} {'median s/program':>17} {'mean s/program':>15} {'programs/s':>11}")
    for method in METHODS:
        passed = len(names) - len([f for f in failed[method] if "(parallel)" not in f])
        print(
            f"{method:<9} {passed:>8} {statistics.median(seconds[method]):>17.4f} "
            f"{statistics.fmean(seconds[method]):>15.4f} {throughput[method]:>11.1f}"
        )
    medians = {method: statistics.median(seconds[method]) for method in METHODS}
    paired = statistics.median(t / p for t, p in zip(seconds["trusted"], seconds["program"]))
    print(
        f"\ntrusted / program: median time per program {medians['trusted'] / medians['program']:.3f} "
        f"(median of per-program ratios {paired:.3f}); throughput {throughput['trusted'] / throughput['program']:.3f}"
    )
    for method in METHODS:
        for line in failed[method][:20]:
            print(f"FAILED ({method}): {line}")
    if any(failed.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
