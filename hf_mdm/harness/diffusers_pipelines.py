"""``hf_diffusers``: diffusers' diffusion-LM pipelines, timed in lm-eval beside ``hf_mdm`` on the same checkpoint.

diffusers (0.42) ships ``LLaDA2Pipeline``, block refinement of a [MASK] canvas by its ``BlockRefinementScheduler``
(threshold reveals, token editing, no KV cache: every forward recomputes the prefix). This model loads a LLaDA2.x
checkpoint (hf_mdm's native classes, or remote code with ``trust_remote_code=True``), runs the pipeline on each
batch of requests unchanged, and times it as ``hf_mdm`` and ``hf_timed`` are (`hf_mdm.harness.timed`), so one
``hf-mdm compare`` matrix puts diffusers' sampler, hf_mdm's reproduction of it
(`MaskedDiffusionGenerationConfig.llada2_pipeline`, with the exact block cache) and autoregressive models side by
side (``evaluation/configs/peers.yaml``).

Model arguments: every argument of lm-eval's ``hf`` model, ``max_gen_toks``, ``batch_invariant``, ``pipeline``
(``"llada2"``, the only one taking token ids) and the pipeline's own settings (`LLADA2_PIPELINE_SETTINGS`: its
``__call__`` arguments, its defaults when unset). A request's NFE is the number of model forwards of its batch.
Request kwargs are not pipeline settings and are ignored, with a warning naming them (the pipeline's temperature
is the ``temperature`` model argument). The model attends in blocks of its ``config.block_size``: the pipeline
passes only a 2-D mask, so ``block_length`` must equal it (a ValueError otherwise).
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.registry import register_model

from .timed import TimedHFLM

LLADA2_PIPELINE_SETTINGS = (
    "block_length",
    "num_inference_steps",
    "temperature",
    "top_p",
    "top_k",
    "threshold",
    "editing_threshold",
    "max_post_steps",
    "minimal_topk",
    "eos_early_stop",
)
PIPELINES = ("llada2",)


@register_model("hf_diffusers")
class DiffusersPipelineLM(TimedHFLM):
    """lm-eval model running a diffusers diffusion-LM pipeline (see the module docstring)."""

    registered_name = "hf_diffusers"

    def __init__(self, *args: Any, pipeline: str = "llada2", **kwargs: Any):
        if pipeline not in PIPELINES:
            raise ValueError(f"hf_diffusers: pipeline must be one of {list(PIPELINES)}, got {pipeline!r}")
        self._settings = {name: kwargs.pop(name) for name in LLADA2_PIPELINE_SETTINGS if name in kwargs}
        super().__init__(*args, **kwargs)
        self._pipeline = self._build_pipeline()

    @classmethod
    def own_arguments(cls) -> list[str]:
        """``max_gen_toks``, ``batch_invariant``, ``pipeline`` and the pipeline's settings."""
        return [*super().own_arguments(), "pipeline", *LLADA2_PIPELINE_SETTINGS]

    def _get_backend(self, config: Any, backend: str = "default", trust_remote_code: bool = False) -> None:
        """Tokenise as a decoder; load with the causal-LM Auto class (hf_mdm registers LLaDA2 there)."""
        self.backend = "causal"
        import transformers

        self.AUTO_MODEL_CLASS = transformers.AutoModelForCausalLM

    def _build_pipeline(self) -> Any:
        from diffusers import BlockRefinementScheduler, LLaDA2Pipeline

        block = self._settings.get("block_length", BlockRefinementScheduler().config.block_length)
        attention_block = getattr(self.model.config, "block_size", None)
        if attention_block is not None and attention_block != block:
            raise ValueError(
                f"hf_diffusers: block_length={block} but the model attends in blocks of {attention_block} "
                f"(config.block_size), and LLaDA2Pipeline passes only a 2-D mask: set block_length={attention_block}"
            )
        pipe = LLaDA2Pipeline(model=self.model, scheduler=BlockRefinementScheduler(), tokenizer=self.tokenizer)
        pipe.set_progress_bar_config(disable=True)
        self._mask_id = self.model.config.mask_token_id
        if self._mask_id is None:
            raise ValueError("hf_diffusers: the model config has no mask_token_id, which LLaDA2Pipeline needs")
        return pipe

    def _generate_batch(self, input_ids, attention_mask, until, max_gen_toks, kwargs, seeds):
        self._warn_ignored(kwargs, "a pipeline setting")

        def call(ids, mask):
            output = self._pipeline(
                input_ids=ids, attention_mask=mask, use_chat_template=False, gen_length=max_gen_toks,
                mask_token_id=self._mask_id, output_type="seq", **self._settings,
            )  # fmt: skip
            return self._padded(output.sequences, ids)

        return self._own_generate_batch(self.model, call, input_ids, attention_mask, until, seeds)

    def _padded(self, sequences, ids):
        """The prompt and the generated columns, with the [MASK] tokens the pipeline leaves in a row that stopped
        early (``eos_early_stop``) replaced by padding."""
        import torch

        mask_id = self._mask_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        if mask_id is not None:
            sequences = sequences.masked_fill(sequences == mask_id, pad)
        return torch.cat([ids, sequences.to(ids.device)], dim=1)


__all__ = ["LLADA2_PIPELINE_SETTINGS", "DiffusersPipelineLM"]
