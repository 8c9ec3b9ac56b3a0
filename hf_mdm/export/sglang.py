"""Export for serving engines: a LLaDA2.x checkpoint as SGLang 0.5 loads it, a DiffusionGemma checkpoint in
transformers' own format (which SGLang and vLLM load).

SGLang's diffusion mode (``--dllm-algorithm``) keys on ``config.architectures[0]`` (``sglang/srt/dllm/config.py``):
``LLaDA2MoeModelLM`` is decoded in blocks of 32 with the [MASK] id fixed at 156895, ``DiffusionGemmaForBlockDiffusion``
in canvases of its ``canvas_length`` with its own algorithm, ``Gemma4Renoise``; LLaDA 1, Dream and hf_mdm's MDM are
not served. Its ``LLaDA2MoeModelLM`` (``sglang/srt/models/llada2.py``) reads the published parameter names, which
hf_mdm's ``save_pretrained`` writes (the routed experts split back into ``mlp.experts.{e}.{gate,up,down}_proj``), and
a config read through ``AutoConfig`` with ``--trust-remote-code``. A LLaDA2 export therefore holds

- ``config.json``: ``architectures`` ``["LLaDA2MoeModelLM"]``, the checkpoint's ``model_type`` (``llada2_moe``, or
  ``llada21_moe`` for LLaDA2.1, as published), an ``auto_map`` naming ``configuration_llada2.py`` (hf_mdm's
  configuration module, copied by transformers' own remote-code export), and the keys SGLang's model reads set to
  what hf_mdm's forward computes: a sigmoid router with its expert bias (``moe_router_enable_expert_bias``,
  ``score_function``), scores in float32 (``router_dtype``), weights renormalised when more than one expert is chosen
  (``norm_topk_prob``), no lm_head normalisation (``norm_head``), no block routing (no ``expert_capacity``), the shared
  expert's width, and ``num_shared_experts`` None when there is none;
- the weights in safetensors shards (transformers' sharding, ``max_shard_size``) with ``model.safetensors.index.json``;
  a model with an output-projection bias but none on ``query_key_value`` gets a zero one there (SGLang gives that
  projection a bias whenever ``use_bias`` is set), which changes no output;
- the tokenizer files and ``generation_config.json`` of the checkpoint, and ``dllm_algorithm.yaml``: the block size
  and the thresholds of the family's published sampler (from the checkpoint's generation config when it sets them),
  for ``--dllm-algorithm-config``.

A [MASK] id other than 156895 or bidirectional attention (``block_size=None``) is refused; another block size is
passed through the YAML file (with a note). `export_for_serving` writes the folder atomically and returns the
launch command.
"""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .record import export_record, write_record
from .source import GENERATION_CONFIG, Checkpoint, copy_side_files, ensure_shard_index, load_model, read_checkpoint

__all__ = [
    "ExportResult",
    "export_for_serving",
    "check_servable",
    "sglang_config",
    "launch_command",
    "SGLANG_VERSION",
    "VLLM_VERSION",
    "TARGETS",
]

#: The SGLang release whose loader and diffusion settings this export follows.
SGLANG_VERSION = "0.5.23"
#: The vLLM release whose loader the DiffusionGemma export (transformers' own format) follows.
VLLM_VERSION = "0.33.0"
TARGETS = ("sglang", "vllm")
LLADA2_ARCHITECTURE, DIFFUSION_GEMMA_ARCHITECTURE = "LLaDA2MoeModelLM", "DiffusionGemmaForBlockDiffusion"
#: What SGLang's diffusion mode assumes for ``LLaDA2MoeModelLM`` (``sglang/srt/dllm/config.py``).
SGLANG_BLOCK_SIZE, SGLANG_MASK_ID = 32, 156895
#: model_type -> (name, SGLang's --dllm-algorithm, the YAML keys from hf_mdm's generation config fields).
LLADA2_FAMILIES = {
    "llada2_moe": ("LLaDA2.0", "LowConfidence", {"threshold": "threshold"}),
    "llada21_moe": (
        "LLaDA2.1",
        "JointThreshold",
        {"threshold": "threshold", "edit_threshold": "editing_threshold", "max_post_edit_steps": "max_post_steps"},
    ),
}
NOT_SERVED = {"llada": "LLaDA 1", "Dream": "Dream", "hf_mdm": "hf_mdm's MDM"}
ALGORITHM_CONFIG = "dllm_algorithm.yaml"
SERVED = (
    f"SGLang {SGLANG_VERSION}'s diffusion mode serves LLaDA2.0/2.1 ({LLADA2_ARCHITECTURE}) and DiffusionGemma "
    f"({DIFFUSION_GEMMA_ARCHITECTURE}) only"
)


@dataclass
class ExportResult:
    """What `export_for_serving` wrote: the folder, the family exported, whether a LoRA adapter was merged, the
    command that serves the folder (argv), and notes on settings the engine takes differently from the checkpoint."""

    output_dir: str
    family: str
    adapter_merged: bool
    launch: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def launch_line(self) -> str:
        return shlex.join(self.launch)


def _family(checkpoint: Checkpoint, target: str) -> str:
    """``"llada2"`` or ``"diffusion_gemma"`` for a checkpoint ``target`` serves; a one-line ValueError otherwise."""
    model_type = checkpoint.model_type
    if target not in TARGETS:
        raise ValueError(f"--target {target!r}: unknown target; choose one of {', '.join(TARGETS)}")
    if model_type == "diffusion_gemma":
        return "diffusion_gemma"
    if model_type in LLADA2_FAMILIES and target == "sglang":
        return "llada2"
    if model_type in LLADA2_FAMILIES:
        raise ValueError(
            f"--target vllm exports DiffusionGemma checkpoints; {checkpoint.folder} is "
            f"{LLADA2_FAMILIES[model_type][0]}: export it with --target sglang"
        )
    what = NOT_SERVED.get(model_type, "a model")
    raise ValueError(
        f"{checkpoint.folder} is {what} (model_type {model_type!r}), which {target} does not serve: {SERVED}; "
        "serve this checkpoint with `hf-mdm serve` instead"
    )


def _check_output(checkpoint: Checkpoint, output_dir: str, overwrite: bool) -> Path:
    """The output folder, refused when it exists and is not empty (unless ``overwrite``), or when writing it would
    replace the checkpoint being read."""
    out = Path(output_dir).expanduser()
    resolved = out.resolve()
    for source in {checkpoint.folder.resolve(), checkpoint.base.resolve()}:
        if source == resolved or resolved in source.parents:
            raise ValueError(f"--output-dir {output_dir} holds the checkpoint being exported: choose a new folder")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output-dir {output_dir} is a file: choose a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"--output-dir {output_dir} exists and is not empty: pass --overwrite to replace it")
    return out


def check_servable(config: Any) -> None:
    """A one-line ValueError, saying what to change, when SGLang cannot serve the LLaDA2.x ``config`` as hf_mdm
    computes it: a [MASK] id other than SGLang's fixed one, bidirectional attention, an activation other than silu,
    no routed experts."""
    problems = [
        (
            config.mask_token_id != SGLANG_MASK_ID,
            f"mask_token_id is {config.mask_token_id}, but SGLang {SGLANG_VERSION} fills {LLADA2_ARCHITECTURE}'s "
            f"blocks with the fixed id {SGLANG_MASK_ID}: export a checkpoint trained with LLaDA2's tokenizer and "
            f"[MASK] id {SGLANG_MASK_ID}, or serve this one with `hf-mdm serve`",
        ),
        (
            config.block_size is None,
            "block_size is None (bidirectional attention), but SGLang decodes LLaDA2 block by block with "
            "block-causal attention: set block_size in config.json to the block size the model was trained with",
        ),
        (
            config.hidden_act != "silu",
            f"hidden_act is {config.hidden_act!r}, but SGLang's LLaDA2 experts run SwiGLU with silu only",
        ),
        (
            not config.num_experts,
            "num_experts is not set (no mixture of experts), but SGLang's LLaDA2 loader needs the routed experts",
        ),
    ]
    for problem, message in problems:
        if problem:
            raise ValueError(message)


def sglang_config(config: Any) -> tuple[Any, list[str]]:
    """A copy of a LLaDA2.x ``config`` as SGLang's ``LLaDA2MoeModelLM`` reads it (see the module docstring), with
    notes on what SGLang takes differently; `check_servable`'s ValueError for what SGLang cannot serve."""
    check_servable(config)
    config = copy.deepcopy(config)
    notes = []
    if config.block_size != SGLANG_BLOCK_SIZE:
        notes.append(
            f"block_size is {config.block_size}, SGLang's default for {LLADA2_ARCHITECTURE} is {SGLANG_BLOCK_SIZE}: "
            f"{ALGORITHM_CONFIG} sets block_size {config.block_size}, so pass it with --dllm-algorithm-config"
        )
    ignored = {
        "norm_head": getattr(config, "norm_head", False),
        "expert_capacity": getattr(config, "expert_capacity", None),
    }
    for key, value in ignored.items():
        if value not in (None, False):
            notes.append(f"{key}={value} is dropped: hf_mdm's forward does not use it, and SGLang would")
    if hasattr(config, "expert_capacity"):
        del config.expert_capacity
    config.norm_head = False
    config.moe_router_enable_expert_bias = True
    config.score_function = "sigmoid"
    config.router_dtype = "fp32"
    config.norm_topk_prob = config.num_experts_per_tok > 1
    config.moe_shared_expert_intermediate_size = config.moe_intermediate_size
    config.num_shared_experts = config.num_shared_experts or None
    config.use_qkv_bias = bool(config.use_qkv_bias or config.use_bias)
    config.architectures = [LLADA2_ARCHITECTURE]
    config.auto_map = None  # the published remote code is not shipped: only the configuration module, set on saving
    config._auto_class = "AutoConfig"  # transformers' remote-code export of the config class, for this copy only
    return config, notes


def _zero_qkv_bias(model: Any) -> None:
    """A zero bias on every ``query_key_value`` projection that has none (SGLang builds one when ``use_bias``)."""
    import torch

    for layer in model.model.layers:
        projection = layer.attention.query_key_value
        if projection.bias is None:
            weight = projection.weight
            projection.bias = torch.nn.Parameter(torch.zeros(weight.shape[0], dtype=weight.dtype))


def _algorithm_settings(checkpoint: Checkpoint, model: Any, block_size: int) -> tuple[str, dict]:
    """(SGLang's --dllm-algorithm, its YAML settings): the block size, and the thresholds of the family's published
    sampler, from the checkpoint's generation config where it sets them."""
    _, algorithm, keys = LLADA2_FAMILIES[model.config.model_type]
    settings = dict(model.diffusion_facts.sampler)
    for folder in (checkpoint.adapter, checkpoint.base):
        path = folder / GENERATION_CONFIG if folder is not None else None
        if path is not None and path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            settings.update({k: v for k, v in saved.items() if v is not None})
            break
    values = {"block_size": block_size}
    values.update({key: settings[ours] for key, ours in keys.items() if settings.get(ours) is not None})
    return algorithm, values


def _write_llada2(model: Any, checkpoint: Checkpoint, max_shard_size: Any) -> tuple[Any, list[str], str]:
    """(the function that writes the export into a folder, the notes, SGLang's --dllm-algorithm)."""
    import yaml

    config, notes = sglang_config(model.config)
    if model.config.use_bias and not model.config.use_qkv_bias:
        _zero_qkv_bias(model)
    algorithm, settings = _algorithm_settings(checkpoint, model, config.block_size)

    def write(folder: Path) -> None:
        model.config = config
        model.save_pretrained(folder, max_shard_size=max_shard_size)
        config.architectures = [LLADA2_ARCHITECTURE]  # save_pretrained names the class (LLaDA21MoeModelLM for 2.1)
        config.save_pretrained(folder)
        ensure_shard_index(folder)
        copy_side_files(checkpoint, folder)
        (folder / ALGORITHM_CONFIG).write_text(yaml.safe_dump(settings, sort_keys=False))

    return write, notes, algorithm


def launch_command(output_dir: str, family: str, target: str, algorithm: Optional[str] = None) -> list[str]:
    """The command that serves an exported folder (flag names from SGLang's server arguments)."""
    if target == "vllm":
        return ["vllm", "serve", output_dir]
    command = ["python", "-m", "sglang.launch_server", "--model-path", output_dir]
    if family == "llada2":
        config = str(Path(output_dir) / ALGORITHM_CONFIG)
        return command + ["--trust-remote-code", "--dllm-algorithm", algorithm, "--dllm-algorithm-config", config]
    return command + ["--dllm-algorithm", "Gemma4Renoise"]


def _model_class(model_type: str) -> Any:
    if model_type == "diffusion_gemma":
        from transformers import DiffusionGemmaForBlockDiffusion

        return DiffusionGemmaForBlockDiffusion
    from ..models import LLaDA2MoeModelLM, LLaDA21MoeModelLM

    return {"llada2_moe": LLaDA2MoeModelLM, "llada21_moe": LLaDA21MoeModelLM}[model_type]


def export_for_serving(
    model: str,
    output_dir: str,
    target: str = "sglang",
    overwrite: bool = False,
    max_shard_size: Any = "5GB",
    dtype: str = "auto",
) -> ExportResult:
    """Export the checkpoint folder ``model`` (a LoRA adapter folder is merged into its base) into ``output_dir``
    for ``target`` (``"sglang"``: LLaDA2.x and DiffusionGemma; ``"vllm"``: DiffusionGemma), written atomically.

    Args:
        model: a checkpoint folder as hf_mdm saves it, or a LoRA adapter folder (``hf-mdm sft --lora``).
        output_dir: the folder to write; an existing non-empty one is refused unless ``overwrite``.
        max_shard_size: the largest safetensors shard (transformers' ``save_pretrained``), e.g. ``"5GB"``.
        dtype: the weights' dtype (``"auto"``: as saved).

    The folder also holds ``export.json`` and ``README.md`` (`hf_mdm.export.record`): the engine and the release it was
    checked against, the launch line, the source checkpoint and whether a LoRA adapter was merged.

    Returns:
        An `ExportResult` with the launch command. Bad input is a one-line ValueError, raised before anything is
        written.
    """
    from transformers.utils.hub import convert_file_size_to_int

    from ..fileio import write_directory_atomic

    try:
        convert_file_size_to_int(max_shard_size)
    except ValueError:
        raise ValueError(f"--max-shard-size {max_shard_size!r}: not a size; write it like 5GB or 500MB") from None
    checkpoint = read_checkpoint(model)
    family = _family(checkpoint, target)
    out = _check_output(checkpoint, output_dir, overwrite)
    model_class = _model_class(checkpoint.model_type)
    if family == "llada2":
        check_servable(model_class.config_class.from_pretrained(checkpoint.base))  # before loading the weights
    loaded = load_model(checkpoint, model_class, dtype)
    if family == "llada2":
        write_weights, notes, algorithm = _write_llada2(loaded, checkpoint, max_shard_size)
    else:
        algorithm, notes = None, []

        def write_weights(folder: Path) -> None:
            loaded.save_pretrained(folder, max_shard_size=max_shard_size)
            ensure_shard_index(folder)
            copy_side_files(checkpoint, folder)

    launch = launch_command(str(out), family, target, algorithm)
    version = SGLANG_VERSION if target == "sglang" else VLLM_VERSION
    record = export_record(checkpoint, target, version, launch, str(loaded.dtype).removeprefix("torch."), notes)

    def write(folder: Path) -> None:
        write_weights(folder)
        write_record(folder, record)

    write_directory_atomic(out, write)
    return ExportResult(str(out), family, checkpoint.adapter is not None, launch, notes)
