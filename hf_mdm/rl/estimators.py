"""Per-token log-likelihood estimates of a completion under a masked diffusion LM: what GRPO's ratio needs.

An autoregressive policy gives log pi(y_i | x, y_<i) exactly in one forward; a masked diffusion LM has no such
factorisation, so diffusion RL methods estimate it from masked copies of (prompt, completion). Each estimator here
returns a (B, C) tensor of per-token terms whose sum over a row is its estimate of the completion's log-likelihood:

- ``one_step`` (d1's diffu-GRPO, arXiv 2504.12216): the completion fully masked, each prompt token masked with
  probability ``prompt_mask_rate`` (d1: 0.15); term i = log p(y_i | that canvas). One forward. Its only randomness
  is the prompt's mask (none without one), so its variance is small; its bias is that of a mean-field guess: every
  token is scored as if no other completion token were known.
- ``coupled`` (DiffuCoder's coupled-GRPO, arXiv 2506.20639): a mask time t uniform in ``time_range``, each
  completion token masked with probability t, and the complementary mask; every token is scored exactly once, in
  the copy where it is masked. Two forwards; less variance than one random mask, and no 1/t weight.
- ``decoding``: the rollouts' own sampler law (`hf_mdm.likelihood_law.RevealLaw`: ``steps``, transfer, order,
  schedule and ``block_length``, every one taken from the rollouts' settings, which it refuses by name where they
  shape the law in a way it does not model): the positions grouped into steps as that sampler groups them, each
  token scored given the tokens revealed before its step. ``steps`` forwards; its expectation is a lower bound of
  log pi_N(y), the exact log-likelihood under that sampler (Jensen over the groupings), and at one token a step it
  is the ELBO.
- ``elbo``: LLaDA's Monte Carlo ELBO with ``draws`` masked copies (the count of masked tokens m uniform in 1..C,
  stratified over the draws, positions uniform); term i = mean over draws of (C / m) 1[i masked] log p(y_i | copy).
  Unbiased for the ELBO, a lower bound of the log-likelihood under any-order decoding (Jensen), with variance
  falling as 1 / draws. ``draws`` forwards. Its per-token terms are not log-probabilities, so with TRL's
  ``num_iterations > 1`` it needs the sequence-level ratio (``importance_sampling_level="sequence"``).

`exact_expectation` computes each estimator's expectation by enumerating the masks (small C; each estimator class
carries its own enumeration, `LogLikelihoodEstimator.expectation`), and
`hf_mdm.likelihood_law.exact_sampler_log_probs` the log-likelihood under a sampler's decoding law, so the
bias of each against the decoding law and the spread of its draws can be measured (`evaluation/rl_estimators.py`).

Each row draws its masks from its own generator: GRPO's old, reference and current log-likelihoods of a rollout must
use the same masks, whatever batch it is in (`hf_mdm.rl.trainer` seeds each row from its tokens and the step its
rollout was drawn at, so each step draws new masks). Block-causal models (``config.block_size``) are
scored in the block-diffusion form of their training (`hf_mdm.finetune.objective.block_diffusion_inputs`: a
noisy block sees the clean blocks before it). The [MASK] token's logit is removed before the softmax, as the
samplers draw.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

import torch

from ..families import attention_block_size
from ..generation_denoiser import logits_shift_of
from ..generation_processors import NEUTRAL

__all__ = [
    "ESTIMATORS",
    "LogLikelihoodEstimator",
    "build_estimator",
    "estimator_help",
    "estimator_options",
    "exact_expectation",
    "inner_model",
    "masked_token_log_probs",
]

ESTIMATORS: dict[str, type["LogLikelihoodEstimator"]] = {}
#: log p(x_i | x with the positions ``masked`` masked) for each i in ``masked`` (what `exact_expectation` enumerates).
Scores = Callable[[tuple[int, ...]], dict[int, float]]


def inner_model(model: Any) -> Any:
    """The model under data-parallel (``.module``) and PEFT wrappers: where its config and family facts are."""
    from ..finetune.trainer import base_model  # (hf_mdm.finetune loads datasets and peft: not at import)

    while hasattr(model, "module"):
        model = model.module
    return base_model(model)


def masked_token_log_probs(
    model: Any,
    noisy: torch.Tensor,
    clean: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    start: int,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C) log p(clean[:, start + i] | noisy) for the C = L - start completion columns, the model's token law
    at ``temperature`` with [MASK] removed (block-causal models in their block-diffusion form), and (B, C) that
    law's entropy (detached)."""
    inner = inner_model(model)
    block = attention_block_size(inner)
    if block is not None:
        from ..finetune.objective import block_diffusion_inputs

        kwargs = block_diffusion_inputs(noisy, clean, int(block))
    else:
        kwargs = {"input_ids": noisy} | ({} if attention_mask is None else {"attention_mask": attention_mask})
    shift = logits_shift_of(inner)
    logits = model(**kwargs).logits[:, start - shift : clean.shape[1] - shift].float() / temperature
    logits[..., int(inner.config.mask_token_id)] = -math.inf
    logp = torch.log_softmax(logits, -1)
    with torch.no_grad():
        entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)
    return logp.gather(-1, clean[:, start:, None]).squeeze(-1), entropy


@dataclass
class LogLikelihoodEstimator(ABC):
    """An estimator of per-token log-likelihoods of completions (see the module docstring); registered by name.

    Each class says what it needs and what it is: ``per_token_log_probs`` (whether each term is one token's
    log-probability, so TRL's token-level ratio is a ratio of probabilities), `rollout_options` (the options it takes
    from the rollouts' generation config), `check_model` (models it cannot score) and `expectation` (its expectation
    by enumeration, what `exact_expectation` returns)."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for help texts
    per_token_log_probs: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ESTIMATORS[cls.name] = cls

    @abstractmethod
    def masks(self, completion: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The copies one estimate scores: (masked completion columns (C,) bool, weight of their terms (C,))."""

    def prompt_mask(self, prompt: int, generator: torch.Generator) -> Optional[torch.Tensor]:
        """(prompt,) bool: prompt tokens masked in the copies (None: the prompt is kept whole)."""
        return None

    @classmethod
    def rollout_options(cls, rollout: Any) -> dict[str, Any]:
        """Options taken from the rollouts' `MaskedDiffusionGenerationConfig` (default: none)."""
        return {}

    def check_model(self, model: Any) -> None:
        """A ValueError for a model this estimator cannot score (default: every model)."""

    def expectation(self, scores: Scores, length: int) -> float:
        """The expectation of the summed estimate of one prompt-free sequence of ``length`` tokens, enumerating every
        mask with its chance; ``scores(masked)`` gives log p(x_i | x with ``masked`` masked) for each i in
        ``masked``."""
        raise ValueError(f"no exact expectation for {self!r}")

    @property
    def forwards(self) -> int:
        """Forward passes of one estimate (of a batch of rows)."""
        return len(self.masks(1, torch.Generator().manual_seed(0)))

    def per_token(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        completion: int,
        generators: list[torch.Generator],
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C) per-token terms for the last ``completion`` columns of ``input_ids`` (prompt before them), each
        row's masks drawn from its own generator, the token law at ``temperature`` (the rollouts'), and (B, C) its
        entropy where each token was last scored."""
        mask_id = int(inner_model(model).config.mask_token_id)
        start = input_ids.shape[1] - completion
        rows = [self.masks(completion, g) for g in generators]
        prompts = [self.prompt_mask(start, g) for g in generators]
        total = torch.zeros(input_ids.shape[0], completion, device=input_ids.device)
        entropy = torch.zeros_like(total)
        for j in range(len(rows[0])):
            masked = torch.stack([row[j][0] for row in rows]).to(input_ids.device)
            weight = torch.stack([row[j][1] for row in rows]).to(input_ids.device)
            noisy = input_ids.clone()
            noisy[:, start:] = noisy[:, start:].masked_fill(masked, mask_id)
            if prompts[0] is not None:
                noisy[:, :start] = noisy[:, :start].masked_fill(torch.stack(prompts).to(noisy.device), mask_id)
            logp, law_entropy = masked_token_log_probs(model, noisy, input_ids, attention_mask, start, temperature)
            total = total + logp * weight * masked
            entropy = torch.where(masked, law_entropy, entropy)
        return total, entropy


@dataclass
class OneStep(LogLikelihoodEstimator):
    """d1's one-step estimate: the completion fully masked, prompt tokens masked at ``prompt_mask_rate``."""

    name: ClassVar[str] = "one_step"
    summary: ClassVar[str] = "d1's one step, the completion fully masked (1 forward)"
    prompt_mask_rate: float = 0.15

    def masks(self, completion: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.ones(completion, dtype=torch.bool), torch.ones(completion))]

    def prompt_mask(self, prompt: int, generator: torch.Generator) -> Optional[torch.Tensor]:
        if self.prompt_mask_rate <= 0 or prompt == 0:
            return None
        return torch.rand(prompt, generator=generator) < self.prompt_mask_rate

    def expectation(self, scores: Scores, length: int) -> float:
        return sum(scores(tuple(range(length))).values())


@dataclass
class Coupled(LogLikelihoodEstimator):
    """DiffuCoder's coupled complementary masks: t uniform in ``time_range``, a mask at rate t and its complement."""

    name: ClassVar[str] = "coupled"
    summary: ClassVar[str] = "DiffuCoder's coupled complementary masks (2 forwards)"
    time_range: tuple[float, float] = (0.0, 1.0)

    def masks(self, completion: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        low, high = self.time_range
        t = low + (high - low) * float(torch.rand((), generator=generator))
        first = torch.rand(completion, generator=generator) < t
        return [(first, torch.ones(completion)), (~first, torch.ones(completion))]

    def expectation(self, scores: Scores, length: int) -> float:
        """P(first mask = S) = integral of t^|S| (1 - t)^(L - |S|) dt = 1 / ((L + 1) C(L, |S|)) for t uniform in
        [0, 1]; the complement scores the rest, so every nonempty S contributes its own terms with P(S) + P(~S)."""
        if tuple(self.time_range) != (0.0, 1.0):
            raise ValueError(f"the coupled expectation is enumerated for time_range=(0, 1), not {self.time_range}")
        return sum(2.0 / ((length + 1) * math.comb(length, len(s))) * sum(scores(s).values()) for s in _subsets(length))


@dataclass
class MonteCarloELBO(LogLikelihoodEstimator):
    """LLaDA's Monte Carlo ELBO with ``draws`` masked copies (stratified mask counts, weight C / m). Its per-token
    terms are not log-probabilities (weights C / m, and 0 for a token masked in no draw): only their sum estimates
    a log-likelihood, so a ratio across policy updates (TRL's ``num_iterations > 1``) must be the sequence's."""

    name: ClassVar[str] = "elbo"
    summary: ClassVar[str] = "LLaDA's Monte Carlo ELBO (draws forwards)"
    per_token_log_probs: ClassVar[bool] = False
    draws: int = 8

    def masks(self, completion: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        k = int(torch.randint(completion, (), generator=generator))  # each draw's count uniform in 1..C
        counts = [(k + j * completion // self.draws) % completion + 1 for j in range(self.draws)]
        copies = []
        for m in counts:
            masked = torch.zeros(completion, dtype=torch.bool)
            masked[torch.randperm(completion, generator=generator)[:m]] = True
            copies.append((masked, torch.full((completion,), completion / m / self.draws)))
        return copies

    def expectation(self, scores: Scores, length: int) -> float:
        """m uniform in 1..L, then a uniform subset of m positions: each subset S weighs 1 / (L C(L, |S|)) and its
        terms L / |S|."""
        return sum(sum(scores(s).values()) / len(s) / math.comb(length, len(s)) for s in _subsets(length))


#: Rollout settings the ``decoding`` law models: its option <- the generation config's field.
LAW_SETTINGS = {"steps": "steps", "block_length": "block_length", "transfer": "transfer", "order": "strategy",
                "schedule": "schedule"}  # fmt: skip
#: Rollout settings that leave the law of the kept tokens as it is: ids, outputs, compilation, batching, and the
#: temperature and length, which the trainer passes (`per_token`'s temperature, ``generation_length``); any other
#: field leaves it as it is only at its neutral value (`hf_mdm.generation_processors.NEUTRAL`).
LAW_NEUTRAL = frozenset(
    {
        "max_new_tokens", "temperature", "do_sample", "transformers_version", "_from_model_config",
        "mask_token_id", "pad_token_id", "eos_token_id", "bos_token_id", "stop_at_eos", "finish_at_eos",
        "output_history", "return_dict_in_generate", "output_scores", "output_logits", "logits_shift",
        "compile_forward", "batch_invariant", "use_cache",
    }
)  # fmt: skip


@dataclass
class DecodingLaw(LogLikelihoodEstimator):
    """The rollouts' own sampler: positions grouped into steps by its law (`RevealLaw`: ``steps``, ``transfer``,
    ``order``, ``schedule``, and ``block_length``: blocks left to right from the completion's first token, the
    steps split over them as the sampler splits them), each token scored given the tokens revealed before its step.
    ``generation_length`` is the rollouts' ``max_new_tokens``: a completion cut at its EOS is scored with the
    grouping its first tokens had in the sampler's canvas of that length. In the trainer every option comes from
    the rollouts' generation config (`rollout_options`), which refuses the settings this law does not model."""

    name: ClassVar[str] = "decoding"
    summary: ClassVar[str] = "the rollouts' own sampler law, a lower bound of its log-likelihood (steps forwards)"
    steps: int = 1
    transfer: str = "stochastic"
    order: str = "random"
    schedule: str = "linear"
    block_length: Optional[int] = None
    generation_length: Optional[int] = None

    def __post_init__(self) -> None:
        try:
            self.law()
        except ValueError as err:
            raise ValueError(
                f"the decoding estimator needs a rollout whose grouping does not depend on the drawn tokens ({err}): "
                "set the rollout's strategy=random and transfer=stochastic or deterministic (--rollout "
                "strategy=random --rollout transfer=stochastic), or choose another --estimator"
            ) from None

    def law(self) -> Any:
        from ..likelihood_law import RevealLaw

        return RevealLaw(self.steps, self.order, self.transfer, self.schedule, self.block_length)

    @classmethod
    def rollout_options(cls, rollout: Any) -> dict[str, Any]:
        """Every setting of ``rollout`` that shapes its law, a ValueError naming the first one it does not model."""
        settings = rollout.to_diff_dict()
        unmodelled = sorted(
            (key, value) for key, value in settings.items()
            if key not in LAW_NEUTRAL and key not in LAW_SETTINGS.values() and value is not None
            and (key not in NEUTRAL or NEUTRAL[key] != value)
        )  # fmt: skip
        if unmodelled:
            key, value = unmodelled[0]
            others = ", ".join(name for name in ESTIMATORS if name != cls.name)
            raise ValueError(
                f"the decoding estimator models the rollouts' {', '.join(LAW_SETTINGS.values())} and temperature; "
                f"the rollout setting {key}={value!r} changes their law in a way it does not: drop it (--rollout "
                f"{key}=..., rollout={{'{key}': ...}}) or choose another --estimator ({others})"
            )
        options = {opt: getattr(rollout, field) for opt, field in LAW_SETTINGS.items()}
        options = {opt: value for opt, value in options.items() if value is not None}
        options.setdefault("steps", rollout.max_new_tokens)  # steps=None: one token a step
        return options | {"generation_length": rollout.max_new_tokens}

    def check_model(self, model: Any) -> None:
        block = attention_block_size(inner_model(model))
        if block is not None:
            raise ValueError(
                f"the decoding estimator lays the rollouts' blocks from the completion's first token; "
                f"{type(inner_model(model)).__name__} (block_size={block}) aligns them to its attention blocks from "
                "the prompt's first token: choose --estimator coupled, one_step or elbo"
            )

    def masks(self, completion: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        law, length = self.law(), max(completion, self.generation_length or 0)
        step = law.sample_steps(1, length, generator)[0, :completion]
        return [(step >= k, (step == k).float()) for k in range(law.total_steps(length))]

    def expectation(self, scores: Scores, length: int) -> float:
        """Every ordered partition of the positions with its chance under the law, each group scored given the
        groups before it."""
        from ..likelihood_law import ordered_partitions

        if self.generation_length not in (None, length):
            raise ValueError(f"generation_length={self.generation_length}: enumerate sequences of that length")
        law, total = self.law(), 0.0
        for groups in ordered_partitions(tuple(range(length))):
            chance = law.log_prob_of(groups, length)
            if chance == -math.inf:
                continue
            revealed: set[int] = set()
            value = 0.0
            for group in groups:
                masked = tuple(i for i in range(length) if i not in revealed)
                value += sum(scores(masked)[i] for i in group)
                revealed.update(group)
            total += math.exp(chance) * value
        return total


def estimator_options(name: str, options: dict[str, Any], rollout: Any) -> dict[str, Any]:
    """The options of estimator ``name``: those it takes from the ``rollout`` generation config
    (`LogLikelihoodEstimator.rollout_options`), then ``options``, which may not contradict them."""
    cls = _registered(name)
    taken = cls.rollout_options(rollout)
    for key, value in options.items():
        if key in taken and value != taken[key]:
            raise ValueError(
                f"estimator option {key}={value!r} contradicts the rollouts' {key}={taken[key]!r}: the {name} "
                f"estimator takes it from the rollout settings (drop --estimator-option {key})"
            )
    return taken | dict(options)


def build_estimator(name: str, **options: Any) -> LogLikelihoodEstimator:
    """The estimator registered as ``name`` with its ``options`` (a ValueError naming the choices otherwise)."""
    cls = _registered(name)
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        accepted = ", ".join(f"{key}={value!r}" for key, value in fields.items()) or "none"
        raise ValueError(
            f"estimator {name!r} has no option {', '.join(map(repr, unknown))}: its options (with their defaults) "
            f"are {accepted} (--estimator-option key=value)"
        )
    return cls(**options)


def estimator_help() -> str:
    """One line per registered estimator: its name and summary (the help of ``--estimator`` and the config)."""
    return "; ".join(f"{name}: {cls.summary}" for name, cls in ESTIMATORS.items())


def _registered(name: str) -> type[LogLikelihoodEstimator]:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown log-likelihood estimator {name!r}: choose one of {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def _subsets(length: int) -> list[tuple[int, ...]]:
    """Every nonempty subset of ``range(length)``, as sorted tuples."""
    return [s for r in range(1, length + 1) for s in itertools.combinations(range(length), r)]


@torch.no_grad()
def exact_expectation(estimator: LogLikelihoodEstimator, model: Any, sequence: torch.Tensor) -> float:
    """The expectation of ``estimator``'s summed estimate for one prompt-free ``sequence`` (L,), by enumerating
    every mask with its probability (small L; `LogLikelihoodEstimator.expectation`): what its draws average to, to
    set beside the exact log-likelihood. The 2^L - 1 masked copies are scored in one forward."""
    length, mask_id = sequence.numel(), int(inner_model(model).config.mask_token_id)
    subsets = _subsets(length)
    noisy = sequence.repeat(len(subsets), 1)
    for row, masked in enumerate(subsets):
        noisy[row, list(masked)] = mask_id
    logp = masked_token_log_probs(model, noisy, sequence.expand(len(subsets), -1), None, 0)[0].double().tolist()
    table = {masked: {i: logp[row][i] for i in masked} for row, masked in enumerate(subsets)}
    return float(estimator.expectation(table.__getitem__, length))
