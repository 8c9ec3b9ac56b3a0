"""Resuming training (`hf_mdm.checkpoints`, `hf_mdm.training.train`, `hf-mdm train`): a checkpoint cut short by a
kill is skipped with a warning naming it, training resumes from the last one that reads and says where, and starts
over when none reads."""

import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import TrainingArguments

from hf_mdm import cli
from hf_mdm.training import build_trainer, train


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
