"""Argument validation: the one place that checks configuration values.

Every check raises ``TypeError`` (wrong type) or ``ValueError`` (wrong value) with a message that names the
argument, the value and what is allowed, and returns the value normalised (``np.bool_`` -> ``bool``,
``np.int64`` -> ``int``...). Never ``assert``: it vanishes under ``python -O``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "INF", "FLOAT32_TINY", "check_bool", "check_int", "check_float", "check_choice", "check_eps",
    "check_averaging_constant", "check_channel_count", "UnsupportedConfigError",
]

INF = float("inf")


class UnsupportedConfigError(ValueError, NotImplementedError):
    """A configuration an observer class does not support (a per-channel qscheme for a per-tensor class,
    dynamic quantization...): a ``ValueError`` naming the argument that is also the ``NotImplementedError``
    torch.ao raises for it, so ``except NotImplementedError`` written for torch.ao still catches it."""
#: float32's smallest normal number: below it XLA flushes to zero, so an ``eps`` there is refused.
FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def check_bool(value: Any, name: str) -> bool:
    """``value`` as a ``bool``; ``TypeError`` for anything but ``bool``/``np.bool_`` (``0``/``1`` too)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_int(value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (either bound may be ``None``); bools are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        if maximum is None:
            allowed = f"{name} >= {minimum}"
        elif minimum is None:
            allowed = f"{name} <= {maximum}"
        else:
            allowed = f"{minimum} <= {name} <= {maximum}"
        raise ValueError(f"{name}={value} is out of range; allowed: {allowed}")
    return value


def check_float(
    value: Any,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    allow_none: bool = False,
) -> float | None:
    """``value`` as a finite ``float`` in ``[minimum, maximum]``; ``None`` passes when ``allow_none``."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} {value!r}")
    value = float(value)
    low = -INF if minimum is None else minimum
    high = INF if maximum is None else maximum
    if not (math.isfinite(value) and low <= value <= high):
        if minimum is not None and maximum is not None:
            allowed = f"{minimum} <= {name} <= {maximum}"
        elif minimum is not None:
            allowed = f"{name} >= {minimum}"
        elif maximum is not None:
            allowed = f"{name} <= {maximum}"
        else:
            allowed = "any finite value"
        problem = "is out of range" if math.isfinite(value) else "must be finite"
        raise ValueError(f"{name}={value!r} {problem}; allowed: {allowed}")
    return value


def check_choice(value: Any, name: str, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices``; ``ValueError`` listing them otherwise."""
    choices = tuple(choices)
    try:
        ok = value in choices
    except TypeError:  # unhashable / incomparable
        ok = False
    if not ok:
        raise ValueError(f"{name}={value!r} is not allowed; allowed: {', '.join(repr(c) for c in choices)}")
    return value


def check_eps(value: Any, name: str = "eps") -> float:
    """``eps`` as a float: positive, finite and a float32 normal number (``>= 1.1754944e-38``).

    The scale is float32 and is clamped to ``eps``; a subnormal ``eps`` would be flushed to zero by XLA
    (JAX, GPUs), giving scale 0 there and ``eps`` elsewhere, so it is refused on every backend.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} {value!r}")
    value = float(value)
    as_float32 = float(np.float32(value)) if math.isfinite(value) else value
    if not (math.isfinite(as_float32) and as_float32 >= FLOAT32_TINY):
        raise ValueError(
            f"{name}={value!r} must be a positive finite float32 normal number; allowed: "
            f"{FLOAT32_TINY!r} <= {name} <= {float(np.finfo(np.float32).max)!r}"
        )
    return value


def check_averaging_constant(value: Any, name: str = "averaging_constant") -> float:
    """``c`` of the moving average ``x_min <- x_min + c * (min(X) - x_min)``: a float in ``[0, 1]``.

    ``0`` is accepted as torch 2.13 accepts it (the first batch sets the range, later ones change
    nothing); values outside ``[0, 1]`` (torch takes them and extrapolates) are refused."""
    return check_float(value, name, minimum=0.0, maximum=1.0)


def check_channel_count(channels: int, held: tuple[int, ...], ch_axis: int) -> None:
    """``ValueError`` unless a per-channel state of shape ``held`` (``(C,)``) takes a batch with ``channels``
    channels along ``ch_axis``: the one message every observer gives for another channel count."""
    if tuple(held) != (channels,):
        count = held[0] if len(held) == 1 else tuple(held)
        raise ValueError(
            f"x has {channels} channels along ch_axis={ch_axis} but the observer holds {count}; "
            "call reset_min_max_vals() to observe a different channel count"
        )
