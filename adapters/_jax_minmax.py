"""The min/max family of the jax adapter, and the jax-specific pieces the other families build on
(imported by :mod:`observers_core.adapters.jax`, which is the public module)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from observers_core._collective import check_collective
from observers_core._minmax import MinMaxState, minmax_qparams
from observers_core._qparams import QParams

from . import _array_observers as _base

__all__ = [
    "AxisCollective",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "PerChannelMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "FixedQParamsObserver",
    "PlaceholderObserver",
    "NoopObserver",
]

Array = Any


@dataclasses.dataclass(frozen=True)
class AxisCollective:
    """:class:`observers_core.Collective` across the named axis (or tuple of axes) of an enclosing
    ``jax.shard_map`` or ``jax.pmap``: ``lax.pmin``/``lax.pmax``/``lax.psum``, one all-reduce each
    (``min_max``: a range's minima and negated maxima in one ``pmin``).

    NaN wins in ``min``/``max`` explicitly (XLA's all-reduce min/max drops NaN): the values with NaN
    masked out and a NaN flag are reduced together. Hashable, so it is a static argument of ``jax.jit``.
    Used outside a ``shard_map``/``pmap`` binding the axis, each reduction raises ``ValueError``.
    """

    axis_name: str | tuple[str, ...]

    def __post_init__(self) -> None:
        names = self.axis_name if isinstance(self.axis_name, tuple) else (self.axis_name,)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise TypeError(f"axis_name must be a non-empty str or a non-empty tuple of them, got {self.axis_name!r}")

    def _check_bound(self) -> None:
        names = self.axis_name if isinstance(self.axis_name, tuple) else (self.axis_name,)
        for name in names:
            try:
                lax.axis_size(name)
            except NameError as err:
                raise ValueError(
                    f"axis_name={name!r} is not bound here: call the update inside jax.shard_map (a mesh axis) "
                    f"or jax.pmap(axis_name=...) with that name ({err})"
                ) from None

    def _nan_wins(self, x: Array, reduce: Any, identity: float) -> Array:
        self._check_bound()
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return reduce(x, self.axis_name)
        nan = jnp.isnan(x)
        # one all-reduce: row 0 the values (NaN -> identity), row 1 a flag that is -identity where NaN
        both = reduce(jnp.stack([jnp.where(nan, identity, x), jnp.where(nan, -identity, identity)]), self.axis_name)
        return jnp.where(both[1] == -identity, jnp.nan, both[0])

    def min(self, x: Array) -> Array:
        return self._nan_wins(x, lax.pmin, jnp.inf)

    def max(self, x: Array) -> Array:
        return self._nan_wins(x, lax.pmax, -jnp.inf)

    def min_max(self, lo: Array, hi: Array) -> tuple[Array, Array]:
        """``(min(lo), max(hi))`` in one all-reduce (``max(hi) = -min(-hi)``, exact) when both are floating
        of one dtype; else two."""
        lo, hi = jnp.asarray(lo), jnp.asarray(hi)
        if not (jnp.issubdtype(lo.dtype, jnp.floating) and lo.dtype == hi.dtype):
            return self.min(lo), self.max(hi)
        both = self.min(jnp.concatenate([lo.reshape(-1), -hi.reshape(-1)]))
        return both[:lo.size].reshape(lo.shape), (-both[lo.size:]).reshape(hi.shape)

    def sum(self, x: Array) -> Array:
        self._check_bound()
        return lax.psum(x, self.axis_name)


def jax_collective(axis_name: Any, collective: Any) -> Any:
    """The collective of a JAX ``update``: ``AxisCollective(axis_name)``, ``collective`` itself (a
    hashable :class:`observers_core.Collective`: it is a static argument of ``jax.jit``), or ``None``."""
    if axis_name is not None:
        if collective is not None:
            raise ValueError("give axis_name or collective, not both")
        return AxisCollective(axis_name)
    check_collective(collective)
    try:
        hash(collective)
    except TypeError:
        raise TypeError(
            f"collective must be hashable for the JAX observers (a static argument of jax.jit), "
            f"e.g. AxisCollective(axis_name); got {type(collective).__name__}"
        ) from None
    return collective


def _update_body(
    state: MinMaxState, x: Array, *, axis: int | None, averaging_constant: float | None, ignore_nonfinite: bool,
    collective: Any = None,
) -> MinMaxState:
    """The traced update: the core's (which also restores the NaN propagation XLA:CPU's reductions lack)."""
    return _base.core_update(
        state, x, axis=axis, averaging_constant=averaging_constant, ignore_nonfinite=ignore_nonfinite, xp=jnp,
        collective=collective,
    )


@functools.partial(jax.jit, static_argnames=("axis", "averaging_constant", "ignore_nonfinite", "collective"))
def _jit_update(state, x, *, axis, averaging_constant, ignore_nonfinite, collective=None):
    return _update_body(state, x, axis=axis, averaging_constant=averaging_constant, ignore_nonfinite=ignore_nonfinite,
                        collective=collective)  # fmt: skip


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
    def update(self, state: Any, x: Array, *, axis_name: Any = None, collective: Any = None) -> Any:
        """Pure update (see the base class). Inside ``jax.shard_map``/``jax.pmap`` over ``axis_name``
        (:class:`AxisCollective`) every device ends with the state one device reaches on the whole
        batch (all shards concatenated), replicated."""
        return super().update(state, x, collective=jax_collective(axis_name, collective))

    def _compute_update(self, state: MinMaxState, x: Array, axis: int | None, collective: Any = None) -> MinMaxState:
        return _jit_update(
            state, x, axis=axis, averaging_constant=self._averaging_constant, ignore_nonfinite=self.ignore_nonfinite,
            collective=collective,
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
