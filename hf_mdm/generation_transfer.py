"""How many positions a denoising step reveals: the time grid, the split of steps over blocks, the counts.

Within a block of S steps, step i goes from time t = 1 - i/S to s = 1 - (i+1)/S (`time_grid`). A *transfer* rule
says how many of a row's masked positions step i reveals:

- ``stochastic``: Binomial(m, (alpha(s) - alpha(t)) / (1 - alpha(t))) of the m still-masked positions
  (`reveal_probability`); with the random strategy this is the paper's sampler, drawn up front per position
  (`reveal_steps`, the same law);
- ``deterministic``: floor(m0 (alpha(s) - alpha(t))), the remainder to the earliest steps (`deterministic_counts`;
  LLaDA's split for the linear schedule);
- ``threshold``: every position whose confidence reaches the threshold, at least one, and at least what the
  remaining steps need to finish the block (`threshold_counts`, decided from the step's proposals);
- ``entropy_bound`` (EB-sampler, arXiv 2505.24857): the masked positions of the block in the strategy's order
  while the sum of their entropies stays within the bound, at least one, and at least what the remaining steps
  need (`entropy_bound_counts`);
- ``speculative``: exact speculative decoding of the left-to-right factorisation, its own loop over the canvas
  (`hf_mdm.generation_speculative`);
- ``llada2``: LLaDA2's published generate(): every position whose confidence exceeds the threshold when they are
  at least the step's share of an even split of the block over ``steps``, else that share, most confident first,
  with ``steps`` forwards per block at most (`LLaDA2Transfer`); ``llada21_editing``: LLaDA2.1's, which also edits
  revealed tokens, its own block loop (`hf_mdm.generation_editing`).

With ``steps=None`` a block has as many steps as masked positions, so the two adaptive rules run until the block
is done (Fast-dLLM's parallel decoding) and the fixed rules reveal one token a step.

Each rule is a `Transfer` class registered by name (`register_transfer`), so a new rule touches this module only.
Which positions: `hf_mdm.generation_strategy`. Nothing here sees the model; exported with the model as remote code.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from typing import Any, Callable, Optional

import torch

from .generation_random import binomial as random_binomial
from .generation_random import rand as random_rand

# counts(step index, (B, L) masked positions of the block) -> (B,) tokens to reveal, or None (decided in the step)
CountRule = Callable[[int, torch.Tensor], Optional[torch.Tensor]]


def time_grid(num_steps: int) -> torch.Tensor:
    """(num_steps + 1,) times 1 = t_0 > t_1 > ... > t_S = 0, float64."""
    return 1.0 - torch.arange(num_steps + 1, dtype=torch.float64) / num_steps


def deterministic_counts(
    num_masked: torch.Tensor, num_steps: int, schedule: Any, shares: Optional[list[float]] = None
) -> torch.Tensor:
    """Tokens revealed at each step of a block: (B, S) from masked counts (B,) at block start.

    floor(m0 * (alpha(s) - alpha(t))) per step, the remainder m0 - sum given one each to the earliest steps.
    For the linear schedule this is LLaDA's rule: m0 // S per step plus one on the first m0 % S steps.
    ``shares``: `step_shares`, when the caller keeps them (a call's blocks share them). Counted on the host (float64,
    as torch would), once per distinct m0: a block's table is a few dozen integers, and tensor operations on them
    cost more than the numbers.
    """
    shares = step_shares(schedule, num_steps) if shares is None else shares
    masked, tables = num_masked.tolist(), {}  # the one read (the table is the host's from here on)
    for m0 in set(masked):
        base = [math.floor(m0 * share + 1e-9) for share in shares]
        full, extra = divmod(m0 - sum(base), num_steps)
        tables[m0] = [count + full + (step < extra) for step, count in enumerate(base)]
    return torch.tensor([tables[m0] for m0 in masked], dtype=torch.long, device=num_masked.device)


def step_shares(schedule: Any, num_steps: int) -> list[float]:
    """(alpha(s) - alpha(t)) of each step, normalised to sum to 1 (schedules whose alpha(1) is not exactly 0 still
    reveal everything), float64."""
    alphas = schedule.alpha(time_grid(num_steps)).to(torch.float64)
    delta = alphas[1:] - alphas[:-1]
    return (delta / delta.sum()).tolist()


def reveal_probability(schedule: Any, t: float, s: float) -> float:
    """(alpha(s) - alpha(t)) / (1 - alpha(t)): chance that a position masked at time t is revealed by time s."""
    return _reveal_probability(float(schedule.alpha(t)), float(schedule.alpha(s)), s)


def _reveal_probability(alpha_t: float, alpha_s: float, s: float) -> float:
    if s <= 0 or alpha_t >= 1:
        return 1.0
    return min(max((alpha_s - alpha_t) / (1.0 - alpha_t), 0.0), 1.0)


def reveal_probabilities(schedule: Any, num_steps: int) -> list[float]:
    """`reveal_probability` of each step of a block of ``num_steps`` steps (`time_grid`), the schedule read once:
    alpha is evaluated one time at a time, as `reveal_probability` does, so the floats are the same (a schedule's
    vectorised exp or cos may round differently), then read in one ``tolist``."""
    grid = time_grid(num_steps)
    alphas = torch.stack([torch.as_tensor(schedule.alpha(t), dtype=torch.float64) for t in grid.unbind()]).tolist()
    return [_reveal_probability(alphas[i], alphas[i + 1], 1.0 - (i + 1) / num_steps) for i in range(num_steps)]


def normalised_alpha(schedule: Any, t: torch.Tensor) -> torch.Tensor:
    """alpha(t) (float64) rescaled to alpha(1) = 0 and alpha(0) = 1, so that every schedule reveals everything."""
    ends = schedule.alpha(torch.tensor([1.0, 0.0], dtype=torch.float64)).double()
    return (schedule.alpha(t.double()).double() - ends[0]) / (ends[1] - ends[0])


def draw_steps(cdf: torch.Tensor, shape: torch.Size, generator, device) -> torch.Tensor:
    """(shape) step indices drawn by inverse CDF from ``cdf`` (S,) (its last entry read as 1), one float64 uniform
    per element: the one draw of every sampler that decides a position's reveal step up front."""
    u = random_rand(shape, generator, device, torch.float64)
    return torch.searchsorted(cdf.to(device), u, right=True).clamp_(max=cdf.numel() - 1)


def reveal_steps(schedule: Any, num_steps: int, shape: torch.Size, generator, device) -> torch.Tensor:
    """(B, L) step at which each position is revealed when every masked position is revealed independently with
    probability (alpha(s) - alpha(t)) / (1 - alpha(t)) at each step: drawn once, from
    P(step <= i) = normalised alpha(s_i) (inverse CDF)."""
    return draw_steps(normalised_alpha(schedule, time_grid(num_steps))[1:], shape, generator, device)


def split_steps(steps: Optional[int], block_counts: list[int]) -> list[int]:
    """Steps per block, proportional to the blocks' masked counts (largest remainder), each non-empty block >= 1.

    ``steps=None`` gives every block as many steps as its count (one token per step).
    """
    if steps is None:
        return list(block_counts)
    nonempty = [i for i, c in enumerate(block_counts) if c > 0]
    out = [0] * len(block_counts)
    if not nonempty:
        return out
    if steps <= len(nonempty):
        for i in nonempty:
            out[i] = 1
        return out
    total = sum(block_counts)
    quotas = {i: steps * block_counts[i] / total for i in nonempty}
    for i in nonempty:
        out[i] = max(1, int(math.floor(quotas[i] + 1e-9)))
    left = steps - sum(out)
    by_remainder = sorted(nonempty, key=lambda i: (-(quotas[i] - math.floor(quotas[i] + 1e-9)), i))
    while left > 0:
        for i in by_remainder[:left]:
            out[i] += 1
        left = steps - sum(out)
    while left < 0:  # the at-least-one rule overshot: take from the largest blocks
        i = max(nonempty, key=lambda j: (out[j], -j))
        out[i] -= 1
        left += 1
    return out


def warn_steps_raised(steps: int, per_block: list[int]) -> None:
    """A UserWarning: ``steps`` is below the number of blocks to generate, so ``sum(per_block)`` steps run."""
    blocks = sum(1 for n in per_block if n > 0)
    warnings.warn(
        f"steps={steps} is fewer than the {blocks} blocks to generate and every block takes at least one step, so "
        f"{sum(per_block)} steps (forward passes) run: pass steps >= {blocks} (a multiple of {blocks} splits them "
        "evenly), a larger block_length, or steps=None (one step per token)",
        UserWarning,
        stacklevel=2,
    )


def threshold_counts(confident: torch.Tensor, remaining: torch.Tensor, steps_left: int) -> torch.Tensor:
    """Counts (B,) of the threshold transfer: the ``confident`` (B,) positions, at least one while any is masked,
    and at least ``ceil(remaining / steps_left)`` so that the block never takes more than its steps (which is at
    least one where ``remaining`` > 0)."""
    return torch.maximum(confident, (remaining + (steps_left - 1)) // steps_left)


def entropy_bound_counts(
    scores: torch.Tensor, entropy: torch.Tensor, candidates: torch.Tensor, bound: float, steps_left: int
) -> torch.Tensor:
    """Counts (B,) of the entropy-bound transfer from the (B, K) ``scores`` (higher first), ``entropy`` and
    ``candidates`` (masked positions of the block) at the step's K columns: the longest prefix of the candidates
    in score order whose summed entropy is at most ``bound``, then as `threshold_counts` (at least one, at least
    what the remaining steps need)."""
    order = scores.masked_fill(~candidates, -float("inf")).argsort(dim=-1, descending=True, stable=True)
    sorted_entropy = entropy.gather(1, order).masked_fill(~candidates.gather(1, order), float("inf"))
    within = (sorted_entropy.cumsum(1) <= bound).sum(1)
    return threshold_counts(within, candidates.sum(1), steps_left)


class Transfer(ABC):
    """How many masked positions a step reveals. A subclass registered with `register_transfer` is a transfer
    ``generate(transfer=name)`` takes, built from the call's config (`from_config`). A fixed rule decides a block's
    counts at its start (`count_table`, or step by step `count_rule`); an adaptive one (`AdaptiveTransfer`) decides
    inside each step from the step's proposals; ``needs_distributions`` asks the proposer for the whole
    distributions; ``parameters`` names the config fields only this rule (and others that list them) reads, so a
    call that sets one under another transfer is told so (`check_transfer_parameters`)."""

    name: str = ""
    adaptive: bool = False
    needs_distributions: bool = False
    parameters: tuple[str, ...] = ()

    block_denoiser: Any = None  # a transfer with its own block loop (a `BlockDenoiser`), else the default loop's
    canvas_loop: Any = None  # a transfer with its own loop over the canvas (speculative decoding), else the block loop
    edits: bool = False  # whether a step may rewrite revealed tokens of its block (they are final once it is done)
    draws: bool = False  # whether the rule draws random numbers (`hf_mdm.generation_rows.draws_random_numbers`)

    @classmethod
    def from_config(cls, config: Any) -> "Transfer":
        return cls()

    def block_steps(self, steps: Optional[int], block_counts: list[int]) -> list[int]:
        """Steps of each block from the call's ``steps`` and the blocks' masked counts: split over the blocks
        (`split_steps`). Fewer steps than blocks cannot be honoured (each block takes at least one): a warning says
        how many run."""
        per_block = split_steps(steps, block_counts)
        if steps is not None and sum(per_block) > steps:
            warn_steps_raised(steps, per_block)
        return per_block

    def count_rule(self, schedule: Any, num_steps: int, m0: torch.Tensor, generator) -> CountRule:
        """The counts of a block of ``num_steps`` steps with masked counts ``m0`` (B,) at its start, step by step
        (default: the columns of `count_table`)."""
        table = self.count_table(schedule, num_steps, m0, generator)
        if table is None:
            raise TypeError(
                f"transfer {type(self).__name__} decides no counts: define count_table or count_rule, or subclass "
                "AdaptiveTransfer and define adaptive_counts"
            )
        return lambda i, block_mask: table[:, i]

    def count_table(self, schedule: Any, num_steps: int, m0: torch.Tensor, generator) -> Optional[torch.Tensor]:
        """(B, num_steps) the tokens each row reveals at each step, all decided at the block's start on the device
        (so a step reads nothing back), or None where `count_rule` decides step by step. Each step reveals exactly
        its count (the counts of a row add up to at most its ``m0``)."""
        return None


class AdaptiveTransfer(Transfer):
    """A transfer that decides each step's counts from the step's proposals (`adaptive_counts`); `count_rule` sets
    up a block (default: nothing) and gives no fixed counts."""

    adaptive = True

    def count_rule(self, schedule: Any, num_steps: int, m0: torch.Tensor, generator) -> CountRule:
        return lambda i, block_mask: None

    @abstractmethod
    def adaptive_counts(self, confidence, probs, scores, candidates, steps_left: int) -> torch.Tensor:
        """Counts (B,) from the step's (B, K) proposals: confidences, distributions (B, K, V), strategy scores
        and ``candidates`` (the block's masked positions among the K columns)."""


TRANSFER_REGISTRY: dict[str, type] = {}


def register_transfer(cls: type) -> type:
    """Register a `Transfer` subclass under its ``name``."""
    TRANSFER_REGISTRY[cls.name] = cls
    return cls


@register_transfer
class StochasticTransfer(Transfer):
    """Binomial(m, (alpha(s) - alpha(t)) / (1 - alpha(t))) of the m still-masked positions."""

    name, draws = "stochastic", True

    def count_rule(self, schedule: Any, num_steps: int, m0: torch.Tensor, generator) -> CountRule:
        """Each step's counts drawn at the step, from the positions still masked (so the draws interleave with the
        step's other random numbers, e.g. sampling at temperature > 0)."""
        probabilities = reveal_probabilities(schedule, num_steps)
        return lambda i, block_mask: _binomial(block_mask.sum(1), probabilities[i], generator)

    def count_table(self, schedule: Any, num_steps: int, m0: torch.Tensor, generator) -> Optional[torch.Tensor]:
        """Every step's counts drawn at the block's start, in step order: the draws of `count_rule` (a step
        reveals exactly its count, so the masked counts it draws from are known), when nothing else draws between
        them (a draw from zero masked positions takes no random number on the CPU)."""
        remaining, columns = m0, []
        for p in reveal_probabilities(schedule, num_steps):
            columns.append(_binomial(remaining, p, generator))
            remaining = remaining - columns[-1]
        return torch.stack(columns, 1)


def _binomial(remaining: torch.Tensor, p: float, generator) -> torch.Tensor:
    """(B,) Binomial(``remaining``, p) draws (``remaining`` itself when p is 1: no draw)."""
    if p >= 1.0:
        return remaining
    probs = torch.full(remaining.shape, p, dtype=torch.float64, device=remaining.device)
    return random_binomial(remaining.double(), probs, generator).long()


@register_transfer
class DeterministicTransfer(Transfer):
    """floor(m0 (alpha(s) - alpha(t))), the remainder to the earliest steps (`deterministic_counts`)."""

    name = "deterministic"

    def __init__(self) -> None:
        self._shares: dict[tuple[int, int], list[float]] = {}  # (schedule, steps) -> `step_shares`, for the call

    def count_table(self, schedule: Any, num_steps: int, m0: torch.Tensor, generator) -> Optional[torch.Tensor]:
        key = (id(schedule), num_steps)  # the call's schedule: the same object for all its blocks
        if key not in self._shares:
            self._shares[key] = step_shares(schedule, num_steps)
        return deterministic_counts(m0, num_steps, schedule, self._shares[key])


@register_transfer
class ThresholdTransfer(AdaptiveTransfer):
    """Every position whose confidence reaches ``threshold`` (`threshold_counts`)."""

    name, parameters = "threshold", ("threshold",)

    def __init__(self, threshold: float = 1.0):
        self.threshold = float(threshold)

    @classmethod
    def from_config(cls, config: Any) -> "Transfer":
        return cls(config.threshold)

    def adaptive_counts(self, confidence, probs, scores, candidates, steps_left: int) -> torch.Tensor:
        confident = ((confidence >= self.threshold) & candidates).sum(1)
        return threshold_counts(confident, candidates.sum(1), steps_left)


@register_transfer
class EntropyBoundTransfer(AdaptiveTransfer):
    """The strategy's order while the summed entropy stays within ``bound`` (`entropy_bound_counts`)."""

    name, needs_distributions, parameters = "entropy_bound", True, ("entropy_bound",)

    def __init__(self, bound: float = 1.0):
        self.bound = float(bound)

    @classmethod
    def from_config(cls, config: Any) -> "Transfer":
        return cls(config.entropy_bound)

    def adaptive_counts(self, confidence, probs, scores, candidates, steps_left: int) -> torch.Tensor:
        entropy = -(probs * torch.log(probs + 1e-10)).sum(-1)
        return entropy_bound_counts(scores, entropy, candidates, self.bound, steps_left)


@register_transfer
class SpeculativeTransfer(Transfer):
    """Exact speculative decoding of the left-to-right factorisation, named here; `hf_mdm.generation_speculative`
    registers it in its place with its own loop over the canvas (``canvas_loop``)."""

    name, parameters = "speculative", ("draft_length",)


def even_split(total: int, steps: int) -> list[int]:
    """``total`` split over ``steps``: ``total // steps`` each, one more on the first ``total % steps``."""
    return [total // steps + (i < total % steps) for i in range(steps)]


@register_transfer
class LLaDA2Transfer(AdaptiveTransfer):
    """LLaDA2's published generate() (modeling_llada2_moe.py): ``steps`` forwards per block at most; step i reveals
    every masked position of the block whose confidence is above ``threshold`` (strictly) when there are at least
    ``share[i]`` of them, with ``share`` the even split (`even_split`) of the block length (not of its masked count)
    over ``steps``; otherwise the ``share[i]`` most confident (all that are left if fewer). The shares add up to the
    block length, so a block is always complete within its steps."""

    name, parameters = "llada2", ("threshold",)

    def __init__(self, threshold: float = 0.95, steps: int = 32, block_length: Optional[int] = 32):
        self.threshold, self.steps = float(threshold), int(steps)
        self.block_length = None if block_length is None else int(block_length)
        self.num_steps, self.share = self.steps, torch.zeros(self.steps, dtype=torch.long)

    @classmethod
    def from_config(cls, config: Any) -> "Transfer":
        if config.steps is None or config.threshold is None:
            raise ValueError(
                "transfer='llada2' needs steps (forwards per block) and threshold: build the config with "
                "MaskedDiffusionGenerationConfig.llada2(...)"
            )
        return cls(config.threshold, config.steps, config.block_length)

    def block_steps(self, steps: Optional[int], block_counts: list[int]) -> list[int]:
        """``steps`` for every block that has masked positions (LLaDA2 does not split them over the blocks)."""
        return [self.steps if count > 0 else 0 for count in block_counts]

    def count_rule(self, schedule: Any, num_steps: int, m0: torch.Tensor, generator) -> CountRule:
        """The block's shares: the even split of ``block_length`` (one block: its masked count) over its steps."""
        length = self.block_length if self.block_length is not None else int(m0.max())
        self.num_steps, self.share = num_steps, torch.tensor(even_split(length, num_steps))
        return super().count_rule(schedule, num_steps, m0, generator)

    def adaptive_counts(self, confidence, probs, scores, candidates, steps_left: int) -> torch.Tensor:
        share = self.share[self.num_steps - steps_left].to(candidates.device)
        confident = ((confidence > self.threshold) & candidates).sum(1)
        return torch.where(confident >= share, confident, torch.minimum(share, candidates.sum(1)))


TRANSFERS = tuple(TRANSFER_REGISTRY)  # the built-in transfers, in registration order


def check_transfer_parameters(transfer: str, given: dict[str, Any], remdm: Optional[str] = None) -> None:
    """A ValueError for a field of ``given`` (the settings a call named, name -> value) that only other transfer
    rules read (their ``parameters``): ``transfer`` (the rule in use; ``remdm``'s stochastic one when set) would
    ignore it."""
    in_use = "stochastic" if remdm is not None else transfer
    for field, value in given.items():
        readers = [name for name, cls in TRANSFER_REGISTRY.items() if field in getattr(cls, "parameters", ())]
        if value is None or not readers or in_use in readers:
            continue
        using = f"transfer={in_use!r}" + (f" (remdm={remdm!r})" if remdm is not None else "")
        raise ValueError(
            f"{field}={value!r} is read only by transfer={' / '.join(map(repr, readers))}, not by {using}, the "
            f"transfer in use, so it would change nothing: pass transfer={readers[0]!r} or drop {field}"
        )


def build_transfer(config: Any) -> Transfer:
    """The registered transfer ``config.transfer``, with its parameters from ``config``."""
    if config.transfer not in TRANSFER_REGISTRY:
        raise ValueError(f"unknown transfer {config.transfer!r}: use one of {list(TRANSFER_REGISTRY)}")
    return TRANSFER_REGISTRY[config.transfer].from_config(config)
