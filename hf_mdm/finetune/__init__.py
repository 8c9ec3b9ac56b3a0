"""Fine-tuning masked diffusion LMs: supervised fine-tuning with LLaDA's recipe (response-only masking, EOS
padding), its block-diffusion form for block-causal models, LoRA through PEFT, all through transformers' `Trainer`.

- `hf_mdm.finetune.data`: prompt/response pairs from a file, a saved dataset or the Hub, tokenised with the chat
  template (`load_pairs`, `tokenize_pairs`);
- `hf_mdm.finetune.objective`: the collator and the loss (`SFTCollator`, `sft_loss`, `block_diffusion_inputs`,
  `block_by_block_loss`);
- `hf_mdm.finetune.trainer`: `SFTTrainer`, `sft_trainer`, `apply_lora`, `train_sft`.

``hf-mdm sft`` and ``hf-mdm a2d`` (`hf_mdm.cli_finetune`) wire them from the command line; `hf_mdm.finetune.a2d`
converts an autoregressive Llama or Qwen2 checkpoint into a masked diffusion model (`convert_to_mdm`).
"""

from .a2d import convert_to_mdm
from .data import load_pairs, tokenize_pairs
from .objective import SFTCollator, block_by_block_loss, block_diffusion_inputs, sft_loss
from .trainer import SFTTrainer, apply_lora, checkpointing_argument, sft_step_loss, sft_trainer, train_sft

__all__ = [
    "load_pairs",
    "tokenize_pairs",
    "SFTCollator",
    "sft_loss",
    "block_diffusion_inputs",
    "block_by_block_loss",
    "SFTTrainer",
    "sft_step_loss",
    "sft_trainer",
    "apply_lora",
    "train_sft",
    "checkpointing_argument",
    "convert_to_mdm",
]
