"""Failures met at the edges of everyday use, each refused or handled with a message that names what to change:
output file modes, resuming past a cut checkpoint, a cut cell cache, bad metric inputs, oversized n-gram tables,
an unreachable Hub, and the command line's help, threads and warnings."""

import json
import math
import os
import stat
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
from datasets import Dataset
from transformers import TrainingArguments

from hf_mdm import cli
from hf_mdm.fileio import write_atomic, write_directory_atomic
from hf_mdm.training import build_trainer, train

# ----------------------------------------------------------------------------------------------------------------
# File modes


@pytest.fixture(params=[0o022, 0o077])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_writes_honour_the_umask(tmp_path, umask):
    write_atomic(tmp_path / "a.json", "{}")
    write_atomic(tmp_path / "a.json", b"{}")  # replacing keeps the umask's mode too
    write_directory_atomic(tmp_path / "folder", lambda folder: (folder / "x.txt").write_text("x"))
    write_directory_atomic(tmp_path / "folder", lambda folder: (folder / "y.txt").write_text("y"))
    assert _mode(tmp_path / "a.json") == 0o666 & ~umask
    assert _mode(tmp_path / "folder") == 0o777 & ~umask
    assert _mode(tmp_path / "folder" / "y.txt") == 0o666 & ~umask
    assert (tmp_path / "a.json").read_text() == "{}" and not (tmp_path / "folder" / "x.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "folder"]  # no temporary left


def test_atomic_write_syncs_before_the_rename(tmp_path):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    with (
        mock.patch("os.fsync", side_effect=lambda fd: events.append("fsync") or real_fsync(fd)),
        mock.patch("os.replace", side_effect=lambda a, b: events.append("replace") or real_replace(a, b)),
    ):
        write_atomic(tmp_path / "a.txt", "x")
    assert events[:2] == ["fsync", "replace"] and events.count("fsync") >= 1


def test_an_interrupted_atomic_write_leaves_nothing(tmp_path):
    def fail(folder):
        (folder / "half").write_text("x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_directory_atomic(tmp_path / "out", fail)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------------------------------
# Resuming past a cut checkpoint


def _tiny_trainer(folder: Path, max_steps: int):
    g = torch.Generator().manual_seed(0)
    data = Dataset.from_dict({"input_ids": torch.randint(0, 4, (64, 8), generator=g).tolist()})
    args = TrainingArguments(
        output_dir=str(folder),
        per_device_train_batch_size=8,
        max_steps=max_steps,
        save_steps=2,
        eval_strategy="no",
        report_to=[],
        logging_steps=100,
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
    )
    return build_trainer("mdm", data, data, vocab_size=4, length=8, args=args)


def test_resume_skips_a_cut_checkpoint_and_says_where_it_resumes(tmp_path, capsys):
    train(_tiny_trainer(tmp_path, 4))
    weights = tmp_path / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])  # killed during the save
    capsys.readouterr()
    resumed = _tiny_trainer(tmp_path, 6)
    with pytest.warns(UserWarning, match=r"skipping checkpoint .*checkpoint-4: model.safetensors does not read"):
        state = train(resumed)
    assert state.global_step == 6 and resumed.state.global_step == 6
    assert f"resuming from {tmp_path / 'checkpoint-2'} (step 2)" in capsys.readouterr().out


def test_resume_starts_over_when_no_checkpoint_reads(tmp_path, capsys):
    (tmp_path / "checkpoint-2").mkdir(parents=True)  # killed before its trainer state was written
    (tmp_path / "checkpoint-2" / "model.safetensors").write_bytes(b"\0" * 4)
    with pytest.warns(UserWarning, match=r"checkpoint-2: no trainer_state.json"):
        state = train(_tiny_trainer(tmp_path, 2))
    assert state.global_step == 2 and "resuming" not in capsys.readouterr().out


def test_cli_train_resumes_past_a_cut_checkpoint(tmp_path, capsys):
    data, runs = str(tmp_path / "data"), tmp_path / "runs"
    build = ["dataset", "build", "ngram2", "--length", "8", "--num-train", "64", "--num-validation", "16"]
    assert cli.main([*build, "--num-test", "0", "--output-dir", data]) == 0
    command = ["train", "--data", data, "--kind", "mdm", "--output-dir", str(runs), "--batch-size", "8"]
    command += ["--warmup-steps", "0", "--save-steps", "2", "--eval-samples", "8", "--threads", "1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main([*command, "--max-steps", "4"]) == 0
    assert not [w for w in caught if "pin_memory" in str(w.message)]  # no accelerator here: no pinned memory asked
    weights = runs / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    capsys.readouterr()
    with pytest.warns(UserWarning, match="checkpoint-4: model.safetensors does not read") as caught:
        assert cli.main([*command, "--max-steps", "6"]) == 0
    assert len([w for w in caught if "skipping checkpoint" in str(w.message)]) == 1
    out = capsys.readouterr().out
    assert out.count("resuming from") == 1 and f"resuming from {runs / 'checkpoint-2'} (step 2)" in out
    assert (runs / "final" / "model.safetensors").is_file()


# ----------------------------------------------------------------------------------------------------------------
# A cut cell cache


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


# ----------------------------------------------------------------------------------------------------------------
# Metric inputs


@pytest.mark.parametrize(
    "log_p, shown", [([-2.0, 0.5], r"predictions\[1\] is 0.5"), ([float("nan"), -3.0], r"predictions\[0\] is nan")]
)
def test_ter_refuses_positive_and_nan_log_probabilities(log_p, shown):
    from hf_mdm.languages import ChainLanguage
    from hf_mdm.metrics import TokenErrorRate

    references = [[1, 4, 2, 9], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match=shown + ", not a log-probability"):
        TokenErrorRate().compute(predictions=log_p, references=references, language=ChainLanguage())
    exact = TokenErrorRate().compute(predictions=[-12 * math.log(2)] * 2, references=references)
    assert exact["ter"] == pytest.approx(8.0)  # log p = 0 up to rounding stays allowed below
    assert TokenErrorRate().compute(predictions=[1e-12], references=[[0]])["ter"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "predictions, shown",
    [
        ([[1, 4, 2, 9], [1.5, 4, 2, 9]], r"predictions\[1\]\[0\] is 1.5, not an integer token id"),
        ([[1, 4, 2, 9.0]], r"predictions\[0\]\[3\] is 9.0"),
        (torch.tensor([[1.0, 4.0, 2.0, 9.0]]), r"predictions holds torch.float32 values"),
        ([torch.tensor([1.0, 4.0])], r"predictions\[0\] holds torch.float32 values"),
    ],
)
def test_ser_and_generative_perplexity_refuse_non_integer_token_ids(predictions, shown):
    from hf_mdm.languages import ChainLanguage
    from hf_mdm.metrics import GenerativePerplexity, SequenceErrorRate

    for metric in (SequenceErrorRate(), GenerativePerplexity()):
        with pytest.raises(ValueError, match=shown):
            metric.compute(predictions=predictions, language=ChainLanguage())


def test_metrics_accept_integer_token_ids_in_every_form():
    import numpy as np

    from hf_mdm.languages import ChainLanguage
    from hf_mdm.metrics import SequenceErrorRate, TokenErrorRate

    ser = SequenceErrorRate()
    for rows in ([[1, 4, 2, 9]], torch.tensor([[1, 4, 2, 9]]), np.array([[1, 4, 2, 9]]), [np.array([1, 4, 2, 9])]):
        assert ser.compute(predictions=rows, language=ChainLanguage())["ser"] == 0.0
    ser.add(prediction=[1, 2, 2, 9])
    with pytest.raises(ValueError, match=r"prediction\[1\] is 2.5"):
        ser.add(prediction=[1, 2.5, 2, 9])
    assert ser.compute(language=ChainLanguage())["ser"] == 1.0
    with pytest.raises(ValueError, match=r"references\[0\]\[1\] is 0.5"):
        TokenErrorRate().compute(predictions=[-1.0], references=[[0, 0.5]])


# ----------------------------------------------------------------------------------------------------------------
# n-gram tables


def test_ngram_refuses_tables_too_large_before_allocating():
    import time

    from hf_mdm.languages import NGramLanguage, build_language
    from hf_mdm.languages.ngram import MAX_TABLE_ENTRIES

    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"vocab_size=16 and n=8 needs 4,581,298,448 table entries .* 34 GiB") as err:
        NGramLanguage.random(vocab_size=16, n=8, seed=0)
    assert "lower n to 6 or less" in str(err.value) and f"{MAX_TABLE_ENTRIES:,}" in str(err.value)
    with pytest.raises(ValueError, match="MAX_TABLE_ENTRIES"):
        build_language("ngram", n=3, vocab_size=1024, seed=0)
    assert time.perf_counter() - start < 1.0
    assert NGramLanguage.random(vocab_size=4, n=4, seed=0).n == 4  # the experiments' sizes stay well inside


# ----------------------------------------------------------------------------------------------------------------
# An unreachable Hub


@pytest.fixture
def saved_mdm(tmp_path) -> Path:
    from hf_mdm import MDMForMaskedDiffusion
    from hf_mdm.training import mdm_config_for

    MDMForMaskedDiffusion(mdm_config_for(4, 8)).save_pretrained(tmp_path / "mdm")
    return tmp_path / "mdm"


def _unreachable_errors():
    """The errors the installed huggingface_hub raises without a network: its HTTP client's (httpx2 from
    huggingface_hub 2.x, httpx before) and its offline mode's."""
    import importlib
    import importlib.util

    from huggingface_hub.errors import OfflineModeIsEnabled

    client = next(importlib.import_module(m) for m in ("httpx2", "httpx") if importlib.util.find_spec(m))
    request = client.Request("POST", "https://huggingface.co/api/repos/create")
    return [
        client.ConnectError("[Errno -3] Temporary failure in name resolution\nmore detail", request=request),
        client.ConnectTimeout("timed out", request=request),
        OfflineModeIsEnabled("Cannot reach https://huggingface.co/api/repos/create: offline mode is enabled."),
    ]


@pytest.mark.parametrize("error", _unreachable_errors(), ids=lambda e: type(e).__name__)
def test_push_without_the_hub_says_so_in_one_line(saved_mdm, capsys, error):
    from huggingface_hub import HfApi

    with (
        mock.patch.object(HfApi, "create_repo", side_effect=error),
        mock.patch.object(HfApi, "create_commit") as commit,
    ):
        code = cli.main(["push", "--model", str(saved_mdm), "--repo-id", "you/mdm"])
    err = capsys.readouterr().err
    assert code == 2 and not commit.called
    last = err.splitlines()[-1]  # before it, only the loading progress bar
    assert last.startswith("hf-mdm: error: could not reach the Hugging Face Hub") and "nothing was uploaded" in last
    assert type(error).__name__ in last and "Traceback" not in err and "more detail" not in err


def test_push_still_raises_what_is_not_about_the_network(saved_mdm):
    from huggingface_hub import HfApi

    with mock.patch.object(HfApi, "create_repo", side_effect=RuntimeError("a bug")), pytest.raises(RuntimeError):
        cli.main(["push", "--model", str(saved_mdm), "--repo-id", "you/mdm"])


# ----------------------------------------------------------------------------------------------------------------
# The command line's help and threads


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
