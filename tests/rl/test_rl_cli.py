"""`hf-mdm grpo` and GRPO on every hf_mdm class: one step of each class (MDM, LLaDA, Dream with its logits shift,
LLaDA2 block-causal) through the Python API; the command line on a synthetic language (trained to its steps, the
model saved, every rollout batch's settings recorded), under ``accelerate launch`` on 2 CPU processes, and its
refusals of bad input as one line each."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from finetune_inputs import models_by_class  # noqa: E402
from launching import launch  # noqa: E402

from hf_mdm import MDMForMaskedDiffusion  # noqa: E402
from hf_mdm.languages import NGramLanguage  # noqa: E402
from hf_mdm.rl.language_task import language_tokenizer  # noqa: E402
from hf_mdm.rl.trainer import DiffusionGRPOConfig, grpo_trainer  # noqa: E402
from hf_mdm.training import mdm_config_for  # noqa: E402

HF_MDM = Path(sys.executable).parent / "hf-mdm"


def token_sum(completion_ids, **_):
    """A reward that differs between two completions unless their tokens sum alike: that sum."""
    return [float(sum(ids)) for ids in completion_ids]


@pytest.mark.parametrize("name", ["mdm", "llada", "dream", "llada2"])
def test_every_class_takes_a_grpo_step(name, tmp_path):
    import datasets

    model = models_by_class()[name]
    config = model.config
    tokenizer = language_tokenizer(config.vocab_size, config.mask_token_id)
    rollout = {"steps": 8, "block_length": 8} if name == "llada2" else {"steps": 4}
    args = DiffusionGRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_completion_length=8,
        max_steps=1, learning_rate=1e-2, report_to=[], use_cpu=True, bf16=False, rollout=rollout,
        estimator="coupled", save_strategy="no", disable_tqdm=True, seed=1,
    )  # fmt: skip
    prompts = datasets.Dataset.from_dict({"prompt": ["t1 t2 t3", "t4 t5"]})
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = grpo_trainer(model, token_sum, prompts, args, tokenizer)
    result = trainer.train()
    assert result.global_step == 1 and torch.isfinite(torch.tensor(result.training_loss))
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    (line,) = [json.loads(x) for x in (tmp_path / "rollouts-0.jsonl").read_text().splitlines()]
    assert line["settings"]["steps"] == rollout["steps"] and line["estimator"]["name"] == "coupled"
    assert all(len(ids) == 8 for ids in line["completion_ids"])


@pytest.fixture(scope="module")
def language_run(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("grpo_language")
    language = NGramLanguage.random(vocab_size=4, n=2, seed=0)
    language.save_pretrained(folder / "language")
    torch.manual_seed(0)
    MDMForMaskedDiffusion(mdm_config_for(4, 8, "tiny")).save_pretrained(folder / "model")
    return {"language": folder / "language", "model": folder / "model", "root": folder}


def grpo_arguments(run: dict, out: Path, *extra: str) -> list[str]:
    return [
        "grpo", "--model", str(run["model"]), "--language", str(run["language"]), "--reward", "language",
        "--output-dir", str(out), "--max-steps", "2", "--num-generations", "2", "--batch-size", "2",
        "--max-completion-length", "8", "--rollout", "steps=2", "--rollout", "transfer=stochastic", "--rollout",
        "strategy=random", "--estimator", "elbo", "--estimator-option", "draws=2", "--save-steps", "2",
        "--logging-steps", "1", "--prompts", "8", "--lr", "1e-3", "--threads", "1", *extra,
    ]  # fmt: skip


def hf_mdm(*arguments: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run([str(HF_MDM), *arguments], env=env, capture_output=True, text=True, timeout=300)


def test_the_command_line_trains_on_a_language_and_records_its_rollouts(language_run, tmp_path):
    result = hf_mdm(*grpo_arguments(language_run, tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained to step 2;" in result.stdout
    lines = [json.loads(x) for x in (tmp_path / "run" / "rollouts-0.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1]
    assert lines[0]["settings"]["transfer"] == "stochastic" and lines[0]["estimator"] == {"name": "elbo", "draws": 2}
    assert lines[0]["seed"] != lines[1]["seed"]
    saved = MDMForMaskedDiffusion.from_pretrained(tmp_path / "run")
    assert saved.config.mask_token_id == 4 and (tmp_path / "run" / "checkpoint-2").is_dir()
    again = hf_mdm(*grpo_arguments(language_run, tmp_path / "run"))  # rerun: resumes at its last checkpoint
    assert again.returncode == 0 and "already at step 2" in again.stdout


def test_help_shows_every_default_and_asks_for_the_learning_rate(capsys):
    from hf_mdm.cli import main

    with pytest.raises(SystemExit) as shown:
        main(["grpo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert shown.value.code == 0 and "--lr LR the learning rate (required)" in text
    for flag, default in (("--max-steps", 100), ("--save-total-limit", 2), ("--num-generations", 8), ("--beta", 0.0)):
        assert re.search(rf"{flag} \S+ .*?\(default: {default}\)", text), flag
    with pytest.raises(SystemExit) as refused:
        main(["grpo", "--model", "m", "--reward", "language", "--output-dir", "o"])
    assert refused.value.code == 2 and "the following arguments are required: --lr" in capsys.readouterr().err


def test_a_vocabulary_that_is_not_the_languages_is_named():
    from hf_mdm.cli_grpo import check_vocabulary

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_vocabulary(mdm_config_for(4, 8, "tiny"), 4, "m")  # the language's 4 tokens and [MASK]: silent
    with pytest.warns(UserWarning, match="has 9 token ids, the --language 4 tokens and \\[MASK\\] \\(5\\)"):
        check_vocabulary(mdm_config_for(8, 8, "tiny"), 4, "m")
    with pytest.raises(ValueError, match="has 5 token ids, fewer than the --language's 6 tokens"):
        check_vocabulary(mdm_config_for(4, 8, "tiny"), 6, "m")


@pytest.mark.slow
def test_two_cpu_processes_under_accelerate(language_run, tmp_path):
    out = tmp_path / "run"
    result = launch("multi_cpu", "hf_mdm.cli", *grpo_arguments(language_run, out))
    assert result.stdout.count("trained to step 2;") == 2  # both ranks ran to the end
    assert (out / "rollouts-0.jsonl").is_file() and (out / "rollouts-1.jsonl").is_file()
    seeds = [json.loads((out / f"rollouts-{rank}.jsonl").read_text().splitlines()[0])["seed"] for rank in (0, 1)]
    assert seeds[0] != seeds[1]  # each process draws its own rollouts


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--rollout", "steps"], "write settings as key=value"),
        (["--estimator", "exact"], "unknown log-likelihood estimator 'exact'"),
        (["--reward", "nope"], "unknown reward 'nope'"),
        (["--rollout", "preset=fast"], "rollout settings: unknown preset 'fast'"),
    ],
)
def test_bad_input_is_one_line(language_run, tmp_path, extra, message):
    result = hf_mdm(*grpo_arguments(language_run, tmp_path / "bad", *extra))
    assert result.returncode != 0 and message in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "bad" / "checkpoint-2").exists()
