"""Uniform-corruption canvas sampling: transformers' DiffusionGemma (`DiffusionGemmaForBlockDiffusion`), token for
token.

A uniform-corruption model has no [MASK]: its noise is random tokens. DiffusionGemma is an encoder-decoder: the
encoder writes everything before the canvas into a KV cache, and the decoder denoises a canvas of
``config.canvas_length`` tokens that attends to that cache. `uniform_generate` reads as its outline:

1. encode what the cache lacks (the prompt, then the last canvas) at the positions that follow it;
2. denoise a canvas that starts as ``randint(0, V, (B, C))``; each of at most ``max_denoising_steps`` steps:
   decode the canvas (self-conditioned on the previous step's processed logits), process the logits (the user's
   processors, then the temperature ``t_min + (t_max - t_min) n / N`` at step n = N..1), draw a token at every
   position from their softmax (``multinomial``), accept the drafts at the positions the entropy bound picks
   (`EntropyBoundAcceptance`: re-decided over the whole canvas every step) and renoise the others (``randint``);
   a row stops when its argmax is stable and confident (`StableAndConfident`), the canvas when every row has;
3. append the canvas' argmax (not the canvas), then EOS and padding as transformers' ``_finalize_canvas``:
   tokens after a row's first EOS of a canvas and the canvases of rows that finished before become
   ``pad_token_id``; stop when every row has finished. The EOS and pad ids are, as transformers reads them, the
   call's and the generation configs' (the family's registered sampler settings leave the model config's out).

The random numbers are drawn in transformers' order and shapes (``generator``, else the global generator), so a
`torch.Generator` seeded with s gives on the CPU the tokens of ``torch.manual_seed(s)`` then ``model.generate``.
A step does less than transformers' around the same decoder forward, with the same numbers: the decoder and LM
head called without the model's outer wrappers (`CanvasModel.decode`), the temperature divided in place, the
entropies computed once for the acceptance and the stop (`token_entropy`), the drafts drawn as ``multinomial``
draws them without its checks (`hf_mdm.generation_random.draw_one`), argmaxes read off ``torch.max`` on the CPU
(`hf_mdm.generation_random.first_argmax`), and one host read of the rows done.
Settings a call leaves unset read transformers' defaults (`UNIFORM_DEFAULTS`, its
``_get_default_generation_params``); masked-diffusion settings are a ValueError here (`check_uniform_config`), as
are the uniform ones on a masked model (`uses_uniform_corruption`). Exported with the model as remote code.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from transformers import DynamicCache
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

from .families import DiffusionFacts, facts_of, register_family
from .generation_config import DIFFUSION_FIELDS, MaskedDiffusionGenerateOutput, MaskedDiffusionGenerationConfig
from .generation_processors import HONOURED, is_active
from .generation_random import draw_one, first_argmax
from .generation_stopping import eos_tensor, with_max_time
from .timer import Stopwatch
from .tokens import after_first_eos

__all__ = ["uniform_generate", "uses_uniform_corruption", "check_uniform_config", "UNIFORM_FIELDS", "UNIFORM_DEFAULTS"]
__all__ += ["CanvasModel", "EntropyBoundAcceptance", "StableAndConfident", "LinearTemperature"]

UNIFORM_FIELDS = ("max_denoising_steps", "t_min", "t_max", "stability_threshold", "confidence_threshold")
# transformers' DiffusionGemmaGenerationConfig._get_default_generation_params
UNIFORM_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 256,
    "max_denoising_steps": 48,
    "entropy_bound": 0.1,
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
}
# what the uniform sampler reads besides UNIFORM_FIELDS, and what cannot change its tokens (ids, no-op switches)
_READ = frozenset(
    (*UNIFORM_FIELDS, "entropy_bound", "max_new_tokens", "max_length", "max_time", "stop_at_eos", "eos_token_id")
    + ("pad_token_id", "bos_token_id", "decoder_start_token_id", "mask_token_id", "logits_shift", "use_cache")
    + ("return_dict_in_generate", "disable_compile", "transformers_version")
)


class CanvasModel:
    """The model calls of an encoder-decoder canvas model (DiffusionGemma): `encode` writes new tokens into the
    encoder's KV cache (a `DynamicCache`) at the positions after the cached ones, `decode` returns the logits of a
    canvas placed after them, self-conditioned on the previous step's logits. ``nfe`` counts the decoder forwards
    (the encoder's are not counted, as DiffusionGemma's ``tokens_per_forward`` does not count them)."""

    def __init__(self, model: Any):
        self.model = model
        config = model.config
        self.canvas_length = int(config.canvas_length)
        self.vocab_size = int(config.get_text_config().vocab_size)
        self.embedding_dtype = model.get_input_embeddings().weight.dtype
        self.cache = DynamicCache(config=config.get_text_config(decoder=True))
        self.length, self.nfe = 0, 0  # positions in the cache, decoder forwards
        self._mask, self._positions = None, None
        # transformers named the cache argument past_key_values before 5.2x, cache since (the old name deprecated)
        taken = inspect.signature(model.get_encoder().create_masks_for_generate).parameters
        self._cache = "cache" if "cache" in taken else "past_key_values"
        self._decoder = _plain_decoder(model)

    def encode(self, new_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Write ``new_ids`` (B, n) into the cache; ``attention_mask`` (B, cached + n) is False at padding."""
        model, (batch, n), device = self.model, new_ids.shape, new_ids.device
        positions = torch.arange(self.length, self.length + n, dtype=torch.int32, device=device).unsqueeze(0)
        encoder = model.get_encoder()
        masks = encoder.create_masks_for_generate(
            config=model.config,
            inputs_embeds=torch.empty((batch, n, 0), dtype=model.dtype, device=device),
            attention_mask=attention_mask,
            position_ids=positions,
            **{self._cache: self.cache},
        )
        ids = new_ids.clone(memory_format=torch.contiguous_format)
        encoder(input_ids=ids, attention_mask=masks, position_ids=positions, **{self._cache: self.cache})
        self.length += n
        start = self.length
        self._positions = torch.arange(start, start + self.canvas_length, dtype=torch.int32, device=device)[None]
        canvas_mask = torch.nn.functional.pad(attention_mask, (0, self.canvas_length), value=True)
        self._mask = model.get_decoder().create_diffusion_decoder_attention_mask(
            config=model.config,
            inputs_embeds=torch.zeros((batch, self.canvas_length, 1), dtype=torch.long, device=device),
            decoder_attention_mask=canvas_mask,
            **{self._cache: self.cache},
        )

    def decode(self, canvas: torch.Tensor, self_conditioning: Optional[torch.Tensor]) -> torch.Tensor:
        """The (B, C, V) float32 logits of ``canvas`` (B, C) after the cached tokens. The model's own classes
        unchanged (`_plain_decoder`): its decoder, then the LM head and the soft cap in place on the head's output
        (the operations of ``DiffusionGemmaForBlockDiffusion.forward``, so the same logits, without its wrappers'
        copies); else the model's forward."""
        self.nfe += 1
        inputs = dict(
            decoder_input_ids=canvas,
            self_conditioning_logits=self_conditioning,
            decoder_attention_mask=self._mask,
            decoder_position_ids=self._positions,
            **{self._cache: self.cache},
        )
        if self._decoder is None:
            return self.model(**inputs).logits
        logits = self.model.lm_head(self._decoder(**inputs).last_hidden_state).to(torch.float32)
        cap = self.model.final_logit_softcapping
        return logits if cap is None else logits.div_(cap).tanh_().mul_(cap)

    def random_canvas(self, batch: int, device: Any, generator: Optional[torch.Generator]) -> torch.Tensor:
        """(B, C) tokens uniform over the vocabulary: the noise a canvas starts from and renoising draws."""
        size = (batch, self.canvas_length)
        return torch.randint(0, self.vocab_size, size, device=device, generator=generator)


class LinearTemperature:
    """Logits / (t_min + (t_max - t_min) n / N) at step n (N down to 1), in transformers' float32 arithmetic."""

    def __init__(self, t_min: float, t_max: float, steps: int):
        self.t_min, self.t_max, self.steps = t_min, t_max, steps

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, cur_step: torch.Tensor) -> torch.Tensor:
        return scores / self.temperature(cur_step)

    def temperature(self, cur_step: torch.Tensor) -> torch.Tensor:
        """The 0-dim temperature at ``cur_step`` (an int32 0-dim tensor, as transformers passes it)."""
        return self.t_min + ((self.t_max - self.t_min) * (cur_step / self.steps))


class EntropyBoundAcceptance:
    """Each step keeps the drafts at the k lowest-entropy positions of the canvas, k the most with
    ``sum(entropy) - max(entropy) <= bound`` (at least one), and renoises every other position (EB-sampler,
    arXiv:2505.24857, over the whole canvas: a position accepted at one step is decided again at the next)."""

    def __init__(self, bound: float):
        self.bound = bound

    def accepted(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, C) bool: the positions whose draft is kept, from the processed logits (B, C, V)."""
        return self.accepted_at(token_entropy(logits))

    def accepted_at(self, entropy: torch.Tensor) -> torch.Tensor:
        """(B, C) bool: the positions whose draft is kept, from the (B, C) entropies of the processed logits."""
        sorted_entropy, order = torch.sort(entropy, dim=-1, descending=False)
        keep = torch.cumsum(sorted_entropy, dim=-1) - sorted_entropy <= self.bound
        return torch.scatter(torch.zeros_like(keep), dim=-1, index=order, src=keep)

    def step(self, calls: CanvasModel, canvas, draft, entropy, generator) -> torch.Tensor:
        """The next canvas: the accepted drafts, random tokens elsewhere (drawn after the drafts); ``entropy`` the
        (B, C) entropies of the processed logits. (Every position holds a draft or noise: the canvas is not read.)"""
        accepted = self.accepted_at(entropy)
        noise = calls.random_canvas(canvas.shape[0], canvas.device, generator)
        return torch.where(accepted, draft, noise)


class StableAndConfident:
    """A row's canvas is done when its argmax equals that of each of the last ``stability`` steps (0: always
    stable) and the mean entropy of its processed logits is below ``confidence`` (transformers'
    `StableAndConfidentStoppingCriteria`); `reset` at every canvas."""

    def __init__(self, stability: int, confidence: float):
        self.stability, self.confidence = stability, confidence
        self.history: Optional[torch.Tensor] = None

    def reset(self) -> None:
        self.history = None

    def __call__(self, argmax: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """(B,) bool: the rows stable and confident after this step."""
        return self.at(argmax, token_entropy(logits))

    def at(self, argmax: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
        """`__call__` from the (B, C) entropies of the processed logits."""
        if self.stability == 0:
            stable = torch.ones(entropy.shape[0], device=entropy.device, dtype=torch.bool)
        else:
            if self.history is None:
                self.history = torch.full((self.stability, *argmax.shape), -1, dtype=argmax.dtype, device=argmax.device)
            stable = (self.history == argmax[None]).all(dim=-1).all(dim=0)
            self.history = torch.roll(self.history, shifts=-1, dims=0)
            self.history[-1] = argmax
        return stable & (entropy.mean(dim=-1) < self.confidence)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """The entropies (...) of the softmax of ``logits`` (..., V): the operations of
    ``torch.distributions.Categorical(logits=logits).entropy()`` (the same bits), without its argument checks and
    with two of its copies done in place."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(normalized, dim=-1)
    return -normalized.clamp_(min=torch.finfo(normalized.dtype).min).mul_(probs).sum(-1)


def _plain_decoder(model: Any) -> Any:
    """``model``'s decoder when ``model`` is transformers' `DiffusionGemmaForBlockDiffusion` with its and its inner
    model's ``forward`` unchanged (not overridden, patched nor hooked), else None (the model's forward is called)."""
    try:
        from transformers import DiffusionGemmaForBlockDiffusion, DiffusionGemmaModel
    except ImportError:  # transformers before DiffusionGemma
        return None
    inner = getattr(model, "model", None)
    for module, cls in ((model, DiffusionGemmaForBlockDiffusion), (inner, DiffusionGemmaModel)):
        if not isinstance(module, cls) or type(module).forward is not cls.forward or "forward" in vars(module):
            return None
        if module._forward_hooks or module._forward_pre_hooks:
            return None
    return inner.decoder


def uses_uniform_corruption(model: Any, config: MaskedDiffusionGenerationConfig, seed: Any = None) -> bool:
    """Whether ``model``'s family corrupts with random tokens (`hf_mdm.families.DiffusionFacts.corruption`);
    ValueErrors for the uniform sampler's settings on a masked model and for one seed per row on a uniform one."""
    facts = facts_of(model)
    if facts is None or facts.corruption != "uniform":
        named = [f"{name}={getattr(config, name)!r}" for name in UNIFORM_FIELDS if getattr(config, name) is not None]
        if named:
            raise ValueError(
                f"{', '.join(named)}: settings of the uniform-corruption sampler (DiffusionGemma's), which this masked "
                f"diffusion model ({type(model).__name__}) does not run: unset them and use steps= / transfer= / "
                "strategy= (e.g. transfer='entropy_bound' with entropy_bound=...)"
            )
        return False
    if isinstance(seed, (list, tuple)):
        raise ValueError(
            "one seed per row is not supported for a uniform-corruption model: its rows share the canvas draws, as in "
            "transformers' generate; pass seed=<int> or generator="
        )
    return True


def check_uniform_config(model: Any, config: MaskedDiffusionGenerationConfig) -> None:
    """A ValueError naming every setting of ``config`` that the uniform sampler would ignore (the masked diffusion
    sampler's fields and transformers' sampling fields, when set to anything but their default)."""
    names = [name for name in (*DIFFUSION_FIELDS, *sorted(HONOURED)) if name not in _READ]
    ignored = [name for name in dict.fromkeys(names) if _differs(config, name)]
    if ignored:
        values = ", ".join(f"{name}={getattr(config, name)!r}" for name in ignored)
        raise ValueError(
            f"{values}: setting(s) of the masked diffusion sampler, which a uniform-corruption model "
            f"({type(model).__name__}) does not run: unset them. Its sampler reads max_new_tokens, max_length, "
            f"{', '.join(UNIFORM_FIELDS)}, entropy_bound, eos_token_id, pad_token_id, stop_at_eos and max_time "
            "(MaskedDiffusionGenerationConfig.diffusion_gemma(...))"
        )


def _differs(config: MaskedDiffusionGenerationConfig, name: str) -> bool:
    value = getattr(config, name, None)
    if name in DIFFUSION_FIELDS:
        return value != getattr(MaskedDiffusionGenerationConfig, name)
    return bool(value) if name == "temperature" else is_active(config, name)


def _settings(config: MaskedDiffusionGenerationConfig, prompt_len: int) -> dict[str, Any]:
    """The sampler's settings: the config's, else `UNIFORM_DEFAULTS`; the new tokens as transformers'
    ``_prepare_generated_length`` (``max_length`` counts the prompt and wins over a ``max_new_tokens`` of 256)."""
    values = {name: getattr(config, name) for name in UNIFORM_DEFAULTS}
    settings = {name: UNIFORM_DEFAULTS[name] if value is None else value for name, value in values.items()}
    if config.max_length and settings["max_new_tokens"] == 256:
        settings["max_new_tokens"] = config.max_length - prompt_len
    if settings["max_new_tokens"] < 1:
        raise ValueError(
            f"nothing to generate: {settings['max_new_tokens']} new tokens (max_new_tokens / max_length="
            f"{config.max_length} after a prompt of {prompt_len}): a uniform-corruption model generates whole "
            "canvases, pass max_new_tokens >= 1"
        )
    if not settings["t_max"] > settings["t_min"]:
        raise ValueError(f"t_max must be > t_min (got t_min={settings['t_min']}, t_max={settings['t_max']})")
    return settings


def _stopping(config, stopping_criteria, device) -> tuple[StoppingCriteriaList, Optional[torch.Tensor]]:
    """The user's criteria, ``max_time``, then transformers' MaxLengthCriteria and EosTokenCriteria; the EOS ids."""
    stopping = StoppingCriteriaList(with_max_time(stopping_criteria, config.max_time) or [])
    if config.max_length is not None:
        stopping.append(MaxLengthCriteria(config.max_length))
    eos_ids = eos_tensor(config, device)
    if eos_ids is not None:
        stopping.append(EosTokenCriteria(eos_ids))
    return stopping, eos_ids


@torch.no_grad()
def uniform_generate(
    model: Any,
    input_ids: torch.LongTensor,
    attention_mask: Optional[torch.Tensor],
    config: MaskedDiffusionGenerationConfig,
    generator: Optional[torch.Generator] = None,
    logits_processor: Optional[LogitsProcessorList] = None,
    stopping_criteria: Optional[StoppingCriteriaList] = None,
    streamer: Any = None,
) -> Any:
    r"""Generate with a uniform-corruption canvas model (see the module docstring), as transformers' DiffusionGemma
    ``generate`` does: the same tokens and decoder forwards for the same settings and random stream.

    Args:
        model: a `DiffusionGemmaForBlockDiffusion` (or a model with its encoder/decoder interface).
        input_ids: (B, P) prompt; attention_mask: (B, P), 0 at (left) padding, passed to every call as
            transformers does (positions count from the first column, padding included).
        config: the resolved `MaskedDiffusionGenerationConfig` (`hf_mdm.generation_resolve.resolve_config`).
        generator: the random stream (None: torch's global one).
        logits_processor: applied before the temperature to the (B, C, V) logits, with ``input_ids`` the sequence
            so far and ``cur_step`` (the steps left) as in transformers; stopping_criteria: checked after each
            canvas with ``new_token_length=C``.
        streamer: a transformers streamer: the prompt, each canvas (``put_draft`` with the argmax every step when
            it has one), then ``end()``.

    Returns:
        (B, P + k C) LongTensor, k the canvases run (``ceil(max_new_tokens / C)`` unless every row finished
        before), or `MaskedDiffusionGenerateOutput` with ``return_dict_in_generate``: ``nfe`` the decoder forwards
        run, ``row_nfe`` (B,) those each row took part in before it stopped (DiffusionGemma's count).
    """
    check_uniform_config(model, config)
    settings = _settings(config, input_ids.shape[1])
    batch, device = input_ids.shape[0], input_ids.device
    calls = CanvasModel(model)
    canvases = -(-settings["max_new_tokens"] // calls.canvas_length)
    mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    temperature = LinearTemperature(settings["t_min"], settings["t_max"], settings["max_denoising_steps"])
    stop = StableAndConfident(settings["stability_threshold"], settings["confidence_threshold"])
    stop = stop if settings["confidence_threshold"] != 0 else None  # 0: transformers' confidence_threshold=None
    acceptance = EntropyBoundAcceptance(float(settings["entropy_bound"]))
    run = _Run(calls, acceptance, stop, (LogitsProcessorList(logits_processor or []), temperature), generator, streamer)
    stopping, eos_ids = _stopping(config, stopping_criteria, device)
    sequence, new_ids = input_ids, input_ids
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    row_nfe = torch.zeros(batch, dtype=torch.long, device=device)
    if streamer is not None:
        streamer.put(input_ids.cpu())
    with Stopwatch(device) as watch:
        for _ in range(canvases):
            # 1. the cache gets what it lacks: the prompt, then the last canvas
            calls.encode(new_ids, mask)
            # 2. a canvas of random tokens denoised; its argmax appended
            new_ids = run.denoise(sequence, finished, row_nfe, settings["max_denoising_steps"])
            sequence = torch.cat([sequence, new_ids], dim=-1)
            # 3. EOS and padding; the loop ends when every row has finished
            sequence, finished = _finalize_canvas(sequence, finished, stopping, calls.canvas_length, eos_ids, config)
            new_ids = sequence[:, -calls.canvas_length :]
            if streamer is not None:
                streamer.put(new_ids.cpu())
            if bool(finished.all()):
                break
            mask = torch.nn.functional.pad(mask, (0, calls.canvas_length), value=True)
    if streamer is not None:
        streamer.end()
    if not config.return_dict_in_generate:
        return sequence
    return _output(sequence, input_ids.shape[1], calls, row_nfe, config.pad_token_id, watch.seconds)


class _Run:
    """The denoising of one canvas (step 2 of the outline), with the pieces the canvases share: ``processors`` the
    user's `LogitsProcessorList` and the `LinearTemperature` applied after it (as transformers appends it)."""

    def __init__(self, calls, acceptance, stop, processors, generator, streamer):
        self.calls, self.acceptance, self.stop = calls, acceptance, stop
        self.processors, self.temperature = processors
        self.generator, self.streamer = generator, streamer

    def denoise(self, sequence, finished, row_nfe, steps: int) -> torch.Tensor:
        """The canvas' argmax (B, C) after at most ``steps`` steps; ``row_nfe`` counts each row's forwards. One host
        read a step, of the rows done (none without the adaptive stop)."""
        calls, stop = self.calls, self.stop
        batch, device = sequence.shape[0], sequence.device
        canvas = calls.random_canvas(batch, device, self.generator)
        argmax, conditioning = canvas, None
        done, any_done = torch.zeros(batch, dtype=torch.bool, device=device), False
        if stop is not None:
            stop.reset()
        for cur_step in range(steps, 0, -1):  # the steps left, N..1
            row_nfe += ~(done | finished)
            new_canvas, new_argmax, logits, entropy = self._step(sequence, canvas, conditioning, cur_step)
            if stop is not None:
                if any_done:  # rows done keep their argmax, canvas and conditioning
                    new_argmax = torch.where(done[:, None], argmax, new_argmax)
                    new_canvas = torch.where(done[:, None], canvas, new_canvas)
                    logits = torch.where(done[:, None, None], conditioning, logits)
                # a row not done has the entropies of its new logits; a row done stays done whatever its are
                done |= stop.at(new_argmax, entropy)
            canvas, argmax, conditioning = new_canvas, new_argmax, logits.to(calls.embedding_dtype)
            self._draft(argmax, conditioning)
            if stop is not None:
                rows_done = done.tolist()
                any_done = any(rows_done)
                if all(rows_done):
                    break
        return argmax

    def _step(self, sequence, canvas, conditioning, cur_step: int) -> tuple:
        """One denoising step of every row: the next canvas, the argmax, the processed logits and their entropies,
        the random numbers drawn in transformers' order (the drafts, then the noise)."""
        calls, generator = self.calls, self.generator
        step = torch.tensor(cur_step, device=canvas.device, dtype=torch.int32)
        raw = calls.decode(canvas, conditioning)
        logits = self.processors(sequence, raw, cur_step=step) if self.processors else raw
        temperature = self.temperature.temperature(step)
        logits = logits.div_(temperature) if logits is raw else logits / temperature  # the decoder's own: in place
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        draft = draw_one(probs.view(-1, calls.vocab_size), generator).view(canvas.shape)
        argmax = first_argmax(logits)
        entropy = token_entropy(logits)
        return self.acceptance.step(calls, canvas, draft, entropy, generator), argmax, logits, entropy

    def _draft(self, argmax: torch.Tensor, logits: torch.Tensor) -> None:
        """A draft-aware streamer's ``put_draft``: the argmax, or the logits when it takes them."""
        if self.streamer is None or not hasattr(self.streamer, "put_draft"):
            return
        takes_logits = getattr(self.streamer, "_takes_logits", False)
        self.streamer.put_draft(**({"logits": logits.cpu()} if takes_logits else {"value": argmax.cpu()}))


def _finalize_canvas(sequence, finished, stopping, canvas_length: int, eos_ids, config):
    """transformers' ``_finalize_canvas``: rows that met a criterion on the new canvas finish; with a
    ``pad_token_id``, the canvas of rows finished before and the tokens after a new canvas' first EOS become it."""
    finished_now = stopping(sequence, None, new_token_length=canvas_length)
    before, finished = finished, finished | finished_now
    pad_id = config.pad_token_id
    if pad_id is not None and bool(finished.any()):
        sequence[before, -canvas_length:] = pad_id
        if eos_ids is not None and bool(finished_now.any()):
            new = sequence[:, -canvas_length:]
            new[after_first_eos(new, eos_ids)] = pad_id
    return sequence, finished


def _output(sequence, prompt_len: int, calls: CanvasModel, row_nfe, pad_id, seconds: float):
    new = sequence[:, prompt_len:]
    generated = (new != pad_id).sum(dim=-1) if pad_id is not None else torch.full_like(row_nfe, new.shape[1])
    batch = sequence.shape[0]
    return MaskedDiffusionGenerateOutput(
        sequences=sequence,
        steps=calls.nfe,
        nfe=calls.nfe,
        row_nfe=row_nfe,
        forward_rows=calls.nfe * batch,
        forward_tokens=calls.nfe * batch * calls.canvas_length,
        elapsed_s=seconds,
        num_generated_tokens=generated,
        unfinished=torch.zeros(batch, dtype=torch.bool, device=sequence.device),
        tokens_per_forward=float(generated.sum()) / max(calls.nfe, 1),
    )


# transformers' DiffusionGemma generate reads the EOS and pad ids from its generation config only (the call's, the
# model's): the model config's are no default of this family's sampler (a caller's tokenizer still gives them)
_IDS_FROM_GENERATION_CONFIG = (("eos_token_id", None), ("pad_token_id", None))
register_family("diffusion_gemma", DiffusionFacts(corruption="uniform", sampler=_IDS_FROM_GENERATION_CONFIG))
