"""The reverse process: sampling from a masked diffusion language model.

One implementation serves ``model.generate`` (through ``MaskedDiffusionGenerationMixin``) and the free function
``diffusion_generate(model, input_ids, ...)``, which works with any model whose output has ``.logits``
(hf_mdm's own models, LLaDA and Dream loaded natively or with ``trust_remote_code``, the exact-posterior
``OracleDenoiser``).

A run, top to bottom:

1. the canvas is the prompt followed by ``max_new_tokens`` [MASK] tokens; masks already inside the prompt are
   generated too (infilling). Padding (2-D ``attention_mask``, left or right) is never attended to nor generated;
2. the generation region (from the first masked column to the end) is cut into blocks of ``block_length``
   columns, denoised left to right (semi-autoregressive); ``steps`` are split over the blocks in proportion to
   their masked counts, each block at least one;
3. within a block of S steps, step i goes from time t = 1 - i/S to s = 1 - (i+1)/S. The model sees the canvas
   once (classifier-free guidance: twice, batched), the LM head runs only on the block's masked positions,
   a token is proposed at each of them (argmax at temperature 0, else sampled after the temperature / top-k /
   top-p processors; [MASK] itself is never proposed), the *transfer* rule decides how many positions each row
   reveals and the *strategy* which ones. Revealed tokens stay (no remasking);
4. between blocks, rows that produced EOS (or met a stopping criterion) finish early; at the end tokens after
   the first generated EOS become padding when ``stop_at_eos``.

Reference presets: a config built with ``MaskedDiffusionGenerationConfig.llada(...)`` or ``.dream(...)`` (field
``reference``) replaces steps 2-4 with the loop of LLaDA's ``generate()`` or Dream's ``diffusion_generate()``, which
returns their outputs token for token (same random draws in the same order); see those two constructors.

This module is exported with the model as remote code, so it imports only torch, transformers and
``.schedules``.
"""

from __future__ import annotations

import copy
import inspect
import math
import time
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.stopping_criteria import StoppingCriteriaList
from transformers.utils import ModelOutput

from .schedules import get_schedule

TRANSFERS = ("stochastic", "deterministic", "threshold")
STRATEGIES = ("random", "confidence", "margin", "entropy", "left_to_right")
POSITIONAL_STRATEGIES = ("random", "left_to_right")  # positions chosen without looking at the proposals
STRATEGY_ALIASES = {
    "low_confidence": "confidence",
    "maskgit_plus": "confidence",
    "topk_margin": "margin",
    "origin": "random",
}

_DIFFUSION_DEFAULTS: dict[str, Any] = {
    "steps": None,
    "block_length": None,
    "schedule": "linear",
    "schedule_kwargs": None,
    "transfer": "deterministic",
    "strategy": "confidence",
    "threshold": None,
    "cfg_scale": 0.0,
    "mask_token_id": None,
    "stop_at_eos": True,
    "output_history": False,
    "logits_shift": None,
    "reference": None,
    # LLaDA generate()'s own parameters (reference="llada")
    "remasking": None,
    "logits_eos_inf": False,
    "confidence_eos_eot_inf": False,
    "eot_token_id": None,
    # Dream diffusion_generate()'s own parameters (reference="dream")
    "eps": None,
    "alg": None,
    "alg_temp": None,
}

REFERENCES = ("llada", "dream")
LLADA_REMASKINGS = ("low_confidence", "random")
DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
# The reference parameters each preset reads; any other one must keep its default (listed in _DIFFUSION_DEFAULTS).
_REFERENCE_PARAMS = {
    "llada": ("remasking", "logits_eos_inf", "confidence_eos_eot_inf", "eot_token_id"),
    "dream": ("eps", "alg", "alg_temp"),
}
# LLaDA's generate() hard-codes LLaDA-8B's ids: EOS <|endoftext|> and EoT <|eot_id|>. The presets take EOS from the
# model config (126081 for LLaDA-8B) and EoT from ``eot_token_id`` (the model config's ``eot_token_id``, else this).
LLADA_EOS_TOKEN_ID = 126081
LLADA_EOT_TOKEN_ID = 126348


class MaskedDiffusionGenerationConfig(GenerationConfig):
    r"""Generation settings of the reverse (denoising) process of a masked diffusion LM.

    Besides the usual `transformers.GenerationConfig` fields (``max_new_tokens``, ``temperature``, ``top_k``,
    ``top_p``, ``eos_token_id``, ``pad_token_id``, ``return_dict_in_generate``), it holds:

    Args:
        steps (`int`, *optional*): denoising steps in total (default: one per masked token). Split over blocks in
            proportion to their masked counts, each block at least one, so fewer steps than blocks runs one step
            per block. More steps than masked tokens is allowed: steps that would reveal nothing are skipped.
        block_length (`int`, *optional*): semi-autoregressive block size in columns (default: one block). It need
            not divide the generation length (the last block is shorter).
        schedule (`str` or schedule object, defaults to ``"linear"``), schedule_kwargs (`dict`): alpha(t), see
            `hf_mdm.schedules`.
        transfer (`str`, defaults to ``"deterministic"``): how many positions a step reveals:
            ``"stochastic"``: Binomial(m, (alpha(s) - alpha(t)) / (1 - alpha(t))) of the m still-masked positions
            (with ``strategy="random"`` this is the paper's sampler: each masked position revealed independently);
            ``"deterministic"``: floor(m0 (alpha(s) - alpha(t))) with the remainder given to the earliest steps
            (m0 = masked count at block start; LLaDA's split for the linear schedule);
            ``"threshold"``: every position whose confidence >= ``threshold``, at least one, and at least what the
            remaining steps need to finish the block, so a block never takes more than its steps.
        strategy (`str`, defaults to ``"confidence"``): which positions: ``"random"``, ``"confidence"`` (probability
            of the proposed token), ``"margin"`` (top-1 minus top-2 probability), ``"entropy"`` (lowest entropy
            first) or ``"left_to_right"``. Aliases: ``low_confidence``, ``maskgit_plus`` (confidence),
            ``topk_margin`` (margin), ``origin`` (random).
        threshold (`float`, *optional*): in (0, 1], for ``transfer="threshold"``.
        cfg_scale (`float`, defaults to 0): classifier-free guidance; the unconditional input is the canvas with
            the prompt masked, and logits = u + (cfg_scale + 1)(c - u). Costs a second forward per step.
        mask_token_id (`int`, *optional*): [MASK] id (default: the model config's).
        stop_at_eos (`bool`, defaults to `True`): tokens after the first generated EOS become ``pad_token_id``
            (EOS if unset) and rows that finished stop between blocks.
        output_history (`bool`, defaults to `False`): keep the canvas after every step (returned with
            ``return_dict_in_generate``).
        logits_shift (`int`, *optional*): 1 if position i is predicted from hidden state i-1 (Dream); default from
            the model config.
        reference (`str`, *optional*): ``"llada"`` or ``"dream"``: run the reference sampler of that model family,
            token for token, instead of the sampler above. Build such a config with `llada` or `dream`, whose
            docstrings give the exact semantics. Its parameters are fields too, serialised with the config:
            ``remasking``, ``logits_eos_inf``, ``confidence_eos_eot_inf``, ``eot_token_id`` (LLaDA) and ``eps``,
            ``alg``, ``alg_temp`` (Dream), read only by their own preset (inert otherwise, as in Dream's published
            generation_config.json, which holds ``alg``, ``eps`` and ``alg_temp``). A preset reads ``max_new_tokens``,
            ``steps``, ``temperature``, ``cfg_scale``, ``mask_token_id``, ``eos_token_id`` and, for LLaDA,
            ``block_length``, for Dream ``top_p`` and ``top_k``; the fields of the sampler above (``schedule``,
            ``transfer``, ``strategy``, ...) must keep their defaults (a ValueError says so otherwise).

    Confidence, margin and entropy are computed from the softmax of the processed logits over the whole vocabulary
    ([MASK] included in the normalisation, as LLaDA and Dream do), before [MASK] is excluded from the proposal.
    """

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("temperature", 0.0)
        for key, default in _DIFFUSION_DEFAULTS.items():
            value = kwargs.pop(key, default)
            setattr(self, key, copy.deepcopy(value) if isinstance(value, dict) else value)
        if self.schedule_kwargs is None:
            self.schedule_kwargs = {}
        super().__init__(**kwargs)

    def validate(self, strict: bool = False, user_set_attributes: Optional[set] = None) -> None:
        # GenerationConfig rejects max_new_tokens == 0, which is legal here (pure infilling).
        max_new_tokens = self.max_new_tokens
        if max_new_tokens is not None and max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        # Hidden from transformers' checks: max_new_tokens == 0 is legal here (pure infilling), temperature 0 means
        # argmax and top-k/top-p apply whenever temperature > 0, so its do_sample consistency rules do not apply.
        hidden = {"max_new_tokens": max_new_tokens or None, "temperature": None, "top_k": None, "top_p": None}
        saved = {name: getattr(self, name) for name in hidden}
        try:
            for name, value in hidden.items():
                setattr(self, name, value)
            super().validate(strict=strict, user_set_attributes=user_set_attributes)
        finally:
            for name, value in saved.items():
                setattr(self, name, value)
        self.validate_diffusion()

    def validate_diffusion(self) -> None:
        """Raise a ValueError naming the field for every diffusion setting that cannot run."""
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if self.block_length is not None and (not isinstance(self.block_length, int) or self.block_length < 1):
            raise ValueError(f"block_length must be an integer >= 1 (or None for one block), got {self.block_length!r}")
        if self.transfer not in TRANSFERS:
            raise ValueError(f"unknown transfer {self.transfer!r}: use one of {list(TRANSFERS)}")
        canonical_strategy(self.strategy)
        get_schedule(self.schedule, **(self.schedule_kwargs or {}))
        if self.transfer == "threshold":
            if self.threshold is None or not 0 < float(self.threshold) <= 1:
                raise ValueError(f"transfer='threshold' needs threshold in (0, 1], got {self.threshold!r}")
        elif self.threshold is not None and not 0 < float(self.threshold) <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold!r}")
        if self.cfg_scale is None or self.cfg_scale < 0:
            raise ValueError(f"cfg_scale must be >= 0, got {self.cfg_scale!r}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.logits_shift not in (None, 0, 1):
            raise ValueError(f"logits_shift must be 0, 1 or None, got {self.logits_shift!r}")
        self._validate_reference()

    def _validate_reference(self) -> None:
        reference = self.reference
        if reference is None:
            # The reference parameters are inert here: Dream's published generation_config.json carries alg, eps,
            # alg_temp (and steps), which a Dream checkpoint's default config keeps without selecting the preset.
            return
        if reference not in REFERENCES:
            raise ValueError(f"unknown reference {reference!r}: use one of {list(REFERENCES)} or None")
        for name in ("schedule", "schedule_kwargs", "transfer", "strategy", "threshold"):
            value, default = getattr(self, name), _DIFFUSION_DEFAULTS[name]
            if value != default and not (name == "schedule_kwargs" and not value):
                raise ValueError(
                    f"{name}={value!r} does not apply to reference={reference!r}, which follows its reference "
                    f"sampler: leave {name} at its default"
                    + (" and set remasking=..." if reference == "llada" else " and set alg=...")
                )
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"reference={reference!r} needs steps >= 1, got {self.steps!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            name = "gen_length" if reference == "llada" else "max_new_tokens"
            raise ValueError(f"reference={reference!r} needs {name} (max_new_tokens) >= 1, got {self.max_new_tokens!r}")
        if reference == "llada":
            self._validate_llada()
        else:
            self._validate_dream()

    def _validate_llada(self) -> None:
        gen_length, block_length, steps = self.max_new_tokens, self.block_length, self.steps
        if block_length is None:
            raise ValueError("reference='llada' needs block_length (block_length=gen_length for a single block)")
        if gen_length % block_length:
            raise ValueError(
                f"LLaDA's generate() needs gen_length % block_length == 0: gen_length={gen_length}, "
                f"block_length={block_length}; change one of them"
            )
        num_blocks = gen_length // block_length
        if steps % num_blocks:
            lower, higher = steps - steps % num_blocks, steps + num_blocks - steps % num_blocks
            raise ValueError(
                f"LLaDA's generate() needs steps to be a multiple of the number of blocks: steps={steps}, "
                f"gen_length // block_length = {num_blocks} blocks; use steps={lower or higher}"
                + (f" or {higher}" if lower else "")
            )
        if self.remasking not in LLADA_REMASKINGS:
            raise ValueError(f"remasking must be one of {list(LLADA_REMASKINGS)}, got {self.remasking!r}")
        if self.top_k is not None or self.top_p is not None:
            raise ValueError("LLaDA's generate() has no top_k / top_p: leave them None with reference='llada'")

    def _validate_dream(self) -> None:
        if self.block_length is not None:
            raise ValueError(
                "Dream's diffusion_generate() has no blocks: leave block_length None with reference='dream'"
            )
        if self.alg not in DREAM_ALGS:
            raise ValueError(f"alg must be one of {list(DREAM_ALGS)}, got {self.alg!r}")
        if self.eps is None or not 0 <= float(self.eps) < 1:
            raise ValueError(f"eps must be in [0, 1), got {self.eps!r}")
        if self.alg_temp is not None and float(self.alg_temp) < 0:
            raise ValueError(f"alg_temp must be >= 0 or None, got {self.alg_temp!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not 0 < float(self.top_p) <= 1:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")

    @classmethod
    def llada(
        cls,
        gen_length: int,
        steps: int,
        block_length: int,
        temperature: float = 0.0,
        cfg_scale: float = 0.0,
        remasking: str = "low_confidence",
        logits_eos_inf: bool = False,
        confidence_eos_eot_inf: bool = False,
        *,
        mask_id: Optional[int] = None,
        eos_token_id: Optional[int] = None,
        eot_token_id: Optional[int] = None,
        **kwargs: Any,
    ) -> "MaskedDiffusionGenerationConfig":
        r"""LLaDA's ``generate()`` (ML-GSAI/LLaDA generate.py), token for token at fp32, with its argument names.

        ``model.generate(prompt, attention_mask=..., generation_config=MaskedDiffusionGenerationConfig.llada(...))``
        (or `diffusion_generate`) then returns what ``generate(model, prompt, attention_mask, steps, gen_length,
        block_length, temperature, cfg_scale, remasking, mask_id, logits_eos_inf, confidence_eos_eot_inf)`` returns,
        given the same ``torch.manual_seed`` (or pass ``generator=``), for LLaDA or any model with the same output:

        - canvas: the prompt (left padding; pads != [MASK]) then ``gen_length`` masks; the attention mask (extended
          with ones) is passed on every forward when the prompt is padded;
        - ``gen_length % block_length == 0`` and ``steps % (gen_length // block_length) == 0`` are required
          (ValueError, where LLaDA asserts); each block gets ``steps // num_blocks`` steps. A block's schedule comes
          from each row's mask count M in the block at its start: ``M // spb`` per step plus one on the first
          ``M % spb`` steps;
        - each step: logits of the whole canvas in the model dtype (classifier-free guidance: one call on
          ``[x, x with every prompt position, pads included, masked]``, ``u + (cfg_scale + 1)(c - u)``);
          ``logits_eos_inf`` sets the EOS logit to -inf; the proposal x0 is the argmax (first index on ties) at
          ``temperature`` 0, else the Gumbel-max ``argmax(exp(l) / (-log U) ** temperature)`` in float64 with
          ``U`` a (B, L, V) float64 uniform draw. [MASK] can be proposed (it then stays masked);
        - ``confidence_eos_eot_inf`` reproduces LLaDA's aliasing: after x0 is chosen, at temperature 0 both the EOS
          and the EoT logits become -inf, at temperature > 0 only the EoT logit (LLaDA's EOS write lands in the
          float64 copy); a position whose x0 is EOS/EoT thus gets confidence 0 (unmasked last, still possible);
        - confidence: ``remasking="low_confidence"``: the softmax of those logits, in the model dtype, at x0;
          ``"random"``: ``torch.rand((B, L))`` (float32), drawn after the Gumbel noise. Positions at or after the
          block end and positions not masked get -inf; masked positions before the block (prompt masks, or masks
          that got [MASK] proposed) stay candidates, as in LLaDA;
        - each row reveals the scheduled count by ``torch.topk`` on its full-length confidence vector (LLaDA calls
          it per row, here one call covers the rows: the same indices on CPU, ties included; a block is fully
          masked in every row at its start, so all rows share the schedule). Revealed tokens stay.

        Differences from LLaDA, none of which changes a token: (1) LLaDA's classifier-free guidance without an
        attention mask raises NameError (it reads ``attention_mask_``, only set when a mask is given): here it runs
        without a mask; (2) a step where no row reveals anything (only when ``steps > gen_length``) skips the forward
        but still draws the Gumbel / random-remasking numbers LLaDA draws, so later steps see the same random stream;
        ``nfe`` counts the forwards run (two per step with guidance; LLaDA's NFE is ``steps``), while ``steps`` and
        ``history`` (one canvas per step) count all of LLaDA's steps; (3) EOS comes from ``eos_token_id``
        (default: the model config's, 126081 for LLaDA-8B; the first id of a list) and EoT from ``eot_token_id``
        (default: the model config's ``eot_token_id``, else 126348 as for LLaDA-8B-Instruct) instead of LLaDA's
        constants; (4) ``mask_id`` defaults to the model config's ``mask_token_id``. As in LLaDA the output is the
        full canvas: ``stop_at_eos`` is False (set it to True to pad after the first EOS; the sampling itself is
        unchanged).

        Other keyword arguments are `MaskedDiffusionGenerationConfig` fields (``return_dict_in_generate``,
        ``output_history``, ``pad_token_id``, ...).
        """
        _reject_foreign_params("llada", kwargs)
        values = dict(
            reference="llada",
            max_new_tokens=gen_length,
            steps=steps,
            block_length=block_length,
            temperature=temperature,
            cfg_scale=cfg_scale,
            remasking=remasking,
            logits_eos_inf=logits_eos_inf,
            confidence_eos_eot_inf=confidence_eos_eot_inf,
            mask_token_id=mask_id,
            eos_token_id=eos_token_id,
            eot_token_id=eot_token_id,
            stop_at_eos=False,
        )
        return cls(**{**values, **kwargs})

    @classmethod
    def dream(
        cls,
        max_new_tokens: int,
        steps: int,
        eps: float = 1e-3,
        alg: str = "origin",
        alg_temp: Optional[float] = None,
        temperature: float = 0.0,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        **kwargs: Any,
    ) -> "MaskedDiffusionGenerationConfig":
        r"""Dream's ``diffusion_generate()`` (the Hub's generation_utils.py of Dream-v0), token for token at fp32,
        with its argument names.

        ``model.generate(input_ids, attention_mask=..., generation_config=MaskedDiffusionGenerationConfig.dream(...))``
        (or `diffusion_generate`) returns what ``model.diffusion_generate(input_ids, attention_mask=...,
        max_new_tokens=..., steps=..., eps=..., alg=..., alg_temp=..., temperature=..., top_p=..., top_k=...)``
        returns, given the same ``torch.manual_seed`` (or pass ``generator=``):

        - canvas: the prompt then ``max_new_tokens`` masks; every [MASK] is generated (prompt masks too);
        - padding (an attention mask with a 0): positions ``cumsum(mask) - 1`` with pads at 1, and the boolean
          (B, 1, L, L) mask ``m_i & m_j`` (pads neither attend nor are attended to); otherwise no mask and
          positions 0..L-1;
        - times ``torch.linspace(1, eps, steps + 1)`` in float32 on the canvas' device; step i goes from
          ``t = ts[i]`` to ``s = ts[i + 1]``; logits of the whole canvas, shifted by the model's ``logits_shift``
          (1 for Dream: the token at j is read from the logits at j - 1);
        - proposals (Dream's ``sample_tokens``, on the masked positions in row-major order): logits / temperature
          if temperature > 0; top_p (sorted cumulative softmax > top_p removed, the first token over the threshold
          kept, removed logits set to ``finfo.min``); top_k (logits below the k-th largest set to ``finfo.min``);
          softmax in the model dtype; temperature 0: ``probs.max(-1)`` (confidence and token); temperature > 0: a
          draw from ``Categorical(probs)`` (``torch.multinomial`` of the renormalised probabilities, with Dream's
          fallback to ``probs.max`` when torch.distributions rejects them) and its probability. top_p / top_k apply
          at temperature 0 too. [MASK] can be proposed (it then stays masked);
        - ``alg="origin"``: ``torch.rand(n_masked_total) < 1 - s / t`` (1 at the last step) selects the positions
          revealed (drawn at temperature 0 too), then the selected positions are sampled;
          ``"maskgit_plus"`` (confidence), ``"topk_margin"`` (top-1 minus top-2 probability), ``"entropy"``
          (``sum p log(p + 1e-10)``): every row reveals ``n = int(nm * (1 - s / t))`` positions, ``int(nm)`` at the
          last step, with ``nm`` the float32 *batch-average* mask count, chosen by ``torch.topk`` on the (B, L)
          confidences (-inf where not masked) or, with ``alg_temp`` > 0, by
          ``torch.multinomial(softmax(confidence / alg_temp), n)`` without replacement.

        Differences from Dream, none of which changes a token: a step with ``n == 0`` at temperature 0 (non-origin
        algs; e.g. step 0 when ``steps == max_new_tokens``) skips the forward, which draws no random number there:
        ``nfe`` counts the forwards run (Dream's NFE is ``steps``), ``steps`` and ``history`` (one canvas per step, as
        Dream's ``output_history``) count all of Dream's steps. Dream's sampler has no classifier-free guidance (the CFG
        of Dream's lm-eval wrapper reads an undefined attribute); here ``cfg_scale`` > 0 guides as LLaDA does
        (prompt and pads masked in the unconditional input, ``u + (cfg_scale + 1)(c - u)``), and ``cfg_scale`` 0 is
        exactly Dream. As in Dream the output is the full canvas: ``stop_at_eos`` is False. ``max_new_tokens`` is
        required (Dream's default ``max_length=20`` is not reproduced).

        Other keyword arguments are `MaskedDiffusionGenerationConfig` fields (``return_dict_in_generate``,
        ``output_history``, ``mask_token_id``, ``cfg_scale``, ...).
        """
        _reject_foreign_params("dream", kwargs)
        values = dict(
            reference="dream",
            max_new_tokens=max_new_tokens,
            steps=steps,
            eps=eps,
            alg=alg,
            alg_temp=alg_temp,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop_at_eos=False,
        )
        return cls(**{**values, **kwargs})

    def to_dict(self) -> dict[str, Any]:
        config = super().to_dict()
        # An auto-created config would be reloaded by transformers with its custom keys dropped: never mark it so.
        config.pop("_from_model_config", None)
        if not isinstance(config.get("schedule"), (str, type(None))):
            schedule = config["schedule"]
            config["schedule"] = schedule.to_dict() if hasattr(schedule, "to_dict") else repr(schedule)
        return config

    @classmethod
    def from_any(cls, config: Optional[GenerationConfig]) -> "MaskedDiffusionGenerationConfig":
        """A copy as `MaskedDiffusionGenerationConfig` of any generation config (custom keys of a plain one kept)."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return copy.deepcopy(config)
        values = {k: v for k, v in config.to_dict().items() if k != "_from_model_config"}
        return cls(**values)


def _reject_foreign_params(reference: str, kwargs: dict[str, Any]) -> None:
    for owner, params in _REFERENCE_PARAMS.items():
        foreign = sorted(name for name in params if owner != reference and name in kwargs)
        if foreign:
            raise ValueError(
                f"{', '.join(foreign)}: parameter(s) of MaskedDiffusionGenerationConfig.{owner}(...), not of "
                f"MaskedDiffusionGenerationConfig.{reference}(...)"
            )


def canonical_strategy(name: str) -> str:
    name = STRATEGY_ALIASES.get(name, name)
    if name not in STRATEGIES:
        raise ValueError(
            f"unknown strategy {name!r}: use one of {list(STRATEGIES)} or an alias {sorted(STRATEGY_ALIASES)}"
        )
    return name


@dataclass
class MaskedDiffusionGenerateOutput(ModelOutput):
    """Result of a reverse-diffusion run.

    Args:
        sequences: (B, P + max_new_tokens) prompt and generated tokens.
        steps: denoising steps run (summed over blocks); with a reference preset, the reference's steps, including
            those whose forward was skipped because they reveal nothing.
        nfe: forward passes of the network (classifier-free guidance counts two per step).
        elapsed_s: wall-clock seconds of the run, device synchronised.
        num_generated_tokens: (B,) generated tokens per row (prompt and post-EOS padding excluded).
        tokens_per_forward: generated tokens of the batch per forward pass.
        history: canvases (B, P + max_new_tokens) after each step, with ``output_history``.
    """

    sequences: Optional[torch.LongTensor] = None
    steps: Optional[int] = None
    nfe: Optional[int] = None
    elapsed_s: Optional[float] = None
    num_generated_tokens: Optional[torch.LongTensor] = None
    tokens_per_forward: Optional[float] = None
    history: Optional[tuple[torch.LongTensor, ...]] = None


# ----------------------------------------------------------------------------------------------------------------
# Transfer counts


def time_grid(num_steps: int) -> torch.Tensor:
    """(num_steps + 1,) times 1 = t_0 > t_1 > ... > t_S = 0, float64."""
    return 1.0 - torch.arange(num_steps + 1, dtype=torch.float64) / num_steps


def deterministic_counts(num_masked: torch.Tensor, num_steps: int, schedule: Any) -> torch.Tensor:
    """Tokens revealed at each step of a block: (B, S) from masked counts (B,) at block start.

    floor(m0 * (alpha(s) - alpha(t))) per step, the remainder m0 - sum given one each to the earliest steps.
    For the linear schedule this is LLaDA's rule: m0 // S per step plus one on the first m0 % S steps.
    """
    alphas = schedule.alpha(time_grid(num_steps)).to(torch.float64)
    delta = alphas[1:] - alphas[:-1]
    delta = delta / delta.sum()  # schedules whose alpha(1) is not exactly 0 still reveal everything
    m0 = num_masked.to(torch.float64).cpu()
    base = torch.floor(m0[:, None] * delta[None, :] + 1e-9).long()
    remainder = num_masked.cpu().long() - base.sum(1)
    steps = torch.arange(num_steps)
    extra = (steps[None, :] < (remainder % num_steps)[:, None]).long() + (remainder // num_steps)[:, None]
    return (base + extra).to(num_masked.device)


def reveal_probability(schedule: Any, t: float, s: float) -> float:
    """(alpha(s) - alpha(t)) / (1 - alpha(t)): chance that a position masked at time t is revealed by time s."""
    alpha_t, alpha_s = float(schedule.alpha(t)), float(schedule.alpha(s))
    if s <= 0 or alpha_t >= 1:
        return 1.0
    return min(max((alpha_s - alpha_t) / (1.0 - alpha_t), 0.0), 1.0)


def split_steps(steps: Optional[int], block_counts: list[int]) -> list[int]:
    """Steps per block, proportional to the blocks' masked counts (largest remainder), each non-empty block >= 1.

    ``steps=None`` gives every block as many steps as its count (one token per step).
    """
    if steps is None:
        return list(block_counts)
    nonempty = [i for i, c in enumerate(block_counts) if c > 0]
    out = [0] * len(block_counts)
    if not nonempty:
        return out
    if steps <= len(nonempty):
        for i in nonempty:
            out[i] = 1
        return out
    total = sum(block_counts)
    quotas = {i: steps * block_counts[i] / total for i in nonempty}
    for i in nonempty:
        out[i] = max(1, int(math.floor(quotas[i] + 1e-9)))
    left = steps - sum(out)
    by_remainder = sorted(nonempty, key=lambda i: (-(quotas[i] - math.floor(quotas[i] + 1e-9)), i))
    while left > 0:
        for i in by_remainder[:left]:
            out[i] += 1
        left = steps - sum(out)
    while left < 0:  # the at-least-one rule overshot: take from the largest blocks
        i = max(nonempty, key=lambda j: (out[j], -j))
        out[i] -= 1
        left += 1
    return out


# ----------------------------------------------------------------------------------------------------------------
# The sampler


@dataclass
class _Run:
    """State shared by the steps of one generate call."""

    model: Any
    config: MaskedDiffusionGenerationConfig
    mask_id: int
    shift: int
    schedule: Any
    strategy: str
    processors: LogitsProcessorList
    warpers: LogitsProcessorList
    generator: Optional[torch.Generator]
    pass_logits_to_keep: bool
    per_row_logits: bool  # the model takes logits_to_keep as (B, K) positions per row
    prompt_mask: torch.Tensor  # (B, L) True at prompt tokens (for CFG's unconditional input)
    nfe: int = 0
    steps: int = 0


def _accepts(model: Any, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _model_logits(run: _Run, x: torch.Tensor, attn: Optional[torch.Tensor], keep: torch.Tensor, prompt_mask):
    """Logits predicting the tokens at positions ``keep``, shift and guidance applied: (B, K, V) for columns
    ``keep`` (K,), or for per-row positions ``keep`` (B, K) with models that support it."""
    query = (keep - 1).clamp(min=0) if run.shift else keep
    inputs, mask = x, attn
    if run.config.cfg_scale > 0:
        uncond = x.masked_fill(prompt_mask, run.mask_id)
        inputs = torch.cat([x, uncond])
        mask = None if attn is None else torch.cat([attn, attn])
        query = torch.cat([query, query]) if query.dim() == 2 else query
    kwargs: dict[str, Any] = {}
    if mask is not None:
        kwargs["attention_mask"] = mask
    if run.pass_logits_to_keep:
        kwargs["logits_to_keep"] = query
    logits = run.model(inputs, **kwargs).logits
    if not run.pass_logits_to_keep or logits.shape[1] != query.shape[-1]:
        logits = logits.gather(1, query[..., None].expand(-1, -1, logits.shape[-1])) if query.dim() == 2 else logits[:, query]
    run.nfe += 2 if run.config.cfg_scale > 0 else 1
    if run.config.cfg_scale > 0:
        cond, uncond = logits.chunk(2)
        logits = uncond + (run.config.cfg_scale + 1.0) * (cond - uncond)
    return logits


def _propose(
    run: _Run, logits: torch.Tensor, ids: Optional[torch.Tensor], need_probs: bool = False
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Proposals at N scored positions from their logits (N, V): tokens x0 (N,), their probabilities (N,), and the
    whole distributions (N, V) when sampling or when ``need_probs`` (margin, entropy), else None.

    Probabilities are normalised over the whole vocabulary, [MASK] included (as LLaDA and Dream do); [MASK] itself
    is never proposed. At temperature 0 the probability of the argmax is exp(max - logsumexp): two read-only passes
    over the logits instead of writing a softmax. ``ids`` (N, L) is the canvas row of each position, for user
    logits processors (None when there are none).
    """
    logits = run.processors(ids, logits) if len(run.processors) else logits
    logits = run.warpers(ids, logits) if len(run.warpers) else logits
    if run.config.temperature or need_probs:
        probs = torch.softmax(logits, dim=-1)
        if run.config.temperature:
            sample_probs = probs.clone()
            sample_probs[:, run.mask_id] = 0.0
            x0 = torch.multinomial(sample_probs, 1, generator=run.generator).squeeze(1)
        else:
            logits[:, run.mask_id] = -float("inf")
            x0 = logits.argmax(-1)
        return x0, probs.gather(-1, x0[:, None]).squeeze(1), probs
    log_normaliser = torch.logsumexp(logits, dim=-1)
    logits[:, run.mask_id] = -float("inf")
    top, x0 = logits.max(-1)  # ties: the first index, as argmax
    return x0, torch.exp(top - log_normaliser), None


def _scores(run: _Run, confidence: torch.Tensor, probs: Optional[torch.Tensor], keep: torch.Tensor, length: int):
    """Ranking scores (B, L) of every position (higher = reveal first) from the proposals at columns ``keep``
    (confidence (B, K), probs (B, K, V) for margin and entropy); other columns are -inf."""
    bsz = confidence.shape[0]
    if run.strategy == "random":
        return torch.rand((bsz, length), generator=run.generator, device=confidence.device).to(confidence.dtype)
    full = torch.full((bsz, length), -float("inf"), dtype=confidence.dtype, device=confidence.device)
    if run.strategy == "left_to_right":
        full[:, keep] = -keep.to(confidence.dtype)[None, :].expand(bsz, -1)
        return full
    if run.strategy == "confidence":
        score = confidence
    elif run.strategy == "margin":
        top2 = probs.topk(2, dim=-1).values
        score = top2[..., 0] - top2[..., 1]
    else:  # entropy: negative entropy, higher = more certain
        score = (probs * torch.log(probs + 1e-10)).sum(-1)
    full[:, keep] = score
    return full


def _choose(scores: torch.Tensor, candidates: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: the ``counts`` (B,) best-scored candidate positions of each row (torch.topk's tie order)."""
    chosen = torch.zeros_like(candidates)
    kmax = int(counts.max())
    if kmax == 0:
        return chosen
    idx = torch.topk(scores.masked_fill(~candidates, -float("inf")), kmax, dim=-1).indices
    take = torch.arange(kmax, device=scores.device)[None, :] < counts[:, None]
    return chosen.scatter_(1, idx, take & candidates.gather(1, idx))


def _processor_ids(run: _Run, x: torch.Tensor, rows: torch.Tensor) -> Optional[torch.Tensor]:
    return x[rows] if len(run.processors) else None


def _step(run: _Run, x, attn, block_mask, keep, counts, prompt_mask, steps_left: int) -> None:
    """One denoising step on rows ``x`` (B, L), in place. ``block_mask`` (B, L) marks the current block's masked
    positions, ``keep`` (K,) the columns where any row is masked, ``counts`` (B,) the tokens each row reveals
    (None for the threshold transfer, which decides from the confidences)."""
    remaining = block_mask.sum(1)
    if counts is not None and run.strategy in POSITIONAL_STRATEGIES:
        return _step_positions_first(run, x, attn, block_mask, torch.minimum(counts, remaining), prompt_mask)
    logits = _model_logits(run, x, attn, keep, prompt_mask)
    bsz, k, vocab = logits.shape
    rows = torch.arange(bsz, device=x.device).repeat_interleave(k)
    need_probs = run.strategy in ("margin", "entropy")
    x0, confidence, probs = _propose(run, logits.reshape(bsz * k, vocab), _processor_ids(run, x, rows), need_probs)
    x0, confidence = x0.view(bsz, k), confidence.view(bsz, k)
    probs = probs.view(bsz, k, vocab) if probs is not None else None
    scores = _scores(run, confidence, probs, keep, x.shape[1])
    if counts is None:
        confident = ((confidence >= float(run.config.threshold)) & block_mask[:, keep]).sum(1)
        needed = (remaining + steps_left - 1) // steps_left
        counts = torch.maximum(torch.maximum(confident, needed), (remaining > 0).long())
    chosen = _choose(scores, block_mask, torch.minimum(counts, remaining))[:, keep]  # only kept columns can be chosen
    x[:, keep] = torch.where(chosen, x0, x[:, keep])


def _step_positions_first(run: _Run, x, attn, block_mask, counts, prompt_mask) -> None:
    """A step of a strategy whose choice of positions ignores the proposals (random, left_to_right): choose the
    positions first, then compute logits only at their columns and propose tokens only where they are revealed."""
    if run.strategy == "random":
        scores = torch.rand(x.shape, generator=run.generator, device=x.device)
    else:
        scores = -torch.arange(x.shape[1], device=x.device, dtype=torch.float32).expand(x.shape[0], -1)
    _reveal_rows(run, x, attn, _choose(scores, block_mask, counts), prompt_mask)


def _reveal_rows(run: _Run, x, attn, chosen, prompt_mask) -> None:
    """Propose and write tokens at the ``chosen`` (B, L) positions, running the model only on rows with one."""
    active = chosen.any(1)
    if bool(active.all()):
        return _reveal_chosen(run, x, attn, chosen, prompt_mask)
    sub = active.nonzero().flatten()  # rows never see each other: the others need no forward
    xs = x[sub]
    _reveal_chosen(run, xs, None if attn is None else attn[sub], chosen[sub], prompt_mask[sub])
    x[sub] = xs


def _reveal_chosen(run: _Run, x, attn, chosen, prompt_mask) -> None:
    if run.per_row_logits:
        rows, cols = chosen.nonzero(as_tuple=True)  # row-major
        per_row = chosen.sum(1)
        first = per_row.cumsum(0) - per_row
        slot = torch.arange(rows.numel(), device=x.device) - first[rows]
        positions = cols.new_zeros((x.shape[0], int(per_row.max())))  # unused slots ask for position 0
        positions[rows, slot] = cols
        logits = _model_logits(run, x, attn, positions, prompt_mask)[rows, slot]
    else:
        keep = chosen.any(0).nonzero().flatten()
        rows, k = chosen[:, keep].nonzero(as_tuple=True)
        cols = keep[k]
        logits = _model_logits(run, x, attn, keep, prompt_mask)[rows, k]
    x0 = _propose(run, logits, _processor_ids(run, x, rows))[0]
    x[rows, cols] = x0


def _transfer_counts(run: _Run, num_steps: int, m0: torch.Tensor):
    """``counts(i, block_mask)`` -> (B,) tokens to reveal at step i of a block with masked counts m0 (B,) at
    its start; None for the threshold transfer (decided inside the step)."""
    transfer = run.config.transfer
    if transfer == "deterministic":
        table = deterministic_counts(m0, num_steps, run.schedule)
        return lambda i, block_mask: table[:, i]
    if transfer == "threshold":
        return lambda i, block_mask: None
    grid = time_grid(num_steps).tolist()

    def stochastic(i: int, block_mask: torch.Tensor) -> torch.Tensor:
        remaining = block_mask.sum(1)
        p = reveal_probability(run.schedule, grid[i], grid[i + 1])
        if p >= 1.0:
            return remaining
        probs = torch.full(remaining.shape, p, dtype=torch.float64, device=remaining.device)
        return torch.binomial(remaining.double(), probs, generator=run.generator).long()

    return stochastic


def reveal_steps(schedule: Any, num_steps: int, shape: torch.Size, generator, device) -> torch.Tensor:
    """(B, L) step at which each position is revealed when every masked position is revealed independently with
    probability (alpha(s) - alpha(t)) / (1 - alpha(t)) at each step: drawn once, from
    P(step i) = (alpha(s_i) - alpha(t_i)) / (alpha(0) - alpha(1)) (inverse CDF)."""
    alphas = schedule.alpha(time_grid(num_steps)).to(torch.float64)
    cdf = ((alphas[1:] - alphas[0]) / (alphas[-1] - alphas[0])).to(device)
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)
    return torch.searchsorted(cdf, u, right=True).clamp_(max=num_steps - 1)


def _denoise_block(run: _Run, x, attn, prompt_mask, region, num_steps: int, on_step) -> None:
    """Denoise the masked positions of ``region`` (B, L) in ``num_steps`` steps, in place on ``x`` (B, L)."""
    mask_id = run.mask_id
    if run.config.transfer == "stochastic" and run.strategy == "random":
        # The paper's sampler: every masked position revealed independently with probability
        # (alpha(s) - alpha(t)) / (1 - alpha(t)) at each step (the law of a Binomial count of uniformly random
        # positions). Each position's step is drawn up front, so a step costs one comparison outside the model.
        step_of = reveal_steps(run.schedule, num_steps, x.shape, run.generator, x.device)
        step_of.masked_fill_(~((x == mask_id) & region), -1)
        per_step = torch.bincount(step_of[step_of >= 0], minlength=num_steps).tolist()
        for i in range(num_steps):
            if per_step[i]:
                _reveal_rows(run, x, attn, step_of == i, prompt_mask)
                run.steps += 1
                on_step()
        return
    m0 = ((x == mask_id) & region).sum(1)
    counts_at = _transfer_counts(run, num_steps, m0)
    for i in range(num_steps):
        block_mask = (x == mask_id) & region
        keep = block_mask.any(0).nonzero().flatten()
        if keep.numel() == 0:
            break
        counts = counts_at(i, block_mask)
        if counts is not None and int(counts.max()) == 0:
            continue  # nothing to reveal: skipping the forward changes no token
        _step(run, x, attn, block_mask, keep, counts, prompt_mask, num_steps - i)
        run.steps += 1
        on_step()


def _prepare_canvas(input_ids, attention_mask, config, mask_id):
    if input_ids is None or input_ids.dim() != 2:
        shape = None if input_ids is None else tuple(input_ids.shape)
        raise ValueError(f"input_ids must be a 2-D LongTensor (batch, prompt_length), got shape {shape}")
    bsz, prompt_len = input_ids.shape
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (bsz, prompt_len):
            raise ValueError(
                f"attention_mask must be 2-D (batch, prompt_length) = {(bsz, prompt_len)} like input_ids, "
                f"got {tuple(attention_mask.shape)}"
            )
        attention_mask = attention_mask.to(input_ids.device).bool()
    max_new = config.max_new_tokens
    if max_new is None:
        if config.max_length is not None and config.max_length > prompt_len:
            max_new = config.max_length - prompt_len
        else:
            max_new = 0
    if max_new < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new}")
    x = torch.cat([input_ids, input_ids.new_full((bsz, max_new), mask_id)], dim=1)
    attn = None
    if attention_mask is not None and not bool(attention_mask.all()):
        attn = torch.cat([attention_mask, attention_mask.new_ones((bsz, max_new))], dim=1)
    gen_mask = x == mask_id
    if attn is not None:
        gen_mask &= attn
    return x, attn, gen_mask


def _blocks(gen_mask: torch.Tensor, block_length: Optional[int]) -> list[tuple[int, int]]:
    columns = gen_mask.any(0).nonzero().flatten()
    if columns.numel() == 0:
        return []
    start, end = int(columns[0]), gen_mask.shape[1]
    size = end - start if block_length is None else block_length
    return [(b, min(b + size, end)) for b in range(start, end, size)]


# ----------------------------------------------------------------------------------------------------------------
# Reference samplers (``reference="llada"`` / ``"dream"``): LLaDA's generate() and Dream's diffusion_generate(),
# step for step, with the same random draws in the same order. See MaskedDiffusionGenerationConfig.llada / .dream.


def _reference_logits(run: _Run, x: torch.Tensor, model_kwargs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits (B, L, V) of the whole canvas as the references compute them: the LM head on every position (no
    ``logits_to_keep``, so the logits are those of the reference bit for bit), classifier-free guidance as one call
    on ``[x, x with the prompt and pads masked]`` and ``u + (cfg_scale + 1)(c - u)``, then the model's logits shift;
    on the canvas' device."""
    cfg_scale = run.config.cfg_scale
    inputs, kwargs = x, model_kwargs
    if cfg_scale > 0:
        inputs = torch.cat([x, x.masked_fill(run.prompt_mask, run.mask_id)])
        kwargs = {name: torch.cat([value, value]) for name, value in model_kwargs.items()}
    logits = run.model(inputs, **kwargs).logits
    run.nfe += 2 if cfg_scale > 0 else 1
    if cfg_scale > 0:
        cond, uncond = logits.chunk(2)
        logits = uncond + (cfg_scale + 1) * (cond - uncond)
    if run.shift:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return logits.to(x.device)


def _llada_special_ids(run: _Run) -> tuple[Optional[int], Optional[int]]:
    """EOS and EoT ids for LLaDA's ``logits_eos_inf`` / ``confidence_eos_eot_inf`` (None when neither is set)."""
    config = run.config
    if not (config.logits_eos_inf or config.confidence_eos_eot_inf):
        return None, None
    eos = config.eos_token_id
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    eos = LLADA_EOS_TOKEN_ID if eos is None else int(eos)
    eot = config.eot_token_id
    if eot is None:
        eot = getattr(getattr(run.model, "config", None), "eot_token_id", None)
    eot = LLADA_EOT_TOKEN_ID if eot is None else int(eot)
    return eos, eot


def _llada_sample(run: _Run, x: torch.Tensor, attn: Optional[torch.Tensor], prompt_len: int, record) -> None:
    """LLaDA's generate() on the canvas ``x`` (B, P + gen_length), in place."""
    config, mask_id, generator = run.config, run.mask_id, run.generator
    bsz, length = x.shape
    temperature = float(config.temperature or 0.0)
    random_remasking = config.remasking == "random"
    block_length = config.block_length
    num_blocks = config.max_new_tokens // block_length
    steps_per_block = config.steps // num_blocks
    model_kwargs = {} if attn is None else {"attention_mask": attn}
    eos, eot = _llada_special_ids(run)
    vocab = None
    # LLaDA's schedule comes from each row's mask count in the block at its start. Nothing at or after a block's end
    # is ever revealed, so that count is block_length in every row: one schedule for the batch.
    base, extra = divmod(block_length, steps_per_block)
    schedule = [base + (1 if i < extra else 0) for i in range(steps_per_block)]
    for block in range(num_blocks):
        end = prompt_len + (block + 1) * block_length
        for count in schedule:
            reveal = count > 0
            if reveal or vocab is None:
                logits = _reference_logits(run, x, model_kwargs)
                if vocab is None:
                    vocab = logits.shape[-1]
                    for name, token in (("eos_token_id", eos), ("eot_token_id", eot)):
                        if token is not None and not 0 <= token < vocab:
                            raise ValueError(
                                f"{name}={token} is outside the model's {vocab} logits (LLaDA-8B's id is the "
                                f"default): pass {name}=... to MaskedDiffusionGenerationConfig.llada"
                            )
            # LLaDA's random draws, in its order, also on a step that reveals nothing (its forward is skipped).
            noise = None
            if temperature > 0:
                noise = torch.rand((bsz, length, vocab), dtype=torch.float64, generator=generator, device=x.device)
            remask_scores = None
            if random_remasking:
                remask_scores = torch.rand((bsz, length), generator=generator, device=x.device)
            run.steps += 1
            if reveal:
                _llada_step(run, x, logits, end, count, noise, remask_scores, temperature, eos, eot)
            record(x)


def _llada_step(run, x, logits, end, count, noise, remask_scores, temperature, eos, eot) -> None:
    """One step of LLaDA's generate(), in place: every row reveals ``count`` of its masked positions before the block
    end ``end``."""
    config, mask_id = run.config, run.mask_id
    mask_index = x == mask_id
    keep = mask_index[:, :end].any(0).nonzero().flatten()  # the positions whose confidence can be finite
    logits = logits[:, keep]  # (B, K, V), a copy: LLaDA's in-place writes stay local
    if config.logits_eos_inf:
        logits[..., eos] = -float("inf")
    if temperature > 0:
        gumbel = (-torch.log(noise[:, keep])) ** temperature
        x0 = (logits.to(torch.float64).exp() / gumbel).argmax(-1)
    else:
        x0 = logits.argmax(-1)
    if config.confidence_eos_eot_inf:  # LLaDA's aliasing: EOS only reaches these logits at temperature 0
        if temperature == 0:
            logits[..., eos] = -float("inf")
        logits[..., eot] = -float("inf")
    if remask_scores is not None:
        scores = remask_scores[:, keep]
    else:
        scores = torch.softmax(logits, dim=-1).gather(-1, x0[..., None]).squeeze(-1)
    masked = mask_index[:, keep]
    confidence = torch.full(x.shape, -float("inf"), dtype=scores.dtype, device=x.device)
    confidence[:, keep] = scores.masked_fill(~masked, -float("inf"))
    proposal = x.clone()
    proposal[:, keep] = torch.where(masked, x0, x[:, keep])
    # LLaDA calls topk row by row on these full-length vectors; one call over the rows, with the same k, returns the
    # same indices on CPU (ties included).
    idx = torch.topk(confidence, count, dim=-1).indices
    x.scatter_(1, idx, proposal.gather(1, idx))


def _categorical_sample(probs: torch.Tensor, generator: Optional[torch.Generator]) -> Optional[torch.Tensor]:
    """``torch.distributions.Categorical(probs=probs).sample()`` (N,) with an optional generator: the renormalised
    probabilities, one ``torch.multinomial`` draw with replacement each; None where Categorical would raise (its
    argument validation, when enabled, or the draw itself), on which Dream falls back to ``probs.max``."""
    normalized = probs / probs.sum(-1, keepdim=True)
    if torch.distributions.Distribution._validate_args:
        valid = (normalized >= 0).all(-1) & ((normalized.sum(-1) - 1).abs() < 1e-6)
        if not bool(valid.all()):
            return None
    try:
        return torch.multinomial(normalized, 1, True, generator=generator).view(-1)
    except RuntimeError:
        return None


def _dream_sample_tokens(
    logits: torch.Tensor, temperature: float, top_p, top_k, generator, margin: bool = False, neg_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's ``sample_tokens`` on logits (N, V): (confidence, token), both (N,)."""
    if temperature > 0:
        logits = logits / temperature
    lowest = torch.finfo(logits.dtype).min
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        over = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1) > top_p
        # keep the first token over the threshold: a token goes when the mass *before* it exceeds top_p
        drop_sorted = torch.cat([torch.zeros_like(over[..., :1]), over[..., :-1]], dim=-1)
        drop = torch.zeros_like(over).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, lowest)
    if top_k is not None:
        kth = torch.topk(logits, min(int(top_k), logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, lowest)
    probs = torch.softmax(logits, dim=-1)
    x0 = _categorical_sample(probs, generator) if temperature > 0 else None
    if x0 is None:
        confidence, x0 = probs.max(dim=-1)
    else:
        confidence = probs.gather(-1, x0[:, None]).squeeze(-1)
    if margin:
        top2 = probs.topk(2, dim=-1).values
        confidence = top2[:, 0] - top2[:, 1]
    if neg_entropy:
        confidence = (probs * torch.log(probs + 1e-10)).sum(-1)
    return confidence, x0


def _dream_sample(run: _Run, x: torch.Tensor, attn: Optional[torch.Tensor], prompt_len: int, record) -> None:
    """Dream's diffusion_generate() on the canvas ``x`` (B, P + max_new_tokens), in place."""
    config, mask_id, generator = run.config, run.mask_id, run.generator
    bsz = x.shape[0]
    temperature = float(config.temperature or 0.0)
    alg, alg_temp, steps = config.alg, config.alg_temp, config.steps
    sampling = dict(temperature=temperature, top_p=config.top_p, top_k=config.top_k, generator=generator)
    model_kwargs: dict[str, torch.Tensor] = {}
    if attn is not None:  # Dream's padding: real tokens at 0, 1, ..., pads at 1; pads neither attend nor are attended
        position_ids = attn.long().cumsum(-1) - 1
        position_ids.masked_fill_(~attn, 1)
        model_kwargs = {"attention_mask": attn[:, None, None, :] & attn[:, None, :, None], "position_ids": position_ids}
    timesteps = torch.linspace(1, float(config.eps), steps + 1, device=x.device)
    for i in range(steps):
        mask_index = x == mask_id
        t, s = timesteps[i], timesteps[i + 1]
        last = i == steps - 1
        run.steps += 1
        count = 0
        if alg != "origin":
            average = mask_index.sum() / bsz  # float32, the batch average
            count = int(average) if last else int(average * (1 - s / t))
            if count == 0 and temperature == 0:  # nothing revealed and nothing drawn: the forward changes nothing
                record(x)
                continue
        logits = _reference_logits(run, x, model_kwargs)
        mask_logits = logits[mask_index]
        if alg == "origin":
            x0 = torch.full(mask_logits.shape[:1], mask_id, dtype=torch.long, device=x.device)
            selected = torch.rand(x0.shape, generator=generator, device=x.device) < (1 if last else 1 - s / t)
            if bool(selected.any()):
                x0[selected] = _dream_sample_tokens(mask_logits[selected], **sampling)[1]
            x[mask_index] = x0
        else:
            confidence, x0 = _dream_sample_tokens(
                mask_logits, **sampling, margin=alg == "topk_margin", neg_entropy=alg == "entropy"
            )
            if count > 0:
                full = torch.full(x.shape, -float("inf"), dtype=logits.dtype, device=x.device)
                full[mask_index] = confidence
                if alg_temp:
                    idx = torch.multinomial(torch.softmax(full / alg_temp, dim=-1), count, generator=generator)
                else:
                    idx = torch.topk(full, count, dim=-1).indices
                proposal = torch.full_like(x, mask_id)
                proposal[mask_index] = x0
                x.scatter_(1, idx, proposal.gather(1, idx))
        record(x)


_REFERENCE_SAMPLERS = {"llada": _llada_sample, "dream": _dream_sample}


def _finished_rows(x, gen_mask0, upto, eos_ids, stopping_criteria, still_masked):
    """Rows whose revealed prefix up to column ``upto`` contains EOS or meets a stopping criterion."""
    done = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    if eos_ids is not None:
        region = gen_mask0[:, :upto]
        is_eos = torch.isin(x[:, :upto], eos_ids) & region
        first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full_like(done, upto, dtype=torch.long))
        cols = torch.arange(upto, device=x.device)[None, :]
        masked_before = (still_masked[:, :upto] & (cols < first_eos[:, None])).any(1)
        done |= is_eos.any(1) & ~masked_before
    if stopping_criteria is not None and len(stopping_criteria):
        done |= stopping_criteria(x[:, :upto], None).to(done.device).bool()
    return done


def _finalize_eos(x, gen_mask0, eos_ids, pad_id, unfilled):
    """Tokens after the first generated EOS become ``pad_id`` (in place); returns generated-token counts (B,),
    not counting ``unfilled`` positions (masks of rows that stopped early, set to padding)."""
    keep = gen_mask0 & ~unfilled
    if eos_ids is not None:
        is_eos = torch.isin(x, eos_ids) & gen_mask0
        after = (is_eos.long().cumsum(1) - is_eos.long()) > 0
        after &= gen_mask0
        x.masked_fill_(after, pad_id)
        keep &= ~after
    return keep.sum(1)


class _Streamer:
    """Feeds a transformers streamer with tokens as the leftmost generated prefix of row 0 becomes final."""

    def __init__(self, streamer, x, gen_mask0, mask_id):
        self.streamer, self.mask_id = streamer, mask_id
        if streamer is not None and x.shape[0] != 1:
            raise ValueError("streamer supports batch size 1 only, as in transformers")
        cols = gen_mask0[0].nonzero().flatten() if streamer is not None else None
        self.pos = int(cols[0]) if cols is not None and cols.numel() else x.shape[1]
        if streamer is not None:
            streamer.put(x[0, : self.pos].cpu())

    def update(self, x):
        if self.streamer is None:
            return
        row = x[0, self.pos :]
        masked = (row == self.mask_id).nonzero()
        stop = int(masked[0]) if masked.numel() else row.shape[0]
        if stop > 0:
            self.streamer.put(row[:stop].cpu())
            self.pos += stop

    def end(self, x):
        if self.streamer is not None:
            self.update(x)
            self.streamer.end()


def _resolve_config(model, generation_config, kwargs) -> MaskedDiffusionGenerationConfig:
    base = generation_config if generation_config is not None else getattr(model, "generation_config", None)
    config = MaskedDiffusionGenerationConfig.from_any(base)
    unknown = [k for k in kwargs if not hasattr(config, k)]
    if unknown:
        raise ValueError(
            f"unknown generation argument(s) {unknown}: see MaskedDiffusionGenerationConfig for the accepted fields"
        )
    config.update(**kwargs)
    model_config = getattr(model, "config", None)
    if config.mask_token_id is None:
        config.mask_token_id = getattr(model_config, "mask_token_id", None)
    if config.mask_token_id is None:
        raise ValueError(
            "no mask token id: pass mask_token_id=... or set config.mask_token_id on the model "
            "(e.g. 126336 for LLaDA, 151666 for Dream)"
        )
    for name in ("eos_token_id", "pad_token_id"):
        if getattr(config, name) is None:
            setattr(config, name, getattr(model_config, name, None))
    config.validate_diffusion()
    return config


def logits_shift_of(model: Any, config: Optional[GenerationConfig] = None) -> int:
    """1 if ``model`` predicts position i from hidden state i-1 (Dream), else 0: the generation config's
    ``logits_shift`` if set, else the model config's, else 1 for model_type "Dream"."""
    if config is not None and getattr(config, "logits_shift", None) is not None:
        return int(config.logits_shift)
    model_config = getattr(model, "config", None)
    shift = getattr(model_config, "logits_shift", None)
    if shift is None:
        shift = 1 if getattr(model_config, "model_type", None) == "Dream" else 0
    return int(shift)


def _eos_tensor(config, device) -> Optional[torch.Tensor]:
    eos = config.eos_token_id
    if eos is None or not config.stop_at_eos:
        return None
    eos = [eos] if isinstance(eos, int) else list(eos)
    return torch.tensor(eos, device=device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def diffusion_generate(
    model: Any,
    input_ids: torch.LongTensor,
    attention_mask: Optional[torch.Tensor] = None,
    generation_config: Optional[GenerationConfig] = None,
    logits_processor: Optional[LogitsProcessorList] = None,
    stopping_criteria: Optional[StoppingCriteriaList] = None,
    streamer: Any = None,
    generator: Optional[torch.Generator] = None,
    seed: Optional[int] = None,
    **kwargs: Any,
) -> Union[torch.LongTensor, MaskedDiffusionGenerateOutput]:
    r"""Sample from a masked diffusion LM by reverse diffusion (see the module docstring for the algorithm).

    Args:
        model: any module returning an output with ``.logits`` (B, L, V); ``logits_to_keep`` is used when its
            ``forward`` names it. ``model.config`` supplies ``mask_token_id``, ``eos_token_id``, ``pad_token_id``,
            ``logits_shift`` and ``max_position_embeddings`` unless given here.
        input_ids: (B, P) prompt ids, possibly containing [MASK] tokens to infill.
        attention_mask: (B, P), 0 at padding (left or right); padding is never attended to nor generated.
        generation_config: a `MaskedDiffusionGenerationConfig` (a plain `GenerationConfig` is converted, custom
            keys kept); default ``model.generation_config``. ``**kwargs`` override its fields.
        logits_processor, stopping_criteria: as in transformers; processors see ``input_ids`` = the canvas row
            repeated for every scored position and ``scores`` (B*K, V); stopping criteria are checked between blocks
            on the revealed prefix.
        streamer: a transformers streamer (batch size 1): receives the prompt, then tokens as the leftmost
            generated prefix becomes final.
        generator / seed: randomness for sampling, stochastic transfer and the random strategy.

    Returns:
        (B, P + max_new_tokens) LongTensor, or `MaskedDiffusionGenerateOutput` with ``return_dict_in_generate``.

    Example:

    ```python
    >>> import torch
    >>> from hf_mdm import MDMConfig, MDMForMaskedDiffusion
    >>> from hf_mdm.generation import diffusion_generate
    >>> model = MDMForMaskedDiffusion(MDMConfig(vocab_size=17, mask_token_id=16, hidden_size=32,
    ...                                         num_attention_heads=2, intermediate_size=64))
    >>> out = diffusion_generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=8, steps=4, block_length=4,
    ...                          return_dict_in_generate=True)
    >>> out.sequences.shape, out.nfe
    (torch.Size([1, 11]), 4)
    ```
    """
    config = _resolve_config(model, generation_config, kwargs)
    if generator is None and seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(int(seed))
    mask_id = int(config.mask_token_id)
    x, attn, gen_mask0 = _prepare_canvas(input_ids, attention_mask, config, mask_id)
    model_config = getattr(model, "config", None)
    max_positions = getattr(model_config, "max_position_embeddings", None) or getattr(model_config, "max_sequence_length", None)
    if max_positions is not None and x.shape[1] > max_positions:
        raise ValueError(
            f"prompt ({input_ids.shape[1]}) + max_new_tokens ({x.shape[1] - input_ids.shape[1]}) = {x.shape[1]} "
            f"exceeds the model's max_position_embeddings={max_positions}: shorten one of them"
        )
    if config.reference is not None and (logits_processor or stopping_criteria):
        raise ValueError(
            f"reference={config.reference!r} reproduces its reference sampler, which has no logits processors nor "
            "stopping criteria: drop logits_processor / stopping_criteria, or use the default sampler"
        )
    warpers = LogitsProcessorList()
    if config.temperature and config.reference is None:
        warpers.append(TemperatureLogitsWarper(float(config.temperature)))
        if config.top_k is not None and config.top_k > 0:
            warpers.append(TopKLogitsWarper(int(config.top_k)))
        if config.top_p is not None and config.top_p < 1.0:
            warpers.append(TopPLogitsWarper(float(config.top_p)))
    run = _Run(
        model=model,
        config=config,
        mask_id=mask_id,
        shift=logits_shift_of(model, config),
        schedule=get_schedule(config.schedule, **(config.schedule_kwargs or {})),
        strategy=canonical_strategy(config.strategy),
        processors=logits_processor if logits_processor is not None else LogitsProcessorList(),
        warpers=warpers,
        generator=generator,
        pass_logits_to_keep=_accepts(model, "logits_to_keep"),
        per_row_logits=bool(getattr(model, "supports_per_row_logits_to_keep", False)),
        prompt_mask=~gen_mask0,
    )
    eos_ids = _eos_tensor(config, x.device)
    pad_id = config.pad_token_id if config.pad_token_id is not None else (int(eos_ids[0]) if eos_ids is not None else mask_id)
    history: list[torch.Tensor] = []
    stream = _Streamer(streamer, x, gen_mask0, mask_id)
    if config.reference is None:
        blocks = _blocks(gen_mask0, config.block_length)
        block_counts = [int(gen_mask0[:, s:e].sum(1).max()) for s, e in blocks]
        steps_per_block = split_steps(config.steps, block_counts)
    finished = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)

    _sync(x.device)
    start_time = time.perf_counter()
    if config.reference is not None:

        def record(canvas: torch.Tensor) -> None:
            if config.output_history:
                history.append(canvas.clone())
            stream.update(canvas)

        _REFERENCE_SAMPLERS[config.reference](run, x, attn, input_ids.shape[1], record)
    else:
        for (start, end), num_steps in zip(blocks, steps_per_block):
            if num_steps == 0:
                continue
            rows = (~finished).nonzero().flatten()
            all_rows = rows.numel() == x.shape[0]
            xs = x if all_rows else x[rows]
            attn_s = attn if (attn is None or all_rows) else attn[rows]
            prompt_s = run.prompt_mask if all_rows else run.prompt_mask[rows]
            region = torch.zeros_like(gen_mask0[:1])
            region[:, start:end] = True
            region = region & (gen_mask0 if all_rows else gen_mask0[rows])

            def on_step() -> None:
                if not all_rows and (config.output_history or streamer is not None):
                    x[rows] = xs
                if config.output_history:
                    history.append(x.clone())
                stream.update(x)

            _denoise_block(run, xs, attn_s, prompt_s, region, num_steps, on_step)
            if not all_rows:
                x[rows] = xs
            finished |= _finished_rows(x, gen_mask0, end, eos_ids, stopping_criteria, x == mask_id)
            if bool(finished.all()):
                break
    unfilled = (x == mask_id) & gen_mask0 & finished[:, None]
    x.masked_fill_(unfilled, pad_id)
    num_generated = _finalize_eos(x, gen_mask0, eos_ids, pad_id, unfilled)
    _sync(x.device)
    elapsed = time.perf_counter() - start_time
    stream.end(x)

    if not config.return_dict_in_generate:
        return x
    return MaskedDiffusionGenerateOutput(
        sequences=x,
        steps=run.steps,
        nfe=run.nfe,
        elapsed_s=elapsed,
        num_generated_tokens=num_generated,
        tokens_per_forward=float(num_generated.sum()) / max(run.nfe, 1),
        history=tuple(history) if config.output_history else None,
    )


class MaskedDiffusionGenerationMixin:
    """Gives a model ``generate`` by reverse diffusion (see `diffusion_generate`).

    ``from_pretrained`` loads ``generation_config.json`` as a `MaskedDiffusionGenerationConfig` (transformers'
    own loader would read a plain `GenerationConfig` here and drop the diffusion fields).
    """

    generation_config_class = MaskedDiffusionGenerationConfig

    def adjust_generation_fn(self, generation_config, from_auto_class, from_pipeline, pretrained_model_name_or_path,
                             *args: Any, **kwargs: Any) -> None:
        """Called by ``PreTrainedModel.from_pretrained``: load the checkpoint's generation config, if any."""
        if generation_config is not None:
            self.generation_config = MaskedDiffusionGenerationConfig.from_any(generation_config)
            return
        if pretrained_model_name_or_path is None:
            return
        names = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision", "subfolder")
        loading = dict(zip(names, args))
        loading.update({k: kwargs[k] for k in names if k in kwargs})
        try:
            self.generation_config = MaskedDiffusionGenerationConfig.from_pretrained(
                pretrained_model_name_or_path, **{k: v for k, v in loading.items() if v is not None}
            )
        except OSError:  # no generation_config.json: keep the one built from the model config
            pass

    @torch.no_grad()
    def generate(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        generation_config: Optional[GenerationConfig] = None,
        logits_processor: Optional[LogitsProcessorList] = None,
        stopping_criteria: Optional[StoppingCriteriaList] = None,
        streamer: Any = None,
        generator: Optional[torch.Generator] = None,
        seed: Optional[int] = None,
        **kwargs: Any,
    ) -> Union[torch.LongTensor, MaskedDiffusionGenerateOutput]:
        r"""Generate by reverse diffusion. Arguments as in `hf_mdm.generation.diffusion_generate`.

        Example:

        ```python
        >>> import torch
        >>> from hf_mdm import MDMConfig, MDMForMaskedDiffusion
        >>> model = MDMForMaskedDiffusion(MDMConfig(vocab_size=17, mask_token_id=16, hidden_size=32,
        ...                                         num_attention_heads=2, intermediate_size=64))
        >>> model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, steps=2).shape
        torch.Size([1, 7])
        ```
        """
        return diffusion_generate(
            self,
            input_ids,
            attention_mask=attention_mask,
            generation_config=generation_config,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            streamer=streamer,
            generator=generator,
            seed=seed,
            **kwargs,
        )
