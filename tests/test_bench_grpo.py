"""The GRPO benchmark's smoke run (evaluation/bench_grpo.py --quick): its table has the AR row and one row per
log-likelihood estimator, and each ratio is its column's value over the AR's; no timing is asserted."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))

pytest.importorskip("trl")

ROWS = ("AR, TRL", "MDM, one_step", "MDM, coupled", "MDM, elbo")


def _within_rounding(ratio: str, value: str, reference: str) -> bool:
    """Whether the printed ratio (2 decimals) can be the quotient of the values before they were printed (each
    rounded to its printed decimals)."""
    half = [0.5 * 10 ** -len(text.partition(".")[2]) for text in (value, reference)]
    v, r = float(value), float(reference)
    low, high = max(v - half[0], 0.0) / (r + half[1]), (v + half[0]) / (r - half[1])
    return low - 0.005 <= float(ratio.rstrip("x")) <= high + 0.005


def test_grpo_bench_quick_run_has_the_ar_and_each_estimator(tmp_path):
    import bench_grpo

    output = tmp_path / "grpo.md"
    text = bench_grpo.main(["--quick", "--output", str(output)])
    assert output.read_text() == text
    cells = {}
    for line in text.splitlines():
        if line.startswith("| AR") or line.startswith("| MDM"):
            row = [cell.strip() for cell in line.strip("|").split("|")]
            cells[row[0]] = row
    assert len(cells) == 4
    names = {prefix: [name for name in cells if name.startswith(prefix)] for prefix in ROWS}
    assert all(len(found) == 1 for found in names.values()), names
    ar = cells[names["AR, TRL"][0]]
    assert ar[1] == "0" and ar[5] == ar[7] == "1.00x"
    for prefix in ROWS:
        name, beta, step, generation, rest, step_ratio, cpu, cpu_ratio, added, added_ratio, peak = cells[
            names[prefix][0]
        ]
        assert all(float(value) > 0 for value in (step, generation, rest, cpu, peak))
        assert float(generation) <= float(step) + 0.001 and float(rest) <= float(step) + 0.001
        assert _within_rounding(step_ratio, step, ar[2]), (name, step_ratio, step, ar[2])
        assert _within_rounding(cpu_ratio, cpu, ar[6]), (name, cpu_ratio, cpu, ar[6])
        assert float(added) >= 0  # what the steps add above the built trainer: at this shape, maybe nothing
        if float(ar[8]) > 0.1:
            assert _within_rounding(added_ratio, added, ar[8]), (name, added_ratio, added, ar[8])
        else:
            assert added_ratio.endswith("x") or added_ratio == "n/a"
