"""CuPy ``HistogramObserver``: the running histogram and torch's L2 search over CuPy arrays, state on the GPU.

Everything but CuPy specifics lives in :mod:`observers_core.adapters._array_histogram`. Here: inputs must
be ``cupy.ndarray``; the state is created on the first input's device (or on ``factory_kwargs={"device":
d}``) and an input on another device raises ``ValueError``; every update and qparams computation runs
with the state's device current. The update never synchronises with the host; the search reads the
number of candidate ranges and stops evaluating them once the error rises (a few host reads).

Example::

    import cupy as cp
    from observers_core.adapters.cupy import HistogramObserver

    obs = HistogramObserver(bins=2048)
    for batch in batches:
        obs(cp.asarray(batch))
    scale, zero_point = obs.calculate_qparams()   # cupy arrays on the same GPU
"""

from __future__ import annotations

from . import _array_histogram as _base
from ._cupy_minmax import CupyMinMaxMixin

__all__ = list(_base.__all__)


class HistogramObserver(CupyMinMaxMixin, _base.HistogramObserver):
    __doc__ = _base.HistogramObserver.__doc__
