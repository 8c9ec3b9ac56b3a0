"""The sandbox's cost: every MBPP and HumanEval reference solution under the process layer alone ("before": limits and
the guard) and under bubblewrap ("after": operating-system isolation on top), measured in one run.

Printed, for each layer: how many of the programs pass (all must), the median seconds per program run one at a time
(programs alternate between the layers, so drift hits both alike) and the throughput with ``--workers`` programs in
parallel (`run_programs`, as the benchmarks run them; layers alternate, best of ``--repeats``); then the ratios
bubblewrap / process.

    HF_MDM_DATA_DIR=../shared/data HF_ALLOW_CODE_EVAL=1 python evaluation/bench_sandbox.py [--limit 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from hf_mdm.harness.code_eval import reference_programs
from hf_mdm.harness.sandbox import SandboxLimits, bubblewrap_unavailable, run_program, run_programs

LAYERS = ("process", "bubblewrap")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="programs (default: all 1,138)")
    parser.add_argument("--workers", type=int, default=None, help="parallel programs (default: CPUs, at most 8)")
    parser.add_argument("--repeats", type=int, default=2, help="throughput runs per layer (best is kept)")
    args = parser.parse_args()
    reason = bubblewrap_unavailable()
    if reason:
        raise SystemExit(f"bubblewrap is unavailable, nothing to compare: {reason}")
    programs = reference_programs()
    names = list(programs)[: args.limit]
    limits = SandboxLimits.from_env()
    workers = args.workers or int(os.environ.get("HF_MDM_SANDBOX_WORKERS", 0)) or min(8, os.cpu_count() or 1)

    seconds = {layer: [] for layer in LAYERS}
    failed = {layer: [] for layer in LAYERS}
    for index, name in enumerate(names):
        for layer in LAYERS if index % 2 == 0 else reversed(LAYERS):
            result = run_program(programs[name], limits, isolation=layer)
            seconds[layer].append(result.elapsed_s)
            if not result.passed:
                failed[layer].append(f"{name}: {result.reason}")

    throughput = {layer: 0.0 for layer in LAYERS}
    for _ in range(args.repeats):
        for layer in LAYERS:
            start = time.perf_counter()
            results = run_programs([programs[n] for n in names], limits, max_workers=workers, isolation=layer)
            throughput[layer] = max(throughput[layer], len(names) / (time.perf_counter() - start))
            failed[layer] += [f"{n} (parallel): {r.reason}" for n, r in zip(names, results) if not r.passed]

    print(f"{len(names)} reference programs (MBPP and HumanEval), {workers} workers in parallel\n")
    print(f"{'layer':<11} {'passed':>8} {'median s/program':>17} {'mean s/program':>15} {'programs/s':>11}")
    for layer in LAYERS:
        passed = len(names) - len([f for f in failed[layer] if "(parallel)" not in f])
        print(
            f"{layer:<11} {passed:>8} {statistics.median(seconds[layer]):>17.4f} "
            f"{statistics.fmean(seconds[layer]):>15.4f} {throughput[layer]:>11.1f}"
        )
    medians = {layer: statistics.median(seconds[layer]) for layer in LAYERS}
    paired = statistics.median(b / p for b, p in zip(seconds["bubblewrap"], seconds["process"]))
    print(
        f"\nbubblewrap / process: median time per program {medians['bubblewrap'] / medians['process']:.3f} "
        f"(median of per-program ratios {paired:.3f}); throughput {throughput['bubblewrap'] / throughput['process']:.3f}"
    )
    for layer in LAYERS:
        for line in failed[layer][:20]:
            print(f"FAILED under {layer}: {line}")
    if any(failed.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
