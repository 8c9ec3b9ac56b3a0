"""Profiles: the sizes an experiment config offers (its ``first_look:``, ``quick:`` and ``full:`` sections), what each
costs, and the progress estimate ``hf-mdm reproduce`` prints.

- ``first_look`` (the default of ``make reproduce``): every experiment and every kind of finding of the report, with
  fewer samples, shorter training and fewer lengths and repeats, in about 15 minutes on 2 CPU cores;
- ``quick`` (``make reproduce-quick``): the committed ``results/REPORT.md``, about an hour on 2 CPU cores;
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
#: CPU minutes per experiment, measured on the 2-core machine the committed report was made on, one thread each
#: (the quick RL experiment: 48 GRPO runs, from one run's measured CPU time times the runs).
CPU_MINUTES: dict[str, dict[str, float]] = {
    "first_look": {
        "ter_vs_steps": 4.0,
        "ser_vs_steps": 4.0,
        "samplers": 1.0,
        "block_diffusion": 4.0,
        "rl": 5.0,
        "wallclock": 1.0,
    },
    "quick": {
        "ter_vs_steps": 35.0,
        "ser_vs_steps": 11.0,
        "samplers": 1.0,
        "block_diffusion": 20.0,
        "rl": 25.0,
        "wallclock": 5.0,
    },
}


def estimate_line(profile: str, name: str) -> str:
    """What a progress line says of an experiment's expected time under ``profile``."""
    minutes = CPU_MINUTES.get(profile, {}).get(name)
    if minutes is None:
        return "no estimate for this profile (the paper's scale: hours to days on a GPU)"
    return f"about {minutes:.0f} CPU-min"


def wall_estimate(profile: str, names: list[str], jobs: int) -> Optional[float]:
    """Expected wall minutes of ``names`` under ``profile``: the experiments side by side over ``jobs`` cores, then
    the timing one (``wallclock``) alone; None where a profile has no measured table."""
    table = CPU_MINUTES.get(profile)
    if table is None or any(name not in table for name in names):
        return None
    parallel = sum(table[n] for n in names if n != "wallclock")
    longest = max([table[n] for n in names if n != "wallclock"], default=0.0)
    return max(parallel / max(1, jobs), longest) + table.get("wallclock", 0.0) * ("wallclock" in names)
