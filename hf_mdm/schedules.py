"""Masking schedules alpha(t) of the forward process.

A token of x_0 survives to time t with probability ``alpha(t)`` and is replaced by [MASK] otherwise.
Every schedule here is decreasing with ``alpha(0) = 1`` (clean) and ``alpha(1) = 0`` (all masked), up to
the small offsets documented on the loglinear and geometric schedules.

Two quantities drive everything else:

- ``alpha(t)``: used by the sampler, which reveals a still-masked token between times t > s with
  probability ``(alpha(s) - alpha(t)) / (1 - alpha(t))``;
- ``weight(t) = -alpha'(t) / (1 - alpha(t))``: the ELBO weight of the cross-entropy at masked positions
  (``1 / t`` for the linear schedule).

Schedules are small, stateless objects in the spirit of diffusers schedulers. Any object with
``alpha(t)`` and ``weight(t)`` methods is accepted wherever a schedule is, and ``get_schedule(name, **kwargs)``
builds the named ones. This file imports nothing from the rest of the package so that models exported with
``save_pretrained`` carry it as remote code.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Union

import torch

TimeLike = Union[float, torch.Tensor]


def _as_tensor(t: TimeLike) -> torch.Tensor:
    if isinstance(t, torch.Tensor):
        return t if t.is_floating_point() else t.double()
    return torch.tensor(t, dtype=torch.float64)


def _like_input(value: torch.Tensor, t: TimeLike) -> TimeLike:
    return value if isinstance(t, torch.Tensor) else float(value)


class Schedule(ABC):
    """Base class: subclasses define ``_alpha`` and ``_weight`` on tensors."""

    name: str = "schedule"

    def alpha(self, t: TimeLike) -> TimeLike:
        """Probability that a token is still unmasked at time ``t`` (a float or a tensor of any shape)."""
        return _like_input(self._alpha(_as_tensor(t)), t)

    def weight(self, t: TimeLike) -> TimeLike:
        """ELBO weight ``-alpha'(t) / (1 - alpha(t))``."""
        return _like_input(self._weight(_as_tensor(t)), t)

    @abstractmethod
    def _alpha(self, t: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def _weight(self, t: torch.Tensor) -> torch.Tensor: ...

    def to_dict(self) -> dict[str, Any]:
        """``{"name": ..., **kwargs}`` such that ``get_schedule(**d)`` rebuilds this schedule."""
        return {"name": self.name, **self.kwargs()}

    def kwargs(self) -> dict[str, Any]:
        return {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs().items())
        return f"{type(self).__name__}({args})"


class LinearSchedule(Schedule):
    """``alpha(t) = 1 - t``; weight ``1 / t`` (LLaDA, MDLM's default)."""

    name = "linear"

    def _alpha(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 - t

    def _weight(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 / t


class CosineSchedule(Schedule):
    """``alpha(t) = cos(pi t / 2)`` (MaskGIT's cosine); reveals few tokens early and many late."""

    name = "cosine"

    def _alpha(self, t: torch.Tensor) -> torch.Tensor:
        # cos(pi/2) is 6e-17 in floating point; clamp so that alpha(1) is exactly 0.
        return torch.cos(0.5 * math.pi * t).clamp(min=0.0)

    def _weight(self, t: torch.Tensor) -> torch.Tensor:
        half = 0.5 * math.pi * t
        return 0.5 * math.pi * torch.sin(half) / (1.0 - torch.cos(half))


class PolynomialSchedule(Schedule):
    """``alpha(t) = 1 - t**power``; weight ``power / t``. ``power = 1`` is the linear schedule."""

    name = "polynomial"

    def __init__(self, power: float = 2.0):
        if not power > 0:
            raise ValueError(f"polynomial schedule needs power > 0, got {power}")
        self.power = float(power)

    def kwargs(self) -> dict[str, Any]:
        return {"power": self.power}

    def _alpha(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 - t**self.power

    def _weight(self, t: torch.Tensor) -> torch.Tensor:
        return self.power / t


class LogLinearSchedule(Schedule):
    """MDLM/SEDD's log-linear noise ``sigma(t) = -log(1 - (1 - eps) t)``, so ``alpha(t) = 1 - (1 - eps) t``.

    ``alpha(1) = eps`` rather than 0 (the sampler starts from an all-masked sequence regardless); weight
    ``(1 - eps) / ((1 - eps) t) = 1 / t``.
    """

    name = "loglinear"

    def __init__(self, eps: float = 1e-3):
        if not 0 <= eps < 1:
            raise ValueError(f"loglinear schedule needs 0 <= eps < 1, got {eps}")
        self.eps = float(eps)

    def kwargs(self) -> dict[str, Any]:
        return {"eps": self.eps}

    def _alpha(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 - (1.0 - self.eps) * t

    def _weight(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 / t


class GeometricSchedule(Schedule):
    """SEDD's geometric noise ``sigma(t) = sigma_min^(1-t) sigma_max^t`` with ``alpha(t) = exp(-sigma(t))``.

    ``alpha(0) = exp(-sigma_min)`` and ``alpha(1) = exp(-sigma_max)``, i.e. 1 and 0 up to 1e-4 and 2e-9 with
    the defaults. Weight ``sigma'(t) / (exp(sigma(t)) - 1)`` with ``sigma'(t) = sigma(t) log(sigma_max / sigma_min)``.
    """

    name = "geometric"

    def __init__(self, sigma_min: float = 1e-4, sigma_max: float = 20.0):
        if not 0 < sigma_min < sigma_max:
            raise ValueError(f"geometric schedule needs 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}")
        self.sigma_min = float(sigma_min)
        self.sigma_max = float(sigma_max)

    def kwargs(self) -> dict[str, Any]:
        return {"sigma_min": self.sigma_min, "sigma_max": self.sigma_max}

    def _sigma(self, t: torch.Tensor) -> torch.Tensor:
        return self.sigma_min ** (1.0 - t) * self.sigma_max**t

    def _alpha(self, t: torch.Tensor) -> torch.Tensor:
        return torch.exp(-self._sigma(t))

    def _weight(self, t: torch.Tensor) -> torch.Tensor:
        sigma = self._sigma(t)
        return sigma * math.log(self.sigma_max / self.sigma_min) / torch.expm1(sigma)


SCHEDULES: dict[str, type[Schedule]] = {
    cls.name: cls for cls in (LinearSchedule, CosineSchedule, PolynomialSchedule, LogLinearSchedule, GeometricSchedule)
}


def get_schedule(name: Any = "linear", **kwargs: Any) -> Any:
    """Build a schedule by name (``linear``, ``cosine``, ``polynomial``, ``loglinear``, ``geometric``).

    ``name`` may also be a schedule object (anything with ``alpha(t)`` and ``weight(t)``), which is returned
    as is, or a dict ``{"name": ..., **kwargs}`` as produced by ``Schedule.to_dict``.

    >>> get_schedule("polynomial", power=2).alpha(0.5)
    0.75
    """
    if isinstance(name, dict):
        spec = dict(name)
        if "name" not in spec:
            raise ValueError(f"a schedule given as a dict names it: {{'name': ..., **kwargs}}, got {name!r}")
        return get_schedule(spec.pop("name"), **{**spec, **kwargs})
    if hasattr(name, "alpha") and hasattr(name, "weight") and not isinstance(name, str):
        if kwargs:
            raise ValueError("schedule_kwargs can only be given with a schedule name, not with a schedule object")
        return name
    if not isinstance(name, str) or name not in SCHEDULES:
        raise ValueError(
            f"unknown schedule {name!r}: use one of {sorted(SCHEDULES)} or an object with alpha(t) and weight(t)"
        )
    try:
        return SCHEDULES[name](**kwargs)
    except TypeError as err:
        raise ValueError(f"bad schedule_kwargs {kwargs} for schedule {name!r}: {err}") from None
