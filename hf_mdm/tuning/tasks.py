"""What ``hf-mdm tune`` measures a setting on: a task draws samples with a setting and scores them.

`SyntheticTask`: sequences of ``length`` tokens drawn from the empty prompt at temperature 1 and scored by a synthetic
language (`hf_mdm.languages`); the quality is the share of valid sequences, 1 - SER, with its 95% Wilson interval. The
development split and the held-out split are disjoint random streams (seeds from ``DEV_SEED`` and ``TEST_SEED``), so
the setting chosen on one is reported on the other. A chunk of samples is counted, not kept: valid sequences,
samples, the forwards in which each row revealed a token and the positions the forwards computed.

A task's ``generation_fields`` are the `generate` fields it fixes for every setting (temperature, max_new_tokens,
...): with the setting and the model's own generation config, the whole config its measurements ran with.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cached_property
from statistics import NormalDist
from typing import Any, Callable

import torch

from ..experiments.common import sample_ar
from ..experiments.fast import active_steps, generate_batches
from ..generation import diffusion_generate
from ..generation_denoiser import model_device
from ..metrics.common import wilson_interval

#: Seeds of the first sample of each split; chunk k of a split starts at its seed + the samples before it.
DEV_SEED, TEST_SEED = 0, 1_000_000_007

#: What a synthetic task draws every sample with, besides its length (`hf_mdm.experiments.fast.generate_batches`).
SYNTHETIC_FIELDS = {"temperature": 1.0, "stop_at_eos": False}


@dataclass
class Counts:
    """A chunk's or a setting's counts so far; adding two is measuring both."""

    valid: int = 0
    samples: int = 0
    forwards: float = 0.0
    positions: float = 0.0
    tokens: float = 0.0  # tokens generated; 0: every sample generated the task's full length
    log_q: float = 0.0  # the samples' log q(x) per token under the language, summed (-inf: one outside it)
    log_q_squares: float = 0.0  # and their squares, for the interval of the mean

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple())))

    def as_tuple(self) -> tuple:
        return self.valid, self.samples, self.forwards, self.positions, self.tokens, self.log_q, self.log_q_squares

    def valid_share(self) -> tuple[float, float, float]:
        """The share of valid samples with its 95% Wilson interval."""
        low, high = wilson_interval(self.valid, self.samples)
        return self.valid / max(self.samples, 1), low, high

    def mean_log_q(self) -> tuple[float, float, float]:
        """The mean log q(x) per token with its 95% normal interval (-inf throughout once a sample is outside the
        language: the generative perplexity is then infinite)."""
        n = max(self.samples, 1)
        mean = self.log_q / n
        if not math.isfinite(mean):
            return -math.inf, -math.inf, -math.inf
        variance = max(self.log_q_squares / n - mean * mean, 0.0) * n / max(n - 1, 1)
        half = NormalDist().inv_cdf(0.975) * math.sqrt(variance / n)
        return mean, mean - half, mean + half


#: The qualities of a synthetic task: name -> (its description, the Counts method computing it).
SYNTHETIC_QUALITIES = {
    "valid": ("valid share (1 - SER)", "valid_share"),
    "likelihood": ("mean log q(x) per token (minus the log of the generative perplexity)", "mean_log_q"),
}


class SyntheticTask:
    """Samples of ``length`` tokens scored by ``language``; ``batch_size`` rows per `generate` call; ``quality``
    "valid" (1 - SER) or "likelihood" (the samples' mean log q(x) per token, whose exponential of minus it is the
    generative perplexity)."""

    def __init__(self, language: Any, length: int, batch_size: int = 64, quality: str = "valid"):
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        if quality not in SYNTHETIC_QUALITIES:
            raise ValueError(f"unknown quality {quality!r}: use one of {', '.join(SYNTHETIC_QUALITIES)}")
        self.language, self.length, self.batch_size = language, int(length), int(batch_size)
        self.quality_name, self._quality = SYNTHETIC_QUALITIES[quality]

    def quality(self, counts: Counts) -> tuple[float, float, float]:
        return getattr(counts, self._quality)()

    @property
    def description(self) -> str:
        return f"{self.language.language_class} language, {self.length} tokens from the empty prompt, temperature 1"

    @property
    def generation_fields(self) -> dict:
        """The fields every sample is drawn with (see the module docstring)."""
        return {**SYNTHETIC_FIELDS, "max_new_tokens": self.length}

    def check_sizes(self, timing_rows: int, max_samples: int) -> None:
        """A synthetic language draws as many samples as asked: nothing to check."""

    @property
    def key(self) -> str:
        described = json.dumps([self.language.to_config(), self.length], sort_keys=True, default=str)
        return "synthetic|" + hashlib.sha1(described.encode()).hexdigest()[:12]

    def measure(self, model: Any, setting: dict, num: int, start: int, split: str = "dev") -> Counts:
        """Counts of samples ``start`` to ``start + num`` of ``split`` ("dev" or "test") drawn with ``setting``."""
        seed = (DEV_SEED if split == "dev" else TEST_SEED) + start
        counts = Counts()
        mask_id = int(model.config.mask_token_id)
        for out in generate_batches(model, num, self.length, seed, setting, self.batch_size):
            rows = out.sequences.cpu()
            counts = counts + self._scored(rows, float(active_steps(out.history, mask_id).double().sum()))
            counts.positions += float(out.forward_tokens)
        return counts

    def _scored(self, rows: torch.Tensor, forwards: float) -> Counts:
        """A chunk's validity and log q(x) per token counts (forwards given; positions added by the caller)."""
        per_token = self.language.log_prob(rows).double() / self.length
        squares = float((per_token**2).sum()) if bool(torch.isfinite(per_token).all()) else math.inf
        valid = int(self.language.in_support(rows).sum())
        return Counts(valid, rows.shape[0], forwards, 0.0, 0.0, float(per_token.sum()), squares)

    def measure_ar(self, model: Any, num: int) -> Counts:
        """Counts of ``num`` ancestral samples of an AR baseline (one forward a token) on the development split."""
        rows = sample_ar(model, num, self.length, seed=DEV_SEED, batch_size=self.batch_size)
        counts = self._scored(rows.cpu(), float(num * self.length))
        counts.positions = float(num * self.length)  # one new position a forward with the KV cache
        return counts

    def timed_ar_run(self, model: Any, rows: int) -> Callable[[], Any]:
        """One call drawing ``rows`` sequences from the AR baseline."""
        return lambda: sample_ar(model, rows, self.length, seed=0, batch_size=rows)

    def timed_run(self, model: Any, setting: dict, rows: int) -> Callable[[], Any]:
        """One `generate` call of ``rows`` sequences with ``setting``: what the tokens/s axis times."""
        empty = torch.zeros(rows, 0, dtype=torch.long, device=model_device(model))
        kwargs = {"steps": None, **setting, **self.generation_fields}
        return lambda: diffusion_generate(model, empty, seed=0, **kwargs)


class LmEvalTask:
    """A generation task of lm-eval (e.g. the harness's ``mdm_gsm8k``) run through an hf_mdm lm-eval model ``lm``
    (`hf_mdm.harness.create_lm`), each setting as the run's generation kwargs with ``max_gen_toks``; the quality is
    the share of documents whose 0/1 ``metric`` (of the task's first filter) is 1, with its Wilson interval. The
    development split is the task's documents from 0, the held-out split those from ``test_start`` on (disjoint
    when ``test_start`` is at least the development documents used). Costs from the harness's per-request timing:
    sequential forwards, positions computed and tokens generated. ``manager``: an lm-eval task manager that knows
    ``task`` (default: `hf_mdm.harness.evaluator.build_task_manager`'s)."""

    def __init__(
        self,
        lm: Any,
        task: str,
        test_start: int,
        metric: str = "exact_match",
        max_gen_toks: int = 256,
        manager: Any = None,
    ):
        from ..harness.evaluator import build_task_manager

        self.lm, self.task, self.metric, self.test_start = lm, task, metric, int(test_start)
        self.length = int(max_gen_toks)
        self.manager = manager if manager is not None else build_task_manager([task])
        self.quality_name = f"{task} {metric} (share of documents)"

    def quality(self, counts: Counts) -> tuple[float, float, float]:
        return counts.valid_share()

    @property
    def description(self) -> str:
        return f"lm-eval task {self.task}, up to {self.length} generated tokens"

    @property
    def key(self) -> str:
        described = json.dumps([self.task, self.metric, self.length, str(getattr(self.lm, "pretrained", ""))])
        return "lm-eval|" + hashlib.sha1(described.encode()).hexdigest()[:12]

    @cached_property
    def _lm_eval_task(self) -> Any:
        return load_lm_eval_task(self.manager, self.task)

    @property
    def generation_fields(self) -> dict:
        """The sampler fields of the task's own generation kwargs (lm-eval's tasks send temperature 0), and
        ``max_new_tokens``: what every setting is measured with."""
        from ..harness.sampler_config import sampler_fields

        config = getattr(self._lm_eval_task, "config", None)
        kwargs = dict(getattr(config, "generation_kwargs", None) or {})
        return {**{k: v for k, v in kwargs.items() if k in sampler_fields()}, "max_new_tokens": self.length}

    def check_sizes(self, timing_rows: int, max_samples: int) -> None:
        """Documents enough for the timed calls and both splits (`check_documents`)."""
        check_documents(self._lm_eval_task, self.task, timing_rows, max_samples, self.test_start)

    def measure(self, model: Any, setting: dict, num: int, start: int, split: str = "dev") -> Counts:
        """Counts of documents ``start`` to ``start + num`` of ``split`` answered with ``setting``."""
        first = start + (0 if split == "dev" else self.test_start)
        return self._run(self.lm, {**setting, "max_gen_toks": self.length}, first, num)

    def measure_ar(self, lm: Any, num: int) -> Counts:
        """Counts of the first ``num`` development documents answered by an AR lm-eval model (``hf_timed``)."""
        return self._run(lm, {"max_gen_toks": self.length}, 0, num)

    def timed_ar_run(self, lm: Any, rows: int) -> Callable[[], Any]:
        """The AR model on the task's first ``rows`` development documents."""
        return lambda: self.measure_ar(lm, rows)

    def _run(self, lm: Any, gen_kwargs: dict, first: int, num: int) -> Counts:
        from ..harness.evaluator import simple_evaluate

        results = simple_evaluate(
            lm,
            tasks=[self.task],
            samples={self.task: list(range(first, first + num))},
            log_samples=True,
            gen_kwargs=gen_kwargs,
            task_manager=self.manager,
        )
        logged = results["samples"][self.task]
        kept = [s for s in logged if s["filter"] == logged[0]["filter"]]
        timing = [t for s in kept for t in s.get("timing") or []]
        return Counts(
            int(sum(float(s[self.metric]) == 1.0 for s in kept)),
            len(kept),
            float(sum(t["nfe"] for t in timing)),
            float(sum(t.get("forward_tokens", 0.0) for t in timing)),
            float(sum(t["generated_tokens"] for t in timing)),
        )

    def timed_run(self, model: Any, setting: dict, rows: int) -> Callable[[], Any]:
        """The task's first ``rows`` development documents answered with ``setting``."""
        return lambda: self.measure(model, setting, rows, 0, "dev")


def load_lm_eval_task(manager: Any, name: str) -> Any:
    """lm-eval's task object ``name`` (its documents and generation kwargs); None for a group of tasks."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # lm-eval 0.4.13 deprecates it for load()
        found = manager.load_task_or_group([name]).get(name)
    return found if hasattr(found, "eval_docs") else None


def check_documents(task: Any, name: str, timing_rows: int, max_samples: int, test_start: int) -> None:
    """A ValueError naming the numbers and what to change when lm-eval's ``task`` (`load_lm_eval_task`) has fewer
    documents than the timed calls or the two splits read (None, a group of tasks: not checked)."""
    if task is None:
        return
    docs = len(task.eval_docs)
    if timing_rows > docs:
        raise ValueError(
            f"--timing-rows {timing_rows} is more than the {docs} documents of {name}: pass --timing-rows {docs} or "
            "fewer"
        )
    if max_samples > docs:
        raise ValueError(
            f"--max-samples {max_samples} is more than the {docs} documents of {name}: pass --max-samples "
            f"{docs // 2} or fewer (the development split reads the first --max-samples documents, the held-out "
            "split as many from --test-start)"
        )
    if test_start + max_samples > docs:
        raise ValueError(
            f"the held-out split (--test-start {test_start} + --max-samples {max_samples} documents) runs past the "
            f"{docs} documents of {name}: lower --test-start or --max-samples"
        )
