"""The base class of the synthetic languages: saving, loading, validation and the shared parts of exact inference.

A *language* is a distribution ``q`` over token sequences of every length, such that the distribution over
sequences of length ``L`` is the marginal of the one over longer sequences (each language generates left to
right and has no end-of-sequence token). Token ids are ``0 .. vocab_size - 1``.

Random parameters follow one recipe (DESIGN.md section 4): every row of every stochastic matrix is drawn from a
symmetric Dirichlet(``concentration``), entries below ``prune_threshold`` are set to zero (the largest entry of
a row is always kept) and the row is renormalised. The pruning is what makes some sequences impossible, so that
the Sequence Error Rate (SER) is meaningful.
"""

import json
import math
import os
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Dict, NamedTuple, Optional, Type, Union

import torch
from safetensors.torch import load_file, save_file

LANGUAGE_CONFIG_NAME = "language_config.json"
LANGUAGE_WEIGHTS_NAME = "language.safetensors"
FORMAT_VERSION = 1

#: Dirichlet concentration of the random languages. With 16 tokens a row then has a few large entries and a
#: long tail: about 30% of its entries are below 0.01.
DEFAULT_CONCENTRATION = 0.5
#: Entries below this are zeroed. With ``DEFAULT_CONCENTRATION`` this removes about 30% of the entries and
#: 1.6% of the mass of a row of 16 (42% of the entries and 4% of the mass of a row of 32).
DEFAULT_PRUNE_THRESHOLD = 0.01
#: Weight of the uniform distribution mixed into every stochastic row when ``x_t`` is impossible under ``q``
#: (see ``SyntheticLanguage.log_posterior``).
DEFAULT_SMOOTHING = 1e-6
#: The paper these languages come from (the datasets' and the metrics' citation).
PAPER_CITATION = """\
@inproceedings{feng2025theoretical,
  title = {Theoretical Benefit and Limitation of Diffusion Language Model},
  author = {Feng, Guhao and Geng, Yihan and Guan, Jian and Wu, Wei and Wang, Liwei and He, Di},
  booktitle = {Advances in Neural Information Processing Systems},
  year = {2025},
  eprint = {2502.09622},
  archivePrefix = {arXiv}
}
"""

_LANGUAGE_CLASSES: Dict[str, Type["SyntheticLanguage"]] = {}


class ExpectedNLL(NamedTuple):
    """The entropy ``H(q_L) = E_{x ~ q}[-log q(x)]`` of the sequences of one length, in nats (natural log).

    ``value`` is the total over the sequence (not per token); ``stderr`` is the standard error of a Monte Carlo
    estimate, exactly ``0.0`` when ``value`` is exact. Unpacks as ``value, stderr = language.expected_nll(L)``.
    """

    value: float
    stderr: float

    def per_token(self, length: int) -> float:
        """``value / length``: the optimal per-token negative log-likelihood in nats."""
        return self.value / length

    def ter(self, length: int) -> float:
        """The Token Error Rate of ``q`` itself, ``TER(q) = exp(value / length)`` (a perplexity)."""
        return math.exp(self.value / length)


def check_stochastic(name: str, rows: torch.Tensor) -> None:
    """Raises a ValueError unless every row (last dimension) of ``rows`` is a probability distribution."""
    if (rows < 0).any() or not torch.isfinite(rows).all():
        raise ValueError(f"{name} must hold finite non-negative probabilities.")
    if not torch.allclose(rows.sum(-1), torch.ones((), dtype=torch.float64), atol=1e-9, rtol=0):
        raise ValueError(f"Every row of {name} must sum to 1.")


def safe_log(p: torch.Tensor) -> torch.Tensor:
    """``log p`` with ``log 0 = -inf`` and no warning."""
    return torch.where(p > 0, p.log(), float("-inf"))


def random_stochastic_rows(
    num_rows: int, size: int, generator: torch.Generator, concentration: float, prune_threshold: float
) -> torch.Tensor:
    """Draws ``num_rows`` distributions over ``size`` outcomes with the pruned-Dirichlet recipe.

    Each row ~ Dirichlet(``concentration`` * ones(size)); entries ``< prune_threshold`` become 0, except the row's
    largest entry; the row is renormalised. Returns a float64 tensor of shape ``(num_rows, size)``.
    """
    if concentration <= 0:
        raise ValueError(f"concentration must be > 0, got {concentration}.")
    if not 0 <= prune_threshold < 1:
        raise ValueError(f"prune_threshold must be in [0, 1), got {prune_threshold}.")
    alpha = torch.full((num_rows, size), float(concentration), dtype=torch.float64)
    # Dirichlet = normalised Gamma draws; torch's Gamma sampler is the one that accepts a generator.
    gammas = torch._standard_gamma(alpha, generator=generator)
    rows = gammas / gammas.sum(-1, keepdim=True)
    keep = rows >= prune_threshold
    keep.scatter_(-1, rows.argmax(-1, keepdim=True), True)
    rows = torch.where(keep, rows, torch.zeros_like(rows))
    return rows / rows.sum(-1, keepdim=True)


def smooth_rows(rows: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Mixes every row (last dimension) with the uniform distribution: ``(1 - epsilon) * rows + epsilon / size``."""
    return (1.0 - epsilon) * rows + epsilon / rows.shape[-1]


def row_entropy(rows: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row (last dimension) of a stochastic matrix, with ``0 log 0 = 0``."""
    logs = torch.where(rows > 0, rows.log(), torch.zeros_like(rows))
    return -(rows * logs).sum(-1)


def sample_from_cdf(cdf: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: for rows ``cdf`` of shape ``(..., K)`` and ``uniforms`` of shape ``(...)`` in [0, 1).

    ``cdf`` must come from ``cumulative_rows`` so that zero-probability outcomes are never returned.
    """
    return torch.searchsorted(cdf, uniforms.unsqueeze(-1), right=True).squeeze(-1)


def cumulative_rows(rows: torch.Tensor) -> torch.Tensor:
    """Cumulative sums of the rows, scaled so that the entry of the last non-zero outcome is exactly 1.0."""
    cdf = rows.cumsum(-1)
    return cdf / cdf[..., -1:]


class SyntheticLanguage(ABC):
    """A distribution over token sequences with exact (or exactly estimated) inference.

    Subclasses implement the abstract methods: sampling, likelihood, entropy, the exact posterior with the
    likelihood of the visible tokens, and access to their stochastic matrices and hyper-parameters.
    """

    language_class: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.language_class = cls.__name__
        _LANGUAGE_CLASSES[cls.__name__] = cls

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = int(vocab_size)
        self._smoothed_cache: Dict[float, "SyntheticLanguage"] = {}

    # ----------------------------------------------------------------------------------------------------------
    # What subclasses provide.

    @abstractmethod
    def sample(self, num: int, length: int, generator: Optional[torch.Generator] = None) -> torch.LongTensor:
        """Draws ``num`` sequences ``x ~ q`` of ``length`` tokens. Returns a LongTensor of shape ``(num, length)``."""

    @abstractmethod
    def log_prob(self, x: torch.LongTensor) -> torch.DoubleTensor:
        """``log q(x)`` in nats for ``x`` of shape ``(B, L)``; ``-inf`` outside the support.
        Returns ``(B,)`` float64."""

    @abstractmethod
    def expected_nll(self, length: int, *, num_samples: int = 10_000, seed: int = 0) -> ExpectedNLL:
        """The entropy of the sequences of ``length`` tokens; see ``ExpectedNLL``."""

    @abstractmethod
    def hyperparameters(self) -> Dict[str, Any]:
        """The JSON-serialisable parameters that ``random`` (or the constructor) was called with."""

    @abstractmethod
    def tensors(self) -> Dict[str, torch.Tensor]:
        """The stochastic matrices by name (float64, every row sums to 1)."""

    @classmethod
    @abstractmethod
    def _from_tensors(cls, hyperparameters: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> "SyntheticLanguage":
        """Re-creates a saved language from its hyper-parameters and matrices."""

    @abstractmethod
    def _log_posterior_and_evidence(
        self,
        x_t: torch.LongTensor,
        observed: torch.BoolTensor,
        positions: Optional[torch.LongTensor],
        num_columns: int,
        dtype: torch.dtype,
    ) -> "tuple[torch.Tensor, torch.Tensor]":
        """Exact ``log q(x^i | x_t)`` at ``positions`` (all if None), shape ``(B, K, num_columns)`` (columns
        ``>= vocab_size`` at ``-inf``), and ``log q(visible tokens of x_t)``, shape ``(B,)``. Rows whose visible
        tokens are impossible may hold anything in the first output."""

    # ----------------------------------------------------------------------------------------------------------
    # Derived API.

    def in_support(self, x: torch.LongTensor) -> torch.BoolTensor:
        """Whether ``q(x) > 0`` for each row of ``x`` (shape ``(B, L)``). Returns a BoolTensor of shape ``(B,)``."""
        return torch.isfinite(self.log_prob(x))

    def log_posterior(
        self,
        x_t: torch.LongTensor,
        mask_token_id: int,
        positions: Optional[torch.LongTensor] = None,
        *,
        smoothing: float = DEFAULT_SMOOTHING,
    ) -> torch.DoubleTensor:
        """The exact denoising posterior ``log q_{0|t}(x^i = v | x_t)`` (natural log, float64).

        Args:
            x_t: ``(B, L)`` partly masked sequences: ids in ``[0, vocab_size)`` or ``mask_token_id``.
            mask_token_id: the id of [MASK]; must not be a token of the language.
            positions: optional LongTensor of ``K`` positions: 1-D (the same for every row) or ``(B, K)`` (per row);
                by default every position (``K = L``).
            smoothing: for rows whose visible tokens are impossible under ``q`` (``q(x_t) = 0``; they arise when a
                sampler reveals contradicting tokens in one step) the posterior does not exist; those rows get the
                posterior of ``q_eps``, the language with every stochastic row mixed as
                ``(1 - eps) * row + eps * uniform``, ``eps = smoothing``. ``smoothing=0`` returns NaN for them.
                Rows with ``q(x_t) > 0`` are always exact.

        Returns:
            ``(B, K, vocab_size)`` float64: at a masked position the log posterior over tokens (``-inf`` for
            impossible tokens), at a visible position the log of the one-hot of the visible token.
        """
        return self._log_posterior(x_t, mask_token_id, positions, smoothing, self.vocab_size, torch.float64)

    def log_posterior_and_evidence(
        self, x_t: torch.LongTensor, mask_token_id: int
    ) -> "tuple[torch.DoubleTensor, torch.DoubleTensor]":
        """``(log_posterior(x_t, mask_token_id, smoothing=0), log q(visible tokens of x_t))``: the exact posterior at
        every position, ``(B, L, vocab_size)``, and the log marginal probability of each row's visible tokens,
        ``(B,)`` (-inf where they are impossible; those rows' posteriors are NaN), from one pass."""
        observed = self._check_partly_masked(x_t, mask_token_id)
        out, log_evidence = self._log_posterior_and_evidence(x_t, observed, None, self.vocab_size, torch.float64)
        out[torch.isneginf(log_evidence)] = float("nan")
        return out, log_evidence

    def posterior(
        self,
        x_t: torch.LongTensor,
        mask_token_id: int,
        positions: Optional[torch.LongTensor] = None,
        *,
        smoothing: float = DEFAULT_SMOOTHING,
    ) -> torch.DoubleTensor:
        """``exp(log_posterior(...))``: probabilities ``q_{0|t}(x^i = v | x_t)``, shape ``(B, K, vocab_size)``."""
        return self.log_posterior(x_t, mask_token_id, positions, smoothing=smoothing).exp()

    def smoothed(self, epsilon: float) -> "SyntheticLanguage":
        """The language ``q_eps`` with every stochastic row mixed with ``epsilon`` of the uniform distribution."""
        if epsilon not in self._smoothed_cache:
            tensors = {name: smooth_rows(t, epsilon) for name, t in self.tensors().items()}
            self._smoothed_cache[epsilon] = self._with_tensors(tensors)
        return self._smoothed_cache[epsilon]

    @abstractmethod
    def _with_tensors(self, tensors: Dict[str, torch.Tensor]) -> "SyntheticLanguage":
        """A language of the same kind with other matrices (hyper-parameters are not carried over)."""

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
        """``log_posterior`` with a chosen number of output columns and dtype, log probabilities below ``floor``
        raised to it (the oracle's entry point)."""
        observed = self._check_partly_masked(x_t, mask_token_id)
        positions = check_positions(positions, x_t.shape, x_t.device)
        out, log_evidence = self._log_posterior_and_evidence(x_t, observed, positions, num_columns, dtype)
        impossible = torch.isneginf(log_evidence)
        if impossible.any():
            rows = impossible.nonzero().squeeze(1)
            if smoothing > 0:
                row_positions = positions if positions is None or positions.dim() == 1 else positions[rows]
                fallback, _ = self.smoothed(smoothing)._log_posterior_and_evidence(
                    x_t[rows], observed[rows], row_positions, num_columns, dtype
                )
            else:
                fallback = torch.full_like(out[rows], float("nan"))
            out[rows] = fallback
        return out if floor is None else out.clamp_(min=floor)

    # ----------------------------------------------------------------------------------------------------------
    # Validation.

    def _check_tokens(self, x: torch.Tensor) -> torch.LongTensor:
        if x.dim() != 2:
            raise ValueError(f"Expected token ids of shape (batch, length), got shape {tuple(x.shape)}.")
        if x.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ValueError(f"Expected an integer tensor of token ids, got dtype {x.dtype}.")
        x = x.long()
        if x.numel() and (x.min() < 0 or x.max() >= self.vocab_size):
            raise ValueError(
                f"Token ids must be in [0, {self.vocab_size}) for this language; got ids in "
                f"[{int(x.min())}, {int(x.max())}]. Strip special tokens (pad, eos, mask) first."
            )
        return x

    def _check_partly_masked(self, x_t: torch.Tensor, mask_token_id: int) -> torch.BoolTensor:
        if x_t.dim() != 2:
            raise ValueError(f"Expected x_t of shape (batch, length), got shape {tuple(x_t.shape)}.")
        if mask_token_id < self.vocab_size:
            raise ValueError(
                f"mask_token_id={mask_token_id} is a token of the language (vocab_size={self.vocab_size}); use an id "
                f">= {self.vocab_size}, e.g. {self.vocab_size}."
            )
        observed = x_t != mask_token_id
        if x_t.numel():
            low, high = (int(v) for v in torch.aminmax(x_t))
            invalid = low < 0 or high > mask_token_id
            if not invalid and high >= self.vocab_size and mask_token_id > self.vocab_size:
                invalid = int(torch.where(observed, x_t, 0).max()) >= self.vocab_size
            if invalid:
                raise ValueError(
                    f"x_t may hold only token ids in [0, {self.vocab_size}) and the mask id {mask_token_id}; got "
                    f"ids in [{low}, {high}]."
                )
        return observed

    # ----------------------------------------------------------------------------------------------------------
    # Serialisation.

    def to_config(self) -> Dict[str, Any]:
        """A JSON-serialisable description: ``language_class``, ``format_version`` and ``hyperparameters()``."""
        return {"language_class": self.language_class, "format_version": FORMAT_VERSION, **self.hyperparameters()}

    def save_pretrained(self, save_directory: Union[str, os.PathLike]) -> None:
        """Writes ``language_config.json`` (``to_config()``) and ``language.safetensors`` (``tensors()``)."""
        os.makedirs(save_directory, exist_ok=True)
        with open(os.path.join(save_directory, LANGUAGE_CONFIG_NAME), "w") as f:
            json.dump(self.to_config(), f, indent=2, sort_keys=True)
        tensors = {name: t.contiguous() for name, t in self.tensors().items()}
        save_file(tensors, os.path.join(save_directory, LANGUAGE_WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, directory: Union[str, os.PathLike]) -> "SyntheticLanguage":
        """Loads a language written by ``save_pretrained``; the matrices are read back bit for bit."""
        config = read_language_config(directory)
        saved_class = _LANGUAGE_CLASSES.get(config["language_class"])
        if saved_class is None or not issubclass(saved_class, cls):
            raise ValueError(
                f"{directory} holds a {config['language_class']}, not a {cls.__name__}; use "
                "hf_mdm.languages.load_language to load any language."
            )
        tensors = load_file(os.path.join(directory, LANGUAGE_WEIGHTS_NAME))
        return saved_class._from_tensors(_hyperparameters_of(config), tensors)

    @classmethod
    @abstractmethod
    def from_config(cls, config: Dict[str, Any]) -> "SyntheticLanguage":
        """Re-creates a language from ``to_config()`` alone (random languages are regenerated from their seed)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hyperparameters().items())
        return f"{self.language_class}({args})"


def read_language_config(directory: Union[str, os.PathLike]) -> Dict[str, Any]:
    path = os.path.join(directory, LANGUAGE_CONFIG_NAME)
    if not os.path.isfile(path):
        raise ValueError(f"No {LANGUAGE_CONFIG_NAME} in {directory}: not a directory written by save_pretrained.")
    with open(path) as f:
        config = json.load(f)
    if config.get("language_class") not in _LANGUAGE_CLASSES:
        raise ValueError(
            f"Unknown language_class {config.get('language_class')!r} in {path}; known: {sorted(_LANGUAGE_CLASSES)}."
        )
    return config


def _hyperparameters_of(config: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in config.items() if k not in ("language_class", "format_version")}


def load_language(source: Union[str, os.PathLike, Dict[str, Any]]) -> SyntheticLanguage:
    """Loads any language: from a directory written by ``save_pretrained`` (dispatching on the saved class name),
    or from a ``to_config()`` dictionary (random languages are then regenerated from their seed)."""
    if isinstance(source, dict):
        if source.get("language_class") not in _LANGUAGE_CLASSES:
            raise ValueError(
                f"Unknown language_class {source.get('language_class')!r}; known: {sorted(_LANGUAGE_CLASSES)}."
            )
        return _LANGUAGE_CLASSES[source["language_class"]].from_config(source)
    config = read_language_config(source)
    return _LANGUAGE_CLASSES[config["language_class"]].from_pretrained(source)


def check_positions(
    positions: Optional[torch.Tensor], shape: torch.Size, device: torch.device
) -> Optional[torch.LongTensor]:
    """Validates 1-D or ``(B, K)`` positions for ``x_t`` of ``shape`` ``(B, L)``; negative ones count from the end."""
    if positions is None:
        return None
    batch, length = shape
    positions = torch.as_tensor(positions, device=device).long()
    if positions.dim() not in (1, 2) or (positions.dim() == 2 and positions.shape[0] != batch):
        raise ValueError(
            f"positions must be a 1-D tensor of indices or one of shape ({batch}, K), got shape "
            f"{tuple(positions.shape)}."
        )
    if positions.numel() and (positions.min() < -length or positions.max() >= length):
        raise ValueError(f"positions must be in [-{length}, {length}) for sequences of length {length}.")
    return positions % length if length else positions
