"""Harness overhead: wall time of lm-eval runs / the sampler's own generate() time, on the tiny config.

For every masked-diffusion setting of the config, the model is loaded once (not timed), then one lm-eval run
(`hf_mdm.harness.simple_evaluate`: task loading, prompts, batching, tokenisation, sampling, decoding, stop strings,
filters and code execution, metrics, lm-eval's environment report) is timed end to end and compared with the sum of
the sampler's own ``elapsed_s`` over its ``diffusion_generate`` calls. Printed:

- ``run / generate``: the whole run's wall time over the sampler's time (target <= 1.10);
- ``batches / generate``: the harness's time per batch (encode, generate, decode, cut) over the sampler's time,
  i.e. the per-request overhead without the run's fixed costs;
- the fixed cost of a run in seconds (run time minus batch time).

    HF_MDM_DATA_DIR=../shared/data HF_ALLOW_CODE_EVAL=1 python evaluation/bench_harness.py [--limit 8]

Code tasks are left out unless ``HF_ALLOW_CODE_EVAL=1``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from hf_mdm.harness import compare
from hf_mdm.harness.evaluator import create_lm, simple_evaluate

CODE_TASKS = ("mdm_mbpp", "mdm_humaneval")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(Path(__file__).parent / "configs" / "tiny.yaml"))
    parser.add_argument("--limit", type=float, default=None, help="requests per task (default: the config's)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = compare.load_config(args.config, limit=args.limit)
    allow_code = os.environ.get("HF_ALLOW_CODE_EVAL") == "1"
    skip = ("batch_size", "device", "log_samples", "gen_kwargs")
    evaluate = {k: v for k, v in config.evaluate.items() if k not in skip}
    groups: dict[tuple[str, str], list[compare.Cell]] = {}
    for cell in config.cells:
        if cell.model == "hf_mdm" and (allow_code or cell.task not in CODE_TASKS):
            groups.setdefault((cell.model_name, cell.setting), []).append(cell)
    if not allow_code:
        print(f"(code tasks {CODE_TASKS} left out: set HF_ALLOW_CODE_EVAL=1 to include them)")
    print(
        f"{'model':<12} {'setting':<14} {'tasks':>5} {'requests':>8} {'run s':>8} {'generate s':>10} "
        f"{'batches s':>9} {'run/gen':>8} {'batch/gen':>9} {'fixed s':>8}"
    )
    totals = {"run": 0.0, "generate": 0.0, "batches": 0.0}
    for (model_name, setting), cells in groups.items():
        first = cells[0]
        lm = create_lm(
            first.model,
            dict(first.model_args),
            batch_size=config.evaluate.get("batch_size"),
            device=config.evaluate.get("device"),
        )
        tasks = [cell.task for cell in cells]
        start = time.perf_counter()
        results = simple_evaluate(
            lm, model_args=first.model_args, tasks=tasks, gen_kwargs=first.gen_kwargs or None, **evaluate
        )
        run = time.perf_counter() - start
        timing = results["timing"]["all"]
        totals["run"] += run
        totals["generate"] += timing["generate_s"]
        totals["batches"] += timing["wall_s"]
        print(
            f"{model_name:<12} {setting:<14} {len(tasks):>5} {timing['requests']:>8} {run:>8.2f} "
            f"{timing['generate_s']:>10.2f} {timing['wall_s']:>9.2f} {run / timing['generate_s']:>8.3f} "
            f"{timing['wall_s'] / timing['generate_s']:>9.3f} {run - timing['wall_s']:>8.2f}"
        )
        del lm
    print(
        f"\ntotal: run / generate = {totals['run'] / totals['generate']:.3f} (target <= 1.10); "
        f"batches / generate = {totals['batches'] / totals['generate']:.3f}; "
        f"fixed cost {totals['run'] - totals['batches']:.1f} s over {len(groups)} runs"
    )


if __name__ == "__main__":
    main()
