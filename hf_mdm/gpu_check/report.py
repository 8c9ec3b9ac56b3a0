"""What the GPU check writes: ``gpu_check.json`` and ``gpu_check.md`` (the device, torch and CUDA versions, the CUDA
tests' outcome, the plan, the timing table with its limits, invariance, serving and the published figures), whole or
not at all."""

from __future__ import annotations

import dataclasses
import json
import platform
from pathlib import Path
from typing import Any, Optional

import torch
import transformers

from ..fileio import write_atomic
from .adaptive import interleaved_lines
from .invariance import Invariance
from .limits import PEAK_BANDWIDTH, PEAK_FLOPS
from .published import published_lines
from .schedule import Schedule
from .serving import serving_lines
from .table import Row

__all__ = ["environment", "write_report"]


def environment(device: str) -> dict[str, Any]:
    """The machine the numbers come from."""
    cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(torch.device(device))
        if cuda
        else f"CPU ({platform.processor() or platform.machine()})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
    }


TINY_NOTE = (
    "Tiny stand-ins (--tiny): each row's model is the named model's class at tiny sizes (hidden 64, 2 layers, "
    "vocabulary 512), so its timings check the code path, not that model's speed."
)


def _cell(value: Optional[float], digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _limit_cells(r: Row) -> str:
    return f"{_cell(r.flop_limit_ms, 2)} | {_cell(r.byte_limit_ms, 2)} | {_cell(r.limit_ratio, 2)}"


def markdown(env: dict[str, Any], done: dict[str, Any], settings: dict[str, Any], schedule: Schedule) -> str:
    """The report: the machine, the plan, the table, invariance, serving and the published figures."""
    tests = done["tests"]
    lines = [
        "# GPU check" + (": tiny stand-ins, not the named models' shapes" if settings.get("tiny") else ""),
        "",
        f"Device: {env['device']}; torch {env['torch']}, CUDA {env['cuda'] or '-'}, transformers {env['transformers']}.",
        f"CUDA tests: {tests.get('summary', '-')}.",
        "",
        *([TINY_NOTE, ""] if settings.get("tiny") else []),
        *schedule.lines(),
        "",
        f"Random weights, {settings['dtype']}; prompt {settings['prompt']} + {settings['new_tokens']} new tokens, blocks "
        f"of {settings['block']}, {settings['steps']} steps; median of {settings['repeats']} timed call(s) after a "
        "warm-up. Timing does not depend on the weights for fixed-step samplers; threshold decoding's does. *FLOP "
        f"limit*: a forward's FLOPs at {PEAK_FLOPS / 1e12:.0f} TFLOP/s; *byte limit*: the bytes it must read (weights "
        f"once, keys and values attended) at {PEAK_BANDWIDTH / 1e12:.1f} TB/s; *x limit*: ms / forward over the "
        "larger (`hf_mdm.gpu_check.limits`; an H200's rates, so on another device only the code path is checked).",
        "",
        "| model | batch | sampler | quantized | tokens/s | ms / forward | FLOP limit ms | byte limit ms | x limit | NFE | "
        "peak GiB | tokens equal | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in done["rows"]:
        equal = "-" if r.tokens_equal is None else ("yes" if r.tokens_equal else "NO")
        lines.append(
            f"| {r.model} | {r.batch} | {r.sampler} | {r.weights} | {_cell(r.tokens_per_s, 1)} | "
            f"{_cell(r.ms_per_forward, 2)} | {_limit_cells(r)} | {r.nfe if r.nfe is not None else '-'} | "
            f"{_cell(r.peak_memory_gib, 2)} | {equal} | {r.note} |"
        )
    lines += interleaved_lines(done.get("adaptive", []))
    lines += invariance_lines(done["invariance"]) + serving_lines(list(done["serving"]))
    return "\n".join(lines + published_lines(done["rows"])) + "\n"


def invariance_lines(invariance: list[Invariance]) -> list[str]:
    """The batch-invariance table: rows of one length batched against each alone (`hf_mdm.gpu_check.invariance`)."""
    if not invariance:
        return []
    lines = [
        "",
        "Batch invariance: 8 prompts of one length batched without padding against each alone (one forward's logits; "
        "the default sampler at temperature 0). Where every row is equal, equal-length batches are invariant here.",
        "",
        "| model | dtype | logits bitwise equal | largest logit difference | tokens equal |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in invariance:
        lines.append(
            f"| {r.model} | {r.dtype} | {r.logits_equal_rows} of {r.rows} | {r.max_logit_difference:.3g} | "
            f"{r.token_equal_rows} of {r.rows} |"
        )
    return lines


def write_report(
    output_dir: Path, env: dict, done: dict[str, Any], settings: dict, schedule: Schedule
) -> dict[str, Path]:
    """Both files under ``output_dir`` (``done``: `hf_mdm.gpu_check.execute`'s); returns their paths."""
    records = [{k: v for k, v in dataclasses.asdict(r).items() if k != "tokens"} for r in done["rows"]]
    plan = [
        {"part": e.item.label(), "kind": e.item.kind, "estimated_s": e.seconds, "basis": e.basis, "planned": e.planned}
        for e in schedule.entries
    ]
    payload = {"environment": env, "cuda_tests": done["tests"], "settings": settings, "rows": records}
    payload["plan"] = {"budget_s": schedule.budget_s, "total_s": schedule.total_s, "parts": plan}
    payload["threshold_vs_confidence"] = [dataclasses.asdict(r) for r in done.get("adaptive", [])]
    payload["batch_invariance"] = [dataclasses.asdict(r) for r in done["invariance"]]
    payload["serving"] = [dataclasses.asdict(r) for r in done["serving"]]
    paths = {"json": output_dir / "gpu_check.json", "markdown": output_dir / "gpu_check.md"}
    write_atomic(paths["json"], json.dumps(payload, indent=2, default=str))
    write_atomic(paths["markdown"], markdown(env, done, settings, schedule))
    return paths
