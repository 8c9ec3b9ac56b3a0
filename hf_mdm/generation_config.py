"""Settings of the reverse process: `MaskedDiffusionGenerationConfig`, its validation, and the output dataclass.

The config is a `transformers.GenerationConfig` with the diffusion fields (steps, blocks, schedule, transfer,
strategy, guidance, ...) and the reference samplers' own parameters (`hf_mdm.generation_reference`), serialised
with it. A field is *set* when the instance holds a value for it (given to the constructor or assigned, not None);
an unset field reads its default (a class attribute) and is not serialised; `hf_mdm.generation_resolve` fills the
unset fields of a call's config from the model and the caller. Exported with the model as remote code.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any, Optional

import torch
from transformers import GenerationConfig
from transformers.utils import ModelOutput

from .generation_denoiser import KV_CACHES, check_compile
from .generation_editing import LLaDA21EditingTransfer  # noqa: F401  (registers the llada21_editing transfer)
from .generation_presets import ReferencePresets
from .generation_reference import check_reference_values, validate_reference
from .generation_remask import validate_remdm
from .generation_speculative import validate_speculative
from .generation_strategy import canonical_strategy
from .generation_transfer import TRANSFER_REGISTRY
from .generation_values import is_integer, is_number
from .schedules import get_schedule

_DIFFUSION_DEFAULTS: dict[str, Any] = {
    "steps": None,
    "block_length": None,
    "schedule": "linear",
    "schedule_kwargs": None,
    "transfer": "deterministic",
    "strategy": "confidence",
    "threshold": None,
    "entropy_bound": None,
    "draft_length": None,
    "kv_cache": None,
    "kv_cache_refresh": None,
    "compile_forward": False,
    "batch_invariant": False,
    "remdm": None,
    "remdm_eta": None,
    "remdm_t_on": None,
    "remdm_t_off": None,
    "remdm_alpha_on": None,
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
    # LLaDA2.x generate()'s own behaviour (the llada2 / llada21 presets; usable with any block-causal model)
    "whole_blocks": False,
    "hide_block_tail": False,
    "eos_early_stop": False,
    "finish_at_eos": True,
    "editing_threshold": None,
    "max_post_steps": None,
    "num_to_transfer": None,
    # DiffusionGemma's canvas sampler (the diffusion_gemma preset; uniform-corruption models)
    "max_denoising_steps": None,
    "t_min": None,
    "t_max": None,
    "stability_threshold": None,
    "confidence_threshold": None,
}
# GenerationConfig fields whose default differs here (transformers' own default is None)
_GENERATION_DEFAULTS: dict[str, Any] = {"temperature": 0.0}


def _parent_validate_kwargs(**kwargs: Any) -> dict[str, Any]:
    """The keywords of ``kwargs`` that the installed `GenerationConfig.validate` takes (``user_set_attributes``
    arrived during transformers 5)."""
    return {name: value for name, value in kwargs.items() if name in _PARENT_VALIDATE_PARAMETERS}


_PARENT_VALIDATE_PARAMETERS = frozenset(inspect.signature(GenerationConfig.validate).parameters)


class MaskedDiffusionGenerationConfig(ReferencePresets, GenerationConfig):
    r"""Generation settings of the reverse (denoising) process of a masked diffusion LM.

    Besides the usual `transformers.GenerationConfig` fields (``max_new_tokens``, ``temperature``, ``top_k``,
    ``top_p``, ``eos_token_id``, ``pad_token_id``, ``return_dict_in_generate``), it holds:

    Args:
        steps (`int`, *optional*): denoising steps in total (default: one per masked token). Split over blocks in
            proportion to their masked counts, each block at least one, so fewer steps than blocks runs one step
            per block (a UserWarning says how many run). More steps than masked tokens is allowed: steps that would
            reveal nothing are skipped.
        block_length (`int`, *optional*): semi-autoregressive block size in columns (default: one block; for a
            block-causal model its ``config.block_size``, with blocks counted in positions from 0 and attention
            blocks following the decoding blocks, so it must be a multiple or a divisor of ``block_size``: a
            ValueError otherwise). It need not divide the generation length (the last block is shorter).
        schedule (`str` or schedule object), schedule_kwargs (`dict`): alpha(t), see `hf_mdm.schedules`; default:
            the schedule the model was trained with (its config's ``schedule``), else ``"linear"``.
        transfer (`str`, defaults to ``"deterministic"``): how many positions a step reveals:
            ``"stochastic"``: Binomial(m, (alpha(s) - alpha(t)) / (1 - alpha(t))) of the m still-masked positions
            (with ``strategy="random"`` this is the paper's sampler: each masked position revealed independently);
            ``"deterministic"``: floor(m0 (alpha(s) - alpha(t))) with the remainder given to the earliest steps
            (m0 = masked count at block start; LLaDA's split for the linear schedule);
            ``"threshold"``: every position whose confidence >= ``threshold``, at least one, and at least what the
            remaining steps need to finish the block, so a block never takes more than its steps;
            ``"llada2"`` / ``"llada21_editing"``: LLaDA2.0's / LLaDA2.1's rules (`llada2`, `llada21`);
            ``"entropy_bound"``: the masked positions of the block in the strategy's order while the sum of their
            entropies stays within ``entropy_bound``, at least one (EB-sampler). With ``steps=None`` the two adaptive
            rules run a block until it is done. ``"speculative"``: exact speculative decoding (``draft_length``).
        strategy (`str`, defaults to ``"confidence"``): which positions: ``"random"``, ``"confidence"`` (probability
            of the proposed token), ``"margin"`` (top-1 minus top-2 probability), ``"entropy"`` (lowest entropy
            first) or ``"left_to_right"``. Aliases: ``low_confidence``, ``maskgit_plus`` (confidence),
            ``topk_margin`` (margin), ``origin`` (random).
        threshold (`float`, *optional*): in (0, 1], for ``transfer="threshold"`` (in [0, 1] for the LLaDA2 rules).
        entropy_bound (`float`, *optional*): > 0, nats per step, for ``transfer="entropy_bound"``. A call that sets
            a transfer's own parameter (these two, ``draft_length``, LLaDA2.1's editing fields) under a transfer that
            does not read it is a ValueError (`hf_mdm.generation_transfer.check_transfer_parameters`).
        draft_length (`int`, *optional*): >= 1, for ``transfer="speculative"``: samples the model's left-to-right
            factorisation exactly (at temperature 0 the tokens of ``strategy="left_to_right"`` one token a step) in
            rounds that draft up to ``draft_length`` tokens from the marginals of the last forward and verify them in
            one batched forward (`hf_mdm.generation_speculative`). ``steps`` and ``schedule`` are not read; strategy
            must be unset or ``"left_to_right"``; no ``kv_cache``, ``cfg_scale`` nor ``reference``.
        kv_cache (`str`, *optional*): ``"prefix"`` or ``"dual"``: Fast-dLLM's approximate block caches (see
            `hf_mdm.generation_denoiser`; models with ``supports_diffusion_cache``). The first forward of every block
            runs the whole canvas and keeps every layer's keys/values; the block's later forwards run the block and
            what follows it (prefix) or the block alone (dual) against them. Counts, strategy, threshold,
            temperature, EOS, history and streamer are unchanged; the cache is dropped at the end of the call.
            For a block-causal model (``config.block_size``) the cache is exact and ``"prefix"`` is the default:
            completed blocks' keys/values are computed once and a block's forwards compute only the block; the
            tokens equal ``kv_cache="none"`` (no cache) exactly.
        kv_cache_refresh (`int`, *optional*): a full forward (cache refresh) every ``k`` forwards inside a block
            (default: only at the block's start); ``1`` gives the tokens of ``kv_cache=None``.
        compile_forward (`bool`, defaults to `False`): run the model's forward compiled with ``torch.compile``,
            compiled once per model and kept on it, so later calls reuse the graphs, and the step's proposals
            (processors, softmax, the token drawn) with the same options but ``fullgraph`` and CUDA graphs (the step
            takes fixed shapes inside a block); tokens equal the eager forward's
            (exactly with the ``"eager"`` / ``"aot_eager"`` backends; inductor may reorder float sums). The options
            come from transformers' ``compile_config`` (a `transformers.CompileConfig`: ``fullgraph``, ``dynamic``,
            ``backend``, and for inductor ``mode`` or ``options``; ``dynamic=None`` reads True, one graph for every
            number of positions a step asks logits for); unset, ``dynamic=True`` with inductor's default mode. A
            CUDA-graph mode (``"reduce-overhead"``) needs the model on CUDA. With static shapes (``dynamic=False``,
            or a CUDA-graph mode) a step asks logits at the block's columns, rows that finished stay in the batch
            (their results dropped) and with ``kv_cache`` the keys/values live in buffers written in place (a static
            cache): a few graphs a call (`hf_mdm.generation_static`). ``disable_compile=True`` turns it off
            (`hf_mdm.generation_denoiser.compile_options`).
        batch_invariant (`bool`, defaults to `False`): every row's tokens are those it gets alone, whatever the batch
            size, padding and neighbours, in every dtype and under every sampler and cache: rows of one prompt length
            run as one batch without padding, each drawing from its own seed, where the device's kernels give a row
            the same bits at any number of rows (the CPU in float32, bfloat16 without AMX); elsewhere rows run one
            at a time (`hf_mdm.generation_rows`; a sampler that draws random numbers needs ``seed=``, an integer for
            every row or a list with one per row).
        remdm (`str`, *optional*): ReMDM remasking, ``"cap"``, ``"rescale"``, ``"conf"`` or ``"loop"``
            (`hf_mdm.generation_remask`): the paper's sampler (``transfer="stochastic"``, ``strategy="random"``, which
            may be left unset) where a step may also remask revealed tokens of the current block. Combines with
            blocks, guidance, logits processors and ``kv_cache``; not with a ``reference`` nor a streamer.
        remdm_eta (`float`, *optional*): the remasking rate: in [0, 1] for cap, rescale and conf (conf's default 1),
            in [0, min(1, (1 - alpha_on) / alpha_on)] for loop (required for cap and rescale; loop's default is
            ReMDM's published 0.02).
        remdm_t_on, remdm_t_off (`float`, *optional*): the window of ``remdm="loop"``, 0 < t_off < t_on < 1, given
            together; neither given: ReMDM's published window, t_on 0.55, t_off 0.05 with alpha_on 0.9
            (`hf_mdm.generation_remask.REMDM_LOOP_PUBLISHED`).
        remdm_alpha_on (`float`, *optional*): alpha held on the loop's window, in (0, 1) (ReMDM's published 0.9);
            unset with a window given, alpha(t_on) of the schedule.
        cfg_scale (`float`, defaults to 0): classifier-free guidance; the unconditional input is the canvas with
            the prompt masked, and logits = u + (cfg_scale + 1)(c - u). Costs a second forward per step.
        mask_token_id (`int`, *optional*): [MASK] id (default: the model config's).
        stop_at_eos (`bool`, defaults to `True`): tokens after the first generated EOS become ``pad_token_id``
            (EOS if unset) and rows that finished stop between blocks.
        finish_at_eos (`bool`, defaults to `True`): with ``stop_at_eos``, whether a row whose revealed prefix holds an
            EOS skips the remaining blocks (False: every block is generated, tokens after EOS still padded).
        eos_early_stop (`bool`, defaults to `False`): a row also stops inside a block, at the step that reveals an
            EOS with nothing generated before its first EOS still masked (LLaDA2.0's ``eos_early_stop``).
        whole_blocks (`bool`, defaults to `False`): for a block-causal model, each row's generation runs to the end
            of its last attention block (LLaDA2's canvas of whole blocks); the output keeps the first
            ``max_new_tokens`` generated columns.
        hide_block_tail (`bool`, defaults to `False`): with ``whole_blocks``, the last block's columns past the
            ``max_new_tokens`` generated ones are still generated but never attended to (diffusers'
            ``LLaDA2Pipeline``); False: attended to like the others (LLaDA2's own ``generate()``).
        editing_threshold, max_post_steps, num_to_transfer: LLaDA2.1's token editing (``transfer="llada21_editing"``,
            `hf_mdm.generation_editing`; build it with `llada21`).
        output_history (`bool`, defaults to `False`): keep the canvas after every step (returned with
            ``return_dict_in_generate``).
        logits_shift (`int`, *optional*): 1 if position i is predicted from hidden state i-1 (Dream); default from
            the model config.
        reference (`str`, *optional*): ``"llada"`` or ``"dream"``: run the reference sampler of that model family,
            token for token, instead of the sampler above (``"none"``: the sampler above, even where the model's
            generation config names a reference). Build such a config with `llada` or `dream`, whose
            docstrings give the exact semantics. Its parameters are fields too, serialised with the config:
            ``remasking``, ``logits_eos_inf``, ``confidence_eos_eot_inf``, ``eot_token_id`` (LLaDA) and ``eps``,
            ``alg``, ``alg_temp`` (Dream), read only by their own preset (inert otherwise, as in Dream's published
            generation_config.json, which holds ``alg``, ``eps`` and ``alg_temp``). Their values are checked even
            when inert (``remasking="nope"`` is a ValueError), and a ``generate()`` call that names one without
            selecting its reference is a ValueError too (the call would ignore it). A preset reads ``max_new_tokens``,
            ``steps``, ``temperature``, ``cfg_scale``, ``mask_token_id``, ``eos_token_id`` and, for LLaDA,
            ``block_length``, for Dream ``top_p`` and ``top_k``; the fields of the sampler above (``schedule``,
            ``transfer``, ``strategy``, ...) must keep their defaults (a ValueError says so otherwise).
        max_denoising_steps, t_min, t_max, stability_threshold, confidence_threshold: the canvas sampler of a
            uniform-corruption model (transformers' DiffusionGemma, `hf_mdm.generation_uniform`; build it with
            `diffusion_gemma`, whose docstring gives the semantics), with ``entropy_bound``: at most
            ``max_denoising_steps`` (an integer >= 1, default 48) steps per canvas; the temperature falls linearly
            from ``t_max`` at the first step to ``t_min`` at the last (0 <= t_min < t_max, defaults 0.4 and 0.8); a
            row's canvas stops early once its argmax is unchanged for ``stability_threshold`` steps (an integer >= 0,
            default 1) and the mean entropy of its logits is below ``confidence_threshold`` (>= 0, default 0.005; 0
            turns the stop off, transformers' ``confidence_threshold=None``). Unset, each reads transformers'
            default. Set on a masked diffusion model they are a ValueError, as are the masked sampler's settings on
            a uniform-corruption model (both would be ignored).

    Confidence, margin and entropy are computed from the softmax of the processed logits over the whole vocabulary
    ([MASK] included in the normalisation, as LLaDA and Dream do), before [MASK] is excluded from the proposal.
    """

    def __init__(self, **kwargs: Any):
        given = {key: kwargs.pop(key) for key in _DIFFUSION_DEFAULTS if key in kwargs}
        for key, value in given.items():
            if value is not None:  # None: unset, the field reads its default
                setattr(self, key, copy.deepcopy(value) if isinstance(value, dict) else value)
        super().__init__(**kwargs)
        for name in _GENERATION_DEFAULTS:
            if self.__dict__.get(name) is None:
                self.__dict__.pop(name, None)  # unset: reads the class default

    def explicit_values(self) -> dict[str, Any]:
        """The fields this config sets (see the module docstring): name -> value, None values left out."""
        return {k: v for k, v in vars(self).items() if v is not None and not k.startswith("_")}

    def validate(self, strict: bool = False, user_set_attributes: Optional[set] = None) -> None:
        # GenerationConfig rejects max_new_tokens == 0, which is legal here (pure infilling).
        _check_sampling_values(self)  # before transformers' checks, which compare without checking types
        max_new_tokens = self.max_new_tokens
        # Hidden from transformers' checks: max_new_tokens == 0 is legal here (pure infilling), temperature 0 means
        # argmax and top-k/top-p apply whenever temperature > 0, so its do_sample consistency rules do not apply.
        hidden = {"max_new_tokens": max_new_tokens or None, "temperature": None, "top_k": None, "top_p": None}
        saved = {name: self.__dict__[name] for name in hidden if name in self.__dict__}
        try:
            self.__dict__.update(hidden)
            super().validate(strict=strict, **_parent_validate_kwargs(user_set_attributes=user_set_attributes))
        finally:
            for name in hidden:  # as it was: an unset field stays unset
                self.__dict__.pop(name, None)
            self.__dict__.update(saved)
        self.validate_diffusion()

    def validate_diffusion(self) -> None:
        """Raise a ValueError naming the field for every diffusion setting that cannot run."""
        _check_sampling_values(self)
        if self.steps is not None and (not is_integer(self.steps) or self.steps < 1):
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if self.block_length is not None and (not is_integer(self.block_length) or self.block_length < 1):
            raise ValueError(f"block_length must be an integer >= 1 (or None for one block), got {self.block_length!r}")
        if self.transfer not in TRANSFER_REGISTRY:
            raise ValueError(f"unknown transfer {self.transfer!r}: use one of {list(TRANSFER_REGISTRY)}")
        canonical_strategy(self.strategy)
        get_schedule(self.schedule, **(self.schedule_kwargs or {}))
        if self.transfer == "threshold" and self.threshold is None:  # (its range: _check_sampling_values)
            raise ValueError("transfer='threshold' needs threshold in (0, 1], got None")
        if self.cfg_scale is None:
            raise ValueError("cfg_scale must be a number >= 0 (0 = no guidance), got None")
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be True or False, got {self.batch_invariant!r}")
        if self.logits_shift not in (None, 0, 1):
            raise ValueError(f"logits_shift must be 0, 1 or None, got {self.logits_shift!r}")
        if self.hide_block_tail and not self.whole_blocks:
            raise ValueError(
                "hide_block_tail=True hides the tail of whole_blocks' last block: set whole_blocks=True too"
            )
        self._validate_fast_sampling()
        check_compile(self)
        validate_speculative(self)
        validate_remdm(self)
        self._validate_reference()

    def _validate_fast_sampling(self) -> None:
        if self.transfer == "entropy_bound" and self.entropy_bound is None:
            raise ValueError("transfer='entropy_bound' needs entropy_bound > 0 (nats per step), e.g. entropy_bound=0.5")
        if self.entropy_bound is not None and not float(self.entropy_bound) > 0:
            raise ValueError(f"entropy_bound must be > 0 (nats per step), got {self.entropy_bound!r}")
        if self.kv_cache not in (None, "none") + KV_CACHES:
            raise ValueError(
                f"unknown kv_cache {self.kv_cache!r}: use None, 'none' (no cache, even for a block-causal model) or "
                f"{' or '.join(map(repr, KV_CACHES))}"
            )
        refresh = self.kv_cache_refresh
        if refresh is not None and (isinstance(refresh, bool) or not isinstance(refresh, int) or refresh < 1):
            raise ValueError(f"kv_cache_refresh must be an integer >= 1 (a full forward every k), got {refresh!r}")

    def _validate_reference(self) -> None:
        # Without a reference, its parameters are inert: Dream's published generation_config.json carries alg, eps,
        # alg_temp (and steps), which a Dream checkpoint's default config keeps without selecting the reference.
        if self.reference not in (None, "none"):
            validate_reference(self, _DIFFUSION_DEFAULTS)
        else:
            check_reference_values(self)

    def to_dict(self) -> dict[str, Any]:
        config = super().to_dict()
        # An auto-created config would be reloaded by transformers with its custom keys dropped: never mark it so.
        config.pop("_from_model_config", None)
        if not isinstance(config.get("schedule"), (str, dict, type(None))):
            schedule = config["schedule"]
            config["schedule"] = schedule.to_dict() if hasattr(schedule, "to_dict") else repr(schedule)
        return config

    @classmethod
    def from_any(cls, config: Optional[GenerationConfig]) -> "MaskedDiffusionGenerationConfig":
        """A copy as `MaskedDiffusionGenerationConfig` of any generation config (custom keys of a plain one kept)."""
        if config is None:
            return cls()
        if not isinstance(config, GenerationConfig):
            raise ValueError(
                f"generation_config must be a GenerationConfig (e.g. MaskedDiffusionGenerationConfig(steps=...)), got "
                f"{type(config).__name__}: pass MaskedDiffusionGenerationConfig(**settings) or the settings as keywords"
            )
        if isinstance(config, cls):
            return copy.deepcopy(config)
        values = {k: v for k, v in config.to_dict().items() if k != "_from_model_config"}
        sampler = values.pop("sampler_config", None)  # DiffusionGemma's generation config holds its bound there
        bound = sampler.get("entropy_bound") if isinstance(sampler, dict) else getattr(sampler, "entropy_bound", None)
        if sampler is not None and bound is None:
            raise ValueError(f"sampler_config={sampler!r} names no entropy_bound, the one setting hf_mdm reads from it")
        if bound is not None and values.get("entropy_bound") is None:
            values["entropy_bound"] = float(bound)
        return cls(**values)


for _name, _default in {**_DIFFUSION_DEFAULTS, **_GENERATION_DEFAULTS}.items():
    setattr(MaskedDiffusionGenerationConfig, _name, _default)  # what an unset field reads
del _name, _default
DIFFUSION_FIELDS = tuple(_DIFFUSION_DEFAULTS)


# The LLaDA2 rules reveal what is strictly above the threshold, so 0 is meaningful there (every proposal); the
# threshold transfer reveals what reaches it, where 0 would be every proposal too but is refused as a likely slip.
_ZERO_THRESHOLD = ("llada2", "llada21_editing", "block_refinement")


def _check_sampling_values(config: MaskedDiffusionGenerationConfig) -> None:
    """Types and ranges of the length, token sampling and token id fields (a ValueError naming the field)."""
    transfer = getattr(config, "transfer", None)
    in_range = "a number in [0, 1]" if transfer in _ZERO_THRESHOLD else "a number in (0, 1]"
    checks = (
        ("max_new_tokens", lambda v: is_integer(v) and v >= 0, "an integer >= 0"),
        ("temperature", lambda v: is_number(v) and v >= 0, "a number >= 0 (0 = argmax)"),
        ("top_k", lambda v: is_integer(v) and v >= 0, "an integer >= 0 (0 or None keeps every token)"),
        ("top_p", lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1] (1 or None keeps every token)"),
        ("cfg_scale", lambda v: is_number(v) and v >= 0, "a number >= 0 (0 = no guidance)"),
        ("threshold", lambda v: is_number(v) and (0 < v <= 1 or (v == 0 and transfer in _ZERO_THRESHOLD)), in_range),
        ("editing_threshold", lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
        ("max_post_steps", lambda v: is_integer(v) and v >= 0, "an integer >= 0"),
        ("num_to_transfer", lambda v: is_integer(v) and v >= 1, "an integer >= 1"),
        ("max_denoising_steps", lambda v: is_integer(v) and v >= 1, "an integer >= 1"),
        ("t_min", lambda v: is_number(v) and v >= 0, "a number >= 0"),
        ("t_max", lambda v: is_number(v) and v > 0, "a number > 0 (and > t_min)"),
        ("stability_threshold", lambda v: is_integer(v) and v >= 0, "an integer >= 0"),
        ("confidence_threshold", lambda v: is_number(v) and v >= 0, "a number >= 0 (0: no adaptive stop)"),
        ("draft_length", lambda v: is_integer(v) and v >= 1, "an integer >= 1 (tokens drafted per round)"),
        ("mask_token_id", lambda v: is_integer(v) and v >= 0, "a token id (an integer >= 0)"),
        ("stop_at_eos", lambda v: isinstance(v, bool), "True or False"),
        ("finish_at_eos", lambda v: isinstance(v, bool), "True or False"),
        ("eos_early_stop", lambda v: isinstance(v, bool), "True or False"),
        ("whole_blocks", lambda v: isinstance(v, bool), "True or False"),
        ("hide_block_tail", lambda v: isinstance(v, bool), "True or False"),
    )
    for name, valid, expected in checks:
        value = getattr(config, name, None)
        if value is not None and not valid(value):
            raise ValueError(f"{name} must be {expected}, got {value!r}")


@dataclass
class MaskedDiffusionGenerateOutput(ModelOutput):
    """Result of a reverse-diffusion run.

    Args:
        sequences: (B, P + max_new_tokens) prompt and generated tokens.
        steps: denoising steps run (summed over blocks); with a reference preset, the reference's steps, including
            those whose forward was skipped because they reveal nothing.
        nfe: forward passes of the network (classifier-free guidance counts two per step); with
            ``transfer="speculative"`` the rounds, each one batched forward. When the rows ran alone
            (``batch_invariant``, one seed per row), the rows' forwards summed.
        row_nfe: (B,) each row's forward passes, when the rows ran alone or a uniform-corruption model's rows stopped
            at steps of their own (`hf_mdm.generation_uniform`); else None (every row took part in ``nfe``).
        forward_rows: canvas rows the forward passes ran, summed (guidance's unconditional rows and speculative
            decoding's verification canvases included).
        forward_tokens: positions the forward passes computed, summed (rows x input length of each).
        elapsed_s: wall-clock seconds of the run, device synchronised.
        num_generated_tokens: (B,) generated tokens per row (prompt and post-EOS padding excluded).
        unfinished: (B,) bool, True for a row that still lacks tokens: a position to generate before its first EOS
            was never revealed, because generation stopped early (``max_time``, which also warns, or a stopping
            criterion) or a reference sampler left a proposed [MASK]. Such positions hold ``pad_token_id`` (else
            the first EOS id, else [MASK]).
        tokens_per_forward: generated tokens of the batch per forward pass.
        accepted_per_round: (B,) float, ``transfer="speculative"`` only: each row's drafted tokens accepted per
            round, averaged over the rounds it took part in (its first round drafts nothing and counts as 0). A
            round also draws one token from the target, so a row's tokens per round are this + 1 (EOS padding aside).
        history: canvases (B, P + max_new_tokens) after each step, with ``output_history``.
        scores, logits: with ``output_scores`` / ``output_logits``, one (B, V) tensor per generated column (the
            ``max_new_tokens`` columns after the prompt): the processed scores / raw logits of the step that revealed
            it, -inf where no model call revealed it (`hf_mdm.generation_processors`).
    """

    sequences: Optional[torch.LongTensor] = None
    steps: Optional[int] = None
    nfe: Optional[int] = None
    row_nfe: Optional[torch.LongTensor] = None
    forward_rows: Optional[int] = None
    forward_tokens: Optional[int] = None
    elapsed_s: Optional[float] = None
    num_generated_tokens: Optional[torch.LongTensor] = None
    unfinished: Optional[torch.BoolTensor] = None
    tokens_per_forward: Optional[float] = None
    accepted_per_round: Optional[torch.FloatTensor] = None
    history: Optional[tuple[torch.LongTensor, ...]] = None
    scores: Optional[tuple[torch.FloatTensor, ...]] = None
    logits: Optional[tuple[torch.FloatTensor, ...]] = None
