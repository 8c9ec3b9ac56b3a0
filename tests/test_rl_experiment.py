"""The RL experiment (`hf_mdm.experiments.rl`) in miniature: its table, figure and REPORT section with computed
sentences; a rerun takes every cell from the cache (no GRPO run, no sampling)."""

from __future__ import annotations

import copy
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("trl")

from hf_mdm.experiments import load_scale, miniature, run_experiment  # noqa: E402
from hf_mdm.experiments import rl as rl_experiment  # noqa: E402
from hf_mdm.report import write_report  # noqa: E402
from hf_mdm.report_summary import verdict_of  # noqa: E402


@pytest.fixture(scope="module")
def small() -> dict:
    _, full = load_scale(Path("evaluation/configs/rl.yaml"), full=True)
    scale = miniature(full)
    scale["languages"] = [spec for spec in scale["languages"] if spec["name"] == "chain"]
    return scale


def good(row: dict, result: dict) -> bool:
    """A run whose SER at its N is within 0.05 of the trained AR's."""
    ar = next(r for r in result["rows"] if r["model"] == "trained AR")["ar"]["ser"]
    return row[f"n{row['rollout_steps']}"]["ser"] <= ar + 0.05


def test_the_rl_experiment_writes_its_table_report_and_resumes(small, tmp_path):
    result = run_experiment("rl", small, tmp_path)
    after = [r for r in result["rows"] if r["model"] == "MDM after RL"]
    grid = len(small["grpo"]["estimators"]) * len(small["rollout_steps"]) * len(small["seeds"])
    assert len(after) == grid and all(len(r["rewards"]) == small["grpo"]["max_steps"] for r in after)
    assert all(0.0 <= r[f"n{n}"]["ser"] <= 1.0 for r in after for n in small["rollout_steps"])
    table = (tmp_path / "rl.md").read_text()
    for estimator in small["grpo"]["estimators"]:
        assert f"| chain | {estimator} | 2 | SER at N = 2 |" in table
    assert (tmp_path / "rl.png").stat().st_size > 0
    sentences = rl_experiment.rl_verdicts(result)
    pairs = 2 * len(small["grpo"]["estimators"]) * len(small["rollout_steps"])
    assert len(sentences) == pairs + 1  # and one over every run of the language
    assert all("the SER at N =" in s for s in sentences[:pairs:2]) and all(
        "TER at N =" in s for s in sentences[1:pairs:2]
    )
    assert sentences[-1].startswith(f"chain: {sum(1 for r in after if good(r, result))} of {len(after)} GRPO runs")
    report = write_report(tmp_path).read_text()
    assert "## Reinforcement learning for few-step correctness" in report and sentences[0] in report
    # a TER cell past the estimator's variance limit is a bound: no rise or fall said, no ratio, "<=" in the table
    bounded = copy.deepcopy(result)
    for row in bounded["rows"]:
        if row["model"] == "MDM after RL":
            row[f"n{row['rollout_steps']}"]["ter_kind"] = "upper bound"
    said = rl_experiment.rl_verdicts(bounded)
    ter_sentences = said[1:pairs:2]
    assert all("these cells hold only an upper bound (after RL" in s for s in ter_sentences)
    assert not any(word in s for s in ter_sentences for word in (" rose", " fell", "no resolved amount"))
    assert verdict_of(ter_sentences[0]) == "bound only" and "times the MDM's before RL" not in said[-1]
    assert "| <= " in rl_experiment.rl_table(bounded["rows"], bounded["scale"])

    def fail(*args, **kwargs):
        raise AssertionError("a cached cell was recomputed")

    with mock.patch.object(rl_experiment, "grpo_policy", fail), mock.patch.object(rl_experiment, "sample_mdm", fail):
        again = run_experiment("rl", small, tmp_path)
    assert again["rows"] == result["rows"]
