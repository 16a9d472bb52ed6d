"""CuPy observers: torch.ao's, Horizon's and the low-bit observer classes over CuPy arrays, state on the GPU.

The classes are the generic ones (``adapters/_array_*.py``), each a one-line subclass on :class:`CupyBackend`; this file is all that
is CuPy's: inputs must be ``cupy.ndarray`` (a numpy input raises ``TypeError`` rather than being copied
to the GPU silently); the state (and KLObserver's histogram) is created on the first input's device (or
on ``factory_kwargs={"device": d}``, ``d`` a device id or ``cupy.cuda.Device``), and an input on another
device raises ``ValueError``. Every core step runs with its arrays' device current (CuPy launches kernels
on the current device). The updates are written not to synchronise with the host (no ``bincount``
sized on the host, constant tables copied once per device); that is checked for torch on CUDA
(tests/test_gpu_sync.py), not for CuPy, which has no such debug mode. The histogram search reads the
number of candidate ranges and stops once the error rises: a few host reads.

Example::

    import cupy as cp
    from observers_core.adapters.cupy import PerChannelMinMaxObserver

    obs = PerChannelMinMaxObserver(ch_axis=0, dtype="qint8", qscheme="per_channel_symmetric")
    obs(cp.asarray(weight))
    scale, zero_point = obs.calculate_qparams()   # cupy arrays on the same GPU
"""

from __future__ import annotations

from typing import Any, Callable

import array_api_compat.cupy as cpx
import cupy

from ._backend import FrameworkBackend
from . import _array_calibration as calibration, _array_histogram as histogram, _array_lowbit as lowbit
from . import _array_observers as minmax

__all__ = [
    'MinMaxObserver', 'MovingAverageMinMaxObserver', 'PerChannelMinMaxObserver',
    'MovingAveragePerChannelMinMaxObserver', 'FixedQParamsObserver', 'PlaceholderObserver', 'NoopObserver',
    'HistogramObserver', 'KLObserver', 'MSEObserver', 'PercentileObserver', 'MixObserver', 'LowBitObserver',
    'PerGroupMinMaxObserver', 'FP8Observer', 'PerBlockMXObserver', 'PerBlockBFPObserver',
]

Array = Any


def _first_device(args: Any) -> cupy.cuda.Device | None:
    """The device of the first CuPy array in ``args`` (states are tuples); ``None`` if there is none."""
    for arg in args:
        if isinstance(arg, cupy.ndarray):
            return arg.device
        if isinstance(arg, tuple):
            for leaf in arg:
                found = _first_device((leaf,))
                if found is not None:
                    return found
    return None


class CupyBackend(FrameworkBackend):
    """CuPy through ``array_api_compat.cupy``; every step with its arrays' device current."""

    label, namespace_name = "CuPy", "cupy"

    def __init__(self) -> None:
        super().__init__(cpx)

    def normalize_device(self, device: Any) -> Any:
        return device if device is None or isinstance(device, cupy.cuda.Device) else cupy.cuda.Device(device)

    def coerce(self, x: Array) -> Array:
        if not isinstance(x, cupy.ndarray):
            raise TypeError(
                f"x must be a cupy.ndarray (use cupy.asarray to move data to the GPU), "
                f"got {type(x).__module__}.{type(x).__name__}"
            )
        return x

    def empty(self, make: Callable[[Any], Any], device: Any, x: Array | None = None) -> Any:
        target = device if device is not None or x is None else x.device
        with target if target is not None else cupy.cuda.Device():  # array_api_compat's cupy.full ignores device=
            return make(target)

    def run(self, fn: Callable[..., Any], /, *args: Any, **static: Any) -> Any:
        with _first_device(args) or cupy.cuda.Device():
            return fn(*args, **static)


BACKEND = CupyBackend()

# The public classes: the generic ones (signature, checks, steps) on this backend.
class MinMaxObserver(minmax.MinMaxObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class MovingAverageMinMaxObserver(minmax.MovingAverageMinMaxObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class PerChannelMinMaxObserver(minmax.PerChannelMinMaxObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class MovingAveragePerChannelMinMaxObserver(minmax.MovingAveragePerChannelMinMaxObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class FixedQParamsObserver(minmax.FixedQParamsObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class PlaceholderObserver(minmax.PlaceholderObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class NoopObserver(minmax.NoopObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class HistogramObserver(histogram.HistogramObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class KLObserver(calibration.KLObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class MSEObserver(calibration.MSEObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class PercentileObserver(calibration.PercentileObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class MixObserver(calibration.MixObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class LowBitObserver(lowbit.LowBitObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class PerGroupMinMaxObserver(lowbit.PerGroupMinMaxObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class FP8Observer(lowbit.FP8Observer): _BACKEND_TYPE = CupyBackend  # noqa: E701
class PerBlockMXObserver(lowbit.PerBlockMXObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
class PerBlockBFPObserver(lowbit.PerBlockBFPObserver): _BACKEND_TYPE = CupyBackend  # noqa: E701
