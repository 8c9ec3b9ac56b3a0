"""lm-eval models: ``hf_mdm`` (masked diffusion LMs) and ``hf_timed`` (lm-eval's HF causal LM), both timed.

Both subclass lm-eval's `HFLM`, so loading (``pretrained``, ``dtype``, ``device``, ``trust_remote_code``,
``parallelize``, ``peft``, ...), tokenisation, chat templates and data parallelism under ``accelerate launch``
are lm-eval's own. They share one ``generate_until``: requests grouped by their generation kwargs, sorted by
prompt length (longest first, as lm-eval does), batched with left padding, generated, decoded and cut at the
request's own stop strings (``until`` plus EOS); every batch is timed (see `hf_mdm.harness.timing`).

``hf_mdm`` loads any masked diffusion checkpoint with ``AutoModelForMaskedLM`` (hf_mdm's own models and the
native LLaDA / Dream classes, registered on ``import hf_mdm``; other checkpoints through their remote code with
``trust_remote_code=True``) and samples with `hf_mdm.generation.diffusion_generate`. Every field of
`MaskedDiffusionGenerationConfig` is a model argument (``steps``, ``block_length``, ``schedule``, ``transfer``,
``strategy``, ``threshold``, ``temperature``, ``top_k``, ``top_p``, ``cfg_scale``, ``logits_shift``,
``mask_token_id``, ``stop_at_eos``, ``reference``, ...), on top of the checkpoint's generation config. A
request's generation kwargs (``--gen_kwargs``) override the diffusion settings; ``temperature``, ``top_k``,
``top_p`` and ``max_gen_toks`` given as model arguments win over the request's (every lm-eval task sets
temperature 0 through ``do_sample: false``, and a generation length per task). ``loglikelihood`` is the Monte
Carlo ELBO of LLaDA and Dream.

LLaDA and Dream checkpoints are sampled by their reference samplers (model argument ``preset``, default ``auto``:
``llada`` for model_type "llada", ``dream`` for "Dream", else ``none``, hf_mdm's own sampler): each request runs
`MaskedDiffusionGenerationConfig.llada` / `.dream` with LLaDA's ``generate()`` / Dream's ``diffusion_generate()``
arguments taken from the model arguments (see `MaskedDiffusionLM`). The tokenizer's pad token (used for left
padding) is never the [MASK] id: a tokenizer without one pads with EOS.

On CPU, ``accelerate launch`` with several processes (``ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu
--num_processes N``) gives lm-eval's HFLM no rank (it counts GPUs); these models take rank and world size from
accelerate, so requests are sharded on CPU as on GPUs.
"""

from __future__ import annotations

import abc
import copy
import hashlib
import json
import logging
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
import transformers
from lm_eval import utils as lm_eval_utils
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from ..generation import MaskedDiffusionGenerationConfig, diffusion_generate, logits_shift_of
from .timing import RequestTag, Stopwatch, TimingRecorder, tag_requests

__all__ = ["MaskedDiffusionLM", "TimedHFLM", "StopStringCriteria", "tokens_until_stop", "PRESETS"]

logger = logging.getLogger(__name__)

# Request generation kwargs that are not generation-config fields of a masked diffusion model.
_LM_EVAL_ONLY_KWARGS = ("do_sample",)


def diffusion_fields() -> frozenset[str]:
    """Fields of `MaskedDiffusionGenerationConfig` that a plain `GenerationConfig` does not have."""
    return frozenset(vars(MaskedDiffusionGenerationConfig())) - frozenset(vars(GenerationConfig()))


_SAMPLING_FIELDS = frozenset({"temperature", "top_k", "top_p", "eos_token_id", "pad_token_id"})
# Model arguments that win over a request's value: lm-eval tasks always carry temperature (do_sample: false).
_EXPLICIT_WINS = frozenset({"temperature", "top_k", "top_p"})

PRESETS = ("auto", "llada", "dream", "none")
# preset="auto": the reference sampler of the checkpoint's model_type (anything else: hf_mdm's sampler, "none").
PRESET_OF_MODEL_TYPE = {"llada": "llada", "Dream": "dream"}
# The sampler settings each preset takes (model arguments or --gen_kwargs), under the reference's own names, mapped
# onto MaskedDiffusionGenerationConfig.llada(gen_length=max_gen_toks, ...) / .dream(max_new_tokens=max_gen_toks, ...).
PRESET_ARGS = {
    "llada": ("steps", "block_length", "temperature", "cfg_scale", "remasking", "logits_eos_inf",
              "confidence_eos_eot_inf", "eot_token_id"),
    "dream": ("steps", "eps", "alg", "alg_temp", "temperature", "top_p", "top_k", "cfg_scale"),
}  # fmt: skip
# Token ids every preset takes (the preset's defaults come from the model config).
_PRESET_COMMON = ("mask_token_id", "eos_token_id", "pad_token_id")
# Settings that only a reference sampler reads (inert for hf_mdm's sampler).
_REFERENCE_ONLY = frozenset(PRESET_ARGS["llada"] + PRESET_ARGS["dream"]) - frozenset(
    {"steps", "block_length", "temperature", "cfg_scale", "top_p", "top_k"}
)


def tokens_until_stop(tokenizer: Any, tokens: Sequence[int], stops: Sequence[str]) -> int:
    """Length of the shortest prefix of ``tokens`` whose text contains a stop string (all of them if none does)."""
    stops = [s for s in stops if s]
    tokens = list(tokens)

    def stopped(n: int) -> bool:
        text = tokenizer.decode(tokens[:n], skip_special_tokens=False)
        return any(s in text for s in stops)

    if not stops or not tokens or not stopped(len(tokens)):
        return len(tokens)
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if stopped(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class StopStringCriteria(StoppingCriteria):
    """Stop rows whose generated text (after the prompt columns) contains a stop string.

    The masked diffusion sampler checks stopping criteria between blocks on the revealed prefix, so with
    ``block_length`` set, rows that wrote a stop string skip their remaining blocks (their answer is cut there).
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str], prompt_width: int):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_width :], skip_special_tokens=True)
        done = [any(s in text for s in self.stops) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class _TimedGeneration:
    """``generate_until`` with per-batch timing, shared by both models; subclasses implement `_generate_batch`."""

    timing: TimingRecorder
    _explicit_max_gen_toks: Optional[int] = None

    def _init_timing(self) -> None:
        self._use_accelerate_rank()
        self.timing = TimingRecorder(rank=self.rank)

    def _use_accelerate_rank(self) -> None:
        """Rank and world size from accelerate: HFLM sets them only when it sees several GPUs (so not on CPU) and
        uses the node-local index as rank (so not across nodes)."""
        accelerator = getattr(self, "accelerator", None)
        if accelerator is not None and accelerator.num_processes > 1:
            self._rank = accelerator.process_index
            self._world_size = accelerator.num_processes

    # -- batching --------------------------------------------------------------------------------------------

    def _generation_batches(self, requests: Sequence[Any]) -> list[list[int]]:
        """Indices of requests per batch: grouped by generation kwargs, longest prompt first."""
        groups: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            key = json.dumps(request.args[1], sort_keys=True, default=str)
            groups.setdefault(key, []).append(index)
        batch_size = self._resolved_batch_size()
        batches = []
        for indices in groups.values():
            lengths = {i: len(self.tok_encode(requests[i].args[0])) for i in indices}
            ordered = sorted(indices, key=lambda i: (-lengths[i], requests[i].args[0]))
            batches += [ordered[s : s + batch_size] for s in range(0, len(ordered), batch_size)]
        return batches

    def _resolved_batch_size(self) -> int:
        if str(self.batch_size).startswith("auto"):
            if not getattr(self, "_auto_batch_size", None):
                self._auto_batch_size = self._detect_batch_size()
            return self._auto_batch_size
        return max(1, int(self.batch_size))

    # -- generate_until --------------------------------------------------------------------------------------

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        """Generate for lm-eval ``Instance``s with ``args = (context, gen_kwargs)``; texts in request order."""
        results: list[Optional[str]] = [None] * len(requests)
        tags = tag_requests(requests)
        progress = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="generate_until")
        for batch in self._generation_batches(requests):
            contexts = [requests[i].args[0] for i in batch]
            gen_kwargs = requests[batch[0]].args[1]
            texts = self._generate_texts(contexts, gen_kwargs, [tags[i] for i in batch])
            for index, text in zip(batch, texts):
                results[index] = text
                self.cache_hook.add_partial("generate_until", requests[index].args, text)
            progress.update(len(batch))
        progress.close()
        return results  # type: ignore[return-value]

    def _generate_texts(self, contexts: Sequence[str], gen_kwargs: dict, tags: Sequence[RequestTag]) -> list[str]:
        """Encode, generate, decode and cut one batch; record its timing."""
        kwargs = dict(normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        max_gen_toks = int(kwargs.pop("max_gen_toks"))
        if self._explicit_max_gen_toks is not None:
            max_gen_toks = self._explicit_max_gen_toks
        with Stopwatch(self.device) as watch:
            input_ids, attention_mask = self.tok_batch_encode(
                list(contexts), left_truncate_len=self._max_prompt_length(max_gen_toks), truncation=self.truncation
            )
            input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
            generation = self._generate_batch(input_ids, attention_mask, until, max_gen_toks, kwargs)
            rows = generation["tokens"].tolist()
            texts = [self._postprocess(self.tok_decode(self._after_thinking(row)), until) for row in rows]
            output_tokens = [tokens_until_stop(self.tokenizer, row[:n], until)
                             for row, n in zip(rows, generation["generated_tokens"])]  # fmt: skip
        self.timing.add_batch(
            tags,
            batch_time_s=watch.seconds,
            generate_s=generation["generate_s"],
            nfe=generation["nfe"],
            generated_tokens=generation["generated_tokens"],
            output_tokens=output_tokens,
        )
        return texts

    def _after_thinking(self, row: list[int]) -> list[int]:
        """HFLM's ``think_end_token`` given as a token id: keep the tokens after its last occurrence."""
        token = self.think_end_token
        if isinstance(token, int) and token in row:
            return row[len(row) - row[::-1].index(token) :]
        return row

    def _postprocess(self, text: str, until: list[str]) -> str:
        """Cut at the first stop string (and after a string ``think_end_token``), as HFLM does."""
        if isinstance(self.think_end_token, int):
            text = text.lstrip()
        think_end = self.think_end_token if isinstance(self.think_end_token, str) else None
        return postprocess_generated_text(generation=text, stop=until, think_end_token=think_end)

    def _max_prompt_length(self, max_gen_toks: int) -> int:
        length = self.max_length - max_gen_toks
        if length <= 0:
            raise ValueError(
                f"max_gen_toks={max_gen_toks} leaves no room for the prompt in the model's max_length="
                f"{self.max_length}: lower max_gen_toks (model arg or --gen_kwargs) or raise max_length"
            )
        return length

    @abc.abstractmethod
    def _generate_batch(
        self, input_ids: torch.LongTensor, attention_mask: torch.Tensor, until: list[str], max_gen_toks: int,
        kwargs: dict,
    ) -> dict[str, Any]:  # fmt: skip
        """Generate for one left-padded batch. Returns ``tokens`` (B, T) after the prompt, ``generate_s`` (the
        model's own generation seconds), ``nfe`` (forward passes of the batch) and per-row ``generated_tokens``."""

    def _autocast(self) -> torch.autocast:
        """HFLM's ``mixed_precision_dtype`` autocast (a no-op when unset)."""
        dtype = self.mixed_precision_dtype
        return torch.autocast(device_type=self.device.type, dtype=dtype, enabled=dtype is not None)

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info["timing"] = "hf_mdm.harness.timing: wall-clock per batch, device synchronised"
        return info


@register_model("hf_timed")
class TimedHFLM(_TimedGeneration, HFLM):
    """lm-eval's ``hf`` model (autoregressive, ``AutoModelForCausalLM``) with per-request timing.

    Takes every argument of lm-eval's ``hf`` model, and ``max_gen_toks`` (wins over the request's). Each batch is
    generated with lm-eval's own ``_model_generate`` (``model.generate`` with its stop-sequence criteria, KV cache
    on); its NFE is the number of decoding steps of the batch (one forward pass each), and a row's generated tokens
    stop at its EOS or at the token that completed one of its stop strings.
    """

    def __init__(self, *args: Any, max_gen_toks: Optional[int] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._explicit_max_gen_toks = None if max_gen_toks is None else int(max_gen_toks)
        self._init_timing()

    @property
    def max_gen_toks(self) -> int:
        """Tokens to generate: the ``max_gen_toks`` model argument if given (it wins over the request's), else the
        request's, else 256 (lm-eval's default)."""
        return self._explicit_max_gen_toks or 256

    def _generate_batch(self, input_ids, attention_mask, until, max_gen_toks, kwargs):
        with Stopwatch(self.device) as watch:
            output = self._model_generate(
                context=input_ids,
                attention_mask=attention_mask,
                stop=until,
                max_length=input_ids.shape[1] + max_gen_toks,
                **kwargs,
            )
        tokens = output[:, input_ids.shape[1] :]
        generated = [self._row_length(row, until) for row in tokens.tolist()]
        return {"tokens": tokens, "generate_s": watch.seconds, "nfe": tokens.shape[1], "generated_tokens": generated}

    def _row_length(self, row: list[int], until: list[str]) -> int:
        """Tokens this row generated before stopping: through its EOS, before padding, through a stop string."""
        eos = {self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)}
        eos = {e for item in eos for e in (item if isinstance(item, (list, tuple)) else [item]) if e is not None}
        pad = self.tokenizer.pad_token_id
        length = len(row)
        for position, token in enumerate(row):
            if token in eos:
                length = position + 1
                break
            if token == pad:
                length = position
                break
        return tokens_until_stop(self.tokenizer, row[:length], until)


@register_model("hf_mdm")
class MaskedDiffusionLM(_TimedGeneration, HFLM):
    """Any masked diffusion LM for lm-eval, sampled by reverse diffusion, scored by its Monte Carlo ELBO.

    Args:
        pretrained: checkpoint path or Hub id (hf_mdm's MDMs, LLaDA, Dream, or remote code with
            ``trust_remote_code=True``), or a loaded model.
        preset: the sampler of ``generate_until``: ``"llada"`` (LLaDA's ``generate()``,
            `MaskedDiffusionGenerationConfig.llada`), ``"dream"`` (Dream's ``diffusion_generate()``,
            `MaskedDiffusionGenerationConfig.dream`), ``"none"`` (hf_mdm's sampler, every field of
            `MaskedDiffusionGenerationConfig`), or ``"auto"`` (default): ``llada`` for model_type "llada", ``dream``
            for model_type "Dream", else ``none``.
        max_gen_toks: tokens generated (masks appended); default: the request's ``max_gen_toks``, else 256.
        mc_num: Monte Carlo samples per ``loglikelihood`` request (LLaDA's default, 128); the samples of all
            requests are batched together, ``batch_size`` rows per forward pass.
        greedy_check: compute lm-eval's ``is_greedy`` for ``loglikelihood`` as LLaDA does (the continuation
            decoded one token per step, most confident first, must equal the target); costs one forward per
            continuation token.
        seed: seed of the sampler's and the Monte Carlo estimator's random numbers.
        **kwargs: sampler settings, then everything else to lm-eval's HFLM (``dtype``, ``device``, ``batch_size``,
            ``trust_remote_code``, ...) and from there to ``from_pretrained``. The sampler settings depend on the
            preset:

            - ``none``: `MaskedDiffusionGenerationConfig` fields (``steps``, ``block_length``, ``schedule``,
              ``transfer``, ``strategy``, ``threshold``, ``temperature``, ``top_k``, ``top_p``, ``cfg_scale``,
              ``logits_shift``, ``mask_token_id``, ``stop_at_eos``, ``reference``, ...), on top of the checkpoint's
              generation config;
            - ``llada``: ``MaskedDiffusionGenerationConfig.llada(gen_length=max_gen_toks, steps=steps,
              block_length=block_length, temperature=temperature, cfg_scale=cfg_scale, remasking=remasking,
              logits_eos_inf=logits_eos_inf, confidence_eos_eot_inf=confidence_eos_eot_inf)``, with LLaDA's defaults
              (``block_length`` = max_gen_toks, one block; ``temperature`` 0, ``cfg_scale`` 0, ``remasking``
              "low_confidence", both EOS flags False) and ``steps`` = max_gen_toks (one token per step) unless given;
              ``eot_token_id`` too. LLaDA requires ``max_gen_toks % block_length == 0`` and ``steps`` a multiple of
              ``max_gen_toks // block_length`` (a ValueError names the arguments to change);
            - ``dream``: ``MaskedDiffusionGenerationConfig.dream(max_new_tokens=max_gen_toks, steps=steps, eps=eps,
              alg=alg, alg_temp=alg_temp, temperature=temperature, top_p=top_p, top_k=top_k)`` with
              ``diffusion_generate()``'s defaults (``eps`` 1e-3, ``alg`` "origin", ``alg_temp`` None, ``temperature``
              0, no top_p / top_k) and ``steps`` = max_gen_toks unless given; ``cfg_scale`` too. ``alg="origin"``
              reveals random positions (seeded by ``seed``) even at temperature 0; Dream's own evaluation scripts
              pass ``alg=entropy`` (confidence-ordered, deterministic at temperature 0): pass it to match them.

            Both presets also take ``mask_token_id``, ``eos_token_id`` and ``pad_token_id``; a setting the preset
            does not have (``transfer``, ``strategy``, ``schedule``, ``threshold``, ``block_length`` for Dream,
            ``top_k`` for LLaDA, ...) raises a ValueError (use ``preset=none`` for hf_mdm's sampler), and the
            sampler settings of the checkpoint's generation config are not read, as the references do not read
            them (its token ids are). A request's
            ``--gen_kwargs`` of the preset's settings apply as for ``none``; the reference sampler itself runs
            unchanged, generations are cut at the first EOS and at the request's stop strings afterwards.

    Tokenizer: left padding with the tokenizer's pad token, which must not be the [MASK] id (LLaDA's sampler tells
    the prompt from the generation by ``x != mask_id``): a tokenizer without a pad token, or whose pad token is
    [MASK], pads with its EOS token (as LLaDA-8B's config does, ``pad_token_id`` = EOS). ``--apply_chat_template``
    uses the tokenizer's chat template (LLaDA's and Dream's -Instruct tokenizers ship theirs) through HFLM.
    """

    def __init__(
        self,
        pretrained: Any,
        preset: Optional[str] = "auto",
        max_gen_toks: Optional[int] = None,
        mc_num: int = 128,
        greedy_check: bool = True,
        seed: int = 1234,
        **kwargs: Any,
    ):
        sampler_fields = diffusion_fields() | _SAMPLING_FIELDS
        overrides = {key: kwargs.pop(key) for key in list(kwargs) if key in sampler_fields}
        preset = _canonical_preset(preset)
        if preset in PRESET_ARGS:  # fail before loading the weights
            _check_preset_args(preset, overrides, "requested")
        kwargs.setdefault("backend", "causal")
        super().__init__(pretrained, **kwargs)
        if int(mc_num) < 1:
            raise ValueError(f"mc_num must be >= 1, got {mc_num}")
        self._explicit_max_gen_toks = None if max_gen_toks is None else int(max_gen_toks)
        self._explicit_sampling = {k: v for k, v in overrides.items() if k in _EXPLICIT_WINS}
        self.mc_num = int(mc_num)
        self.greedy_check = bool(greedy_check)
        self.seed = int(seed)
        model_type = getattr(self.model.config, "model_type", None)
        self.preset = PRESET_OF_MODEL_TYPE.get(model_type, "none") if preset == "auto" else preset
        self._preset_args = dict(overrides)
        if preset == "auto" and self.preset in PRESET_ARGS:
            _check_preset_args(self.preset, overrides, f"chosen by preset=auto for model_type {model_type!r}")
        self.generation_config = self._build_generation_config(overrides)
        if self.preset == "none":
            self._check_no_reference_args(overrides, model_type)
        self.mask_token_id = int(self.generation_config.mask_token_id)
        self._use_pad_token_other_than_mask()
        if self.preset in PRESET_ARGS and self._explicit_max_gen_toks is not None:
            self._preset_config(self._explicit_max_gen_toks, {})  # settings that cannot run fail here, not mid-run
        self._generator = torch.Generator(device=self.device).manual_seed(self.seed)
        self._current_tags: Optional[list[RequestTag]] = None  # set by loglikelihood for _loglikelihood_tokens
        self._ignored_kwargs: set[str] = set()
        self._init_timing()

    # -- loading ---------------------------------------------------------------------------------------------

    def _get_backend(self, config: Any, backend: str = "default", trust_remote_code: Optional[bool] = False) -> None:
        """Tokenise as a decoder (prompt + continuation encoded together); load with the masked-LM Auto class."""
        self.backend = "causal"
        self.AUTO_MODEL_CLASS = _auto_model_class(config, bool(trust_remote_code))

    def _create_tokenizer(self, *args: Any, **kwargs: Any) -> None:
        """HFLM's tokenizer; without a pad token it pads with EOS (HFLM would take UNK first, or add a token the
        model has no embedding for)."""
        super()._create_tokenizer(*args, **kwargs)
        tokenizer = self.tokenizer
        if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
            logger.info("hf_mdm: the tokenizer has no pad token; padding with EOS %r", tokenizer.eos_token)

    def _use_pad_token_other_than_mask(self) -> None:
        """Left padding must not use the [MASK] id (it would be generated, and LLaDA's sampler counts [MASK]s)."""
        tokenizer = self.tokenizer
        if tokenizer.pad_token_id is None or int(tokenizer.pad_token_id) != self.mask_token_id:
            return
        if tokenizer.eos_token_id is None or int(tokenizer.eos_token_id) == self.mask_token_id:
            raise ValueError(
                f"the tokenizer's pad token {tokenizer.pad_token!r} is the [MASK] token (id {self.mask_token_id}) and "
                "it has no other EOS token to pad with: give the tokenizer a pad token other than [MASK]"
            )
        logger.warning("hf_mdm: the tokenizer's pad token is [MASK] (id %d); padding with EOS %r instead",
                       self.mask_token_id, tokenizer.eos_token)  # fmt: skip
        tokenizer.pad_token = tokenizer.eos_token
        if self.generation_config.pad_token_id == self.mask_token_id:
            self.generation_config.pad_token_id = tokenizer.pad_token_id

    def _check_no_reference_args(self, overrides: dict[str, Any], model_type: Optional[str]) -> None:
        """hf_mdm's sampler ignores the reference samplers' own settings: refuse them instead of ignoring them."""
        if self.generation_config.reference is not None:
            return  # reference=llada / dream given as a sampler field: these settings are read
        given = sorted(_REFERENCE_ONLY & set(overrides))
        if given:
            owners = sorted({p for name in given for p, args in PRESET_ARGS.items() if name in args})
            raise ValueError(
                f"{', '.join(given)}: setting(s) of preset={' / '.join(owners)}, but this model samples with "
                f"preset=none (hf_mdm's sampler; preset=auto picks none for model_type {model_type!r}): pass "
                f"preset={owners[0]} to sample as that reference, or use hf_mdm's strategy= / transfer= settings"
            )

    def _build_generation_config(self, overrides: dict[str, Any]) -> MaskedDiffusionGenerationConfig:
        config = MaskedDiffusionGenerationConfig.from_any(getattr(self.model, "generation_config", None))
        for key, value in overrides.items():
            setattr(config, key, value)
        model_config = self.model.config
        if config.mask_token_id is None:
            config.mask_token_id = getattr(model_config, "mask_token_id", None)
        if config.mask_token_id is None and getattr(self.tokenizer, "mask_token_id", None) is not None:
            config.mask_token_id = self.tokenizer.mask_token_id
        if config.mask_token_id is None:
            raise ValueError("the model has no mask_token_id: pass mask_token_id=<id of [MASK]> in --model_args")
        for name in ("eos_token_id", "pad_token_id"):
            if getattr(config, name) is None:
                value = getattr(model_config, name, None)
                setattr(config, name, value if value is not None else getattr(self.tokenizer, name))
        config.validate_diffusion()
        return config

    @property
    def max_gen_toks(self) -> int:
        """Masks appended: the ``max_gen_toks`` model argument if given, else the request's, else 256."""
        return self._explicit_max_gen_toks or 256

    @property
    def logits_shift(self) -> int:
        """1 if position i is predicted from hidden state i-1 (Dream), else 0 (the sampler's own rule)."""
        return logits_shift_of(self.model, self.generation_config)

    # -- generation ------------------------------------------------------------------------------------------

    def _request_config(self, max_gen_toks: int, kwargs: dict) -> MaskedDiffusionGenerationConfig:
        if self.preset in PRESET_ARGS:
            return self._preset_config(max_gen_toks, kwargs)
        config = copy.deepcopy(self.generation_config)
        config.max_new_tokens = max_gen_toks
        config.return_dict_in_generate = True
        for key, value in kwargs.items():
            if key in _LM_EVAL_ONLY_KWARGS or key in self._explicit_sampling:
                continue
            if key not in diffusion_fields() | _SAMPLING_FIELDS:
                if key not in self._ignored_kwargs:
                    self._ignored_kwargs.add(key)
                    logger.warning("hf_mdm: generation kwarg %r is not a sampler setting; ignored", key)
                continue
            setattr(config, key, value)
        config.validate_diffusion()
        return config

    def _preset_config(self, max_gen_toks: int, kwargs: dict) -> MaskedDiffusionGenerationConfig:
        """The request's `MaskedDiffusionGenerationConfig.llada` / `.dream`: the model arguments of the preset, the
        request's kwargs of the preset (model arguments ``temperature``, ``top_k``, ``top_p`` win), the reference's
        defaults; generations padded after the first EOS (the sampling itself is the reference's)."""
        preset = self.preset
        allowed = PRESET_ARGS[preset] + _PRESET_COMMON
        values = {k: v for k, v in self._preset_args.items() if k in allowed}
        for key, value in kwargs.items():
            if key in _LM_EVAL_ONLY_KWARGS or key in self._explicit_sampling:
                continue
            if key in allowed:
                values[key] = value
            elif preset == "llada" and _neutral_top(key, value):
                continue  # an autoregressive task's top_k / top_p that filters nothing: nothing to apply
            elif key in diffusion_fields() | _SAMPLING_FIELDS:
                raise ValueError(_foreign_message(preset, [key], f"the request's generation kwarg {key}={value!r}"))
            elif key not in self._ignored_kwargs:
                self._ignored_kwargs.add(key)
                logger.warning("hf_mdm: generation kwarg %r is not a setting of preset=%s; ignored", key, preset)
        values = {k: v for k, v in values.items() if v is not None}
        steps = _positive_int("steps", values.pop("steps", max_gen_toks))
        common = dict(
            eos_token_id=values.pop("eos_token_id", None) or self._stop_ids() or None,
            pad_token_id=values.pop("pad_token_id", self.tokenizer.pad_token_id),
            stop_at_eos=True,
            return_dict_in_generate=True,
        )
        mask_id = values.pop("mask_token_id", self.mask_token_id)
        if preset == "llada":
            block_length = _positive_int("block_length", values.pop("block_length", max_gen_toks))
            _check_llada_lengths(max_gen_toks, steps, block_length)
            return MaskedDiffusionGenerationConfig.llada(
                gen_length=max_gen_toks, steps=steps, block_length=block_length, mask_id=mask_id, **values, **common
            )
        return MaskedDiffusionGenerationConfig.dream(
            max_new_tokens=max_gen_toks, steps=steps, mask_token_id=mask_id, **values, **common
        )

    def _stop_ids(self) -> list[int]:
        """EOS ids a generation is cut at: the generation config's, the model config's, the tokenizer's (in this
        order: the first is the one LLaDA's ``logits_eos_inf`` uses, the model config's by default)."""
        ids: list[int] = []
        sources = (self.generation_config.eos_token_id, getattr(self.model.config, "eos_token_id", None),
                   self.tokenizer.eos_token_id)  # fmt: skip
        for source in sources:
            for token in source if isinstance(source, (list, tuple)) else [source]:
                if token is not None and int(token) not in ids and int(token) != self.mask_token_id:
                    ids.append(int(token))
        return ids

    def _generate_batch(self, input_ids, attention_mask, until, max_gen_toks, kwargs):
        config = self._request_config(max_gen_toks, kwargs)
        criteria = StoppingCriteriaList([StopStringCriteria(self.tokenizer, until, input_ids.shape[1])])
        with self._autocast():
            output = diffusion_generate(
                self.model,
                input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                stopping_criteria=None if config.reference is not None else criteria,
                generator=self._generator,
            )
        tokens = output.sequences[:, input_ids.shape[1] :]
        return {
            "tokens": tokens,
            "generate_s": float(output.elapsed_s),
            "nfe": int(output.nfe),
            "generated_tokens": [int(n) for n in output.num_generated_tokens.tolist()],
        }

    # -- likelihood ------------------------------------------------------------------------------------------

    def _loglikelihood_tokens(
        self, requests: Sequence[Any], disable_tqdm: bool = False, override_bs: Optional[int] = None
    ) -> list[tuple[float, bool]]:
        """ELBO of each continuation given its context (and LLaDA's greedy check), batched across requests.

        ``requests``: ``((context, continuation), context_ids, continuation_ids)`` as built by lm-eval.
        """
        pairs = [self._truncate(context_ids, continuation_ids) for _, context_ids, continuation_ids in requests]
        results, seconds, nfe = self._score(pairs, self.greedy_check, override_bs)
        tags = self._current_tags or [RequestTag("unknown", i, "loglikelihood") for i in range(len(pairs))]
        for tag, time_s, forwards in zip(tags, seconds, nfe):
            self.timing.add_request(tag, time_s=time_s, generate_s=time_s, nfe=forwards)
        for (strings, _, _), result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", strings, result)
        return results

    def _score(
        self, pairs: Sequence[tuple[list[int], list[int]]], greedy: bool, override_bs: Optional[int] = None
    ) -> tuple[list[tuple[float, bool]], list[float], list[int]]:
        """(log-likelihood, is_greedy) per pair, with each pair's share of the seconds and its forward passes."""
        with Stopwatch(self.device) as watch:
            log_likelihoods, nfe = self._elbo(pairs, override_bs)
            matches = self._greedy_matches(pairs) if greedy else [False] * len(pairs)
        if greedy:  # one forward per continuation token
            nfe = [n + len(continuation) for n, (_, continuation) in zip(nfe, pairs)]
        total = sum(nfe) or 1
        return list(zip(log_likelihoods, matches)), [watch.seconds * n / total for n in nfe], nfe

    def loglikelihood(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        self._current_tags = tag_requests(requests)
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        finally:
            self._current_tags = None

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        """Sum of the ELBOs of the text's disjoint windows (lm-eval's rolling windows of ``max_length``)."""
        pairs, owners = [], []
        for index, request in enumerate(requests):
            rolling = lm_eval_utils.get_rolling_token_windows(
                token_list=self.tok_encode(request.args[0]), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1,
            )  # fmt: skip
            for context, continuation in map(lm_eval_utils.make_disjoint_window, rolling):
                pairs.append((context, continuation))
                owners.append(index)
        results, seconds, nfe = self._score(pairs, greedy=False)
        totals, time_s, forwards = [0.0] * len(requests), [0.0] * len(requests), [0] * len(requests)
        for owner, (log_likelihood, _), window_s, window_nfe in zip(owners, results, seconds, nfe):
            totals[owner] += log_likelihood
            time_s[owner] += window_s
            forwards[owner] += window_nfe
        for request, tag, total, t, n in zip(requests, tag_requests(requests), totals, time_s, forwards):
            self.timing.add_request(tag, time_s=t, generate_s=t, nfe=n)
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def _truncate(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """Keep the continuation (at most max_length - 1 tokens) and as much context as fits, from the right."""
        continuation = continuation[-(self.max_length - 1) :]
        context = context[-(self.max_length - len(continuation)) :]
        return context, continuation

    def _elbo(self, pairs: Sequence[tuple[list[int], list[int]]], override_bs: Optional[int] = None):
        """Monte Carlo ELBO per (context, continuation), as LLaDA's ``get_loglikelihood``: ``mc_num`` samples,
        sample j masks m_j of the T continuation tokens (stratified: m_j = k + j T / mc_num, wrapped into 1..T, k
        uniform), each masked token's log-probability weighted by T / m_j. Random numbers come from a generator
        seeded by the request's tokens, so a request's estimate does not depend on its batch or rank.

        Returns (log-likelihoods, forward passes per request)."""
        rows = [row for index, pair in enumerate(pairs) for row in self._mc_rows(index, *pair)]
        rows.sort(key=lambda row: -row["ids"].numel())
        loss = [0.0] * len(pairs)
        batch_size = override_bs or self._resolved_batch_size()
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            for row, value in zip(batch, self._masked_nll(batch)):
                loss[row["request"]] += value / row["ratio"]
        forwards = self.mc_num * (2 if self.generation_config.cfg_scale > 0 else 1)
        return [-total / self.mc_num for total in loss], [forwards] * len(pairs)

    def _mc_rows(self, index: int, context: list[int], continuation: list[int]) -> list[dict]:
        length = len(continuation)
        generator = torch.Generator().manual_seed(_stable_seed(self.seed, context, continuation))
        k = int(torch.randint(1, length + 1, (), generator=generator))
        counts = torch.round(torch.linspace(float(k), k + (self.mc_num - 1) * length / self.mc_num, self.mc_num)).long()
        counts = (counts - 1) % length + 1
        ids = torch.tensor(context + continuation, dtype=torch.long)
        rows = []
        for count in counts.tolist():
            positions = torch.randperm(length, generator=generator)[:count] + len(context)
            rows.append({"request": index, "ids": ids, "masked": positions.sort().values,
                         "prompt_length": len(context), "ratio": count / length})  # fmt: skip
        return rows

    @torch.no_grad()
    def _masked_nll(self, batch: Sequence[dict]) -> list[float]:
        """Sum of -log p(x_i | noisy x) over the masked positions of each row (right-padded batch)."""
        width = max(row["ids"].numel() for row in batch)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.mask_token_id
        noisy = torch.full((len(batch), width), pad, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        prompt = torch.zeros((len(batch), width), dtype=torch.bool)
        for r, row in enumerate(batch):
            n = row["ids"].numel()
            noisy[r, :n] = row["ids"]
            noisy[r, row["masked"]] = self.mask_token_id
            attention[r, :n] = 1
            prompt[r, : row["prompt_length"]] = True
        noisy, attention, prompt = noisy.to(self.device), attention.to(self.device), prompt.to(self.device)
        shift = self.logits_shift
        columns = torch.cat([row["masked"] for row in batch]).unique().to(self.device)
        logits = self._guided_logits(noisy, attention, prompt, (columns - shift).clamp(min=0))
        lookup = torch.full((width,), -1, dtype=torch.long, device=self.device)
        lookup[columns] = torch.arange(columns.numel(), device=self.device)
        losses = []
        for r, row in enumerate(batch):
            masked = row["masked"].to(self.device)
            row_logits = logits[r, lookup[masked]].float()
            targets = row["ids"].to(self.device)[masked]
            losses.append(float(F.cross_entropy(row_logits, targets, reduction="sum")))
        return losses

    def _guided_logits(self, ids, attention, prompt, keep: torch.Tensor) -> torch.Tensor:
        """Logits (B, K, V) at the positions ``keep``, with classifier-free guidance when ``cfg_scale`` > 0 (the
        unconditional input has the prompt masked, as in LLaDA)."""
        cfg = float(self.generation_config.cfg_scale or 0.0)
        inputs, mask = ids, attention
        if cfg > 0:
            inputs = torch.cat([ids, ids.masked_fill(prompt, self.mask_token_id)])
            mask = torch.cat([attention, attention])
        with self._autocast():
            logits = self._forward_logits(inputs, mask, keep)
        if cfg > 0:
            cond, uncond = logits.chunk(2)
            logits = uncond + (cfg + 1.0) * (cond - uncond)
        return logits

    def _forward_logits(self, inputs: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        try:
            logits = self.model(inputs, attention_mask=mask, logits_to_keep=keep).logits
        except TypeError:  # a remote-code model without logits_to_keep
            logits = self.model(inputs, attention_mask=mask).logits
        return logits if logits.shape[1] == keep.numel() else logits[:, keep]

    def _greedy_matches(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[bool]:
        """LLaDA's ``suffix_greedy_prediction``: the continuation fully masked and revealed one token per step,
        most confident first, at temperature 0; True where the result equals the continuation."""
        matches = []
        batch_size = self._resolved_batch_size()
        for start in range(0, len(pairs), batch_size):
            batch = pairs[start : start + batch_size]
            rows = [context + [self.mask_token_id] * len(continuation) for context, continuation in batch]
            width = max(len(r) for r in rows)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
            attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
            config = MaskedDiffusionGenerationConfig(
                mask_token_id=self.mask_token_id,
                eos_token_id=self.generation_config.eos_token_id,
                pad_token_id=self.generation_config.pad_token_id,
                logits_shift=self.generation_config.logits_shift,
                cfg_scale=self.generation_config.cfg_scale,
                max_new_tokens=0,
                steps=max(len(c) for _, c in batch),
                strategy="confidence",
                transfer="deterministic",
                temperature=0.0,
                stop_at_eos=False,
            )
            with self._autocast():
                output = diffusion_generate(self.model, ids, attention_mask=attention, generation_config=config)
            for row, (_, continuation) in zip(output.tolist(), batch):
                matches.append(row[width - len(continuation) :] == continuation)
        return matches

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info["generation_config"] = self.generation_config.to_diff_dict()
        info["preset"] = self.preset
        info.update(mc_num=self.mc_num, greedy_check=self.greedy_check, seed=self.seed, max_gen_toks=self.max_gen_toks)
        return info


def _auto_model_class(config: Any, trust_remote_code: bool) -> type:
    """AutoModelForMaskedLM for registered masked LMs (hf_mdm, LLaDA, Dream), else what the remote code offers."""
    if type(config) in transformers.AutoModelForMaskedLM._model_mapping:
        return transformers.AutoModelForMaskedLM
    auto_map = getattr(config, "auto_map", None) or {}
    if trust_remote_code:
        for name in ("AutoModelForMaskedLM", "AutoModel", "AutoModelForCausalLM"):
            if name in auto_map:
                return getattr(transformers, name)
    return transformers.AutoModelForMaskedLM


def _canonical_preset(preset: Any) -> str:
    """``preset`` as one of `PRESETS` (lm-eval parses ``preset=none`` in --model_args to None)."""
    name = "none" if preset is None else str(preset).strip().lower()
    if name not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: use one of {list(PRESETS)}")
    return name


def _neutral_top(key: str, value: Any) -> bool:
    """A top_k / top_p that keeps every token (None, top_k 0, top_p 1)."""
    if key == "top_k":
        return value is None or value == 0
    return key == "top_p" and (value is None or float(value) >= 1.0)


def _foreign_message(preset: str, names: Sequence[str], what: str) -> str:
    reference = {"llada": "LLaDA's generate()", "dream": "Dream's diffusion_generate()"}[preset]
    return (
        f"{what}: preset={preset} runs {reference}, which has no {', '.join(names)} (its settings: "
        f"{', '.join(PRESET_ARGS[preset] + _PRESET_COMMON)}). Pass preset=none to sample with hf_mdm's own sampler "
        f"and its settings (transfer, strategy, schedule, ...), or drop {', '.join(names)}"
    )


def _check_preset_args(preset: str, overrides: dict[str, Any], how: str) -> None:
    """Model arguments that are sampler settings the preset does not have: a ValueError naming them."""
    foreign = sorted(set(overrides) - set(PRESET_ARGS[preset] + _PRESET_COMMON))
    if foreign:
        given = ", ".join(f"{name}={overrides[name]!r}" for name in foreign)
        raise ValueError(_foreign_message(preset, foreign, f"model argument(s) {given} with preset={preset} ({how})"))


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r} (model argument or --gen_kwargs {name}=...)")
    return value


def _check_llada_lengths(gen_length: int, steps: int, block_length: int) -> None:
    """LLaDA's generate() asserts ``gen_length % block_length == 0`` and ``steps % num_blocks == 0``: the same
    rules as a ValueError naming the model arguments to change."""
    if gen_length % block_length:
        divisors = [d for d in range(block_length, 0, -1) if gen_length % d == 0][:1] + [gen_length]
        raise ValueError(
            f"preset=llada (LLaDA's generate()) needs max_gen_toks to be a multiple of block_length: max_gen_toks="
            f"{gen_length} (the max_gen_toks model argument, else the task's), block_length={block_length}. Set "
            f"block_length (model argument or --gen_kwargs) to a divisor of {gen_length}, e.g. "
            f"{' or '.join(map(str, dict.fromkeys(divisors)))}, or max_gen_toks (model argument) to a multiple of "
            f"{block_length}"
        )
    num_blocks = gen_length // block_length
    if steps % num_blocks:
        lower, higher = steps - steps % num_blocks, steps + num_blocks - steps % num_blocks
        raise ValueError(
            f"preset=llada (LLaDA's generate()) needs steps to be a multiple of the number of blocks: steps={steps}, "
            f"max_gen_toks // block_length = {gen_length} // {block_length} = {num_blocks} blocks. Set steps (model "
            f"argument or --gen_kwargs) to {lower or higher}" + (f" or {higher}" if lower else "")
            + ", or change block_length"
        )


def _stable_seed(seed: int, context: Sequence[int], continuation: Sequence[int]) -> int:
    digest = hashlib.sha256(json.dumps([seed, list(context), list(continuation)]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
