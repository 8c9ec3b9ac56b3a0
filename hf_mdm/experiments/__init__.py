"""The paper's synthetic experiments as functions: TER vs steps, SER vs steps, and MDM vs AR wall-clock.

Each experiment takes a plain dict (a scale from ``evaluation/configs/*.yaml``, read by ``load_scale``), writes
``<name>.json``, ``<name>.md`` and ``<name>.png`` into an output folder, and reuses finished pieces on re-runs:
trained models are kept under ``<out>/models/`` and every measured cell is cached in ``<out>/cache/<name>.json``
(written atomically), so an interrupted run resumes where it stopped. ``run_experiment(name, scale, out)`` runs
one of ``EXPERIMENTS`` by name. ``load_scale`` reads a scale from a config; ``miniature`` shrinks one to a
seconds-long run with the same keys (``scales.py``).

- ``ter_vs_steps`` (``ter.py``): the paper's TER relative increase TER(p)/TER(q) - 1 (its epsilon_total,
  TER(p) = 2^(E_{x~q}[-log2 p(x)/L])) of the paper's sampler (stochastic transfer, random order, linear schedule)
  against the number of steps N, for n-gram languages at several lengths L: with the exact-posterior oracle (no
  learning error) and with trained MDMs, the trained AR model's TER as reference (Theorem 4.2: it depends on N, not
  on L); beside it the generative perplexity (``ter_cells.py``), exact values at a small L and the chain language's
  closed form.
- ``ser_vs_steps`` (``ser.py``): the sequence error rate against N for a pruned HMM and for the Theorem 4.4 chain
  language, oracle and trained MDM, AR as reference, plus SER against N/L for several L (Theorem 4.4: one curve).
- ``samplers`` (``samplers.py``): beyond Theorem 4.4, SER and generative perplexity against sequential forwards per
  token for the
  paper's sampler and the others (confidence, threshold, entropy bound, remasking, speculative decoding,
  left-to-right), oracle everywhere and trained MDMs where the other experiments train them, with a verdict.
- ``block_diffusion`` (``blocks.py``): block diffusion between AR (b = 1) and the paper's MDM (b = L): SER and
  generative perplexity of block-wise sampling with the oracle against sequential forwards and positions computed
  per token (with the exact block cache), the chain language's closed form beside it.
- ``wallclock`` (``speed.py``): seconds to generate a batch with an MDM at fixed step counts (the paper's 512) and
  at N chosen per L from the paper's TER at that L (within a target of the optimum), and with the same-size AR model
  decoding with its KV cache, as L grows, with the forwards of each and the cost of one (warm-up, medians of
  interleaved repeats, timed with ``hf_mdm.timer.Stopwatch``).

What they share is in ``common.py`` (the cell cache, languages from scale entries through
``hf_mdm.languages.build_language``, ``sample_mdm`` / ``sample_ar``, trained models, rows and outputs) and
``plotting.py`` (the matplotlib set-up).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..languages import LANGUAGE_KINDS
from .blocks import block_diffusion
from .common import (
    PAPER_SAMPLER,
    CellCache,
    experiment_result,
    language_name,
    language_rows,
    lazy_pair,
    machine_description,
    make_language,
    measure_languages,
    oracle_rows,
    sample_ar,
    sample_mdm,
    trained_pair,
    trained_rows,
    validation_row,
    validation_table,
    write_outputs,
)
from .rl import rl_vs_steps
from .samplers import compare_samplers, plot_samplers, samplers_table, verdict
from .scales import MINIATURE, load_scale, miniature
from .ser import plot_ser, ser_table, ser_vs_steps
from .speed import median_seconds, plot_wallclock, wallclock, wallclock_table
from .ter import plot_ter, ter_table, ter_vs_steps

EXPERIMENTS: dict[str, Callable[[dict, Path], dict]] = {
    "ter_vs_steps": ter_vs_steps,
    "ser_vs_steps": ser_vs_steps,
    "samplers": compare_samplers,
    "wallclock": wallclock,
    "block_diffusion": block_diffusion,
    "rl": rl_vs_steps,
}


def run_experiment(name: str, scale: dict, out: Path) -> dict:
    """Run the experiment ``name`` (a key of ``EXPERIMENTS``) with ``scale``, writing into ``out``."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}: use one of {sorted(EXPERIMENTS)}")
    return EXPERIMENTS[name](scale, Path(out))


__all__ = [
    "EXPERIMENTS",
    "LANGUAGE_KINDS",
    "CellCache",
    "block_diffusion",
    "experiment_result",
    "language_name",
    "language_rows",
    "lazy_pair",
    "load_scale",
    "machine_description",
    "make_language",
    "measure_languages",
    "median_seconds",
    "MINIATURE",
    "miniature",
    "oracle_rows",
    "PAPER_SAMPLER",
    "plot_samplers",
    "plot_ser",
    "plot_ter",
    "plot_wallclock",
    "run_experiment",
    "sample_ar",
    "sample_mdm",
    "compare_samplers",
    "samplers_table",
    "ser_table",
    "ser_vs_steps",
    "ter_table",
    "ter_vs_steps",
    "trained_pair",
    "trained_rows",
    "validation_row",
    "validation_table",
    "verdict",
    "wallclock",
    "wallclock_table",
    "write_outputs",
]
