"""The one validator for numbers given by users: Python, numpy or torch scalars in, Python numbers out, or one error."""

from __future__ import annotations

import math
import numbers
from typing import Any

from .errors import HyvInputError


def as_number(name: str, value: Any, kind: type = float, *, low: float | None = None, high: float | None = None,
              low_open: bool = False) -> int | float | None:
    """``value`` as a Python ``int`` (``kind=int``) or ``float``, or None for None; a HyvInputError naming ``name``
    otherwise. Taken: Python, numpy and 0-d torch/numpy array numbers (``np.int64(8)``, ``torch.tensor(0.5)``);
    refused: bools, strings, floats where an integer is needed (33.0 would flow into shapes), NaN and infinity.
    Range: ``value >= low`` (``> low`` with ``low_open``) and ``value < high``."""
    if value is None:
        return None
    if not isinstance(value, (numbers.Number, bool)) and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # a 0-d torch tensor or numpy array
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (integral if kind is int else real) or (real and not math.isfinite(float(value))):
        raise HyvInputError(name, f"must be {'an integer' if kind is int else 'a finite number'}, "
                                  f"got {type(value).__name__} {value!r}")
    value = int(value) if kind is int else float(value)
    below = low is not None and (value <= low if low_open else value < low)
    if below or (high is not None and value >= high):
        bounds = [f"{'>' if low_open else '>='} {low:g}" if low is not None else "", f"< {high:g}" if high is not None
                  else ""]
        raise HyvInputError(name, f"must be {' and '.join(b for b in bounds if b)}, got {value!r}")
    return value
