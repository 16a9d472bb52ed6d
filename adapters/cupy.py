"""CuPy observers: ``torch.ao.quantization.observer``'s classes over CuPy arrays, state kept on the GPU.

Everything but CuPy specifics lives in :mod:`observers_core.adapters._array_observers`. Here: inputs
must be ``cupy.ndarray`` (a numpy input raises ``TypeError`` rather than being copied to the GPU
silently); the state is created on the first input's device (or on ``factory_kwargs={"device": d}``,
``d`` a device id or ``cupy.cuda.Device``), and an input on another device raises ``ValueError``.
Every update and qparams computation runs with the state's device current (CuPy launches kernels on
the current device); none synchronises with the host.

Example::

    import cupy as cp
    from observers_core.adapters.cupy import PerChannelMinMaxObserver

    obs = PerChannelMinMaxObserver(ch_axis=0, dtype="qint8", qscheme="per_channel_symmetric")
    obs(cp.asarray(weight))
    scale, zero_point = obs.calculate_qparams()   # cupy arrays on the same GPU
"""

from __future__ import annotations

from . import adopt_public_names

from . import _cupy_calibration, _cupy_histogram, _cupy_lowbit, _cupy_minmax
from ._cupy_minmax import *  # noqa: F401,F403
from ._cupy_histogram import *  # noqa: F401,F403
from ._cupy_calibration import *  # noqa: F401,F403
from ._cupy_lowbit import *  # noqa: F401,F403

__all__ = (
    _cupy_minmax.__all__ + _cupy_histogram.__all__ + _cupy_calibration.__all__ + _cupy_lowbit.__all__
)
adopt_public_names(globals())
