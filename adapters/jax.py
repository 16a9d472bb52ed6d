"""JAX observers: ``torch.ao.quantization.observer``'s classes over ``jax.numpy``, updated under ``jax.jit``.

Everything but JAX specifics lives in :mod:`observers_core.adapters._array_observers`. Here:

- ``__call__`` runs one jitted update (the configuration is static: axis, averaging constant,
  ``ignore_nonfinite``); it never syncs with the host and is traced once per input shape/dtype and
  configuration (the compiled function is shared by all observers with the same configuration);
- ``calculate_qparams`` is jitted with the hashable :class:`~observers_core.QuantSpec` as static argument;
- ``obs.update(state, x)`` / ``obs.qparams(state)`` are the same pure functions, to be used inside a
  user's ``jit`` or ``lax.scan`` (``obs.state`` is a pytree; ``obs.state = new_state`` stores one back);
- inputs may be ``jax.Array`` or numpy arrays (moved to the default device); calling the stateful
  ``obs(x)`` on a tracer raises ``TypeError`` (use ``obs.update``).

Zero points are int32 where torch has int64 (symmetric schemes, defaults): JAX without x64 has no int64.
On CPU, XLA flushes subnormal float32 values to zero (FTZ/DAZ, jax-ml/jax#16200), so a state built from
inputs below ``1.18e-38`` in magnitude holds (signed) zeros where torch keeps the subnormal value.

Example::

    import jax.numpy as jnp
    from observers_core.adapters.jax import MovingAveragePerChannelMinMaxObserver

    obs = MovingAveragePerChannelMinMaxObserver(averaging_constant=0.1, ch_axis=1, dtype="qint8",
                                                qscheme="per_channel_symmetric")
    for batch in batches:
        obs(batch)                           # jitted, asynchronous
    scale, zero_point = obs.calculate_qparams()
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from observers_core._minmax import MinMaxState, minmax_qparams
from observers_core._qparams import QParams

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


def _update_body(
    state: MinMaxState, x: Array, *, axis: int | None, averaging_constant: float | None, ignore_nonfinite: bool
) -> MinMaxState:
    """The traced update: the core's (which also restores the NaN propagation XLA:CPU's reductions lack)."""
    return _base._core_update(
        state, x, axis=axis, averaging_constant=averaging_constant, ignore_nonfinite=ignore_nonfinite, xp=jnp
    )


@functools.partial(jax.jit, static_argnames=("axis", "averaging_constant", "ignore_nonfinite"))
def _jit_update(state, x, *, axis, averaging_constant, ignore_nonfinite):
    return _update_body(state, x, axis=axis, averaging_constant=averaging_constant, ignore_nonfinite=ignore_nonfinite)


def _qparams_body(state: MinMaxState, spec) -> QParams:
    return minmax_qparams(state, spec, xp=jnp)


@functools.partial(jax.jit, static_argnames=("spec",))
def _jit_qparams(state, *, spec):
    return _qparams_body(state, spec)


class _JaxMixin:
    """The JAX-specific hooks of :class:`~observers_core.adapters._array_observers.ObserverBase`."""

    @classmethod
    def _namespace(cls, xp: Any) -> Any:
        if xp is not None:
            raise TypeError("the JAX observers always use jax.numpy; xp must not be given")
        return jnp

    def __call__(self, x: Array) -> Array:
        if isinstance(x, jax.core.Tracer):
            raise TypeError(
                f"{type(self).__name__}(x) stores state and cannot run inside jit/scan/vmap; "
                "use obs.update(state, x) there and assign obs.state afterwards"
            )
        return super().__call__(x)

    def _coerce_input(self, x: Array) -> Array:
        if isinstance(x, jax.Array):  # tracers included: obs.update runs inside jit
            return x
        if isinstance(x, np.ndarray):
            return jnp.asarray(x)
        raise TypeError(f"x must be a jax.Array or numpy.ndarray, got {type(x).__module__}.{type(x).__name__}")

    def _check_device(self, x: Array, state: MinMaxState) -> None:
        """Placement is jax.jit's business (committed arrays on different devices raise there)."""

    def _place(self, arr: np.ndarray, dtype: Any, like: Array | None = None) -> Array:
        out = jnp.asarray(arr, dtype=dtype)
        if like is not None and isinstance(like, jax.Array):
            return jax.device_put(out, like.sharding)
        return out if self._device is None else jax.device_put(out, self._device)


class _JaxMinMaxMixin(_JaxMixin):
    def _compute_update(self, state: MinMaxState, x: Array, axis: int | None) -> MinMaxState:
        return _jit_update(
            state, x, axis=axis, averaging_constant=self._averaging_constant, ignore_nonfinite=self.ignore_nonfinite
        )

    def _compute_qparams(self, state: MinMaxState) -> QParams:
        return _jit_qparams(state, spec=self._spec)

    def init_state(self, num_channels: int | None = None) -> MinMaxState:
        state = super().init_state(num_channels)
        return state if self._device is None else jax.device_put(state, self._device)

    def _new_state(self, x: Array, num_channels: int | None) -> MinMaxState:
        return self.init_state(num_channels)  # uncommitted unless a device was given: jit places it


class MinMaxObserver(_JaxMinMaxMixin, _base.MinMaxObserver):
    __doc__ = _base.MinMaxObserver.__doc__


class MovingAverageMinMaxObserver(_JaxMinMaxMixin, _base.MovingAverageMinMaxObserver):
    __doc__ = _base.MovingAverageMinMaxObserver.__doc__


class PerChannelMinMaxObserver(_JaxMinMaxMixin, _base.PerChannelMinMaxObserver):
    __doc__ = _base.PerChannelMinMaxObserver.__doc__


class MovingAveragePerChannelMinMaxObserver(_JaxMinMaxMixin, _base.MovingAveragePerChannelMinMaxObserver):
    __doc__ = _base.MovingAveragePerChannelMinMaxObserver.__doc__


class FixedQParamsObserver(_JaxMixin, _base.FixedQParamsObserver):
    __doc__ = _base.FixedQParamsObserver.__doc__


class PlaceholderObserver(_JaxMixin, _base.PlaceholderObserver):
    __doc__ = _base.PlaceholderObserver.__doc__


class NoopObserver(_JaxMixin, _base.NoopObserver):
    __doc__ = _base.NoopObserver.__doc__


# The other observer families live in their own modules and build on the classes above; they import
# from this module, so they are imported last (import them through this module, never directly).
from . import _jax_calibration, _jax_histogram, _jax_lowbit  # noqa: E402
from ._jax_calibration import *  # noqa: E402,F401,F403
from ._jax_histogram import *  # noqa: E402,F401,F403
from ._jax_lowbit import *  # noqa: E402,F401,F403

__all__ += _jax_histogram.__all__ + _jax_calibration.__all__ + _jax_lowbit.__all__
