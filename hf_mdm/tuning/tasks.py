"""What ``hf-mdm tune`` measures a setting on: a task draws samples with a setting and scores them.

`SyntheticTask`: sequences of ``length`` tokens drawn from the empty prompt at temperature 1 and scored by a synthetic
language (`hf_mdm.languages`); the quality is the share of valid sequences, 1 - SER, with its 95% Wilson interval. The
development split and the held-out split are disjoint random streams (seeds from ``DEV_SEED`` and ``TEST_SEED``), so
the setting chosen on one is reported on the other. A chunk of samples is counted, not kept: valid sequences,
samples, the forwards in which each row revealed a token and the positions the forwards computed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..experiments.common import _device, sample_ar
from ..experiments.fast import active_steps, generate_batches
from ..generation import diffusion_generate
from ..metrics.common import wilson_interval

#: Seeds of the first sample of each split; chunk k of a split starts at its seed + the samples before it.
DEV_SEED, TEST_SEED = 0, 1_000_000_007


@dataclass
class Counts:
    """A chunk's or a setting's counts so far; adding two is measuring both."""

    valid: int = 0
    samples: int = 0
    forwards: float = 0.0
    positions: float = 0.0

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple())))

    def as_tuple(self) -> tuple:
        return self.valid, self.samples, self.forwards, self.positions

    def quality(self) -> tuple[float, float, float]:
        """The share of valid samples with its 95% Wilson interval."""
        low, high = wilson_interval(self.valid, self.samples)
        return self.valid / max(self.samples, 1), low, high


class SyntheticTask:
    """Samples of ``length`` tokens scored by ``language``; ``batch_size`` rows per `generate` call."""

    quality_name = "valid share (1 - SER)"

    def __init__(self, language: Any, length: int, batch_size: int = 64):
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        self.language, self.length, self.batch_size = language, int(length), int(batch_size)

    @property
    def description(self) -> str:
        return f"{self.language.language_class} language, {self.length} tokens from the empty prompt, temperature 1"

    @property
    def key(self) -> str:
        described = json.dumps([self.language.to_config(), self.length], sort_keys=True, default=str)
        return "synthetic|" + hashlib.sha1(described.encode()).hexdigest()[:12]

    def measure(self, model: Any, setting: dict, num: int, start: int, split: str = "dev") -> Counts:
        """Counts of samples ``start`` to ``start + num`` of ``split`` ("dev" or "test") drawn with ``setting``."""
        seed = (DEV_SEED if split == "dev" else TEST_SEED) + start
        counts = Counts()
        mask_id = int(model.config.mask_token_id)
        for out in generate_batches(model, num, self.length, seed, setting, self.batch_size):
            rows = out.sequences.cpu()
            valid = int(self.language.in_support(rows).sum())
            forwards = float(active_steps(out.history, mask_id).double().sum())
            counts = counts + Counts(valid, rows.shape[0], forwards, float(out.forward_tokens))
        return counts

    def measure_ar(self, model: Any, num: int) -> Counts:
        """Counts of ``num`` ancestral samples of an AR baseline (one forward a token) on the development split."""
        rows = sample_ar(model, num, self.length, seed=DEV_SEED, batch_size=self.batch_size)
        tokens = float(num * self.length)
        return Counts(int(self.language.in_support(rows).sum()), num, tokens, tokens)

    def timed_ar_run(self, model: Any, rows: int) -> Callable[[], Any]:
        """One call drawing ``rows`` sequences from the AR baseline."""
        return lambda: sample_ar(model, rows, self.length, seed=0, batch_size=rows)

    def timed_run(self, model: Any, setting: dict, rows: int) -> Callable[[], Any]:
        """One `generate` call of ``rows`` sequences with ``setting``: what the tokens/s axis times."""
        empty = torch.zeros(rows, 0, dtype=torch.long, device=_device(model))
        kwargs = {"steps": None, **setting, "temperature": 1.0}
        return lambda: diffusion_generate(model, empty, max_new_tokens=self.length, seed=0, stop_at_eos=False, **kwargs)
