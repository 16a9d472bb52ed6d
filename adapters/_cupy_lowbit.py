"""CuPy low-bit observers: per-group integers, fp8, MX and BFP16 over CuPy arrays, state on the GPU.

Everything but CuPy specifics lives in :mod:`observers_core.adapters._array_lowbit`. Here: inputs must
be ``cupy.ndarray``; the statistics live on the first input's device and an input on another device
raises ``ValueError``; every computation runs with that device current (CuPy launches kernels on the
current device) and none synchronises with the host.

Example::

    import cupy as cp
    from observers_core.adapters.cupy import PerGroupMinMaxObserver

    obs = PerGroupMinMaxObserver("int4", axis=-1, group_size=128)
    obs(cp.asarray(weight))
    scale, zero_point = obs.calculate_qparams()      # cupy arrays, one entry per group
"""

from __future__ import annotations

from typing import Any

from . import _array_lowbit as _base
from ._cupy_minmax import CupyMixin

__all__ = list(_base.__all__)

Array = Any


class _CupyLowBitMixin(CupyMixin):
    def _compute_update(self, state, x: Array, collective: Any = None):
        with x.device:
            return super()._compute_update(state, x, collective)

    def _compute_qparams(self, state):
        with state.min_val.device:
            return super()._compute_qparams(state)

    def _compute_fake_quantize(self, x: Array, qparams):
        with x.device:
            return super()._compute_fake_quantize(x, qparams)


class LowBitObserver(_CupyLowBitMixin, _base.LowBitObserver):
    __doc__ = _base.LowBitObserver.__doc__


class PerGroupMinMaxObserver(_CupyLowBitMixin, _base.PerGroupMinMaxObserver):
    __doc__ = _base.PerGroupMinMaxObserver.__doc__


class FP8Observer(_CupyLowBitMixin, _base.FP8Observer):
    __doc__ = _base.FP8Observer.__doc__


class PerBlockMXObserver(_CupyLowBitMixin, _base.PerBlockMXObserver):
    __doc__ = _base.PerBlockMXObserver.__doc__


class PerBlockBFPObserver(_CupyLowBitMixin, _base.PerBlockBFPObserver):
    __doc__ = _base.PerBlockBFPObserver.__doc__
