"""The likelihood p(x) of a sequence under a masked diffusion *sampler*: what the paper's TER needs.

The paper's Token Error Rate is TER(p) = 2^(E_{x~q}[-log2 p(x) / |x|]) with q the true language and p the
distribution of the sequences the sampler generates (`hf_mdm.metrics.TokenErrorRate`). A sampler that reveals
tokens in groups draws each revealed token from the denoiser's marginal given the tokens revealed before its step,
so, summing over the ways its positions can be grouped into steps,

    p(x) = sum over ordered partitions (G_1, ..., G_m) of the positions of
           P(G_1, ..., G_m) * prod_j prod_{i in G_j} p_theta(x_i | x_{G_1 u ... u G_{j-1}})

with P the law of the grouping (`RevealLaw`) and p_theta the denoiser's token law (the softmax of its logits with
[MASK] removed, at temperature 1: what `diffusion_generate` draws from). Two ways to compute it:

- `exact_sampler_log_probs`: every x of V^L at once, enumerating the ordered partitions and every partly revealed
  canvas ((V + 1)^L forwards): exact, for small L (the Fubini number of ordered partitions grows fast);
- `estimate_sampler_log_probs`: for given x, a particle filter over the sampler's steps (`hf_mdm.likelihood_smc`):
  each step summed out exactly given the positions revealed before it, resampling, several independent runs, and
  the bias of the log removed from the runs' spread. Whether its 95% intervals hold the exact value depends on
  that spread: `evaluation/ter_calibration.py` measures their coverage against the runs' variance, on the chain
  language's closed form and on enumeration, and `ESTIMATE_VARIANCE_LIMIT` (lower for a trained model's
  pseudo-likelihood twist than for the language's exact one) is set where the calibration's groups of 16 sequences
  stop reaching 90% coverage; above it the result is labelled an upper bound (of TER), not an estimate;
- `prior_sampling_log_probs`: the log of a mean over groupings drawn from P itself, the baseline the calibration
  measures against: unbiased for p(x) inside the log, so E[-log p^(x)] >= -log p(x) (Jensen), by a gap that grows
  with L.

`RevealLaw` covers the samplers whose grouping does not depend on the sampled tokens: the paper's (stochastic
transfer, random order: each position's step drawn independently from the schedule), and deterministic transfer
(counts from the schedule) in random or left-to-right order, in one block or in blocks denoised left to right.
Confidence-ordered samplers choose positions from the tokens they draw, so their law is not of this form.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch

from .generation_denoiser import model_device
from .generation_transfer import deterministic_counts, draw_steps, normalised_alpha, split_steps, time_grid
from .languages import OracleDenoiser
from .likelihood_smc import MAX_PARTICLES, NUM_REPLICATES, Denoiser, SMCEstimate, smc_log_probs
from .schedules import get_schedule

#: The orders and transfer rules whose grouping law `RevealLaw` knows.
LAW_ORDERS = ("random", "left_to_right")
LAW_TRANSFERS = ("stochastic", "deterministic")
#: `exact_sampler_log_probs` refuses more than this many sequences or positions (use the estimator instead).
MAX_EXACT_SEQUENCES = 1 << 17
MAX_EXACT_LENGTH = 7


@dataclass(frozen=True)
class RevealLaw:
    """How a sampler groups the L positions into its N steps: ``order`` (``random`` or ``left_to_right``) and
    ``transfer`` (``stochastic``: each position's step drawn independently, P(step <= i) = alpha(s_i), the paper's
    sampler with ``order="random"``; ``deterministic``: the schedule's counts, `deterministic_counts`). With
    ``block_length`` the positions form blocks of that length from the first, denoised one after the other, the N
    steps split over them as the sampler splits them (`split_steps`), each block grouped by this law at its own
    steps (`blocks`)."""

    steps: int
    order: str = "random"
    transfer: str = "stochastic"
    schedule: str = "linear"
    block_length: Optional[int] = None

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.block_length is not None and self.block_length < 1:
            raise ValueError(f"block_length must be >= 1 (or None: one block), got {self.block_length}")
        if self.order not in LAW_ORDERS or self.transfer not in LAW_TRANSFERS:
            raise ValueError(
                f"order={self.order!r}, transfer={self.transfer!r}: the sampler's law is known for order in "
                f"{LAW_ORDERS} and transfer in {LAW_TRANSFERS} (confidence orders depend on the drawn tokens)"
            )
        if self.order == "left_to_right" and self.transfer == "stochastic":
            raise ValueError("order='left_to_right' reveals counts from the schedule: pass transfer='deterministic'")

    def generate_kwargs(self) -> dict[str, Any]:
        """The `diffusion_generate` settings that sample with this law (temperature 1)."""
        return {
            "steps": self.steps,
            "transfer": self.transfer,
            "strategy": self.order,
            "schedule": self.schedule,
            "block_length": self.block_length,
            "temperature": 1.0,
        }

    def blocks(self, length: int) -> list[tuple[int, int, "RevealLaw"]]:
        """(start, end, law of its positions) of each block of ``length`` positions, in the order they are denoised."""
        size = length if self.block_length is None else self.block_length
        spans = [(b, min(b + size, length)) for b in range(0, length, max(size, 1))]
        per_block = split_steps(self.steps, [end - start for start, end in spans])
        return [(s, e, dataclasses.replace(self, steps=n, block_length=None)) for (s, e), n in zip(spans, per_block)]

    def total_steps(self, length: int) -> int:
        """The steps the sampler takes on ``length`` positions (``steps``, or one a block where there are more
        blocks)."""
        return sum(law.steps for _, _, law in self.blocks(length))

    def one_block(self, length: int) -> bool:
        """Whether ``length`` positions form a single block (the laws `step_probabilities` and `counts` describe)."""
        return self.block_length is None or self.block_length >= length

    def step_probabilities(self) -> torch.Tensor:
        """(N,) the chance that a position is revealed at step i (stochastic transfer), float64."""
        cdf = normalised_alpha(get_schedule(self.schedule), time_grid(self.steps))
        return (cdf[1:] - cdf[:-1]).clamp(min=0.0)

    def counts(self, length: int) -> list[int]:
        """The nonzero per-step counts of deterministic transfer for ``length`` masked positions."""
        table = deterministic_counts(torch.tensor([length]), self.steps, get_schedule(self.schedule))[0]
        return [int(c) for c in table.tolist() if c > 0]

    def log_prob_of(self, groups: tuple[tuple[int, ...], ...], length: int) -> float:
        """log P(G_1, ..., G_m): the chance that the sampler reveals exactly these groups, in this order."""
        if not self.one_block(length):
            return _log_prob_by_block(self.blocks(length), groups)
        sizes = [len(g) for g in groups]
        if self.transfer == "stochastic":
            return _log_increasing_steps(self.step_probabilities(), sizes)
        if sizes != self.counts(length):
            return -math.inf
        if self.order == "left_to_right":
            contiguous = [i for g in groups for i in sorted(g)] == list(range(length))
            return 0.0 if contiguous else -math.inf
        remaining, total = length, 0.0
        for n in sizes:  # uniformly random positions: 1 / C(remaining, n) for each group
            total -= math.lgamma(remaining + 1) - math.lgamma(n + 1) - math.lgamma(remaining - n + 1)
            remaining -= n
        return total

    def sample_steps(self, num: int, length: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """(num, length) the step at which each position is revealed, drawn from the law (a block's steps after
        those of the blocks before it)."""
        if not self.one_block(length):
            parts, offset = [], 0
            for start, end, law in self.blocks(length):
                parts.append(law.sample_steps(num, end - start, generator) + offset)
                offset += law.steps
            return torch.cat(parts, 1)
        if self.transfer == "stochastic":
            cdf = normalised_alpha(get_schedule(self.schedule), time_grid(self.steps))[1:]
            return draw_steps(cdf, torch.Size((num, length)), generator, torch.device("cpu"))
        step_of_rank = torch.repeat_interleave(
            torch.arange(len(self.counts(length))), torch.tensor(self.counts(length))
        )
        if self.order == "left_to_right":
            return step_of_rank.expand(num, length).clone()
        ranks = torch.rand(num, length, generator=generator).argsort(1).argsort(1)  # a uniform random order
        return step_of_rank[ranks]


def _log_prob_by_block(blocks: list[tuple[int, int, RevealLaw]], groups: tuple[tuple[int, ...], ...]) -> float:
    """log P(groups) under a block law: the groups of each block, in block order, each block by its own law."""
    total, g = 0.0, 0
    for start, end, law in blocks:
        own = []
        while g < len(groups) and all(start <= i < end for i in groups[g]):
            own.append(tuple(i - start for i in groups[g]))
            g += 1
        if sum(len(group) for group in own) != end - start:
            return -math.inf  # a group spans two blocks, or a block's positions are revealed out of block order
        total += law.log_prob_of(tuple(own), end - start)
    return total


def _log_increasing_steps(step_probs: torch.Tensor, sizes: list[int]) -> float:
    """log of the sum over steps k_1 < ... < k_m of prod_j w_{k_j}^{n_j}: independent steps forming these groups."""
    w = step_probs.tolist()
    previous = [1.0] * (len(w) + 1)  # previous[k]: mass with every earlier group on steps < k
    for n in sizes:
        current = [0.0] * (len(w) + 1)
        for k in range(len(w)):
            current[k + 1] = current[k] + previous[k] * w[k] ** n
        previous = current
    return math.log(previous[-1]) if previous[-1] > 0 else -math.inf


def ordered_partitions(positions: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Every ordered partition of ``positions`` into nonempty groups (the Fubini number of them)."""
    if not positions:
        yield ()
        return
    for size in range(1, len(positions) + 1):
        for first in itertools.combinations(positions, size):
            rest = tuple(p for p in positions if p not in first)
            for tail in ordered_partitions(rest):
                yield (first, *tail)


def token_log_probs(model: Any, canvases: torch.Tensor, vocab_size: int, batch_size: int = 4096) -> torch.Tensor:
    """(n, L, V) float64: log of the denoiser's token law at every position of ``canvases`` (n, L), for the
    language's ``vocab_size`` tokens: log_softmax of the logits with [MASK] removed (what the sampler draws from at
    temperature 1)."""
    config = model.config
    if int(getattr(config, "logits_shift", 0) or 0) != 0:
        raise ValueError("the sampler's likelihood is computed for models with logits_shift=0")
    mask_id = int(config.mask_token_id)
    out = []
    device = model_device(model)
    with torch.no_grad():
        for start in range(0, canvases.shape[0], batch_size):
            x = canvases[start : start + batch_size].to(device)
            logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits.double().cpu()
            logits[..., mask_id] = -math.inf
            out.append(torch.log_softmax(logits, dim=-1)[..., :vocab_size])
    return torch.cat(out)


def exact_sampler_log_probs(model: Any, law: RevealLaw, length: int, vocab_size: int) -> torch.Tensor:
    """(V^L,) float64: log p(x) of every sequence of ``length`` tokens of ``0..vocab_size-1`` under the sampler
    (``law`` with ``model`` as denoiser), in the order of ``itertools.product(range(V), repeat=L)``; exact."""
    if length > MAX_EXACT_LENGTH or vocab_size**length > MAX_EXACT_SEQUENCES:
        raise ValueError(
            f"exact enumeration of V^L = {vocab_size}^{length} sequences is too large (at most L = "
            f"{MAX_EXACT_LENGTH} and {MAX_EXACT_SEQUENCES} sequences): use estimate_sampler_log_probs"
        )
    mask_id = int(model.config.mask_token_id)
    digits = torch.tensor(list(itertools.product(range(vocab_size), repeat=length)), dtype=torch.long)
    marginals = {}  # revealed set -> (V^L, L) log p_theta(x_i | x_R) for every x and position
    for revealed in itertools.chain.from_iterable(itertools.combinations(range(length), r) for r in range(length)):
        index = _prefix_index(digits, revealed, vocab_size)
        canvases = torch.full((vocab_size ** len(revealed), length), mask_id, dtype=torch.long)
        if revealed:
            canvases[:, list(revealed)] = torch.tensor(
                list(itertools.product(range(vocab_size), repeat=len(revealed))), dtype=torch.long
            )
        logp = token_log_probs(model, canvases, vocab_size)  # (V^|R|, L, V)
        marginals[revealed] = logp[index].gather(2, digits[:, :, None]).squeeze(2)
    terms = []
    for groups in ordered_partitions(tuple(range(length))):
        weight = law.log_prob_of(groups, length)
        if weight == -math.inf:
            continue
        total, seen = torch.full((digits.shape[0],), weight, dtype=torch.float64), ()
        for group in groups:
            total += marginals[seen][:, list(group)].sum(1)
            seen = tuple(sorted(seen + group))
        terms.append(total)
    return torch.logsumexp(torch.stack(terms), dim=0)


def _prefix_index(digits: torch.Tensor, revealed: tuple[int, ...], vocab_size: int) -> torch.Tensor:
    """(V^L,) the row of each sequence's canvas among the V^|R| canvases revealing ``revealed`` (base-V digits)."""
    index = torch.zeros(digits.shape[0], dtype=torch.long)
    for position in revealed:
        index = index * vocab_size + digits[:, position]
    return index


def estimate_sampler_log_probs(
    model: Any,
    law: RevealLaw,
    x: torch.Tensor,
    vocab_size: int,
    num_particles: Optional[int] = None,
    num_replicates: int = NUM_REPLICATES,
    generator: Optional[torch.Generator] = None,
    batch_size: int = 4096,
    max_particles: int = MAX_PARTICLES,
    exact_twist: bool = True,
) -> SMCEstimate:
    """`SMCEstimate` of log p(x) for each row of ``x`` (B, L) under the sampler ``law`` with ``model`` as
    denoiser: a twisted particle filter over the sampler's steps (`hf_mdm.likelihood_smc`), ``num_replicates``
    independent runs per sequence, bias-corrected from the runs' spread (``.log_prob``), with the uncorrected
    stochastic lower bound (``.log_prob_bound``), the per-sequence variance and whether the correction is trusted
    (``.reliable``: the mean variance at most its twist's `ESTIMATE_VARIANCE_LIMIT`). With ``num_particles=None`` a
    pilot on the first rows chooses the particles (up to ``max_particles``) and the twist; for the language's oracle
    (`OracleDenoiser`) the twist is the language's exact conditional, unless ``exact_twist=False`` (the
    pseudo-likelihood twist, as for a trained model)."""
    if not law.one_block(x.shape[1]):
        raise ValueError(f"the particle filter follows one block: block_length={law.block_length} < L={x.shape[1]}")
    return smc_log_probs(
        sampler_denoiser(model, vocab_size, x, batch_size, exact_twist),
        law,
        x,
        int(model.config.mask_token_id),
        num_particles,
        num_replicates,
        generator,
        max_particles,
    )


def sampler_denoiser(
    model: Any, vocab_size: int, x: torch.Tensor, batch_size: int = 4096, exact_twist: bool = True
) -> Denoiser:
    """The denoiser as `hf_mdm.likelihood_smc` calls it: (canvases, tokens) -> (log p_theta(token_i | canvas), log psi),
    log psi = log q(x_masked | x_visible) for the oracle of a language on sequences of its support (unless
    ``exact_twist=False``: the oracle then seen as a trained model is), else None."""
    language = model.language if isinstance(model, OracleDenoiser) and exact_twist else None
    if language is not None and bool(torch.isfinite(language.log_prob(x)).all()):
        mask_id = int(model.config.mask_token_id)

        def exact(canvases: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
            log_post, log_visible = language.log_posterior_and_evidence(canvases, mask_id)
            log_a = log_post.gather(2, tokens[:, :, None]).squeeze(2)
            return log_a, language.log_prob(tokens) - log_visible

        return exact

    def chosen(canvases: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        parts = []
        for start in range(0, canvases.shape[0], batch_size):
            logp = token_log_probs(model, canvases[start : start + batch_size], vocab_size, batch_size)
            parts.append(logp.gather(2, tokens[start : start + batch_size, :, None]).squeeze(2))
        return torch.cat(parts), None

    return chosen


def prior_sampling_log_probs(
    model: Any,
    law: RevealLaw,
    x: torch.Tensor,
    vocab_size: int,
    num_orders: int = 8,
    generator: Optional[torch.Generator] = None,
    batch_size: int = 4096,
) -> torch.Tensor:
    """(B,) float64: log of the mean, over ``num_orders`` groupings drawn from ``law`` itself, of the probability
    that the sampler draws x with that grouping: importance sampling from the prior, unbiased for p(x) inside the
    log but with a spread that grows exponentially with L, so its log falls ever further below log p(x) as L grows.
    Kept as the baseline that `evaluation/ter_calibration.py` measures against `estimate_sampler_log_probs`."""
    if num_orders < 1:
        raise ValueError(f"num_orders must be >= 1, got {num_orders}")
    num, length = x.shape
    mask_id = int(model.config.mask_token_id)
    steps = law.sample_steps(num * num_orders, length, generator)  # (B K, L)
    rows = x.repeat_interleave(num_orders, 0)
    pairs = [(r, k) for r in range(rows.shape[0]) for k in torch.unique(steps[r]).tolist()]
    log_prob = torch.zeros(rows.shape[0], dtype=torch.float64)
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        r = torch.tensor([p[0] for p in chunk])
        k = torch.tensor([p[1] for p in chunk])
        canvases = torch.where(steps[r] < k[:, None], rows[r], torch.full_like(rows[r], mask_id))
        logp = token_log_probs(model, canvases, vocab_size, batch_size).gather(2, rows[r][:, :, None]).squeeze(2)
        own = steps[r] == k[:, None]
        log_prob.index_add_(0, r, torch.where(own, logp, torch.zeros_like(logp)).sum(1))
    per_order = log_prob.view(num, num_orders)
    return torch.logsumexp(per_order, dim=1) - math.log(num_orders)
