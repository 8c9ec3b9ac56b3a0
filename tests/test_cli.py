"""The `hf-mdm` command line (`hf_mdm.cli`): a bad samples file for `score` is one line naming the file and what
is wrong in it; `--help` of `tiny-models`; `--threads` sets torch's threads on every command that takes it."""

import json
from unittest import mock

import pytest

from hf_mdm import cli


def error_line(capsys) -> str:
    """The command's stderr, checked to be one line."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "text, says",
    [
        ('{"samples": [[1, 2],\n [3, }', "not valid JSON at line 2, column 6 (Expecting value)"),
        (
            '{"model": "m", "rows": [[1, 2]]}',
            "no `samples` key (its keys: 'model', 'rows'): pass the file hf-mdm sample",
        ),
        ('{"samples": [[1, 2], 3]}', "sample 1 is of type int, not a list of token ids"),
    ],
)
def test_score_names_the_samples_file_and_what_is_wrong(tmp_path, capsys, text, says):
    path = tmp_path / "samples.json"
    path.write_text(text)
    assert cli.main(["score", "--samples", str(path), "--language", str(tmp_path / "never-read")]) == 2
    assert f"hf-mdm: error: --samples {path}: {says}" in error_line(capsys)


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_tiny_models_help_names_the_four_models(capsys):
    assert "write the four tiny local models" in _help(capsys)
    text = _help(capsys, "tiny-models")
    assert "an MDM, a LLaDA2 MoE, a DiffusionGemma and a Llama" in text
    for name in ("mdm", "llada2", "diffusion_gemma", "llama"):
        assert f"DIRECTORY/{name}" in text


def test_threads_option_sets_torch_threads(tmp_path, capsys):
    from hf_mdm.languages import ChainLanguage

    ChainLanguage().save_pretrained(tmp_path / "lang")
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps({"samples": [[1, 4, 2, 9]]}))
    score = ["score", "--samples", str(samples), "--language", str(tmp_path / "lang")]
    with mock.patch("torch.set_num_threads") as set_threads:
        assert cli.main([*score, "--threads", "3"]) == 0
        assert cli.main(score) == 0
    set_threads.assert_called_once_with(3)
    for name in cli.THREAD_COMMANDS:
        text = _help(capsys, name)
        assert "--threads THREADS" in text and "Pass 1 on a machine with few cores" in text
    with pytest.raises(SystemExit):
        cli.main([*score, "--threads", "0"])
