"""``hf-mdm export --target sglang``: a tiny LLaDA2.x exported as SGLang 0.5 loads it, checked against the facts read
from SGLang's published source (``tests/fixtures/sglang/sglang_0.5.23_facts.json``: the weight names its
``LLaDA2MoeModelLM.load_weights`` maps, the config keys its model reads, the architecture table, block size and [MASK]
id of its diffusion mode, its algorithms and server flags), and loaded back by transformers (the configuration as
remote code, without hf_mdm) and by hf_mdm's class (the same logits, bitwise, float32)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from hf_mdm.cli import main
from hf_mdm.harness.tiny import build_tokenizer
from hf_mdm.models import LLaDA2MoeConfig, LLaDA2MoeModelLM, LLaDA21MoeConfig, LLaDA21MoeModelLM

FIXTURES = Path(__file__).parents[1] / "fixtures"
FACTS = json.loads((FIXTURES / "sglang" / "sglang_0.5.23_facts.json").read_text())
LLADA2 = FACTS["llada2"]
SERVED = FACTS["dllm"]["architectures"]["LLaDA2MoeModelLM"]
MASK_ID = SERVED["mask_id"]
# Tiny sizes, with the published vocabulary: SGLang's [MASK] id (156895) must be a token of the model.
TINY = dict(
    vocab_size=157184,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    num_experts=4,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    moe_intermediate_size=8,
    num_shared_experts=1,
    first_k_dense_replace=1,
    pad_token_id=0,
    eos_token_id=156892,
    mask_token_id=MASK_ID,
    use_qkv_bias=True,
    embedding_dropout=0.0,
    attention_dropout=0.0,
    output_dropout=0.0,
)
CANVAS = torch.tensor([[5, 17, 99, MASK_ID, MASK_ID, 3, MASK_ID, 156892, 40, MASK_ID]])
SHARD = "4MB"  # the embedding and the head (10 MB each) land in shards of their own: a sharded export
GENERATION = {"threshold": 0.8, "steps": 16, "transfer": "llada2"}


def tiny_llada2(model_class=LLaDA2MoeModelLM, config_class=LLaDA2MoeConfig, seed=0, **overrides):
    torch.manual_seed(seed)
    model = model_class(config_class(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.normal_(0.0, 0.3)
    return model


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(CANVAS).logits


def save_source(model, folder: Path) -> Path:
    """The checkpoint as hf_mdm saves it (``save_pretrained``), with a tokenizer and a generation config."""
    model.save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps(GENERATION))
    return folder


def export(capsys, *args) -> tuple[int, str, str]:
    rc = main(["export", *map(str, args)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    model = tiny_llada2()
    return save_source(model, tmp_path_factory.mktemp("source")), logits(model)


@pytest.fixture(scope="module")
def exported(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports") / "llada2"
    rc = main(
        ["export", "--model", str(source[0]), "--output-dir", str(out), "--target", "sglang"]
        + ["--max-shard-size", SHARD]
    )
    assert rc == 0
    return out


# ---------------------------------------------------------------------------------------------------------------------
# SGLang's weight names, from the fixture


CONDITIONS = {
    "qkv_bias": lambda c, i: c["use_bias"] or c["use_qkv_bias"],
    "qk_norm": lambda c, i: c.get("use_qk_norm", True),
    "use_bias": lambda c, i: c["use_bias"],
    "dense_layer": lambda c, i: c["num_experts"] is None or i < c["first_k_dense_replace"],
    "sparse_layer": lambda c, i: c["num_experts"] is not None and i >= c["first_k_dense_replace"],
    "expert_bias": lambda c, i: c.get("moe_router_enable_expert_bias", False),
    "shared_experts": lambda c, i: c["num_shared_experts"] is not None,
    "untied_head": lambda c, i: not c["tie_word_embeddings"],
}


def sglang_weights(config: dict) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor SGLang's LLaDA2MoeModelLM loads for a ``config.json``, from the fixture."""
    names = dict(config)
    width = config.get("moe_shared_expert_intermediate_size", config["moe_intermediate_size"])
    names["shared_intermediate_size"] = width * (config["num_shared_experts"] or 0)
    expected = {}
    for entry in LLADA2["weights"]:
        shape = tuple(eval(expr, {"__builtins__": {}}, names) for expr in entry["shape"])
        layers = range(config["num_hidden_layers"]) if "{i}" in entry["name"] else [None]
        for i in layers:
            if not all(CONDITIONS[c](config, i) for c in entry["when"]):
                continue
            experts = range(config["num_experts"]) if "{e}" in entry["name"] else [None]
            for e in experts:
                expected[entry["name"].format(i=i, e=e)] = shape
    return expected


def accepted(name: str) -> bool:
    """Whether ``name`` matches one of the fixture's weight-name patterns (layers and experts by number)."""
    for entry in LLADA2["weights"]:
        pattern = re.escape(entry["name"]).replace(r"\{i\}", r"\d+").replace(r"\{e\}", r"\d+")
        if re.fullmatch(pattern, name):
            return True
    return False


def exported_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shapes = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / shard), "pt") as handle:
            for name in handle.keys():
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def exported_tensor(folder: Path, name: str) -> torch.Tensor:
    shard = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][name]
    with safe_open(str(folder / shard), "pt") as handle:
        return handle.get_tensor(name)


def test_the_fixture_names_its_source():
    assert FACTS["sglang_version"] == "0.5.23"
    assert {"sglang/srt/models/llada2.py", "sglang/srt/dllm/config.py"} <= set(FACTS["files_sha256"])
    assert set(CONDITIONS) | {"shared_intermediate_size"} == set(LLADA2["conditions"])


def test_weight_names_and_shapes_are_exactly_what_sglang_loads(exported):
    config = json.loads((exported / "config.json").read_text())
    shapes = exported_shapes(exported)
    expected = sglang_weights(config)
    assert set(shapes) == set(expected), (sorted(set(shapes) - set(expected)), sorted(set(expected) - set(shapes)))
    assert shapes == expected
    assert all(accepted(name) for name in shapes)
    assert not any("v_head" in name or "inv_freq" in name for name in shapes)
    # the routed experts one tensor per expert and projection, as SGLang's expert mapping reads them
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in shapes
    assert not any(name.endswith("gate_up_proj") for name in shapes)


def test_the_index_matches_the_shards(exported):
    index = json.loads((exported / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((exported / shard).is_file() for shard in shards)
    assert sorted(p.name for p in exported.glob("*.safetensors")) == shards
    seen, size = {}, 0
    for shard in shards:
        with safe_open(str(exported / shard), "pt") as handle:
            for name in handle.keys():
                assert name not in seen, f"{name} in {seen.get(name)} and {shard}"
                seen[name] = shard
                size += handle.get_tensor(name).nbytes
    assert seen == index["weight_map"]
    assert index["metadata"]["total_size"] == size


def test_config_json_is_what_sglang_reads(exported):
    config = json.loads((exported / "config.json").read_text())
    assert (
        config["architectures"][0] == "LLaDA2MoeModelLM"
        and config["architectures"][0] in FACTS["dllm"]["architectures"]
    )
    assert config["architectures"][0] == LLADA2["entry_class"]
    assert config["model_type"] == "llada2_moe"
    assert config["auto_map"] == {"AutoConfig": "configuration_llada2.LLaDA2MoeConfig"}
    assert (exported / "configuration_llada2.py").is_file()
    assert [key for key in LLADA2["config_read_as_attribute"] if key not in config] == []
    assert (config["mask_token_id"], config["block_size"]) == (SERVED["mask_id"], SERVED["block_size"])
    # set to what hf_mdm's forward computes: sigmoid router with its expert bias, float32 scores, renormalised weights
    assert config["moe_router_enable_expert_bias"] is True and config["score_function"] == "sigmoid"
    assert config["router_dtype"] == "fp32" and config["norm_topk_prob"] is True
    assert config["norm_head"] is False and "expert_capacity" not in config
    assert config["moe_shared_expert_intermediate_size"] == config["moe_intermediate_size"]


def test_the_config_loads_as_remote_code_without_hf_mdm(exported, tmp_path):
    """What SGLang does: transformers' AutoConfig with trust_remote_code, here in a process without hf_mdm."""
    keys = LLADA2["config_read_as_attribute"] + ["use_qk_norm", "partial_rotary_factor", "rope_theta", "block_size"]
    script = (
        "import json, sys\n"
        "from transformers import AutoConfig\n"
        f"config = AutoConfig.from_pretrained({str(exported)!r}, trust_remote_code=True)\n"
        "assert 'hf_mdm' not in sys.modules\n"
        f"keys = {keys!r}\n"
        "print(json.dumps({'module': type(config).__module__, 'missing': [k for k in keys if not hasattr(config, k)],"
        " 'architectures': config.architectures, 'model_type': config.model_type, 'mask': config.mask_token_id}))\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), PYTHONPATH="")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["module"].startswith("transformers_modules.") and result["missing"] == []
    assert (result["architectures"], result["model_type"], result["mask"]) == (
        ["LLaDA2MoeModelLM"],
        "llada2_moe",
        MASK_ID,
    )


def test_the_export_gives_the_same_logits_in_hf_mdm(source, exported):
    from transformers import AutoConfig

    assert type(AutoConfig.from_pretrained(exported, trust_remote_code=True)) is LLaDA2MoeConfig  # hf_mdm's own
    model = LLaDA2MoeModelLM.from_pretrained(exported).eval()
    assert model.dtype == torch.float32
    assert torch.equal(logits(model), source[1])


def test_tokenizer_generation_config_and_launch_line(source, exported, capsys, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (exported / name).read_bytes() == (source[0] / name).read_bytes(), name
    settings = yaml.safe_load((exported / "dllm_algorithm.yaml").read_text())
    assert settings == {"block_size": 32, "threshold": GENERATION["threshold"]}
    assert set(settings) - {"block_size"} <= set(FACTS["algorithms"]["LowConfidence"])
    rc, out, err = export(capsys, "--model", source[0], "--output-dir", tmp_path / "out", "--target", "sglang")
    assert rc == 0 and "warning" not in err
    line = next(line.strip() for line in out.splitlines() if "sglang.launch_server" in line)
    argv = line.split()
    assert argv[:3] == ["python", "-m", FACTS["server_flags"]["module"]]
    assert {a for a in argv if a.startswith("--")} <= set(FACTS["server_flags"]["flags"])
    assert argv[argv.index("--model-path") + 1] == str(tmp_path / "out") and "--trust-remote-code" in argv
    assert argv[argv.index("--dllm-algorithm") + 1] in FACTS["algorithms"]
    assert argv[argv.index("--dllm-algorithm-config") + 1] == str(tmp_path / "out" / "dllm_algorithm.yaml")
    record = json.loads((tmp_path / "out" / "export.json").read_text())
    assert record["launch"] == argv and record["target"] == "sglang"
    assert record["engine_version"] == FACTS["sglang_version"]
    assert record["source"] == {
        "checkpoint": str(source[0]),
        "base_model": str(source[0]),
        "model_type": "llada2_moe",
        "lora_adapter": None,
        "lora_merged": False,
    }
    readme = (tmp_path / "out" / "README.md").read_text()
    assert line in readme and f"sglang {FACTS['sglang_version']}" in readme and "as saved" in readme


# ---------------------------------------------------------------------------------------------------------------------
# LoRA adapters, LLaDA2.1 and the configurations SGLang takes differently


def test_a_lora_adapter_is_merged_into_its_base(source, exported, tmp_path, capsys):
    from peft import PeftModel

    from hf_mdm.finetune import apply_lora

    base = LLaDA2MoeModelLM.from_pretrained(source[0]).eval()
    peft_model = apply_lora(base, r=2, alpha=4, dropout=0.0)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.3)
    peft_model.save_pretrained(tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        source[0]
    )
    with torch.no_grad():
        adapted = peft_model.eval()(CANVAS).logits
    fresh = PeftModel.from_pretrained(LLaDA2MoeModelLM.from_pretrained(source[0]), tmp_path / "adapter")
    merged = logits(fresh.merge_and_unload().eval())
    rc, out, err = export(
        capsys, "--model", tmp_path / "adapter", "--output-dir", tmp_path / "out", "--target", "sglang"
    )
    assert rc == 0 and "LoRA adapter merged" in out, err
    back = LLaDA2MoeModelLM.from_pretrained(tmp_path / "out").eval()
    assert torch.equal(logits(back), merged)
    torch.testing.assert_close(merged, adapted, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(merged, source[1], atol=1e-3)  # the adapter changed the model
    assert set(exported_shapes(tmp_path / "out")) == set(exported_shapes(exported))
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (source[0] / "tokenizer.json").read_bytes()
    record = json.loads((tmp_path / "out" / "export.json").read_text())["source"]
    assert record["lora_merged"] and record["lora_adapter"] == str(tmp_path / "adapter")
    assert record["base_model"] == str(source[0]) and "LoRA adapter" in (tmp_path / "out" / "README.md").read_text()


def test_llada21_with_the_settings_sglang_reads_differently(tmp_path, capsys):
    """LLaDA2.1 (JointThreshold), blocks of 64, a bias on the output projection only, one expert per token, no
    shared expert, and two keys hf_mdm's forward ignores but SGLang's would not: the export keeps hf_mdm's numbers
    under SGLang's reading of the config."""
    overrides = dict(use_bias=True, use_qkv_bias=False, num_experts_per_tok=1, num_shared_experts=0, block_size=64)
    overrides.update(norm_head=True, expert_capacity=4)
    model = tiny_llada2(LLaDA21MoeModelLM, LLaDA21MoeConfig, seed=1, **overrides)
    expected = logits(model)
    model.save_pretrained(tmp_path / "src")
    rc, out, err = export(capsys, "--model", tmp_path / "src", "--output-dir", tmp_path / "out", "--target", "sglang")
    assert rc == 0
    assert "warning: block_size is 64" in err and "--dllm-algorithm-config" in err
    assert "warning: norm_head=True is dropped" in err and "warning: expert_capacity=4 is dropped" in err
    folder = tmp_path / "out"
    config = json.loads((folder / "config.json").read_text())
    assert (config["architectures"], config["model_type"]) == (["LLaDA2MoeModelLM"], "llada21_moe")
    assert config["auto_map"] == {"AutoConfig": "configuration_llada2.LLaDA21MoeConfig"}
    assert config["use_qkv_bias"] is True and config["num_shared_experts"] is None and config["norm_topk_prob"] is False
    assert config["norm_head"] is False and "expert_capacity" not in config
    shapes = exported_shapes(folder)
    assert shapes == sglang_weights(config)
    assert not any(exported_tensor(folder, f"model.layers.{i}.attention.query_key_value.bias").any() for i in range(3))
    settings = yaml.safe_load((folder / "dllm_algorithm.yaml").read_text())
    assert settings == {"block_size": 64, "threshold": 0.95, "edit_threshold": 0.9, "max_post_edit_steps": 16}
    assert set(settings) - {"block_size"} <= set(FACTS["algorithms"]["JointThreshold"])
    assert "--dllm-algorithm JointThreshold" in out
    back = LLaDA21MoeModelLM.from_pretrained(folder).eval()
    assert torch.equal(logits(back), expected)


# ---------------------------------------------------------------------------------------------------------------------
# DiffusionGemma: transformers' own format


def tiny_diffusion_gemma():
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    from hf_mdm.harness.tiny import TINY_CANVAS, TINY_DIFFUSION_GEMMA_TEXT, TINY_VISION

    torch.manual_seed(0)
    config = DiffusionGemmaConfig(
        text_config={"vocab_size": 300, **TINY_DIFFUSION_GEMMA_TEXT},
        vision_config=TINY_VISION,
        canvas_length=TINY_CANVAS,
    )
    return DiffusionGemmaForBlockDiffusion(config).eval()


@pytest.mark.parametrize("target", ["sglang", "vllm"])
def test_diffusion_gemma_is_saved_in_transformers_format(target, tmp_path, capsys):
    from transformers import DiffusionGemmaForBlockDiffusion

    model = tiny_diffusion_gemma()
    model.save_pretrained(tmp_path / "src")
    rc, out, err = export(capsys, "--model", tmp_path / "src", "--output-dir", tmp_path / "out", "--target", target)
    assert rc == 0, err
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"][0] == "DiffusionGemmaForBlockDiffusion" in FACTS["dllm"]["architectures"]
    assert "auto_map" not in config
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert all((tmp_path / "out" / shard).is_file() for shard in set(index["weight_map"].values()))
    back = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "out")
    state, loaded = model.state_dict(), back.state_dict()
    assert state.keys() == loaded.keys() and all(torch.equal(state[k], loaded[k]) for k in state)
    if target == "sglang":
        assert (
            f"--dllm-algorithm {FACTS['dllm']['architectures']['DiffusionGemmaForBlockDiffusion']['algorithm']}" in out
        )
    else:
        assert f"vllm serve {tmp_path / 'out'}" in out
    record = json.loads((tmp_path / "out" / "export.json").read_text())
    assert record["target"] == target and str(tmp_path / "out") in record["launch"]
    assert record["engine_version"] == {"sglang": FACTS["sglang_version"], "vllm": "0.33.0"}[target]


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: one line, exit code 2, nothing written


def _write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _bad_inputs(root: Path, source: Path) -> list[tuple[list, str]]:
    llada = json.loads((FIXTURES / "llada_8b_base_config.json").read_text())
    dream = json.loads((FIXTURES / "dream_v0_base_7b_config.json").read_text())
    adapter = root / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(root / "gone")}))
    (root / "empty").mkdir()
    out = ["--output-dir", root / "out"]
    return [
        (["--model", root / "missing", *out, "--target", "sglang"], "no such file or directory"),
        (["--model", root / "empty", *out, "--target", "sglang"], "not a checkpoint"),
        (["--model", adapter, *out, "--target", "sglang"], "base model .*gone is not a local checkpoint folder"),
        (["--model", source, *out, "--target", "triton"], "unknown target"),
        (["--model", source, *out, "--target", "sglang", "--max-shard-size", "5GG"], "not a size"),
        (["--model", source, *out, "--target", "vllm"], "--target sglang"),
        (["--model", _write_config(root / "llada", llada), *out, "--target", "sglang"], "LLaDA 1 .*hf-mdm serve"),
        (["--model", _write_config(root / "dream", dream), *out, "--target", "sglang"], "Dream .*hf-mdm serve"),
        (["--model", _write_config(root / "mdm", {"model_type": "hf_mdm"}), *out, "--target", "sglang"], "MDM"),
        (["--model", source, "--output-dir", source, "--target", "sglang", "--overwrite"], "holds the checkpoint"),
        (
            ["--model", source, "--output-dir", source.parent, "--target", "sglang", "--overwrite"],
            "holds the checkpoint",
        ),
    ]


def test_bad_input_is_one_line_and_exit_code_2(source, tmp_path, capsys):
    for args, message in _bad_inputs(tmp_path, source[0]):
        rc, out, err = export(capsys, *args)
        assert rc == 2, (args, out, err)
        assert len(err.strip().splitlines()) == 1 and err.startswith("hf-mdm: error: "), err
        assert re.search(message, err), (message, err)
        assert "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(vocab_size=64, mask_token_id=63, eos_token_id=62), "mask_token_id is 63.*fixed id 156895"),
        (dict(block_size=None), "block_size is None .*set block_size in config.json"),
        (dict(hidden_act="gelu"), "hidden_act is 'gelu'"),
    ],
)
def test_what_sglang_cannot_serve_is_refused(overrides, message, tmp_path, capsys):
    tiny_llada2(**overrides).save_pretrained(tmp_path / "src")
    capsys.readouterr()
    rc, out, err = export(capsys, "--model", tmp_path / "src", "--output-dir", tmp_path / "out", "--target", "sglang")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_an_existing_output_needs_overwrite(source, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    rc, _, err = export(capsys, "--model", source[0], "--output-dir", out, "--target", "sglang")
    assert rc == 2 and "--overwrite" in err and (out / "keep.txt").is_file()
    rc, _, err = export(capsys, "--model", source[0], "--output-dir", out, "--target", "sglang", "--overwrite")
    assert rc == 0 and not (out / "keep.txt").exists() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left beside it
