"""n-gram languages and the Theorem 4.4 chain language.

An n-gram language of order ``n`` over ``V`` tokens generates left to right: the first token from ``initial``,
token ``i`` from the table of order ``k + 1 = min(i, n - 1) + 1`` given the previous ``k`` tokens. So the first
``n - 2`` tokens use lower-order tables (the 2-gram, 3-gram, ... tables of the language's own start) and every
later token the n-gram table. All tables are random with the pruned-Dirichlet recipe (``random``).

Contexts are numbered in base ``V`` with the oldest token as the most significant digit: the context
``(a, b)`` is row ``a * V + b`` of ``transitions[1]``.
"""

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .base import (
    DEFAULT_CONCENTRATION,
    DEFAULT_PRUNE_THRESHOLD,
    ExpectedNLL,
    SyntheticLanguage,
    check_positions,
    check_stochastic,
    cumulative_rows,
    random_stochastic_rows,
    row_entropy,
    safe_log,
    sample_from_cdf,
)
from .inference import HiddenChain, MarkovBridge, forward_backward

#: The most table entries (``V + V**2 + ... + V**n``, float64) ``NGramLanguage.random`` draws: 2**27 entries are
#: 1 GiB of tables, and drawing them takes a few times that in temporaries.
MAX_TABLE_ENTRIES = 2**27


def check_table_size(vocab_size: int, n: int) -> None:
    """A ValueError, before anything is allocated, when the tables of an n-gram language over ``vocab_size``
    tokens would hold more than ``MAX_TABLE_ENTRIES`` entries; it says how many and what to lower."""
    entries = table_entries(vocab_size, n)
    if entries <= MAX_TABLE_ENTRIES:
        return
    fits = [k for k in range(2, min(n, 64)) if table_entries(vocab_size, k) <= MAX_TABLE_ENTRIES]
    lower = f"n to {fits[-1]}{' or less' * (fits[-1] > 2)} at this vocab_size, or vocab_size" if fits else "vocab_size"
    raise ValueError(
        f"an n-gram language with vocab_size={vocab_size} and n={n} needs {entries:,} table entries (about "
        f"{max(entries * 8 // 2**30, 1):,} GiB of float64; vocab_size**n of them in the n-gram table), more than "
        f"MAX_TABLE_ENTRIES = {MAX_TABLE_ENTRIES:,}: lower {lower}."
    )


def table_entries(vocab_size: int, n: int) -> int:
    """Entries of an n-gram language's tables: ``V`` (first token) + ``V**2`` + ... + ``V**n``."""
    return n if vocab_size == 1 else (vocab_size ** (n + 1) - vocab_size) // (vocab_size - 1)


class NGramLanguage(SyntheticLanguage):
    """An n-gram language (``n >= 2``) with exact inference.

    Args:
        initial: ``(V,)`` distribution of the first token.
        transitions: ``n - 1`` row-stochastic tables; ``transitions[k - 1]`` has shape ``(V**k, V)`` and gives
            token ``i`` given the previous ``k`` tokens, used for ``i = k`` when ``k < n - 1`` and for every
            ``i >= n - 1`` when ``k = n - 1``.
        seed, concentration, prune_threshold: recorded in ``hyperparameters()`` when the tables came from
            ``random``; None otherwise.

    Exact inference: ``log_prob`` and ``expected_nll`` directly from the tables; ``log_posterior`` by
    ``MarkovBridge`` for ``n = 2`` and by forward-backward over the ``V**(n-1)`` contexts (each step O(V**n), not
    O(V**(2n-2)): a context ``(a, b)`` can only move to ``(b, c)``) for ``n >= 3``.
    """

    def __init__(
        self,
        initial: torch.Tensor,
        transitions: Sequence[torch.Tensor],
        *,
        seed: Optional[int] = None,
        concentration: Optional[float] = None,
        prune_threshold: Optional[float] = None,
    ) -> None:
        initial = torch.as_tensor(initial, dtype=torch.float64).cpu()
        super().__init__(initial.shape[0])
        vocab = self.vocab_size
        self.n = len(transitions) + 1
        if self.n < 2:
            raise ValueError("An n-gram language needs n >= 2, i.e. at least one transition table.")
        self.initial = initial.contiguous()
        self.transitions: List[torch.Tensor] = []
        for k, table in enumerate(transitions, start=1):
            table = torch.as_tensor(table, dtype=torch.float64).cpu().contiguous()
            if table.shape != (vocab**k, vocab):
                raise ValueError(
                    f"transitions[{k - 1}] must have shape ({vocab**k}, {vocab}), got {tuple(table.shape)}."
                )
            self.transitions.append(table)
        for name, rows in self.tensors().items():
            check_stochastic(name, rows)
        self.seed, self.concentration, self.prune_threshold = seed, concentration, prune_threshold
        self._log_initial = safe_log(self.initial)
        self._log_transitions = [safe_log(t) for t in self.transitions]
        self._bridges: Dict[float, MarkovBridge] = {}
        self._chains: Dict[torch.device, "ContextChain"] = {}

    @classmethod
    def random(
        cls,
        vocab_size: int,
        n: int,
        seed: int,
        concentration: float = DEFAULT_CONCENTRATION,
        prune_threshold: float = DEFAULT_PRUNE_THRESHOLD,
    ) -> "NGramLanguage":
        """A random n-gram language: ``initial`` then the tables of orders 2..n, each row pruned-Dirichlet, all
        drawn in that order from ``torch.Generator().manual_seed(seed)``. Tables of more than
        ``MAX_TABLE_ENTRIES`` entries in all (``vocab_size**n`` for the n-gram table) raise a ValueError first."""
        if n < 2:
            raise ValueError(f"n must be >= 2, got {n}.")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}.")
        check_table_size(vocab_size, n)
        generator = torch.Generator().manual_seed(seed)
        tables = [
            random_stochastic_rows(rows, vocab_size, generator, concentration, prune_threshold)
            for rows in [1] + [vocab_size**k for k in range(1, n)]
        ]
        initial, transitions = tables[0][0], tables[1:]
        return NGramLanguage(
            initial, transitions, seed=seed, concentration=concentration, prune_threshold=prune_threshold
        )

    # ----------------------------------------------------------------------------------------------------------
    # Serialisation.

    def hyperparameters(self) -> Dict[str, Any]:
        return {
            "vocab_size": self.vocab_size,
            "n": self.n,
            "seed": self.seed,
            "concentration": self.concentration,
            "prune_threshold": self.prune_threshold,
        }

    def tensors(self) -> Dict[str, torch.Tensor]:
        tables = {f"transition_{k}": t for k, t in enumerate(self.transitions, start=1)}
        return {"initial": self.initial, **tables}

    @classmethod
    def _from_tensors(cls, hyperparameters: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> "NGramLanguage":
        n = hyperparameters["n"]
        transitions = [tensors[f"transition_{k}"] for k in range(1, n)]
        keys = ("seed", "concentration", "prune_threshold")
        return NGramLanguage(tensors["initial"], transitions, **{k: hyperparameters.get(k) for k in keys})

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "NGramLanguage":
        if config.get("seed") is None:
            raise ValueError("This n-gram language was not made by NGramLanguage.random; load it from its directory.")
        return cls.random(
            config["vocab_size"], config["n"], config["seed"], config["concentration"], config["prune_threshold"]
        )

    # ----------------------------------------------------------------------------------------------------------
    # Sampling and likelihood.

    def sample(self, num: int, length: int, generator: Optional[torch.Generator] = None) -> torch.LongTensor:
        """Ancestral sampling, vectorised over the ``num`` sequences. Returns ``(num, length)`` int64."""
        uniforms = torch.rand(length, num, dtype=torch.float64, generator=generator)
        x = torch.empty(length, num, dtype=torch.long)  # filled position by position, returned transposed
        if length > 0:
            cdfs = [cumulative_rows(t) for t in self.transitions]
            x[0] = sample_from_cdf(cumulative_rows(self.initial), uniforms[0])
            context, num_contexts = x[0].clone(), self.vocab_size ** (self.n - 1)
            for i in range(1, length):
                table = cdfs[min(i, self.n - 1) - 1]
                x[i] = sample_from_cdf(table[context], uniforms[i])
                context = (context * self.vocab_size + x[i]) % num_contexts
        return x.T.contiguous()

    def log_prob(self, x: torch.LongTensor) -> torch.DoubleTensor:
        """``log q(x)``: ``(B, L)`` -> ``(B,)`` float64, ``-inf`` outside the support."""
        x = self._check_tokens(x)
        batch, length = x.shape
        log_p = torch.zeros(batch, dtype=torch.float64, device=x.device)
        if length == 0:
            return log_p
        device = x.device
        log_p += self._log_initial.to(device)[x[:, 0]]
        order = self.n - 1
        context = x[:, 0]
        for i in range(1, min(length, order)):  # the first tokens, from the lower-order tables
            log_p += self._log_transitions[i - 1].to(device)[context, x[:, i]]
            context = context * self.vocab_size + x[:, i]
        if length > order:
            digits = self.vocab_size ** torch.arange(order - 1, -1, -1, device=device)
            contexts = (x.unfold(1, order, 1)[:, : length - order] * digits).sum(-1)  # (B, L - n + 1)
            log_p += self._log_transitions[-1].to(device)[contexts, x[:, order:]].sum(1)
        return log_p

    def expected_nll(self, length: int, *, num_samples: int = 10_000, seed: int = 0) -> ExpectedNLL:
        """Exact entropy of the first ``length`` tokens (``stderr = 0.0``), by propagating the distribution of the
        context: ``H = H(initial) + sum_i E[H(q(x_i | context_i))]``. ``num_samples`` and ``seed`` are unused."""
        if length <= 0:
            return ExpectedNLL(0.0, 0.0)
        vocab, order = self.vocab_size, self.n - 1
        entropies = [row_entropy(t) for t in self.transitions]
        total = float(row_entropy(self.initial))
        context = self.initial  # distribution of the last min(i, n - 1) tokens before position i
        for i in range(1, length):
            k = min(i, order)
            table = self.transitions[k - 1]
            total += float(context @ entropies[k - 1])
            joint = context.unsqueeze(1) * table  # (V**k, V): (context, next token)
            context = joint.reshape(-1) if k < order else joint.view(vocab, -1).sum(0)
        return ExpectedNLL(total, 0.0)

    # ----------------------------------------------------------------------------------------------------------
    # Posterior.

    def _log_posterior(
        self,
        x_t: torch.LongTensor,
        mask_token_id: int,
        positions: Optional[torch.LongTensor],
        smoothing: float,
        num_columns: int,
        dtype: torch.dtype,
        floor: Optional[float] = None,
    ) -> torch.Tensor:
        if self.n > 2:
            return super()._log_posterior(x_t, mask_token_id, positions, smoothing, num_columns, dtype, floor)
        # 2-grams: one fused pass, the smoothed fallback tables sit next to the exact ones.
        observed = self._check_partly_masked(x_t, mask_token_id)
        positions = check_positions(positions, x_t.shape, x_t.device)
        bridge = self._bridge(smoothing)
        out, log_evidence = bridge.log_posterior(x_t, observed, positions, num_columns, dtype, floor)
        if smoothing == 0:
            out[torch.isneginf(log_evidence)] = float("nan")
        return out

    def _log_posterior_and_evidence(
        self,
        x_t: torch.LongTensor,
        observed: torch.BoolTensor,
        positions: Optional[torch.LongTensor],
        num_columns: int,
        dtype: torch.dtype,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.n == 2:
            return self._bridge(0.0).log_posterior(x_t, observed, positions, num_columns, dtype)
        return forward_backward(self.hidden_chain(x_t.device), x_t, observed, positions, num_columns, dtype)

    def _bridge(self, smoothing: float) -> MarkovBridge:
        if smoothing not in self._bridges:
            fallback = None
            if smoothing > 0:
                smoothed = self.smoothed(smoothing)
                fallback = (smoothed.initial, smoothed.transitions[0])
            self._bridges[smoothing] = MarkovBridge(self.initial, self.transitions[0], fallback)
        return self._bridges[smoothing]

    def hidden_chain(self, device: torch.device = torch.device("cpu")) -> "ContextChain":
        """The language as a hidden Markov chain over its ``V**(n-1)`` contexts (for ``forward_backward``)."""
        device = torch.device(device)
        if device not in self._chains:
            self._chains[device] = ContextChain(self, device)
        return self._chains[device]

    def _with_tensors(self, tensors: Dict[str, torch.Tensor]) -> "NGramLanguage":
        return NGramLanguage(tensors["initial"], [tensors[f"transition_{k}"] for k in range(1, self.n)])


class ContextChain(HiddenChain):
    """An n-gram as a hidden Markov chain whose state is a context of ``h = n - 1`` tokens.

    Positions ``0 .. h - 1`` all carry the first context ``(x_0, ..., x_{h-1})`` (identity transitions), and
    position ``i`` checks the token at digit ``min(i, h - 1)`` of the state; from position ``h`` on the state is the
    window of the last ``h`` tokens, which moves ``(a, rest) -> (rest, c)`` with probability ``P[(a, rest), c]``.
    If ``L < h`` the unobserved digits of the first context are summed out, which gives the right marginal.
    """

    def __init__(self, language: NGramLanguage, device: torch.device) -> None:
        vocab, self.order = language.vocab_size, language.n - 1
        self.vocab_size, self.num_states, self.evidence_size = vocab, vocab**self.order, vocab
        prior = language.initial
        for table in language.transitions[:-1]:
            prior = (prior.unsqueeze(1) * table).reshape(-1)
        self._prior = prior.to(device)
        # step[rest, first, next] = P[(first, rest), next]
        self._step = language.transitions[-1].view(vocab, -1, vocab).transpose(0, 1).contiguous().to(device)
        self._step_t = self._step.transpose(1, 2).contiguous()  # [rest, next, first]

    def prior(self) -> torch.Tensor:
        return self._prior

    def _digit_view(self, messages: torch.Tensor, digit: int) -> torch.Tensor:
        """``(..., S)`` -> ``(..., V**digit, V, V**(h-1-digit))``."""
        vocab = self.vocab_size
        return messages.view(*messages.shape[:-1], vocab**digit, vocab, vocab ** (self.order - 1 - digit))

    def evidence(self, tokens: torch.LongTensor, observed: torch.BoolTensor) -> torch.Tensor:
        values = torch.arange(self.vocab_size, device=tokens.device)
        return ((values == tokens.unsqueeze(-1)) | ~observed.unsqueeze(-1)).double()  # (B, L, V)

    def weigh(self, messages: torch.Tensor, evidence: torch.Tensor, position: int) -> torch.Tensor:
        digit = self._digit_view(messages, min(position, self.order - 1))
        return (digit * evidence.view(-1, 1, self.vocab_size, 1)).view(messages.shape)

    def propagate(self, alpha: torch.Tensor, position: int) -> torch.Tensor:
        if position < self.order:
            return alpha
        batch = alpha.shape[0]
        alpha = alpha.view(batch, self.vocab_size, -1).permute(2, 0, 1)  # (rest, B, first)
        return torch.bmm(alpha, self._step).transpose(0, 1).reshape(batch, -1)  # (B, rest, next)

    def pull_back(self, beta: torch.Tensor, position: int) -> torch.Tensor:
        if position < self.order:
            return beta
        batch = beta.shape[0]
        beta = beta.view(batch, -1, self.vocab_size).transpose(0, 1)  # (rest, B, next)
        return torch.bmm(beta, self._step_t).permute(1, 2, 0).reshape(batch, -1)  # (B, first, rest)

    def token_marginals(self, gamma: torch.Tensor, positions: torch.LongTensor) -> torch.Tensor:
        marginals = self._digit_view(gamma, self.order - 1).sum((-3, -1))
        for k, position in enumerate(positions.tolist()):
            if position < self.order - 1:
                marginals[:, k] = self._digit_view(gamma[:, k], position).sum((-3, -1))
        return marginals


class ChainLanguage(NGramLanguage):
    """The language of Theorem 4.4 (Feng et al., 2025): 16 tokens ``4 * u + v`` with ``u, v`` in ``0..3``.

    The first token is uniform over the 16; each next token has ``u`` equal to the previous token's ``v`` and a
    uniform ``v`` (4 choices). Equivalently, the links ``w_0, ..., w_L`` are i.i.d. uniform on ``0..3`` and token
    ``i`` is ``4 * w_i + w_{i+1}``; a sequence is valid iff it is such a chain, and all ``16 * 4**(L-1)`` valid
    sequences are equally likely. It is a 2-gram, so every ``NGramLanguage`` method applies, exactly.
    """

    def __init__(self) -> None:
        tokens = torch.arange(16)
        initial = torch.full((16,), 1 / 16, dtype=torch.float64)
        transition = (tokens.unsqueeze(1) % 4 == tokens.unsqueeze(0) // 4).double() / 4
        super().__init__(initial, [transition])

    @classmethod
    def random(cls, *args: Any, **kwargs: Any) -> "NGramLanguage":
        raise TypeError("ChainLanguage has no random parameters: use ChainLanguage().")

    def hyperparameters(self) -> Dict[str, Any]:
        return {"vocab_size": 16}

    @classmethod
    def _from_tensors(cls, hyperparameters: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> "ChainLanguage":
        return cls()

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "ChainLanguage":
        return cls()

    @staticmethod
    def predicted_ser(length: int, steps: int) -> float:
        """SER of the paper's sampler with the exact denoiser (the oracle) on this language.

        The sampler is the stochastic-transfer, random-order reverse process with the linear schedule: every
        masked position is revealed independently with probability ``1 / (steps remaining)``, so each position's
        reveal step is uniform on ``1..N`` and independent of the others, and each revealed token is drawn from its
        own posterior marginal. Given a possible ``x_t`` the unrevealed links ``w_j`` are i.i.d. uniform, so a
        token revealed next to a visible one always agrees with it, while the link ``w_j`` shared by positions
        ``j - 1`` and ``j`` is drawn twice, independently, when both are revealed in the same step, and then
        disagrees with probability 3/4. The ``L - 1`` events "positions j-1 and j share their step" are mutually
        independent with probability ``1 / N`` each, hence

            SER = 1 - (1 - 3 / (4 N)) ** (L - 1)  ~=  1 - exp(-(3/4) (L - 1) / N)

        (0.527 at ``N = L = 512``, 0.950 at ``N = L / 4``, 0.046 at ``N = 16 L``).
        """
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}.")
        return 1.0 - (1.0 - 3.0 / (4.0 * steps)) ** max(length - 1, 0)

    @staticmethod
    def predicted_ter_increase(length: int, steps: int) -> float:
        """The paper's TER relative increase TER(p) / TER(q) - 1 of the paper's sampler with the exact denoiser.

        Every factor of p(x) (the chance of drawing each token given those revealed in earlier steps, for a given
        grouping of the positions into steps) depends for a valid chain only on which neighbours were revealed
        earlier (1/16, 1/4 or 1), not on the tokens, so p is the same on every one of the ``16 * 4**(L-1)`` valid
        chains: p(x) = (1 - SER) q(x). Hence TER(p) = 2^(E_q[-log2 p(x)] / L) = TER(q) (1 - SER)^(-1/L) and

            TER(p) / TER(q) - 1 = (1 - 3 / (4 N)) ** (-(L - 1) / L) - 1  ~=  3 / (4 N) for N >> 1,

        which does not grow with L (Theorem 4.2), while SER does (`predicted_ser`).
        """
        if steps < 1 or length < 1:
            raise ValueError(f"steps and length must be >= 1, got {steps}, {length}.")
        return math.expm1(-(length - 1) / length * math.log1p(-3.0 / (4.0 * steps)))  # exact, in log space

    @staticmethod
    def predicted_block_ser(length: int, block_size: int, steps_per_block: int) -> float:
        """SER of the paper's sampler run block by block (block diffusion) with the exact denoiser on this language:
        blocks of ``block_size`` positions decoded left to right, each in ``steps_per_block`` steps.

        The oracle is a perfect block diffusion model: the masked blocks after the current one carry no information,
        so its conditionals are those the block sees under block-causal attention. Inside a block the argument of
        `predicted_ser` holds with ``N = steps_per_block``: two neighbours of the block disagree with probability
        3/4 when they share their step (probability 1/s); a block's first position sits next to the completed block
        before it, with which it always agrees. The events are independent, one per pair of neighbours inside a
        block (``length`` minus the number of blocks of them), hence

            SER = 1 - (1 - 3 / (4 s)) ** (L - ceil(L / b))

        (0 for b = 1, an autoregressive order; `predicted_ser` for b = L).
        """
        if block_size < 1 or steps_per_block < 1:
            raise ValueError(f"block_size and steps_per_block must be >= 1, got {block_size}, {steps_per_block}.")
        pairs = length - -(-length // block_size)
        return 1.0 - (1.0 - 3.0 / (4.0 * steps_per_block)) ** pairs


__all__ = ["NGramLanguage", "ChainLanguage", "ContextChain"]
