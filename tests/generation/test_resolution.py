"""Where a sampling setting comes from, in every entry point: call kwargs > the given generation config > the
model's generation config > the model config (trained schedule, ids, logits shift) > defaults."""

import json
import shutil

import pytest
import torch
from lm_eval.api.instance import Instance
from transformers import AutoModelForMaskedLM

from hf_mdm import MDMConfig, MDMForMaskedDiffusion, cli
from hf_mdm.generation import MaskedDiffusionGenerationConfig, diffusion_generate, resolve_config
from hf_mdm.harness import MaskedDiffusionLM
from hf_mdm.harness.tiny import build_tiny_models

PROMPT = torch.tensor([[1, 2, 3]])


def tiny_mdm(schedule: str, seed: int = 0) -> MDMForMaskedDiffusion:
    torch.manual_seed(seed)
    config = MDMConfig(
        vocab_size=33,
        mask_token_id=32,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        initializer_range=0.3,
        schedule=schedule,
    )
    return MDMForMaskedDiffusion(config).eval()


@pytest.fixture(scope="module")
def cosine_checkpoint(tmp_path_factory):
    """A saved MDM trained (configured) with the cosine schedule, without a generation_config.json of its own."""
    path = tmp_path_factory.mktemp("cosine")
    tiny_mdm("cosine").save_pretrained(path)
    (path / "generation_config.json").unlink()
    return path


def test_generate_samples_with_the_trained_schedule(cosine_checkpoint):
    model = AutoModelForMaskedLM.from_pretrained(cosine_checkpoint).eval()
    unqualified = model.generate(PROMPT, max_new_tokens=16, steps=6)
    assert torch.equal(unqualified, model.generate(PROMPT, max_new_tokens=16, steps=6, schedule="cosine"))
    assert not torch.equal(unqualified, model.generate(PROMPT, max_new_tokens=16, steps=6, schedule="linear"))
    assert torch.equal(unqualified, diffusion_generate(model, PROMPT, max_new_tokens=16, steps=6))


def test_one_precedence_order():
    model = tiny_mdm("cosine")
    resolve = lambda given=None, **kwargs: resolve_config(model, given, kwargs)  # noqa: E731
    assert (resolve().schedule, resolve().transfer, resolve().logits_shift) == ("cosine", "deterministic", 0)
    model.generation_config = MaskedDiffusionGenerationConfig(schedule="polynomial", steps=5, max_new_tokens=7)
    assert (resolve().schedule, resolve().steps, resolve().max_new_tokens) == ("polynomial", 5, 7)
    given = MaskedDiffusionGenerationConfig(schedule="loglinear")  # its unset fields come from the model's config
    assert (resolve(given).schedule, resolve(given).steps) == ("loglinear", 5)
    assert (resolve(given, schedule="linear", steps=None).schedule, resolve(given, steps=None).steps) == ("linear", 5)
    shifted = MDMForMaskedDiffusion(
        MDMConfig(
            vocab_size=9, mask_token_id=8, hidden_size=16, num_attention_heads=2, intermediate_size=16, logits_shift=1
        )
    )
    assert (resolve_config(shifted, None, {}).logits_shift, resolve_config(shifted, None, {}).mask_token_id) == (1, 8)
    # a config serialises only what it sets, so a saved generation config does not pin the defaults
    assert given.to_diff_dict()["schedule"] == "loglinear" and "transfer" not in given.to_diff_dict()


def test_a_saved_generation_config_keeps_unset_fields_unset(tmp_path):
    model = tiny_mdm("cosine")
    model.generation_config = MaskedDiffusionGenerationConfig(steps=5, max_new_tokens=6)
    model.save_pretrained(tmp_path)
    assert "schedule" not in json.loads((tmp_path / "generation_config.json").read_text())
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    out = loaded.generate(PROMPT)
    assert out.shape == (1, 9) and torch.equal(
        out, model.generate(PROMPT, steps=5, max_new_tokens=6, schedule="cosine")
    )
    assert not torch.equal(out, model.generate(PROMPT, schedule="linear"))


def test_reference_configs_take_only_the_models_ids_from_below():
    """A llada/dream config is complete: the model's generation config (here hf_mdm's sampler settings) does not
    leak into it; the result is the same as with no generation config at all."""
    model = tiny_mdm("cosine")
    preset = MaskedDiffusionGenerationConfig.llada(8, 4, 4)
    plain = model.generate(PROMPT, generation_config=preset)
    model.generation_config = MaskedDiffusionGenerationConfig(transfer="stochastic", strategy="random", steps=3)
    assert torch.equal(model.generate(PROMPT, generation_config=preset), plain)
    assert resolve_config(model, preset, {}).schedule == "linear"  # the reference's, not the model's cosine


def test_generate_without_a_length_says_what_is_missing(cosine_checkpoint):
    model = AutoModelForMaskedLM.from_pretrained(cosine_checkpoint)
    with pytest.raises(ValueError, match="nothing to generate.*pass max_new_tokens"):
        model.generate(PROMPT)
    assert model.generate(torch.tensor([[1, 32, 3]]))[0, 1] != 32  # infilling needs no length
    model.generation_config.max_new_tokens = 4  # or the model's generation config gives it
    assert model.generate(PROMPT).shape == (1, 7)


def test_hf_mdm_sample_uses_the_trained_schedule(cosine_checkpoint, tmp_path):
    def sample(*flags):
        out = tmp_path / "samples.json"
        args = ["sample", "--model", str(cosine_checkpoint), "--num", "4", "--length", "12", "--steps", "4", *flags]
        assert cli.main([*args, "--output", str(out)]) == 0
        return json.loads(out.read_text())

    unqualified, cosine = sample(), sample("--schedule", "cosine")
    assert unqualified["samples"] == cosine["samples"] and unqualified["sampler"]["schedule"] == "cosine"
    assert unqualified["sampler"]["transfer"] == "stochastic"  # the paper's sampler below the model's settings
    model = AutoModelForMaskedLM.from_pretrained(cosine_checkpoint)
    expected = diffusion_generate(
        model,
        torch.zeros(4, 0, dtype=torch.long),
        max_new_tokens=12,
        steps=4,
        seed=0,
        schedule="cosine",
        transfer="stochastic",
        strategy="random",
        temperature=1.0,
        stop_at_eos=False,
    )
    assert unqualified["samples"] == expected.tolist()
    assert (
        cli.main(
            [
                "sample",
                "--model",
                str(cosine_checkpoint),
                "--length",
                "4",
                "--schedule",
                "linear",
                "--output",
                str(tmp_path / "x.json"),
            ]
        )
        == 2
    )


def test_lm_eval_model_uses_the_trained_schedule(tmp_path):
    tiny = build_tiny_models(tmp_path / "tiny")
    path = tmp_path / "cosine"
    shutil.copytree(tiny["mdm"], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "schedule": "cosine"}))
    prompts = ["Question: what is 2 + 3?\nAnswer:", "Tell me a story about a cat named"]

    def texts(**model_args):
        model = MaskedDiffusionLM(pretrained=str(path), device="cpu", steps=6, **model_args)
        requests = [
            Instance("generate_until", {}, (p, {"until": [], "max_gen_toks": 24}), i, ("demo", i, 1))
            for i, p in enumerate(prompts)
        ]
        return model.generation_config.schedule, model.generate_until(requests)

    schedule, unqualified = texts()
    assert schedule == "cosine" and unqualified == texts(schedule="cosine")[1]
    assert unqualified != texts(schedule="linear")[1]
