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
- ``decoding``: the rollouts' own sampler law (`hf_mdm.sampler_likelihood.RevealLaw`, ``steps`` and its transfer
  and order): the positions grouped into steps as that sampler groups them, each token scored given the tokens
  revealed before its step. ``steps`` forwards; its expectation is a lower bound of log pi_N(y), the exact
  log-likelihood under that sampler (Jensen over the groupings), and at one token a step it is the ELBO.
- ``elbo``: LLaDA's Monte Carlo ELBO with ``draws`` masked copies (the count of masked tokens m uniform in 1..C,
  stratified over the draws, positions uniform); term i = mean over draws of (C / m) 1[i masked] log p(y_i | copy).
  Unbiased for the ELBO, a lower bound of the log-likelihood under any-order decoding (Jensen), with variance
  falling as 1 / draws. ``draws`` forwards.

`exact_expectation` computes each estimator's expectation by enumerating the masks (small C), and
`hf_mdm.sampler_likelihood.exact_sampler_log_probs` the log-likelihood under a sampler's decoding law, so the
bias of each against the decoding law and the spread of its draws can be measured (`evaluation/rl_estimators.py`).

Each row draws its masks from its own generator: GRPO's old, reference and current log-likelihoods of a rollout must
use the same masks, whatever batch it is in (`hf_mdm.rl.trainer` seeds each row from its tokens). Block-causal models (``config.block_size``) are
scored in the block-diffusion form of their training (`hf_mdm.finetune.objective.block_diffusion_inputs`: a
noisy block sees the clean blocks before it). The [MASK] token's logit is removed before the softmax, as the
samplers draw.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch

from ..families import attention_block_size
from ..finetune.objective import block_diffusion_inputs
from ..finetune.trainer import base_model
from ..generation_denoiser import logits_shift_of

__all__ = [
    "ESTIMATORS",
    "LogLikelihoodEstimator",
    "build_estimator",
    "exact_expectation",
    "inner_model",
    "masked_token_log_probs",
]

ESTIMATORS: dict[str, type["LogLikelihoodEstimator"]] = {}


def inner_model(model: Any) -> Any:
    """The model under data-parallel (``.module``) and PEFT wrappers: where its config and family facts are."""
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
    """An estimator of per-token log-likelihoods of completions (see the module docstring); registered by name."""

    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ESTIMATORS[cls.name] = cls

    @abstractmethod
    def masks(self, completion: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The copies one estimate scores: (masked completion columns (C,) bool, weight of their terms (C,))."""

    def prompt_mask(self, prompt: int, generator: torch.Generator) -> Optional[torch.Tensor]:
        """(prompt,) bool: prompt tokens masked in the copies (None: the prompt is kept whole)."""
        return None

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
    prompt_mask_rate: float = 0.15

    def masks(self, completion: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.ones(completion, dtype=torch.bool), torch.ones(completion))]

    def prompt_mask(self, prompt: int, generator: torch.Generator) -> Optional[torch.Tensor]:
        if self.prompt_mask_rate <= 0 or prompt == 0:
            return None
        return torch.rand(prompt, generator=generator) < self.prompt_mask_rate


@dataclass
class Coupled(LogLikelihoodEstimator):
    """DiffuCoder's coupled complementary masks: t uniform in ``time_range``, a mask at rate t and its complement."""

    name: ClassVar[str] = "coupled"
    time_range: tuple[float, float] = (0.0, 1.0)

    def masks(self, completion: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        low, high = self.time_range
        t = low + (high - low) * float(torch.rand((), generator=generator))
        first = torch.rand(completion, generator=generator) < t
        return [(first, torch.ones(completion)), (~first, torch.ones(completion))]


@dataclass
class MonteCarloELBO(LogLikelihoodEstimator):
    """LLaDA's Monte Carlo ELBO with ``draws`` masked copies (stratified mask counts, weight C / m)."""

    name: ClassVar[str] = "elbo"
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


@dataclass
class DecodingLaw(LogLikelihoodEstimator):
    """The rollouts' own sampler: positions grouped into ``steps`` steps by its law (`RevealLaw`: ``transfer``,
    ``order``, ``schedule``), each token scored given the tokens revealed before its step."""

    name: ClassVar[str] = "decoding"
    steps: int = 1
    transfer: str = "stochastic"
    order: str = "random"
    schedule: str = "linear"

    def masks(self, completion: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        step = self.law().sample_steps(1, completion, generator)[0]
        return [(step >= k, (step == k).float()) for k in range(self.steps)]

    def law(self) -> Any:
        from ..sampler_likelihood import RevealLaw

        return RevealLaw(self.steps, self.order, self.transfer, self.schedule)


def build_estimator(name: str, **options: Any) -> LogLikelihoodEstimator:
    """The estimator registered as ``name`` with its ``options`` (a ValueError naming the choices otherwise)."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown log-likelihood estimator {name!r}: choose one of {sorted(ESTIMATORS)}")
    try:
        return ESTIMATORS[name](**options)
    except TypeError as err:
        raise ValueError(f"estimator {name!r}: {err}") from None


@torch.no_grad()
def exact_expectation(estimator: LogLikelihoodEstimator, model: Any, sequence: torch.Tensor) -> float:
    """The expectation of ``estimator``'s summed estimate for one prompt-free ``sequence`` (L,), by enumerating
    every mask with its probability (small L): what its draws average to, to set beside the exact log-likelihood."""
    length = sequence.numel()
    x = sequence[None]
    mask_id = int(base_model(model).config.mask_token_id)

    memo: dict[tuple[int, ...], torch.Tensor] = {}

    def scored(masked: tuple[int, ...]) -> torch.Tensor:  # log p(x_i | x with `masked` masked), for i in masked
        if masked not in memo:
            noisy = x.clone()
            noisy[0, list(masked)] = mask_id
            memo[masked] = masked_token_log_probs(model, noisy, x, None, 0)[0][0, list(masked)].double()
        return memo[masked]

    subsets = [s for r in range(1, length + 1) for s in itertools.combinations(range(length), r)]
    if isinstance(estimator, OneStep):
        return float(scored(tuple(range(length))).sum())
    if isinstance(estimator, MonteCarloELBO):  # m uniform in 1..L, then a uniform subset of m: weight L / m
        return sum(float(scored(s).sum()) / len(s) / math.comb(length, len(s)) for s in subsets)
    if isinstance(estimator, Coupled) and estimator.time_range == (0.0, 1.0):
        # P(first mask = S) = integral of t^|S| (1 - t)^(L - |S|) dt = 1 / ((L + 1) C(L, |S|)); the complement scores
        # the rest, so every subset S (the empty one included) contributes its own terms with P(S) + P(complement).
        total = 0.0
        for s in subsets:
            chance = 2.0 / ((length + 1) * math.comb(length, len(s)))
            total += chance * float(scored(s).sum())
        return total
    if isinstance(estimator, DecodingLaw):  # every ordered partition with its chance under the law
        from ..sampler_likelihood import ordered_partitions

        total = 0.0
        for groups in ordered_partitions(tuple(range(length))):
            chance = estimator.law().log_prob_of(groups, length)
            if chance == -math.inf:
                continue
            revealed: tuple[int, ...] = ()
            value = 0.0
            for group in groups:
                masked = tuple(i for i in range(length) if i not in revealed)
                scores = dict(zip(masked, scored(masked).tolist()))
                value += sum(scores[i] for i in group)
                revealed += group
            total += math.exp(chance) * value
        return total
    raise ValueError(f"no exact expectation for {estimator!r}")
