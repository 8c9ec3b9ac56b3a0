"""Which positions a denoising step reveals: propose a token at each scored position, score, choose.

- `Proposer` turns logits (N, V) into proposals: the token (argmax at temperature 0, else a draw after the user's
  logits processors and the temperature / top-k / top-p warpers), its probability (the *confidence*) and, when a
  strategy needs them, the whole distributions. [MASK] is never proposed, but it is part of the normalisation (as
  in LLaDA and Dream).
- `strategy_scores` ranks positions (higher = revealed first): ``random``, ``confidence``, ``margin`` (top-1
  minus top-2 probability), ``entropy`` (negative entropy) or ``left_to_right`` (lowest position first).
  ``random`` and ``left_to_right`` ignore the proposals (`POSITIONAL_STRATEGIES`): the sampler chooses their
  positions first and runs the LM head only there (`positional_scores`).
- `choose` takes the ``counts`` best-scored candidates of each row (how many: `hf_mdm.generation_transfer`).

Nothing here sees the model; exported with the model as remote code (imports only torch and transformers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .generation_processors import left_context

STRATEGIES = ("random", "confidence", "margin", "entropy", "left_to_right")
POSITIONAL_STRATEGIES = ("random", "left_to_right")  # positions chosen without looking at the proposals
STRATEGY_ALIASES = {
    "low_confidence": "confidence",
    "maskgit_plus": "confidence",
    "topk_margin": "margin",
    "origin": "random",
}
NEEDS_DISTRIBUTIONS = ("margin", "entropy")  # strategies scored from the whole proposal distributions


def canonical_strategy(name: str) -> str:
    """The strategy ``name`` stands for (aliases resolved); a ValueError for an unknown one."""
    name = STRATEGY_ALIASES.get(name, name)
    if name not in STRATEGIES:
        raise ValueError(
            f"unknown strategy {name!r}: use one of {list(STRATEGIES)} or an alias {sorted(STRATEGY_ALIASES)}"
        )
    return name


def build_warpers(temperature: Optional[float], top_k: Optional[int], top_p: Optional[float]) -> LogitsProcessorList:
    """transformers' temperature / top-k / top-p warpers; none at temperature 0 (argmax)."""
    warpers = LogitsProcessorList()
    if temperature:
        warpers.append(TemperatureLogitsWarper(float(temperature)))
        if top_k is not None and top_k > 0:
            warpers.append(TopKLogitsWarper(int(top_k)))
        if top_p is not None and top_p < 1.0:
            warpers.append(TopPLogitsWarper(float(top_p)))
    return warpers


class Proposals(NamedTuple):
    """Proposed tokens (N,), their probabilities (N,), the distributions (N, V) when computed (else None), and,
    when the proposer records them (``output_scores`` / ``output_logits``), the processed scores and raw logits."""

    tokens: torch.Tensor
    confidence: torch.Tensor
    probs: Optional[torch.Tensor]
    scores: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None


class ProcessorIds(NamedTuple):
    """What logits processors read for each scored position: its canvas row (N, L) and its left context (N, L)
    (`hf_mdm.generation_processors.left_context`); None where no processor reads it."""

    canvas: Optional[torch.Tensor] = None
    left: Optional[torch.Tensor] = None


@dataclass
class Proposer:
    """Proposes a token at each scored position from its logits: ``processors`` read the canvas row of the
    position, ``context_processors`` its left context; ``record`` keeps the processed scores and raw logits."""

    mask_id: int
    temperature: float
    processors: LogitsProcessorList
    warpers: LogitsProcessorList
    generator: Optional[torch.Generator] = None
    context_processors: LogitsProcessorList = field(default_factory=LogitsProcessorList)
    record: bool = False

    def __call__(self, logits: torch.Tensor, ids: ProcessorIds, need_probs: bool = False) -> Proposals:
        """Proposals at N positions from their logits (N, V), with the recorded scores and logits when asked."""
        raw = logits.clone() if self.record else None
        proposals = self._propose(logits, ids, need_probs)
        return proposals._replace(logits=raw) if self.record else proposals

    def _propose(self, logits: torch.Tensor, ids: ProcessorIds, need_probs: bool) -> Proposals:
        """Proposals at N positions from their logits (N, V); the distributions are returned when sampling or when
        ``need_probs`` (margin, entropy). At temperature 0 the probability of the argmax is exp(max - logsumexp):
        two read-only passes over the logits instead of writing a softmax. ``ids``: what the processors read."""
        logits = self.process(logits, ids)
        scores = logits.clone() if self.record else None
        if self.temperature or need_probs:
            probs = torch.softmax(logits, dim=-1)
            if self.temperature:
                sample_probs = probs.clone()
                sample_probs[:, self.mask_id] = 0.0
                tokens = torch.multinomial(sample_probs, 1, generator=self.generator).squeeze(1)
            else:
                logits[:, self.mask_id] = -float("inf")
                tokens = logits.argmax(-1)
            return Proposals(tokens, probs.gather(-1, tokens[:, None]).squeeze(1), probs, scores)
        log_normaliser = torch.logsumexp(logits, dim=-1)
        logits[:, self.mask_id] = -float("inf")
        top, tokens = logits.max(-1)  # ties: the first index, as argmax
        return Proposals(tokens, torch.exp(top - log_normaliser), None, scores)

    def process(self, logits: torch.Tensor, ids: ProcessorIds) -> torch.Tensor:
        """The logits (N, V) after the logits processors and the temperature / top-k / top-p warpers."""
        logits = self.processors(ids.canvas, logits) if len(self.processors) else logits
        logits = self.context_processors(ids.left, logits) if len(self.context_processors) else logits
        return self.warpers(ids.canvas, logits) if len(self.warpers) else logits

    def distribution(self, logits: torch.Tensor, ids: ProcessorIds) -> torch.Tensor:
        """The law (N, V) a proposal is drawn from: the softmax of the processed logits with [MASK] removed and
        renormalised; one-hot at the proposed token at temperature 0. May write into ``logits``."""
        if not self.temperature:
            tokens = self(logits, ids).tokens
            return torch.zeros_like(logits).scatter_(1, tokens[:, None], 1.0)
        probs = torch.softmax(self.process(logits, ids), dim=-1)
        probs[:, self.mask_id] = 0.0
        return probs / probs.sum(-1, keepdim=True)

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        """A token (N,) from each law ``probs`` (N, V) (`distribution`'s): the argmax at temperature 0."""
        if not self.temperature:
            return probs.argmax(-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1)

    def processor_ids(self, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> ProcessorIds:
        """What the processors read for the scored positions (``rows``, ``cols``) (N,) of the canvas ``x``."""
        canvas = x[rows] if len(self.processors) else None
        left = left_context(x, rows, cols, self.mask_id) if len(self.context_processors) else None
        return ProcessorIds(canvas, left)


def strategy_scores(
    strategy: str, proposals: Proposals, keep: torch.Tensor, length: int, generator: Optional[torch.Generator]
) -> torch.Tensor:
    """Ranking scores (B, L) of every position (higher = reveal first) from the proposals at columns ``keep`` (K,)
    (confidence (B, K), probs (B, K, V) for margin and entropy); other columns are -inf."""
    confidence, probs = proposals.confidence, proposals.probs
    bsz = confidence.shape[0]
    if strategy == "random":
        return torch.rand((bsz, length), generator=generator, device=confidence.device).to(confidence.dtype)
    full = torch.full((bsz, length), -float("inf"), dtype=confidence.dtype, device=confidence.device)
    if strategy == "left_to_right":
        full[:, keep] = -keep.to(confidence.dtype)[None, :].expand(bsz, -1)
        return full
    if strategy == "confidence":
        score = confidence
    elif strategy == "margin":
        top2 = probs.topk(2, dim=-1).values
        score = top2[..., 0] - top2[..., 1]
    else:  # entropy: negative entropy, higher = more certain
        score = (probs * torch.log(probs + 1e-10)).sum(-1)
    full[:, keep] = score
    return full


def positional_scores(strategy: str, shape: torch.Size, generator: Optional[torch.Generator], device: Any) -> torch.Tensor:
    """Scores (B, L) of a strategy that ignores the proposals: uniform draws (random) or -position (left_to_right)."""
    if strategy == "random":
        return torch.rand(shape, generator=generator, device=device)
    return -torch.arange(shape[1], device=device, dtype=torch.float32).expand(shape[0], -1)


def choose(scores: torch.Tensor, candidates: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: the ``counts`` (B,) best-scored ``candidates`` (B, L) of each row (torch.topk's tie order)."""
    chosen = torch.zeros_like(candidates)
    kmax = int(counts.max())
    if kmax == 0:
        return chosen
    idx = torch.topk(scores.masked_fill(~candidates, -float("inf")), kmax, dim=-1).indices
    take = torch.arange(kmax, device=scores.device)[None, :] < counts[:, None]
    return chosen.scatter_(1, idx, take & candidates.gather(1, idx))
