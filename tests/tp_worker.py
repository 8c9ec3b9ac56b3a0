"""One process of a tensor-parallel run (``torchrun --nproc_per_node N tp_worker.py CHECKPOINT``): loads the
checkpoint with ``tp_plan="auto"``, runs the padded forward saved beside it and writes this rank's logits' largest
difference from the single-process logits and whether its weights are sharded, to ``CHECKPOINT/rank{r}.json``."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForMaskedLM

import hf_mdm  # noqa: F401  registers the classes
import hf_mdm.models  # noqa: F401

checkpoint = Path(sys.argv[1])
inputs = torch.load(checkpoint / "inputs.pt")
model = AutoModelForMaskedLM.from_pretrained(checkpoint, tp_plan="auto").eval()
with torch.no_grad():
    logits = model(inputs["ids"], attention_mask=inputs["attention_mask"]).logits
sharded = [name for name, p in model.named_parameters() if type(p.data).__name__ == "DTensor"]
result = {"max_abs_diff": float((logits - inputs["logits"]).abs().max()), "sharded": len(sharded)}
(checkpoint / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
dist.barrier()  # no rank leaves while another still needs it (an early exit aborts the other under load)
dist.destroy_process_group()
