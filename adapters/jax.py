"""JAX observers: ``torch.ao.quantization.observer``'s classes over ``jax.numpy``, updated under ``jax.jit``.

Everything but JAX specifics lives in :mod:`observers_core.adapters._array_observers`. Here:

- ``__call__`` runs one jitted update (the configuration is static: axis, averaging constant,
  ``ignore_nonfinite``); it never syncs with the host and is traced once per input shape/dtype and
  configuration (the compiled function is shared by all observers with the same configuration);
- ``calculate_qparams`` is jitted with the hashable :class:`~observers_core.QuantSpec` as static argument;
- ``obs.update(state, x)`` / ``obs.qparams(state)`` are the same pure functions, to be used inside a
  user's ``jit`` or ``lax.scan`` (``obs.state`` is a pytree; ``obs.state = new_state`` stores one back);
- ``obs.update(state, x, axis_name="data")`` inside ``jax.shard_map``/``jax.pmap`` over that axis reduces the
  batch statistics across the devices (:class:`AxisCollective`: ``lax.pmin``/``pmax``/``psum``, NaN wins),
  so every device holds the state one device reaches on the whole batch (README "JAX collectives");
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

from . import adopt_public_names

from . import _jax_calibration, _jax_histogram, _jax_lowbit, _jax_minmax
from ._jax_minmax import *  # noqa: F401,F403
from ._jax_histogram import *  # noqa: F401,F403
from ._jax_calibration import *  # noqa: F401,F403
from ._jax_lowbit import *  # noqa: F401,F403

__all__ = (
    _jax_minmax.__all__ + _jax_histogram.__all__ + _jax_calibration.__all__ + _jax_lowbit.__all__
)
adopt_public_names(globals())
