"""The served model: requests turned into generation calls, batches run, outputs turned into OpenAI answers.

A diffusion model (every class hf_mdm loads, and transformers' DiffusionGemma) samples with
`hf_mdm.generation.diffusion_generate`; an autoregressive model with transformers' ``generate``, so both compare
behind one client. A request's settings become a `MaskedDiffusionGenerationConfig` checked as ``generate`` checks
it (`hf_mdm.generation_resolve.resolve_config`), before the request joins a batch: a bad setting is its own 400.
Requests whose configs are equal run as one call (`Job.key`); each row stops early when its client left (a stopping
criterion, checked between blocks) and streams through its own streamer (`RowStream`).
"""

from __future__ import annotations

import copy
import json
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from ..families import facts_of
from ..generation import MaskedDiffusionGenerationConfig, diffusion_generate
from ..generation_presets import preset_config
from ..generation_resolve import resolve_config
from ..generation_rows import batches_invariantly, draws_random_numbers
from ..generation_uniform import check_uniform_config
from ..tokens import eos_index, left_pad
from .forwards import SharedForwards
from .protocol import ApiError, Asked
from .settings import ServeSettings

__all__ = ["Engine", "Job", "Answer"]

STEPS_PER_TOKEN = 4  # a request's step counts are capped at this many per token of the server's max_tokens
STEP_FIELDS = ("steps", "max_denoising_steps", "max_post_steps")


@dataclass
class Answer:
    """One request's answer: its text, why it ended, and its token counts."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Job:
    """One request ready to run: its prompt ids, its generation config (and the batching key: its JSON), its seed,
    its stops, its streamer, and whether its client left."""

    ids: list[int]
    config: Any
    key: str
    seed: Optional[int]
    stops: list[str]
    max_tokens: int
    stream: Any = None
    cancelled: threading.Event = field(default_factory=threading.Event)


class _Cancelled(StoppingCriteria):
    """Rows whose client left: finished at the next block boundary (they leave the batch)."""

    def __init__(self, jobs: list[Job]):
        self.jobs = jobs

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        flags = [job.cancelled.is_set() for job in self.jobs]
        if len(flags) != input_ids.shape[0]:  # a group of the batch (batch_invariant): its rows are not known here
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        return torch.tensor(flags, device=input_ids.device)


def _cancelled(jobs: list[Job], config: Any) -> Optional[StoppingCriteriaList]:
    """The stopping criterion of rows whose client left; none for a reference sampler (LLaDA's, Dream's: the
    ``llada`` and ``dream`` presets), which takes no stopping criteria and runs its rows to the end."""
    return StoppingCriteriaList([_Cancelled(jobs)]) if config.reference in (None, "none") else None


class Engine:
    """A model and its tokenizer behind the server: `prepare` checks a request, `run` generates a batch of jobs."""

    def __init__(self, model: Any, tokenizer: Any, settings: ServeSettings, generation_config: Any = None):
        self.model, self.tokenizer, self.settings = model.eval(), tokenizer, settings
        facts = facts_of(model)
        self.diffusion = facts is not None
        self.uniform = facts is not None and facts.corruption == "uniform"  # DiffusionGemma
        base = generation_config if generation_config is not None else getattr(model, "generation_config", None)
        self.base = MaskedDiffusionGenerationConfig.from_any(base) if self.diffusion else base
        if settings.preset is not None and not self.diffusion:
            raise ValueError(
                f"preset {settings.preset!r}: presets are diffusion samplers, and this model is autoregressive"
            )
        self._eos: Optional[set[int]] = None
        self.forwards = 0  # forward passes so far (the model's forward hook)
        model.register_forward_pre_hook(self._count)
        self.lock = threading.Lock()  # one call on the model at a time
        self.batches: Optional[list[list[Job]]] = None  # a list: every batch run is recorded (benchmarks replay them)
        self.shared: Optional[SharedForwards] = None  # forwards shared by joined calls (`share_forwards`)

    def _count(self, *args: Any) -> None:
        if self.shared is None or not self.shared.routes():  # a joined call's forward counts once, batched
            self.forwards += 1

    @property
    def pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return int(pad if pad is not None else getattr(self.tokenizer, "eos_token_id", 0) or 0)

    def prepare(self, asked: Asked) -> Job:
        """The job of a request; an `ApiError` (400) for a prompt too long, a length above the cap or a bad setting."""
        ids = self._encode(asked)
        if len(ids) > self.settings.max_prompt_tokens:
            raise ApiError(
                400, f"the prompt is {len(ids)} tokens, above this server's {self.settings.max_prompt_tokens}"
            )
        max_tokens = asked.max_tokens or self.settings.default_max_tokens
        if max_tokens > self.settings.max_tokens:
            raise ApiError(
                400, f"max_tokens {max_tokens} is above this server's {self.settings.max_tokens}", "max_tokens"
            )
        config = self._diffusion_config(asked, max_tokens) if self.diffusion else self._ar_config(asked, max_tokens)
        key = json.dumps(
            config.to_diff_dict() if hasattr(config, "to_diff_dict") else config, sort_keys=True, default=str
        )
        return Job(ids, config, key, asked.seed, asked.stop, max_tokens)

    def _encode(self, asked: Asked) -> list[int]:
        try:
            return self._tokenize(asked)
        except (TypeError, ValueError) as err:  # what the client sent cannot be tokenized (a lone surrogate, ...)
            field = "messages" if asked.chat else "prompt"
            raise ApiError(400, f"the {field} cannot be tokenized: {err}", field) from err

    def _tokenize(self, asked: Asked) -> list[int]:
        if not asked.chat:
            return list(self.tokenizer(asked.prompt, add_special_tokens=False)["input_ids"])
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ApiError(400, "this model's tokenizer has no chat template: use /v1/completions", "messages")
        ids = self.tokenizer.apply_chat_template(asked.prompt, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def _diffusion_config(self, asked: Asked, max_tokens: int) -> MaskedDiffusionGenerationConfig:
        settings = dict(asked.settings)
        preset = settings.pop("preset", None) or self.settings.preset
        base = copy.deepcopy(self.base) if preset is None else _preset(preset, settings, max_tokens)
        settings.update(max_new_tokens=max_tokens, batch_invariant=self.settings.batch_invariant)
        settings.update(return_dict_in_generate=True)
        try:
            config = resolve_config(self.model, base, settings, fallback=self.tokenizer)
            if self.uniform:
                check_uniform_config(self.model, config)  # its own sampler's settings only
        except (ValueError, TypeError) as err:
            raise ApiError(400, str(err)) from err
        _check_steps(config, self.settings.max_tokens)
        return config

    def _ar_config(self, asked: Asked, max_tokens: int) -> dict:
        extra = sorted(set(asked.settings) - {"temperature", "top_p", "top_k"})
        if extra:
            raise ApiError(400, f"{extra}: diffusion settings, and this model is autoregressive", extra[0])
        temperature = float(asked.settings.get("temperature", 0.0) or 0.0)
        config = dict(max_new_tokens=max_tokens, do_sample=temperature > 0, pad_token_id=self.pad_id)
        if temperature > 0:
            config.update(
                temperature=temperature, top_p=asked.settings.get("top_p", 1.0), top_k=asked.settings.get("top_k", 0)
            )
        return config

    def run(self, jobs: list[Job]) -> list[Answer]:
        """Generate a batch of jobs with one config (in the calling thread; one call on the model at a time)."""
        with self.lock:
            return self._run(jobs)

    def run_joined(self, jobs: list[Job]) -> list[Answer]:
        """Generate a batch of jobs with one config as a call whose forwards join the other running calls' (in its
        own thread: `hf_mdm.serve.joining`); the call ends at its next forward once every job's client left."""
        with self.share_forwards().member(lambda: all(job.cancelled.is_set() for job in jobs)):
            return self._run(jobs)

    def _run(self, jobs: list[Job]) -> list[Answer]:
        if self.batches is not None:
            self.batches.append(list(jobs))
        ids, mask = left_pad([job.ids for job in jobs], self.pad_id)
        device = next(self.model.parameters()).device
        ids, mask = ids.to(device), mask.to(device)
        with torch.inference_mode():  # no autograd records: less host work a forward
            tokens = self._diffusion(jobs, ids, mask) if self.diffusion else self._autoregressive(jobs, ids, mask)
        return [self.answer(job, row) for job, row in zip(jobs, tokens)]

    def _diffusion(self, jobs: list[Job], ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        config = jobs[0].config
        if self.uniform and len(jobs) > 1 and any(job.seed is not None or job.stream for job in jobs):
            # a uniform-corruption model's rows share the canvas draws: a seeded or streamed row runs alone
            return [self._diffusion([job], ids[b : b + 1, mask[b].bool()], mask[b : b + 1, mask[b].bool()])[0]
                    for b, job in enumerate(jobs)]  # fmt: skip
        if self.uniform:
            out = diffusion_generate(
                self.model, ids, attention_mask=mask, generation_config=config, seed=jobs[0].seed,
                stopping_criteria=StoppingCriteriaList([_Cancelled(jobs)]), streamer=jobs[0].stream,
            )  # fmt: skip
            return out.sequences[:, ids.shape[1] :].tolist()
        seeds = [job.seed for job in jobs]
        if (config.batch_invariant or any(s is not None for s in seeds)) and draws_random_numbers(config):
            seed: Any = [s if s is not None else secrets.randbelow(2**31) for s in seeds]
        else:
            seed = None
        streams = [job.stream for job in jobs]
        out = diffusion_generate(
            self.model, ids, attention_mask=mask, generation_config=config, seed=seed,
            stopping_criteria=_cancelled(jobs, config), streamer=streams if any(streams) else None,
        )  # fmt: skip
        return out.sequences[:, ids.shape[1] :].tolist()

    def _autoregressive(self, jobs: list[Job], ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        config = GenerationConfig(**jobs[0].config)
        sampled, rows = config.do_sample and any(job.seed is not None for job in jobs), []
        if not sampled and not any(job.stream for job in jobs):
            out = self.model.generate(ids, attention_mask=mask, generation_config=config)
            return out[:, ids.shape[1] :].tolist()
        for b, job in enumerate(jobs):  # one at a time: transformers draws from one stream for the batch
            row = ids[b : b + 1, mask[b].bool()]
            if job.seed is not None:
                torch.manual_seed(job.seed)
            out = self.model.generate(
                row, attention_mask=torch.ones_like(row), generation_config=config, streamer=job.stream
            )
            rows.append(out[0, row.shape[1] :].tolist())
        return rows

    def joins(self, job: Job) -> bool:
        """Whether ``job`` runs as a call of its own whose forwards join the running calls' (`hf_mdm.serve.joining`):
        every masked diffusion model's job but a compiled forward's (an autoregressive model and a uniform-corruption
        one batch whole requests)."""
        return self.diffusion and not self.uniform and not getattr(job.config, "compile_forward", False)

    def cache_tokens(self, job: Job) -> int:
        """The positions whose keys/values ``job``'s call keeps while it runs (twice with guidance): its canvas, or 0
        without a cache."""
        config = job.config
        if getattr(config, "kv_cache", None) in (None, "none"):
            return 0
        return (len(job.ids) + job.max_tokens) * (2 if (config.cfg_scale or 0) > 0 else 1)

    def share_forwards(self, on_forward: Any = None) -> SharedForwards:
        """The model's forwards shared by concurrent calls (made once): batched only where rows stay their own
        arithmetic when ``batch_invariant`` is asked."""
        if self.shared is None:
            parameter = next(self.model.parameters())
            batched = not self.settings.batch_invariant or batches_invariantly(parameter.device, parameter.dtype)
            self.shared = SharedForwards(self.model, batched=batched, lock=self.lock)
        if on_forward is not None:
            self.shared.on_forward = on_forward  # the latest app's metrics
        return self.shared

    def answer(self, job: Job, tokens: list[int]) -> Answer:
        """The answer from a row's generated tokens: cut at the first EOS, decoded, cut at the first stop string.
        Streaming applies the same cuts to the final tokens it has, so the chunks join to this text."""
        text, reason, used = self.text_of(job, tokens)
        return Answer(text, reason, len(job.ids), used)

    def text_of(self, job: Job, tokens: list[int], final: bool = True) -> tuple[str, str, int]:
        """(text, finish reason, tokens used) of ``tokens``; not ``final``: a prefix (the reason is "")."""
        cut = eos_index(tokens, self.eos_ids)
        kept = tokens if cut is None else tokens[:cut]
        text = self.tokenizer.decode(kept, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        at = min((i for i in (text.find(s) for s in job.stops) if i >= 0), default=None)
        if at is not None:
            return text[:at], "stop", len(self.tokenizer(text[:at], add_special_tokens=False)["input_ids"])
        if not final:
            return text, "", len(kept)
        reason = "stop" if cut is not None or len(tokens) < job.max_tokens else "length"
        return text, reason, len(kept)

    @property
    def eos_ids(self) -> set[int]:
        """The ids an answer ends at: the serving config's EOS, else the tokenizer's (computed once)."""
        if self._eos is None:
            eos = getattr(self.base, "eos_token_id", None) if self.base is not None else None
            eos = getattr(self.tokenizer, "eos_token_id", None) if eos is None else eos
            self._eos = set() if eos is None else set([eos] if isinstance(eos, int) else eos)
        return self._eos


def _check_steps(config: MaskedDiffusionGenerationConfig, max_tokens: int) -> None:
    """A 400 for a step count above the server's cap: `STEPS_PER_TOKEN` per token of its ``max_tokens``."""
    cap = STEPS_PER_TOKEN * max_tokens
    for name in STEP_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, (int, float)) and value > cap:
            why = f"{STEPS_PER_TOKEN} per token of its max_tokens {max_tokens}"
            raise ApiError(400, f"{name} {value} is above this server's cap of {cap} ({why})", name)


def _preset(name: str, settings: dict, max_tokens: int) -> MaskedDiffusionGenerationConfig:
    """``MaskedDiffusionGenerationConfig.<name>(...)`` with the request's settings it names and its length
    argument from ``max_tokens`` (`preset_config`); the other settings override it after. A bad preset is a 400."""
    try:
        return preset_config(MaskedDiffusionGenerationConfig, name, max_tokens, settings)
    except ValueError as err:
        raise ApiError(400, str(err), "preset") from err
