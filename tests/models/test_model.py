"""MDMConfig / MDMForMaskedDiffusion: round trips, Auto classes, remote code, logits_to_keep, ELBO loss."""

import json
import math
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from remote_code import EXPORT_ALLOWED_IMPORTS, exported_files  # noqa: E402
from transformers import AutoConfig, AutoModelForMaskedLM, GenerationConfig

from hf_mdm import MDMConfig, MDMForMaskedDiffusion
from hf_mdm.generation import MaskedDiffusionGenerationConfig
from hf_mdm.schedules import get_schedule


def tiny_config(**kw):
    base = dict(
        vocab_size=23,
        mask_token_id=22,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
    )
    base.update(kw)
    return MDMConfig(**base)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return MDMForMaskedDiffusion(tiny_config()).eval()


def test_config_requires_mask_token_and_checks_shapes():
    with pytest.raises(ValueError, match="mask_token_id"):
        MDMConfig(vocab_size=10)
    with pytest.raises(ValueError, match="mask_token_id"):
        MDMConfig(vocab_size=10, mask_token_id=10)
    with pytest.raises(ValueError, match="num_attention_heads"):
        MDMConfig(vocab_size=10, mask_token_id=9, hidden_size=30, num_attention_heads=4)


def test_attention_is_bidirectional(model):
    x = torch.randint(0, 20, (1, 10))
    y = x.clone()
    y[0, -1] = (y[0, -1] + 1) % 20  # changing the last token must change the first position's logits
    assert not torch.allclose(model(x).logits[0, 0], model(y).logits[0, 0])


def test_padding_left_right_equal_unpadded(model):
    x = torch.randint(0, 20, (1, 7))
    ref = model(x).logits[0]
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
    out = model(left, attention_mask=torch.tensor([[0, 0, 0] + [1] * 7])).logits[0, 3:]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    right = torch.cat([x, torch.zeros(1, 3, dtype=torch.long)], 1)
    out = model(right, attention_mask=torch.tensor([[1] * 7 + [0, 0, 0]])).logits[0, :7]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_logits_to_keep_int_and_index(model):
    x = torch.randint(0, 20, (2, 12))
    full = model(x).logits
    torch.testing.assert_close(model(x, logits_to_keep=3).logits, full[:, -3:])
    idx = torch.tensor([0, 5, 7])
    torch.testing.assert_close(model(x, logits_to_keep=idx).logits, full[:, idx])
    per_row = torch.tensor([[1, 4], [11, 0]])  # (B, K) positions per row
    expected = torch.stack([full[0, [1, 4]], full[1, [11, 0]]])
    torch.testing.assert_close(model(x, logits_to_keep=per_row).logits, expected)


def test_too_long_and_bad_mask_are_value_errors(model):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.zeros(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4))


@pytest.mark.parametrize("schedule", ["linear", {"name": "polynomial", "power": 2.0}])
def test_elbo_loss_matches_hand_computation(schedule):
    torch.manual_seed(1)
    model = MDMForMaskedDiffusion(tiny_config(schedule=schedule)).eval()
    x0 = torch.randint(0, 20, (3, 9))
    t = torch.tensor([0.2, 0.5, 0.9])
    masked = torch.rand(3, 9) < t[:, None]
    masked[:, 0] = True
    xt = x0.masked_fill(masked, 22)
    labels = x0.masked_fill(~masked, -100)
    out = model(xt, labels=labels, t=t)
    logp = torch.log_softmax(out.logits, -1)
    alpha = get_schedule(schedule)
    total = 0.0
    for b in range(3):
        tb = float(t[b])
        h = 1e-6  # numeric derivative of alpha: the weight is -alpha'(t) / (1 - alpha(t))
        weight = -(alpha.alpha(tb + h) - alpha.alpha(tb - h)) / (2 * h) / (1 - alpha.alpha(tb))
        for i in range(9):
            if masked[b, i]:
                total += weight * -float(logp[b, i, x0[b, i]].detach())
    assert math.isclose(float(out.loss), total / 27, rel_tol=1e-4)
    with pytest.raises(ValueError, match="t must"):
        model(xt, labels=labels, t=torch.tensor([0.0, 0.5, 0.9]))


def test_elbo_loss_logits_shift():
    torch.manual_seed(2)
    model = MDMForMaskedDiffusion(tiny_config(logits_shift=1)).eval()
    x0 = torch.randint(0, 20, (1, 6))
    labels = torch.full_like(x0, -100)
    labels[0, 3] = x0[0, 3]
    xt = x0.clone()
    xt[0, 3] = 22
    out = model(xt, labels=labels, t=torch.tensor([0.5]))
    expected = 2.0 * F.cross_entropy(out.logits[0, 2:3], x0[0, 3:4]) / 6  # weight 1/t = 2, position 3 from hidden 2
    assert math.isclose(float(out.loss), float(expected), rel_tol=1e-5)


def test_save_load_round_trip_weights_and_generation_config(model, tmp_path):
    model.generation_config = MaskedDiffusionGenerationConfig(
        steps=7, block_length=4, transfer="deterministic", strategy="margin", schedule="cosine", max_new_tokens=8
    )
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert saved["steps"] == 7 and saved["strategy"] == "margin" and "_from_model_config" not in saved
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert type(loaded) is MDMForMaskedDiffusion
    for name, p in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], p, atol=0, rtol=0)
    gen = MaskedDiffusionGenerationConfig.from_any(loaded.generation_config)
    assert (gen.steps, gen.block_length, gen.transfer, gen.strategy, gen.schedule) == (
        7,
        4,
        "deterministic",
        "margin",
        "cosine",
    )
    x = torch.tensor([[1, 2]])
    out = loaded.generate(x, return_dict_in_generate=True)  # the saved defaults drive generate
    expected = model.generate(x, return_dict_in_generate=True)
    assert out.sequences.shape == (1, 10) and torch.equal(out.sequences, expected.sequences)
    # cosine, deterministic, blocks of 4 with 4 + 3 steps: counts [2, 2, 0, 0] and [3, 1, 0]; empty steps are skipped
    assert out.steps == expected.steps == 4


def test_plain_generation_config_keeps_custom_keys(tmp_path):
    plain = GenerationConfig.from_dict({"steps": 3, "transfer": "threshold", "threshold": 0.8, "max_new_tokens": 5})
    converted = MaskedDiffusionGenerationConfig.from_any(plain)
    assert (converted.steps, converted.transfer, converted.threshold, converted.max_new_tokens) == (
        3,
        "threshold",
        0.8,
        5,
    )
    auto = GenerationConfig.from_model_config(tiny_config())  # auto-created: diffusion keys absent -> defaults
    converted = MaskedDiffusionGenerationConfig.from_any(auto)
    assert converted.transfer == "deterministic" and converted.steps is None


def test_auto_model_loads_the_bare_transformer_of_a_saved_mdm_quietly(model, tmp_path, capfd, caplog):
    from transformers import AutoModel

    model.save_pretrained(tmp_path)
    capfd.readouterr()
    caplog.clear()
    bare = AutoModel.from_pretrained(tmp_path)
    said = capfd.readouterr().err + caplog.text  # transformers' load report goes through logging
    assert type(bare).__name__ == "MDMModel" and "UNEXPECTED" not in said and "lm_head" not in said
    torch.testing.assert_close(bare.embed_tokens.weight, model.model.embed_tokens.weight)


def test_auto_classes(tmp_path):
    config = AutoConfig.for_model("hf_mdm", vocab_size=11, mask_token_id=10, hidden_size=16, num_attention_heads=2)
    assert isinstance(config, MDMConfig)
    model = AutoModelForMaskedLM.from_config(config)
    assert isinstance(model, MDMForMaskedDiffusion)


def test_exported_modules_import_only_torch_transformers_and_siblings():
    files = exported_files("modeling_mdm.py", "configuration_mdm.py")
    assert {"generation.py", "generation_sampler.py", "schedules.py", "timer.py"} <= set(files)
    stdlib = set(sys.stdlib_module_names)
    for name, imports in files.items():
        assert imports - stdlib <= EXPORT_ALLOWED_IMPORTS, (name, imports - stdlib)


@pytest.mark.parametrize("block_size", [None, 3], ids=["bidirectional", "block-causal"])
def test_remote_code_export_loads_without_hf_mdm(block_size, tmp_path):
    torch.manual_seed(0)
    model = MDMForMaskedDiffusion(tiny_config(block_size=block_size)).eval()
    model.generation_config = MaskedDiffusionGenerationConfig(steps=4, max_new_tokens=6)
    model.save_pretrained(tmp_path)
    for name in exported_files("modeling_mdm.py", "configuration_mdm.py"):
        assert (tmp_path / name).exists(), name
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForMaskedLM"] == "modeling_mdm.MDMForMaskedDiffusion"
    x = torch.tensor([[1, 2, 3, 4]])
    expected_logits = model(x).logits
    expected_gen = model.generate(x)
    cached_gen = model.generate(x, kv_cache="prefix")  # the keys/values cache through the exported code
    assert not torch.equal(cached_gen, x)
    torch.save({"x": x, "logits": expected_logits, "gen": expected_gen, "cached": cached_gen}, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["hf_mdm"] = None  # make any import of the package fail
        import torch
        from transformers import AutoModelForMaskedLM
        model = AutoModelForMaskedLM.from_pretrained({str(tmp_path)!r}, trust_remote_code=True).eval()
        assert "hf_mdm" not in type(model).__module__.split(".")[0], type(model).__module__
        ref = torch.load({str(tmp_path / "expected.pt")!r})
        torch.testing.assert_close(model(ref["x"]).logits, ref["logits"])
        assert torch.equal(model.generate(ref["x"]), ref["gen"])
        assert torch.equal(model.generate(ref["x"], kv_cache="prefix"), ref["cached"])
        print("REMOTE_OK", type(model).__module__)
        """
    )
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "REMOTE_OK transformers_modules" in result.stdout
