"""The RL experiment (`hf_mdm.experiments.rl`) in miniature: its table, figure and REPORT section with computed
sentences; a rerun takes every cell from the cache (no GRPO run, no sampling)."""

from __future__ import annotations

import copy
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("trl")

from hf_mdm.experiments import (  # noqa: E402
    load_scale,
    miniature,
    rl_report,  # noqa: E402
    run_experiment,
)
from hf_mdm.experiments import rl as rl_experiment  # noqa: E402
from hf_mdm.experiments.common import scale_of  # noqa: E402
from hf_mdm.report import write_report  # noqa: E402
from hf_mdm.report_summary import verdict_of  # noqa: E402


@pytest.fixture(scope="module")
def small() -> dict:
    _, full = load_scale(Path("evaluation/configs/rl.yaml"), full=True)
    scale = miniature(full)
    scale["languages"] = [spec for spec in scale["languages"] if spec["name"] == "chain"]
    scale["kl_sweep"]["language"] = "chain"
    return scale


def good(row: dict, result: dict) -> bool:
    """A run whose SER at its N is within 0.05 of the trained AR's."""
    ar = next(r for r in result["rows"] if r["model"] == "trained AR")["ar"]["ser"]
    return row[f"n{row['rollout_steps']}"]["ser"] <= ar + 0.05


def test_the_rl_experiment_writes_its_table_report_and_resumes(small, tmp_path):
    result = run_experiment("rl", small, tmp_path)
    after = [r for r in result["rows"] if r["model"] == "MDM after RL"]
    seeds, sweep = len(small["seeds"]), small["kl_sweep"]
    grid = len(small["grpo"]["estimators"]) * len(small["rl_steps"]) * seeds + len(sweep["betas"]) * seeds
    assert len(after) == grid and all(len(r["rewards"]) == small["grpo"]["max_steps"] for r in after)
    assert sorted({r["beta"] for r in after}) == [0.0, *sweep["betas"]]
    assert all(0.0 <= r[f"n{n}"]["ser"] <= 1.0 for r in after for n in small["rollout_steps"])
    table = (tmp_path / "rl.md").read_text()
    for estimator in small["grpo"]["estimators"]:
        assert f"| chain | {estimator} | 2 | 0 | SER at N = 2 |" in table
    assert f"| chain | decoding | 2 | {sweep['betas'][0]:g} | SER at N = 2 |" in table
    assert (tmp_path / "rl.png").stat().st_size > 0
    sentences = rl_report.rl_verdicts(result)
    pairs = 2 * (len(small["grpo"]["estimators"]) * len(small["rl_steps"]) + len(sweep["betas"]))
    assert len(sentences) == pairs + 3  # the runs that lost reward, those near the AR, the KL sweep
    assert all("the SER at N =" in s for s in sentences[:pairs:2]) and all(
        "TER at N =" in s for s in sentences[1:pairs:2]
    )
    assert sentences[pairs].startswith(f"chain: 0 of {len(after)} GRPO runs lost reward")  # 2 steps: ends equal
    assert sentences[pairs + 1].startswith(f"chain: {sum(1 for r in after if good(r, result))} of {len(after)}")
    swept = [r["n2"]["ser"] for r in after if r["beta"] == sweep["betas"][0]]
    assert f"beta {sweep['betas'][0]:g}, SER at N = 2 {sum(swept) / len(swept):.3f} [" in sentences[-1]
    report = write_report(tmp_path).read_text()
    assert "## Reinforcement learning for few-step correctness" in report and sentences[0] in report

    def fail(*args, **kwargs):
        raise AssertionError("a cached cell was recomputed")

    with mock.patch.object(rl_experiment, "grpo_policy", fail), mock.patch.object(rl_experiment, "sample_mdm", fail):
        again = run_experiment("rl", small, tmp_path)
    assert again["rows"] == result["rows"]
    check_bounds_lost_runs_and_sweep(result)


def check_bounds_lost_runs_and_sweep(result: dict) -> None:
    """A TER cell past the estimator's variance limit is a bound: no rise or fall said, no ratio, "<=" on its TER row
    only; a run whose reward fell is counted and named; the sweep says where beta > 0 separates from beta 0."""
    changed = copy.deepcopy(result)
    after = [r for r in changed["rows"] if r["model"] == "MDM after RL"]
    for row in after:
        row[f"n{row['rollout_steps']}"]["ter_kind"] = "upper bound"
        row[f"n{row['rollout_steps']}"]["ser"] = 0.9 if row["beta"] > 0 else 0.1 + 0.01 * row["seed"]
    after[0]["rewards"] = [0.5] * 5 + [0.1] * 5  # lost 0.4
    said = rl_report.rl_verdicts(changed)
    ter_sentences = [s for s in said if "TER at N =" in s]
    assert ter_sentences and all("these cells hold only an upper bound (after RL" in s for s in ter_sentences)
    assert not any(word in s for s in ter_sentences for word in (" rose", " fell", "no resolved amount"))
    assert verdict_of(ter_sentences[0]) == "bound only" and not any("times the MDM's before RL" in s for s in said)
    lost = next(s for s in said if "lost reward" in s)
    assert f"chain: 1 of {len(after)} GRPO runs lost reward" in lost
    assert f"{rl_report.run_label(after[0])} (0.500 -> 0.100)" in lost
    table = rl_report.rl_table(changed["rows"], scale_of(changed))
    ter_rows = [line for line in table.splitlines() if "| TER at N" in line]
    assert ter_rows and all("| <= " in line for line in ter_rows)
    assert not any("| <= " in line for line in table.splitlines() if "| SER at N" in line)
    assert f"1 of {len(small_seeds(changed))}: {rl_report.run_label(after[0])}" in table
    sweep = said[-1]
    assert "SER at N = 2 0.900 [0.900, 0.900] (above beta 0's)" in sweep and verdict_of(sweep) != "not resolved"


def small_seeds(result: dict) -> list[int]:
    return scale_of(result)["seeds"]
