"""Scales: the sizes an experiment config offers (its ``first_look:``, ``quick:`` and ``full:`` sections), read from
``evaluation/configs/*.yaml`` (`load_scale`), what each costs (`CPU_MINUTES`, the progress estimates ``hf-mdm
reproduce`` prints), and shrunk to a miniature (`miniature`).

- ``first_look`` (the default of ``make reproduce``): every experiment and every kind of finding of the report, with
  fewer samples, shorter training and fewer lengths and repeats: 19.5 CPU-minutes measured, about 12 minutes on 2
  CPU cores (the block diffusion experiment, 8.1, after the TER one, 2.3, is the longest chain of the schedule);
- ``quick`` (``make reproduce-quick``): the committed ``results/REPORT.md``, about an hour on 2 CPU cores;
- ``full`` (``make reproduce-paper``): the paper's scale, for a GPU (days).

``CPU_MINUTES`` holds each experiment's measured CPU time per scale (the experiment's own process on one thread,
``time.process_time``, which contention for the cores barely changes, unlike wall time); `estimate_line` turns it
into the estimate of a progress line and `wall_estimate` into the run's expected wall time.

A miniature keeps every key of a scale and its languages, samplers and code path, and swaps the sizes for tiny ones
(``MINIATURE`` for the experiment's own keys, ``MINIATURE_TRAINING`` for its training settings and a language entry's
overrides, ``MINIATURE_FAST`` for its ``fast_samplers`` section; nested ``trained`` and ``timing`` sections alike): the
paper-scale ``--full`` scales run end to end in seconds this way (``tests/experiments/test_experiments.py``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Optional

SCALES = ("first_look", "quick", "full")
DEFAULT_SCALE = "first_look"
#: Where each scale writes by default: the quick run's report is the committed one (results/), the others beside.
OUTPUT_DIRS = {"first_look": "results/first_look", "quick": "results", "full": "results/full"}
#: CPU minutes per experiment (the experiment's own process, one thread, ``time.process_time``). first_look: measured
#: from an empty output folder on the 2-core machine (each experiment's models trained once, as in a fresh run; 19.5
#: in all). quick: the committed report's runs (their minutes per experiment, one thread each; the RL experiment's
#: 32 GRPO runs measured alone: 12.5 CPU-minutes, 18.3 wall beside other jobs).
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
        "rl": 12.5,
        "wallclock": 5.0,
    },
}


def estimate_line(scale_name: str, name: str) -> str:
    """What a progress line says of an experiment's expected time under ``scale_name``."""
    minutes = CPU_MINUTES.get(scale_name, {}).get(name)
    if minutes is None:
        return "no estimate for this scale (the paper's scale: hours to days on a GPU)"
    return f"about {minutes:.1f} CPU-min"


def wall_estimate(scale_name: str, names: list[str], jobs: int, after: Optional[dict] = None) -> Optional[float]:
    """Expected wall minutes of ``names`` under ``scale_name`` on ``jobs`` cores, as ``hf-mdm reproduce`` schedules
    them: the independent experiments first, in order, each on the first free core; one that reuses the models of
    others (``after``: name -> those it waits for) when they have finished; then the timing one (``wallclock``)
    alone. None where a scale has no measured table."""
    table, after = CPU_MINUTES.get(scale_name), after or {}
    if table is None or any(name not in table for name in names):
        return None
    parallel = [n for n in names if n != "wallclock"]
    waits = {n: [d for d in after.get(n, ()) if d in parallel] for n in parallel}
    free, done = [0.0] * max(1, jobs), {}
    for name in [n for n in parallel if not waits[n]] + [n for n in parallel if waits[n]]:
        core = min(range(len(free)), key=free.__getitem__)
        free[core] = done[name] = max([free[core], *(done[d] for d in waits[name])]) + table[name]
    return max(done.values(), default=0.0) + table["wallclock"] * ("wallclock" in names)


#: The experiment-level sizes of a miniature: only keys the scale has are replaced.
MINIATURE = {
    "num_samples": 16,
    "nll_sequences": 8,
    "lengths": [8, 16],
    "train_length": 8,
    "steps": [2, 8],
    "size": "tiny",
    "batch_size": 2,
    "mdm_steps": [4],
    "repeats": 1,
    "dual_cache_blocks": 2,
    "block_sizes": [1, 4, 16],
    "steps_per_block": [1, 4],
    "length": 8,
    "ter_samples": 4,
    "ter_particles": 8,
    "exact": {"length": 3, "steps": [1, 2]},
    "seeds": [0, 1],
    "budget_mdm_steps": 2,
    "ar_training_steps": 2,
    "diffusion_training_steps": 2,
    "rollout_steps": [2, 8],
    "rl_steps": [2],
}
#: The training settings of a miniature (a scale's ``training`` and a language entry's ``training``).
MINIATURE_TRAINING = {
    "size": "tiny",
    "num_train": 64,
    "num_validation": 16,
    "batch_size": 16,
    "max_steps": 2,
    "ar_max_steps": 2,
    "warmup_steps": 0,
}
#: The ``fast_samplers`` section of a miniature: blocks that fit ``MINIATURE["train_length"]``.
MINIATURE_FAST = {"block_length": 4}
#: The ``grpo`` section of a miniature (the RL experiment's): two steps of two groups of two.
MINIATURE_GRPO = {"max_steps": 2, "batch_size": 4, "num_generations": 2}


def load_scale(config_path: Path, full: bool = False, scale_name: str = "") -> tuple[str, dict]:
    """``(experiment name, scale)`` from a YAML config with ``experiment:``, ``quick:`` and ``full:`` sections (and
    the other scales of ``scales.SCALES``): the ``scale_name`` section, else ``full:`` or ``quick:``; a one-line
    ValueError naming the file when it does not read as one or lacks that section."""
    from ..fileio import read_yaml

    config = read_yaml(config_path, "experiment config")
    if not isinstance(config, dict):
        raise ValueError(
            f"{config_path}: an experiment config is a YAML mapping with experiment:, quick: and full: sections"
        )
    section = scale_name or ("full" if full else "quick")
    for key in dict.fromkeys(("experiment", "quick", "full", section)):
        if key not in config:
            raise ValueError(f"{config_path}: missing the `{key}` field")
    return config["experiment"], config[section]


def miniature(scale: dict) -> dict:
    """A copy of ``scale`` with the same keys and tiny sizes (``MINIATURE``, ``MINIATURE_TRAINING``,
    ``MINIATURE_FAST``): the same experiment and code path in seconds."""
    small = copy.deepcopy(scale)
    _replace(small, MINIATURE)
    _replace(small.get("training", {}), MINIATURE_TRAINING)
    for spec in small.get("languages", []):
        _replace(spec, {"lengths": MINIATURE["lengths"]})  # a language's own lengths (the sampler comparison's)
        _replace(spec.get("training", {}), MINIATURE_TRAINING)
    _replace(small.get("fast_samplers", {}), MINIATURE_FAST)
    _replace(small.get("grpo", {}), MINIATURE_GRPO)
    _replace(small.get("kl_sweep", {}), {"rollout_steps": MINIATURE["rl_steps"][0], "betas": [0.04]})
    _replace(small.get("steps_for_ser", {}), {"lengths": [8, 16, 32]})  # three lengths: a slope and its interval
    for part in ("trained", "timing", "equal_flops", "a2d"):  # nested sections (the block diffusion experiment's)
        if part in small:
            small[part] = miniature(small[part])
    return small


def _replace(section: dict, sizes: dict) -> None:
    for key, value in sizes.items():
        if key in section:
            section[key] = copy.deepcopy(value)
