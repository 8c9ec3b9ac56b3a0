"""``hf-mdm reproduce`` and ``hf-mdm bench``: the synthetic experiments of `evaluation/configs`, the independent ones
side by side (one process per core), the timing one alone, then ``results/REPORT.md``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .argtypes import at_least

CONFIG_DIR = Path("evaluation") / "configs"
EXPERIMENT_CONFIGS = ("ter_vs_steps", "ser_vs_steps", "samplers", "block_diffusion", "rl", "wallclock")
#: Experiments that reuse another's trained models start when it has finished (never train the same model twice).
AFTER = {"samplers": ("ter_vs_steps", "ser_vs_steps"), "rl": ("ser_vs_steps",)}
#: What ``hf-mdm bench`` is beside ``make bench``.
BENCH_RELATION = (
    "hf-mdm bench is the wallclock experiment of make reproduce (MDM against AR as L grows, results/wallclock.md); "
    "make bench (evaluation/bench.py) times the sampler's own costs (caches, fixed shapes, host syncs)."
)


def _run_experiment(name: str, config_dir: Path, output_dir: Path, scale_name: str) -> dict:
    from .experiments import load_scale, run_experiment

    path = check_config(config_dir / f"{name}.yaml", scale_name)
    experiment, scale = load_scale(path, scale_name=scale_name)
    return run_experiment(experiment, scale, output_dir)


def check_config(path: Path, scale_name: str = "quick") -> Path:
    """``path``, an experiment config that exists and reads as YAML with its sections (``scale_name``'s among them);
    else a one-line ValueError naming the file and what to change (the line and column where its YAML breaks)."""
    from .experiments import load_scale

    if not path.exists():
        raise ValueError(f"no experiment config {path}: run from the repository root or pass --config-dir")
    load_scale(path, scale_name=scale_name)  # reads it and checks its sections
    return path


def _scale_name(args: argparse.Namespace) -> str:
    """The scale asked for: ``--scale``, or ``full`` with ``--full``."""
    return "full" if args.full else args.scale


def _output_dir(args: argparse.Namespace) -> Path:
    """``--output-dir``, else the scale's own folder (``scales.OUTPUT_DIRS``)."""
    from .experiments.scales import OUTPUT_DIRS

    return Path(args.output_dir or OUTPUT_DIRS[_scale_name(args)])


def _bench(args: argparse.Namespace) -> int:
    """The ``wallclock`` experiment alone; cells already in its cache are reused, and the output says so."""
    check_config(Path(args.config_dir) / "wallclock.yaml", _scale_name(args))
    output_dir = _output_dir(args)
    cache = output_dir / "cache" / "wallclock.json"
    if cache.exists():
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(cache.stat().st_mtime))
        print(f"reusing the timings cached in {cache} (last written {stamp}); delete it to time again")
    result = _run_experiment("wallclock", Path(args.config_dir), output_dir, _scale_name(args))
    print((output_dir / "wallclock.md").read_text())
    print(BENCH_RELATION)
    return 0 if result else 1


def _experiment_worker(name: str, config_dir: str, output_dir: str, scale_name: str, announce: str = "") -> tuple:
    """Run one experiment on one thread (printing ``announce`` as it starts); its (wall, CPU) seconds, the CPU time
    the process's own (``time.process_time``: contention for the cores barely changes it)."""
    import torch

    if announce:
        print(announce, flush=True)
    torch.set_num_threads(1)
    start, cpu = time.perf_counter(), time.process_time()
    _run_experiment(name, Path(config_dir), Path(output_dir), scale_name)
    return time.perf_counter() - start, time.process_time() - cpu


class _Progress:
    """One line as each experiment starts (with its estimated CPU time under the scale) and ends, with how many
    remain."""

    def __init__(self, names: list[str], scale_name: str):
        self.total, self.started, self.done, self.start = len(names), 0, 0, time.perf_counter()
        self.scale_name = scale_name

    def starting(self, name: str) -> str:
        """The line an experiment prints as it starts (in its own process, when a core is free for it)."""
        from .experiments.scales import estimate_line

        self.started += 1
        return (
            f"[{self.started}/{self.total}] {name}: started, {estimate_line(self.scale_name, name)} "
            f"({self.total - self.started} still to start)"
        )

    def finished(self, name: str, seconds: tuple) -> None:
        self.done += 1
        elapsed = (time.perf_counter() - self.start) / 60
        print(
            f"[{self.done}/{self.total} done] {name}: {seconds[0] / 60:.1f} min, {seconds[1] / 60:.1f} CPU-min "
            f"({elapsed:.1f} min so far)",
            flush=True,
        )


def _run_side_by_side(parallel: list[str], args: argparse.Namespace, progress: _Progress) -> dict[str, tuple]:
    """The experiments of ``parallel`` in one process per core; one waits for those whose models it reuses."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    seconds: dict[str, tuple] = {}
    workers = max(1, min(len(parallel), args.jobs))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:

        def submit(name: str) -> Any:
            announce = progress.starting(name)
            future = pool.submit(
                _experiment_worker, name, args.config_dir, str(_output_dir(args)), _scale_name(args), announce
            )
            future.add_done_callback(lambda f: f.exception() or progress.finished(name, f.result()))
            return future

        futures = {n: submit(n) for n in parallel if not set(AFTER.get(n, ())) & set(parallel)}
        for n in parallel:
            if n not in futures:  # after the experiments whose models it reuses
                for first in set(AFTER[n]) & set(parallel):
                    seconds[first] = futures[first].result()
                futures[n] = submit(n)
        for n, future in futures.items():
            seconds[n] = future.result()
    return seconds


def _reproduce(args: argparse.Namespace) -> int:
    """Run the experiments, the independent ones side by side (one process per core), timing ones alone; then
    write the report and print a short summary (each experiment's time and table file, the report's summary)."""
    from .experiments.scales import wall_estimate
    from .report import report_summary, write_report

    output_dir, scale_name = _output_dir(args), _scale_name(args)
    names = list(args.only or EXPERIMENT_CONFIGS)
    for name in names:  # every config read before the first experiment starts
        check_config(Path(args.config_dir) / f"{name}.yaml", scale_name)
    minutes = wall_estimate(scale_name, names, args.jobs, AFTER)
    expected = f"about {minutes:.0f} min on {args.jobs} cores" if minutes else "no estimate"
    print(f"scale {scale_name} -> {output_dir} ({len(names)} experiments, {expected})", flush=True)
    progress = _Progress(names, scale_name)
    seconds = _run_side_by_side([n for n in names if n != "wallclock"], args, progress)
    if "wallclock" in names:  # alone, so that nothing else competes for the cores while it times
        announce = progress.starting("wallclock")
        seconds["wallclock"] = _experiment_worker("wallclock", args.config_dir, str(output_dir), scale_name, announce)
        progress.finished("wallclock", seconds["wallclock"])
    report = write_report(output_dir, scale_name=scale_name)
    print(
        "\n"
        + "\n".join(
            f"{name}: {seconds[name][0] / 60:.1f} min ({seconds[name][1] / 60:.1f} CPU-min), {output_dir / name}.md"
            for name in names
        )
    )
    print("\n" + report_summary(output_dir))
    print(f"\nreport: {report} (total {(time.perf_counter() - progress.start) / 60:.1f} min)")
    return 0


def add_commands(commands: Any) -> None:
    """``hf-mdm bench`` and ``hf-mdm reproduce``."""
    from .experiments.scales import DEFAULT_SCALE, SCALES

    for name, func, help_text in (
        (
            "bench",
            _bench,
            "the wallclock experiment of make reproduce alone (MDM vs AR as L grows; cached cells reused)",
        ),
        ("reproduce", _reproduce, "the paper's synthetic experiments and results/REPORT.md"),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument(
            "--scale",
            choices=SCALES,
            default=DEFAULT_SCALE,
            help="the size of every experiment (default: %(default)s, about 12 min on 2 CPU cores; quick: the "
            "committed report, about an hour; full: the paper's scale, for a GPU)",
        )
        sub.add_argument("--full", action="store_true", help="the same as --scale full")
        sub.add_argument(
            "--output-dir", default=None, help="default: results/first_look, results (quick) or results/full"
        )
        sub.add_argument("--config-dir", default=str(CONFIG_DIR))
        if name == "reproduce":
            sub.add_argument("--only", nargs="+", choices=EXPERIMENT_CONFIGS)
            sub.add_argument("--jobs", type=at_least(1), default=2, help="experiments run side by side (one per core)")
        sub.set_defaults(func=func)
