"""One process of a tensor- or expert-parallel run (``torchrun --nproc_per_node N tp_worker.py CHECKPOINT
[LAYOUT]``): loads the checkpoint with ``tp_plan="auto"`` (LAYOUT ``tp``, the default) or with
``DistributedConfig(ep_size=N, tp_size=N)`` (``ep``: whole experts per process, the dense modules split by the TP
plan), runs the padded forward saved beside it and writes to ``CHECKPOINT/rank{r}.json`` this rank's logits' largest
difference from the single-process logits, how many of its weights are sharded, and for a mixture of experts the
experts and the expert weights' shape this rank holds."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForMaskedLM
from transformers.distributed import DistributedConfig

import hf_mdm  # noqa: F401  registers the classes
import hf_mdm.models  # noqa: F401

checkpoint = Path(sys.argv[1])
layout = sys.argv[2] if len(sys.argv) > 2 else "tp"
inputs = torch.load(checkpoint / "inputs.pt")
if layout == "tp":
    model = AutoModelForMaskedLM.from_pretrained(checkpoint, tp_plan="auto")
else:
    size = int(os.environ["WORLD_SIZE"])
    parallel = DistributedConfig(ep_size=size, tp_size=size)
    model = AutoModelForMaskedLM.from_pretrained(checkpoint, distributed_config=parallel)
model = model.eval()
with torch.no_grad():
    logits = model(inputs["ids"], attention_mask=inputs["attention_mask"]).logits
sharded = [name for name, p in model.named_parameters() if type(p.data).__name__ == "DTensor"]
result = {"max_abs_diff": float((logits - inputs["logits"]).abs().max()), "sharded": len(sharded)}
experts = [module for name, module in model.named_modules() if name.endswith("mlp.experts")]
if experts:
    weight = experts[0].gate_up_proj
    local = weight.to_local() if type(weight.data).__name__ == "DTensor" else weight
    result.update(local_experts=experts[0].num_experts, gate_up_proj=list(local.shape))
(checkpoint / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
dist.barrier()  # no rank leaves while another still needs it (an early exit aborts the other under load)
dist.destroy_process_group()
