"""`hf_mdm.loading`, the loader of every command: the kind of a checkpoint from its config, one set of refusals said
before the weights load (an autoregressive Llama is pointed to ``hf-mdm a2d``, DiffusionGemma is told its noise is
uniform, a folder without a tokenizer is named), and ``hf-mdm grpo`` checking its task, rewards and estimator before
loading, then training a LLaDA2 checkpoint on a synthetic language.

The refusal tests pass folders holding a config only: a command that reached the weights would answer "cannot load
the model" instead of the refusal asserted."""

from __future__ import annotations

import json
from pathlib import Path

import llada2_tiny
import pytest
import torch
from transformers import AutoConfig, AutoModelForMaskedLM, DiffusionGemmaConfig, LlamaConfig

from hf_mdm import MDMConfig
from hf_mdm.cli import main
from hf_mdm.languages import NGramLanguage
from hf_mdm.loading import auto_class, checkpoint_kind, load_pretrained, require_kind

LLAMA = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    """Config-only checkpoint folders of each kind, and a saved 4-token language."""
    root = tmp_path_factory.mktemp("configs")
    folders = {
        "mdm": MDMConfig(vocab_size=8, mask_token_id=7, hidden_size=16, num_hidden_layers=1, num_attention_heads=2),
        "llama": LlamaConfig(**LLAMA),
        "gemma": DiffusionGemmaConfig(),
    }
    for name, config in folders.items():
        config.save_pretrained(root / name)
    NGramLanguage.random(vocab_size=4, n=2, seed=0).save_pretrained(root / "language")
    return {name: root / name for name in (*folders, "language")}


def test_the_kind_and_class_come_from_the_config(configs):
    import transformers

    kinds = {name: AutoConfig.from_pretrained(configs[name]) for name in ("mdm", "llama", "gemma")}
    assert {name: checkpoint_kind(config) for name, config in kinds.items()} == {
        "mdm": "masked",
        "llama": "autoregressive",
        "gemma": "uniform",
    }
    assert auto_class(kinds["mdm"]) is transformers.AutoModelForMaskedLM
    assert auto_class(kinds["llama"]) is transformers.AutoModelForCausalLM
    assert auto_class(kinds["gemma"]) is transformers.AutoModelForImageTextToText


def test_one_set_of_refusals(configs):
    llama, gemma = (AutoConfig.from_pretrained(configs[name]) for name in ("llama", "gemma"))
    with pytest.raises(
        ValueError, match=r"--model runs/ar is an autoregressive llama model .*hf-mdm a2d --model runs/ar"
    ):
        require_kind(llama, "masked", "runs/ar", "hf-mdm sft")
    with pytest.raises(
        ValueError, match=r"'diffusion_gemma' model, whose noise is uniform random tokens, not \[MASK\]"
    ):
        require_kind(gemma, "masked", "runs/dg", "hf-mdm grpo")
    with pytest.raises(ValueError, match=r"pretrained=runs/x is an autoregressive .*; try hf_timed"):
        require_kind(llama, "masked", "runs/x", "--model hf_mdm", "pretrained=", "; try hf_timed")
    mdm = AutoConfig.from_pretrained(configs["mdm"])
    with pytest.raises(ValueError, match=r"is a masked diffusion model \('hf_mdm'\), not an autoregressive one"):
        require_kind(mdm, "autoregressive", "runs/mdm", "hf-mdm tune")


def test_a_folder_without_a_tokenizer_is_named_before_the_weights(configs):
    with pytest.raises(ValueError, match=rf"--model {configs['mdm']} has no tokenizer .*tokenizer.save_pretrained"):
        load_pretrained(str(configs["mdm"]))
    with pytest.raises(ValueError, match="cannot load the model"):  # without a tokenizer asked for: the weights
        load_pretrained(str(configs["mdm"]), tokenizer=False)


def grpo(model: Path, out: Path, *extra: str, reward: str = "language") -> list[str]:
    return ["grpo", "--model", str(model), "--reward", reward, "--output-dir", str(out), "--max-steps", "1",
            "--num-generations", "2", "--batch-size", "2", "--max-completion-length", "8", "--prompts", "2",
            "--save-steps", "1", "--logging-steps", "1", "--lr", "3e-4", *extra]  # fmt: skip


def error_of(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "cannot load the model" not in err, err  # refused before the weights
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "model, extra, message",
    [
        ("mdm", ["--rollout", "steps=2"], "give --data (rows with a prompt column) or --language"),
        ("mdm", ["--language", "LANGUAGE", "--reward", "nope"], "unknown reward 'nope'"),
        ("mdm", ["--language", "LANGUAGE", "--estimator", "elbo", "--estimator-option", "bogus=2"],
         "estimator 'elbo' has no option 'bogus': its options (with their defaults) are draws=8"),
        ("mdm", ["--language", "LANGUAGE", "--estimator", "decoding"],
         "(--rollout strategy=random --rollout transfer=stochastic), or choose another --estimator"),
        ("llama", ["--language", "LANGUAGE"], "is an autoregressive llama model (no [MASK] token): hf-mdm grpo"),
        ("gemma", ["--language", "LANGUAGE"], "whose noise is uniform random tokens, not [MASK]: hf-mdm grpo"),
        ("mdm", ["--data", "DATA"], "--reward language needs --language"),
    ],
)  # fmt: skip
def test_grpo_refuses_before_loading_and_names_the_flags(configs, tmp_path, capsys, model, extra, message):
    pytest.importorskip("trl")
    named = {"LANGUAGE": str(configs["language"]), "DATA": str(tmp_path / "prompts.jsonl")}
    assert main(grpo(configs[model], tmp_path / "out", *[named.get(x, x) for x in extra])) == 2
    assert message in error_of(capsys)


def test_grpo_on_data_names_a_missing_tokenizer(configs, tmp_path, capsys):
    pytest.importorskip("trl")
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "1 + 1 =", "answer": "2"}) + "\n")
    assert main(grpo(configs["mdm"], tmp_path / "out", "--data", str(data), reward="gsm8k")) == 2
    assert f"--model {configs['mdm']} has no tokenizer" in error_of(capsys)


def test_grpo_trains_a_llada2_checkpoint_on_a_language(configs, tmp_path, capsys):
    pytest.importorskip("trl")
    fields = {**llada2_tiny.CONFIGS["llada2_moe"], "mask_token_id": llada2_tiny.MASK_ID, "eos_token_id": 46}
    fields["block_size"] = 8
    torch.manual_seed(0)
    AutoModelForMaskedLM.from_config(AutoConfig.for_model(**fields)).save_pretrained(tmp_path / "llada2")
    extra = ["--language", str(configs["language"]), "--rollout", "steps=8", "--rollout", "block_length=8",
             "--estimator", "coupled", "--lr", "1e-2"]  # fmt: skip
    assert main(grpo(tmp_path / "llada2", tmp_path / "out", *extra)) == 0, capsys.readouterr().err[-2000:]
    assert "trained to step 1;" in capsys.readouterr().out
    (line,) = [json.loads(x) for x in (tmp_path / "out" / "rollouts-0.jsonl").read_text().splitlines()]
    assert line["settings"]["block_length"] == 8 and all(len(ids) <= 8 for ids in line["completion_ids"])
    assert AutoConfig.from_pretrained(tmp_path / "out").model_type == "llada2_moe"
