"""Training glue: the forward-process collator and HF ``Trainer`` set-ups for an MDM and a matched AR baseline.

Both models see the same sequences. The MDM (``MDMForMaskedDiffusion``) is trained on the ELBO: each sequence
gets a time t, each token is masked with probability 1 - alpha(t), and the loss is the weighted cross-entropy at
masked positions, per token. The AR baseline is a standard transformers causal LM (``LlamaForCausalLM``) of the
same width, depth and MLP size, reading a BOS token first so that it also predicts the first token.

With ``block_size`` the MDM is a block diffusion model (BD3-LM): block-causal attention, each block of a sequence
noised at its own time, x_t and x_0 read side by side in one forward (`BlockDiffusionCollator`).

Both eval losses are per-token negative log-likelihoods in nats (the MDM's an upper bound, the ELBO), so they are
directly comparable with the language's exact entropy per token ``expected_nll(L) / L``:
`EntropyGapCallback` adds ``eval_entropy_per_token`` and ``eval_nll_gap`` (= eval_loss / entropy - 1) to every
evaluation. Everything runs unchanged under ``accelerate launch`` (the Trainer distributes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from .checkpoints import resumable_checkpoint
from .configuration_mdm import MDMConfig
from .fileio import write_directory_atomic
from .modeling_mdm import MDMForMaskedDiffusion
from .schedules import get_schedule

MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=192),
    "small": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=384),
    "base": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1152),
    "paper": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=2304),
}


def _pad(
    sequences: Sequence[Sequence[int]], pad_token_id: Optional[int]
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    lengths = {len(s) for s in sequences}
    if len(lengths) == 1:
        return torch.tensor([list(s) for s in sequences], dtype=torch.long), None
    if pad_token_id is None:
        raise ValueError("sequences of different lengths need pad_token_id on the collator")
    longest = max(lengths)
    ids = torch.full((len(sequences), longest), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def _ids(features: Sequence[Any]) -> list:
    return [f["input_ids"] if isinstance(f, dict) else f for f in features]


@dataclass
class MaskedDiffusionCollator:
    """The forward process as a data collator: ``{"input_ids"}`` rows -> x_t, labels, t.

    Args:
        mask_token_id: id of [MASK].
        schedule: alpha(t), a name or schedule object (must match the model config's ``schedule``).
        eps: t is drawn in [eps, 1] so the ELBO weight stays finite.
        low_discrepancy: draw the batch's times as ``(u + i / B) mod 1`` (one uniform per batch, MDLM's
            antithetic sampling); lower variance of the loss, same expectation.
        pad_token_id: needed only when sequences differ in length; padding is never masked nor scored.
        seed: seed of the collator's own generator (masks and times), for reproducible runs.

    Returns a dict with ``input_ids`` (B, L) x_t, ``labels`` (B, L) x_0 at masked positions and -100 elsewhere,
    ``t`` (B,) and, with padding, ``attention_mask``.
    """

    mask_token_id: int
    schedule: Any = "linear"
    eps: float = 1e-3
    low_discrepancy: bool = True
    pad_token_id: Optional[int] = None
    seed: Optional[int] = None
    _generator: Optional[torch.Generator] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.schedule = get_schedule(self.schedule)
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {self.eps}")
        if self.seed is not None:
            self._generator = torch.Generator().manual_seed(self.seed)

    def sample_times(self, batch_size: int) -> torch.Tensor:
        if self.low_discrepancy:
            u = torch.rand((), generator=self._generator)
            t = (u + torch.arange(batch_size) / batch_size) % 1.0
        else:
            t = torch.rand(batch_size, generator=self._generator)
        return self.eps + (1.0 - self.eps) * t

    def __call__(self, features: Sequence[Any]) -> dict[str, torch.Tensor]:
        x0, attention_mask = _pad(_ids(features), self.pad_token_id)
        if bool((x0 == self.mask_token_id).any()):
            raise ValueError(
                f"the data contains the mask token id {self.mask_token_id}: pick an id outside the vocabulary"
            )
        t = self.sample_times(x0.shape[0])
        p_mask = 1.0 - self.schedule.alpha(t.double()).float()
        masked = torch.rand(x0.shape, generator=self._generator) < p_mask[:, None]
        if attention_mask is not None:
            masked &= attention_mask.bool()
        batch = {
            "input_ids": x0.masked_fill(masked, self.mask_token_id),
            "labels": x0.masked_fill(~masked, -100),
            "t": t,
        }
        if attention_mask is not None:
            batch["attention_mask"] = attention_mask
        return batch


@dataclass
class BlockDiffusionCollator(MaskedDiffusionCollator):
    """Block diffusion's forward process (BD3-LM, arXiv 2503.09573): each block of ``block_size`` positions of a
    sequence gets its own time t and is masked with probability 1 - alpha(t); the model reads x_t and x_0 side by
    side in one forward (`MDMForMaskedDiffusion.block_diffusion_forward`).

    Args (besides `MaskedDiffusionCollator`'s):
        block_size: the model's attention block (``MDMConfig(block_size=...)``).
        t_range: BD3-LM's clipped schedule: times drawn in ``[low, high]`` instead of ``[eps, 1]`` (a narrower range
            lowers the variance of the loss, at the price of a biased estimate of the ELBO).

    Returns ``input_ids`` (B, L) x_t, ``clean_ids`` (B, L) x_0, ``labels`` (x_0 at masked positions, -100 elsewhere),
    ``t`` (B, number of blocks) and, with padding, ``attention_mask``.
    """

    block_size: int = 16
    t_range: Optional[tuple[float, float]] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {self.block_size!r}")
        if self.t_range is not None and not 0 < self.t_range[0] <= self.t_range[1] <= 1:
            raise ValueError(f"t_range must be (low, high) with 0 < low <= high <= 1, got {self.t_range!r}")

    def __call__(self, features: Sequence[Any]) -> dict[str, torch.Tensor]:
        x0, attention_mask = _pad(_ids(features), self.pad_token_id)
        if bool((x0 == self.mask_token_id).any()):
            raise ValueError(
                f"the data contains the mask token id {self.mask_token_id}: pick an id outside the vocabulary"
            )
        bsz, length = x0.shape
        num_blocks = -(-length // self.block_size)
        t = self.sample_times(bsz * num_blocks).view(bsz, num_blocks)
        if self.t_range is not None:
            low, high = self.t_range
            t = low + (high - low) * (t - self.eps) / (1.0 - self.eps)
        block_of = torch.arange(length) // self.block_size
        p_mask = 1.0 - self.schedule.alpha(t.double()).float()[:, block_of]
        masked = torch.rand(x0.shape, generator=self._generator) < p_mask
        if attention_mask is not None:
            masked &= attention_mask.bool()
        batch = {
            "input_ids": x0.masked_fill(masked, self.mask_token_id),
            "clean_ids": x0,
            "labels": x0.masked_fill(~masked, -100),
            "t": t,
        }
        if attention_mask is not None:
            batch["attention_mask"] = attention_mask
        return batch


@dataclass
class CausalLMCollator:
    """For the AR baseline: prepend BOS, labels = inputs (padding -> -100); the model shifts internally."""

    bos_token_id: int
    pad_token_id: Optional[int] = None

    def __call__(self, features: Sequence[Any]) -> dict[str, torch.Tensor]:
        ids, attention_mask = _pad(_ids(features), self.pad_token_id)
        ids = torch.cat([torch.full((ids.shape[0], 1), self.bos_token_id, dtype=torch.long), ids], dim=1)
        labels = ids.clone()
        batch = {"input_ids": ids, "labels": labels}
        if attention_mask is not None:
            attention_mask = torch.cat([torch.ones((ids.shape[0], 1), dtype=torch.long), attention_mask], dim=1)
            labels.masked_fill_(attention_mask == 0, -100)
            batch["attention_mask"] = attention_mask
        return batch


def model_dims(size: Any) -> dict[str, int]:
    """The dimensions of a model size: a name of ``MODEL_SIZES`` or a dict of dimensions."""
    if isinstance(size, dict):
        return dict(size)
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}: use one of {sorted(MODEL_SIZES)} or a dict of dimensions")
    return dict(MODEL_SIZES[size])


def mdm_config_for(
    vocab_size: int, length: int, size: Any = "tiny", schedule: Any = "linear", block_size: Optional[int] = None
) -> MDMConfig:
    """An MDM for a language of ``vocab_size`` tokens: [MASK] = ``vocab_size`` (one extra id); block-causal with
    ``block_size`` (a block diffusion model), else bidirectional."""
    schedule = get_schedule(schedule)
    return MDMConfig(
        vocab_size=vocab_size + 1,
        mask_token_id=vocab_size,
        max_position_embeddings=length,
        schedule=schedule.to_dict() if schedule.kwargs() else schedule.name,
        block_size=block_size,
        **model_dims(size),
    )


def ar_config_for(vocab_size: int, length: int, size: Any = "tiny") -> LlamaConfig:
    """The matched AR baseline: same dimensions, BOS = ``vocab_size`` (one extra id), positions for BOS + L."""
    dims = model_dims(size)
    return LlamaConfig(
        vocab_size=vocab_size + 1,
        bos_token_id=vocab_size,
        eos_token_id=None,
        pad_token_id=None,
        max_position_embeddings=length + 1,
        tie_word_embeddings=False,
        **dims,
    )


class EntropyGapCallback(TrainerCallback):
    """Adds the language's exact entropy per token and the relative gap of eval_loss to it to eval metrics."""

    def __init__(self, entropy_per_token: float):
        self.entropy_per_token = float(entropy_per_token)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics is not None and "eval_loss" in metrics:
            metrics["eval_entropy_per_token"] = self.entropy_per_token
            metrics["eval_nll_gap"] = metrics["eval_loss"] / self.entropy_per_token - 1.0


def build_trainer(
    kind: str,
    train_dataset: Any,
    eval_dataset: Any,
    vocab_size: int,
    length: int,
    args: TrainingArguments,
    size: Any = "tiny",
    schedule: Any = "linear",
    entropy_per_token: Optional[float] = None,
    seed: int = 0,
    model: Optional[torch.nn.Module] = None,
    block_size: Optional[int] = None,
) -> Trainer:
    """A `transformers.Trainer` for ``kind="mdm"`` (MDMForMaskedDiffusion, ELBO; with ``block_size`` a block
    diffusion model trained on BD3-LM's objective) or ``kind="ar"`` (LlamaForCausalLM).

    ``train_dataset`` / ``eval_dataset`` have an ``input_ids`` column of sequences over ``range(vocab_size)``.
    """
    if kind not in ("mdm", "ar"):
        raise ValueError(f"kind must be 'mdm' or 'ar', got {kind!r}")
    torch.manual_seed(seed)
    if kind == "mdm":
        config = mdm_config_for(vocab_size, length, size, schedule, block_size)
        if model is not None and get_schedule(model.config.schedule) != get_schedule(schedule):
            raise ValueError(
                f"schedule {schedule!r} differs from the model's config.schedule {model.config.schedule!r}: "
                "train with the schedule the model was built with"
            )
        model = model if model is not None else MDMForMaskedDiffusion(config)
        block_size = model.config.block_size if model is not None else block_size
        collator = (
            BlockDiffusionCollator(config.mask_token_id, schedule, seed=seed, block_size=block_size)
            if block_size is not None
            else MaskedDiffusionCollator(mask_token_id=config.mask_token_id, schedule=schedule, seed=seed)
        )
    else:
        config = ar_config_for(vocab_size, length, size)
        model = model if model is not None else LlamaForCausalLM(config)
        collator = CausalLMCollator(bos_token_id=config.bos_token_id)
    callbacks = [EntropyGapCallback(entropy_per_token)] if entropy_per_token is not None else []
    args.remove_unused_columns = False
    if args.use_cpu or not torch.cuda.is_available():  # pinned memory only speeds copies to a CUDA device
        args.dataloader_pin_memory = False
    return Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        callbacks=callbacks,
    )


def train(trainer: Trainer, resume: bool = True) -> Any:
    """Train, resuming from the newest readable checkpoint in ``args.output_dir`` when there is one (said in one
    line); newer checkpoints that do not read (a save cut short) are skipped with a warning naming them
    (`hf_mdm.checkpoints.resumable_checkpoint`)."""
    last = resumable_checkpoint(trainer.args.output_dir) if resume else None
    if last is not None and trainer.is_world_process_zero():
        print(f"resuming from {last[0]} (step {last[1]})", flush=True)
    return trainer.train(resume_from_checkpoint=last[0] if last is not None else None)


def _attention_flops() -> dict:
    """FLOP formulas for the CPU kernels of scaled-dot-product attention, which torch's ``FlopCounterMode`` does not
    list (it counts the CUDA kernels): the same count as theirs, every product of the dense S x S score matrix
    (2 products forward; backward 5: the scores recomputed, then the gradients of values, scores, queries and keys)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    aten = torch.ops.aten
    return {
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
    }


def step_flops(
    kind: str,
    vocab_size: int,
    length: int,
    size: Any = "tiny",
    batch_size: int = 1,
    block_size: Optional[int] = None,
    attn_implementation: str = "sdpa",
) -> int:
    """The FLOPs of one training step's forward and backward (the optimiser's update left out) for the model
    `build_trainer` makes with these arguments, on one batch of ``batch_size`` sequences of ``length``, counted by
    torch's ``FlopCounterMode``: every matrix product, attention's included (``attn_implementation`` "sdpa", the
    default of training, or "eager"). Attention is counted dense, S x S for S positions (2L for a block diffusion
    model, whose objective reads the noisy and the clean copy side by side; the AR model's BOS + L), as the kernels
    compute it under a mask; a causal kernel that skips masked tiles does less. The token values do not change it.
    The rotary position table is left out (`_position_table_flops`)."""
    import tempfile

    from datasets import Dataset
    from torch.utils.flop_counter import FlopCounterMode

    rows = Dataset.from_dict({"input_ids": [[0] * length] * batch_size})
    with tempfile.TemporaryDirectory() as folder, torch.random.fork_rng():  # build_trainer seeds torch
        args = TrainingArguments(output_dir=folder, report_to=[], use_cpu=True)
        trainer = build_trainer(
            kind, rows, rows, vocab_size=vocab_size, length=length, args=args, size=size, block_size=block_size
        )
        trainer.model.set_attn_implementation(attn_implementation)
        batch = trainer.data_collator(list(rows))
        with FlopCounterMode(display=False, custom_mapping=_attention_flops()) as counter:
            trainer.compute_loss(trainer.model, batch).backward()
    return int(counter.get_total_flops() - _position_table_flops(counter))


def _position_table_flops(counter: Any) -> int:
    """The FLOPs a ``FlopCounterMode`` counted inside rotary-embedding modules (named ``rotary_emb``): the outer
    product of the inverse frequencies and the positions, no weight in it. transformers 5.15's Llama writes it as a
    matrix product, which the counter counts (2 (d_head / 2) S FLOPs); 5.24's as an elementwise product, which it
    does not, nor the MDM's `rotary_cos_sin`. Leaving it out makes the count the same under every version."""
    counts = counter.get_flop_counts()
    return sum(sum(ops.values()) for name, ops in counts.items() if name.rsplit(".", 1)[-1] == "rotary_emb")


class NoEvaluationAtTheLastStep(TrainerCallback):
    """Drops the trainer's own evaluation at the last step (`train_save_evaluate` saves the model, then evaluates)."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps:
            control.should_evaluate = False


def train_save_evaluate(
    trainer: Trainer,
    final: Union[str, os.PathLike],
    write_extra: Optional[Callable[[Path], None]] = None,
    resume: bool = True,
) -> Optional[dict[str, float]]:
    """Train, write the model to ``final`` atomically (with ``write_extra(folder)``), then evaluate it. Returns the
    metrics, or None when the evaluation was interrupted (Ctrl-C): the trained model is on disk before it starts."""
    trainer.add_callback(NoEvaluationAtTheLastStep())
    train(trainer, resume=resume)

    def write(folder: Path) -> None:
        trainer.save_model(str(folder))
        if write_extra is not None:
            write_extra(folder)

    write_directory_atomic(final, write)
    try:
        return trainer.evaluate()
    except KeyboardInterrupt:
        return None
