"""``make gpu-check``: everything hf_mdm measures on a GPU, in one unattended command that ends in minutes.

First the plan (`hf_mdm.gpu_check.schedule`): every part below with its estimated seconds on one H200, measured
where ``results/gpu`` timed it and estimated otherwise, kept in order while it fits the budget (8 minutes), printed
before anything runs; a part whose estimate would end past the deadline is skipped and named.

1. The real-shape table with random weights (`hf_mdm.gpu_check.table`, models in `hf_mdm.gpu_check.shapes`):
   LLaDA-8B, Dream-7B, LLaDA2.0-mini and the autoregressive Qwen2.5-7B and Llama-3-8B, every model's eager rows at
   batch 1, then at batch 32, then LLaDA-8B's dual cache with int8 and int4 weights; each row beside its two limits
   (`hf_mdm.gpu_check.limits`). After LLaDA-8B's batch-1 rows, threshold decoding against confidence decoding,
   called in turn (`hf_mdm.gpu_check.adaptive`).
2. Batch invariance (`hf_mdm.gpu_check.invariance`): whether rows of one length batched together get the bits each
   gets alone on this device, for each diffusion model.
3. Serving (`hf_mdm.gpu_check.serving`): concurrent requests as joined calls (``hf-mdm serve --scheduler join``)
   against one batched call, LLaDA-8B and LLaDA2.0-mini, 1 / 8 / 32 at once.
4. The costly rows, last: CUDA graphs (bfloat16, then int8 and int4), transformers' static cache, model by model so
   that each model's compiled forwards serve its later rows.
5. The CUDA tests (``pytest -m cuda``, `tests/gpu_check/test_cuda.py`; skipped, with the reason, where there is no GPU).
6. ``results/gpu/gpu_check.json`` and ``gpu_check.md``: the device, torch and CUDA versions, the plan, the tables,
   tokens/s beside published figures (`hf_mdm.gpu_check.published`); printed.

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

from ..quantization import quantize_weights
from .adaptive import measure_interleaved
from .invariance import measure_invariance
from .report import environment, write_report
from .schedule import BUDGET_S, Planned, Schedule, compile_caches, plan
from .serving import Serving, measure_serving
from .shapes import Shape, shapes
from .table import Row, RowSpec, Settings, measure_row, skipped_row, table_rows

__all__ = ["run", "run_cuda_tests", "execute"]

REPO = Path(__file__).resolve().parents[2]


def run_cuda_tests(timeout_s: float) -> dict[str, Any]:
    """``pytest -m cuda tests/gpu_check/test_cuda.py``: its summary line and exit code (None when the tests are not
    there)."""
    tests = REPO / "tests" / "gpu_check" / "test_cuda.py"
    if not tests.is_file():
        return {
            "summary": "not run: tests/gpu_check/test_cuda.py is not here (an installed package)",
            "returncode": None,
        }
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "-p", "no:logging"]
    command.append(str(tests))  # no:logging: a failing compiled test otherwise prints thousands of torch trace records
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"summary": f"stopped after {timeout_s:.0f} s", "returncode": None}
    lines = [line for line in done.stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    summary = lines[-1].strip("= ") if lines else (done.stdout + done.stderr)[-300:]
    return {"summary": summary, "returncode": done.returncode, "output_tail": done.stdout[-4000:]}


class _Models:
    """The model rows run on, kept built while consecutive rows share its model and weights (so its compiled
    forwards serve them all), then freed."""

    def __init__(self, shapes: dict[str, Shape], settings: Settings):
        self.shapes, self.settings, self.key, self.network = shapes, settings, None, None

    def get(self, spec: RowSpec):
        if self.key != (spec.model, spec.weights):
            self.free()
            network = self.shapes[spec.model].build(self.settings.dtype, self.settings.device)
            if spec.weights != "none":
                quantize_weights(network, spec.weights, self.settings.device, self.settings.group_size)
            self.key, self.network = (spec.model, spec.weights), network
        return self.network

    def prompt(self, batch: int) -> torch.Tensor:
        generator = torch.Generator(device="cpu").manual_seed(batch)
        vocab = self.network.config.vocab_size
        ids = torch.randint(3, min(vocab, 30000) - 2, (batch, self.settings.prompt), generator=generator)
        return ids.to(self.settings.device)

    def free(self) -> None:
        self.key, self.network = None, None
        if torch.device(self.settings.device).type == "cuda":
            torch.cuda.empty_cache()


def _measure(models: _Models, planned: Planned, done: list[Row]) -> Row:
    spec, settings = planned.item.spec, models.settings
    if not planned.planned:
        return skipped_row(spec, "not in the plan (past the budget)")
    if time.monotonic() + planned.seconds > settings.deadline:
        return skipped_row(spec, "time budget")
    try:
        network = models.get(spec)
    except ValueError as error:  # a quantization this machine cannot run (no torchao, a device int4 does not pack for)
        return skipped_row(spec, str(error))
    return measure_row(network, models.shapes[spec.model], spec, models.prompt(spec.batch), settings, done)


def _serve(shape: Shape, entries: list[Planned], settings: Settings) -> list[Serving]:
    """One model's serving rows: the planned counts in one call (one build), the others named as left out."""
    counts = tuple(e.item.count for e in entries if e.planned)
    rows = measure_serving(
        shape, settings.device, settings.dtype, settings.prompt, settings.new_tokens, counts, settings.deadline,
        settings.steps,
    ) if counts else []  # fmt: skip
    left_out = [e.item.count for e in entries if not e.planned]
    return rows + [Serving(shape.name, n, 0.0, 0.0, 0, "skipped: not in the plan (past the budget)") for n in left_out]


def execute(schedule: Schedule, shapes: list[Shape], settings: Settings, cuda: bool) -> dict[str, Any]:
    """Runs the planned parts in order (a part whose estimate would end past the deadline is skipped); returns the
    table's rows in table order, the invariance and serving rows and the CUDA tests' outcome."""
    by_name = {shape.name: shape for shape in shapes}
    models, rows, invariance, serving, adaptive = _Models(by_name, settings), [], [], [], []
    tests = {"summary": "not run: not in the plan (past the budget)", "returncode": None}
    for planned in schedule.entries:
        item = planned.item
        if item.kind not in ("row", "adaptive"):
            models.free()
        if item.kind == "row":
            rows.append(_measure(models, planned, rows))
        elif item.kind == "serving" and item.model not in {r.model for r in serving}:
            entries = [e for e in schedule.entries if e.item.kind == "serving" and e.item.model == item.model]
            serving += _serve(by_name[item.model], entries, settings)
        elif not planned.planned or time.monotonic() + planned.seconds > settings.deadline:
            continue
        elif item.kind == "adaptive":  # the model its batch-1 rows built
            network = models.get(item.spec)
            adaptive.append(measure_interleaved(network, by_name[item.model], models.prompt(1), settings))
        elif item.kind == "invariance":
            shape = by_name[item.model]
            measured = measure_invariance(
                shape, settings.device, settings.dtype, settings.prompt, settings.new_tokens, settings.steps
            )
            invariance.append(measured)
        elif item.kind == "cuda tests":
            tests = run_cuda_tests(min(240.0, max(planned.seconds, settings.deadline - time.monotonic())))
            print(f"gpu-check: CUDA tests: {tests['summary']}", flush=True)
    models.free()
    order = [s for shape in shapes for b in settings.batches for s in table_rows(shape, b, cuda)]
    key = {(s.model, s.batch, s.sampler, s.weights): n for n, s in enumerate(order)}
    rows.sort(key=lambda r: key[(r.model, r.batch, r.sampler, r.weights)])
    return {"rows": rows, "invariance": invariance, "serving": serving, "tests": tests, "adaptive": adaptive}


def run(
    device: str = "cuda",
    tiny: bool = False,
    quick: bool = False,
    output_dir: Path = Path("results/gpu"),
    budget_s: float = BUDGET_S,
    models: Optional[list[str]] = None,
) -> tuple[dict[str, Path], list[Row]]:
    """The plan (`hf_mdm.gpu_check.schedule`), printed, then run; returns the written paths and the table's rows."""
    start = time.monotonic()
    cuda = torch.device(device).type == "cuda"
    caches = compile_caches(Path("runs/inductor-cache").resolve()) if cuda else {}
    settings = Settings(device=device, dtype=torch.bfloat16 if cuda else torch.float32, deadline=start + budget_s)
    if tiny:
        settings.prompt, settings.new_tokens, settings.block, settings.steps = 32, 32, 8, 8
        settings.batches, settings.group_size = (1, 3), 32
    if quick:
        settings.batches = settings.batches[:1]
    chosen = shapes(tiny=tiny, names=models)
    schedule = plan(chosen, settings, cuda, budget_s, None if not tiny else lambda item, builds: (0.0, "tiny: none"))
    print("\n".join(["gpu-check: the plan", *schedule.lines()]), flush=True)
    done = execute(schedule, chosen, settings, cuda)
    recorded = {k: str(v) if k == "dtype" else v for k, v in vars(settings).items() if k != "deadline"}
    recorded.update(tiny=tiny, compile_caches=caches)  # tiny: the table says its rows are tiny stand-ins
    paths = write_report(Path(output_dir), environment(device), done, recorded, schedule)
    print(paths["markdown"].read_text(encoding="utf-8"))
    print(f"gpu-check: wrote {paths['json']} and {paths['markdown']} in {time.monotonic() - start:.0f} s")
    return paths, done["rows"]
