"""Forward-process collator and Trainer glue for the MDM and the AR baseline."""

import math

import pytest
import torch
from datasets import Dataset
from transformers import TrainingArguments

from hf_mdm.schedules import get_schedule
from hf_mdm.training import (
    CausalLMCollator,
    MaskedDiffusionCollator,
    ar_config_for,
    build_trainer,
    mdm_config_for,
    train,
)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_collator_masks_with_probability_one_minus_alpha(schedule):
    collator = MaskedDiffusionCollator(mask_token_id=9, schedule=schedule, seed=0, low_discrepancy=False)
    rows = [[1, 2, 3, 4, 5, 6, 7, 8] * 8] * 400
    batch = collator(rows)
    t, masked = batch["t"], batch["input_ids"] == 9
    assert ((t >= 1e-3) & (t <= 1)).all()
    assert torch.equal(batch["labels"] != -100, masked)
    x0 = torch.tensor(rows)
    assert torch.equal(batch["labels"][masked], x0[masked]) and torch.equal(batch["input_ids"][~masked], x0[~masked])
    expected = 1 - get_schedule(schedule).alpha(t.double()).float()
    # per-row masked fractions match 1 - alpha(t) on average over rows (binomial noise, 64 tokens per row)
    observed = masked.float().mean(1)
    assert abs(float((observed - expected).mean())) < 0.02
    assert float(((observed - expected) ** 2).mean()) < 0.25 / 64 * 1.5


def test_low_discrepancy_times_cover_the_interval():
    collator = MaskedDiffusionCollator(mask_token_id=9, seed=1)
    t = collator([[1, 2]] * 10)["t"]
    gaps = torch.sort(t).values.diff()
    assert torch.allclose(gaps, torch.full_like(gaps, (1 - 1e-3) / 10), atol=1e-6)


def test_collator_rejects_mask_id_in_data_and_pads():
    with pytest.raises(ValueError, match="mask token id"):
        MaskedDiffusionCollator(mask_token_id=3)([[1, 3, 2]])
    with pytest.raises(ValueError, match="pad_token_id"):
        MaskedDiffusionCollator(mask_token_id=9)([[1, 2, 3], [1, 2]])
    batch = MaskedDiffusionCollator(mask_token_id=9, pad_token_id=0, seed=0)([[1, 2, 3], [1, 2]])
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["input_ids"][1, 2] == 0 and batch["labels"][1, 2] == -100


def test_causal_collator_prepends_bos():
    batch = CausalLMCollator(bos_token_id=7)([[1, 2, 3], [4, 5, 6]])
    assert batch["input_ids"].tolist() == [[7, 1, 2, 3], [7, 4, 5, 6]]
    assert torch.equal(batch["labels"], batch["input_ids"])


def test_matched_sizes():
    mdm, ar = mdm_config_for(16, 32, "tiny"), ar_config_for(16, 32, "tiny")
    assert mdm.vocab_size == ar.vocab_size == 17 and mdm.mask_token_id == 16 and ar.bos_token_id == 16
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        assert getattr(mdm, name) == getattr(ar, name)


@pytest.mark.parametrize("kind", ["mdm", "ar"])
def test_trainer_reaches_entropy_of_iid_language_and_resumes(kind, tmp_path):
    """Uniform i.i.d. tokens over 4 symbols: entropy log 4 per token; the MDM's ELBO is exact for it."""
    g = torch.Generator().manual_seed(0)
    data = Dataset.from_dict({"input_ids": torch.randint(0, 4, (2048, 8), generator=g).tolist()})
    held_out = Dataset.from_dict({"input_ids": torch.randint(0, 4, (4096, 8), generator=g).tolist()})
    args = TrainingArguments(
        output_dir=str(tmp_path / kind),
        per_device_train_batch_size=64,
        per_device_eval_batch_size=512,
        max_steps=60,
        learning_rate=3e-3,
        save_steps=30,
        eval_strategy="no",
        report_to=[],
        logging_steps=30,
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
    )
    trainer = build_trainer(kind, data, held_out, vocab_size=4, length=8, args=args, entropy_per_token=math.log(4))
    train(trainer)
    metrics = trainer.evaluate()
    assert abs(metrics["eval_nll_gap"]) < 0.05, metrics
    assert metrics["eval_entropy_per_token"] == pytest.approx(math.log(4))
    args.max_steps = 70  # resume: continues from checkpoint-60 rather than starting over
    resumed = build_trainer(kind, data, held_out, vocab_size=4, length=8, args=args)
    state = train(resumed)
    assert resumed.state.global_step == 70 and state.global_step == 70
