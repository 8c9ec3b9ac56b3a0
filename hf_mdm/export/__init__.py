"""Exporting checkpoints for serving engines: `export_for_serving` writes a LLaDA2.x checkpoint (a LoRA adapter merged
into its base) as SGLang loads it, and a DiffusionGemma checkpoint in transformers' own format (SGLang, vLLM).

- `hf_mdm.export.source`: the checkpoint folder read (model or LoRA adapter), loaded and merged, and the tokenizer
  and generation config copied beside the weights;
- `hf_mdm.export.sglang`: what SGLang's loader and diffusion mode read, the config written for it, the launch line;
- `hf_mdm.export.record`: ``export.json`` and ``README.md`` in the folder: the engine release it was checked against,
  the launch line, the source checkpoint and whether a LoRA adapter was merged.

``hf-mdm export`` (`hf_mdm.cli_export`) wires it from the command line.
"""

from .sglang import (
    SGLANG_VERSION,
    TARGETS,
    VLLM_VERSION,
    ExportResult,
    export_for_serving,
    launch_command,
    sglang_config,
)

__all__ = [
    "ExportResult",
    "export_for_serving",
    "launch_command",
    "sglang_config",
    "SGLANG_VERSION",
    "VLLM_VERSION",
    "TARGETS",
]
