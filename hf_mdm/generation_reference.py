"""The reference samplers of LLaDA and Dream, token for token: their parameters, checks and loops.

A config built with `MaskedDiffusionGenerationConfig.llada` or `.dream` (field ``reference``) replaces the default
sampler's block loop with the loop of LLaDA's ``generate()`` (`llada_sample`) or Dream's ``diffusion_generate()``
(`dream_sample`): the same random draws in the same order, so the same tokens given the same seed. Their exact
semantics are in the docstrings of those two constructors.

`REFERENCE_ARGS` is the one table of what each reference reads (the sampler settings it takes, under its own
names); `REFERENCE_ONLY_ARGS` derives the settings no other sampler reads; `check_llada_lengths` is LLaDA's length
rule as a ValueError. The config, the lm-eval harness and the CLI all read them from here.

Exported with the model as remote code (imports only torch and sibling modules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .generation_denoiser import Denoiser
from .generation_values import is_integer, is_number

REFERENCES = ("llada", "dream")
LLADA_REMASKINGS = ("low_confidence", "random")
DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
# The sampler settings each reference takes, under its own names (besides its length: LLaDA's gen_length, Dream's
# max_new_tokens; and the token ids mask_token_id, eos_token_id, pad_token_id).
REFERENCE_ARGS = {
    "llada": (
        "steps",
        "block_length",
        "temperature",
        "cfg_scale",
        "remasking",
        "logits_eos_inf",
        "confidence_eos_eot_inf",
        "eot_token_id",
    ),
    "dream": ("steps", "eps", "alg", "alg_temp", "temperature", "top_p", "top_k", "cfg_scale"),
}
REFERENCE_TOKEN_ARGS = ("mask_token_id", "eos_token_id", "pad_token_id")
# Settings the default sampler has too; every other setting of a reference is its own.
_SHARED_ARGS = ("steps", "block_length", "temperature", "cfg_scale", "top_p", "top_k")
REFERENCE_ONLY_ARGS = {name: tuple(a for a in args if a not in _SHARED_ARGS) for name, args in REFERENCE_ARGS.items()}
# The default sampler's own fields, which a reference config leaves at their defaults.
SAMPLER_ONLY_FIELDS = (
    "schedule",
    "schedule_kwargs",
    "transfer",
    "strategy",
    "threshold",
    "entropy_bound",
    "kv_cache",
    "kv_cache_refresh",
    "draft_length",
)
# LLaDA's generate() hard-codes LLaDA-8B's ids: EOS <|endoftext|> and EoT <|eot_id|>. The configs take EOS from the
# model config (126081 for LLaDA-8B) and EoT from ``eot_token_id`` (the model config's ``eot_token_id``, else this).
LLADA_EOS_TOKEN_ID = 126081
LLADA_EOT_TOKEN_ID = 126348


def reject_foreign_args(reference: str, kwargs: dict[str, Any]) -> None:
    """A ValueError for settings of the other reference given to ``reference``'s constructor."""
    for owner, params in REFERENCE_ONLY_ARGS.items():
        foreign = sorted(name for name in params if owner != reference and name in kwargs)
        if foreign:
            raise ValueError(
                f"{', '.join(foreign)}: parameter(s) of MaskedDiffusionGenerationConfig.{owner}(...), not of "
                f"MaskedDiffusionGenerationConfig.{reference}(...)"
            )


def check_reference_values(config: Any, reference: Optional[str] = None) -> None:
    """A ValueError naming the field for a value of a reference's own field that its reference cannot take.

    Without ``reference`` (the default sampler, which does not read these fields) a field may be unset (None) or
    hold a valid value, which stays inert: Dream's published generation_config.json carries ``alg``, ``eps`` and
    ``alg_temp`` without selecting the reference. With ``reference`` its own fields must be set."""

    def hint(owner: Optional[str]) -> str:
        return "" if reference or owner is None else f" (read only by the {owner} reference sampler)"

    checks = (
        ("remasking", "llada", lambda v: v in LLADA_REMASKINGS, f"one of {list(LLADA_REMASKINGS)}"),
        ("alg", "dream", lambda v: v in DREAM_ALGS, f"one of {list(DREAM_ALGS)}"),
        ("eps", "dream", lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
        ("alg_temp", "dream", lambda v: v is None or (is_number(v) and v >= 0), "a number >= 0 or None"),
        ("eot_token_id", "llada", lambda v: v is None or (is_integer(v) and v >= 0), "a token id >= 0 or None"),
    )
    for name, owner, valid, expected in checks:
        value = getattr(config, name, None)
        if (value is not None or owner == reference) and not valid(value):
            raise ValueError(f"{name} must be {expected}, got {value!r}{hint(owner)}")


def reject_inert_reference_args(config: Any, kwargs: dict[str, Any]) -> None:
    """A ValueError for a reference's own setting passed to a call that runs the default sampler, which would
    ignore it (a saved config may hold such settings, inert; a call that names one means to use it)."""
    if config.reference is not None:
        return
    for owner, names in REFERENCE_ONLY_ARGS.items():
        given = sorted(name for name in names if kwargs.get(name) not in (None, False))
        if given:
            raise ValueError(
                f"{', '.join(f'{n}={kwargs[n]!r}' for n in given)}: setting(s) of the {owner} reference sampler, which "
                f"this call does not run (reference=None: hf_mdm's sampler, which ignores them). Pass "
                f"reference={owner!r} (or a config from MaskedDiffusionGenerationConfig.{owner}(...)), or drop them and "
                "use strategy= / transfer= / schedule="
            )


def reject_reference_inputs(config: Any, logits_processor: Any, stopping_criteria: Any) -> None:
    """A ValueError for logits processors or stopping criteria given to a reference sampler, which has neither."""
    if config.reference is not None and (logits_processor or stopping_criteria):
        raise ValueError(
            f"reference={config.reference!r} reproduces its reference sampler, which has no logits processors nor "
            "stopping criteria: drop logits_processor / stopping_criteria, or use the default sampler"
        )


def reference_draws(config: Any) -> bool:
    """Whether the reference sampler of ``config`` draws random numbers: LLaDA's Gumbel noise (temperature > 0) and
    random remasking; Dream's token draws (temperature > 0), its ``origin`` reveals and ``alg_temp`` choices."""
    if config.reference == "llada":
        return bool(config.temperature) or config.remasking == "random"
    return bool(config.temperature) or config.alg == "origin" or bool(config.alg_temp)


def validate_reference(config: Any, defaults: dict[str, Any]) -> None:
    """Raise a ValueError naming the field for a reference config that its reference cannot run; ``defaults`` are
    the config's field defaults (the default sampler's own fields must keep them)."""
    reference = config.reference
    if reference not in REFERENCES:
        raise ValueError(f"unknown reference {reference!r}: use one of {list(REFERENCES)} or None")
    for name in SAMPLER_ONLY_FIELDS:
        value = getattr(config, name)
        if value != defaults[name] and not (name == "schedule_kwargs" and not value):
            raise ValueError(
                f"{name}={value!r} does not apply to reference={reference!r}, which follows its reference "
                f"sampler: leave {name} at its default"
                + (" and set remasking=..." if reference == "llada" else " and set alg=...")
            )
    if not isinstance(config.steps, int) or config.steps < 1:
        raise ValueError(f"reference={reference!r} needs steps >= 1, got {config.steps!r}")
    if not isinstance(config.max_new_tokens, int) or config.max_new_tokens < 1:
        name = "gen_length" if reference == "llada" else "max_new_tokens"
        raise ValueError(f"reference={reference!r} needs {name} (max_new_tokens) >= 1, got {config.max_new_tokens!r}")
    (_validate_llada if reference == "llada" else _validate_dream)(config)


def check_llada_lengths(
    gen_length: int,
    steps: int,
    block_length: int,
    length_name: str = "gen_length",
    length_note: str = "",
    where: str = "",
) -> None:
    """LLaDA's generate() asserts ``gen_length % block_length == 0`` and ``steps % num_blocks == 0``: the same rules
    as a ValueError naming what to change (``length_name`` / ``length_note`` / ``where`` word it for the caller)."""
    if gen_length % block_length:
        divisors = [d for d in range(block_length, 0, -1) if gen_length % d == 0][:1] + [gen_length]
        raise ValueError(
            f"LLaDA's generate() needs {length_name} % block_length == 0: {length_name}={gen_length}{length_note}, "
            f"block_length={block_length}. Set block_length{where} to a divisor of {gen_length}, e.g. "
            f"{' or '.join(map(str, dict.fromkeys(divisors)))}, or {length_name} to a multiple of {block_length}"
        )
    num_blocks = gen_length // block_length
    if steps % num_blocks:
        lower, higher = steps - steps % num_blocks, steps + num_blocks - steps % num_blocks
        raise ValueError(
            f"LLaDA's generate() needs steps to be a multiple of the number of blocks: steps={steps}, "
            f"{length_name} // block_length = {gen_length} // {block_length} = {num_blocks} blocks. Set steps{where} "
            f"to {lower or higher}" + (f" or {higher}" if lower else "") + ", or change block_length"
        )


def _validate_llada(config: Any) -> None:
    if config.block_length is None:
        raise ValueError("reference='llada' needs block_length (block_length=gen_length for a single block)")
    check_llada_lengths(config.max_new_tokens, config.steps, config.block_length)
    check_reference_values(config, "llada")
    if config.top_k is not None or config.top_p is not None:
        raise ValueError("LLaDA's generate() has no top_k / top_p: leave them None with reference='llada'")


def _validate_dream(config: Any) -> None:
    if config.block_length is not None:
        raise ValueError("Dream's diffusion_generate() has no blocks: leave block_length None with reference='dream'")
    check_reference_values(config, "dream")
    if config.top_k is not None and (not isinstance(config.top_k, int) or config.top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 or None, got {config.top_k!r}")
    if config.top_p is not None and not 0 < float(config.top_p) <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {config.top_p!r}")


@dataclass
class ReferenceRun:
    """What a reference loop works on: its config, the model call, the canvas (``x`` written in place), the prompt
    width, the random generator and the trace of steps (a `hf_mdm.generation_stopping.Trace`)."""

    config: Any
    denoiser: Denoiser
    canvas: Any
    prompt_length: int
    generator: Optional[torch.Generator]
    trace: Any

    def logits(self, model_kwargs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits (B, L, V) of the whole canvas as the references compute them (`Denoiser.full_logits`)."""
        return self.denoiser.full_logits(self.canvas.x, self.canvas.prompt_mask, model_kwargs)


def run_reference(run: ReferenceRun) -> None:
    """The reference loop of ``run.config.reference`` on the canvas, in place."""
    {"llada": llada_sample, "dream": dream_sample}[run.config.reference](run)


def _llada_special_ids(config: Any, model: Any) -> tuple[Optional[int], Optional[int]]:
    """EOS and EoT ids for LLaDA's ``logits_eos_inf`` / ``confidence_eos_eot_inf`` (None when neither is set)."""
    if not (config.logits_eos_inf or config.confidence_eos_eot_inf):
        return None, None
    eos = config.eos_token_id
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    eos = LLADA_EOS_TOKEN_ID if eos is None else int(eos)
    eot = config.eot_token_id
    if eot is None:
        eot = getattr(getattr(model, "config", None), "eot_token_id", None)
    eot = LLADA_EOT_TOKEN_ID if eot is None else int(eot)
    return eos, eot


def llada_sample(run: ReferenceRun) -> None:
    """LLaDA's generate() on the canvas (B, P + gen_length), in place."""
    config, generator, x = run.config, run.generator, run.canvas.x
    bsz, length = x.shape
    temperature = float(config.temperature or 0.0)
    random_remasking = config.remasking == "random"
    block_length = config.block_length
    num_blocks = config.max_new_tokens // block_length
    steps_per_block = config.steps // num_blocks
    model_kwargs = {} if run.canvas.attn is None else {"attention_mask": run.canvas.attn}
    eos, eot = _llada_special_ids(config, run.denoiser.model)
    vocab = None
    # LLaDA's schedule comes from each row's mask count in the block at its start. Nothing at or after a block's end
    # is ever revealed, so that count is block_length in every row: one schedule for the batch.
    base, extra = divmod(block_length, steps_per_block)
    schedule = [base + (1 if i < extra else 0) for i in range(steps_per_block)]
    for block in range(num_blocks):
        end = run.prompt_length + (block + 1) * block_length
        for count in schedule:
            reveal = count > 0
            if reveal or vocab is None:
                logits = run.logits(model_kwargs)
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
            if reveal:
                _llada_step(run, logits, end, count, noise, remask_scores, temperature, eos, eot)
            run.trace.step(x)


def _llada_step(run: ReferenceRun, logits, end, count, noise, remask_scores, temperature, eos, eot) -> None:
    """One step of LLaDA's generate(), in place: every row reveals ``count`` of its masked positions before the block
    end ``end``."""
    config, mask_id, x = run.config, run.denoiser.mask_id, run.canvas.x
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


def dream_sample(run: ReferenceRun) -> None:
    """Dream's diffusion_generate() on the canvas (B, P + max_new_tokens), in place."""
    config, mask_id, generator = run.config, run.denoiser.mask_id, run.generator
    x, attn = run.canvas.x, run.canvas.attn
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
        count = 0
        if alg != "origin":
            average = mask_index.sum() / bsz  # float32, the batch average
            count = int(average) if last else int(average * (1 - s / t))
            if count == 0 and temperature == 0:  # nothing revealed and nothing drawn: the forward changes nothing
                run.trace.step(x)
                continue
        logits = run.logits(model_kwargs)
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
        run.trace.step(x)
