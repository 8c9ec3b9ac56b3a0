"""Theorem 4.4's scaling on the chain language (`hf_mdm.experiments.scaling`): the closed form's N, the crossing of a
measured SER curve, the fitted slope and its interval, and the experiment on a small grid."""

import math

import pytest

from hf_mdm.experiments.common import CellCache
from hf_mdm.experiments.scaling import closed_form_steps, crossing, scaling_fit, scaling_sentences, steps_for_ser
from hf_mdm.languages import ChainLanguage


@pytest.mark.parametrize("length", [8, 100, 1000])
def test_closed_form_steps_solve_the_closed_form(length):
    steps = closed_form_steps(length, 0.5)
    assert 1 - (1 - 3 / (4 * steps)) ** (length - 1) == pytest.approx(0.5, rel=1e-9)
    assert (
        ChainLanguage.predicted_ser(length, math.floor(steps))
        > 0.5
        >= ChainLanguage.predicted_ser(length, math.ceil(steps))
    )


def test_crossing_interpolates_in_log_steps():
    grid = [{"steps": 4, "ser": 0.9}, {"steps": 16, "ser": 0.7}, {"steps": 64, "ser": 0.3}]
    assert crossing(grid, "ser", 0.5) == pytest.approx(32.0)  # halfway in SER between 16 and 64: halfway in log N
    assert math.isnan(crossing(grid, "ser", 0.1)) and math.isnan(crossing(grid, "ser", 0.95))


def test_fit_recovers_a_known_slope_and_says_so():
    rows = [
        {"length": n, "steps": 3.0 * n * (1.05 if i % 2 else 0.95), "steps_closed_form": 3.0 * n}
        for i, n in enumerate([16, 32, 64, 128])
    ]
    fit = scaling_fit(rows, "steps")
    assert fit["slope_ci_low"] < 1.0 < fit["slope_ci_high"] and fit["points"] == 4
    assert scaling_fit(rows, "steps_closed_form")["slope"] == pytest.approx(1.0)
    assert "consistent with N growing linearly in L" in scaling_sentences(rows)[0]
    flat = [{**r, "steps": 40.0 * (1.05 if i % 2 else 0.95)} for i, r in enumerate(rows)]
    assert "not consistent with a slope of 1" in scaling_sentences(flat)[0]


def test_steps_for_ser_on_the_oracle_brackets_the_closed_form(tmp_path):
    section = {"target": 0.5, "lengths": [8, 16], "steps_over_length": [0.25, 0.5, 1, 2, 4]}
    rows = steps_for_ser(section, 512, CellCache(tmp_path / "cache.json"))
    for r in rows:
        assert r["steps_ci_low"] <= r["steps"] <= r["steps_ci_high"]
        assert r["steps_ci_low"] * 0.8 <= r["steps_closed_form"] <= r["steps_ci_high"] * 1.25
        assert [g["steps"] for g in r["grid"]] == [max(1, round(x * r["length"])) for x in section["steps_over_length"]]
