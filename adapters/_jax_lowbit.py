"""JAX low-bit observers: per-group integers, fp8, MX and BFP16 over ``jax.numpy``, under ``jax.jit``.

Everything but JAX specifics lives in :mod:`observers_core.adapters._array_lowbit`. Here the update,
the qparams and the fake quantization are jitted with the hashable :class:`~observers_core.LowBitSpec`
as a static argument: the update is traced once per input shape and dtype (the first batch and the
dynamic mode merge into an empty state, so they share it), the qparams and the fake quantization once
per shape; the compiled functions are shared by all observers with the same configuration.
``obs(x)`` never syncs with the host. ``obs.update(state, x)`` / ``obs.qparams(state)`` are the pure
functions for a user's ``jit`` or ``lax.scan`` (``obs.state`` is a pytree; ``obs.state = new_state``
stores one back).

Example::

    import jax.numpy as jnp
    from observers_core.adapters.jax import PerBlockMXObserver

    obs = PerBlockMXObserver("mxfp4", block_size=32)
    for batch in batches:
        obs(batch)                                   # jitted, asynchronous
    scale, exponent = obs.calculate_qparams()        # exponent: uint8 E8M0 codes per block
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from observers_core._lowbit import lowbit_fake_quantize, lowbit_qparams
from observers_core._minmax import MinMaxState

from observers_core.families import lowbit as lowbit_family

from . import _array_lowbit as _base
from ._jax_minmax import JaxMixin, jax_collective

__all__ = list(_base.__all__)

Array = Any


def _update_body(state, x, *, spec, ignore_nonfinite, collective=None):
    """The traced update (``state=None``: the batch's own statistics)."""
    return lowbit_family.observe(state, x, spec=spec, ignore_nonfinite=ignore_nonfinite, xp=jnp, collective=collective)


@functools.partial(jax.jit, static_argnames=("spec", "ignore_nonfinite", "collective"))
def _jit_update(state, x, *, spec, ignore_nonfinite, collective=None):
    return _update_body(state, x, spec=spec, ignore_nonfinite=ignore_nonfinite, collective=collective)


def _qparams_body(state, spec):
    return lowbit_qparams(state, spec, xp=jnp)


@functools.partial(jax.jit, static_argnames=("spec",))
def _jit_qparams(state, *, spec):
    return _qparams_body(state, spec)


def _fake_quantize_body(x, qparams, spec):
    return lowbit_fake_quantize(x, qparams, spec, xp=jnp)


@functools.partial(jax.jit, static_argnames=("spec",))
def _jit_fake_quantize(x, qparams, *, spec):
    return _fake_quantize_body(x, qparams, spec)


@functools.lru_cache(maxsize=256)
def _stats_struct(spec, ignore_nonfinite: bool, shape: tuple[int, ...], dtype: Any):
    """Shape and dtype of an input's statistics (an abstract trace, never compiled; cached)."""
    observe = functools.partial(lowbit_family.observe, None, spec=spec, ignore_nonfinite=ignore_nonfinite, xp=jnp)
    return jax.eval_shape(observe, jax.ShapeDtypeStruct(shape, dtype)).min_val


class _JaxLowBitMixin(JaxMixin):
    def update(self, state: Any, x: Array, *, axis_name: Any = None, collective: Any = None) -> Any:
        """Pure update (see the base class). Inside ``jax.shard_map``/``jax.pmap`` over ``axis_name``
        (:class:`AxisCollective`) the batch statistics are every device's shard's, merged elementwise:
        the state is replicated and equals observing the shards one after another on one device."""
        return super().update(state, x, collective=jax_collective(axis_name, collective))

    def _compute_update(self, state, x: Array, collective: Any = None):
        if state is None:
            # merging into the identity (+inf/-inf) gives the batch's own statistics: the first batch
            # and the dynamic mode reuse the one compiled update
            struct = _stats_struct(self._spec, self.ignore_nonfinite, tuple(x.shape), x.dtype)
            state = MinMaxState(jnp.full(struct.shape, jnp.inf, struct.dtype), jnp.full(struct.shape, -jnp.inf, struct.dtype))
        return _jit_update(state, x, spec=self._spec, ignore_nonfinite=self.ignore_nonfinite, collective=collective)

    def _compute_qparams(self, state):
        return _jit_qparams(state, spec=self._spec)

    def _compute_fake_quantize(self, x: Array, qparams):
        return _jit_fake_quantize(x, qparams, spec=self._spec)


class LowBitObserver(_JaxLowBitMixin, _base.LowBitObserver):
    __doc__ = _base.LowBitObserver.__doc__


class PerGroupMinMaxObserver(_JaxLowBitMixin, _base.PerGroupMinMaxObserver):
    __doc__ = _base.PerGroupMinMaxObserver.__doc__


class FP8Observer(_JaxLowBitMixin, _base.FP8Observer):
    __doc__ = _base.FP8Observer.__doc__


class PerBlockMXObserver(_JaxLowBitMixin, _base.PerBlockMXObserver):
    __doc__ = _base.PerBlockMXObserver.__doc__


class PerBlockBFPObserver(_JaxLowBitMixin, _base.PerBlockBFPObserver):
    __doc__ = _base.PerBlockBFPObserver.__doc__
