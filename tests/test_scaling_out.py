"""Scaling out through accelerate (`hf_mdm.scaling`, ``hf_mdm/configs/accelerate``): every shipped config loads with
accelerate's own loader, names only options ``accelerate launch`` knows and starts several processes; the FSDP and
DeepSpeed plugins accelerate builds from them (DeepSpeed itself needs GPUs and is not run here), the FSDP one
wrapping every hf_mdm class's decoder layers. On 2 CPU processes: ``hf-mdm sft`` under ``multi_cpu.yaml`` and under
``fsdp.yaml`` (which accelerate runs on CPUs as plain data parallelism: that run checks the launch and the training,
not the sharding), and evaluation under ``multi_cpu.yaml``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import pytest
import torch
from finetune_inputs import models_by_class, write_pairs
from launching import launch
from safetensors.torch import load_file

from hf_mdm.scaling import ACCELERATE_CONFIGS, accelerate_config
from hf_mdm.scaling import main as scaling_main

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = os.environ.setdefault("HF_MDM_DATA_DIR", str(REPO.parent / "shared" / "data"))
CONFIGS = {"multi_cpu": "MULTI_GPU", "fsdp": "FSDP", "deepspeed_zero2": "DEEPSPEED", "deepspeed_zero3": "DEEPSPEED"}


def launch_environment(name: str) -> dict[str, str]:
    """The environment ``accelerate launch --config_file NAME.yaml --num_processes 2`` gives its processes, from
    accelerate's own command line (its multi-process launchers stubbed: nothing starts)."""
    from accelerate.commands import launch
    from accelerate.utils import launch as prepare

    captured: dict[str, str] = {}
    stubs = {
        "multi_gpu_launcher": lambda args: captured.update(prepare.prepare_multi_gpu_env(args)),
        "deepspeed_launcher": lambda args: captured.update(prepare.prepare_deepspeed_cmd_env(args)[1]),
    }
    command = ["--config_file", str(accelerate_config(name)), "--num_processes", "2", "train.py"]
    with mock.patch.multiple(launch, **stubs):
        launch.launch_command(launch.launch_command_parser().parse_args(command))
    assert captured, f"{name}.yaml: accelerate launch chose its single-process launcher"
    return captured


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_load_with_accelerates_loader_and_name_known_options(name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    path = accelerate_config(name)
    assert path.read_text().startswith("# ") and "accelerate launch --config_file" in path.read_text()
    config = load_config_from_file(str(path))  # unknown top-level keys raise here
    assert isinstance(config, ClusterConfig) and config.distributed_type.value == CONFIGS[name]
    # the nested sections become `accelerate launch` options, unchecked by the loader: a misspelt key would be ignored
    options = {action.dest for action in launch_command_parser()._actions}
    nested = [key if key.startswith("fsdp") else f"fsdp_{key}" for key in config.fsdp_config]
    nested += list(config.deepspeed_config)
    assert set(nested) <= options, sorted(set(nested) - options)
    assert bool(nested) == (name != "multi_cpu")
    assert launch_environment(name)["ACCELERATE_MIXED_PRECISION"] == "no"  # a multi-process launcher; precision: --bf16


def test_the_helper_finds_every_shipped_config(capsys):
    assert sorted(p.stem for p in ACCELERATE_CONFIGS.glob("*.yaml")) == sorted(CONFIGS)
    assert accelerate_config("fsdp.yaml") == accelerate_config("fsdp") == ACCELERATE_CONFIGS / "fsdp.yaml"
    with pytest.raises(ValueError, match="no shipped accelerate config 'zero3'.*deepspeed_zero3"):
        accelerate_config("zero3")
    assert scaling_main(["multi_cpu"]) == 0 and capsys.readouterr().out.strip() == str(accelerate_config("multi_cpu"))
    assert scaling_main(["nope"]) == 2


def test_the_fsdp_plugin_wraps_every_class_decoder_layers():
    from accelerate.utils import FullyShardedDataParallelPlugin

    with mock.patch.dict(os.environ, launch_environment("fsdp")):
        assert os.environ["ACCELERATE_USE_FSDP"] == "true"
        for name, model in models_by_class().items():
            plugin = FullyShardedDataParallelPlugin()
            assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
            assert "FULL_STATE_DICT" in str(plugin.state_dict_type)
            plugin.set_auto_wrap_policy(model)  # raises when a named class is not in the model
            assert plugin.transformer_cls_names_to_wrap == list(model._no_split_modules), name
            layers = [m for m in model.modules() if type(m).__name__ in model._no_split_modules]
            assert len(layers) == model.config.num_hidden_layers, name
            assert all(plugin.auto_wrap_policy(module=layer, recurse=False, nonwrapped_numel=0) for layer in layers)


@pytest.mark.parametrize("stage", [2, 3])
def test_the_deepspeed_configs_build_accelerates_plugin(stage):
    from accelerate.utils import DeepSpeedPlugin

    with mock.patch.dict(os.environ, launch_environment(f"deepspeed_zero{stage}")):
        config = DeepSpeedPlugin().deepspeed_config
    assert config["zero_optimization"]["stage"] == stage
    # left to hf-mdm sft's own arguments
    assert {config[k] for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")} == {"auto"}
    assert config["gradient_clipping"] == "auto"
    assert config["zero_optimization"].get("stage3_gather_16bit_weights_on_model_save", False) is (stage == 3)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from hf_mdm.harness.tiny import build_tiny_models

    return Path(build_tiny_models(tmp_path_factory.mktemp("tiny"))["mdm"])


@pytest.mark.slow
@pytest.mark.parametrize("config", ["multi_cpu", "fsdp"])
def test_sft_on_two_cpu_processes(config, tiny_checkpoint, tmp_path):
    data, out = write_pairs(tmp_path / "pairs.jsonl"), tmp_path / "run"  # 24 pairs
    result = launch(
        config, "hf_mdm.cli", "sft", "--model", str(tiny_checkpoint), "--data", str(data), "--output-dir", str(out),
        "--batch-size", "4", "--max-length", "48", "--max-steps", "4", "--save-steps", "4", "--logging-steps", "1",
        "--lr", "1e-3", "--threads", "1",
    )  # fmt: skip
    assert result.stdout.count("trained to step 4;") == 2  # both ranks ran to the end
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    # 4 steps of 2 processes x 4 pairs: 32 pairs seen, 4/3 epochs (one process alone would be at 2/3)
    assert state["epoch"] == pytest.approx(4 * 2 * 4 / 24)
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    # rank 0 wrote the model: the same weights at the last checkpoint and in the output folder, trained
    saved, checkpoint = load_file(out / "model.safetensors"), load_file(out / "checkpoint-4" / "model.safetensors")
    initial = load_file(tiny_checkpoint / "model.safetensors")
    assert saved.keys() == checkpoint.keys() == initial.keys()
    assert all(torch.equal(saved[k], checkpoint[k]) for k in saved)
    assert any(not torch.equal(saved[k], initial[k]) for k in saved)
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(out)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[5, 6, 7, model.config.mask_token_id]])).logits
    assert torch.isfinite(logits).all()


@pytest.mark.slow
def test_evaluation_on_two_cpu_processes(tiny_checkpoint, tmp_path):
    launch(
        "multi_cpu", "hf_mdm.harness", "run", "--model", "hf_mdm", "--model_args",
        f"pretrained={tiny_checkpoint},steps=8", "--tasks", "mdm_gsm8k", "--limit", "3", "--batch_size", "2",
        "--output_path", str(tmp_path), "--log_samples",
    )  # fmt: skip
    timing = json.loads(next(tmp_path.rglob("results_*.json")).read_text())["timing"]["all"]
    assert timing["ranks"] == 2 and len(timing["rank_s"]) == 2 and timing["requests"] == 3
    samples = [json.loads(line) for line in next(tmp_path.rglob("samples_mdm_gsm8k_*.jsonl")).read_text().splitlines()]
    logged = sorted((sample["doc_id"], sample["filter"]) for sample in samples)  # each request once, per filter
    assert logged == sorted({*logged}) and {doc for doc, _ in logged} == {0, 1, 2}


@pytest.mark.parametrize(
    "environ, accelerator, refused",
    [
        ({"WORLD_SIZE": "2"}, False, True),  # CPU processes without ACCELERATE_USE_CPU: each would run alone
        ({"WORLD_SIZE": "2", "ACCELERATE_USE_CPU": "1"}, False, False),
        ({"WORLD_SIZE": "2"}, True, False),  # on GPUs accelerate shards them
        ({"WORLD_SIZE": "1"}, False, False),
        ({}, False, False),
    ],
)
def test_cpu_processes_without_accelerate_use_cpu_are_refused(environ, accelerator, refused):
    from hf_mdm.harness.launch import check_launch

    if refused:
        with pytest.raises(ValueError, match="ACCELERATE_USE_CPU=1"):
            check_launch(environ, accelerator)
    else:
        check_launch(environ, accelerator)
