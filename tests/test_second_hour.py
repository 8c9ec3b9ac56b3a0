"""What a new user hit in the second hour (issue 44): mistakes in config and samples files and in harness model
arguments are one line naming the file (and where in it) or the argument, before any work; README's examples run on
their own and name what exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from hf_mdm.cli import main

REPO = Path(__file__).resolve().parents[1]
# the README and the guides it links (docs/), one text
README = "\n".join(path.read_text() for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])


def error_line(capsys) -> str:
    """The command's stderr, checked to be one line."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


# -- hf-mdm score ----------------------------------------------------------------------------------------------------


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
    assert main(["score", "--samples", str(path), "--language", str(tmp_path / "never-read")]) == 2
    assert f"hf-mdm: error: --samples {path}: {says}" in error_line(capsys)


# -- experiment configs (hf-mdm bench / reproduce) -----------------------------------------------------------------


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
        assert main([*command, "--config-dir", str(config_dir), "--output-dir", str(out)]) == 2
        err = error_line(capsys)
        assert f"{config_dir / 'wallclock.yaml'}: not valid YAML at line 5, column 7 (mapping values" in err
    (config_dir / "wallclock.yaml").write_text("- a list\n")
    assert main(["bench", "--config-dir", str(config_dir), "--output-dir", str(out)]) == 2
    assert "an experiment config is a YAML mapping with experiment:, quick: and full: sections" in error_line(capsys)
    assert not out.exists()


# -- harness model arguments -----------------------------------------------------------------------------------------


def test_a_misspelled_model_argument_is_one_short_line(capsys):
    from hf_mdm.harness import model_args
    from hf_mdm.harness.argument_checks import unknown_argument
    from hf_mdm.harness.mdm import MaskedDiffusionLM

    err = unknown_argument("hf_mdm", "stepz", MaskedDiffusionLM.known_arguments())
    message = str(err)
    assert message == (
        "unknown model argument 'stepz' for --model hf_mdm (did you mean 'steps'?); every argument it takes: "
        "python -m hf_mdm.harness.model_args hf_mdm"
    )
    assert model_args.main(["hf_mdm"]) == 0
    listed = capsys.readouterr().out
    assert "the sampler's: " in listed and "lm-eval HFLM's: " in listed and " steps," in listed
    assert model_args.main(["hf"]) == 2
    assert "hf: not one of hf_mdm's lm-eval models (hf_mdm, hf_timed" in error_line(capsys)


# -- README ----------------------------------------------------------------------------------------------------------


def python_block(after: str) -> str:
    """The first ```python block after the text ``after``."""
    return re.search(r"```python\n(.*?)```", README[README.index(after) :], flags=re.S).group(1)


@pytest.mark.parametrize("after", ["# Reproducible at any batch size", "# Beside diffusers' LLaDA2Pipeline"])
def test_readme_examples_run_on_their_own(after):
    pytest.importorskip("diffusers")
    exec(compile(python_block(after), f"README.md: {after}", "exec"), {})


def exists(dotted: str) -> bool:
    """Whether ``dotted`` (``hf_mdm.module.name``) is a module, or a name in the longest module it starts with."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


def test_readme_names_what_exists_and_how_to_reach_the_commands():
    named = sorted(set(re.findall(r"`(hf_mdm(?:\.\w+)+)", README)))
    assert "hf_mdm.generation_resolve.resolve_config" in named
    assert [dotted for dotted in named if not exists(dotted)] == []
    assert "source .venv/bin/activate" in README and "`.venv/bin/hf-mdm`" in README


def test_a_broken_compare_config_is_one_line_naming_it(tmp_path, capsys):
    from hf_mdm.harness.compare import load_config

    config = tmp_path / "compare.yaml"
    config.write_text("models:\n  - name: a\n   model: hf_mdm\n")  # one space short
    with pytest.raises(ValueError) as err:
        load_config(config)
    message = str(err.value)
    assert "\n" not in message and str(config) in message and "line 3" in message
    with pytest.raises(ValueError, match="no compare config at"):
        load_config(tmp_path / "missing.yaml")
