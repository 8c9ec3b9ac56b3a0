"""The samples ``hf-mdm tune``'s halving search spends against the exhaustive grid, and whether their fronts agree.

On the chain language with its exact-posterior oracle (no training needed), one space of the paper's sampler at
several step counts beside one-token-a-step and threshold decoding; both searches share one timing (the speeds
are measured once, interleaved), so the two fronts differ only where the samples decide differently.

    python evaluation/bench_tune.py [--length 16] [--min-samples 32] [--max-samples 512]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from hf_mdm.experiments.common import CellCache
from hf_mdm.languages import ChainLanguage, OracleDenoiser
from hf_mdm.tuning import SyntheticTask, expand, pareto_front, search, time_settings
from hf_mdm.tuning.space import setting_key

SPACE = [
    {"transfer": "stochastic", "strategy": "random", "steps": [2, 4, 8, 16, 32]},
    {"transfer": "deterministic", "strategy": ["confidence", "left_to_right"], "steps": 16},
    {"transfer": "threshold", "strategy": "confidence", "threshold": [0.5, 0.9]},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--min-samples", type=int, default=32)
    parser.add_argument("--max-samples", type=int, default=512)
    args = parser.parse_args()
    language = ChainLanguage()
    oracle, task, settings = OracleDenoiser(language), SyntheticTask(language, args.length), expand(SPACE)
    with tempfile.TemporaryDirectory() as folder:
        cache = CellCache(Path(folder) / "cache.json")
        speeds = time_settings(oracle, task, settings, rows=16, rounds=5, cache=cache)
        found = {
            how: search(oracle, task, settings, speeds, cache, how, args.min_samples, args.max_samples)
            for how in ("grid", "halving")
        }
    used = {how: sum(r["samples"] for r in rows) for how, rows in found.items()}
    fronts = {how: [setting_key(r["setting"]) for r in pareto_front(rows)] for how, rows in found.items()}
    print(f"settings: {len(settings)}; samples per setting: {args.min_samples} to {args.max_samples}")
    for how in found:
        print(f"{how:8s} samples used: {used[how]:6d}  front: {len(fronts[how])} settings")
    print(
        f"halving / grid samples: {used['halving'] / used['grid']:.2f}; fronts equal: {fronts['grid'] == fronts['halving']}"
    )
    for row in found["halving"]:
        dropped = "" if row["dropped_after"] is None else f"dropped after round {row['dropped_after']}"
        print(f"  {setting_key(row['setting']):70s} {row['samples']:5d} samples {dropped}")


if __name__ == "__main__":
    main()
