"""``hf_diffusion_gemma``: transformers' own diffusion LM, DiffusionGemma, timed through its own ``generate``.

`DiffusionGemmaForBlockDiffusion` (transformers.models.diffusion_gemma) generates canvases of ``canvas_length``
tokens one after the other, each denoised by its entropy-bound sampler with a temperature schedule and adaptive
stopping, conditioned on an encoder KV cache of everything before it. This model runs that ``generate`` unchanged,
batched and timed as ``hf_mdm`` and ``hf_timed`` are (`hf_mdm.harness.timed`), so one ``hf-mdm compare`` run
times DiffusionGemma next to LLaDA2, LLaDA, Dream and autoregressive models.

Model arguments: every argument of lm-eval's ``hf`` model, ``max_gen_toks``, and DiffusionGemma's own generation
settings ``max_denoising_steps``, ``t_min``, ``t_max``, ``entropy_bound`` (of its `EntropyBoundSamplerConfig`),
``stability_threshold`` and ``confidence_threshold`` (unset: the checkpoint's generation config, else
transformers' defaults). A request's NFE is the number of decoder forwards of its batch (the encoder passes that
fill the cache between canvases are not counted, as DiffusionGemma's ``tokens_per_forward`` does not count them).
Request kwargs such as ``temperature`` are not DiffusionGemma settings and are ignored (its temperature follows
its own schedule).
"""

from __future__ import annotations

from typing import Any, Optional

from lm_eval.api.registry import register_model

from ..loading import auto_class, checkpoint_kind
from .timed import TimedHFLM

DIFFUSION_GEMMA_SETTINGS = (
    "max_denoising_steps",
    "t_min",
    "t_max",
    "entropy_bound",
    "stability_threshold",
    "confidence_threshold",
)


@register_model("hf_diffusion_gemma")
class DiffusionGemmaLM(TimedHFLM):
    """lm-eval model for `DiffusionGemmaForBlockDiffusion` checkpoints (see the module docstring)."""

    registered_name = "hf_diffusion_gemma"

    def __init__(self, *args: Any, **kwargs: Any):
        self._settings = {name: kwargs.pop(name) for name in DIFFUSION_GEMMA_SETTINGS if name in kwargs}
        super().__init__(*args, **kwargs)

    @classmethod
    def own_arguments(cls) -> list[str]:
        """``max_gen_toks`` and DiffusionGemma's generation settings."""
        return [*super().own_arguments(), *DIFFUSION_GEMMA_SETTINGS]

    def _get_backend(self, config: Any, backend: str = "default", trust_remote_code: Optional[bool] = False) -> None:
        """Tokenise as a decoder; load with the Auto class transformers maps DiffusionGemma to (a ValueError for
        another checkpoint, before its weights are loaded)."""
        if checkpoint_kind(config) != "uniform":
            raise ValueError(
                f"hf_diffusion_gemma takes DiffusionGemma checkpoints (model_type 'diffusion_gemma'), got "
                f"{getattr(config, 'model_type', None)!r}: use hf_mdm for masked diffusion models and hf_timed for "
                "autoregressive ones"
            )
        self.backend = "causal"
        self.AUTO_MODEL_CLASS = auto_class(config)

    def _generation_settings(self) -> dict[str, Any]:
        settings = dict(self._settings)
        bound = settings.pop("entropy_bound", None)
        if bound is not None:
            from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

            settings["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=float(bound))
        return settings

    def _generate_batch(self, input_ids, attention_mask, until, max_gen_toks, kwargs, seeds):
        self._warn_ignored(kwargs, "a DiffusionGemma setting")

        def call(ids, mask):
            settings = self._generation_settings()
            pad = self.tokenizer.pad_token_id
            output = self.model.generate(
                ids, attention_mask=mask, max_new_tokens=max_gen_toks, pad_token_id=pad, return_dict_in_generate=True,
                **settings,
            )  # fmt: skip
            return output.sequences

        # the decoder forwards (self.model.model's), as DiffusionGemma counts them
        return self._own_generate_batch(self.model.model, call, input_ids, attention_mask, until, seeds)


__all__ = ["DIFFUSION_GEMMA_SETTINGS", "DiffusionGemmaLM"]
