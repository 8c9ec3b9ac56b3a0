"""``hf-mdm compare --config evaluation/configs/<name>.yaml``: accuracy against time, models x settings x tasks.

Every cell (model, setting, task) is one in-process lm-eval run (`hf_mdm.harness.simple_evaluate`) whose
accuracy and timing come from the same requests. Finished cells are saved as ``<output_dir>/cells/*.json`` (written
atomically) and reused when the command runs again, and within a cell every finished request is kept in lm-eval's
request cache (``<output_dir>/cache``, `hf_mdm.harness.resume`), so a matrix interrupted or killed at any point
resumes where it stopped, with the results of an uninterrupted run. The
summary is ``results.csv``, ``results.md`` and ``accuracy_vs_time.png`` (the paper's Figure 1: accuracy against
the time of the whole benchmark, one panel per benchmark), with the paper's published numbers
(``paper_numbers.json``) beside ours where they exist. Launched with ``accelerate launch -m
hf_mdm.harness.compare``, every process runs the matrix and requests are sharded; the main process writes.

A config key no section takes is a one-line error naming it and the keys that section accepts, before anything
runs; so are generation kwargs ``hf_mdm`` does not take. Ctrl-C ends a run with one line saying how many cells
finished and the command that resumes it (exit status 130).

Config (YAML)::

    name: paper_gsm8k
    output_dir: runs/compare/paper_gsm8k      # relative to the working directory
    tiny_models: runs/tiny/models               # optional: build the tiny local models there, as {tiny_models}
    tasks: [mdm_gsm8k]
    metrics: {mdm_gsm8k: "exact_match,strict-match"}   # optional; defaults in DEFAULT_METRICS
    evaluate: {batch_size: 1, limit: null, log_samples: true, gen_kwargs: {...}}  # simple_evaluate arguments
    models:
      - name: LLaDA-8B-Base                    # also the paper's model name, unless `paper_model` says otherwise
        model: hf_mdm                          # hf_mdm or hf_timed (any registered lm-eval model)
        model_args: {pretrained: GSAI-ML/LLaDA-8B-Base, dtype: bfloat16, block_length: 32}
        settings:                              # default: one setting named "default"
          - {name: 64 steps, model_args: {steps: 64}}
          - {name: left-to-right, model_args: {strategy: left_to_right, steps: 256}, tasks: [mdm_humaneval]}
"""

from __future__ import annotations

import argparse
import difflib
import gc
import inspect
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ..fileio import read_yaml, write_atomic
from .compare_tables import csv_text, markdown, plot

__all__ = [
    "CompareConfig",
    "Cell",
    "load_config",
    "run_matrix",
    "write_report",
    "paper_numbers",
    "add_arguments",
    "check_config",
    "check_cell_gen_kwargs",
    "run",
    "main",
]

DEFAULT_METRICS = {
    "mdm_gsm8k": "exact_match,strict-match",
    "mdm_gsm8k_chain": "exact_match,none",
    "mdm_mbpp": "pass_at_1,sandbox",
    "mdm_humaneval": "pass_at_1,sandbox",
}
PAPER_NUMBERS = Path(__file__).resolve().parent / "paper_numbers.json"
CONFIG_KEYS = ("name", "output_dir", "tiny_models", "tasks", "metrics", "evaluate", "models")
MODEL_KEYS = ("name", "model", "model_args", "settings", "tasks", "gen_kwargs", "paper_model")
SETTING_KEYS = ("name", "model_args", "tasks", "gen_kwargs")
_SET_BY_COMPARE = ("model", "model_args", "tasks", "task_manager", "evaluation_tracker")  # not `evaluate` keys


@dataclass
class Cell:
    """One run of the matrix: a model in one setting on one task."""

    model_name: str
    setting: str
    task: str
    model: str
    model_args: dict
    gen_kwargs: dict
    paper_model: str

    @property
    def slug(self) -> str:
        return "__".join(_slug(part) for part in (self.model_name, self.setting, self.task))


@dataclass
class CompareConfig:
    """A parsed compare config (see the module docstring)."""

    name: str
    output_dir: Path
    cells: list[Cell]
    metrics: dict[str, str] = field(default_factory=dict)
    evaluate: dict = field(default_factory=dict)

    def metric(self, task: str) -> str:
        return self.metrics.get(task) or DEFAULT_METRICS.get(task) or "exact_match,none"


def load_config(path: str | os.PathLike, limit: Optional[float] = None) -> CompareConfig:
    """Read a compare config; builds the tiny local models first if it names ``tiny_models``."""
    raw = read_yaml(path, "compare config") or {}
    check_config(raw, path)
    replacements = {}
    if raw.get("tiny_models"):
        from .tiny import build_tiny_models

        replacements["tiny_models"] = str(Path(build_tiny_models(raw["tiny_models"])["mdm"]).parent)
    raw = _substitute(raw, replacements)
    evaluate = dict(raw.get("evaluate") or {})
    if limit is not None:
        evaluate["limit"] = limit
    tasks = list(raw.get("tasks") or [])
    cells = []
    for spec in raw.get("models") or []:
        for setting in spec.get("settings") or [{"name": "default"}]:
            for task in setting.get("tasks") or spec.get("tasks") or tasks:
                cells.append(
                    Cell(
                        model_name=str(spec["name"]),
                        setting=str(setting.get("name", "default")),
                        task=task,
                        model=spec.get("model", "hf_mdm"),
                        model_args={**(spec.get("model_args") or {}), **(setting.get("model_args") or {})},
                        gen_kwargs={
                            **(evaluate.get("gen_kwargs") or {}),
                            **(spec.get("gen_kwargs") or {}),
                            **(setting.get("gen_kwargs") or {}),
                        },
                        paper_model=str(spec.get("paper_model", spec["name"])),
                    )
                )
    if not cells:
        raise ValueError(f"{path}: no cells: give `models` (with `settings`) and `tasks`")
    name = str(raw.get("name") or Path(path).stem)
    output_dir = Path(raw.get("output_dir") or Path("runs") / "compare" / name)
    return CompareConfig(
        name=name, output_dir=output_dir, cells=cells, metrics=dict(raw.get("metrics") or {}), evaluate=evaluate
    )


def evaluate_keys() -> list[str]:
    """The keys of a config's ``evaluate`` section: the arguments of ``lm_eval.simple_evaluate`` that compare does
    not set itself (``batch_size``, ``device``, ``limit``, ``gen_kwargs``, ``use_cache``, ...)."""
    from lm_eval.evaluator import simple_evaluate

    return [name for name in inspect.signature(simple_evaluate).parameters if name not in _SET_BY_COMPARE]


def check_config(raw: Any, path: str | os.PathLike) -> None:
    """A ValueError for the first key of a raw config that its section does not take (naming the key, the closest
    accepted one and all of them), or for a section of the wrong kind (a list where a mapping belongs)."""
    _check_keys(raw, CONFIG_KEYS, "the config", path)
    for section in ("evaluate", "metrics"):
        _check_mapping(raw.get(section), f"`{section}`", path)
    _check_list(raw.get("tasks"), "`tasks`", path)
    _check_keys(raw.get("evaluate") or {}, evaluate_keys(), "`evaluate`", path)
    _check_mapping((raw.get("evaluate") or {}).get("gen_kwargs"), "`evaluate.gen_kwargs`", path)
    for index, spec in enumerate(_check_list(raw.get("models"), "`models`", path)):
        _check_keys(spec, MODEL_KEYS, f"`models[{index}]`", path)
        if "name" not in spec:
            raise ValueError(f"{path}: `models[{index}]` has no `name`: give every model a name")
        _check_parts(spec, f"models[{index}]", f" ({spec['name']})", path)
        for number, setting in enumerate(_check_list(spec.get("settings"), f"`models[{index}].settings`", path)):
            where = f"models[{index}].settings[{number}]"
            _check_keys(setting, SETTING_KEYS, f"`{where}` ({spec['name']})", path)
            _check_parts(setting, where, f" ({spec['name']})", path)


def _check_parts(section: dict, where: str, label: str, path: str | os.PathLike) -> None:
    for item in ("model_args", "gen_kwargs"):
        _check_mapping(section.get(item), f"`{where}.{item}`{label}", path)
    _check_list(section.get("tasks"), f"`{where}.tasks`{label}", path)


def _check_keys(section: Any, accepted: Sequence[str], where: str, path: str | os.PathLike) -> None:
    _check_mapping(section, where, path)
    for key in section:
        if key not in accepted:
            near = difflib.get_close_matches(str(key), accepted, n=1, cutoff=0.6)
            raise ValueError(
                f"{path}: unknown key {key!r} in {where}"
                + (f" (did you mean {near[0]!r}?)" if near else "")
                + f"; accepted keys: {', '.join(accepted)}"
            )


def _check_mapping(value: Any, where: str, path: str | os.PathLike) -> None:
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{path}: {where} must be a mapping ({{key: value}}), got {value!r}")


def _check_list(value: Any, where: str, path: str | os.PathLike) -> list:
    if value is not None and not isinstance(value, list):
        raise ValueError(f"{path}: {where} must be a list ([a, b]), got {value!r}")
    return value or []


def _substitute(value: Any, replacements: dict[str, str]) -> Any:
    if isinstance(value, str) and replacements:
        return re.sub(r"\{(\w+)\}", lambda m: replacements.get(m.group(1), m.group(0)), value)
    if isinstance(value, dict):
        return {k: _substitute(v, replacements) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, replacements) for v in value]
    return value


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def _is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


# -- running -------------------------------------------------------------------------------------------------------


def run_matrix(config: CompareConfig, force: bool = False) -> list[Path]:
    """Run every cell without a saved result (all cells with ``force``); returns the cell files written.

    Cells of the same model and setting share one loaded model.
    """
    from .evaluator import create_lm, simple_evaluate

    cells_dir = config.output_dir / "cells"
    todo = [c for c in config.cells if force or not (cells_dir / f"{c.slug}.json").is_file()]
    written = []
    groups: dict[tuple, list[Cell]] = {}
    for cell in todo:
        key = (cell.model_name, cell.setting, cell.model, json.dumps(cell.model_args, sort_keys=True))
        groups.setdefault(key, []).append(cell)
    evaluate = {k: v for k, v in config.evaluate.items() if k not in ("gen_kwargs",)}
    lm_kwargs = {k: evaluate.pop(k) for k in ("batch_size", "max_batch_size", "device") if k in evaluate}
    evaluate.pop("use_cache", None)
    for cells in groups.values():
        first = cells[0]
        lm = create_lm(first.model, dict(first.model_args), **lm_kwargs)
        for cell in cells:
            cache = _request_cache(config, cell, force)
            results = simple_evaluate(
                lm,
                model_args=cell.model_args,
                tasks=[cell.task],
                gen_kwargs=cell.gen_kwargs or None,
                use_cache=cache,
                **evaluate,
            )
            if results is not None and _is_main_process():
                written.append(_save_cell(cells_dir, cell, results, config.metric(cell.task)))
        del lm
        gc.collect()
        _empty_device_cache()
    return written


def _cache_root(config: CompareConfig) -> Optional[Path]:
    """The folder of the request caches: ``<output_dir>/cache``; ``evaluate: {use_cache: false}`` turns them off, a
    string puts them elsewhere."""
    use_cache = config.evaluate.get("use_cache", True)
    if use_cache is False or use_cache is None:
        return None
    return Path(use_cache) if isinstance(use_cache, (str, os.PathLike)) else config.output_dir / "cache"


def _request_cache(config: CompareConfig, cell: Cell, force: bool) -> Optional[str]:
    """The cell's request-cache prefix (``<cache root>/<cell>``; the evaluator adds a fingerprint of the model and
    its arguments): a cell killed mid-way resumes from its finished requests; ``--force`` starts it anew."""
    root = _cache_root(config)
    if root is None:
        return None
    if force and _is_main_process():
        for stale in root.glob(f"{cell.slug}_*"):
            stale.unlink()
    return str(root / cell.slug)


def _empty_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _save_cell(cells_dir: Path, cell: Cell, results: dict, metric: str) -> Path:
    task_results = results["results"].get(cell.task, {})
    metric_name, _, filter_name = metric.partition(",")
    timing = results["timing"]["tasks"].get(cell.task, results["timing"]["all"])
    record = {
        "model_name": cell.model_name,
        "setting": cell.setting,
        "task": cell.task,
        "model": cell.model,
        "model_args": cell.model_args,
        "gen_kwargs": cell.gen_kwargs,
        "paper_model": cell.paper_model,
        "metric": metric,
        "accuracy": _number(task_results.get(metric)),
        "stderr": _number(task_results.get(f"{metric_name}_stderr,{filter_name}")),
        "results": task_results,
        "timing": timing,
        "limit": results["config"].get("limit"),
        "reproducibility": results["config"].get("reproducibility"),
        "n_samples": results.get("n-samples", {}).get(cell.task),
        "date": results.get("date"),
    }
    if "sandbox" in results:
        record["sandbox"] = results["sandbox"]
    path = cells_dir / f"{cell.slug}.json"
    write_atomic(path, json.dumps(record, indent=2, default=str))
    if results.get("samples", {}).get(cell.task):
        lines = "".join(json.dumps(s, default=str) + "\n" for s in results["samples"][cell.task])
        write_atomic(cells_dir.parent / "samples" / f"{cell.slug}.jsonl", lines)
    return path


def _number(value: Any) -> Optional[float]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


# -- report --------------------------------------------------------------------------------------------------------


def paper_numbers(path: Path = PAPER_NUMBERS) -> dict[tuple[str, str, str], dict]:
    """The paper's published (benchmark, model, setting) -> {accuracy (%), time_s}."""
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    return {(r["benchmark"], r["model"], r["setting"]): r for r in rows}


def benchmark_of(task: str) -> str:
    """``mdm_gsm8k`` -> ``gsm8k`` (the paper's benchmark name)."""
    return task[4:] if task.startswith("mdm_") else task


def collect_rows(config: CompareConfig) -> list[dict]:
    """One row per finished cell of the config, with the paper's numbers where they exist."""
    paper = paper_numbers()
    rows = []
    for cell in config.cells:
        path = config.output_dir / "cells" / f"{cell.slug}.json"
        if not path.is_file():
            continue
        record = json.loads(path.read_text(encoding="utf-8"))
        timing = record["timing"]
        benchmark = benchmark_of(cell.task)
        published = paper.get((benchmark, cell.paper_model, cell.setting), {})
        accuracy = record["accuracy"]
        rows.append(
            {
                "benchmark": benchmark,
                "task": cell.task,
                "model": cell.model_name,
                "setting": cell.setting,
                "metric": record["metric"],
                "accuracy": None if accuracy is None else 100.0 * accuracy,
                "stderr": None if record["stderr"] is None else 100.0 * record["stderr"],
                "time_s": timing["wall_s"],
                "summed_s": timing.get("summed_s"),
                "generate_s": timing["generate_s"],
                "requests": timing["requests"],
                "nfe_per_request": timing["nfe_per_request"],
                "tokens_per_s": timing["tokens_per_s"],
                "paper_accuracy": published.get("accuracy"),
                "paper_time_s": published.get("time_s"),
                "limit": record.get("limit"),
            }
        )
    return rows


def write_report(config: CompareConfig) -> dict[str, Path]:
    """Write ``results.csv``, ``results.md`` and ``accuracy_vs_time.png`` from the finished cells."""
    rows = collect_rows(config)
    out = config.output_dir
    paths = {"csv": out / "results.csv", "markdown": out / "results.md", "plot": out / "accuracy_vs_time.png"}
    write_atomic(paths["csv"], csv_text(rows))
    write_atomic(paths["markdown"], markdown(config, rows, PAPER_NUMBERS))
    write_atomic(paths["plot"], plot(config, rows))
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments of ``hf-mdm compare`` (for wiring into another parser)."""
    parser.add_argument("--config", required=True, help="compare config (YAML), e.g. evaluation/configs/tiny.yaml")
    parser.add_argument("--force", action="store_true", help="re-run finished cells")
    parser.add_argument("--report_only", action="store_true", help="only rebuild the table and plot from saved cells")
    parser.add_argument(
        "--limit",
        type=_positive_limit,
        default=None,
        help="override the config's limit (smoke runs): requests per task, or a fraction < 1",
    )
    return parser


def _positive_limit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    """Run ``hf-mdm compare`` with parsed arguments: every requirement of the whole matrix is checked before its
    first cell; Ctrl-C prints one line saying what finished and how to resume, and returns 130."""
    from .launch import check_launch, close_process_group
    from .requirements import check_requirements

    config: Optional[CompareConfig] = None
    try:
        check_launch()
        config = load_config(args.config, limit=args.limit)
        if not args.report_only:
            check_requirements(
                [c.task for c in config.cells],
                config.evaluate.get("confirm_run_unsafe_code", False),
                [c.model_args.get("pretrained") for c in config.cells],
            )
            check_cell_gen_kwargs(config)
            run_matrix(config, force=args.force)
        if _is_main_process():
            paths = write_report(config)
            print("\n".join(f"{kind}: {path}" for kind, path in paths.items()))
            print(paths["markdown"].read_text(encoding="utf-8"))
        close_process_group()
    except KeyboardInterrupt:
        if _is_main_process():
            print(f"hf-mdm compare: interrupted; {_resume_note(args, config)}", file=sys.stderr)
        return 130
    return 0


def check_cell_gen_kwargs(config: CompareConfig) -> None:
    """The generation kwargs of every ``hf_mdm`` cell, by name, before the first cell runs
    (`hf_mdm.harness.sampler_config.check_gen_kwargs`; with ``reference=auto``, the settings of every sampler pass
    here and the loaded model checks its own)."""
    from .sampler_config import canonical_reference, check_gen_kwargs

    for cell in config.cells:
        if cell.model == "hf_mdm" and cell.gen_kwargs:
            reference = canonical_reference(cell.model_args.get("reference", cell.model_args.get("preset", "auto")))
            check_gen_kwargs(cell.gen_kwargs, reference, f"gen_kwargs of {cell.model_name} / {cell.setting}")


def _resume_note(args: argparse.Namespace, config: Optional[CompareConfig]) -> str:
    """What an interrupted run leaves and the command that resumes it (finished cells are reused; the interrupted
    cell answers its finished requests from the request cache)."""
    command = f"hf-mdm compare --config {args.config}" + (f" --limit {args.limit:g}" if args.limit else "")
    if config is None:
        return f"no cell ran; start again with `{command}`"
    cells_dir = config.output_dir / "cells"
    done = sum((cells_dir / f"{c.slug}.json").is_file() for c in config.cells)
    cache = _cache_root(config)
    kept = f", the unfinished cell's finished requests in {cache}" if cache is not None else ""
    return (
        f"{done} of {len(config.cells)} cells finished (in {cells_dir}{kept}): run `{command}` (without --force) "
        "to resume where it stopped"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point: ``hf-mdm compare`` (wired by ``hf_mdm.cli``) and ``python -m hf_mdm.harness.compare``."""
    parser = add_arguments(argparse.ArgumentParser(prog="hf-mdm compare", description=__doc__.split("\n\n")[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
