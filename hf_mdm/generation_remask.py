"""Remasking samplers: ReMDM (Wang et al. 2025, arXiv 2503.00307), ``remdm`` in "cap", "rescale", "conf", "loop".

The paper's sampler (``transfer="stochastic"``, ``strategy="random"``) reveals each masked position independently
and never takes a token back. ReMDM's step from t to s (the block's time grid, `hf_mdm.generation_transfer`) may
also remask a token revealed earlier in the current block, which is then predicted again:

- a revealed (generated, not prompt) token of the current block is remasked with probability sigma_t;
- a masked token is revealed with probability (alpha_s - (1 - sigma_t) alpha_t) / (1 - alpha_t), with a token
  drawn from the model's processed distribution (temperature, top-k, top-p, logits processors: `Proposer`) at a
  forward on the canvas at t; remasking needs no forward, so a step that reveals nothing costs none;
- sigma_t <= sigma_max = min(1, (1 - alpha_s) / alpha_t) (1 when alpha_t = 0), which keeps the probability above in
  [0, 1]; the last step (s = 0) has sigma_max = 0 and reveals every position still masked.

The variants choose sigma_t (eta = ``remdm_eta``):

- ``cap``: min(eta, sigma_max); ``rescale``: eta sigma_max (eta in [0, 1] for both);
- ``conf``: per revealed position i, eta sigma_max softmax_i(-c), the softmax over the revealed positions of the
  row's block and c_i the probability of the token at i when it was revealed (least confident most likely; eta
  defaults to 1, the paper's variant). A masked position is in no softmax, so its sigma is 0 and it is revealed
  with the plain probability (alpha_s - alpha_t) / (1 - alpha_t), as in the paper's code;
- ``loop``: the plain sampler until ``remdm_t_on``, then alpha held at alpha_on while revealed tokens are
  remasked with probability eta and masked ones revealed with probability eta alpha_on / (1 - alpha_on) until
  ``remdm_t_off``, then the plain sampler to the end (`LoopSchedule`). Unset, the window, alpha_on and eta are
  ReMDM's official defaults, alpha_on = 0.9, t_on = 0.55, t_off = 0.05, eta = 0.02 (`REMDM_LOOP_PUBLISHED`,
  `apply_remdm_defaults`; eta alone when a window is given). With ``remdm_alpha_on`` the
  schedule's alpha is squeezed into [t_on, 1] to reach alpha_on at t_on, and into [0, t_off] to rise from alpha_on
  to 1 (for the linear schedule: alpha_on (1 - t) / (1 - t_on), then alpha_on + (1 - alpha_on)(1 - t / t_off));
  without it alpha_on = alpha(t_on) and alpha runs over [0, t_on] of the schedule on [0, t_off]. A step is in the
  window when t <= t_on and s >= t_off; eta <= (1 - alpha_on) / alpha_on keeps the reveal probability <= 1.

alpha is the config's schedule rescaled to end exactly at 0 (t = 1) and 1 (t = 0) (`normalised_alpha`), as the
plain sampler's.
Since the chance that a masked position is revealed at step i depends only on i, a position's reveal step is drawn
once when it becomes masked (at the block's start, or when remasked), by inverse CDF over the remaining steps: with
eta = 0 this draws the same random numbers as the paper's sampler and gives the same tokens under the same seed.
Remasking draws a uniform per position at a step whose sigma is not 0. The prompt and the positions outside the
current block are never remasked; blocks, batches (padding), EOS and stopping criteria are `sample_blocks`'s. A
streamer is refused (a streamed token could be remasked later). Exported with the model as remote code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from .generation_denoiser import Rows
from .generation_random import rand as random_rand
from .generation_sampler import Sampler, reveal_where
from .generation_strategy import canonical_strategy
from .generation_transfer import draw_steps, normalised_alpha, time_grid
from .generation_values import is_number
from .schedules import get_schedule

REMDM_VARIANTS = ("cap", "rescale", "conf", "loop")
REMDM_FIELDS = ("remdm_eta", "remdm_t_on", "remdm_t_off", "remdm_alpha_on")
#: ReMDM-loop as published (Wang et al. 2025, its official sampling defaults): the window and alpha held on it.
REMDM_LOOP_PUBLISHED = {"remdm_t_on": 0.55, "remdm_t_off": 0.05, "remdm_alpha_on": 0.9, "remdm_eta": 0.02}


def apply_remdm_defaults(config: Any) -> None:
    """``remdm="loop"``'s unset parameters from ReMDM's published defaults (`REMDM_LOOP_PUBLISHED`): the window
    with its alpha_on when neither end of the window is given, and eta when unset."""
    if config.remdm != "loop":
        return
    window = config.remdm_t_on is None and config.remdm_t_off is None
    for name, value in REMDM_LOOP_PUBLISHED.items():
        if getattr(config, name) is None and (window or name == "remdm_eta"):
            setattr(config, name, value)


def validate_remdm(config: Any) -> None:
    """ValueErrors naming the field for ``remdm`` and its parameters (see the module docstring for the ranges)."""
    if config.remdm is None:
        given = [f"{name}={getattr(config, name)!r}" for name in REMDM_FIELDS if getattr(config, name) is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)}: read only by remdm (ReMDM remasking): pass remdm="
                f"{' / '.join(map(repr, REMDM_VARIANTS))}, or drop them"
            )
        return
    if config.remdm not in REMDM_VARIANTS:
        raise ValueError(f"unknown remdm {config.remdm!r}: use one of {list(REMDM_VARIANTS)} or None")
    _check_combinations(config)
    _check_window(config)
    _check_eta(config)


def _check_combinations(config: Any) -> None:
    """ReMDM is the paper's sampler (stochastic transfer, random order) with remasking: no other transfer or
    strategy, no reference loop. Guidance, logits processors and the KV caches combine with it."""
    for name, value in (("transfer", "stochastic"), ("strategy", "random")):
        given = config.__dict__.get(name)  # unset: the class default, which remdm does not read
        if given is not None and (given if name == "transfer" else canonical_strategy(given)) != value:
            raise ValueError(
                f"{name}={given!r} does not combine with remdm={config.remdm!r}: ReMDM reveals each masked position "
                f"independently (transfer='stochastic', strategy='random') and remasks revealed ones; pass "
                f"{name}={value!r} or leave {name} unset"
            )
    if config.reference not in (None, "none"):
        raise ValueError(
            f"reference={config.reference!r} is not supported with remdm={config.remdm!r} (a reference "
            "sampler runs its own loop, which never remasks): drop reference or remdm"
        )


def _check_window(config: Any) -> None:
    t_on, t_off = config.remdm_t_on, config.remdm_t_off
    if config.remdm != "loop":
        if t_on is not None or t_off is not None or config.remdm_alpha_on is not None:
            raise ValueError(
                f"remdm_t_on / remdm_t_off / remdm_alpha_on are read only by remdm='loop', not "
                f"remdm={config.remdm!r}: drop them"
            )
        return
    alpha_on = config.remdm_alpha_on
    if alpha_on is not None and not (is_number(alpha_on) and 0 < alpha_on < 1):
        raise ValueError(f"remdm_alpha_on={alpha_on!r}: alpha held on the loop's window must be in (0, 1), e.g. 0.9")
    if t_on is None and t_off is None:
        return  # the published window (`apply_remdm_defaults`)
    if t_on is None or t_off is None:
        raise ValueError(
            "remdm='loop' takes its window as remdm_t_on and remdm_t_off together, 0 < remdm_t_off < remdm_t_on "
            "< 1 (e.g. remdm_t_on=0.55, remdm_t_off=0.05), or neither for ReMDM's published window"
        )
    if not (is_number(t_on) and is_number(t_off) and 0 < t_off < t_on < 1):
        raise ValueError(
            f"remdm_t_on={t_on!r}, remdm_t_off={t_off!r}: the loop window needs 0 < remdm_t_off < remdm_t_on < 1"
        )


def _check_eta(config: Any) -> None:
    eta = config.remdm_eta
    if eta is None:
        if config.remdm in ("conf", "loop"):
            return  # the paper's conf: eta = 1; loop: the published eta (`apply_remdm_defaults`)
        raise ValueError(f"remdm={config.remdm!r} needs remdm_eta in [0, 1] (the remasking rate), e.g. remdm_eta=0.05")
    bound, why = 1.0, ""
    if config.remdm == "loop" and is_number(eta) and config.remdm_t_on is not None:
        alpha_on = config.remdm_alpha_on
        if alpha_on is None:
            alpha_on = float(
                normalised_alpha(
                    get_schedule(config.schedule, **(config.schedule_kwargs or {})),
                    torch.tensor([float(config.remdm_t_on)]),
                )[0]
            )
        bound = min(1.0, (1.0 - alpha_on) / alpha_on) if alpha_on > 0 else 1.0
        why = (
            f" (remdm='loop' with alpha_on={alpha_on:.4g}: eta <= (1 - alpha_on) / alpha_on keeps the reveal "
            "probability <= 1; lower remdm_eta, or lower alpha_on (remdm_alpha_on, or raise remdm_t_on without it))"
        )
    if not (is_number(eta) and 0 <= eta <= bound):
        raise ValueError(f"remdm_eta must be a number in [0, {bound:.4g}]{why}, got {eta!r}")


@dataclass(frozen=True)
class LoopSchedule:
    """ReMDM-loop's alpha (see the module docstring): ``base``'s until ``t_on``, held at alpha_on on [t_off, t_on],
    then up to 1 at t = 0. ``alpha_on=None``: alpha_on = alpha(t_on) and alpha(t t_on / t_off) after the window;
    otherwise ``base`` squeezed into [t_on, 1] (scaled to alpha_on) and into [0, t_off] (from alpha_on to 1).
    ``weight`` is the ELBO weight -alpha'/(1 - alpha) of that alpha (0 in the window)."""

    base: Any
    t_on: float
    t_off: float
    alpha_on: Optional[float] = None

    def _warp(self, t: torch.Tensor) -> torch.Tensor:
        held = torch.full_like(t, self.t_on)
        return torch.where(t >= self.t_on, t, torch.where(t >= self.t_off, held, t * (self.t_on / self.t_off)))

    def alpha(self, t: Any) -> Any:
        tt = torch.as_tensor(t, dtype=torch.float64)
        if self.alpha_on is None:
            value = self.base.alpha(self._warp(tt))
        else:
            a, base = self.alpha_on, lambda u: normalised_alpha(self.base, u.clamp(0.0, 1.0))
            before = a * base((tt - self.t_on) / (1.0 - self.t_on))
            after = a + (1.0 - a) * base(tt / self.t_off)
            value = torch.where(tt >= self.t_on, before, torch.where(tt >= self.t_off, torch.full_like(tt, a), after))
        return value if isinstance(t, torch.Tensor) else float(value)

    def weight(self, t: Any) -> Any:
        tt = torch.as_tensor(t, dtype=torch.float64)
        if self.alpha_on is None:
            scale = torch.where(tt >= self.t_on, 1.0, torch.where(tt >= self.t_off, 0.0, self.t_on / self.t_off))
            value = scale * self.base.weight(self._warp(tt))
        else:
            a = self.alpha_on
            u = ((tt - self.t_on) / (1.0 - self.t_on)).clamp(0.0, 1.0)
            b = normalised_alpha(self.base, u)
            before = a * self.base.weight(u) * (1.0 - b) / ((1.0 - self.t_on) * (1.0 - a * b))
            after = self.base.weight((tt / self.t_off).clamp(0.0, 1.0)) / self.t_off
            value = torch.where(tt >= self.t_on, before, torch.where(tt >= self.t_off, 0.0, after))
        return value if isinstance(t, torch.Tensor) else float(value)


@dataclass
class BlockState:
    """What the remasking loop holds while it denoises one block (B rows of length L, S steps)."""

    reveal_step: torch.Tensor  # (B, L) long: the step that reveals each masked position of the block, else -1
    confidence: torch.Tensor  # (B, L) float64: probability of each revealed token when it was revealed
    sigma: list[float]  # (S,) on the host: remasking probability of a revealed token (conf: eta sigma_max)
    hazard: torch.Tensor  # (S,) float64: probability that a position masked at step i is revealed there


@dataclass
class Remasking:
    """A ReMDM variant and its parameters; called on each block in place of `denoise_block` (`sample_blocks`)."""

    variant: str
    eta: float
    t_on: Optional[float] = None
    t_off: Optional[float] = None
    alpha_on: Optional[float] = None

    @classmethod
    def from_config(cls, config: Any, streamer: Any = None) -> Optional["Remasking"]:
        """The remasking of a validated config, None without ``remdm``; a ValueError with a ``streamer``."""
        if config.remdm is None:
            return None
        if streamer is not None:
            raise ValueError(
                f"streamer is not supported with remdm={config.remdm!r}: a streamed token could be "
                "remasked later and replaced; drop streamer or remdm"
            )
        eta = 1.0 if config.remdm_eta is None else float(config.remdm_eta)
        return cls(config.remdm, eta, config.remdm_t_on, config.remdm_t_off, config.remdm_alpha_on)

    def schedule(self, base: Any) -> Any:
        if self.variant != "loop":
            return base
        alpha_on = None if self.alpha_on is None else float(self.alpha_on)
        return LoopSchedule(base, float(self.t_on), float(self.t_off), alpha_on)

    def rates(self, base: Any, num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(S,) sigma and (S,) reveal probability of the masked positions at each step (see the module docstring)."""
        grid = time_grid(num_steps)
        alpha = normalised_alpha(self.schedule(base), grid)
        alpha_t, alpha_s = alpha[:-1], alpha[1:]
        sigma_max = torch.where(alpha_t > 0, (1.0 - alpha_s) / alpha_t.clamp(min=1e-300), 1.0).clamp(0.0, 1.0)
        if self.variant == "cap":
            sigma = sigma_max.clamp(max=self.eta)
        elif self.variant == "loop":
            window = (grid[:-1] <= self.t_on + 1e-12) & (grid[1:] >= self.t_off - 1e-12)
            sigma = torch.where(window, sigma_max.clamp(max=self.eta), 0.0)
        else:  # rescale, conf
            sigma = self.eta * sigma_max
        sigma[-1] = 0.0  # the last step reveals what remains
        masked_sigma = torch.zeros_like(sigma) if self.variant == "conf" else sigma
        hazard = (alpha_s - (1.0 - masked_sigma) * alpha_t) / (1.0 - alpha_t).clamp(min=1e-300)
        hazard = torch.where(alpha_t < 1, hazard, 1.0).clamp(0.0, 1.0)
        hazard[-1] = 1.0
        return sigma, hazard

    def __call__(
        self, sampler: Sampler, rows: Rows, region: torch.Tensor, num_steps: int, on_step: Callable[[], None]
    ) -> None:
        """Denoise the masked positions of ``region`` (B, L) in ``num_steps`` steps with remasking, in place."""
        sigma, hazard = self.rates(sampler.schedule, num_steps)
        x, hazard = rows.x, hazard.to(rows.x.device)
        reveal_step = _draw_reveal_steps(hazard, 0, (x == sampler.mask_id) & region, sampler.generator)
        confidence = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
        state = BlockState(reveal_step, confidence, sigma.tolist(), hazard)
        for i in range(num_steps):
            if self._step(sampler, rows, region, state, i):
                on_step()

    def _step(self, sampler: Sampler, rows: Rows, region: torch.Tensor, state: BlockState, i: int) -> bool:
        """Step i on ``rows``: remask (decided on the canvas at t), reveal (a forward on that canvas), then draw the
        reveal steps of the remasked positions. One read: the most positions a row reveals with whether any is
        remasked (the step's shapes, and whether it runs a forward). Returns whether the canvas changed."""
        x = rows.x
        remask = self._remask(state, region & (x != sampler.mask_id), i, sampler.generator)
        reveal = state.reveal_step == i
        counts = reveal.sum(1)
        any_remask = remask.any() if remask is not None else counts.new_zeros(())
        most, remasked = torch.stack([counts.max(), any_remask.long()]).tolist()
        if most:
            reveal_where(sampler, rows, reveal, counts, most, state.confidence)
            state.reveal_step.masked_fill_(reveal, -1)
        if not remasked:
            return bool(most)
        x.masked_fill_(remask, sampler.mask_id)
        with sampler.drawing_for(drawing=remask.any(1)):  # a row that remasks nothing draws nothing, as alone
            fresh = _draw_reveal_steps(state.hazard, i + 1, remask, sampler.generator)
        state.reveal_step = torch.where(remask, fresh, state.reveal_step)
        return True

    def _remask(self, state: BlockState, revealed: torch.Tensor, i: int, generator) -> Optional[torch.Tensor]:
        """(B, L) the revealed positions remasked at step i; None (no random draw) when none can be (sigma 0)."""
        budget = state.sigma[i]
        if budget <= 0:
            return None
        if self.variant == "conf":
            weights = torch.softmax((-state.confidence).masked_fill(~revealed, -math.inf), dim=1)
            probs = budget * torch.nan_to_num(weights, nan=0.0)  # rows with nothing revealed: NaN -> 0
        else:
            probs = torch.full(revealed.shape, budget, dtype=torch.float64, device=revealed.device)
        u = random_rand(revealed.shape, generator, revealed.device, torch.float64)
        return revealed & (u < probs)


def _draw_reveal_steps(hazard: torch.Tensor, first: int, chosen: torch.Tensor, generator) -> torch.Tensor:
    """(B, L) the step (>= ``first``) that reveals each ``chosen`` position, -1 elsewhere: each step i reveals a
    position still masked with probability ``hazard[i]`` (`draw_steps`, the plain sampler's draw)."""
    cdf = 1.0 - torch.cumprod(1.0 - hazard[first:], dim=0)
    steps = first + draw_steps(cdf, chosen.shape, generator, chosen.device)
    return steps.masked_fill_(~chosen, -1)
