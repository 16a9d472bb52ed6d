"""Min/max statistics: reductions, running and moving-average updates, merging, qparams.

State is data: :class:`MinMaxState` is a NamedTuple (a JAX pytree) of float32 ``min_val``/``max_val``
arrays, 0-d per tensor or shape ``(C,)`` per channel. A state that has seen nothing holds
``+inf``/``-inf`` (the identity of min/max), so ``merge`` is a monoid and every update is branch-free.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import array_api_compat
import numpy as np

from ._collective import check_collective, reduce_range
from ._compiled import finite_range_kernel, host_view
from ._dtypes import QuantSpec
from ._namespace import (
    namespace_of,
    array_namespace,
    check_real,
    check_same_device,
    discarded_invalid,
    is_jax_namespace,
    is_torch_namespace,
    midpoint,
    normalize_axis,
    on_host,
    rounded,
    scalar_like,
    size,
    triton_route,
)
from ._qparams import QParams, calculate_qparams
from ._validate import INF, check_bool, check_int

__all__ = [
    "MinMaxState",
    "aminmax",
    "minmax_init",
    "minmax_merge",
    "minmax_qparams",
    "minmax_update",
    "mean_of_replicas",
    "moving_average_init",
    "moving_average_merge",
    "moving_average_qparams",
    "moving_average_update",
]

Array = Any


class MinMaxState(NamedTuple):
    """Running range: 0-d (per tensor) or ``(C,)`` (per channel) float arrays."""

    min_val: Array
    max_val: Array


def aminmax(
    x: Array, /, *, axis: int | None = None, ignore_nonfinite: bool = False, xp: Any = None
) -> tuple[Array, Array]:
    """``(min(x), max(x))`` over all elements (``axis=None``) or per channel along ``axis``.

    Per channel reduces over every axis but ``axis`` and returns shape ``(x.shape[axis],)``.
    With ``ignore_nonfinite`` NaN and +/-Inf are skipped (like ``nanmin``/``nanmax`` with Inf dropped
    too); a group with no finite value gives ``(+inf, -inf)``, i.e. "nothing seen".
    The results keep ``x``'s dtype; ``x`` must not be empty.
    """
    xp = array_namespace(x, xp=xp)
    check_real(x, xp)
    if size(x) == 0:  # the same error on every backend (torch raises RuntimeError, numpy ValueError)
        raise ValueError(f"x must not be empty, got shape {tuple(x.shape)}")
    ignore_nonfinite = check_bool(ignore_nonfinite, "ignore_nonfinite")
    return _aminmax(x, None if axis is None else normalize_axis(axis, x.ndim), ignore_nonfinite, xp)


def _aminmax(x: Array, axis: int | None, ignore_nonfinite: bool, xp: Any) -> tuple[Array, Array]:
    """:func:`aminmax` for a checked ``x`` and a normalized ``axis``."""
    if axis is None:
        return reduce_aminmax(x, None, ignore_nonfinite=ignore_nonfinite, xp=xp)
    if is_torch_namespace(xp) and not ignore_nonfinite:
        return _torch_aminmax(x, axis)
    others = tuple(i for i in range(x.ndim) if i != axis)
    return reduce_aminmax(x, others, ignore_nonfinite=ignore_nonfinite, xp=xp)


def reduce_aminmax(
    x: Array, axes: tuple[int, ...] | None, /, *, ignore_nonfinite: bool, xp: Any
) -> tuple[Array, Array]:
    """``(min, max)`` of ``x`` over ``axes`` (all when None): the one reduction every statistic uses.

    ``ignore_nonfinite`` skips NaN/+-Inf; otherwise NaN propagates on every backend. JAX: one variadic
    reduction (:func:`_jax_aminmax`), a single pass over ``x``.
    """
    masked = ignore_nonfinite and xp.isdtype(x.dtype, "real floating")
    if is_jax_namespace(xp):
        return _jax_aminmax(x, axes, masked)
    if is_torch_namespace(xp) and not masked and (axes is None or len(axes) == 1) and size(x) > 0:
        import torch  # only reached when x is a torch tensor

        if axes is None:
            return tuple(torch.aminmax(x))  # one pass instead of two
        # over a dimension torch.aminmax is ~5x slower than amin + amax on CPU (torch 2.13, e.g. 22 ms
        # against 4.4 ms for (4096, 32, 128) over dim 2); amin/amax are what torchao's per-group qparams use
        return torch.amin(x, dim=axes[0]), torch.amax(x, dim=axes[0])
    if masked:
        fast = host_finite_range(x, axes, xp)
        if fast is not None:
            return fast
    x_lo = x_hi = x
    if masked:
        finite = xp.isfinite(x)
        x_lo = xp.where(finite, x, scalar_like(INF, x, xp))
        x_hi = xp.where(finite, x, scalar_like(-INF, x, xp))
    return xp.min(x_lo, axis=axes), xp.max(x_hi, axis=axes)


def _jax_aminmax(x: Array, axes: tuple[int, ...] | None, masked: bool) -> tuple[Array, Array]:
    """:func:`reduce_aminmax` on JAX as one variadic ``lax.reduce`` of ``(x, x)`` with ``(min, max)``: XLA
    compiles it, the masking (``masked``: non-finite values to ``+inf``/``-inf``) included, into a single
    fusion, one pass over ``x``. ``jnp.min`` and ``jnp.max`` were two reductions plus a third for the NaN
    check: XLA:CPU's own min/max reductions (the YNNPACK fusion) drop NaN past 4096 elements, which the
    variadic reduction, lowered as a plain loop, does not (``stablehlo.minimum``/``maximum`` propagate NaN,
    and give ``-0.0``/``+0.0`` for a tie of signed zeros, whatever the order)."""
    import jax.numpy as jnp  # only reached with JAX arrays
    from jax import lax

    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.floating) and not np.isinf(np.array(np.inf, dtype=x.dtype)):
        # float8 formats without infinities (e4m3fn, e4m3fnuz): the identity would be NaN; reduce the exact
        # float32 values (the cast is fused into the reduction) and cast the results, elements of x, back
        lo, hi = _jax_aminmax(x.astype(jnp.float32), axes, masked)
        return lo.astype(x.dtype), hi.astype(x.dtype)
    dims = tuple(range(x.ndim)) if axes is None else tuple(sorted(a % x.ndim for a in axes))
    if jnp.issubdtype(x.dtype, jnp.floating):
        low, high = jnp.inf, -jnp.inf
    else:
        low, high = jnp.iinfo(x.dtype).max, jnp.iinfo(x.dtype).min
    x_lo = x_hi = x
    if masked:
        finite = jnp.isfinite(x)
        x_lo, x_hi = jnp.where(finite, x, low), jnp.where(finite, x, high)
    identity = (jnp.full((), low, x.dtype), jnp.full((), high, x.dtype))
    lo, hi = lax.reduce((x_lo, x_hi), identity, lambda a, b: (lax.min(a[0], b[0]), lax.max(a[1], b[1])), dims)
    return lo, hi


def host_finite_range(x: Array, axes: tuple[int, ...] | None, xp: Any) -> tuple[Array, Array] | None:
    """``(min, max)`` of the finite values of a float32/float64 ``x`` in host memory over ``axes`` (all, or
    all but one), with the compiled kernels enabled; ``None`` otherwise (the caller masks instead).

    First the plain ``xp.min``/``xp.max`` (vectorized, threaded): when both come out finite, ``x`` held
    no NaN/Inf and they are the masked reductions, bit for bit. Otherwise one pass of the compiled kernel
    skips the non-finite values."""
    host = host_view(x, xp) if size(x) > 0 else None
    if host is None or host.dtype.kind != "f" or host.dtype.itemsize < 4:
        return None
    if axes is not None:
        kept = [i for i in range(x.ndim) if i not in {a % x.ndim for a in axes}]
        if len(kept) != 1:
            return None
    lo, hi = xp.min(x, axis=axes), xp.max(x, axis=axes)
    if bool(xp.all(xp.isfinite(lo))) and bool(xp.all(xp.isfinite(hi))):
        return lo, hi
    if axes is None:
        rows, shape = host.reshape(1, -1), ()
    else:
        rows = np.moveaxis(host, kept[0], 0)
        rows, shape = rows.reshape(rows.shape[0], -1), (rows.shape[0],)
    lo, hi = finite_range_kernel(rows, False)
    return xp.asarray(lo.reshape(shape)), xp.asarray(hi.reshape(shape))


def _torch_aminmax(x: Array, axis: int | None) -> tuple[Array, Array]:
    """Per channel with one ``torch.aminmax`` pass over a ``(C, -1)`` view, as torch.ao does."""
    import torch  # only reached when x is a torch tensor

    if x.ndim == 1:
        return x, x
    y = torch.movedim(x, axis, 0).reshape(x.shape[axis], -1)
    return torch.aminmax(y, dim=1)


def minmax_init(
    *, num_channels: int | None = None, dtype: Any = None, device: Any = None, xp: Any
) -> MinMaxState:
    """An empty state: ``+inf``/``-inf``, 0-d, or ``(num_channels,)`` per channel (float32 by default; ``dtype``
    must be a real floating dtype, which holds the infinities)."""
    xp = namespace_of(xp)
    shape = () if num_channels is None else (check_int(num_channels, "num_channels", minimum=0),)
    dtype = xp.float32 if dtype is None else dtype
    try:
        real = xp.isdtype(dtype, "real floating")
    except (TypeError, ValueError, AttributeError):  # not a dtype of this namespace
        real = False
    if not real:
        raise TypeError(f"dtype must be a real floating dtype (the state holds +inf/-inf), got {dtype!r}")
    return MinMaxState(
        xp.full(shape, INF, dtype=dtype, device=device), xp.full(shape, -INF, dtype=dtype, device=device)
    )


def _update_namespace(state: MinMaxState, x: Array, xp: Any) -> Any:
    """The namespace of an update: ``xp`` when given (the adapters, which coerce ``x``), else the one of
    ``state`` and ``x`` together (``TypeError`` naming both when they differ)."""
    if xp is not None:
        return namespace_of(xp)
    xp = array_api_compat.array_namespace(state.min_val)
    if type(x) is not type(state.min_val):  # (the common case, one array type, costs no second lookup)
        try:
            same = array_api_compat.array_namespace(x) is xp
        except TypeError:
            same = False
        if not same:
            raise TypeError(f"x ({type(x).__module__}.{type(x).__name__}) and the state "
                            f"({type(state.min_val).__module__}.{type(state.min_val).__name__}) must be arrays of "
                            "one namespace")
    return xp


def _batch_range(state: MinMaxState, x: Array, axis: int | None, ignore_nonfinite: bool, xp: Any,
                 collective: Any = None):
    """``aminmax(x)`` cast to the state's dtype, after checking that ``x`` fits the state, reduced by
    ``collective`` (an empty ``x`` contributes ``(+inf, -inf)``)."""
    check_bool(ignore_nonfinite, "ignore_nonfinite")
    if axis is None:
        if state.min_val.ndim != 0:
            raise ValueError(f"a per-channel state of shape {tuple(state.min_val.shape)} needs axis=<channel axis>")
    else:
        axis = normalize_axis(axis, x.ndim)
        if state.min_val.shape != (x.shape[axis],):
            raise ValueError(
                f"x has {x.shape[axis]} channels along axis {axis} but the state holds "
                f"{tuple(state.min_val.shape)}; build the state with num_channels={x.shape[axis]}"
            )
    if size(x) == 0:
        lo, hi = xp.full_like(state.min_val, INF), xp.full_like(state.max_val, -INF)
    else:
        lo, hi = _aminmax(x, axis, ignore_nonfinite, xp)  # x was checked by the caller
    # Casting after the reduction equals reducing after the cast (rounding is monotone) and skips a copy.
    if lo.dtype != state.min_val.dtype:
        lo, hi = xp.astype(lo, state.min_val.dtype), xp.astype(hi, state.max_val.dtype)
    return reduce_range(lo, hi, collective)


def minmax_update(
    state: MinMaxState,
    x: Array,
    /,
    *,
    axis: int | None = None,
    ignore_nonfinite: bool = False,
    xp: Any = None,
    collective: Any = None,
) -> MinMaxState:
    """Running range: ``x_min = min(x_min, min(X))``, ``x_max = max(x_max, max(X))``. Empty ``x``: no-op.

    NaN in ``x`` propagates into the state (as in torch) unless ``ignore_nonfinite``. With a
    :class:`~observers_core.Collective`, ``min(X)``/``max(X)`` are over every member's batch.
    """
    xp = _update_namespace(state, x, xp)
    check_real(x, xp)
    check_same_device(x, state.min_val, xp)
    if check_collective(collective) is None and size(x) == 0:
        return state
    lo, hi = _batch_range(state, x, axis, ignore_nonfinite, xp, collective)
    return MinMaxState(xp.minimum(lo, state.min_val), xp.maximum(hi, state.max_val))


def never_updated(state: MinMaxState, xp: Any) -> Array:
    """Where the state is exactly ``(+inf, -inf)``, torch's test of "never updated" (an average can
    overflow to ``min = +inf`` with a finite max, or cross min and max: neither is fresh, so
    ``min - max == inf`` would be wrong), as ``minimum(min, -max) == inf`` (NaN gives False)."""
    return xp.minimum(state.min_val, -state.max_val) == INF


def moving_average_update(
    state: MinMaxState,
    x: Array,
    /,
    *,
    averaging_constant: float,
    axis: int | None = None,
    ignore_nonfinite: bool = False,
    xp: Any = None,
    collective: Any = None,
) -> MinMaxState:
    """Moving average of the batch range: ``x_min = x_min + c * (min(X) - x_min)`` (same for max);
    an entry that has seen nothing yet (``+inf``/``-inf``) takes the batch range. Empty ``x``: no-op.

    NaN propagates as in torch; with ``ignore_nonfinite`` a channel whose batch held no finite value
    keeps its previous average. With a :class:`~observers_core.Collective`, ``min(X)``/``max(X)`` are
    over every member's batch (one step of the average per collective step; all empty: no-op)."""
    xp = _update_namespace(state, x, xp)
    check_real(x, xp)
    check_same_device(x, state.min_val, xp)
    if isinstance(averaging_constant, bool) or not isinstance(averaging_constant, (int, float, np.number)):
        raise TypeError(f"averaging_constant must be a real number, got {type(averaging_constant).__name__} "
                        f"{averaging_constant!r}")
    if check_collective(collective) is None and size(x) == 0:
        return state
    lo, hi = _batch_range(state, x, axis, ignore_nonfinite, xp, collective)
    c = float(averaging_constant)
    if collective is None and state.min_val.dtype == xp.float32 and triton_route(state.min_val, lo, xp=xp):
        from . import _triton_kernels  # torch CUDA: the arithmetic below in one kernel

        return MinMaxState(*_triton_kernels.moving_average(*state, lo, hi, c, keep_unseen=ignore_nonfinite))
    branch = fresh = None
    if state.min_val.ndim == 0 and on_host(state.min_val, xp):  # eager host data (NumPy, torch CPU), per
        # tensor: decide on the host and compute only the branch taken, as torch.ao does
        branch = "fresh" if float(state.min_val) == INF and float(state.max_val) == -INF else "average"
    else:
        fresh = never_updated(state, xp)
    with discarded_invalid(xp):  # fresh entries compute inf - inf, replaced by the batch range
        if branch == "fresh":
            new_min, new_max = lo, hi
        elif branch == "average":
            new_min = state.min_val + c * (lo - state.min_val)
            new_max = state.max_val + c * (hi - state.max_val)
        else:
            new_min = xp.where(fresh, lo, state.min_val + rounded(c * (lo - state.min_val), xp))
            new_max = xp.where(fresh, hi, state.max_val + rounded(c * (hi - state.max_val), xp))
    if ignore_nonfinite or collective is not None:  # (+inf, -inf): no finite value, or every batch empty
        seen = ~((lo == INF) & (hi == -INF))
        new_min = xp.where(seen, new_min, state.min_val)
        new_max = xp.where(seen, new_max, state.max_val)
    return MinMaxState(new_min, new_max)


def _check_mergeable(a: MinMaxState, b: MinMaxState) -> None:
    """``ValueError`` unless both states hold ranges of one shape (per tensor, or the same channels)."""
    shapes = [tuple(v.shape) for v in (*a, *b)]
    if len(set(shapes)) != 1:
        raise ValueError(f"a and b must hold min_val/max_val of one shape (per tensor, or the same number of "
                         f"channels), got {shapes[0]}/{shapes[1]} and {shapes[2]}/{shapes[3]}")


def minmax_merge(a: MinMaxState, b: MinMaxState, /, *, xp: Any = None) -> MinMaxState:
    """The range of both states: elementwise min of mins and max of maxes (associative, commutative,
    with :func:`minmax_init` as identity), so shards and batches can be combined in any order."""
    xp = array_namespace(a.min_val, b.min_val, xp=xp)
    _check_mergeable(a, b)
    return MinMaxState(xp.minimum(a.min_val, b.min_val), xp.maximum(a.max_val, b.max_val))


def moving_average_merge(a: MinMaxState, b: MinMaxState, /, *, xp: Any = None) -> MinMaxState:
    """Mean ``(u + v) / 2`` of two moving-average states (data-parallel replicas that averaged the same
    number of steps, as a synchronised all-reduce does), with no overflow near the dtype's maximum
    (:func:`~observers_core._namespace.midpoint`); an entry that has seen nothing takes the other's value."""
    xp = array_namespace(a.min_val, b.min_val, xp=xp)
    _check_mergeable(a, b)
    a_fresh, b_fresh = never_updated(a, xp), never_updated(b, xp)

    def mean(u: Array, v: Array) -> Array:
        both = xp.where(a_fresh | b_fresh, xp.zeros_like(u), midpoint(u, v, xp))
        return xp.where(a_fresh, v, xp.where(b_fresh, u, both))

    return MinMaxState(mean(a.min_val, b.min_val), mean(a.max_val, b.max_val))


def mean_of_replicas(states: list) -> Any:
    """Moving-average states merged by a balanced tree of ``moving_average_merge`` (pairwise means): the
    mean of the replicas when their number is a power of two (otherwise the tree's weighting). Replicas
    that have seen nothing (every entry ``(+inf, -inf)``) are left out: the tree's shape depends on how many
    saw data, so each replica is read on the host once (eager arrays only; a merge after calibration, not a
    step of an update)."""
    states = [s for s in states if not bool(((s.min_val == INF) & (s.max_val == -INF)).all())] or states[:1]
    while len(states) > 1:
        states = [moving_average_merge(*states[i:i + 2]) if i + 1 < len(states) else states[i]
                  for i in range(0, len(states), 2)]  # fmt: skip
    return states[0]


def minmax_qparams(state: MinMaxState, /, spec: QuantSpec, *, xp: Any = None) -> QParams:
    """Scale and zero point of the state's range (see :func:`calculate_qparams`)."""
    return calculate_qparams(state.min_val, state.max_val, spec, xp=xp)


moving_average_init = minmax_init
moving_average_qparams = minmax_qparams
