"""``OracleDenoiser``: the exact posterior of a language behind the interface of a transformers model.

With it, any masked diffusion sampler runs with a perfect denoiser (epsilon_learning = 0 in the paper), so the
sampler's own error (the number of steps, the transfer rule, the order) can be measured against ground truth.
"""

from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Union

import torch
from torch import nn

from .base import DEFAULT_SMOOTHING, SyntheticLanguage, check_positions
from .inference import select_positions

#: Logit of a token with posterior probability 0. Finite, so that guidance arithmetic (``u + s (c - u)``) and
#: entropies (``p log p``) stay free of NaN; ``exp`` of it is exactly 0 in float16/32/64.
IMPOSSIBLE_LOGIT = -1e4


@dataclass
class OracleConfig:
    """The attributes a generic sampler reads from ``model.config``."""

    vocab_size: int  # output width V = max(language vocab, mask_token_id + 1)
    mask_token_id: int
    language_vocab_size: int
    language_class: str
    smoothing: float
    logits_shift: int = 0
    max_position_embeddings: int = 1 << 30
    pad_token_id: Optional[int] = None
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    is_encoder_decoder: bool = False
    model_type: str = "hf_mdm_oracle"

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class OracleOutput:
    """``logits``: ``(B, L, V)``, or ``(B, K, V)`` with ``logits_to_keep``."""

    logits: torch.FloatTensor

    def __getitem__(self, key: Union[int, str]) -> torch.Tensor:
        if key in (0, "logits"):
            return self.logits
        raise KeyError(key)

    def to_tuple(self) -> tuple:
        return (self.logits,)


class OracleDenoiser(nn.Module):
    """A denoiser whose logits are the exact log posterior ``log q_{0|t}(x^i | x_t)`` of ``language``.

    Args:
        language: any ``SyntheticLanguage``.
        mask_token_id: id of [MASK]; must not be a token of the language (usually ``language.vocab_size``, the
            default). Logits have ``V = max(language.vocab_size, mask_token_id + 1)`` columns.
        smoothing: ``x_t`` can be impossible under ``q`` (a sampler that reveals several tokens in one step can
            reveal two that contradict each other, Theorem 4.4). Such rows get the posterior of ``q_eps``, every
            stochastic row of the language mixed as ``(1 - eps) row + eps uniform`` with ``eps = smoothing``: a proper
            distribution that puts its mass on the completions with the fewest violations. Rows with
            ``q(x_t) > 0`` are exact.
        dtype: dtype of the logits (``.to(dtype)`` changes it too). Everything is computed in float64 and rounded
            once to ``dtype``, except that the 2-gram fast path with large tables ("bag" mode of ``MarkovBridge``)
            adds two stored log terms in ``dtype``.

    Output logits: at a masked position the log posterior over the language's tokens; at a visible position 0 for
    the visible token. Every zero probability, the [MASK] column and any id between ``language.vocab_size`` and
    ``mask_token_id`` are ``IMPOSSIBLE_LOGIT`` (-1e4, whose exp is exactly 0); never NaN, never -inf.

    ``attention_mask`` zeros mark pads anywhere in a row: the row's non-pad tokens are taken as the sequence
    (pads removed) and the logits at pad positions are those of an extra masked position (a valid, ignorable
    distribution). ``position_ids`` are ignored. Cost per call: O(B L) index arithmetic plus one fused gather of
    ``(B, K, V)`` for 2-grams (the chain language); O(B L S^2) float64 forward-backward for HMMs and O(B L V^n)
    for n >= 3 n-grams.
    """

    supports_per_row_logits_to_keep = True  # logits_to_keep may be (B, K) positions per row

    def __init__(
        self,
        language: SyntheticLanguage,
        mask_token_id: Optional[int] = None,
        *,
        smoothing: float = DEFAULT_SMOOTHING,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        mask_token_id = language.vocab_size if mask_token_id is None else int(mask_token_id)
        if mask_token_id < language.vocab_size:
            raise ValueError(
                f"mask_token_id={mask_token_id} is a token of the language (vocab_size={language.vocab_size}); "
                f"use an id >= {language.vocab_size}."
            )
        if smoothing <= 0:
            raise ValueError("smoothing must be > 0 so that impossible inputs still get a distribution.")
        self.language = language
        self.config = OracleConfig(
            vocab_size=max(language.vocab_size, mask_token_id + 1),
            mask_token_id=mask_token_id,
            language_vocab_size=language.vocab_size,
            language_class=language.language_class,
            smoothing=smoothing,
        )
        self.register_buffer("_anchor", torch.zeros(0, dtype=dtype), persistent=False)

    @property
    def device(self) -> torch.device:
        return self._anchor.device

    @property
    def dtype(self) -> torch.dtype:
        return self._anchor.dtype

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        logits_to_keep: Union[int, torch.Tensor, None] = 0,
        **kwargs: Any,
    ) -> OracleOutput:
        """Args:
            input_ids: ``(B, L)`` x_t: language tokens and ``mask_token_id`` (pads may hold any id).
            attention_mask: optional ``(B, L)``, 0 at pads.
            position_ids: ignored.
            logits_to_keep: 0 or None for every position; an int ``k`` for the last ``k`` positions; a 1-D
                LongTensor of positions; or (an extension over transformers) a ``(B, K)`` LongTensor of positions per
                row, for samplers that choose the positions to reveal before the forward pass.

        Returns:
            ``OracleOutput`` with ``logits`` of shape ``(B, K, V)`` in ``self.dtype``.
        """
        positions = _positions_to_keep(logits_to_keep, input_ids)
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            logits = select_positions(self._padded_log_posterior(input_ids, attention_mask.bool()), positions)
        else:
            logits = self._log_posterior(input_ids, positions)
        return OracleOutput(logits=logits)

    def _log_posterior(self, x_t: torch.LongTensor, positions: Optional[torch.LongTensor]) -> torch.Tensor:
        config = self.config
        return self.language._log_posterior(
            x_t, config.mask_token_id, positions, config.smoothing, config.vocab_size, self.dtype, IMPOSSIBLE_LOGIT
        )

    def _padded_log_posterior(self, input_ids: torch.LongTensor, keep: torch.BoolTensor) -> torch.Tensor:
        """Moves each row's tokens to the front (stable), masks the freed tail, and maps the logits back."""
        order = torch.argsort((~keep).to(torch.uint8), dim=1, stable=True)
        compact = input_ids.gather(1, order).masked_fill(~keep.gather(1, order), self.config.mask_token_id)
        logits = self._log_posterior(compact, None)
        inverse = torch.argsort(order, dim=1)
        return logits.gather(1, inverse.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))

    def extra_repr(self) -> str:
        return f"language={self.language!r}, mask_token_id={self.config.mask_token_id}"


def _positions_to_keep(
    logits_to_keep: Union[int, torch.Tensor, None], input_ids: torch.LongTensor
) -> Optional[torch.LongTensor]:
    if logits_to_keep is None or (isinstance(logits_to_keep, int) and logits_to_keep == 0):
        return None
    length = input_ids.shape[1]
    if isinstance(logits_to_keep, int):
        if logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be >= 0, got {logits_to_keep}.")
        return torch.arange(max(length - logits_to_keep, 0), length, device=input_ids.device)
    return check_positions(logits_to_keep, input_ids.shape, input_ids.device)


__all__ = ["OracleDenoiser", "OracleConfig", "OracleOutput", "IMPOSSIBLE_LOGIT"]
