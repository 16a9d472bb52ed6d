"""JAX ``HistogramObserver``: the running histogram and torch's L2 search over ``jax.numpy``, under ``jax.jit``.

Everything but JAX specifics lives in :mod:`observers_core.adapters._array_histogram`. Here the update is
jitted with ``upsample_rate`` and ``ignore_nonfinite`` static (traced once per input shape and dtype and
number of bins; the first batch goes through the same compiled update, the empty state being its
identity) and ``calculate_qparams`` with the hashable :class:`~observers_core.QuantSpec` static (traced once
per spec and number of bins; the search evaluates blocks of 16 candidate ranges in a ``lax.while_loop``
up to the first rise of the error, no host sync). The
compiled functions are shared by all observers with the same configuration. ``obs.update(state, x)`` /
``obs.qparams(state)`` are the pure functions for a user's ``jit`` or ``lax.scan``.

On CPU, XLA flushes subnormal float32 values to zero (jax-ml/jax#16200): inputs below ``1.18e-38`` in
magnitude are binned as zeros.

Example::

        from observers_core.adapters.jax import HistogramObserver

    obs = HistogramObserver(bins=2048, dtype="quint8", reduce_range=True)
    for batch in batches:
        obs(batch)                           # jitted, asynchronous
    scale, zero_point = obs.calculate_qparams()
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from observers_core.families import histogram as family

from . import _array_histogram as _base
from ._jax_minmax import JaxMinMaxMixin

__all__ = list(_base.__all__)


def _update_body(config, state, x, collective=None):
    """The traced update."""
    return family.update(config, state, x, collective=collective)


@functools.partial(jax.jit, static_argnames=("config", "collective"))
def _jit_update(state, x, *, config, collective=None):
    return _update_body(config, state, x, collective)


def _qparams_body(config, state):
    """The traced qparams."""
    return family.qparams(config, state)


@functools.partial(jax.jit, static_argnames=("config",))
def _jit_qparams(state, *, config):
    return _qparams_body(config, state)


class HistogramObserver(JaxMinMaxMixin, _base.HistogramObserver):
    __doc__ = _base.HistogramObserver.__doc__

    def _compute_update(self, state, x: Any, axis: int | None, collective: Any = None):
        return _jit_update(state, x, config=self.update_config, collective=collective)

    def _compute_qparams(self, state):
        return _jit_qparams(state, config=self.config)
