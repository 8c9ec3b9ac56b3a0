"""The sampler comparison (hf_mdm.experiments.samplers) on a miniature scale: points, costs, verdict, resume."""

import math
from pathlib import Path
from unittest import mock

import pytest
import yaml

from hf_mdm.experiments import common, run_experiment
from hf_mdm.experiments import samplers as samplers_module
from hf_mdm.experiments.samplers import LEFT_TO_RIGHT, PAPER, paper_at, sampler_points, verdict
from hf_mdm.languages import ChainLanguage

TRAINING = {
    "size": "tiny",
    "num_train": 256,
    "num_validation": 64,
    "batch_size": 32,
    "max_steps": 4,
    "learning_rate": 1e-3,
    "seed": 0,
}
NUM = 200
PRESET = {
    "num_samples": NUM,
    "seed": 0,
    "train_length": 8,
    "training": TRAINING,
    "languages": [
        {"kind": "chain", "name": "chain", "metric": "ser", "lengths": [8], "train": True},
        {
            "kind": "ngram",
            "n": 2,
            "vocab_size": 4,
            "seed": 0,
            "prune_threshold": 0.0,
            "metric": "gen_ppl",
            "lengths": [8],
        },
    ],
    "samplers": [
        {"name": PAPER, "transfer": "stochastic", "strategy": "random", "sweep": {"steps_over_length": [0.125, 1, 4]}},
        {"name": "threshold", "transfer": "threshold", "strategy": "confidence", "sweep": {"threshold": [0.6]}},
        {"name": LEFT_TO_RIGHT, "transfer": "deterministic", "strategy": "left_to_right"},
        {"name": "speculative", "transfer": "speculative", "sweep": {"draft_length": [3]}},
    ],
}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("samplers")
    return out, run_experiment("samplers", PRESET, out)


def _row(rows, language, model, sampler, setting=""):
    (row,) = [
        r
        for r in rows
        if (r["language"], r["model"], r["sampler"], r["setting"]) == (language, model, sampler, setting)
    ]
    return row


def test_points_expand_the_sweep():
    points = sampler_points({"name": "x", "transfer": "stochastic", "sweep": {"steps_over_length": [0.1, 0.5, 2]}}, 32)
    assert [(label, s["steps"]) for label, s in points] == [
        ("steps_over_length = 0.1", 3),
        ("steps_over_length = 0.5", 16),
        ("steps_over_length = 2", 64),
    ]
    assert sampler_points({"name": "y", "threshold": 0.9, "transfer": "threshold"}, 8) == [
        ("", {"threshold": 0.9, "transfer": "threshold"})
    ]
    with pytest.raises(ValueError, match="sweep one field at a time"):
        sampler_points({"name": "z", "sweep": {"threshold": [0.5], "steps_over_length": [1]}}, 8)


def test_oracle_costs_and_errors_are_exact_where_known(result):
    """Left-to-right with the oracle samples the language exactly (no invalid chain) at one forward per token; the
    paper's sampler in one step reveals everything at once (1/L forwards per token) with Theorem 4.4's SER."""
    out, res = result
    rows = res["rows"]
    l2r = _row(rows, "chain", "oracle MDM", LEFT_TO_RIGHT)
    assert l2r["ser"] == 0.0 and l2r["forwards_per_token"] == 1.0 and l2r["num_samples"] == NUM
    one_step = _row(rows, "chain", "oracle MDM", PAPER, "steps_over_length = 0.125")
    assert one_step["forwards_per_token"] == pytest.approx(1 / 8)
    predicted = ChainLanguage.predicted_ser(8, 1)
    assert abs(one_step["ser"] - predicted) < 4 * math.sqrt(predicted * (1 - predicted) / NUM)
    many = _row(rows, "chain", "oracle MDM", PAPER, "steps_over_length = 4")
    assert 1 / 8 < many["forwards_per_token"] < 1.0  # steps that reveal nothing cost no forward
    for r in rows:
        assert r["computed_per_token"] >= r["forwards_per_token"] - 1e-9
    assert {r["model"] for r in rows if r["language"] == "chain"} == {"oracle MDM", "trained MDM"}
    assert {r["model"] for r in rows if r["language"] == "2-gram"} == {"oracle MDM"}


def test_speculative_points_are_exact_in_fewer_rounds(result):
    """Speculative decoding samples left-to-right's law (no invalid chain with the oracle) in fewer rounds than L,
    computing more canvas rows than rounds."""
    _, res = result
    spec = _row(res["rows"], "chain", "oracle MDM", "speculative", "draft_length = 3")
    assert spec["ser"] == 0.0
    assert spec["forwards_per_token"] < 1.0 < spec["computed_per_token"]
    assert 0 < spec["accepted_per_round"] <= 3


def test_outputs_and_verdict(result):
    out, res = result
    for ext in ("json", "md", "png"):
        assert (out / f"samplers.{ext}").stat().st_size > 0
    text = (out / "samplers.md").read_text()
    assert f"| chain | 8 | oracle MDM | {LEFT_TO_RIGHT} |  | SER | 0.0000 |" in text
    assert "- chain, L = 8, oracle MDM (SER): below:" in text and "- 2-gram, L = 8, oracle MDM" in text
    assert "| positions computed / token | wall ms / token | canvases / token |" in text
    for r in res["rows"]:  # a canvas of L = 8 positions per forward, batch-wide: at least one canvas per token
        assert r["positions_per_token"] >= 8 * r["computed_per_token"] - 1e-9 and r["ms_per_token"] > 0
    from hf_mdm.report_verdicts import sampler_verdicts

    said = "\n".join(sampler_verdicts(res))
    spec, l2r = (
        _row(res["rows"], "chain", "oracle MDM", s, t)
        for s, t in (("speculative", "draft_length = 3"), (LEFT_TO_RIGHT, ""))
    )
    assert f"chain, L = 8, oracle MDM: speculative (draft_length = 3) SER {spec['ser']:.3f}" in said
    assert "is not resolved from" in said  # both 0 with the oracle: the same law, no difference claimed


def test_paper_curve_is_interpolated_in_log_forwards():
    rows = [
        {
            "language": "a",
            "length": 4,
            "model": "oracle MDM",
            "sampler": PAPER,
            "forwards_per_token": x,
            "ser": y,
            "ser_ci_low": y - 0.1,
            "ser_ci_high": y + 0.1,
            "metric": "ser",
            "setting": "",
        }
        for x, y in ((0.25, 0.9), (1.0, 0.1))
    ]
    assert paper_at(rows, ("a", 4, "oracle MDM"), 0.5, "ser") == pytest.approx(0.5)  # halfway in log between 0.25 and 1
    assert paper_at(rows, ("a", 4, "oracle MDM"), 0.1, "ser") is None
    better = {**rows[0], "sampler": "b", "forwards_per_token": 0.5, "ser": 0.1, "ser_ci_low": 0.0, "ser_ci_high": 0.2}
    worse = {**better, "sampler": "w", "ser": 0.9, "ser_ci_low": 0.8, "ser_ci_high": 0.95}
    costly = {**better, "sampler": "c", "forwards_per_token": 1.5, "ser": 0.5, "ser_ci_low": 0.4, "ser_ci_high": 0.6}
    cheap_tie = {**costly, "sampler": "t", "ser": 0.15, "ser_ci_low": 0.1, "ser_ci_high": 0.2}  # not above the last
    text = verdict(rows + [better, worse, costly, cheap_tie])
    assert (
        "below: b at 0.50: 0.100 vs 0.500. Above: w at 0.50: 0.900 vs 0.500, c at 1.50: 0.500 vs 0.100 at 1.00." in text
    )
    assert "- **b** (SER, oracle): below the paper's on a L=4; above on no panel; 0.50 sequential forwards," in text
    assert "- **c** (SER, oracle): below the paper's on no panel; above on a L=4; 1.50 sequential forwards," in text


def test_rerun_measures_nothing(result):
    out, res = result

    def fail(*args, **kwargs):
        raise AssertionError("a finished point was measured again")

    with mock.patch.object(samplers_module, "measure", fail), mock.patch.object(common, "trained_pair", fail):
        again = run_experiment("samplers", PRESET, out)
    assert again["rows"] == res["rows"]


def test_bad_entries_name_what_to_change(tmp_path):
    bad = {**PRESET, "languages": [{**PRESET["languages"][0], "metric": "bleu"}]}
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        run_experiment("samplers", bad, tmp_path)


def test_committed_config_has_quick_and_full_with_the_same_samplers():
    config = yaml.safe_load(open(Path(__file__).parents[2] / "evaluation" / "configs" / "samplers.yaml"))
    assert config["experiment"] == "samplers"
    assert config["quick"]["samplers"] == config["full"]["samplers"]
    assert config["quick"]["samplers"][0]["name"] == PAPER


def test_cli_samples_speculatively_from_the_oracle(tmp_path, capsys):
    """`hf-mdm sample --transfer speculative --draft-length 3`: left-to-right's law (no invalid chain), recorded."""
    import json

    from hf_mdm import cli
    from hf_mdm.experiments import make_language

    make_language({"kind": "chain"}).save_pretrained(tmp_path / "lang")
    samples = tmp_path / "samples.json"
    assert (
        cli.main(
            [
                "sample",
                "--model",
                "oracle",
                "--language",
                str(tmp_path / "lang"),
                "--num",
                "64",
                "--length",
                "12",
                "--transfer",
                "speculative",
                "--draft-length",
                "3",
                "--output",
                str(samples),
            ]
        )
        == 0
    )
    saved = json.loads(samples.read_text())
    assert saved["sampler"]["transfer"] == "speculative" and saved["sampler"]["draft_length"] == 3
    capsys.readouterr()
    assert cli.main(["score", "--samples", str(samples), "--language", str(tmp_path / "lang")]) == 0
    assert json.loads(capsys.readouterr().out)["ser"] == 0.0


def test_cli_samples_with_remasking(tmp_path, capsys):
    """`hf-mdm sample --remdm loop ...` runs ReMDM on the paper's sampler and records its settings; a loop window
    outside 0 < t_off < t_on < 1 fails with the field named."""
    import json

    from hf_mdm import cli
    from hf_mdm.experiments import make_language

    make_language({"kind": "chain"}).save_pretrained(tmp_path / "lang")
    args = [
        "sample",
        "--model",
        "oracle",
        "--language",
        str(tmp_path / "lang"),
        "--num",
        "8",
        "--length",
        "12",
        "--steps",
        "24",
        "--remdm",
        "loop",
        "--remdm-eta",
        "0.1",
        "--remdm-t-on",
        "0.6",
    ]
    assert cli.main(args + ["--remdm-t-off", "0.2", "--output", str(tmp_path / "s.json")]) == 0
    sampler = json.loads((tmp_path / "s.json").read_text())["sampler"]
    assert (sampler["remdm"], sampler["remdm_eta"], sampler["remdm_t_on"], sampler["remdm_t_off"]) == (
        "loop",
        0.1,
        0.6,
        0.2,
    )
    assert cli.main(args + ["--remdm-t-off", "0.8", "--output", str(tmp_path / "t.json")]) != 0
    assert "the loop window needs 0 < remdm_t_off < remdm_t_on < 1" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_quick_preset_reuses_the_ser_experiments_models():
    """The trained languages of the quick scale are ser_vs_steps' entries with its training settings and length,
    so reproduce trains nothing new for the comparison (the models' folder names hash exactly these)."""
    configs = Path(__file__).parents[2] / "evaluation" / "configs"
    mine = yaml.safe_load(open(configs / "samplers.yaml"))["quick"]
    ser = yaml.safe_load(open(configs / "ser_vs_steps.yaml"))["quick"]
    entries = {e["name"]: e for e in ser["languages"]}
    trained = [e for e in mine["languages"] if e.get("train")]
    assert {e["name"] for e in trained} == {"chain", "hmm"}
    for entry in trained:
        assert {k: v for k, v in entry.items() if k not in ("metric", "lengths")} == entries[entry["name"]]
    assert (mine["training"], mine["train_length"]) == (ser["training"], ser["train_length"])
