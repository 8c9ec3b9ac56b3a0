"""Exact inference for the synthetic languages.

Two engines compute the denoising posterior ``q_{0|t}(x^i | x_t)``, where ``x_t`` is a sequence with some
positions masked (the masked positions are summed out):

* ``forward_backward`` works for any language written as a hidden Markov chain (``HiddenChain``): an HMM, or
  an n-gram whose hidden state is its context. Scaled forward-backward in float64: ``2 L`` sequential steps, each
  vectorised over the batch and costing O(B S^2) (O(B S V) for n-gram contexts), so O(B L S^2) per call.
* ``MarkovBridge`` is the fast path for first-order Markov chains over tokens (2-grams, the Theorem 4.4 chain).
  There a visible token pins the chain, so the posterior at a masked position depends only on the nearest visible
  tokens ``a`` at ``i - d`` and ``b`` at ``i + e``:

      q(x^i = v | x_t) = P^d[a, v] P^e[v, b] / P^(d+e)[a, b],

  which is a lookup in tables of matrix powers: no loop over positions, O(B L V) per call in total.
"""

from abc import ABC, abstractmethod
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

#: Rows of a forward-backward batch are processed in chunks so that the evidence and the stored messages, of
#: ``rows * (length * evidence_size + 2 * kept positions * states)`` float64 numbers, stay below this many
#: elements (256 MiB).
MAX_MESSAGE_ELEMENTS = 1 << 25
_TINY = torch.finfo(torch.float64).tiny


class HiddenChain(ABC):
    """A language seen as a hidden Markov chain ``z_0, ..., z_{L-1}``; token ``x_i`` depends on ``z_i`` only.

    Subclasses hold the matrices (float64, on one device) and implement the operations below.
    """

    num_states: int
    vocab_size: int
    evidence_size: int  # E, the last dimension of ``evidence``

    @abstractmethod
    def prior(self) -> torch.Tensor:
        """Distribution of ``z_0``, shape ``(S,)``."""

    @abstractmethod
    def evidence(self, tokens: torch.LongTensor, observed: torch.BoolTensor) -> torch.Tensor:
        """The likelihood of each position's token (1 where masked) in a compact form. ``(B, L)`` -> ``(B, L, E)``."""

    @abstractmethod
    def weigh(self, messages: torch.Tensor, evidence: torch.Tensor, position: int) -> torch.Tensor:
        """``messages(z) * q(x_i | z_i = z)`` for ``i = position`` and ``evidence = evidence(...)[:, i]``.
        ``(B, S), (B, E) -> (B, S)``."""

    @abstractmethod
    def propagate(self, alpha: torch.Tensor, position: int) -> torch.Tensor:
        """``sum_z alpha(z) q(z_i = z' | z_{i-1} = z)`` for ``i = position``. ``(B, S) -> (B, S)``."""

    @abstractmethod
    def pull_back(self, beta: torch.Tensor, position: int) -> torch.Tensor:
        """``sum_z' q(z_i = z' | z_{i-1} = z) beta(z')`` for ``i = position``. ``(B, S) -> (B, S)``."""

    @abstractmethod
    def token_marginals(self, gamma: torch.Tensor, positions: torch.LongTensor) -> torch.Tensor:
        """``sum_z gamma_k(z) q(x_i = v | z_i = z)`` at ``i = positions[k]``. ``(B, K, S) -> (B, K, V)``."""


def select_positions(values: torch.Tensor, positions: Optional[torch.LongTensor]) -> torch.Tensor:
    """``values[:, positions]`` for 1-D ``positions`` (the same for every row), a per-row gather for ``(B, K)``
    positions, ``values`` itself for None. ``values``: ``(B, L, ...)`` -> ``(B, K, ...)``."""
    if positions is None:
        return values
    if positions.dim() == 1:
        return values[:, positions]
    trailing = values.shape[2:]
    index = positions.view(*positions.shape, *(1,) * len(trailing)).expand(*positions.shape, *trailing)
    return values.gather(1, index)


def _normalise(messages: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Scales each row to sum 1 (all-zero rows stay zero). Returns the scaled rows and the ``(B, 1)`` row sums."""
    total = messages.sum(-1, keepdim=True)
    return messages / total.clamp_min(_TINY), total


def _forward(
    chain: HiddenChain, evidence: torch.Tensor, slot: Optional[list] = None, stored: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Scaled forward pass over ``evidence`` ``(B, L, E)``; stores the normalised ``alpha_i`` in
    ``stored[:, slot[i]]``.
    Returns ``log q(visible tokens)``, ``(B,)``."""
    batch, length, _ = evidence.shape
    totals = torch.empty(batch, length, dtype=torch.float64, device=evidence.device)
    alpha = chain.prior().expand(batch, -1)
    for i in range(length):
        alpha = chain.weigh(alpha if i == 0 else chain.propagate(alpha, i), evidence[:, i], i)
        alpha, totals[:, i : i + 1] = _normalise(alpha)
        if slot is not None and slot[i] >= 0:
            stored[:, slot[i]] = alpha
    return totals.log().sum(1)


def forward_log_evidence(chain: HiddenChain, x: torch.LongTensor, observed: torch.BoolTensor) -> torch.Tensor:
    """``log q(visible tokens of x)`` by the scaled forward algorithm. ``x``, ``observed``: ``(B, L)``.
    Returns ``(B,)`` float64, ``-inf`` where impossible."""
    batch, length = x.shape
    rows_per_chunk = max(1, MAX_MESSAGE_ELEMENTS // max(1, length * chain.evidence_size))
    tokens = x.clamp(0, chain.vocab_size - 1)
    return torch.cat(
        [
            _forward(chain, chain.evidence(tokens[rows], observed[rows]))
            for rows in (slice(start, start + rows_per_chunk) for start in range(0, batch, rows_per_chunk))
        ]
        or [torch.zeros(0, dtype=torch.float64, device=x.device)]
    )


def forward_backward(
    chain: HiddenChain,
    x_t: torch.LongTensor,
    observed: torch.BoolTensor,
    positions: Optional[torch.LongTensor],
    num_columns: int,
    dtype: torch.dtype,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact log posteriors ``log q(x^i | x_t)`` at ``positions`` and ``log q(visible tokens)``.

    Args:
        chain: the language as a ``HiddenChain``.
        x_t: ``(B, L)`` token ids (masked entries may hold anything, ``observed`` says which are visible).
        observed: ``(B, L)`` bool.
        positions: LongTensor of ``K`` positions in ``[0, L)``, 1-D or ``(B, K)`` (per row), or None for all.
        num_columns: output width ``C >= V``; columns ``>= V`` are ``-inf``.
        dtype: output dtype (the arithmetic is float64).

    Returns:
        ``(B, K, C)`` log posteriors (one-hot logs at visible positions; arbitrary in rows whose visible tokens are
        impossible) and ``(B,)`` float64 log evidence.
    """
    batch, length = x_t.shape
    keep = torch.arange(length, device=x_t.device) if positions is None else positions
    unique_keep, inverse = torch.unique(keep, return_inverse=True)
    per_row = length * chain.evidence_size + 2 * unique_keep.numel() * chain.num_states
    rows_per_chunk = max(1, MAX_MESSAGE_ELEMENTS // max(1, per_row))
    outputs, evidences = [], []
    for start in range(0, batch, rows_per_chunk):
        rows = slice(start, start + rows_per_chunk)
        out, log_evidence = _forward_backward_chunk(chain, x_t[rows], observed[rows], unique_keep)
        outputs.append(out)
        evidences.append(log_evidence)
    if not outputs:
        outputs.append(torch.zeros(0, unique_keep.numel(), chain.vocab_size, dtype=torch.float64, device=x_t.device))
        evidences.append(torch.zeros(0, dtype=torch.float64, device=x_t.device))
    log_post = select_positions(torch.cat(outputs), inverse)
    tokens = select_positions(x_t, keep).unsqueeze(-1)
    one_hot = torch.where(torch.arange(chain.vocab_size, device=x_t.device) == tokens, 0.0, float("-inf"))
    log_post = torch.where(select_positions(observed, keep).unsqueeze(-1), one_hot.double(), log_post)
    out = F.pad(log_post, (0, num_columns - chain.vocab_size), value=float("-inf")).to(dtype)
    return out, torch.cat(evidences)


def _forward_backward_chunk(
    chain: HiddenChain, x_t: torch.LongTensor, observed: torch.BoolTensor, keep: torch.LongTensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward-backward over one chunk of rows; ``keep`` is sorted and unique. Returns ``(B, K, V)`` float64 log
    token marginals (rows impossible under the chain hold NaN) and ``(B,)`` log evidence."""
    batch, length = x_t.shape
    evidence = chain.evidence(x_t.clamp(0, chain.vocab_size - 1), observed)  # (B, L, E)
    slot = torch.full((length,), -1, dtype=torch.long)
    slot[keep.cpu()] = torch.arange(keep.numel())
    slot = slot.tolist()
    alphas = torch.empty(batch, keep.numel(), chain.num_states, dtype=torch.float64, device=x_t.device)
    betas = torch.empty_like(alphas)
    log_evidence = _forward(chain, evidence, slot, alphas)

    beta = torch.ones(batch, chain.num_states, dtype=torch.float64, device=x_t.device)
    first = int(keep.min()) if keep.numel() else length
    for i in range(length - 1, first - 1, -1):
        if slot[i] >= 0:
            betas[:, slot[i]] = beta
        if i > first:
            beta, _ = _normalise(chain.pull_back(chain.weigh(beta, evidence[:, i], i), i))
    gamma, _ = _normalise(alphas * betas)
    return chain.token_marginals(gamma, keep).log(), log_evidence


class _BridgeTables(NamedTuple):
    remap_left: torch.Tensor  # int32: raw left code d * W - a  ->  left row (min(d, D) - 1) * W + a   (W = V + 1)
    remap_right: torch.Tensor  # int32: raw right code e * W + b  ->  right row min(e, D) * W + b
    num_right: int  # number of right rows, (D + 1) * W
    max_distance: int  # D
    pair: torch.Tensor  # (D * W * W,) float64: log P_ext^d[a, b] at ((d - 1) * W + a) * W + b, 0 for b = EOS
    # joint mode: one row per key = left_row * num_right + right_row, for each parameter set (exact, smoothed)
    joint: Optional[torch.Tensor]  # (num_sets * num_keys, C) log posteriors
    joint_evidence: Optional[torch.Tensor]  # (num_keys,) float64: log P_ext^d[a, b] at visible keys (e = 0), else 0
    # bag mode: left rows then right rows of each set, summed by embedding_bag; minus the normaliser
    bag: Optional[torch.Tensor]  # (num_sets * (num_left + num_right), C)
    normaliser: Optional[torch.Tensor]  # (num_sets * D * W * W,) float64: ``pair`` of each set with -inf -> 0


class MarkovBridge:
    """Posteriors of a first-order Markov chain over tokens from tables of matrix powers.

    The chain is extended with a virtual BOS state (id ``V``) at position -1 whose transition row is the initial
    distribution, so ``P_ext^(i+1)[BOS, v] = q(x^i = v)``, and a virtual EOS at position ``L`` that carries no
    evidence. A position ``i`` is summarised by its nearest visible token (or BOS) ``a`` at ``i - d`` and its nearest
    visible token (or EOS) ``b`` at ``i + e`` (``e = 0`` when ``i`` itself is visible, then ``b = x_i``):

    * masked: ``log q(x^i = v | x_t) = log P_ext^d[a, v] + log P^e[v, b] - log P_ext^(d+e)[a, b]``;
    * visible: one-hot of ``b``, and ``log P_ext^d[a, b]`` is its factor of ``log q(visible tokens)``.

    Distances are capped at ``D``, the first power that equals the next to 1e-13 (2 for the chain language, 20-50
    for random 2-grams), or at ``L + 1``. A call is two cumulative scans and a few int32 operations over ``(B, L)``
    to find ``(d, a, e, b)``, then one gather: when ``D (V+1) x (D+1) (V+1)`` keys times ``V`` columns is small the
    log posterior of every key is tabulated ("joint" mode); otherwise a left table and a right table are summed by
    ``embedding_bag`` and the normaliser subtracted ("bag" mode).

    Args:
        initial: ``(V,)`` float64 distribution of the first token.
        transition: ``(V, V)`` float64 row-stochastic matrix.
        fallback: optional ``(initial, transition)`` of the smoothed chain, used for the rows whose visible tokens
            are impossible under the exact one.
    """

    #: Powers are considered converged when consecutive ones have the same zero pattern and agree to this
    #: relative tolerance; longer distances then reuse the last power.
    CONVERGENCE_RTOL = 1e-13
    #: The per-key table is used when it has at most this many entries (all parameter sets together).
    JOINT_TABLE_MAX_ELEMENTS = 1 << 23

    def __init__(
        self,
        initial: torch.Tensor,
        transition: torch.Tensor,
        fallback: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> None:
        self.vocab_size = transition.shape[0]
        self.sets = [(initial, transition)] + ([fallback] if fallback is not None else [])
        self._log_powers: Optional[torch.Tensor] = None  # (num_sets, D, V+1, V+1)
        self._max_length = 0  # longest sequence the remaps cover
        self._converged = False
        self._tables: dict = {}

    def log_posterior(
        self,
        x_t: torch.LongTensor,
        observed: torch.BoolTensor,
        positions: Optional[torch.LongTensor],
        num_columns: int,
        dtype: torch.dtype,
        floor: Optional[float] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Same contract as ``forward_backward``; rows impossible under the exact chain use the fallback chain
        (when given) instead of holding garbage. With ``floor``, log probabilities below it are raised to it."""
        batch, length = x_t.shape
        if length == 0:
            empty = torch.empty(batch, 0 if positions is None else positions.shape[-1], num_columns, dtype=dtype)
            return empty.to(x_t.device), torch.zeros(batch, dtype=torch.float64, device=x_t.device)
        tables = self._get_tables(length, x_t.device, dtype, num_columns, floor)
        width = self.vocab_size + 1
        tokens, visible = x_t.to(torch.int32), observed.to(torch.int32)
        pos_code = torch.arange(1, length * width + 1, width, dtype=torch.int32, device=x_t.device)  # i * W + 1
        end_code = length * width + self.vocab_size + 1 - pos_code  # (EOS code + 1) - (i * W + 1)

        # Nearest visible token strictly to the left, as l * W + a + 1 (0 = BOS at -1): raw code d * W - a.
        left = torch.mul(tokens + pos_code, visible).cummax(1).values
        left_row = _lookup(tables.remap_left, pos_code - F.pad(left[:, :-1], (1, 0)))
        # Nearest visible token at or after, as EOS - (r * W + b) (0 = EOS at L): raw code e * W + b.
        right = torch.mul(end_code - tokens, visible).flip(1).cummax(1).values.flip(1)
        right_row = _lookup(tables.remap_right, end_code - right)

        if tables.joint is not None:
            key = torch.add(right_row, left_row, alpha=tables.num_right)
            log_evidence = _lookup(tables.joint_evidence, key).sum(1)
            shift = self._set_shift(log_evidence)
            key = select_positions(key if shift is None else key + shift * tables.joint_evidence.numel(), positions)
            return F.embedding(key, tables.joint), log_evidence

        # visible position: left_row * W + right_row is ((d - 1) * W + a) * W + x_i
        evidence_terms = _lookup(tables.pair, left_row * width + right_row.clamp(max=self.vocab_size))
        log_evidence = torch.where(observed, evidence_terms, 0.0).sum(1)
        shift = self._set_shift(log_evidence)
        left_row, right_row = select_positions(left_row, positions), select_positions(right_row, positions)
        left_distance = left_row.div(width, rounding_mode="floor")  # d - 1
        right_distance = right_row.div(width, rounding_mode="floor")  # e
        total = (left_distance + right_distance + 1).clamp(max=tables.max_distance)  # d + e, capped
        left_token, right_token = left_row - left_distance * width, right_row - right_distance * width
        pair_key = ((total - 1) * width + left_token) * width + right_token
        num_left = tables.max_distance * width
        if shift is not None:
            pair_key = pair_key + shift * tables.pair.numel()
            left_row, right_row = left_row + shift * num_left, right_row + shift * tables.num_right
        keys = torch.stack([left_row, right_row + len(self.sets) * num_left], dim=-1).view(-1, 2)
        out = F.embedding_bag(keys, tables.bag, mode="sum").view(batch, -1, num_columns)
        out.sub_(_lookup(tables.normaliser, pair_key).to(dtype).unsqueeze(-1))
        if floor is not None:
            out.clamp_(min=floor)
        return out, log_evidence

    def _set_shift(self, log_evidence: torch.Tensor) -> Optional[torch.Tensor]:
        """``(B, 1)`` int32: 1 for the rows that use the fallback set (impossible under the exact chain), or None."""
        impossible = torch.isneginf(log_evidence)
        if len(self.sets) == 1 or not bool(impossible.any()):
            return None
        return impossible.to(torch.int32).unsqueeze(1)

    # ----------------------------------------------------------------------------------------------------------
    # Tables.

    def _get_tables(
        self, length: int, device: torch.device, dtype: torch.dtype, num_columns: int, floor: Optional[float]
    ) -> _BridgeTables:
        if length > self._max_length:
            max_length = max(length, 2 * self._max_length)
            if not self._converged or self._log_powers is None:
                powers = [_log_matrix_powers(initial, transition, max_length + 1) for initial, transition in self.sets]
                cap = max(p.shape[0] for p, _ in powers)
                self._log_powers = torch.stack([_pad_powers(p, cap) for p, _ in powers])
                self._converged = all(converged for _, converged in powers)
            self._max_length = max_length
            self._tables = {}
        key = (device, dtype, num_columns, floor)
        if key not in self._tables:
            self._tables[key] = self._build_tables(device, dtype, num_columns, floor)
        return self._tables[key]

    def _build_tables(
        self, device: torch.device, dtype: torch.dtype, num_columns: int, floor: Optional[float]
    ) -> _BridgeTables:
        log_powers = self._log_powers  # (num_sets, D, W, W), W = V + 1
        num_sets, cap, width, _ = log_powers.shape
        vocab = self.vocab_size
        remap_left, remap_right = _distance_remaps(self._max_length, cap, width)
        pair = log_powers.clone()
        pair[..., vocab] = 0.0  # b = EOS
        pair = pair.reshape(num_sets, -1)  # index ((d - 1) * W + a) * W + b
        common = dict(
            remap_left=remap_left.to(device),
            remap_right=remap_right.to(device),
            num_right=(cap + 1) * width,
            max_distance=cap,
            pair=pair[0].to(device),
        )
        rows = _row_pieces(log_powers, vocab)
        if num_sets * rows.left.shape[1] * rows.right.shape[1] * num_columns <= self.JOINT_TABLE_MAX_ELEMENTS:
            joint, evidence = _joint_table(rows, pair, cap, width, vocab, num_columns, floor)
            return _BridgeTables(
                **common,
                joint=joint.reshape(-1, num_columns).to(device=device, dtype=dtype),
                joint_evidence=evidence.reshape(-1).to(device),
                bag=None,
                normaliser=None,
            )
        right = torch.where(
            rows.is_visible.view(1, -1, 1), rows.one_hot, rows.right
        )  # visible: left + one-hot - evidence
        bag = torch.cat(
            [
                F.pad(rows.left.reshape(-1, vocab), (0, num_columns - vocab), value=float("-inf")),
                F.pad(right.reshape(-1, vocab), (0, num_columns - vocab), value=0.0),
            ]
        )
        normaliser = torch.where(torch.isneginf(pair), 0.0, pair).reshape(-1)
        return _BridgeTables(
            **common,
            joint=None,
            joint_evidence=None,
            bag=bag.to(device=device, dtype=dtype),
            normaliser=normaliser.to(device),
        )


def _lookup(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for a 1-D table (``index_select`` is several times faster than advanced indexing on CPU)."""
    return table.index_select(0, index.reshape(-1)).view(index.shape)


def _log_matrix_powers(initial: torch.Tensor, transition: torch.Tensor, max_distance: int) -> Tuple[torch.Tensor, bool]:
    """``log P_ext^d`` for ``d = 1 .. D`` as a ``(D, V+1, V+1)`` float64 tensor, where ``P_ext`` is ``transition``
    extended with a BOS state whose row is ``initial``. ``D = max_distance`` unless the powers converge earlier
    (then ``P_ext^d = P_ext^D`` for all ``d >= D`` to ``MarkovBridge.CONVERGENCE_RTOL``). Returns
    ``(powers, converged)``."""
    vocab = transition.shape[0]
    extended = torch.zeros(vocab + 1, vocab + 1, dtype=torch.float64)
    extended[:vocab, :vocab] = transition.double().cpu()
    extended[vocab, :vocab] = initial.double().cpu()
    powers = [extended]
    converged = False
    while len(powers) < max_distance:
        following = powers[-1] @ extended
        if torch.equal(following > 0, powers[-1] > 0) and torch.allclose(
            following, powers[-1], rtol=MarkovBridge.CONVERGENCE_RTOL, atol=0.0
        ):
            converged = True
            break
        powers.append(following)
    stacked = torch.stack(powers)
    return torch.where(stacked > 0, stacked.log(), float("-inf")), converged


def _pad_powers(log_powers: torch.Tensor, cap: int) -> torch.Tensor:
    """Repeats the last (converged) power up to ``cap`` distances."""
    if log_powers.shape[0] == cap:
        return log_powers
    return torch.cat([log_powers, log_powers[-1:].expand(cap - log_powers.shape[0], -1, -1)])


def _distance_remaps(max_length: int, cap: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Remaps from raw codes (distances up to the longest sequence) to capped rows: left index d * W - a, right
    index e * W + b."""
    raw_distance = torch.arange(max_length + 2).repeat_interleave(width)
    token = torch.arange(width).repeat(max_length + 2)
    remap_left = torch.zeros((max_length + 3) * width, dtype=torch.int32)
    remap_left[raw_distance * width - token + width] = ((raw_distance.clamp(1, cap) - 1) * width + token).int()
    remap_left = remap_left[width:].contiguous()
    remap_right = (raw_distance.clamp(max=cap) * width + token).int()
    return remap_left, remap_right


class _RowPieces(NamedTuple):
    """Per-row pieces, float64: left rows (d, a) -> log P_ext^d[a, :V]; right rows (e, b) -> log P^e[:V, b]."""

    d: torch.Tensor
    a: torch.Tensor
    e: torch.Tensor
    b: torch.Tensor
    is_visible: torch.Tensor
    is_eos: torch.Tensor
    left: torch.Tensor  # (sets, num_left, V)
    right: torch.Tensor  # (sets, num_right, V)
    one_hot: torch.Tensor  # (num_right, V)


def _row_pieces(log_powers: torch.Tensor, vocab: int) -> _RowPieces:
    _, cap, width, _ = log_powers.shape
    d = torch.arange(1, cap + 1).repeat_interleave(width)
    a = torch.arange(width).repeat(cap)
    e = torch.arange(cap + 1).repeat_interleave(width)
    b = torch.arange(width).repeat(cap + 1).clamp(max=vocab - 1)
    is_visible, is_eos = (e == 0), (torch.arange(width).repeat(cap + 1) == vocab)
    left = log_powers[:, d - 1, a, :vocab]
    right = log_powers.transpose(2, 3)[:, (e - 1).clamp(min=0), b, :vocab]
    right = torch.where((is_visible | is_eos).view(1, -1, 1), 0.0, right)
    one_hot = torch.where(torch.arange(vocab) == b.view(-1, 1), 0.0, float("-inf"))
    return _RowPieces(d, a, e, b, is_visible, is_eos, left, right, one_hot)


def _joint_table(
    rows: _RowPieces, pair: torch.Tensor, cap: int, width: int, vocab: int, num_columns: int, floor: Optional[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The joint table (sets, num_left, num_right, num_columns) of every (left, right) key, and its evidence."""
    neg_inf = float("-inf")
    num_right = rows.right.shape[1]
    total = (rows.d.view(-1, 1) + rows.e.view(1, -1)).clamp(max=cap)  # (num_left, num_right)
    pair_index = ((total - 1) * width + rows.a.view(-1, 1)) * width + torch.where(rows.is_eos, vocab, rows.b).view(
        1, -1
    )
    log_norm = pair[:, pair_index]  # (sets, num_left, num_right)
    masked = rows.left.unsqueeze(2) + rows.right.unsqueeze(1) - log_norm.unsqueeze(-1)
    joint = torch.where(rows.is_visible.view(1, 1, -1, 1), rows.one_hot.view(1, 1, num_right, vocab), masked)
    joint = torch.where(torch.isnan(joint), neg_inf, joint)  # keys that only impossible rows reach
    joint = F.pad(joint, (0, num_columns - vocab), value=neg_inf)
    if floor is not None:
        joint = joint.clamp(min=floor)
    evidence = torch.where(rows.is_visible.view(1, -1), log_norm[0], 0.0)
    return joint, evidence
