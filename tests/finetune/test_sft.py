"""Supervised fine-tuning (`hf_mdm.finetune`, ``hf-mdm sft``): LLaDA's SFT loss against a hand computation, the
block-diffusion form against its block-by-block definition, LoRA and gradient checkpointing on every class, and the
command end to end: a resume after a kill, a resume after Ctrl-C that ends with the uninterrupted run's weights, and
LoRA adapters decided by the seed alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from finetune_inputs import EOS, models_by_class, write_pairs
from tiny_mdm import MASK, VOCAB, tiny_mdm
from transformers import TrainingArguments

from hf_mdm.finetune import (
    SFTCollator,
    apply_lora,
    block_by_block_loss,
    sft_step_loss,
    sft_trainer,
)


def rows(seed: int = 0, count: int = 4, vocab: int = VOCAB - 1, longest: int = 9) -> list[dict]:
    """``count`` pairs of random tokens (never [MASK] nor EOS): prompts of 3-6 tokens, responses of 2-``longest``."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        prompt = int(torch.randint(3, 7, (), generator=generator))
        response = int(torch.randint(2, longest + 1, (), generator=generator))
        ids = torch.randint(4, vocab - 1, (prompt + response,), generator=generator).tolist()
        out.append({"input_ids": ids, "prompt_length": prompt})
    return out


def test_the_collator_masks_responses_only_and_pads_with_eos():
    features = rows(count=64)
    batch = SFTCollator(MASK, EOS, seed=0)(features)
    x_t, labels, p_mask = batch["input_ids"], batch["labels"], batch["p_mask"]
    length = x_t.shape[1]
    for row, feature in enumerate(features):
        prompt, size = feature["prompt_length"], len(feature["input_ids"])
        assert x_t[row, :prompt].tolist() == feature["input_ids"][:prompt]  # the prompt is never masked
        assert (labels[row, :prompt] == -100).all()
        assert batch["clean_ids"][row, size:].eq(EOS).all()  # padded with EOS, a response token
        assert int(batch["answer_lengths"][row]) == length - prompt
        masked = x_t[row] == MASK
        assert torch.equal(masked, labels[row] != -100)
        assert torch.equal(labels[row][masked], batch["clean_ids"][row][masked])
        assert (p_mask[row] == p_mask[row, 0]).all() and 1e-3 <= float(p_mask[row, 0]) <= 1
    # each response position is masked with probability t: the masked share tracks t over many rows
    many = SFTCollator(MASK, EOS, seed=1)(rows(seed=2, count=2000))
    response = (
        torch.arange(many["input_ids"].shape[1])[None, :]
        >= many["input_ids"].new_tensor([f["prompt_length"] for f in rows(seed=2, count=2000)])[:, None]
    )
    masked = (many["labels"] != -100).float()
    expected = (many["p_mask"] * response).sum()
    assert abs(float(masked.sum()) - float(expected)) < 4 * float(expected) ** 0.5


def hand_loss(model, batch, shift: int = 0) -> torch.Tensor:
    """LLaDA's SFT loss written out: every position's logits, CE at masked positions / t / answer length."""
    logits = model(input_ids=batch["input_ids"]).logits.float()
    if shift:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
    total = torch.zeros(())
    for row in range(logits.shape[0]):
        for column in (batch["labels"][row] != -100).nonzero().flatten().tolist():
            ce = F.cross_entropy(logits[row, column], batch["labels"][row, column])
            total = total + ce / batch["p_mask"][row, column] / batch["answer_lengths"][row]
    return total / logits.shape[0]


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return models_by_class()


@pytest.mark.parametrize("name", ["mdm", "llada", "dream"])
def test_loss_equals_the_hand_computation(models, name):
    model = models[name]
    vocab, mask = model.config.vocab_size, model.config.mask_token_id
    batch = SFTCollator(mask, EOS, seed=3)(rows(seed=5, count=6, vocab=min(vocab, mask)))
    shift = 1 if name == "dream" else 0
    assert torch.allclose(sft_step_loss(model, batch), hand_loss(model, batch, shift), rtol=1e-5, atol=1e-6)
    # the prompt is never scored: changing a prompt token's label cannot matter, changing its input does
    assert not bool((batch["labels"][:, :3] != -100).any())


@pytest.mark.parametrize("name", ["mdm_blocks", "llada2"])
def test_block_diffusion_loss_equals_its_block_by_block_computation(models, name):
    model = tiny_mdm(block_size=4, vocab_size=64, mask_token_id=63) if name == "mdm_blocks" else models[name]
    block = model.config.block_size
    mask = model.config.mask_token_id
    collator = SFTCollator(mask, EOS, block_size=block, seed=4)
    batch = collator(rows(seed=6, count=5, vocab=min(model.config.vocab_size, mask), longest=20))
    assert batch["p_mask"][:, ::block].unique().numel() > batch["p_mask"].shape[0]  # a time per block
    with torch.no_grad():
        one_forward = float(sft_step_loss(model, batch, block_size=block))
        by_block = float(block_by_block_loss(model, batch, block))
        one_copy = float(sft_step_loss(model, batch))
    assert one_forward == pytest.approx(by_block, rel=1e-5, abs=1e-6)
    # and it is not the objective read off one noisy copy (later blocks would see earlier blocks' masks)
    assert abs(one_forward - one_copy) > 100 * abs(one_forward - by_block)


@pytest.mark.parametrize("name", ["mdm", "llada", "dream", "llada2"])
def test_lora_with_gradient_checkpointing_trains_only_the_adapters(models, name, tmp_path):
    import copy

    base = copy.deepcopy(models[name]).train()
    mask, vocab = base.config.mask_token_id, base.config.vocab_size
    frozen = {k: v.clone() for k, v in base.state_dict().items()}
    model = apply_lora(base, r=4, alpha=8, dropout=0.0)
    dataset = rows(seed=7, count=8, vocab=min(vocab, mask))
    from hf_mdm.finetune import checkpointing_argument

    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, learning_rate=1e-2,
        report_to="none", save_strategy="no", use_cpu=True, logging_steps=1,
        **{checkpointing_argument(): True},
    )  # fmt: skip
    trainer = sft_trainer(model, dataset, args, EOS, seed=0)
    result = trainer.train()
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))
    assert getattr(base, "is_activation_checkpointing", None) or base.is_gradient_checkpointing
    changed = {k for k, v in model.get_base_model().state_dict().items() if "lora_" in k}
    assert changed, "no LoRA weights"
    for key, value in model.get_base_model().state_dict().items():
        original = key.replace("base_layer.", "")
        if "lora_" not in key and original in frozen:
            assert torch.equal(value, frozen[original]), key  # the base weights never move
    moved = [k for k, v in model.named_parameters() if "lora_B" in k and bool(v.abs().sum() > 0)]
    assert moved, "the adapters did not train"


def test_evaluation_leaves_the_training_stream_where_it_is(tmp_path):
    """An evaluation during training draws from its own copy of the collator: the same masks every time, and the
    training batches after it are the ones a run without evaluation draws (a resume reproduces both)."""
    model = tiny_mdm(vocab_size=64, mask_token_id=63)
    dataset = rows(seed=8, count=8, vocab=63)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, per_device_eval_batch_size=4)
    trainer = sft_trainer(model, dataset, args, EOS, eval_dataset=dataset, seed=0)
    trainer.data_collator(dataset[:4])
    first, second = trainer.evaluate()["eval_loss"], trainer.evaluate()["eval_loss"]
    assert first == second and trainer.data_collator.batches == 1


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from hf_mdm.harness.tiny import build_tiny_models

    return Path(build_tiny_models(tmp_path_factory.mktemp("tiny"))["mdm"])


def sft_command(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "hf_mdm.cli", "sft", "--model", str(model), "--data", str(data),
        "--output-dir", str(out), "--batch-size", "4", "--max-length", "48", "--save-steps", "2", "--threads", "1",
        *extra,
    ]  # fmt: skip


def test_sft_command_end_to_end_resumes_after_a_kill(tiny_checkpoint, tmp_path):
    data, out = write_pairs(tmp_path / "pairs.jsonl"), tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = sft_command(tiny_checkpoint, data, out, "--max-steps", "2000", "--lr", "1e-3")
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not (out / "checkpoint-4" / "trainer_state.json").exists():
        assert process.poll() is None and time.time() < deadline, process.stdout.read()
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "model.safetensors").exists()  # killed before the end
    done = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if (p / "trainer_state.json").exists())
    resumed = subprocess.run(
        sft_command(tiny_checkpoint, data, out, "--max-steps", str(done + 4), "--lr", "1e-3"), env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"(step {done})" in resumed.stdout and f"trained to step {done + 4};" in resumed.stdout
    state = json.loads((out / f"checkpoint-{done + 4}" / "trainer_state.json").read_text())
    assert state["global_step"] == done + 4
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()


def run_sft(model: Path, data: Path, out: Path, *extra: str) -> int:
    """``hf-mdm sft`` in this process: 8 steps over 24 pairs (6 batches an epoch), a checkpoint every 2."""
    from hf_mdm.cli import main

    return main([
        "sft", "--model", str(model), "--data", str(data), "--output-dir", str(out), "--batch-size", "4",
        "--max-length", "48", "--save-steps", "2", "--max-steps", "8", "--lr", "1e-3", *extra,
    ])  # fmt: skip


def interrupt_at(monkeypatch, step: int) -> None:
    """Ctrl-C (a KeyboardInterrupt) at the start of optimizer step ``step + 1``."""
    from hf_mdm.finetune import SFTTrainer

    original = SFTTrainer.training_step

    def training_step(self, *args, **kwargs):
        if self.state.global_step == step:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "training_step", training_step)


def trained_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    adapter = out / "adapter_model.safetensors"
    return load_file(adapter if adapter.exists() else out / "model.safetensors")


def test_lora_runs_with_one_seed_train_the_same_adapters(tiny_checkpoint, tmp_path):
    data = write_pairs(tmp_path / "pairs.jsonl")
    torch.manual_seed(1)  # the global stream before each run differs: the seed alone must decide
    assert run_sft(tiny_checkpoint, data, tmp_path / "a", "--lora", "--max-steps", "2") == 0
    assert run_sft(tiny_checkpoint, data, tmp_path / "b", "--lora", "--max-steps", "2") == 0
    first, second = trained_weights(tmp_path / "a"), trained_weights(tmp_path / "b")
    assert first.keys() == second.keys() and any("lora_A" in key for key in first)
    for key in first:
        assert torch.equal(first[key], second[key]), key
    assert run_sft(tiny_checkpoint, data, tmp_path / "c", "--lora", "--max-steps", "2", "--seed", "1") == 0
    assert not all(torch.equal(first[key], value) for key, value in trained_weights(tmp_path / "c").items())


@pytest.mark.parametrize(
    "extra, stop",
    [((), 5), (("--lora",), 7), (("--grad-accum", "2"), 5)],
    ids=["mid-epoch", "lora-at-an-epoch-end", "accumulation"],
)
def test_a_run_resumed_after_ctrl_c_ends_with_the_uninterrupted_runs_weights(
    tiny_checkpoint, tmp_path, monkeypatch, capsys, extra, stop
):
    """Interrupted after a checkpoint and rerun, a run trains what the uninterrupted run trained: the collator's
    masks and times and the Trainer's random stream (LoRA's dropout) continue where the checkpoint left them."""
    data = write_pairs(tmp_path / "pairs.jsonl")
    assert run_sft(tiny_checkpoint, data, tmp_path / "whole", *extra) == 0
    whole = capsys.readouterr().out
    assert "mean loss" in whole and "over steps 1-8;" in whole
    interrupt_at(monkeypatch, stop)
    assert run_sft(tiny_checkpoint, data, tmp_path / "cut", *extra) == 130
    kept = stop - stop % 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"checkpoint-{kept}" in message and "rerun the same command to resume" in message
    monkeypatch.undo()
    assert run_sft(tiny_checkpoint, data, tmp_path / "cut", *extra) == 0
    resumed = capsys.readouterr().out
    assert f"(step {kept})" in resumed and f"over steps {kept + 1}-8 (this run, resumed at step {kept})" in resumed
    expected, got = trained_weights(tmp_path / "whole"), trained_weights(tmp_path / "cut")
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), (key, float((expected[key] - got[key]).abs().max()))


def test_sft_command_errors_say_what_to_change(tiny_checkpoint, tmp_path):
    from hf_mdm.cli import main

    assert main(["sft", "--model", str(tmp_path / "none"), "--data", "x.jsonl", "--output-dir", str(tmp_path)]) != 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "a", "answer": "b"}) + "\n")
    with pytest.raises(ValueError, match="prompt_column"):
        from transformers import AutoTokenizer

        from hf_mdm.finetune import load_pairs, tokenize_pairs

        tokenize_pairs(load_pairs(str(bad)), AutoTokenizer.from_pretrained(tiny_checkpoint))
