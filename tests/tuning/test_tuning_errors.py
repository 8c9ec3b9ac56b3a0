"""hf-mdm tune's mistakes and interruptions: every argument checked before any work, a space checked as it is read,
nothing to save into for the oracle, and Ctrl-C keeping what was measured (timing rounds included) for a rerun."""

import importlib
import json

import pytest
import yaml

from hf_mdm import cli
from hf_mdm.experiments.common import CellCache
from hf_mdm.languages import ChainLanguage, OracleDenoiser
from hf_mdm.tuning import SyntheticTask, time_settings, tune

search_module = importlib.import_module("hf_mdm.tuning.search")  # the package exports a function of that name
TIMED = search_module.interleaved_times

SPACE = [
    {"transfer": "stochastic", "strategy": "random", "steps": [2, 4]},
    {"transfer": "deterministic", "strategy": "left_to_right", "steps": 8},
]


@pytest.fixture
def argv(tmp_path):
    """hf-mdm tune on the chain language's oracle, 8 tokens, small budgets."""
    ChainLanguage().save_pretrained(tmp_path / "lang")
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    args = ["tune", "--model", "oracle", "--language", str(tmp_path / "lang"), "--space", str(tmp_path / "space.yaml")]
    return args + ["--length", "8", "--output-dir", str(tmp_path / "out"), "--min-samples", "8", "--max-samples", "8"]


@pytest.fixture
def no_work(monkeypatch):
    """Loading a model or measuring anything fails the test: the error must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr("hf_mdm.cli_tune._task", refuse)
    monkeypatch.setattr("hf_mdm.tuning.run.time_settings", refuse)


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hf-mdm: error: "), err
    return err[0]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tolerance", "-1"], "--tolerance must be >= 0 (quality the chosen setting may give up), got -1.0"),
        (["--tolerance", "nan"], "--tolerance must be >= 0"),
        (["--min-samples", "16"], "need 1 <= --min-samples <= --max-samples, got 16 and 8: lower --min-samples"),
        (["--save-to-model"], "--save-to-model writes the chosen setting into the --model folder, and the oracle"),
    ],
)
def test_arguments_are_refused_before_any_work(argv, extra, message, tmp_path, capsys, no_work):
    assert cli.main(argv + extra) == 2
    assert message in _one_error(capsys)
    assert not (tmp_path / "out").exists()


def test_tune_checks_its_arguments_before_timing(no_work, tmp_path):
    language = ChainLanguage()
    with pytest.raises(ValueError, match="--tolerance must be >= 0"):
        tune(OracleDenoiser(language), SyntheticTask(language, 8), SPACE, tmp_path, tolerance=-1)
    with pytest.raises(ValueError, match="--timing-rows must be >= 1, got 0"):
        tune(OracleDenoiser(language), SyntheticTask(language, 8), SPACE, tmp_path, timing_rows=0)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            yaml.safe_dump([{"steps": 4}, {"transfer": "stochastic", "steps": []}]),
            "space.yaml: space[1]: 'steps' has no values (an empty list): give it at least one or remove it",
        ),
        ("- {steps: [2, 4}\n", "space.yaml: not valid YAML at line 1, column 16"),
    ],
)
def test_a_bad_space_is_named_when_it_is_read(argv, text, message, tmp_path, capsys, no_work):
    (tmp_path / "space.yaml").write_text(text)
    assert cli.main(argv) == 2
    assert message in _one_error(capsys)


def _interrupting(monkeypatch, after: int) -> list:
    """``interleaved_times`` raising KeyboardInterrupt on its call number ``after`` + 1; returns the calls made."""
    calls = []

    def interrupt(*args, **kwargs):
        calls.append(kwargs.get("warmup"))
        if len(calls) > after:
            raise KeyboardInterrupt
        return TIMED(*args, **kwargs)

    monkeypatch.setattr(search_module, "interleaved_times", interrupt)
    return calls


def test_timing_keeps_its_finished_rounds(monkeypatch, tmp_path):
    """Interrupted in its third round, the timing keeps two; timed again, it runs only the last (after a warm-up)."""
    language = ChainLanguage()
    oracle, task = OracleDenoiser(language), SyntheticTask(language, 8)
    settings = [{"steps": 2}, {"steps": 4}]
    _interrupting(monkeypatch, after=2)
    with pytest.raises(KeyboardInterrupt):
        time_settings(oracle, task, settings, 4, 3, CellCache(tmp_path / "cache.json"))
    kept = json.loads((tmp_path / "cache.json").read_text())
    assert sorted(key.rsplit("|", 1)[1] for key in kept) == ["round 0", "round 1"]
    calls = _interrupting(monkeypatch, after=99)
    speeds = time_settings(oracle, task, settings, 4, 3, CellCache(tmp_path / "cache.json"))
    assert calls == [1] and set(speeds) == {'{"steps":2}', '{"steps":4}'}
    for speed in speeds.values():
        assert speed["tokens_per_s_min"] <= speed["tokens_per_s"] <= speed["tokens_per_s_max"]


def test_ctrl_c_in_tune_says_what_was_kept_and_a_rerun_resumes(argv, monkeypatch, tmp_path, capsys):
    args = argv + ["--rounds", "3", "--threads", "1"]
    _interrupting(monkeypatch, after=2)
    assert cli.main(args) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"hf-mdm tune: interrupted; kept 2 timed round(s) and 0 chunk(s) of samples in {tmp_path / 'out' / 'cache.json'}"
        ": rerun the same command to resume from them"
    ]
    calls = _interrupting(monkeypatch, after=99)
    assert cli.main(args) == 0 and calls == [1]
    assert json.loads((tmp_path / "out" / "front.json").read_text())["rounds"] == 3


def test_ctrl_c_before_anything_finished(argv, monkeypatch, capsys):
    _interrupting(monkeypatch, after=0)
    assert cli.main(argv + ["--threads", "1"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hf-mdm tune: interrupted; no measurement had finished: rerun the same command to start again"]


def test_an_lm_eval_task_with_too_few_documents_is_refused_naming_the_numbers():
    from types import SimpleNamespace

    from hf_mdm.tuning.tasks import check_documents

    task = SimpleNamespace(eval_docs=list(range(10)))
    check_documents(task, "t", timing_rows=10, max_samples=5, test_start=5)  # exactly enough
    check_documents(None, "a group", timing_rows=10**6, max_samples=10**6, test_start=0)  # a group: not counted
    refusals = [
        ((11, 5, 5), "--timing-rows 11 is more than the 10 documents of t: pass --timing-rows 10 or fewer"),
        ((4, 11, 11), "--max-samples 11 is more than the 10 documents of t: pass --max-samples 5 or fewer"),
        ((4, 6, 6), "the held-out split (--test-start 6 + --max-samples 6 documents) runs past the 10 documents"),
    ]
    for (rows, samples, start), message in refusals:
        with pytest.raises(ValueError) as err:
            check_documents(task, "t", timing_rows=rows, max_samples=samples, test_start=start)
        assert message in str(err.value)
