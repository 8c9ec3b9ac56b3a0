"""What the sampler's validators accept as a number: one definition for the config, the reference presets and the
remasking samplers. Exported with the model as remote code."""

from __future__ import annotations

import math
import numbers
from typing import Any


def is_integer(value: Any) -> bool:
    """An integer (Python's or numpy's), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite real number (not a bool, a string, NaN or infinity)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
