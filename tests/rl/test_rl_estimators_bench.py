"""`evaluation/rl_estimators.py` (the estimator table against exact rollout likelihoods) in its quick form: every
estimator at both sampler step counts, and the decoding-law estimator's expectation never above the exact
log-likelihood (Jensen over the groupings: its bias is at most 0, up to float32 forwards)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "evaluation"))

import rl_estimators  # noqa: E402


def test_the_estimator_table_quick_run(tmp_path):
    text = rl_estimators.main(["--quick", "--models", str(tmp_path), "--output", str(tmp_path / "table.md")])
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith(("| 2 |", "| 6 |"))]
    assert len(rows) == 10 and (tmp_path / "table.md").read_text() == text
    decoding = [row for row in rows if row[1].startswith("decoding")]
    assert len(decoding) == 2 and all(float(row[3]) <= 1e-4 for row in decoding)
    one_step = [row for row in rows if row[1].startswith("one_step")]
    assert all(float(row[5].rstrip(" |")) == 0.0 for row in one_step)  # no prompt: no randomness
