"""The min/max family (torch.ao's MinMax, MovingAverageMinMax and their per-channel forms; Horizon's
moving-average MinMaxObserver).

Thin over :mod:`observers_core._minmax`. The state is a :class:`~observers_core.MinMaxState` of float32
``min_val``/``max_val`` (0-d per tensor, ``(C,)`` per channel):

- running range (``averaging_constant=None``): ``x_min = min(x_min, min(X))``, ``x_max = max(x_max, max(X))``;
- moving average (``averaging_constant=c``): ``x_min = x_min + c * (min(X) - x_min)``, the first batch sets it.

``merge``: the running range merges exactly (``minmax_merge``: associative, commutative, the fresh state
is its identity); the moving average merges data-parallel replicas that averaged the same number of
steps by their mean (``moving_average_merge``), which is not the average of a single pass over both
shards (no order of the batches gives it): sync each step with a collective for that.
``qparams``: :func:`~observers_core.calculate_qparams` of the range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._dtypes import QScheme, QuantSpec, check_granularity
from .._minmax import (
    MinMaxState,
    minmax_init,
    minmax_merge,
    minmax_qparams,
    minmax_update,
    moving_average_merge,
    moving_average_update,
)
from .._qparams import QParams
from .._validate import UnsupportedConfigError, check_averaging_constant, check_bool, check_int

__all__ = ["STATE_KEYS", "Config", "State", "check_observer_args", "check_reduce_range", "init", "merge", "qparams",
           "step", "update"]

State = MinMaxState
#: torch's state_dict keys of the state.
STATE_KEYS = ("min_val", "max_val")


@dataclass(frozen=True)
class Config:
    """``spec`` (dtype, qscheme, range, eps), ``averaging_constant`` (``None``: running range; else in
    ``[0, 1]``), ``ch_axis`` (``None`` per tensor; the channel axis for per-channel qschemes),
    ``ignore_nonfinite`` (skip NaN/inf instead of propagating NaN)."""

    spec: QuantSpec = QuantSpec()
    averaging_constant: float | None = None
    ch_axis: int | None = None
    ignore_nonfinite: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.spec, QuantSpec):
            raise TypeError(f"spec must be a QuantSpec (see observers_core.quant_spec), got {type(self.spec).__name__}")
        if self.averaging_constant is not None:
            object.__setattr__(self, "averaging_constant", check_averaging_constant(self.averaging_constant))
        if self.ch_axis is not None:
            object.__setattr__(self, "ch_axis", check_int(self.ch_axis, "ch_axis"))
        if (self.ch_axis is not None) != self.spec.qscheme.is_per_channel:
            raise ValueError(
                f"ch_axis={self.ch_axis!r} does not fit qscheme={self.spec.qscheme.value!r}: per-channel "
                "qschemes need a channel axis, per-tensor ones ch_axis=None"
            )
        object.__setattr__(self, "ignore_nonfinite", check_bool(self.ignore_nonfinite, "ignore_nonfinite"))


def check_observer_args(owner: str, qscheme: QScheme, *, per_channel: bool, is_dynamic: Any, averaging: bool,
                        averaging_constant: Any = None, ch_axis: Any = None) -> float | None:
    """torch.ao's min/max observer classes' rules that :func:`~observers_core.quant_spec` does not hold, in
    torch's order (every framework's classes check these): ``is_dynamic`` a bool; the qscheme's granularity
    is the class's; a per-channel observer is not dynamic; a moving average's ``averaging_constant`` is in
    ``[0, 1]``, and 1 when dynamic; ``ch_axis`` is an int. Returns the averaging constant (``None`` for a
    running range). ``UnsupportedConfigError`` (torch raises ``NotImplementedError`` there), ``TypeError``,
    ``ValueError``."""
    is_dynamic = check_bool(is_dynamic, "is_dynamic")
    check_granularity(qscheme, owner, per_channel=per_channel)
    if is_dynamic and per_channel:
        raise UnsupportedConfigError(f"is_dynamic=True is not supported by {owner}")
    constant = check_averaging_constant(averaging_constant) if averaging else None
    if averaging and is_dynamic and constant != 1:
        raise UnsupportedConfigError(f"is_dynamic=True needs averaging_constant=1 in {owner}, got {averaging_constant!r}")
    if per_channel:
        check_int(ch_axis, "ch_axis")
    return constant


def check_reduce_range(spec: QuantSpec, reduce_range: bool, owner: str) -> None:
    """torch.ao's min/max observers refuse ``reduce_range=True`` for symmetric ``quint8`` (its histogram
    observer takes it): ``UnsupportedConfigError``."""
    if spec.qscheme.is_symmetric and reduce_range and spec.dtype == "quint8":
        raise UnsupportedConfigError(
            f"reduce_range=True is not supported by {owner} for symmetric quantization with dtype='quint8'")


def init(config: Config, /, *, num_channels: int | None = None, device: Any = None, xp: Any = None) -> State:
    """``+inf``/``-inf`` (nothing seen): 0-d per tensor, ``(num_channels,)`` per channel."""
    if (num_channels is None) != (config.ch_axis is None):
        raise ValueError(f"num_channels={num_channels!r} does not fit ch_axis={config.ch_axis!r} (both or neither)")
    if xp is None:
        import array_api_compat.numpy as xp
    return minmax_init(num_channels=num_channels, device=device, xp=xp)


def step(state: State, x: Any, /, *, axis: int | None, averaging_constant: float | None, ignore_nonfinite: bool,
         collective: Any = None, xp: Any = None) -> State:
    """One update with the configuration given field by field (what :func:`update` runs; adapters that
    keep the configuration as attributes call it directly): the running range when
    ``averaging_constant`` is ``None``, else the moving average."""
    if averaging_constant is None:
        return minmax_update(state, x, axis=axis, ignore_nonfinite=ignore_nonfinite, xp=xp, collective=collective)
    return moving_average_update(state, x, averaging_constant=averaging_constant, axis=axis,
                                 ignore_nonfinite=ignore_nonfinite, xp=xp, collective=collective)  # fmt: skip


def update(config: Config, state: State, x: Any, /, *, collective: Any = None) -> State:
    """The running range or the moving average after also seeing ``x`` (with a collective, every
    member's ``x``). Empty ``x``: no-op."""
    return step(state, x, axis=config.ch_axis, averaging_constant=config.averaging_constant,
                ignore_nonfinite=config.ignore_nonfinite, collective=collective)  # fmt: skip


def merge(config: Config, a: State, b: State, /) -> State:
    """Running range: ``minmax_merge`` (exact); moving average: ``moving_average_merge`` (mean of replicas)."""
    if config.averaging_constant is None:
        return minmax_merge(a, b)
    return moving_average_merge(a, b)


def qparams(config: Config, state: State, /) -> QParams:
    """``calculate_qparams(min_val, max_val, spec)``."""
    return minmax_qparams(state, config.spec)
