"""CuPy calibration observers (Horizon ``observer_v2``: KL, MSE, percentile, mix), state on the GPU.

Everything but CuPy specifics lives in :mod:`observers_core.adapters._array_calibration` (formulas and
deliberate differences from Horizon in its docstring). Here: inputs must be ``cupy.ndarray``; the
statistics (and KLObserver's histogram) live on the first input's device (or on
``factory_kwargs={"device": d}``) and an input on another device raises ``ValueError``; every
computation runs with that device current. KLObserver's batch count is a Python int, so no step
synchronises with the host.

Example::

    import cupy as cp
    from observers_core.adapters.cupy import MixObserver

    obs = MixObserver(ch_axis=0, qscheme="per_channel_symmetric")
    obs(cp.asarray(weight))
    scale, zero_point = obs.calculate_qparams()   # cupy arrays on the same GPU
"""

from __future__ import annotations

from typing import Any

from . import _array_calibration as _base
from ._cupy_minmax import CupyMinMaxMixin

__all__ = list(_base.__all__)

Array = Any


class _CupyCalibrationMixin(CupyMinMaxMixin):
    def _compute_batch(self, state, x: Array, axis: int | None, collective: Any = None):
        with state.min_val.device:
            return super()._compute_batch(state, x, axis, collective)

    def _new_accumulator(self, x: Array, num_channels: int | None):
        with self._device if self._device is not None else x.device:
            return super()._new_accumulator(x, num_channels)

    def _compute_accumulate(self, acc, x: Array, axis: int | None, collective: Any = None):
        with acc.seen.min_val.device:
            return super()._compute_accumulate(acc, x, axis, collective)

    def _compute_kl(self, state, acc):
        with state.min_val.device:
            return super()._compute_kl(state, acc)


class PercentileObserver(_CupyCalibrationMixin, _base.PercentileObserver):
    __doc__ = _base.PercentileObserver.__doc__


class MSEObserver(_CupyCalibrationMixin, _base.MSEObserver):
    __doc__ = _base.MSEObserver.__doc__


class MixObserver(_CupyCalibrationMixin, _base.MixObserver):
    __doc__ = _base.MixObserver.__doc__


class KLObserver(_CupyCalibrationMixin, _base.KLObserver):
    __doc__ = _base.KLObserver.__doc__
