"""The min/max family of the jax adapter, and the jax-specific pieces the other families build on
(imported by :mod:`observers_core.adapters.jax`, which is the public module)."""

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
    return _base.core_update(
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


class JaxMixin:
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


class JaxMinMaxMixin(JaxMixin):
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


class MinMaxObserver(JaxMinMaxMixin, _base.MinMaxObserver):
    __doc__ = _base.MinMaxObserver.__doc__


class MovingAverageMinMaxObserver(JaxMinMaxMixin, _base.MovingAverageMinMaxObserver):
    __doc__ = _base.MovingAverageMinMaxObserver.__doc__


class PerChannelMinMaxObserver(JaxMinMaxMixin, _base.PerChannelMinMaxObserver):
    __doc__ = _base.PerChannelMinMaxObserver.__doc__


class MovingAveragePerChannelMinMaxObserver(JaxMinMaxMixin, _base.MovingAveragePerChannelMinMaxObserver):
    __doc__ = _base.MovingAveragePerChannelMinMaxObserver.__doc__


class FixedQParamsObserver(JaxMixin, _base.FixedQParamsObserver):
    __doc__ = _base.FixedQParamsObserver.__doc__


class PlaceholderObserver(JaxMixin, _base.PlaceholderObserver):
    __doc__ = _base.PlaceholderObserver.__doc__


class NoopObserver(JaxMixin, _base.NoopObserver):
    __doc__ = _base.NoopObserver.__doc__
