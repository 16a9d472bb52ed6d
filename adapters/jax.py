"""JAX observers: torch.ao's, Horizon's and the low-bit observer classes over ``jax.numpy``, under ``jax.jit``.

The classes are the generic ones (``adapters/_array_*.py``), each a one-line subclass on :class:`JaxBackend`; this file is all that
is JAX's:

- ``obs(x)`` runs one jitted step of the core (min/max update, histogram update, calibration batch step,
  KL accumulation and KL update, low-bit statistics) and never syncs with the host. Every jitted
  function is traced once per input shape/dtype and configuration (the hashable family ``Config``,
  :class:`~observers_core.QuantSpec` or :class:`~observers_core.LowBitSpec` is a static argument) and
  shared by all observers with that configuration; the first batch goes through the same compiled
  update (it starts from the empty state). ``calculate_qparams``/``fake_quantize`` are jitted likewise.
- ``obs.update(state, x)`` / ``obs.qparams(state)`` (KLObserver: ``obs.accumulate(acc, x)``,
  ``obs.kl_step(state, acc)``) are the same pure functions, for a user's ``jit`` or ``lax.scan``
  (``obs.state`` is a pytree; ``obs.state = new_state`` stores one back). Calling the stateful ``obs(x)``
  on a tracer raises ``TypeError``.
- ``obs.update(state, x, axis_name="data")`` (``accumulate`` likewise) inside ``jax.shard_map``/``jax.pmap``
  over that axis reduces the batch statistics across the devices (:class:`AxisCollective`:
  ``lax.pmin``/``pmax``/``psum``, NaN wins), so every device holds the state one device reaches on the
  whole batch (README "JAX collectives").
- Inputs may be ``jax.Array`` or numpy arrays (moved to the default device). An input committed to another
  device than the state's (``jax.device_put``) raises ``ValueError``, as on every backend.

Zero points are int32 where torch has int64 (symmetric schemes, defaults): JAX without x64 has no int64.
Without x64 the calibration searches run in float32 where numpy and torch use float64; near-ties between
candidates may then resolve differently. On CPU, XLA flushes subnormal float32 values to zero (FTZ/DAZ,
jax-ml/jax#16200): inputs below ``1.18e-38`` in magnitude are observed as (signed) zeros.

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

import collections
import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from observers_core._collective import check_collective

from ._backend import FrameworkBackend, plain_ndarray
from . import _array_calibration as calibration, _array_histogram as histogram, _array_lowbit as lowbit
from . import _array_observers as minmax

__all__ = [
    'AxisCollective', 'MinMaxObserver', 'MovingAverageMinMaxObserver', 'PerChannelMinMaxObserver',
    'MovingAveragePerChannelMinMaxObserver', 'FixedQParamsObserver', 'PlaceholderObserver', 'NoopObserver',
    'HistogramObserver', 'KLObserver', 'MSEObserver', 'PercentileObserver', 'MixObserver', 'LowBitObserver',
    'PerGroupMinMaxObserver', 'FP8Observer', 'PerBlockMXObserver', 'PerBlockBFPObserver',
]

Array = Any

#: How many times ``jax.jit`` has traced each core function run by :class:`JaxBackend` (a trace per
#: new input shape/dtype or configuration; later calls reuse the compiled function).
TRACES: collections.Counter = collections.Counter()


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


def _is_committed(a: Any) -> bool:
    """A concrete ``jax.Array`` pinned to its devices (tracers and uncommitted arrays are not)."""
    return isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer) and a.committed


def _devices(a: Any) -> str:
    return ", ".join(sorted(str(d) for d in a.devices()))


def _is_traced(arg: Any) -> bool:
    """A positional argument of :meth:`JaxBackend.run` that is data: an array, a state (a tuple) or
    ``None``. Everything else (a configuration) is static."""
    return arg is None or isinstance(arg, (tuple, jax.Array, np.ndarray))


@functools.lru_cache(maxsize=None)
def _jitted(fn: Callable[..., Any], static_args: tuple[tuple[int, Any], ...], static: tuple[tuple[str, Any], ...]
            ) -> Callable[..., Any]:
    """``jax.jit`` of ``fn`` with its static arguments bound, made once per ``(fn, static)``."""
    fixed, kwargs = dict(static_args), dict(static)

    def traced(*data: Any) -> Any:
        TRACES[fn] += 1
        it = iter(data)
        return fn(*(fixed[i] if i in fixed else next(it) for i in range(len(fixed) + len(data))), **kwargs)

    return jax.jit(traced)


@functools.lru_cache(maxsize=256)
def _output_struct(fn: Callable[..., Any], config: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """Shapes and dtypes of ``fn(config, None, x)`` for an ``x`` of ``shape``/``dtype`` (an abstract trace,
    never compiled; cached)."""
    return jax.eval_shape(lambda x: fn(config, None, x), jax.ShapeDtypeStruct(shape, dtype))


class JaxBackend(FrameworkBackend):
    """``jax.numpy``; every core step jitted (see the module docstring); uncommitted arrays go where
    ``jax.jit`` puts them, committed ones must share the state's devices."""

    label, namespace_name = "JAX", "jax.numpy"

    def __init__(self) -> None:
        super().__init__(jnp)

    def coerce(self, x: Array) -> Array:
        if isinstance(x, jax.Array):  # tracers included: obs.update runs inside jit
            return x
        if isinstance(x, np.ndarray):
            x = plain_ndarray(x)
            if x.dtype.kind in "iu" and x.dtype.itemsize == 8 and not jax.config.jax_enable_x64:
                # jnp.asarray would wrap it to 32 bits (2**62 -> 0); the observers count integers in float32
                x = x.astype(np.float32)
            return jnp.asarray(x)
        raise TypeError(f"x must be a jax.Array or numpy.ndarray, got {type(x).__module__}.{type(x).__name__}")

    def check_stateful_call(self, x: Array, owner: str) -> None:
        if isinstance(x, jax.core.Tracer):
            raise TypeError(
                f"{owner}(x) stores state and cannot run inside jit/scan/vmap; "
                "use obs.update(state, x) there and assign obs.state afterwards"
            )

    def check_device(self, x: Array, like: Array) -> None:
        """``ValueError`` where ``x`` and the state are both committed (``jax.device_put``, or computed on a
        device) to different devices, which ``jax.jit`` would refuse with a message about its own arguments;
        an uncommitted ``x`` goes where the state is."""
        if _is_committed(x) and _is_committed(like) and x.devices() != like.devices():
            raise ValueError(f"x is on device {_devices(x)} but this observer's state is on {_devices(like)}; "
                             "move x there (jax.device_put)")

    def place(self, host: np.ndarray, dtype: Any, like: Array | None = None, device: Any = None) -> Array:
        out = jnp.asarray(host, dtype=dtype)
        if _is_committed(like):  # an uncommitted ``like`` leaves placement to jit, so does the result
            return jax.device_put(out, like.sharding)
        return out if device is None else jax.device_put(out, device)

    def empty(self, make: Callable[[Any], Any], device: Any, x: Array | None = None) -> Any:
        """Uncommitted (``jit`` places it with the input) unless the observer was given a device."""
        state = make(None)
        return state if device is None else jax.device_put(state, device)

    def identity_start(self, fn: Callable[..., Any], config: Any, x: Array) -> Any:
        """``+inf``/``-inf`` (min, max) of ``fn(config, None, x)``'s shapes: merged with the batch's
        statistics it gives them, so the first batch and the dynamic mode share the compiled update."""
        struct = _output_struct(fn, config, tuple(x.shape), x.dtype)
        return type(struct)(*(jnp.full(s.shape, fill, s.dtype) for s, fill in zip(struct, (jnp.inf, -jnp.inf))))

    def run(self, fn: Callable[..., Any], /, *args: Any, **static: Any) -> Any:
        static_args = tuple((i, a) for i, a in enumerate(args) if not _is_traced(a))
        return _jitted(fn, static_args, tuple(sorted(static.items())))(*(a for a in args if _is_traced(a)))

    def collective(self, collective: Any, axis_name: Any) -> Any:
        """``AxisCollective(axis_name)``, ``collective`` itself (hashable: a static argument of ``jax.jit``)
        or ``None``."""
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


BACKEND = JaxBackend()

# The public classes: the generic ones (signature, checks, steps) on this backend.
class MinMaxObserver(minmax.MinMaxObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class MovingAverageMinMaxObserver(minmax.MovingAverageMinMaxObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class PerChannelMinMaxObserver(minmax.PerChannelMinMaxObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class MovingAveragePerChannelMinMaxObserver(minmax.MovingAveragePerChannelMinMaxObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class FixedQParamsObserver(minmax.FixedQParamsObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class PlaceholderObserver(minmax.PlaceholderObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class NoopObserver(minmax.NoopObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class HistogramObserver(histogram.HistogramObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class KLObserver(calibration.KLObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class MSEObserver(calibration.MSEObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class PercentileObserver(calibration.PercentileObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class MixObserver(calibration.MixObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class LowBitObserver(lowbit.LowBitObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class PerGroupMinMaxObserver(lowbit.PerGroupMinMaxObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class FP8Observer(lowbit.FP8Observer): _BACKEND_TYPE = JaxBackend  # noqa: E701
class PerBlockMXObserver(lowbit.PerBlockMXObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
class PerBlockBFPObserver(lowbit.PerBlockBFPObserver): _BACKEND_TYPE = JaxBackend  # noqa: E701
