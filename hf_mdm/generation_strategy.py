"""Which positions a denoising step reveals: propose a token at each scored position, score, choose.

- `Proposer` turns logits (N, V) into proposals: the token (argmax at temperature 0, else a draw after the user's
  logits processors and the temperature / top-k / top-p warpers), its probability (the *confidence*) and, when a
  strategy needs them, the whole distributions. [MASK] is never proposed, but it is part of the normalisation (as
  in LLaDA and Dream).
- a `Strategy` ranks positions (higher = revealed first); each is a class registered by name (`register_strategy`):
  ``random``, ``confidence``, ``margin`` (top-1 minus top-2 probability), ``entropy`` (negative entropy) or
  ``left_to_right`` (lowest position first). ``random`` and ``left_to_right`` are *positional*: they ignore the
  proposals, so the sampler chooses their positions first and runs the LM head only there.
- `choose` takes the ``counts`` best-scored candidates of each row (how many: `hf_mdm.generation_transfer`).

Nothing here sees the model; exported with the model as remote code (imports only torch and transformers).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .generation_ngram import NoRepeatNGram
from .generation_processors import left_context
from .generation_random import RowGenerators
from .generation_random import multinomial as random_multinomial
from .generation_random import rand as random_rand


class Strategy(ABC):
    """Which masked positions a step reveals first. A subclass registered with `register_strategy` is a strategy
    ``generate(strategy=name)`` takes: ``scores`` ranks every position (higher = revealed first). Subclass
    `ProposalStrategy` to rank from the step's proposals (``score``), or `PositionalStrategy` to rank without them
    (``positional_scores``, so the sampler runs the LM head only at the positions it chose);
    ``needs_distributions`` asks the proposer for the whole distributions."""

    name: str = ""
    aliases: tuple[str, ...] = ()
    positional: bool = False
    needs_distributions: bool = False
    draws: bool = False  # whether the scores are random numbers (`hf_mdm.generation_rows.draws_random_numbers`)

    @abstractmethod
    def scores(self, proposals: "Proposals", keep: torch.Tensor, length: int, generator) -> torch.Tensor:
        """(B, L) scores of every position from the step's (B, K) proposals at the columns ``keep`` (K,), or at
        per-row columns ``keep`` (B, K)."""


class ProposalStrategy(Strategy):
    """A strategy that ranks the step's proposals: ``score`` gives (B, K) scores of the proposed positions."""

    @abstractmethod
    def score(self, proposals: "Proposals") -> torch.Tensor:
        """(B, K) scores of the K proposed positions."""

    def scores(self, proposals: "Proposals", keep: torch.Tensor, length: int, generator) -> torch.Tensor:
        """(B, L) scores: `score` at the columns ``keep`` (K,) or per-row columns (B, K), -inf elsewhere."""
        confidence = proposals.confidence
        full = torch.full(
            (confidence.shape[0], length), -float("inf"), dtype=confidence.dtype, device=confidence.device
        )
        index = keep if keep.dim() == 2 else keep.expand(confidence.shape[0], -1)
        return full.scatter_(1, index, self.score(proposals).to(confidence.dtype))


class PositionalStrategy(Strategy):
    """A strategy that ranks positions before any proposal: ``positional_scores`` gives (B, L) scores."""

    positional = True

    @abstractmethod
    def positional_scores(self, shape: torch.Size, generator, device: Any) -> torch.Tensor:
        """(B, L) scores of the positions of a canvas of ``shape``."""

    def scores(self, proposals: "Proposals", keep: torch.Tensor, length: int, generator) -> torch.Tensor:
        """(B, L) `positional_scores` (where a step has proposed anyway, e.g. under an adaptive transfer)."""
        confidence = proposals.confidence
        return self.positional_scores((confidence.shape[0], length), generator, confidence.device).to(confidence.dtype)


STRATEGY_REGISTRY: dict[str, Strategy] = {}
STRATEGY_ALIASES: dict[str, str] = {}


def register_strategy(cls: type) -> type:
    """Register a `Strategy` subclass under its ``name`` and ``aliases``."""
    STRATEGY_REGISTRY[cls.name] = cls()
    STRATEGY_ALIASES.update({alias: cls.name for alias in cls.aliases})
    return cls


@register_strategy
class RandomStrategy(PositionalStrategy):
    """Uniformly random positions (the paper's sampler; Dream's ``origin``)."""

    name, aliases, draws = "random", ("origin",), True

    def positional_scores(self, shape: torch.Size, generator, device: Any) -> torch.Tensor:
        return random_rand(shape, generator, device)


@register_strategy
class LeftToRightStrategy(PositionalStrategy):
    """The leftmost masked positions first."""

    name = "left_to_right"

    def positional_scores(self, shape: torch.Size, generator, device: Any) -> torch.Tensor:
        return -torch.arange(shape[1], device=device, dtype=torch.float32).expand(shape[0], -1)


@register_strategy
class ConfidenceStrategy(ProposalStrategy):
    """The most probable proposals first (LLaDA's ``low_confidence`` remasking, Dream's ``maskgit_plus``)."""

    name, aliases = "confidence", ("low_confidence", "maskgit_plus")

    def score(self, proposals: "Proposals") -> torch.Tensor:
        return proposals.confidence


@register_strategy
class MarginStrategy(ProposalStrategy):
    """The largest top-1 minus top-2 probability first (Dream's ``topk_margin``)."""

    name, aliases, needs_distributions = "margin", ("topk_margin",), True

    def score(self, proposals: "Proposals") -> torch.Tensor:
        top2 = proposals.probs.topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]


@register_strategy
class EntropyStrategy(ProposalStrategy):
    """The lowest-entropy distributions first (negative entropy as the score)."""

    name, needs_distributions = "entropy", True

    def score(self, proposals: "Proposals") -> torch.Tensor:
        return (proposals.probs * torch.log(proposals.probs + 1e-10)).sum(-1)


STRATEGIES = tuple(STRATEGY_REGISTRY)  # the built-in strategies, in registration order
POSITIONAL_STRATEGIES = tuple(name for name, s in STRATEGY_REGISTRY.items() if s.positional)


def canonical_strategy(name: str) -> str:
    """The strategy ``name`` stands for (aliases resolved); a ValueError for an unknown one."""
    name = STRATEGY_ALIASES.get(name, name)
    if name not in STRATEGY_REGISTRY:
        raise ValueError(
            f"unknown strategy {name!r}: use one of {list(STRATEGY_REGISTRY)} or an alias {sorted(STRATEGY_ALIASES)}"
        )
    return name


def get_strategy(name: str) -> Strategy:
    """The registered `Strategy` called ``name`` (or an alias of it)."""
    return STRATEGY_REGISTRY[canonical_strategy(name)]


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
    (`hf_mdm.generation_processors.left_context`); for ``no_repeat_ngram_size`` the canvas (B, L) and each
    position's row and column (N,); None where nothing reads it."""

    canvas: Optional[torch.Tensor] = None
    left: Optional[torch.Tensor] = None
    x: Optional[torch.Tensor] = None
    rows: Optional[torch.Tensor] = None
    cols: Optional[torch.Tensor] = None


def step_options(forward_options: dict[str, Any]) -> dict[str, Any]:
    """The ``torch.compile`` options of a step's proposals (processors, softmax, the token drawn) from the model
    call's: the same backend and dynamic shapes, never ``fullgraph`` (a draw with a `torch.Generator` runs
    eagerly between two graphs) nor CUDA graphs (the step's outputs are kept past the next replay)."""
    options = {key: value for key, value in forward_options.items() if key != "fullgraph"}
    if options.get("mode") in ("reduce-overhead", "max-autotune"):
        options.pop("mode")
    return options


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
    compile_options: Optional[dict[str, Any]] = None  # compile_forward: the proposals compiled too (`step_options`)
    ngram: Optional[NoRepeatNGram] = None  # no_repeat_ngram_size: bans on either side, a row's positions in turn

    def __post_init__(self) -> None:
        options = None if self.compile_options is None else step_options(self.compile_options)
        self._proposals = self._propose if options is None else torch.compile(self._propose, **options)

    def __call__(
        self, logits: torch.Tensor, ids: ProcessorIds, need_probs: bool = False, drawn: Optional[tuple] = None
    ) -> Proposals:
        """Proposals at N positions from their logits (N, V), with the recorded scores and logits when asked.
        ``drawn`` = (rows, valid) (N,): the row of each position and whether that row draws there alone (for one
        generator per row: `hf_mdm.generation_random.multinomial`)."""
        raw = logits.clone() if self.record else None
        drawn = drawn if isinstance(self.generator, RowGenerators) else None  # a compiled step sees no extra input
        proposals = self._proposals(logits, ids, need_probs, drawn)
        return proposals._replace(logits=raw) if self.record else proposals

    def _propose(self, logits: torch.Tensor, ids: ProcessorIds, need_probs: bool, drawn=None) -> Proposals:
        """Proposals at N positions from their logits (N, V); the distributions are returned when ``need_probs``
        (margin, entropy, the entropy bound). ``ids``: what the processors read."""
        logits = self.process(logits, ids)
        picked = None if self.ngram is None else self.ngram.propose(logits, ids.x, ids.rows, ids.cols, self._pick)
        scores = logits.clone() if self.record else None
        probs = torch.softmax(logits, dim=-1)  # the confidence is the softmax's, as LLaDA's and Dream's code take it
        if picked is not None:
            tokens = picked
        elif self.temperature:
            # the token drawn with [MASK] left out: in a copy when the distributions are returned, else in place
            # (the drawn token is never [MASK], so its probability is the same)
            sample_probs = probs.clone() if need_probs else probs
            sample_probs[:, self.mask_id] = 0.0
            if drawn is None and self.compile_options is not None:  # compiled: torch's call, one graph break
                tokens = torch.multinomial(sample_probs, 1, generator=self.generator).squeeze(1)
            else:  # torch.multinomial's numbers and indices without its checks (or one generator per row)
                tokens = random_multinomial(sample_probs, self.generator, *(drawn or ()))
        else:
            logits[:, self.mask_id] = -float("inf")
            tokens = logits.argmax(-1)  # ties: the first index
        confidence = probs.gather(-1, tokens[:, None]).squeeze(1)
        return Proposals(tokens, confidence, probs if need_probs else None, scores)

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """A token (M,) from processed ``logits`` (M, V), [MASK] excluded: drawn at temperature > 0, else the argmax."""
        if self.temperature:
            probs = torch.softmax(logits, dim=-1)
            probs[:, self.mask_id] = 0.0
            return self.draw(probs)
        masked = logits.clone()
        masked[:, self.mask_id] = -float("inf")
        return masked.argmax(-1)

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
        """A token (N,) from each law ``probs`` (N, V) (`distribution`'s, or any non-negative weights): the argmax at
        temperature 0."""
        if not self.temperature:
            return probs.argmax(-1)
        return random_multinomial(probs, self.generator)

    @property
    def reads_positions(self) -> bool:
        """Whether proposing reads where each position is: processors, n-gram bans, or one generator per row."""
        processors = len(self.processors) + len(self.context_processors)
        return bool(processors) or self.ngram is not None or isinstance(self.generator, RowGenerators)

    def grid_inputs(
        self, x: torch.Tensor, positions: torch.Tensor, drawing: Optional[torch.Tensor] = None
    ) -> tuple[ProcessorIds, Optional[tuple]]:
        """`processor_ids` and the ``drawn`` argument for per-row ``positions`` (B, K) of ``x`` flattened row by row
        (``drawing`` (B, K): where a row draws alone); nothing built when nothing reads them (`reads_positions`)."""
        if not self.reads_positions:
            return ProcessorIds(), None
        bsz, k = positions.shape
        rows = torch.arange(bsz, device=x.device).repeat_interleave(k)
        drawn = (rows, None if drawing is None else drawing.flatten())
        return self.processor_ids(x, rows, positions.reshape(-1)), drawn

    def processor_ids(self, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> ProcessorIds:
        """What the processors read for the scored positions (``rows``, ``cols``) (N,) of the canvas ``x``."""
        canvas = x[rows] if len(self.processors) else None
        left = left_context(x, rows, cols, self.mask_id) if len(self.context_processors) else None
        if self.ngram is None:
            return ProcessorIds(canvas, left)
        return ProcessorIds(canvas, left, x, rows, cols)


def choose(
    scores: torch.Tensor, candidates: torch.Tensor, counts: torch.Tensor, kmax: Optional[int] = None
) -> torch.Tensor:
    """(B, L) bool: the ``counts`` (B,) best-scored ``candidates`` (B, L) of each row (torch.topk's tie order);
    ``kmax``: the largest count when the host knows it (else read from ``counts``)."""
    chosen = torch.zeros_like(candidates)
    kmax = int(counts.max()) if kmax is None else kmax
    if kmax == 0:
        return chosen
    idx = torch.topk(torch.where(candidates, scores, -float("inf")), kmax, dim=-1).indices
    take = torch.arange(kmax, device=scores.device)[None, :] < counts[:, None]
    return chosen.scatter_(1, idx, take & candidates.gather(1, idx))
