"""JAX calibration observers (Horizon ``observer_v2``: KL, MSE, percentile, mix) under ``jax.jit``.

Everything but JAX specifics lives in :mod:`observers_core.adapters._array_calibration` (formulas and
deliberate differences from Horizon in its docstring). Here the per-batch step (histogram, search,
moving average; MixObserver's error measurement), KLObserver's accumulation and its KL update are
jitted with the hashable :class:`~observers_core.adapters._array_calibration.CalibConfig` as a static
argument: each traces once per input shape and dtype (the first batch starts from an empty state, so
it shares the compiled step) and the compiled functions are shared by all observers with the same
configuration. ``obs(x)`` never syncs with the host: KLObserver's batch count is a Python int.
``obs.update(state, x)`` / ``obs.qparams(state)`` are the pure functions for a user's ``jit`` or
``lax.scan``; KLObserver's are ``obs.accumulate(acc, x)`` and ``obs.kl_step(state, acc)``.

Without x64 the searches run in float32 where numpy and torch use float64; near-ties between
candidates may then resolve differently.

Example::

    import jax.numpy as jnp
    from observers_core.adapters.jax import PercentileObserver

    obs = PercentileObserver(percentile=99.9, averaging_constant=0.1)
    for batch in batches:
        obs(batch)                           # jitted, asynchronous
    scale, zero_point = obs.calculate_qparams()
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from observers_core.families import calibration as family

from . import _array_calibration as _base
from ._jax_minmax import JaxMinMaxMixin, jax_collective

__all__ = list(_base.__all__)

Array = Any


def _batch_body(state, x, *, axis, config, collective=None):
    return family.batch_update(state, x, axis=axis, config=config, xp=jnp, collective=collective)


@functools.partial(jax.jit, static_argnames=("axis", "config", "collective"))
def _jit_batch(state, x, *, axis, config, collective=None):
    return _batch_body(state, x, axis=axis, config=config, collective=collective)


def _accumulate_body(acc, x, *, axis, collective=None):
    return family.kl_accumulate(acc, x, axis=axis, xp=jnp, collective=collective)


@functools.partial(jax.jit, static_argnames=("axis", "collective"))
def _jit_accumulate(acc, x, *, axis, collective=None):
    return _accumulate_body(acc, x, axis=axis, collective=collective)


def _kl_body(state, acc, *, config):
    return family.kl_update(state, acc, config=config, xp=jnp)


@functools.partial(jax.jit, static_argnames=("config",))
def _jit_kl(state, acc, *, config):
    return _kl_body(state, acc, config=config)


class _JaxCalibrationMixin(JaxMinMaxMixin):
    def _compute_batch(self, state, x: Array, axis: int | None, collective: Any = None):
        return _jit_batch(state, x, axis=axis, config=self._config, collective=collective)

    def _compute_update(self, state, x: Array, axis: int | None, collective: Any = None):
        return self._compute_batch(state, x, axis, collective)[0]

    def _new_accumulator(self, x: Array, num_channels: int | None):
        acc = family.kl_init(num_channels, bins=self._config.bins, device=None, xp=jnp)
        return acc if self._device is None else jax.device_put(acc, self._device)

    def _compute_accumulate(self, acc, x: Array, axis: int | None, collective: Any = None):
        return _jit_accumulate(acc, x, axis=axis, collective=collective)

    def _compute_kl(self, state, acc):
        return _jit_kl(state, acc, config=self._config)


class PercentileObserver(_JaxCalibrationMixin, _base.PercentileObserver):
    __doc__ = _base.PercentileObserver.__doc__


class MSEObserver(_JaxCalibrationMixin, _base.MSEObserver):
    __doc__ = _base.MSEObserver.__doc__


class MixObserver(_JaxCalibrationMixin, _base.MixObserver):
    __doc__ = _base.MixObserver.__doc__


class KLObserver(_JaxCalibrationMixin, _base.KLObserver):
    __doc__ = _base.KLObserver.__doc__

    def accumulate(self, acc: Any, x: Array, *, axis_name: Any = None, collective: Any = None) -> Any:
        """Pure accumulation (see the base class). Inside ``jax.shard_map``/``jax.pmap`` over ``axis_name``
        every device holds the accumulator of the whole batch."""
        return super().accumulate(acc, x, collective=jax_collective(axis_name, collective))
