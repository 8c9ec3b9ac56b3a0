"""Profiles: the sizes an experiment config offers (its ``first_look:``, ``quick:`` and ``full:`` sections), what each
costs, and the progress estimate ``hf-mdm reproduce`` prints.

- ``first_look`` (the default of ``make reproduce``): every experiment and every kind of finding of the report, with
  fewer samples, shorter training and fewer lengths and repeats: 19.5 CPU-minutes measured, about 12 minutes on 2
  CPU cores (the block diffusion experiment, 8.1, after the TER one, 2.3, is the longest chain of the schedule);
- ``quick`` (``make reproduce-quick``): the committed ``results/REPORT.md``, one to two hours on 2 CPU cores;
- ``full`` (``make reproduce-paper``): the paper's scale, for a GPU (days).

``CPU_MINUTES`` holds each experiment's measured CPU time per profile (the experiment's own process on one thread,
``time.process_time``, which contention for the cores barely changes, unlike wall time); ``estimate_line`` turns it
into the estimate of a progress line and ``wall_estimate`` into the run's expected wall time.
"""

from __future__ import annotations

from typing import Optional

PROFILES = ("first_look", "quick", "full")
DEFAULT_PROFILE = "first_look"
#: Where each profile writes by default: the quick run's report is the committed one (results/), the others beside.
OUTPUT_DIRS = {"first_look": "results/first_look", "quick": "results", "full": "results/full"}
#: CPU minutes per experiment (the experiment's own process, one thread, ``time.process_time``). first_look: measured
#: from an empty output folder on the 2-core machine (each experiment's models trained once, as in a fresh run; 19.5
#: in all). quick: the committed report's run (its minutes per experiment, one thread each), the RL experiment
#: estimated from one GRPO run's measured CPU time (0.19 s a step of 16 completions with `decoding`, 0.08 with
#: `coupled`, 4 to 7 s to measure a policy) times its 48 runs.
CPU_MINUTES: dict[str, dict[str, float]] = {
    "first_look": {
        "ter_vs_steps": 2.3,
        "ser_vs_steps": 2.5,
        "samplers": 0.7,
        "block_diffusion": 8.1,
        "rl": 5.0,
        "wallclock": 0.8,
    },
    "quick": {
        "ter_vs_steps": 35.0,
        "ser_vs_steps": 11.0,
        "samplers": 1.0,
        "block_diffusion": 20.0,
        "rl": 57.0,
        "wallclock": 5.0,
    },
}


def estimate_line(profile: str, name: str) -> str:
    """What a progress line says of an experiment's expected time under ``profile``."""
    minutes = CPU_MINUTES.get(profile, {}).get(name)
    if minutes is None:
        return "no estimate for this profile (the paper's scale: hours to days on a GPU)"
    return f"about {minutes:.1f} CPU-min"


def wall_estimate(profile: str, names: list[str], jobs: int, after: Optional[dict] = None) -> Optional[float]:
    """Expected wall minutes of ``names`` under ``profile`` on ``jobs`` cores, as ``hf-mdm reproduce`` schedules
    them: the independent experiments first, in order, each on the first free core; one that reuses the models of
    others (``after``: name -> those it waits for) when they have finished; then the timing one (``wallclock``)
    alone. None where a profile has no measured table."""
    table, after = CPU_MINUTES.get(profile), after or {}
    if table is None or any(name not in table for name in names):
        return None
    parallel = [n for n in names if n != "wallclock"]
    waits = {n: [d for d in after.get(n, ()) if d in parallel] for n in parallel}
    free, done = [0.0] * max(1, jobs), {}
    for name in [n for n in parallel if not waits[n]] + [n for n in parallel if waits[n]]:
        core = min(range(len(free)), key=free.__getitem__)
        free[core] = done[name] = max([free[core], *(done[d] for d in waits[name])]) + table[name]
    return max(done.values(), default=0.0) + table["wallclock"] * ("wallclock" in names)
