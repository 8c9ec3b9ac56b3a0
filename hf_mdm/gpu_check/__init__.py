"""``make gpu-check``: everything hf_mdm measures on a GPU, in one unattended command that ends in minutes.

1. The CUDA tests (``pytest -m cuda``, `tests/test_cuda.py`; skipped, with the reason, where there is no GPU).
2. The real-shape table with random weights (`hf_mdm.gpu_check.table`, models in `hf_mdm.gpu_check.shapes`):
   LLaDA-8B, Dream-7B, LLaDA2.0-mini and the autoregressive Qwen2.5-7B and Llama-3-8B, batch 1 and 32, in passes
   (``measure_in_passes``) so that the time budget skips the costly rows (CUDA graphs) rather than whole models.
3. Batch invariance (`hf_mdm.gpu_check.invariance`): whether rows of one length batched together get the bits each
   gets alone on this device, for each diffusion model, while the budget lasts.
4. Serving (`hf_mdm.gpu_check.serving`): concurrent requests as joined calls (``hf-mdm serve --scheduler join``)
   against one batched call, LLaDA-8B and LLaDA2.0-mini, 1 / 8 / 32 at once, while the budget lasts.
5. ``results/gpu/gpu_check.json`` and ``gpu_check.md``, naming the device and the torch and CUDA versions, printed.

The same command runs on the CPU with tiny shapes (``--device cpu --tiny``), as part of ``make test``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

from .invariance import measure_invariance
from .report import environment, write_report
from .serving import SERVED_MODELS, measure_serving
from .shapes import shapes
from .table import Row, Settings, measure_shape

__all__ = ["run", "run_cuda_tests"]

REPO = Path(__file__).resolve().parents[2]


def run_cuda_tests(timeout_s: float) -> dict[str, Any]:
    """``pytest -m cuda tests/test_cuda.py``: its summary line and exit code (None when the tests are not there)."""
    tests = REPO / "tests" / "test_cuda.py"
    if not tests.is_file():
        return {"summary": "not run: tests/test_cuda.py is not here (an installed package)", "returncode": None}
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "-p", "no:logging"]
    command.append(str(tests))  # no:logging: a failing compiled test otherwise prints thousands of torch trace records
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"summary": f"stopped after {timeout_s:.0f} s", "returncode": None}
    lines = [line for line in done.stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    summary = lines[-1].strip("= ") if lines else (done.stdout + done.stderr)[-300:]
    return {"summary": summary, "returncode": done.returncode, "output_tail": done.stdout[-4000:]}


def measure_in_passes(models: list, settings: Settings) -> list[Row]:
    """Cheapest first, so that the budget skips the costly rows rather than whole models: every model's eager rows at
    the first batch size, then at the others, then (on CUDA) the CUDA-graph rows, whose compilation dominates. Rows are
    returned in table order: model, batch, then pass."""
    cuda = torch.device(settings.device).type == "cuda"
    first, rest = settings.batches[:1], settings.batches[1:]
    passes = [(first, False), (rest, False)] + ([(settings.batches, True)] if cuda else [])
    rows: list[Row] = []
    for part, (batches, graphs) in enumerate(passes):
        for order, shape in enumerate(models):
            if not batches or (graphs and shape.kind != "diffusion"):
                continue
            print(f"gpu-check: {shape.name}, batch {', '.join(map(str, batches))}{', CUDA graphs' if graphs else ''}")
            rows += [
                (order, row.batch, part, row)
                for row in measure_shape(shape, settings, batches, graphs, [r[3] for r in rows])
            ]
    return [row for *_, row in sorted(rows, key=lambda r: r[:3])]


def run(
    device: str = "cuda",
    tiny: bool = False,
    quick: bool = False,
    output_dir: Path = Path("results/gpu"),
    budget_s: float = 330.0,
    tests_timeout_s: float = 240.0,
    models: Optional[list[str]] = None,
) -> tuple[dict[str, Path], list[Row]]:
    """The five steps (see the module docstring); returns the written paths and the table's rows."""
    start = time.monotonic()
    tests = run_cuda_tests(tests_timeout_s)
    print(f"gpu-check: CUDA tests: {tests['summary']}", flush=True)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    settings = Settings(device=device, dtype=dtype, deadline=start + budget_s)
    if tiny:
        settings.prompt, settings.new_tokens, settings.block, settings.steps = 32, 32, 8, 8
        settings.batches = (1, 3)
    if quick:
        settings.batches = settings.batches[:1]
    rows = measure_in_passes(shapes(tiny=tiny, names=models), settings)
    invariance = [
        measure_invariance(shape, device, dtype, settings.prompt, settings.new_tokens)
        for shape in shapes(tiny=tiny, names=models)
        if shape.kind == "diffusion" and time.monotonic() < settings.deadline
    ]
    counts = (1, 3) if tiny else (1, 8, 32)
    serving = [
        row
        for shape in shapes(tiny=tiny, names=models)
        if shape.name in SERVED_MODELS
        for row in measure_serving(
            shape, device, dtype, settings.prompt, settings.new_tokens, counts, settings.deadline
        )
    ]
    recorded = {k: str(v) if k == "dtype" else v for k, v in vars(settings).items() if k != "deadline"}
    recorded["tiny"] = tiny  # the table then says its rows are tiny stand-ins of the named shapes
    paths = write_report(Path(output_dir), environment(device), tests, rows, recorded, invariance, serving)
    print(paths["markdown"].read_text(encoding="utf-8"))
    print(f"gpu-check: wrote {paths['json']} and {paths['markdown']} in {time.monotonic() - start:.0f} s")
    return paths, rows
