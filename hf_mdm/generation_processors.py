"""transformers' `GenerationConfig` fields in the reverse process: each one honoured or rejected by name.

A field is *active* when it holds a value other than its neutral one (None, or the value that leaves generation
unchanged, e.g. ``repetition_penalty=1.0``); `check_generation_fields` raises a ValueError naming every active field
the reverse process has no meaning for, with what to use instead. The honoured ones:

- ``do_sample=True`` samples at temperature 1 unless a temperature is given (``temperature`` is the switch here:
  0 = argmax); ``do_sample=True`` with ``temperature=0`` is a ValueError;
- logits processors built from the config, run before the user's ``logits_processor`` and the warpers
  (`config_processors`): ``repetition_penalty`` (tokens anywhere in the canvas, [MASK] excluded),
  ``suppress_tokens``, ``renormalize_logits``, ``remove_invalid_values`` see the canvas row of each scored
  position; ``bad_words_ids`` and ``sequence_bias`` see its *left context* (the revealed tokens before it): a
  position whose left neighbours are all revealed cannot complete a banned / biased sequence; a position with a
  [MASK] among them is left as is;
- ``no_repeat_ngram_size`` holds on the returned sequence in any reveal order (`hf_mdm.generation_ngram`): a token
  that would complete, on either side, an n-gram already in the row is banned, and one step's positions are decided
  in turn (speculative decoding and the reference samplers, which take no processors, refuse it);
- ``min_p``, ``typical_p``, ``epsilon_cutoff``, ``eta_cutoff`` are warpers, as ``top_k`` / ``top_p`` (temperature
  > 0 only);
- ``output_scores`` / ``output_logits``: the processed scores / raw logits (B, V) of each generated column at the
  step that revealed it, one tensor per column (`ScoreRecorder`); a row's entry is -inf where the column was never
  revealed by a model call (EOS padding, a prompt column);
- ``max_time``: transformers' `MaxTimeCriteria`, checked between blocks as every stopping criterion.

Nothing here sees the model; exported with the model as remote code.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TypicalLogitsWarper,
)

from .generation_ngram import NoRepeatNGram

# the value of a field that leaves generation unchanged (besides None), in every transformers 5 release
NEUTRAL: dict[str, Any] = {
    "do_sample": False,
    "num_beams": 1,
    "num_beam_groups": 1,
    "num_return_sequences": 1,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "length_penalty": 1.0,
    "diversity_penalty": 0.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "min_length": 0,
    "min_new_tokens": 0,
    "renormalize_logits": False,
    "remove_invalid_values": False,
    "output_attentions": False,
    "output_hidden_states": False,
    "output_scores": False,
    "output_logits": False,
    "early_stopping": False,
    "low_memory": False,
    "use_cache": True,
    "guidance_scale": 1.0,
    "token_healing": False,
    "is_assistant": False,
    "disable_compile": False,
    "num_assistant_tokens": 20,
    "num_assistant_tokens_schedule": "constant",
    "assistant_confidence_threshold": 0.4,
    "assistant_lookbehind": 10,
    "target_lookbehind": 10,
    "top_k": 50,
    "max_length": 20,
    "use_mtp": False,
}
# transformers' fields the reverse process reads (the diffusion fields are MaskedDiffusionGenerationConfig's own)
HONOURED = frozenset(
    {
        "max_new_tokens",
        "max_length",
        "temperature",
        "top_k",
        "top_p",
        "do_sample",
        "eos_token_id",
        "pad_token_id",
        "bos_token_id",
        "decoder_start_token_id",
        "return_dict_in_generate",
        "output_scores",
        "output_logits",
        "repetition_penalty",
        "no_repeat_ngram_size",
        "suppress_tokens",
        "bad_words_ids",
        "sequence_bias",
        "renormalize_logits",
        "remove_invalid_values",
        "min_p",
        "typical_p",
        "epsilon_cutoff",
        "eta_cutoff",
        "max_time",
        "use_cache",
        "transformers_version",
        "cache_implementation",
        "compile_config",
        "disable_compile",
    }
)
_INSTEAD = {
    "num_beams": "beam search has no counterpart in the reverse process: use num_beams=1",
    "num_return_sequences": "repeat the prompt rows instead (input_ids.repeat_interleave(n, dim=0)) and sample",
    "guidance_scale": "use cfg_scale (classifier-free guidance with the prompt masked)",
    "output_attentions": "call the model's forward with output_attentions=True on the returned sequences",
    "output_hidden_states": "call the model's forward with output_hidden_states=True on the returned sequences",
    "min_new_tokens": "use eos_token_id=None, or stop_at_eos=False, to keep generating past EOS",
    "min_length": "use eos_token_id=None, or stop_at_eos=False, to keep generating past EOS",
    "stop_strings": "pass stopping_criteria=StoppingCriteriaList([StopStringCriteria(tokenizer, strings)])",
}


def is_active(config: Any, name: str) -> bool:
    value = getattr(config, name, None)
    return value is not None and not (name in NEUTRAL and value == NEUTRAL[name])


def check_generation_fields(config: Any, diffusion_fields: tuple[str, ...]) -> None:
    """A ValueError naming every active transformers field that the reverse process would ignore."""
    ignored = [
        name
        for name in sorted(vars(config))
        if not name.startswith("_")
        and name not in HONOURED
        and name not in diffusion_fields
        and is_active(config, name)
    ]
    if ignored:
        hints = "; ".join(f"{name}: {_INSTEAD.get(name, 'unset it')}" for name in ignored)
        values = ", ".join(f"{name}={getattr(config, name)!r}" for name in ignored)
        raise ValueError(f"generate() of a masked diffusion model does not support {values} ({hints})")
    if config.do_sample is True and "temperature" in vars(config) and not config.temperature:
        raise ValueError("do_sample=True asks for sampling but temperature=0 means argmax: drop one of them")
    if config.reference is not None or config.transfer == "speculative":
        extra = [n for n in ("output_scores", "output_logits", *_CONFIG_PROCESSOR_FIELDS) if is_active(config, n)]
        if extra:
            what = f"reference={config.reference!r}" if config.reference is not None else "transfer='speculative'"
            raise ValueError(f"{what} does not take {extra}: unset them, or use the default sampler")


def apply_do_sample(config: Any) -> None:
    """``do_sample=True`` without a temperature given: sample at temperature 1."""
    if config.do_sample is True and vars(config).get("temperature") is None:
        config.temperature = 1.0


_CONFIG_PROCESSOR_FIELDS = (
    "repetition_penalty",
    "no_repeat_ngram_size",
    "suppress_tokens",
    "bad_words_ids",
    "sequence_bias",
    "renormalize_logits",
    "remove_invalid_values",
)


def config_processors(config: Any, mask_id: int) -> tuple[LogitsProcessorList, LogitsProcessorList]:
    """The processors the config's fields ask for: (on the canvas row, on the left context)."""
    canvas, left = LogitsProcessorList(), LogitsProcessorList()
    if is_active(config, "repetition_penalty"):
        canvas.append(_KeepLogit(RepetitionPenaltyLogitsProcessor(float(config.repetition_penalty)), mask_id))
    if is_active(config, "suppress_tokens"):
        canvas.append(SuppressTokensLogitsProcessor(list(config.suppress_tokens)))
    if is_active(config, "remove_invalid_values"):
        canvas.append(InfNanRemoveLogitsProcessor())
    if is_active(config, "bad_words_ids"):
        for width, words in _by_context_width(config.bad_words_ids, len).items():
            left.append(_RevealedContext(NoBadWordsLogitsProcessor(words), width, mask_id))
    if is_active(config, "sequence_bias"):
        for width, biases in _by_context_width(config.sequence_bias, lambda bias: len(bias[0])).items():
            left.append(_RevealedContext(SequenceBiasLogitsProcessor(biases), width, mask_id))
    return canvas, left


def config_ngram(config: Any, mask_id: int) -> Optional[NoRepeatNGram]:
    """``no_repeat_ngram_size``: the bans that hold on the returned sequence in any order (`NoRepeatNGram`)."""
    if not is_active(config, "no_repeat_ngram_size"):
        return None
    return NoRepeatNGram(int(config.no_repeat_ngram_size), mask_id)


def _by_context_width(sequences: list, length: Any) -> dict[int, list]:
    """The sequences grouped by the left context they read (their length - 1)."""
    groups: dict[int, list] = {}
    for sequence in sequences:
        groups.setdefault(length(sequence) - 1, []).append(sequence)
    return groups


def config_warpers(config: Any) -> list[LogitsProcessor]:
    """min-p, typical, epsilon and eta sampling from the config (at temperature > 0, after top-k / top-p), then
    ``renormalize_logits`` (at every temperature: a log-softmax changes neither the argmax nor a probability)."""
    builds = {
        "min_p": MinPLogitsWarper,
        "typical_p": TypicalLogitsWarper,
        "epsilon_cutoff": EpsilonLogitsWarper,
        "eta_cutoff": EtaLogitsWarper,
    }
    warpers = [build(float(getattr(config, name))) for name, build in builds.items() if is_active(config, name)]
    warpers = warpers if config.temperature else []
    return warpers + ([LogitNormalization()] if is_active(config, "renormalize_logits") else [])


def left_context(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, mask_id: int) -> torch.Tensor:
    """(N, L) the tokens before column ``cols[n]`` of row ``rows[n]``, right-aligned, [MASK] on the left."""
    length = x.shape[1]
    index = torch.arange(length, device=x.device)[None, :] - (length - cols)[:, None]
    return torch.where(index >= 0, x[rows[:, None], index.clamp(min=0)], torch.full_like(index, mask_id))


class _RevealedContext(LogitsProcessor):
    """A processor that reads the last ``width`` tokens of its input, applied only where none of them is [MASK]."""

    def __init__(self, processor: LogitsProcessor, width: int, mask_id: int):
        self.processor, self.width, self.mask_id = processor, width, mask_id

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        processed = self.processor(input_ids, scores.clone())
        if self.width <= 0:
            return processed
        revealed = (input_ids[:, -self.width :] != self.mask_id).all(1, keepdim=True)
        return torch.where(revealed, processed, scores)


class _KeepLogit(LogitsProcessor):
    """A processor whose change to one token's logit ([MASK]'s, a placeholder in the canvas) is undone."""

    def __init__(self, processor: LogitsProcessor, token_id: int):
        self.processor, self.token_id = processor, token_id

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        kept = scores[:, self.token_id].clone()
        processed = self.processor(input_ids, scores)
        processed[:, self.token_id] = kept
        return processed


class ScoreRecorder:
    """``output_scores`` / ``output_logits``: per canvas column, the scores and logits (B, V) that revealed it."""

    def __init__(self, batch_size: int, length: int, first_column: int, scores: bool, logits: bool):
        self.shape, self.first_column = (batch_size, length), first_column
        self.want = {"scores": scores, "logits": logits}
        self.buffers: dict[str, Optional[torch.Tensor]] = {"scores": None, "logits": None}

    def record(
        self,
        rows: torch.Tensor,
        cols: torch.Tensor,
        written: Optional[torch.Tensor] = None,
        **values: Optional[torch.Tensor],
    ) -> None:
        """Write the (..., V) ``scores`` / ``logits`` of canvas positions (``rows``, ``cols``) (broadcast to one
        shape); with ``written`` (that shape), only where it is True: fixed shapes, nothing read back."""
        for name, value in values.items():
            if not self.want[name] or value is None:
                continue
            if self.buffers[name] is None:
                self.buffers[name] = value.new_full((*self.shape, value.shape[-1]), -float("inf"))
            buffer = self.buffers[name]
            value = value.to(buffer.dtype)
            if written is not None:
                value = torch.where(written[..., None], value, buffer[rows, cols])
            buffer[rows, cols] = value

    def output(self, name: str, width: Optional[int] = None) -> Optional[tuple[torch.Tensor, ...]]:
        """One (B, V) tensor per generated column, from the first generated column to ``width`` (the returned
        sequences' width; default the canvas'), or None."""
        buffer = self.buffers[name]
        if not self.want[name] or buffer is None:
            return None
        return tuple(buffer[:, self.first_column : width].unbind(1))
