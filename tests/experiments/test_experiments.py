"""The synthetic experiments end to end on miniature scales, resume (a cut cell cache kept aside and measured again),
the report, and the CLI's errors (a broken experiment config is one line naming the file, before any experiment)."""

import json
from collections.abc import Mapping
from pathlib import Path
from unittest import mock

import pytest
import torch

from hf_mdm import MDMConfig, MDMForMaskedDiffusion, cli, experiments
from hf_mdm.experiments import make_language, run_experiment, speed
from hf_mdm.languages import ChainLanguage
from hf_mdm.report import write_report

REPO = Path(__file__).resolve().parents[2]

TRAINING = {
    "size": "tiny",
    "num_train": 256,
    "num_validation": 64,
    "batch_size": 32,
    "max_steps": 4,
    "learning_rate": 1e-3,
    "seed": 0,
}


FAST = {
    "block_length": 4,
    "baseline": "random order, 1 token/step",
    "samplers": [
        {"name": "random order, 1 token/step", "transfer": "deterministic", "strategy": "random"},
        {"name": "threshold 0.5 + dual cache", "transfer": "threshold", "threshold": 0.5, "kv_cache": "dual"},
        {"name": "entropy bound 1", "transfer": "entropy_bound", "entropy_bound": 1.0},
    ],
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    ter = {
        "num_samples": 32,
        "steps": [2, 8],
        "lengths": [8, 16],
        "train_length": 8,
        "progress": False,
        "languages": [{"kind": "ngram", "n": 2, "vocab_size": 4, "seed": 0, "prune_threshold": 0.0, "train": True}],
        "training": TRAINING,
        "fast_samplers": FAST,
        "ter_samples": 16,
        "ter_particles": 16,
        "exact": {"length": 3, "steps": [1, 2]},
    }
    ser = {
        "num_samples": 32,
        "lengths": [8, 16],
        "steps_over_length": [0.5, 2],
        "train_length": 8,
        "progress": False,
        "languages": [{"kind": "chain", "name": "chain", "train": True}],
        "training": TRAINING,
    }
    wall = {
        "vocab_size": 8,
        "size": "tiny",
        "batch_size": 2,
        "mdm_steps": [4],
        "lengths": [8, 16],
        "repeats": 1,
        "dual_cache_blocks": 2,
        "ter_target": 0.3,
        "steps_from": "ter_vs_steps",
    }
    outputs = {
        name: run_experiment(name, scale, out)
        for name, scale in (("ter_vs_steps", ter), ("ser_vs_steps", ser), ("wallclock", wall))
    }
    return out, outputs, {"ter_vs_steps": ter, "ser_vs_steps": ser, "wallclock": wall}


def test_outputs_written(results):
    out, outputs, _ = results
    for name in ("ter_vs_steps", "ser_vs_steps", "wallclock"):
        for ext in ("json", "md", "png"):
            assert (out / f"{name}.{ext}").stat().st_size > 0, (name, ext)
        assert json.loads((out / f"{name}.json").read_text())["experiment"] == name
    ter_rows = outputs["ter_vs_steps"]["rows"]
    models = {r["model"] for r in ter_rows}
    assert models == {"oracle MDM", "trained MDM", "trained AR", "validation"}
    oracle = [r for r in ter_rows if r["model"] == "oracle MDM"]
    assert len(oracle) == 4 and all(r["num_out_of_support"] == 0 for r in oracle)
    chain = [r for r in outputs["ser_vs_steps"]["rows"] if r["model"] == "oracle MDM"]
    assert all(0.0 <= r["ser"] <= 1.0 and "predicted" in r for r in chain)
    wall = outputs["wallclock"]
    chosen = wall["steps_per_length"]
    chain = chosen["chain (closed form, exact)"]
    assert chain == {str(n): speed.chain_steps(n, 0.3) for n in (8, 16)}
    for length, steps in chain.items():  # the smallest N within the target, from the closed form
        assert ChainLanguage.predicted_ter_increase(int(length), steps) <= 0.3
        assert ChainLanguage.predicted_ter_increase(int(length), steps - 1) > 0.3
    measured = chosen["2-gram oracle (measured, n = 16)"]
    for r in (r for r in ter_rows if r["model"] == "oracle MDM"):
        qualifies = r["ter_ci_high"] <= 0.3
        assert (measured.get(str(r["length"]), 10**9) <= r["steps"]) == qualifies or not qualifies
    models = {r["model"] for r in wall["rows"]}
    assert {"AR, KV cache", "MDM, 4 steps", "MDM + dual cache (2 blocks), 4 steps"} <= models
    assert "MDM, N from the paper's sampler's TER within 30% (chain (closed form, exact))" in models
    for r in wall["rows"]:  # AR: one forward per token; the MDM: one per step, at most one per token
        expected = r["length"] if r["model"].startswith("AR") else min(r["steps"], r["length"])
        assert r["forwards"] == expected and r["ms_per_forward"] == pytest.approx(1000 * r["seconds"] / expected)
        assert r["forwards_per_token"] == expected / r["length"]
        if r["model"].startswith("AR"):  # one new position per forward with the KV cache
            assert r["positions_per_token"] == 1.0
        elif "dual" not in r["model"]:  # every forward computes the whole canvas
            assert r["positions_per_token"] == expected
        else:  # a block's first forward refreshes the whole canvas, its later ones compute the block only
            assert r["positions_per_token"] <= expected
        if "chain" in r["model"]:
            assert r["steps"] == chain[str(r["length"])]
    # dual cache, 2 blocks of 8 in 2 steps each: a full canvas (16) then the block (8), per block: 48 / 16 tokens
    assert "| 16 | MDM + dual cache (2 blocks), 4 steps | 4 | 0.250 | 3.00 |" in (out / "wallclock.md").read_text()


def test_fast_samplers_rows(results):
    """Every sampler on the trained MDM, the cache-free ones on the oracle too; one token a step costs one forward
    and L positions per token and the parallel rules fewer forwards; the interval holds the estimate; the table
    compares with the exact baseline and reports every cost."""
    out, outputs, _ = results
    rows = outputs["ter_vs_steps"]["fast_rows"]
    one = "random order, 1 token/step"
    assert {(r["model"], r["sampler"]) for r in rows} == {
        ("oracle MDM", one),
        ("oracle MDM", "entropy bound 1"),
        ("trained MDM", one),
        ("trained MDM", "threshold 0.5 + dual cache"),
        ("trained MDM", "entropy bound 1"),
    }
    for r in rows:
        assert r["gen_ppl_ci_low"] <= r["gen_ppl_increase"] <= r["gen_ppl_ci_high"] and r["num_samples"] == 32
        assert r["forwards_per_token"] == 1.0 if r["sampler"] == one else r["forwards_per_token"] <= 1
        assert r["ms_per_token"] > 0
        if r["sampler"] == one:  # a full canvas of 8 positions per token, batch-wide
            assert r["positions_per_token"] == 8.0
    assert any(r["forwards_per_token"] < 1 for r in rows)
    table = (out / "ter_vs_steps.md").read_text()
    assert "| 2-gram | trained MDM | threshold 0.5 + dual cache |" in table and f"baseline: {one}" in table
    assert "positions computed / token | wall ms / token |" in table


def test_rerun_reuses_finished_pieces(results):
    out, outputs, scales = results

    def fail(*args, **kwargs):
        raise AssertionError("a finished cell was recomputed")

    with (
        mock.patch.object(experiments, "sample_mdm", fail),
        mock.patch.object(experiments, "sample_ar", fail),
        mock.patch.object(experiments, "trained_pair", fail),
    ):  # not even loaded: every cell is cached
        again = run_experiment("ter_vs_steps", scales["ter_vs_steps"], out)
    assert again["rows"] == outputs["ter_vs_steps"]["rows"]


def test_rerun_samples_and_times_nothing(results):
    """The re-run guard above, with the names patched where the experiment modules look them up."""
    from hf_mdm.experiments import common, fast, speed

    out, outputs, scales = results

    def fail(*args, **kwargs):
        raise AssertionError("a finished cell was recomputed")

    with (
        mock.patch.object(common, "sample_mdm", fail),
        mock.patch.object(common, "sample_ar", fail),
        mock.patch.object(common, "trained_pair", fail),
        mock.patch.object(speed, "median_seconds", fail),
        mock.patch.object(fast, "sample_with", fail),
    ):
        again = {name: run_experiment(name, scales[name], out) for name in scales}
    for name in scales:
        assert again[name]["rows"] == outputs[name]["rows"], name


def test_language_entry_errors_name_the_entry():
    with pytest.raises(ValueError, match=r"missing 'vocab_size' in \{'kind': 'ngram', 'n': 2, 'train': True\}"):
        make_language({"kind": "ngram", "n": 2, "train": True})
    assert make_language({"kind": "chain", "name": "c", "train": True, "training": {}}).vocab_size == 16


def test_median_seconds_times_each_call():
    from hf_mdm.experiments import median_seconds

    calls = []
    assert median_seconds(lambda: calls.append(1), 3, torch.device("cpu")) >= 0.0
    assert len(calls) == 3


def test_report_puts_paper_numbers_beside_ours(results):
    out, _, _ = results
    report = write_report(out).read_text()
    assert "![The paper's TER vs steps (Theorem 4.2)](ter_vs_steps.png)" in report
    assert "| 2-gram | 256 | 2.72% |" in report  # the paper's table
    assert "| 8192 | 7.4 | 45.8 |" in report
    assert "oracle MDM" in report and "The quick scale" in report
    assert report.count("Sampler: the paper's") == 2 and "32 samples per cell" in report  # the TER and SER tables
    assert "- 2-gram: `tiny` (64 wide, 2 layers), 4 steps of batch 32" in report
    assert "Time is forwards x cost per forward" in report


def test_unknown_language_kind_names_the_field():
    with pytest.raises(ValueError, match="language kind must be one of"):
        make_language({"kind": "trigram", "n": 3})


def test_cli_sample_rejects_wrong_kind_and_schedule(results, tmp_path, capsys):
    out, _, _ = results
    ar_dir = next((out / "models").glob("2-gram-L8-*-ar")) / "final"
    mdm_dir = next((out / "models").glob("2-gram-L8-*-mdm")) / "final"
    code = cli.main(
        ["sample", "--model", str(ar_dir), "--kind", "mdm", "--length", "8", "--output", str(tmp_path / "s.json")]
    )
    assert code == 2 and "--kind ar" in capsys.readouterr().err
    code = cli.main(
        [
            "sample",
            "--model",
            str(mdm_dir),
            "--length",
            "8",
            "--schedule",
            "cosine",
            "--output",
            str(tmp_path / "s.json"),
        ]
    )
    assert code == 2 and "--schedule 'cosine' differs" in capsys.readouterr().err


def test_cli_oracle_sample_then_score(tmp_path, capsys):
    language = make_language({"kind": "chain"})
    language.save_pretrained(tmp_path / "lang")
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
                "--steps",
                "48",
                "--output",
                str(samples),
            ]
        )
        == 0
    )
    assert len(json.loads(samples.read_text())["samples"]) == 64
    capsys.readouterr()
    assert cli.main(["score", "--samples", str(samples), "--language", str(tmp_path / "lang")]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["num_sequences"] == 64 and 0.0 <= scores["ser"] <= 0.6  # 1 - exp(-3 * 11 / (4 * 48)) = 0.16
    # JSON has no Infinity: null, with a note
    assert (scores["generative_perplexity"] is None) == (scores["num_out_of_support"] > 0)


def test_cli_score_writes_json_with_null_ter_outside_the_support(tmp_path, capsys):
    language = make_language({"kind": "chain"})
    language.save_pretrained(tmp_path / "lang")
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps({"samples": [[1, 4, 2, 9], [1, 2, 2, 9], [1, 4, 2, 9]]}))  # the second is invalid
    assert cli.main(["score", "--samples", str(samples), "--language", str(tmp_path / "lang")]) == 0
    text = capsys.readouterr().out
    scores = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert scores["generative_perplexity"] is None and scores["relative_increase"] is None
    assert scores["num_out_of_support"] == 1
    assert "1 of 3 samples are outside" in scores["note"] and "--skip-out-of-support" in scores["note"]
    assert (
        cli.main(["score", "--samples", str(samples), "--language", str(tmp_path / "lang"), "--skip-out-of-support"])
        == 0
    )
    kept = json.loads(capsys.readouterr().out)
    assert (
        kept["generative_perplexity"] == pytest.approx(2**2.5) and "note" not in kept
    )  # 4 choices, then 2 bits per token: 2^(10/4)


def test_cli_names_a_missing_local_model(tmp_path, capsys):
    (tmp_path / "runs" / "mdm" / "final").mkdir(parents=True)
    code = cli.main(
        [
            "sample",
            "--model",
            str(tmp_path / "runs" / "mdm" / "finall"),
            "--length",
            "4",
            "--output",
            str(tmp_path / "s.json"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "finall: no such file or directory" in err and "has final" in err and "huggingface" not in err


def test_wallclock_crossover_is_where_ar_stays_slower():
    from hf_mdm.experiments.speed import crossover_length, crossover_sentence, wallclock_table

    ratios = {16: 1.01, 32: 0.98, 64: 2.01, 128: 2.7}  # AR / MDM
    mdm = "MDM, 4 steps"
    rows = [
        row
        for n, r in ratios.items()
        for row in (
            speed.row("AR, KV cache", n, n, {"seconds": r, "forwards": n, "positions": n}, 1),
            speed.row(mdm, n, 4, {"seconds": 1.0, "forwards": 4, "positions": 4 * n}, 1),
        )
    ]
    assert crossover_length(rows, mdm) == 64 and crossover_length(rows[:4], mdm) is None
    assert crossover_length(rows[:2], mdm) == 16
    window = rows[:6] + [{**rows[6], "seconds": 0.5}, rows[7]]  # AR faster again at 128
    expected = "AR is slower than the MDM, 4 steps in every round only at L = 16, 64 (AR seconds / its seconds"
    assert crossover_sentence(window, mdm).startswith(expected)
    result = {
        "scale": {"size": "tiny", "vocab_size": 4, "batch_size": 1, "repeats": 1},
        "rows": rows,
        "machine": "cpu",
        "parameters": {"mdm": 1, "ar": 1},
        "steps_per_length": {},
    }
    table = wallclock_table(result)
    assert "AR is slower than the MDM, 4 steps in every round at every L measured from 64 to 128 (AR" in table
    assert "2.01x [2.01, 2.01] at L = 64" in table
    assert "| 64 | MDM, 4 steps | 4 | 0.062 | 4.00 | 15.625 | 250.00 | 1.000 [1.000, 1.000] | 2.01 |" in table
    assert "untrained `tiny` models (1 / 1 parameters, MDM / AR" in table and "ter_target" in table
    from hf_mdm.report import _machine_against_paper

    assert _machine_against_paper(rows[:4], mdm, 18.0).startswith(
        "This machine differs: AR is slower than the MDM, 4 steps in every round only at L = 16 ("
    )
    assert _machine_against_paper(rows, mdm, 2.0).startswith(
        "On this machine too, AR is slower than the MDM, 4 steps in every round at every L measured from 64 to 128 ("
    )


def test_steps_per_length_from_the_ter_at_each_length(tmp_path):
    """Per L, the smallest N whose measured upper bound is within the target; a length where none is, is left out;
    the chain's N from its closed form at every length."""

    def cell(length, steps, high):
        return {
            "language": "2-gram",
            "length": length,
            "model": "oracle MDM",
            "steps": steps,
            "ter_ci_high": high,
            "ter_num_sequences": 64,
        }

    rows = [cell(32, 16, 0.009), cell(32, 4, 0.03), cell(32, 8, 0.011), cell(64, 4, 0.05), cell(64, 16, 0.02)]
    (tmp_path / "ter_vs_steps.json").write_text(json.dumps({"rows": rows + [{**rows[0], "model": "trained MDM"}]}))
    scale = {"lengths": [32, 64, 128], "ter_target": 0.01, "steps_from": "ter_vs_steps"}
    chosen = speed.steps_per_length(scale, tmp_path)
    assert chosen["2-gram oracle (measured, n = 64)"] == {"32": 16}  # out of order; nothing within 1% at L = 64
    assert chosen["chain (closed form, exact)"] == {str(n): speed.chain_steps(n, 0.01) for n in (32, 64, 128)}
    assert speed.chain_steps(64, 0.01) == 75  # (1 - 3/(4N))^(-63/64) - 1: 0.01008 at N = 74, 0.00994 at 75
    assert speed.steps_per_length({"lengths": [8]}, tmp_path) == {}
    settings = speed.mdm_settings({**scale, "mdm_steps": [512], "dual_cache_blocks": None}, chosen)
    assert [s["model"] for s in settings] == [
        "MDM, 512 steps",
        "MDM, N from the paper's sampler's TER within 1% (chain (closed form, exact))",
        "MDM, N from the paper's sampler's TER within 1% (2-gram oracle (measured, n = 64))",
    ]


def test_cli_dataset_build_then_train_then_sample(tmp_path, capsys):
    data = tmp_path / "data"
    assert (
        cli.main(
            [
                "dataset",
                "build",
                "ngram2",
                "--length",
                "8",
                "--num-train",
                "256",
                "--num-validation",
                "64",
                "--num-test",
                "16",
                "--output-dir",
                str(data),
                "--cache-dir",
                str(tmp_path / "cache"),
            ]
        )
        == 0
    )
    assert (data / "language" / "language_config.json").exists()
    run = tmp_path / "run"
    assert (
        cli.main(
            [
                "train",
                "--data",
                str(data),
                "--kind",
                "mdm",
                "--output-dir",
                str(run),
                "--max-steps",
                "3",
                "--batch-size",
                "16",
                "--save-steps",
                "3",
                "--warmup-steps",
                "0",
            ]
        )
        == 0
    )
    assert (run / "final" / "config.json").exists() and (run / "final" / "language").is_dir()
    samples = tmp_path / "s.json"
    assert (
        cli.main(
            [
                "sample",
                "--model",
                str(run / "final"),
                "--kind",
                "mdm",
                "--num",
                "8",
                "--length",
                "8",
                "--steps",
                "4",
                "--output",
                str(samples),
            ]
        )
        == 0
    )
    rows = json.loads(samples.read_text())["samples"]
    assert len(rows) == 8 and all(0 <= t < 16 for row in rows for t in row)  # ngram2 has 16 tokens; [MASK] = 16


def test_cli_train_saves_final_before_a_bounded_evaluation_and_keeps_it_on_ctrl_c(tmp_path, monkeypatch, capsys):
    """``final`` is written (atomically) before the closing evaluation, which reads ``--eval-samples`` sequences; a
    Ctrl-C during it leaves the trained model loadable and exits 130."""
    from transformers import Trainer

    data, run = tmp_path / "data", tmp_path / "run"
    assert (
        cli.main(
            [
                "dataset",
                "build",
                "ngram2",
                "--length",
                "8",
                "--num-train",
                "64",
                "--num-validation",
                "40",
                "--num-test",
                "4",
                "--output-dir",
                str(data),
                "--cache-dir",
                str(tmp_path / "cache"),
            ]
        )
        == 0
    )
    seen = {}

    def interrupted(self, *args, **kwargs):
        seen["saved"] = (run / "final" / "config.json").exists() and (run / "final" / "language").is_dir()
        seen["rows"] = len(self.eval_dataset)
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "evaluate", interrupted)
    assert (
        cli.main(
            [
                "train",
                "--data",
                str(data),
                "--kind",
                "mdm",
                "--output-dir",
                str(run),
                "--max-steps",
                "2",
                "--batch-size",
                "8",
                "--save-steps",
                "100",
                "--warmup-steps",
                "0",
                "--eval-samples",
                "8",
            ]
        )
        == 130
    )
    assert seen == {"saved": True, "rows": 8}
    assert "the trained model is saved in" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []  # no half-written folder left
    MDMForMaskedDiffusion.from_pretrained(run / "final")


def test_cli_sample_says_where_its_default_sampler_differs_from_generate(tmp_path, capsys):
    model_dir = tmp_path / "model"
    MDMForMaskedDiffusion(
        MDMConfig(
            vocab_size=5,
            mask_token_id=4,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
        )
    ).save_pretrained(model_dir)
    out = tmp_path / "s.json"
    assert (
        cli.main(
            [
                "sample",
                "--model",
                str(model_dir),
                "--kind",
                "mdm",
                "--num",
                "2",
                "--length",
                "4",
                "--steps",
                "2",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    note = capsys.readouterr().out.splitlines()[-1]
    assert note == (
        "note: this command defaults to the paper's sampler; model.generate() without these flags would "
        "use transfer='deterministic', strategy='confidence', temperature=0.0 (pass "
        "--transfer/--strategy/--temperature to choose)"
    )
    assert (
        cli.main(
            [
                "sample",
                "--model",
                str(model_dir),
                "--kind",
                "mdm",
                "--num",
                "2",
                "--length",
                "4",
                "--steps",
                "2",
                "--output",
                str(out),
                "--transfer",
                "deterministic",
                "--strategy",
                "confidence",
                "--temperature",
                "0",
            ]
        )
        == 0
    )
    assert "note:" not in capsys.readouterr().out


class Tracked(Mapping):
    """A scale section that records the key paths read from it ("training.max_steps", "languages[0].kind")."""

    def __init__(self, data: dict, read: set, path: str = ""):
        self._data, self._read, self._path = data, read, path

    def __getitem__(self, key):
        value = self._data[key]
        path = f"{self._path}.{key}" if self._path else str(key)
        self._read.add(path)
        return _tracked(value, self._read, path)

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    def __repr__(self):
        return repr(self._data)


def _tracked(value, read, path):
    if isinstance(value, dict):
        return Tracked(value, read, path)
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        return [_tracked(v, read, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def _key_paths(value, path=""):
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from [f"{path}.{key}" if path else key, *_key_paths(inner, f"{path}.{key}" if path else key)]
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _key_paths(inner, f"{path}[{i}]")


def test_full_scales_run_end_to_end_in_miniature(tmp_path):
    """Every experiment `hf-mdm reproduce --full` runs, from its config's full scale shrunk by `miniature` (same
    keys, languages and samplers, tiny sizes), in the order reproduce runs them; every key of the scale is read."""
    from hf_mdm.cli import CONFIG_DIR, EXPERIMENT_CONFIGS
    from hf_mdm.experiments import load_scale, miniature

    for config in EXPERIMENT_CONFIGS:
        name, full = load_scale(CONFIG_DIR / f"{config}.yaml", full=True)
        small, read = miniature(full), set()
        assert sorted(_key_paths(small)) == sorted(_key_paths(full))
        result = run_experiment(name, Tracked(small, read), tmp_path)
        assert sorted(set(_key_paths(full)) - read) == [], config
        assert (tmp_path / f"{name}.png").stat().st_size > 0 and result["rows"]
    wall = json.loads((tmp_path / "wallclock.json").read_text())
    assert wall["steps_per_length"]["chain (closed form, exact)"].keys() == {"8", "16"}
    assert wall["rows"][-1]["length"] == 16
    assert "| 2-gram | 8 | trained MDM |" in (tmp_path / "ter_vs_steps.md").read_text()
    assert "| hmm | 8 | trained MDM | 1 | 0.125 |" in (tmp_path / "ser_vs_steps.md").read_text()
    blocks = (tmp_path / "block_diffusion.md").read_text()
    assert "| 2-gram | 8 | block diffusion (b = 4) | 1 |" in blocks and "| hmm | 8 | MDM (b = L = 8) | 4 |" in blocks
    assert "| 16 | block diffusion (b = 4), 1 token / forward | 16 |" in blocks  # 4 blocks of 4 steps
    assert (tmp_path / "block_diffusion_trained.png").stat().st_size > 0
    assert "| block diffusion (b = 4) | 1 | 128 |" in blocks  # equal FLOPs: half the MDM's 2 steps of 16 x 8 tokens
    assert "block diffusion (b = 4) at equal training FLOPs: exact NLL / entropy - 1" in blocks
    assert (tmp_path / "block_diffusion_budget.png").stat().st_size > 0
    # A2D: the AR model (2 steps of 16 x 8 tokens), the converted and the scratch MDM (4 steps), paired verdicts
    assert "| AR | 256 |" in blocks and "| A2D (AR converted, then MDM-trained) | 512 |" in blocks
    assert "| MDM from scratch | 512 |" in blocks and "- Converted against the scratch MDM: exact NLL" in blocks
    assert "- Converted against the AR model: exact NLL" in blocks


def error_line(capsys) -> str:
    """The command's stderr, checked to be one line."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.fixture
def config_dir(tmp_path) -> Path:
    """The experiment configs, wallclock's with a key indented by one space too many."""
    folder = tmp_path / "configs"
    folder.mkdir()
    for path in (REPO / "evaluation" / "configs").glob("*.yaml"):
        (folder / path.name).write_text(path.read_text())
    text = (folder / "wallclock.yaml").read_text()
    (folder / "wallclock.yaml").write_text(text.replace("\nquick:", "\n quick:", 1))
    return folder


def test_a_broken_experiment_config_is_one_line_before_any_experiment(config_dir, tmp_path, capsys, monkeypatch):
    from hf_mdm import cli_reproduce

    monkeypatch.setattr(cli_reproduce, "_run_side_by_side", lambda *a: pytest.fail("an experiment started"))
    out = tmp_path / "results"
    for command in (["bench"], ["reproduce", "--only", "ter_vs_steps", "wallclock"]):
        assert cli.main([*command, "--config-dir", str(config_dir), "--output-dir", str(out)]) == 2
        err = error_line(capsys)
        assert f"{config_dir / 'wallclock.yaml'}: not valid YAML at line 5, column 7 (mapping values" in err
    (config_dir / "wallclock.yaml").write_text("- a list\n")
    assert cli.main(["bench", "--config-dir", str(config_dir), "--output-dir", str(out)]) == 2
    assert "an experiment config is a YAML mapping with experiment:, quick: and full: sections" in error_line(capsys)
    assert not out.exists()


def test_a_cut_cell_cache_is_kept_aside_and_started_again(tmp_path):
    from hf_mdm.experiments.common import CellCache

    path = tmp_path / "cache" / "ter_vs_steps.json"
    CellCache(path).get("a", lambda: {"ter": 1.5})
    CellCache(path).get("b", lambda: {"ter": 2.5})
    path.write_text(path.read_text()[:-7])  # cut short
    with pytest.warns(UserWarning) as caught:
        cache = CellCache(path)
    (message,) = [str(w.message) for w in caught]
    kept = tmp_path / "cache" / "ter_vs_steps.json.corrupt"
    assert str(path) in message and str(kept) in message and "measured again" in message
    assert kept.is_file() and not path.exists() and cache.cells == {}
    assert cache.get("a", lambda: {"ter": 3.0}) == {"ter": 3.0} and json.loads(path.read_text()) == {"a": {"ter": 3.0}}
