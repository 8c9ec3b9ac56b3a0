"""Presets: read from ``evaluation/configs/*.yaml`` (``load_preset``), and shrunk to a miniature (``miniature``).

A miniature keeps every key of a preset and its languages, samplers and code path, and swaps the sizes for tiny
ones (``MINIATURE`` for the experiment's own keys, ``MINIATURE_TRAINING`` for its training settings and a language
entry's overrides, ``MINIATURE_FAST`` for its ``fast_samplers`` section; nested ``trained`` and ``timing`` sections alike): the paper-scale ``--full`` presets run
end to end in seconds this way (``tests/test_experiments.py``).
"""

from __future__ import annotations

import copy
from pathlib import Path

#: The experiment-level sizes of a miniature: only keys the preset has are replaced.
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
#: The training settings of a miniature (a preset's ``training`` and a language entry's ``training``).
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


def load_preset(config_path: Path, full: bool = False, profile: str = "") -> tuple[str, dict]:
    """``(experiment name, preset)`` from a YAML config with ``experiment:``, ``quick:`` and ``full:`` sections (and
    the other profiles of ``profiles.PROFILES``): the ``profile`` section, else ``full:`` or ``quick:``; a one-line
    ValueError naming the file when it does not read as one or lacks that section."""
    from ..fileio import read_yaml

    config = read_yaml(config_path, "experiment config")
    if not isinstance(config, dict):
        raise ValueError(
            f"{config_path}: an experiment config is a YAML mapping with experiment:, quick: and full: sections"
        )
    section = profile or ("full" if full else "quick")
    for key in dict.fromkeys(("experiment", "quick", "full", section)):
        if key not in config:
            raise ValueError(f"{config_path}: missing the `{key}` field")
    return config["experiment"], config[section]


def miniature(preset: dict) -> dict:
    """A copy of ``preset`` with the same keys and tiny sizes (``MINIATURE``, ``MINIATURE_TRAINING``,
    ``MINIATURE_FAST``): the same experiment and code path in seconds."""
    small = copy.deepcopy(preset)
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
