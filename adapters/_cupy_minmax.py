"""The min/max family of the cupy adapter, and the cupy-specific pieces the other families build on
(imported by :mod:`observers_core.adapters.cupy`, which is the public module)."""

from __future__ import annotations

from typing import Any

import array_api_compat.cupy as cpx
import cupy

from . import _array_observers as _base

__all__ = [
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "PerChannelMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "FixedQParamsObserver",
    "PlaceholderObserver",
    "NoopObserver",
]

Array = Any


class CupyMixin:
    """The CuPy-specific hooks of :class:`~observers_core.adapters._array_observers.ObserverBase`."""

    def _set_device(self) -> None:
        if self._device is not None and not isinstance(self._device, cupy.cuda.Device):
            self._device = cupy.cuda.Device(self._device)

    def _current(self) -> cupy.cuda.Device:
        """The observer's device if one was given, else the current one (as a context manager)."""
        return self._device if self._device is not None else cupy.cuda.Device()

    @classmethod
    def _namespace(cls, xp: Any) -> Any:
        if xp is not None:
            raise TypeError("the CuPy observers always use cupy; xp must not be given")
        return cpx

    def _coerce_input(self, x: Array) -> Array:
        if not isinstance(x, cupy.ndarray):
            raise TypeError(
                f"x must be a cupy.ndarray (use cupy.asarray to move data to the GPU), "
                f"got {type(x).__module__}.{type(x).__name__}"
            )
        return x


class CupyMinMaxMixin(CupyMixin):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._set_device()

    def init_state(self, num_channels: int | None = None):
        with self._current():  # array_api_compat's cupy.full ignores device=
            return super().init_state(num_channels)

    def _new_state(self, x: Array, num_channels: int | None):
        with self._device if self._device is not None else x.device:
            return super()._new_state(x, num_channels)

    def _compute_update(self, state, x: Array, axis: int | None, collective: Any = None):
        with state.min_val.device:
            return super()._compute_update(state, x, axis, collective)

    def _compute_qparams(self, state):
        with state.min_val.device:
            return super()._compute_qparams(state)


class MinMaxObserver(CupyMinMaxMixin, _base.MinMaxObserver):
    __doc__ = _base.MinMaxObserver.__doc__


class MovingAverageMinMaxObserver(CupyMinMaxMixin, _base.MovingAverageMinMaxObserver):
    __doc__ = _base.MovingAverageMinMaxObserver.__doc__


class PerChannelMinMaxObserver(CupyMinMaxMixin, _base.PerChannelMinMaxObserver):
    __doc__ = _base.PerChannelMinMaxObserver.__doc__


class MovingAveragePerChannelMinMaxObserver(CupyMinMaxMixin, _base.MovingAveragePerChannelMinMaxObserver):
    __doc__ = _base.MovingAveragePerChannelMinMaxObserver.__doc__


class FixedQParamsObserver(CupyMixin, _base.FixedQParamsObserver):
    __doc__ = _base.FixedQParamsObserver.__doc__


class PlaceholderObserver(CupyMixin, _base.PlaceholderObserver):
    __doc__ = _base.PlaceholderObserver.__doc__


class NoopObserver(CupyMixin, _base.NoopObserver):
    __doc__ = _base.NoopObserver.__doc__
