"""Timed generation for lm-eval: one ``generate_until`` for both models, and ``hf_timed`` (lm-eval's HF causal LM).

Requests are grouped by their generation kwargs, sorted by prompt length (longest first, as lm-eval does), batched
with left padding, generated, decoded and cut at the request's own stop strings (``until`` plus EOS); every batch is
timed with the device synchronised (`hf_mdm.harness.timing`). `TimedGeneration` is shared by ``hf_timed``
(`TimedHFLM`, below) and ``hf_mdm`` (`hf_mdm.harness.mdm.MaskedDiffusionLM`), which implement `_generate_batch`.

On CPU, ``accelerate launch`` with several processes (``ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu
--num_processes N``) gives lm-eval's HFLM no rank (it counts GPUs); these models take rank and world size from
accelerate, so requests are sharded on CPU as on GPUs.
"""

from __future__ import annotations

import abc
import json
import logging
from typing import Any, Optional, Sequence

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm
from transformers import StoppingCriteria

from .argument_checks import check_pretrained, explain_model_arguments, hflm_arguments
from .reproducible import generate_alone, reproducibility_info, request_seed, run_seed
from .timing import RequestTag, Stopwatch, TimingRecorder, tag_requests

logger = logging.getLogger(__name__)

__all__ = ["TimedGeneration", "TimedHFLM", "StopStringCriteria", "tokens_until_stop"]


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


class TimedGeneration:
    """``generate_until`` with per-batch timing, shared by both models; subclasses implement `_generate_batch`."""

    timing: TimingRecorder
    _explicit_max_gen_toks: Optional[int] = None
    _seed_argument: Optional[int] = None  # the model's seed argument, if it has one
    _resolved_seed: Optional[int] = None

    @property
    def seed(self) -> int:
        """The run's seed, the base of every request's (`hf_mdm.harness.reproducible.run_seed`), read when first
        needed: lm-eval seeds torch from ``--seed`` after ``hf-mdm-eval`` built the model."""
        if self._resolved_seed is None:
            self._resolved_seed = run_seed(self._seed_argument)
        return self._resolved_seed

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
            seeds = [request_seed(self.seed, tag, c, gen_kwargs) for tag, c in zip(tags, contexts)]
            generation = self._generate_batch(input_ids, attention_mask, until, max_gen_toks, kwargs, seeds)
            rows = generation["tokens"].tolist()
            texts = [self._postprocess(self.tok_decode(self._after_thinking(row)), until) for row in rows]
            output_tokens = [
                tokens_until_stop(self.tokenizer, row[:n], until)
                for row, n in zip(rows, generation["generated_tokens"])
            ]
        self.timing.add_batch(
            tags,
            batch_time_s=watch.seconds,
            generate_s=generation["generate_s"],
            nfe=generation["nfe"],
            generated_tokens=generation["generated_tokens"],
            output_tokens=output_tokens,
            forward_tokens=generation.get("forward_tokens", 0.0),
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
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor,
        until: list[str],
        max_gen_toks: int,
        kwargs: dict,
        seeds: list[int],
    ) -> dict[str, Any]:
        """Generate for one left-padded batch, ``seeds`` the requests' own (`request_seed`). Returns ``tokens`` (B, T)
        after the prompt, ``generate_s`` (the model's own generation seconds), ``nfe`` (forward passes of the batch),
        per-row ``generated_tokens`` and optionally ``forward_tokens`` (positions the forwards computed, rows x span
        summed)."""

    def _autocast(self) -> torch.autocast:
        """HFLM's ``mixed_precision_dtype`` autocast (a no-op when unset)."""
        dtype = self.mixed_precision_dtype
        return torch.autocast(device_type=self.device.type, dtype=dtype, enabled=dtype is not None)

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info["timing"] = "hf_mdm.harness.timing: wall-clock per batch, device synchronised"
        return info


@register_model("hf_timed")
class TimedHFLM(TimedGeneration, HFLM):
    """lm-eval's ``hf`` model (autoregressive, ``AutoModelForCausalLM``) with per-request timing.

    Takes every argument of lm-eval's ``hf`` model, ``max_gen_toks`` (wins over the request's) and
    ``batch_invariant``. Each batch is generated with lm-eval's own ``_model_generate`` (``model.generate`` with its
    stop-sequence criteria, KV cache on); its NFE is the number of decoding steps of the batch (one forward pass
    each), and a row's generated tokens stop at its EOS or at the token that completed one of its stop strings.
    With ``batch_invariant=True`` each request is generated alone, a batch of one without padding, sampling from its
    own seed (`hf_mdm.harness.reproducible`): its answer is the same at any batch size and process count, in any
    dtype; a request's NFE is then its own decoding steps.
    """

    registered_name = "hf_timed"  # the lm-eval model name, for messages about its arguments

    def __init__(self, *args: Any, max_gen_toks: Optional[int] = None, batch_invariant: bool = False, **kwargs: Any):
        check_pretrained(kwargs.get("pretrained", args[0] if args else None))
        if not isinstance(batch_invariant, bool):
            raise ValueError(f"batch_invariant must be True or False, got {batch_invariant!r}")
        self.batch_invariant = batch_invariant
        with explain_model_arguments(self.registered_name, kwargs, self.known_arguments()):
            super().__init__(*args, **kwargs)
        self._explicit_max_gen_toks = None if max_gen_toks is None else int(max_gen_toks)
        self._init_timing()

    @classmethod
    def own_arguments(cls) -> list[str]:
        """The model arguments this model takes besides lm-eval HFLM's."""
        return ["max_gen_toks", "batch_invariant"]

    @classmethod
    def known_arguments(cls) -> dict[str, list[str]]:
        """The model arguments by kind (for the message about an unknown one)."""
        return {f"{cls.registered_name}'s": cls.own_arguments(), "lm-eval HFLM's": hflm_arguments()}

    @property
    def max_gen_toks(self) -> int:
        """Tokens to generate: the ``max_gen_toks`` model argument if given (it wins over the request's), else the
        request's, else 256 (lm-eval's default)."""
        return self._explicit_max_gen_toks or 256

    def _generate_batch(self, input_ids, attention_mask, until, max_gen_toks, kwargs, seeds):
        def generate(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            length = ids.shape[1] + max_gen_toks
            return self._model_generate(context=ids, attention_mask=mask, stop=until, max_length=length, **kwargs)

        with Stopwatch(self.device) as watch:
            tokens, steps = self._batch_or_rows(generate, input_ids, attention_mask, seeds)
        generated = [self._row_length(row, until) for row in tokens.tolist()]
        return {"tokens": tokens, "generate_s": watch.seconds, "nfe": steps, "generated_tokens": generated}

    def _own_generate_batch(self, counted: Any, call: Any, input_ids, attention_mask, until, seeds) -> dict:
        """A batch generated by another library's sampler: ``call(ids, mask)`` returns the sequences (prompt
        included); its NFE is the forwards of the module ``counted`` (per row when rows run alone)."""
        forwards, per_call = [0], []

        def generate(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            before = forwards[0]
            sequences = call(ids, mask)
            per_call.append(forwards[0] - before)
            return sequences

        hook = counted.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        try:
            with Stopwatch(self.device) as watch, self._autocast():
                tokens, _ = self._batch_or_rows(generate, input_ids, attention_mask, seeds)
        finally:
            hook.remove()
        generated = [self._row_length(row, until) for row in tokens.tolist()]
        nfe = per_call if self.batch_invariant else forwards[0]  # rows alone: each its own forwards
        return {"tokens": tokens, "generate_s": watch.seconds, "nfe": nfe, "generated_tokens": generated}

    def _warn_ignored(self, kwargs: dict, what: str) -> None:
        """A warning, once per name, for request kwargs that are not settings of ``what``."""
        ignored = getattr(self, "_ignored_kwargs", set())
        for key in sorted(set(kwargs) - ignored):
            logger.warning("%s: generation kwarg %r is not %s; ignored", self.registered_name, key, what)
        self._ignored_kwargs = ignored | set(kwargs)

    def _batch_or_rows(self, generate, input_ids, attention_mask, seeds) -> tuple[torch.Tensor, Any]:
        """The tokens (B, T) ``generate(ids, mask)`` writes after the prompts, and the decoding steps taken: one
        call on the batch (the batch's, an int), or with ``batch_invariant`` one per row alone (`generate_alone`:
        each row's, a list), as `TimingRecorder.add_batch` takes the NFE."""
        if self.batch_invariant:
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            return generate_alone(generate, input_ids, attention_mask, seeds, pad)
        tokens = generate(input_ids, attention_mask)[:, input_ids.shape[1] :]
        return tokens, tokens.shape[1]

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        seeds = "per request (rows alone)" if self.batch_invariant else "torch's stream, shared by a batch"
        info["reproducibility"] = reproducibility_info(self.batch_invariant, seeds, self.seed)
        return info

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
