"""The ``hf_mdm`` lm-eval model: any masked diffusion LM, sampled by reverse diffusion, scored by its ELBO.

It loads any masked diffusion checkpoint with ``AutoModelForMaskedLM`` (hf_mdm's own models and the native LLaDA /
Dream classes, registered on ``import hf_mdm``; other checkpoints through their remote code with
``trust_remote_code=True``), samples with `hf_mdm.generation.diffusion_generate` (the request's config from
`hf_mdm.harness.sampler_config`) and scores ``loglikelihood`` requests with `hf_mdm.likelihood`. Batching, stop
strings and timing are `hf_mdm.harness.timed.TimedGeneration`'s.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from typing import Any, Mapping, Optional, Sequence

import torch
from lm_eval import utils as lm_eval_utils
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from transformers import StoppingCriteriaList

from ..generation import (
    MaskedDiffusionGenerationConfig,
    check_token_ids,
    diffusion_generate,
    logits_shift_of,
    resolve_config,
)
from ..generation_denoiser import Denoiser
from ..generation_reference import REFERENCE_ARGS
from ..generation_rows import invariance_guarantee
from ..likelihood import ELBOEstimator, greedy_matches
from ..loading import auto_class, checkpoint_kind, require_kind
from .argument_checks import check_near_misses, check_pretrained, explain_model_arguments, hflm_arguments
from .reproducible import reproducibility_info
from .sampler_config import (
    RequestConfigs,
    canonical_reference,
    check_gen_kwargs,
    check_model_args,
    check_no_reference_args,
    check_reference_args,
    resolve_reference,
    sampler_fields,
)
from .timed import StopStringCriteria, TimedGeneration
from .timing import RequestTag, Stopwatch, tag_requests

__all__ = ["MaskedDiffusionLM"]

logger = logging.getLogger(__name__)

#: What ``hf_mdm`` says of a checkpoint of another kind: the lm-eval model that runs it.
HF_MDM_HINTS = {
    "autoregressive": "; time an autoregressive LM with --model hf_timed",
    "uniform": "; run it with --model hf_diffusion_gemma",
    "masked": "",
}


@register_model("hf_mdm")
class MaskedDiffusionLM(TimedGeneration, HFLM):
    """Any masked diffusion LM for lm-eval, sampled by reverse diffusion, scored by its Monte Carlo ELBO.

    Args:
        pretrained: checkpoint path or Hub id (hf_mdm's MDMs, LLaDA, Dream, or remote code with
            ``trust_remote_code=True``), or a loaded model.
        reference: the sampler of ``generate_until``: ``"llada"`` (LLaDA's ``generate()``,
            `MaskedDiffusionGenerationConfig.llada`), ``"dream"`` (Dream's ``diffusion_generate()``,
            `MaskedDiffusionGenerationConfig.dream`), ``"none"`` (hf_mdm's sampler, every field of
            `MaskedDiffusionGenerationConfig`), or ``"auto"`` (default): the checkpoint generation config's
            ``reference`` if set, else the reference its family declares (``llada`` for LLaDA, ``dream`` for Dream),
            else ``none`` (see `hf_mdm.harness.sampler_config`). ``preset`` is the former name of this argument
            (accepted, with a warning).
        max_gen_toks: tokens generated (masks appended); default: the request's ``max_gen_toks``, else 256.
        mc_num: Monte Carlo samples per ``loglikelihood`` request (LLaDA's default, 128); the samples of all
            requests are batched together, ``batch_size`` rows per forward pass.
        greedy_check: compute lm-eval's ``is_greedy`` for ``loglikelihood`` as LLaDA does (the continuation
            decoded one token per step, most confident first, must equal the target); costs one forward per
            continuation token.
        seed: the run's seed, of the sampler's and the Monte Carlo estimator's random numbers; unset, the torch seed
            lm-eval's ``--seed`` set (1234 by default).
        per_request_seeds: every request draws from a seed of its own, derived from the run's seed and the request
            (`hf_mdm.harness.reproducible`), so a sampled answer is the same at any ``batch_size`` and process count;
            each row of a batch draws from its own generator (`hf_mdm.generation_rows`: rows of one length batched).
            ``False``: one random stream for the run, shared by a batch's rows (reproducible only at the same batch
            size). Together with the sampler argument ``batch_invariant=True`` (each row's forwards also its own:
            rows of one length batched where the device allows, else alone, so in bfloat16 too) a run's every
            answer is the same at any batch size and process count.
        **kwargs: sampler settings, then everything else to lm-eval's HFLM (``dtype``, ``device``, ``batch_size``,
            ``trust_remote_code``, ...) and from there to ``from_pretrained``. The sampler settings depend on the
            reference:

            - ``none``: `MaskedDiffusionGenerationConfig` fields (``steps``, ``block_length``, ``schedule``,
              ``transfer``, ``strategy``, ``threshold``, ``temperature``, ``top_k``, ``top_p``, ``cfg_scale``,
              ``logits_shift``, ``mask_token_id``, ``stop_at_eos``, ...), on top of the checkpoint's
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

            Both references also take ``mask_token_id``, ``eos_token_id`` and ``pad_token_id``; a setting the reference
            does not have (``transfer``, ``strategy``, ``schedule``, ``threshold``, ``block_length`` for Dream,
            ``top_k`` for LLaDA, ...) raises a ValueError (use ``reference=none`` for hf_mdm's sampler), and the
            sampler settings of the checkpoint's generation config are not read, as the references do not read
            them (its token ids are). A request's
            ``--gen_kwargs`` of the reference's settings apply as for ``none``; the reference sampler itself runs
            unchanged, generations are cut at the first EOS and at the request's stop strings afterwards.

    Tokenizer: left padding with the tokenizer's pad token, which must not be the [MASK] id (LLaDA's sampler tells
    the prompt from the generation by ``x != mask_id``): a tokenizer without a pad token, or whose pad token is
    [MASK], pads with its EOS token (as LLaDA-8B's config does, ``pad_token_id`` = EOS). ``--apply_chat_template``
    uses the tokenizer's chat template (LLaDA's and Dream's -Instruct tokenizers ship theirs) through HFLM.
    """

    registered_name = "hf_mdm"  # the lm-eval model name, for messages about its arguments

    @classmethod
    def known_arguments(cls) -> dict[str, list[str]]:
        """The arguments of ``hf_mdm`` by kind (for the message about an unknown one)."""
        own = [name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "kwargs")]
        return {"hf_mdm's": own, "the sampler's": sorted(sampler_fields()), "lm-eval HFLM's": hflm_arguments()}

    def __init__(
        self,
        pretrained: Any,
        reference: Optional[str] = "auto",
        max_gen_toks: Optional[int] = None,
        mc_num: int = 128,
        greedy_check: bool = True,
        seed: Optional[int] = None,
        per_request_seeds: bool = True,
        **kwargs: Any,
    ):
        choice = canonical_reference(_former_preset_argument(reference, kwargs))
        own = dict(max_gen_toks=max_gen_toks, mc_num=mc_num, greedy_check=greedy_check, seed=seed)
        check_model_args(kwargs, **own, per_request_seeds=per_request_seeds)
        check_near_misses("hf_mdm", kwargs, self.known_arguments(), inspect.signature(HFLM.__init__).parameters)
        overrides = {key: kwargs.pop(key) for key in list(kwargs) if key in sampler_fields()}
        if choice in REFERENCE_ARGS:  # fail before loading the weights
            check_reference_args(choice, overrides, "requested")
        kwargs.setdefault("backend", "causal")
        check_pretrained(pretrained)
        with explain_model_arguments("hf_mdm", kwargs, self.known_arguments()):
            super().__init__(pretrained, **kwargs)
        self._explicit_max_gen_toks = None if max_gen_toks is None else int(max_gen_toks)
        self.mc_num, self.greedy_check, self._seed_argument = int(mc_num), bool(greedy_check), seed
        self.per_request_seeds = per_request_seeds
        self.reference = self._choose_reference(choice, overrides)
        self.generation_config = self._resolve_generation_config(overrides)
        self.mask_token_id = int(self.generation_config.mask_token_id)
        check_token_ids(self.model, self.mask_token_id)
        self._use_pad_token_other_than_mask()
        self.request_configs = RequestConfigs(
            self.reference, self.generation_config, overrides, self._stop_ids(), self.tokenizer.pad_token_id
        )
        if self.reference in REFERENCE_ARGS and self._explicit_max_gen_toks is not None:
            self.request_configs(self._explicit_max_gen_toks, {})  # settings that cannot run fail here, not mid-run
        self._shared_generator: Optional[torch.Generator] = None  # per_request_seeds=False: the run's one stream
        self._current_tags: Optional[list[RequestTag]] = None  # set by loglikelihood for _loglikelihood_tokens
        self._init_timing()

    @property
    def preset(self) -> str:
        """The former name of `reference`."""
        return self.reference

    # -- loading ---------------------------------------------------------------------------------------------

    def _get_backend(self, config: Any, backend: str = "default", trust_remote_code: Optional[bool] = False) -> None:
        """Tokenise as a decoder (prompt + continuation encoded together); load with the Auto class the family takes
        (`hf_mdm.loading.auto_class`), after refusing a checkpoint that is no masked diffusion model (unless remote
        code with ``trust_remote_code`` says how to load it)."""
        self.backend = "causal"
        if not (trust_remote_code and getattr(config, "auto_map", None)):
            name = getattr(config, "_name_or_path", None) or None
            require_kind(config, "masked", name, "--model hf_mdm", "pretrained=", HF_MDM_HINTS[checkpoint_kind(config)])
        self.AUTO_MODEL_CLASS = auto_class(config, bool(trust_remote_code))

    def _create_tokenizer(self, *args: Any, **kwargs: Any) -> None:
        """HFLM's tokenizer; without a pad token it pads with EOS (HFLM would take UNK first, or add a token the
        model has no embedding for)."""
        super()._create_tokenizer(*args, **kwargs)
        tokenizer = self.tokenizer
        if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
            logger.info("hf_mdm: the tokenizer has no pad token; padding with EOS %r", tokenizer.eos_token)

    def _choose_reference(self, choice: str, overrides: dict[str, Any]) -> str:
        model_type = getattr(self.model.config, "model_type", None)
        reference = resolve_reference(choice, getattr(self.model, "generation_config", None), self.model)
        if choice == "auto" and reference in REFERENCE_ARGS:
            check_reference_args(reference, overrides, f"chosen by reference=auto for model_type {model_type!r}")
        if reference == "none":
            check_no_reference_args(overrides, model_type)
        return reference

    def _resolve_generation_config(self, overrides: dict[str, Any]) -> MaskedDiffusionGenerationConfig:
        """The sampler's own resolution (`hf_mdm.generation.resolve_config`), the tokenizer filling in token ids
        that neither config has; the reference sampler is chosen by ``reference``, not by the saved config."""
        return resolve_config(self.model, None, {**overrides, "reference": "none"}, fallback=self.tokenizer)

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
        logger.warning(
            "hf_mdm: the tokenizer's pad token is [MASK] (id %d); padding with EOS %r instead",
            self.mask_token_id,
            tokenizer.eos_token,
        )
        tokenizer.pad_token = tokenizer.eos_token
        if self.generation_config.pad_token_id == self.mask_token_id:
            self.generation_config.pad_token_id = tokenizer.pad_token_id

    def _stop_ids(self) -> list[int]:
        """EOS ids a generation is cut at: the generation config's, the model config's, the tokenizer's (in this
        order: the first is the one LLaDA's ``logits_eos_inf`` uses, the model config's by default)."""
        ids: list[int] = []
        sources = (
            self.generation_config.eos_token_id,
            getattr(self.model.config, "eos_token_id", None),
            self.tokenizer.eos_token_id,
        )
        for source in sources:
            for token in source if isinstance(source, (list, tuple)) else [source]:
                if token is not None and int(token) not in ids and int(token) != self.mask_token_id:
                    ids.append(int(token))
        return ids

    @property
    def max_gen_toks(self) -> int:
        """Masks appended: the ``max_gen_toks`` model argument if given, else the request's, else 256."""
        return self._explicit_max_gen_toks or 256

    @property
    def logits_shift(self) -> int:
        """1 if position i is predicted from hidden state i-1 (Dream), else 0 (the sampler's own rule)."""
        return logits_shift_of(self.model, self.generation_config)

    def _denoiser(self) -> Denoiser:
        config = self.generation_config
        return Denoiser.for_model(self.model, self.mask_token_id, config.cfg_scale, self.logits_shift)

    # -- generation ------------------------------------------------------------------------------------------

    def check_gen_kwargs(self, gen_kwargs: Mapping[str, Any]) -> None:
        """A run's ``--gen_kwargs``, before any request: a ValueError for a key this model's sampler does not take
        (`hf_mdm.harness.sampler_config.check_gen_kwargs`); called by `hf_mdm.harness.simple_evaluate`."""
        check_gen_kwargs(gen_kwargs, self.reference)

    def _request_config(self, max_gen_toks: int, kwargs: dict) -> MaskedDiffusionGenerationConfig:
        return self.request_configs(max_gen_toks, kwargs)

    def _generate_batch(self, input_ids, attention_mask, until, max_gen_toks, kwargs, seeds):
        config = self._request_config(max_gen_toks, kwargs)
        criteria = StoppingCriteriaList([StopStringCriteria(self.tokenizer, until, input_ids.shape[1])])
        randomness = {"seed": seeds} if self.per_request_seeds else {"generator": self._run_generator()}
        with self._autocast():
            output = diffusion_generate(
                self.model,
                input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                stopping_criteria=None if config.reference is not None else criteria,
                **randomness,
            )
        tokens = output.sequences[:, input_ids.shape[1] :]
        return {
            "tokens": tokens,
            "generate_s": float(output.elapsed_s),
            "nfe": int(output.nfe) if output.row_nfe is None else output.row_nfe.tolist(),
            "forward_tokens": float(output.forward_tokens or 0),
            "generated_tokens": [int(n) for n in output.num_generated_tokens.tolist()],
        }

    def _run_generator(self) -> torch.Generator:
        if self._shared_generator is None:
            self._shared_generator = torch.Generator(device=self.device).manual_seed(self.seed)
        return self._shared_generator

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
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.mask_token_id
        estimator = ELBOEstimator(self._denoiser(), self.mc_num, self.seed, pad, self.device)
        with Stopwatch(self.device) as watch:
            with self._autocast():
                log_likelihoods = estimator.loglikelihoods(pairs, override_bs or self._resolved_batch_size())
            matches = self._greedy_matches(pairs) if greedy else [False] * len(pairs)
        nfe = [estimator.forwards_per_request] * len(pairs)
        if greedy:  # one forward per continuation token
            nfe = [n + len(continuation) for n, (_, continuation) in zip(nfe, pairs)]
        total = sum(nfe) or 1
        return list(zip(log_likelihoods, matches)), [watch.seconds * n / total for n in nfe], nfe

    def _greedy_matches(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[bool]:
        """LLaDA's greedy check (`hf_mdm.likelihood.greedy_matches`) with this model's settings."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        with self._autocast():
            return greedy_matches(
                self.model, pairs, self.generation_config, self._resolved_batch_size(), pad, self.device
            )

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
                token_list=self.tok_encode(request.args[0]),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
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

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info["generation_config"] = self.generation_config.to_diff_dict()
        info["reference"] = self.reference
        info.update(mc_num=self.mc_num, greedy_check=self.greedy_check, seed=self.seed, max_gen_toks=self.max_gen_toks)
        seeds = "per request" if self.per_request_seeds else "one stream for the run, shared by a batch"
        guarantee = invariance_guarantee(self.model.device, self.model.dtype)
        info["reproducibility"] = reproducibility_info(
            self.generation_config.batch_invariant, seeds, self.seed, guarantee
        )
        return info


def _former_preset_argument(reference: Any, kwargs: dict[str, Any]) -> Any:
    """``preset=...`` (the former name of ``reference``): taken, with a FutureWarning."""
    if "preset" not in kwargs:
        return reference
    preset = kwargs.pop("preset")
    warnings.warn(
        "the hf_mdm model argument `preset` is now `reference` (same values): use reference=...",
        FutureWarning,
        stacklevel=3,
    )
    if reference not in ("auto", None) and canonical_reference(reference) != canonical_reference(preset):
        raise ValueError(f"reference={reference!r} and preset={preset!r} disagree: pass reference=... alone")
    return preset
