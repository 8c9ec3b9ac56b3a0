"""Hidden Markov model languages: ``z_0 ~ initial``, ``z_i ~ transition[z_{i-1}]``, ``x_i ~ emission[z_i]``."""

import math
from typing import Any, Dict, Optional, Tuple

import torch

from .base import (
    DEFAULT_CONCENTRATION,
    DEFAULT_PRUNE_THRESHOLD,
    ExpectedNLL,
    SyntheticLanguage,
    check_stochastic,
    cumulative_rows,
    random_stochastic_rows,
    sample_from_cdf,
)
from .inference import HiddenChain, forward_backward, forward_log_evidence

#: ``expected_nll`` enumerates every sequence when there are at most this many, and estimates otherwise.
MAX_ENUMERATED_SEQUENCES = 1 << 16


class HMMLanguage(SyntheticLanguage):
    """An HMM language with exact inference by scaled forward-backward (float64).

    Args:
        initial: ``(S,)`` distribution of the first hidden state.
        transition: ``(S, S)`` row-stochastic hidden-state transitions.
        emission: ``(S, V)`` row-stochastic token emissions.
        seed, concentration, prune_threshold: recorded in ``hyperparameters()`` when the matrices came from
            ``random``; None otherwise.
    """

    def __init__(
        self,
        initial: torch.Tensor,
        transition: torch.Tensor,
        emission: torch.Tensor,
        *,
        seed: Optional[int] = None,
        concentration: Optional[float] = None,
        prune_threshold: Optional[float] = None,
    ) -> None:
        emission = torch.as_tensor(emission, dtype=torch.float64).cpu().contiguous()
        super().__init__(emission.shape[1])
        self.num_states = emission.shape[0]
        self.initial = torch.as_tensor(initial, dtype=torch.float64).cpu().contiguous()
        self.transition = torch.as_tensor(transition, dtype=torch.float64).cpu().contiguous()
        self.emission = emission
        if self.initial.shape != (self.num_states,) or self.transition.shape != (self.num_states, self.num_states):
            raise ValueError(
                f"Expected initial ({self.num_states},) and transition ({self.num_states}, {self.num_states}) to "
                f"match emission ({self.num_states}, {self.vocab_size}); got {tuple(self.initial.shape)} and "
                f"{tuple(self.transition.shape)}."
            )
        for name, rows in self.tensors().items():
            check_stochastic(name, rows)
        self.seed, self.concentration, self.prune_threshold = seed, concentration, prune_threshold
        self._chains: Dict[torch.device, "HMMChain"] = {}

    @classmethod
    def random(
        cls,
        num_states: int,
        vocab_size: int,
        seed: int,
        concentration: float = DEFAULT_CONCENTRATION,
        prune_threshold: float = DEFAULT_PRUNE_THRESHOLD,
    ) -> "HMMLanguage":
        """A random HMM: ``initial``, ``transition`` and ``emission``, each row pruned-Dirichlet, drawn in that order
        from ``torch.Generator().manual_seed(seed)``."""
        if num_states < 1 or vocab_size < 1:
            raise ValueError(f"num_states and vocab_size must be >= 1, got {num_states} and {vocab_size}.")
        generator = torch.Generator().manual_seed(seed)
        initial = random_stochastic_rows(1, num_states, generator, concentration, prune_threshold)[0]
        transition = random_stochastic_rows(num_states, num_states, generator, concentration, prune_threshold)
        emission = random_stochastic_rows(num_states, vocab_size, generator, concentration, prune_threshold)
        return cls(
            initial, transition, emission, seed=seed, concentration=concentration, prune_threshold=prune_threshold
        )

    # ----------------------------------------------------------------------------------------------------------
    # Serialisation.

    def hyperparameters(self) -> Dict[str, Any]:
        return {
            "num_states": self.num_states,
            "vocab_size": self.vocab_size,
            "seed": self.seed,
            "concentration": self.concentration,
            "prune_threshold": self.prune_threshold,
        }

    def tensors(self) -> Dict[str, torch.Tensor]:
        return {"initial": self.initial, "transition": self.transition, "emission": self.emission}

    @classmethod
    def _from_tensors(cls, hyperparameters: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> "HMMLanguage":
        keys = ("seed", "concentration", "prune_threshold")
        return cls(
            tensors["initial"], tensors["transition"], tensors["emission"], **{k: hyperparameters.get(k) for k in keys}
        )

    def _with_tensors(self, tensors: Dict[str, torch.Tensor]) -> "HMMLanguage":
        return HMMLanguage(tensors["initial"], tensors["transition"], tensors["emission"])

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "HMMLanguage":
        if config.get("seed") is None:
            raise ValueError("This HMM was not made by HMMLanguage.random; load it from its directory.")
        return cls.random(
            config["num_states"],
            config["vocab_size"],
            config["seed"],
            config["concentration"],
            config["prune_threshold"],
        )

    # ----------------------------------------------------------------------------------------------------------
    # Sampling and likelihood.

    def sample(self, num: int, length: int, generator: Optional[torch.Generator] = None) -> torch.LongTensor:
        """Samples the hidden chain left to right, then all emissions at once. Returns ``(num, length)`` int64."""
        uniforms = torch.rand(2, length, num, dtype=torch.float64, generator=generator)
        states = torch.empty(length, num, dtype=torch.long)  # filled position by position
        if length == 0:
            return states.T.contiguous()
        transition_cdf = cumulative_rows(self.transition)
        states[0] = sample_from_cdf(cumulative_rows(self.initial), uniforms[0, 0])
        for i in range(1, length):
            states[i] = sample_from_cdf(transition_cdf[states[i - 1]], uniforms[0, i])
        return sample_from_cdf(cumulative_rows(self.emission)[states], uniforms[1]).T.contiguous()

    def log_prob(self, x: torch.LongTensor) -> torch.DoubleTensor:
        """``log q(x)`` by the scaled forward algorithm: ``(B, L)`` -> ``(B,)`` float64, ``-inf`` outside the
        support."""
        x = self._check_tokens(x)
        return forward_log_evidence(self.hidden_chain(x.device), x, torch.ones_like(x, dtype=torch.bool))

    def expected_nll(self, length: int, *, num_samples: int = 10_000, seed: int = 0) -> ExpectedNLL:
        """The entropy of ``length`` tokens: exact (``stderr = 0.0``) by enumeration when ``vocab_size**length <=
        MAX_ENUMERATED_SEQUENCES``; otherwise the Monte Carlo mean of ``-log q(x)`` over ``num_samples`` samples
        drawn with ``torch.Generator().manual_seed(seed)``, with its standard error."""
        if length <= 0:
            return ExpectedNLL(0.0, 0.0)
        if length * math.log(self.vocab_size) <= math.log(MAX_ENUMERATED_SEQUENCES):
            x = _all_sequences(self.vocab_size, length)
            log_p = self.log_prob(x)
            p = log_p.exp()
            return ExpectedNLL(float(-(p * torch.where(p > 0, log_p, 0.0)).sum()), 0.0)
        if num_samples < 2:
            raise ValueError(f"num_samples must be >= 2 for a Monte Carlo estimate, got {num_samples}.")
        generator = torch.Generator().manual_seed(seed)
        nll = -self.log_prob(self.sample(num_samples, length, generator))
        return ExpectedNLL(float(nll.mean()), float(nll.std() / math.sqrt(num_samples)))

    # ----------------------------------------------------------------------------------------------------------
    # Posterior.

    def _log_posterior_and_evidence(
        self,
        x_t: torch.LongTensor,
        observed: torch.BoolTensor,
        positions: Optional[torch.LongTensor],
        num_columns: int,
        dtype: torch.dtype,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        return forward_backward(self.hidden_chain(x_t.device), x_t, observed, positions, num_columns, dtype)

    def hidden_chain(self, device: torch.device = torch.device("cpu")) -> "HMMChain":
        """The ``HiddenChain`` view used by ``forward_backward``, with the matrices on ``device``."""
        device = torch.device(device)
        if device not in self._chains:
            self._chains[device] = HMMChain(self, device)
        return self._chains[device]


class HMMChain(HiddenChain):
    """``HiddenChain`` operations of an HMM: dense ``(S, S)`` steps and ``(S, V)`` emissions."""

    def __init__(self, language: HMMLanguage, device: torch.device) -> None:
        self.num_states, self.vocab_size = language.num_states, language.vocab_size
        self.evidence_size = self.num_states
        self._prior = language.initial.to(device)
        self._transition = language.transition.to(device)
        self._transition_t = self._transition.T.contiguous()
        self._emission = language.emission.to(device)
        self._emission_t = self._emission.T.contiguous()  # (V, S): q(x = v | z) as rows

    def prior(self) -> torch.Tensor:
        return self._prior

    def evidence(self, tokens: torch.LongTensor, observed: torch.BoolTensor) -> torch.Tensor:
        return torch.where(observed.unsqueeze(-1), self._emission_t[tokens], 1.0)  # (B, L, S)

    def weigh(self, messages: torch.Tensor, evidence: torch.Tensor, position: int) -> torch.Tensor:
        return messages * evidence

    def propagate(self, alpha: torch.Tensor, position: int) -> torch.Tensor:
        return alpha @ self._transition

    def pull_back(self, beta: torch.Tensor, position: int) -> torch.Tensor:
        return beta @ self._transition_t

    def token_marginals(self, gamma: torch.Tensor, positions: torch.LongTensor) -> torch.Tensor:
        return gamma @ self._emission


def _all_sequences(vocab_size: int, length: int) -> torch.LongTensor:
    """Every sequence of ``length`` tokens in lexicographic order: ``(vocab_size**length, length)``."""
    index = torch.arange(vocab_size**length).unsqueeze(1)
    return index // vocab_size ** torch.arange(length - 1, -1, -1) % vocab_size


__all__ = ["HMMLanguage", "HMMChain"]
