"""``hf-mdm reproduce`` and ``hf-mdm bench``: the synthetic experiments of `evaluation/configs`, the independent ones
side by side (one process per core), the timing one alone, then ``results/REPORT.md``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

CONFIG_DIR = Path("evaluation") / "configs"
EXPERIMENT_CONFIGS = ("ter_vs_steps", "ser_vs_steps", "samplers", "block_diffusion", "wallclock")
#: Experiments that reuse another's trained models start when it has finished (never train the same model twice).
AFTER = {"samplers": ("ter_vs_steps", "ser_vs_steps")}


def _run_experiment(name: str, config_dir: Path, output_dir: Path, full: bool) -> dict:
    from .experiments import load_preset, run_experiment

    path = config_dir / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"no experiment config {path}: run from the repository root or pass --config-dir")
    experiment, preset = load_preset(path, full=full)
    return run_experiment(experiment, preset, output_dir)


def _bench(args: argparse.Namespace) -> int:
    result = _run_experiment("wallclock", Path(args.config_dir), Path(args.output_dir), args.full)
    print((Path(args.output_dir) / "wallclock.md").read_text())
    return 0 if result else 1


def _experiment_worker(name: str, config_dir: str, output_dir: str, full: bool) -> float:
    import time

    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    _run_experiment(name, Path(config_dir), Path(output_dir), full)
    return time.perf_counter() - start


def _reproduce(args: argparse.Namespace) -> int:
    """Run the experiments, the independent ones side by side (one process per core), timing ones alone."""
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    from .report import write_report

    output_dir = Path(args.output_dir)
    names = list(args.only or EXPERIMENT_CONFIGS)
    parallel = [n for n in names if n != "wallclock"]
    start = time.perf_counter()
    seconds: dict[str, float] = {}
    workers = max(1, min(len(parallel), args.jobs))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        submit = lambda n: pool.submit(_experiment_worker, n, args.config_dir, str(output_dir), args.full)  # noqa: E731
        futures = {n: submit(n) for n in parallel if not set(AFTER.get(n, ())) & set(parallel)}
        for n in parallel:
            if n not in futures:  # after the experiments whose models it reuses
                for first in set(AFTER[n]) & set(parallel):
                    seconds[first] = futures[first].result()
                futures[n] = submit(n)
        for n, future in futures.items():
            seconds[n] = future.result()
    if "wallclock" in names:  # alone, so that nothing else competes for the cores while it times
        seconds["wallclock"] = _experiment_worker("wallclock", args.config_dir, str(output_dir), args.full)
    for name in names:
        print(f"\n== {name} ({seconds[name]:.0f} s) ==\n")
        print((output_dir / f"{name}.md").read_text())
    report = write_report(output_dir, full=args.full)
    print(f"report: {report} (total {time.perf_counter() - start:.0f} s)")
    return 0


def add_experiment_commands(commands: Any, at_least: Callable) -> None:
    """``hf-mdm bench`` and ``hf-mdm reproduce`` (``at_least``: the command line's integer-range type)."""
    for name, func, help_text in (
        ("bench", _bench, "MDM vs AR wall-clock as L grows"),
        ("reproduce", _reproduce, "the paper's synthetic experiments and results/REPORT.md"),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--full", action="store_true", help="the paper's scale (GPU) instead of the quick preset")
        sub.add_argument("--output-dir", default="results")
        sub.add_argument("--config-dir", default=str(CONFIG_DIR))
        if name == "reproduce":
            sub.add_argument("--only", nargs="+", choices=EXPERIMENT_CONFIGS)
            sub.add_argument("--jobs", type=at_least(1), default=2, help="experiments run side by side (one per core)")
        sub.set_defaults(func=func)
