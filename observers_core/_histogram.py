"""Histogram statistics and torch's L2 range search (``HistogramObserver``), as pure array functions.

State is data: :class:`HistogramState` is a NamedTuple (a JAX pytree) of a float32 ``(bins,)`` histogram
and 0-d float32 ``min_val``/``max_val`` (``+inf``/``-inf`` until something is seen). Every function is
branch-free over array values (``where`` over all branches, static shapes), so ``histogram_update``,
``histogram_merge`` and ``histogram_qparams`` run under ``jax.jit``. The arithmetic reproduces torch
2.13's CPU kernels in float32 and in the same operation order, so states and qparams equal torch's
bit for bit (see the notes on each function for the few documented exceptions).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, NamedTuple

import array_api_compat
import numpy as np

from ._dtypes import QuantSpec
from ._minmax import aminmax
from ._namespace import (
    array_namespace,
    bincount,
    check_real,
    divide_by_constant,
    index_dtype,
    is_cupy_namespace,
    is_jax_namespace,
    is_numpy_namespace,
    is_torch_namespace,
    rounded,
    size,
)
from ._qparams import QParams, calculate_qparams

__all__ = [
    "HistogramState",
    "histogram",
    "histogram_init",
    "histogram_merge",
    "histogram_qparams",
    "histogram_update",
    "non_linear_param_search",
]

Array = Any
INF = float("inf")
MAX_BINS = 2**24  # bin indices and counts stay exact in float32 below this
_F32_MAX = float(np.finfo(np.float32).max)
_SCALE = 2.0**-26  # rescales (x - lo) * bins when it would overflow float32 (bins <= 2**24)

# dst_nbins of torch's HistogramObserver: 2 ** torch.iinfo(dtype).bits (quint4x2 is stored in 8 bits).
_DST_BITS = {
    "qint8": 8, "quint8": 8, "int8": 8, "uint8": 8, "quint4x2": 8,
    "int16": 16, "uint16": 16, "qint32": 32, "int32": 32,
}  # fmt: skip


class HistogramState(NamedTuple):
    """Running histogram over ``[min_val, max_val]``: ``histogram`` float32 ``(bins,)`` counts,
    ``min_val``/``max_val`` float32 0-d (``+inf``/``-inf`` before the first update)."""

    histogram: Array
    min_val: Array
    max_val: Array


# ----------------------------------------------------------------------------------------------
# validation and small helpers


def _check_bins(bins: Any, *, name: str = "bins") -> int:
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(bins).__name__} {bins!r}")
    if not 1 <= bins <= MAX_BINS:
        raise ValueError(f"{name}={bins} is out of range; allowed: 1 <= {name} <= 2**24")
    return int(bins)


def _check_upsample_rate(upsample_rate: Any) -> int:
    if isinstance(upsample_rate, bool) or not isinstance(upsample_rate, (int, np.integer)):
        raise TypeError(f"upsample_rate must be an int, got {type(upsample_rate).__name__} {upsample_rate!r}")
    if not 1 <= upsample_rate <= 2**16:
        raise ValueError(f"upsample_rate={upsample_rate} is out of range; allowed: 1 <= upsample_rate <= 65536")
    return int(upsample_rate)


def _check_state(state: Any, *, name: str = "state") -> int:
    """The number of bins of a well-formed state; ``ValueError`` naming the bad field otherwise."""
    try:
        hist, lo, hi = state.histogram, state.min_val, state.max_val
    except AttributeError:
        raise TypeError(f"{name} must be a HistogramState, got {type(state).__name__}") from None
    if hist.ndim != 1 or hist.shape[0] < 1:
        raise ValueError(f"{name}.histogram must have shape (bins,) with bins >= 1, got shape {tuple(hist.shape)}")
    for field, arr in (("min_val", lo), ("max_val", hi)):
        if arr.ndim != 0:
            raise ValueError(f"{name}.{field} must be 0-d, got shape {tuple(arr.shape)}")
    return _check_bins(hist.shape[0], name=f"{name}.histogram.shape[0]")


def _device(x: Array) -> Any:
    return array_api_compat.device(x)


def _scalar(value: float, like: Array, xp: Any) -> Array:
    return xp.asarray(value, dtype=like.dtype, device=_device(like))


def _float64_scope(xp: Any):
    """Where torch computes in Python floats (double), we compute in float64; JAX without x64 gets it
    for the duration of the block (also while tracing under ``jit``)."""
    if is_jax_namespace(xp):
        import jax  # only reached with jax arrays

        if not jax.config.jax_enable_x64:
            return jax.enable_x64(True)
    return contextlib.nullcontext()


def _div(a: Array, b: Any, xp: Any) -> Array:
    """``a / b`` as IEEE division. XLA (JAX) turns a division by a scalar or a constant into a
    multiplication by the reciprocal, which can be off in the last bit: Python-number divisors go through
    :func:`divide_by_constant`; an array divisor is spread over ``a``'s elements through ``(a == a)``
    (NaN elements stay NaN), which keeps the true division. Plain ``/`` elsewhere."""
    if not hasattr(b, "dtype"):
        return divide_by_constant(a, float(b), xp)
    if is_jax_namespace(xp):
        return a / (b * xp.astype(a == a, b.dtype))
    return a / b


def _floor_div(a: Array, b: Array, xp: Any) -> Array:
    """``floor(a / b)`` as torch's ``div(rounding_mode="floor")`` gives it for float32 (``b > 0``): the
    exact floor of the real quotient (torch reaches it through ``fmod``, 20x slower in NumPy). The
    rounded quotient is floored and lowered by one where ``q * b > a`` (checked exactly in float64);
    an infinite ``a`` gives NaN like ``fmod``."""
    q = xp.floor(_div(a, b, xp))
    with _float64_scope(xp):
        above = xp.astype(q, xp.float64) * xp.astype(b, xp.float64) > xp.astype(a, xp.float64)
    q = q - xp.astype(above, q.dtype)
    return xp.where(xp.isinf(a), _scalar(float("nan"), q, xp), q)


def _cummin(v: Array, xp: Any) -> Array:
    """Prefix minimum of a 1-D integer array: the native scan where there is one, log-step doubling
    otherwise (the standard has no cummin)."""
    if is_numpy_namespace(xp):
        return np.minimum.accumulate(v)
    if is_torch_namespace(xp):
        import torch  # only reached with torch tensors

        return torch.cummin(v, dim=0).values
    if is_jax_namespace(xp):
        import jax  # only reached with jax arrays

        return jax.lax.cummin(v)
    n = v.shape[0]
    big = xp.full((n,), int(np.iinfo(np.int32).max), dtype=v.dtype, device=_device(v))
    shift = 1
    while shift < n:
        v = xp.minimum(v, xp.concat([big[:shift], v[:-shift]]))
        shift *= 2
    return v


def _fma32(a: Array, m: Array, c: Array, xp: Any) -> Array:
    """``float32(a * m + c)`` rounded once (a fused multiply-add): ``a``, ``c`` float32, ``m`` integral.

    ``a * m`` is exact in float64; the sum is rounded to float64 and its error kept (TwoSum), and the one
    case where rounding twice differs from rounding once (a float32 half-way point) is decided by that
    error's sign."""
    f32, f64 = xp.float32, xp.float64
    with _float64_scope(xp):
        p = xp.astype(a, f64) * xp.astype(m, f64)
        c64 = xp.astype(c, f64)
        s = p + c64
        bv = s - p
        err = (p - (s - bv)) + (c64 - bv)
        r = xp.astype(s, f32)
        r64 = xp.astype(r, f64)
        toward = xp.where(s > r64, _scalar(INF, r, xp), _scalar(-INF, r, xp))
        r2 = xp.nextafter(r, toward)
        tie = (s == (r64 + xp.astype(r2, f64)) / 2) & (err != 0) & (s != r64)
        fixed = xp.where(err > 0, xp.maximum(r, r2), xp.minimum(r, r2))
        return xp.where(tie, fixed, r)


def _linspace(start: Array, end: Array, steps: int, xp: Any) -> Array:
    """``torch.linspace(start, end, steps)`` in float32 as torch's CPU kernel computes it:
    ``step = (end - start) / (steps - 1)``; element ``i`` is ``start + step * i`` for ``i < steps // 2``
    and ``end - step * (steps - 1 - i)`` otherwise, each a fused multiply-add (x86-64 builds of torch
    contract them; verified bit for bit against torch 2.13)."""
    idt = index_dtype(xp)
    step = _div(end - start, float(steps - 1), xp)
    i = xp.arange(steps, dtype=idt, device=_device(start))
    lower = i < steps // 2
    m = xp.where(lower, i, steps - 1 - i)
    return _fma32(xp.where(lower, step, -step), m, xp.where(lower, start, end), xp)


def _seqsum_last(x: Array, xp: Any) -> Array:
    """``((x[..., 0] + x[..., 1]) + ...)`` in x's float arithmetic, one add at a time (0 when empty)."""
    acc = xp.zeros(x.shape[:-1], dtype=x.dtype, device=_device(x))
    for j in range(x.shape[-1]):
        acc = acc + x[..., j]
    return acc


def _cascade_last(x: Array, xp: Any) -> Array:
    """torch's ``multi_row_sum`` along the last axis: sequential sums of 16, of 16 of those, and so on
    (4 levels; the levels' leftovers are added last: ``((l0 + l1) + l2) + l3``)."""
    lead = x.shape[:-1]
    leftovers, level = [], x
    for _ in range(3):
        groups = level.shape[-1] // 16
        leftovers.append(_seqsum_last(level[..., 16 * groups:], xp))
        level = _seqsum_last(xp.reshape(level[..., : 16 * groups], lead + (groups, 16)), xp) if groups else \
            xp.zeros(lead + (0,), dtype=x.dtype, device=_device(x))
    leftovers.append(_seqsum_last(level, xp))
    out = leftovers[0]
    for part in leftovers[1:]:
        out = out + part
    return out


def _sum32(v: Array, xp: Any) -> Array:
    """Float32 sum over the last axis, added up in the order of torch's CPU ``sum`` (``cascade_sum``:
    8-lane vectors in 4 interleaved accumulators, each a 16-ary cascade; then the tail, then the lanes).
    torch's own sum on torch tensors. Exact for rows of up to 32768 elements (longer ones torch splits
    over threads)."""
    if is_torch_namespace(xp):
        return xp.sum(v, axis=-1)
    n, lead = v.shape[-1], v.shape[:-1]
    lanes = 8 if n >= 8 else 1  # torch sums rows shorter than one vector with scalars
    nvec = n // lanes
    ilp = nvec // 4
    blocks = xp.reshape(v[..., : 4 * lanes * ilp], lead + (ilp, 4 * lanes))
    part = xp.reshape(_cascade_last(xp.permute_dims(blocks, tuple(range(len(lead))) + (len(lead) + 1, len(lead))), xp),
                      lead + (4, lanes))  # fmt: skip
    acc = part[..., 0, :]
    for t in range(4 * ilp, nvec):
        acc = acc + v[..., t * lanes:(t + 1) * lanes]
    for k in range(1, 4):
        acc = acc + part[..., k, :]
    if lanes == 1:
        return acc[..., 0]
    out = _seqsum_last(v[..., nvec * lanes:], xp)
    for lane in range(lanes):
        out = out + acc[..., lane]
    return out


def _cumsum32(v: Array, xp: Any) -> Array:
    """Running sums of a float32 vector as torch's CPU ``cumsum`` forms them: in float64, each rounded
    to float32."""
    with _float64_scope(xp):
        return xp.astype(xp.cumulative_sum(xp.astype(v, xp.float64)), xp.float32)


# ----------------------------------------------------------------------------------------------
# counting: one native kernel per namespace, one portable fallback


def _bincount_weighted(idx: Array, weights: Array, length: int, xp: Any) -> Array:
    """``out[idx[i]] += weights[i]`` in float32 and in index order (as ``torch.bincount(weights=)``
    accumulates on CPU); ``idx`` is non-decreasing here."""
    if is_numpy_namespace(xp):
        out = np.zeros(length, dtype=np.float32)
        np.add.at(out, idx, weights)
        return out
    if is_torch_namespace(xp):
        import torch  # only reached with torch tensors

        return torch.bincount(idx, weights=weights, minlength=length)
    if is_jax_namespace(xp):
        return xp.zeros(length, dtype=weights.dtype).at[idx].add(weights)
    if is_cupy_namespace(xp):
        import cupyx  # only reached with cupy arrays

        out = xp.zeros(length, dtype=weights.dtype)
        cupyx.scatter_add(out, idx, weights)
        return out
    # portable: idx is sorted, so each bin sums a contiguous run; differences of a float64 running sum
    # (each bin's sum correctly rounded, where torch adds sequentially in float32)
    with _float64_scope(xp):
        cs = xp.cumulative_sum(xp.astype(weights, xp.float64), include_initial=True)
        edges = xp.searchsorted(idx, xp.arange(length + 1, dtype=idx.dtype, device=_device(idx)), side="left")
        sums = xp.take(cs, edges[1:]) - xp.take(cs, edges[:-1])
        return xp.astype(sums, weights.dtype)


# ----------------------------------------------------------------------------------------------
# torch.histc

_CHUNK = 1 << 16  # numpy/torch bin this many values at a time, in place, while they sit in cache


def _histc_range(lo: Array, hi: Array, data_lo: Array, data_hi: Array, xp: Any) -> tuple[Array, Array]:
    """torch.histc's outer edges: if ``lo == hi`` use the data's range; if that is a single value ``c``
    too, widen it to ``[min(c - 1, prev(c)), max(c + 1, next(c))]`` (torch >= 2.1's float rule)."""
    degenerate = (lo == hi) & (data_lo <= data_hi)
    lo = xp.where(degenerate, data_lo, lo)
    hi = xp.where(degenerate, data_hi, hi)
    point = lo == hi
    big = _scalar(float(xp.finfo(lo.dtype).max), lo, xp)
    wide_lo = xp.minimum(xp.nextafter(lo, -big), lo - 1)
    wide_hi = xp.maximum(xp.nextafter(hi, big), hi + 1)
    return xp.where(point, wide_lo, lo), xp.where(point, wide_hi, hi)


def _finite_range(xf: Array, xp: Any) -> tuple[Array, Array]:
    """``(min, max)`` of the finite values of 1-D ``xf`` (``(+inf, -inf)`` if none), one kernel per
    namespace."""
    if is_numpy_namespace(xp):
        finite = np.isfinite(xf)
        return (np.asarray(np.min(xf, where=finite, initial=np.inf), dtype=xf.dtype),
                np.asarray(np.max(xf, where=finite, initial=-np.inf), dtype=xf.dtype))  # fmt: skip
    if is_torch_namespace(xp):
        import torch  # only reached with torch tensors

        lo = torch.amin(torch.nan_to_num(xf, nan=INF, posinf=INF, neginf=INF))
        return lo, torch.amax(torch.nan_to_num(xf, nan=-INF, posinf=-INF, neginf=-INF))
    return aminmax(xf, ignore_nonfinite=True, xp=xp)


def _counts(xf: Array, bins: int, lo: Array, hi: Array, xp: Any, *, bounded: bool) -> Array:
    """Integer counts, length ``bins + 3``: ``[0, bins]`` by torch.histc's bin formula (``bins`` is the value
    ``hi`` itself, folded into the last bin by the caller), ``bins + 1`` NaN, ``bins + 2`` +/-inf and (when
    ``bounded``) values outside ``[lo, hi]``; ``lo < hi`` finite, as :func:`_histc_range` returns them.

    Bin of ``x``: ``trunc((x - lo) * bins / (hi - lo))`` in ``xf``'s float arithmetic. When that product
    would overflow, numerator and denominator are scaled by ``2**-26`` (exact, same quotient); when even
    ``hi - lo`` overflows, ``x`` and the bounds are halved first."""
    half = xp.where(xp.isfinite(hi - lo), _scalar(1.0, lo, xp), _scalar(0.5, lo, xp))
    width = hi * half - lo * half
    over = ~xp.isfinite(width * float(bins))
    num = xp.where(over, _scalar(bins * _SCALE, lo, xp), _scalar(float(bins), lo, xp))
    den = xp.where(over, width * _SCALE, width)
    lo_half = lo * half
    nan_bin, out_bin = float(bins + 1), float(bins + 2)
    if is_numpy_namespace(xp):
        out = np.zeros(bins + 3, dtype=np.int64)
        for s in range(0, xf.shape[0], _CHUNK):
            c = xf[s:s + _CHUNK]
            d = c * half
            d -= lo_half
            d *= num
            d /= den
            np.nan_to_num(d, copy=False, nan=nan_bin, posinf=out_bin, neginf=out_bin)
            np.clip(d, 0.0, out_bin, out=d)  # only an invalid range puts finite values outside
            if bounded:
                d[(c < lo) | (c > hi)] = out_bin
            out += np.bincount(d.astype(np.intp), minlength=bins + 3)
        return out
    if is_torch_namespace(xp):
        import torch  # only reached with torch tensors

        out = torch.zeros(bins + 3, dtype=torch.int64, device=xf.device)
        for s in range(0, xf.shape[0], _CHUNK):
            c = xf[s:s + _CHUNK]
            d = torch.mul(c, half)
            d.sub_(lo_half).mul_(num).div_(den)
            torch.nan_to_num_(d, nan=nan_bin, posinf=out_bin, neginf=out_bin).clamp_(0.0, out_bin)
            if bounded:
                d.masked_fill_((c < lo) | (c > hi), out_bin)
            out += torch.bincount(d.to(torch.int32), minlength=bins + 3)
        return out
    pos = _div((xf * half - lo_half) * num, den, xp)
    pos = xp.where(xp.isnan(pos), nan_bin, xp.where(xp.isfinite(pos), xp.clip(pos, 0.0, out_bin), out_bin))
    if bounded:
        pos = xp.where((xf >= lo) & (xf <= hi), pos, out_bin)
    return bincount(xp.astype(pos, index_dtype(xp)), bins + 3, xp)


def _histc(xf: Array, bins: int, lo: Array, hi: Array, xp: Any, *, data: tuple[Array, Array],
           bounded: bool = True) -> tuple[Array, Array]:  # fmt: skip
    """``(float counts, number of NaN)`` of ``xf`` (1-D float) in ``bins`` equal bins over ``[lo, hi]``
    (0-d, ``xf.dtype``), exactly as ``torch.histc``: the value ``hi`` in the last bin; NaN, +/-inf and
    values outside ``[lo, hi]`` not counted; ``data`` is the range of the finite values of ``xf`` (used
    when ``lo == hi``). ``bounded=False`` when every finite value is known to lie in ``[lo, hi]``.
    Counted in integers, converted to float at the end."""
    lo, hi = _histc_range(lo, hi, data[0], data[1], xp)
    ok = (hi > lo) & xp.isfinite(lo) & xp.isfinite(hi)
    lo = xp.where(ok, lo, _scalar(0.0, lo, xp))
    hi = xp.where(ok, hi, _scalar(1.0, hi, xp))
    c = _counts(xf, bins, lo, hi, xp, bounded=bounded)
    last = xp.reshape(c[bins - 1] + c[bins], (1,))
    counts = xp.concat([c[: bins - 1], last])
    counts = xp.where(ok, counts, xp.zeros_like(counts))
    return xp.astype(counts, xf.dtype), c[bins + 1]


def histogram(x: Array, /, *, bins: int, lo: Any, hi: Any, xp: Any = None) -> Array:
    """Counts of ``x`` in ``bins`` equal-width bins over ``[lo, hi]``, with ``torch.histc``'s semantics.

    Bin of ``v``: ``trunc((v - lo) * bins / (hi - lo))`` computed in float32 (float64 for float64 input)
    in torch's order, so every value lands in the bin torch.histc puts it in; ``v == hi`` goes to the last
    bin; values outside ``[lo, hi]``, NaN and +/-inf are not counted. ``lo == hi``: the range of the
    finite values of ``x`` is used, and a single value ``c`` is widened to
    ``[min(c - 1, prev(c)), max(c + 1, next(c))]``, as torch does.

    Differences from torch.histc, all deliberate:

    - counts are accumulated in integers (int64; int32 on JAX without x64, i.e. up to 2**31 - 1 per bin
      and call) and converted to float at the end, so a bin never stops growing; torch accumulates in the
      input's float dtype (float32 counts stick at 2**24, float16 at 2048);
    - integer, float16 and bfloat16 inputs are binned in float32 (torch bins float16/bfloat16 in their
      own precision and rejects integers); the result is float32 (float64 for float64 input);
    - where ``(hi - lo) * bins`` overflows float32, torch's C++ casts inf/NaN to an integer (undefined
      behaviour: everything lands in bin 0 on x86-64) and a span ``hi - lo`` beyond float max counts
      nothing; here the computation is rescaled by powers of two, giving the bin torch's formula means.
    - ``lo > hi`` or non-finite bounds given as arrays give all zeros (torch raises; the check would need
      a host sync); as Python numbers they raise ``ValueError``.

    Kernels: ``np.bincount``, ``torch.bincount``, ``jnp.bincount(length=)``, ``cupy.bincount``; other
    namespaces sort and count with ``searchsorted``.
    """
    xp = array_namespace(x, xp=xp)
    check_real(x, xp)
    bins = _check_bins(bins)
    dtype = xp.float64 if x.dtype == xp.float64 else xp.float32
    bounds = []
    for name, value in (("lo", lo), ("hi", hi)):
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ValueError(f"{name}={value} must be finite")
            value = xp.asarray(float(value), dtype=dtype, device=_device(x))
        elif isinstance(value, bool) or not hasattr(value, "shape"):
            raise TypeError(f"{name} must be a real number or a 0-d array, got {type(value).__name__} {value!r}")
        elif value.ndim != 0:
            raise ValueError(f"{name} must be 0-d, got shape {tuple(value.shape)}")
        bounds.append(xp.astype(value, dtype))
    if all(isinstance(v, (int, float, np.integer, np.floating)) for v in (lo, hi)) and float(lo) > float(hi):
        raise ValueError(f"lo={lo} must not exceed hi={hi}")
    with np.errstate(all="ignore"):
        xf = xp.astype(xp.reshape(x, (-1,)), dtype)
        if size(xf) == 0:
            return xp.zeros((bins,), dtype=dtype, device=_device(x))
        data = _finite_range(xf, xp)
        return _histc(xf, bins, bounds[0], bounds[1], xp, data=data)[0]


# ----------------------------------------------------------------------------------------------
# the running state


def histogram_init(*, bins: int, xp: Any, device: Any = None) -> HistogramState:
    """An empty state: ``bins`` zero counts (float32), ``min_val = +inf``, ``max_val = -inf``."""
    bins = _check_bins(bins)
    return HistogramState(
        xp.zeros((bins,), dtype=xp.float32, device=device),
        xp.asarray(INF, dtype=xp.float32, device=device),
        xp.asarray(-INF, dtype=xp.float32, device=device),
    )


def _rebin(hist: Array, old_min: Array, old_max: Array, new_min: Array, new_max: Array, up: int, xp: Any) -> Array:
    """torch's ``_upscale_histogram``: split each bin into ``up`` equal parts of ``h / up``, place each part
    by its midpoint ``linspace(old_min, old_max, bins*up + 1)[:-1] + (old_max - old_min) / (2*bins*up)``
    into the new bins ``linspace(new_min, new_max, bins + 1)`` (``bucketize(right=True) - 1``, clamped),
    and add the parts up in order (float32)."""
    bins = hist.shape[0]
    parts = xp.reshape(xp.broadcast_to(xp.reshape(_div(hist, float(up), xp), (bins, 1)), (bins, up)), (-1,))
    part_width = _div(old_max - old_min, float(bins * up), xp)
    mids = _linspace(old_min, old_max, bins * up + 1, xp)[:-1] + 0.5 * part_width
    edges = _linspace(new_min, new_max, bins + 1, xp)
    idx = xp.searchsorted(edges, mids, side="right") - 1
    idx = xp.clip(idx, 0, bins - 1)
    return _bincount_weighted(idx, parts, bins, xp)


def _to_range(state: HistogramState, new_min: Array, new_max: Array, up: int, xp: Any) -> Array:
    """``state.histogram`` moved onto ``[new_min, new_max]`` (which contains the state's range) the way
    torch's ``_combine_histograms`` does: unchanged on the same range; all of it in the bin of the single
    value when ``min_val == max_val``; re-binned through ``up`` sub-bins otherwise; zeros when empty."""
    hist, old_min, old_max = state
    bins = hist.shape[0]
    empty = (old_min == INF) | (old_max == -INF)
    same = (old_min == new_min) & (old_max == new_max)
    point = (old_min == old_max) & ~same
    rebin = ~(empty | same | point)
    # every branch is computed (jit); the unused ones get harmless finite inputs
    zero, one = _scalar(0.0, old_min, xp), _scalar(1.0, old_min, xp)
    lo = xp.where(rebin, old_min, zero)
    hi = xp.where(rebin, old_max, one)
    nlo = xp.where(rebin, new_min, zero)
    nhi = xp.where(rebin, new_max, one)
    rebinned = _rebin(hist, lo, hi, nlo, nhi, up, xp)
    c = xp.where(point, old_min, zero)
    onehot = _histc(xp.reshape(c, (1,)), bins, xp.where(point, new_min, zero), xp.where(point, new_max, one),
                    xp, data=(c, c))[0]  # fmt: skip
    at_point = xp.where(onehot > 0, xp.sum(hist), xp.zeros_like(hist))
    out = xp.where(same, hist, xp.where(point, at_point, rebinned))
    return xp.where(empty, xp.zeros_like(hist), out)


def histogram_update(
    state: HistogramState,
    x: Array,
    /,
    *,
    upsample_rate: int = 16,
    ignore_nonfinite: bool = False,
    xp: Any = None,
) -> HistogramState:
    """One ``HistogramObserver.forward`` (torch >= 2.5): the state after also seeing ``x``.

    ``min_val = min(min_val, min(x))``, ``max_val = max(max_val, max(x))``; ``x`` is binned with
    :func:`histogram` on the new range and added to the old histogram moved onto that range: as is when
    the range did not change, as ``sum(old)`` in the bin of the old single value when ``min_val ==
    max_val``, otherwise re-binned through ``upsample_rate`` sub-bins per bin (torch's
    ``_upscale_histogram``). The first batch sets the range and the histogram.

    - ``x`` of any shape and real dtype is binned in float32 (torch bins float64/float16 inputs in their
      own precision); empty ``x`` or ``x`` with no finite value: no-op.
    - +/-inf are always dropped (as torch does; torch also warns, which is left to adapters).
    - NaN: with ``ignore_nonfinite`` it is dropped like inf. Otherwise it poisons the state: the result
      holds ``min_val = max_val = NaN`` and the previous histogram (torch raises; adapters check
      ``isnan(state.min_val)`` and raise, the previous state being still theirs).
    """
    bins = _check_state(state)
    up = _check_upsample_rate(upsample_rate)
    xp = array_namespace(state.histogram, xp=xp)
    check_real(x, xp)
    if size(x) == 0:
        return state
    with np.errstate(all="ignore"):
        xf = xp.astype(xp.reshape(x, (-1,)), xp.float32, copy=False)
        x_lo, x_hi = _finite_range(xf, xp)
        fresh = (state.min_val == INF) | (state.max_val == -INF)
        new_min = xp.where(fresh, x_lo, xp.minimum(state.min_val, x_lo))
        new_max = xp.where(fresh, x_hi, xp.maximum(state.max_val, x_hi))
        # every finite value lies in [new_min, new_max]: no bounds check needed
        batch, nans = _histc(xf, bins, new_min, new_max, xp, data=(x_lo, x_hi), bounded=False)
        hist = batch + _to_range(state, new_min, new_max, up, xp)
        seen = x_lo <= x_hi
        hist = xp.where(seen, hist, state.histogram)
        new_min = xp.where(seen, new_min, state.min_val)
        new_max = xp.where(seen, new_max, state.max_val)
        poisoned = xp.isnan(state.min_val) | xp.isnan(state.max_val)
        if not ignore_nonfinite:
            poisoned = poisoned | (nans > 0)
        nan = _scalar(float("nan"), new_min, xp)
        return HistogramState(
            xp.where(poisoned, state.histogram, hist),
            xp.where(poisoned, nan, new_min),
            xp.where(poisoned, nan, new_max),
        )


def histogram_merge(a: HistogramState, b: HistogramState, /, *, upsample_rate: int = 16, xp: Any = None) -> HistogramState:
    """Two states on possibly different ranges as one over ``[min(a.min, b.min), max(a.max, b.max)]``:
    each histogram moved onto that range as :func:`histogram_update` moves the old one, then added.
    Commutative, with :func:`histogram_init` as identity; re-binning is lossy, so it is associative only
    up to that loss, and ``merge(a, batch state)`` differs from ``update(a, batch)`` unless the batch
    state's range already is the merged range (update bins the raw values)."""
    bins_a, bins_b = _check_state(a, name="a"), _check_state(b, name="b")
    xp = array_namespace(a.histogram, b.histogram, xp=xp)
    if bins_a != bins_b:
        raise ValueError(f"a has {bins_a} bins and b has {bins_b}; merge needs the same number of bins")
    up = _check_upsample_rate(upsample_rate)
    with np.errstate(all="ignore"):
        new_min = xp.minimum(a.min_val, b.min_val)
        new_max = xp.maximum(a.max_val, b.max_val)
        hist = _to_range(a, new_min, new_max, up, xp) + _to_range(b, new_min, new_max, up, xp)
        return HistogramState(hist, new_min, new_max)


# ----------------------------------------------------------------------------------------------
# the L2 search


@functools.lru_cache(maxsize=None)
def _walk_tables() -> tuple[np.ndarray, np.ndarray]:
    """The quantile bounds torch's loop visits, in its own Python-float arithmetic:
    ``alpha_a = ((0 + 1e-5) + 1e-5) + ...`` (``a`` times) and ``beta_b = ((1 - 1e-5) - 1e-5) - ...``;
    ``alpha`` rises only as far as ``beta`` falls, so both stop below about 1e5 steps."""
    step = 1e-5
    alphas, betas = [0.0], [1.0]
    while alphas[-1] < 1.0:
        alphas.append(alphas[-1] + step)
    while betas[-1] > 0.0:
        betas.append(betas[-1] - step)
    return np.asarray(alphas, dtype=np.float64), np.asarray(betas, dtype=np.float64)


@functools.lru_cache(maxsize=64)
def _walk_prefix(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``alpha_a`` for ``a in [0, n + 1]`` and ``bmax_a = #{b : alpha_a < beta_b}`` (torch's loop runs at
    ``(a, b)`` iff ``b < bmax_a``)."""
    alphas, betas = _walk_tables()
    a = np.full(n + 2, 2.0)
    a[: min(n + 2, alphas.size)] = alphas[: n + 2]
    bmax = np.searchsorted(-betas, -a, side="left")
    return a, bmax


def _candidates(cs: Array, total: Array, n: int, xp: Any):
    """The sequence of (start, end) bin pairs whose error torch's greedy loop evaluates, in order.

    torch's loop, at state (alpha, beta, start, end), moves ``start`` to the first bin whose cumulative
    count reaches ``(alpha + 1e-5) * total`` or ``end`` to the last one not above ``(beta - 1e-5) *
    total``, whichever moves more (ties move ``end``), and evaluates the error whenever a bound moved.
    Written ``k(a)`` / ``J(b)`` for those bins after ``a`` start and ``b`` end steps, the state after
    ``a``, ``b`` steps is ``(k(a), J(b))``; a start step at ``a`` moves by ``dl_a = k(a+1) - k(a)``, an end
    step by ``dr_b = J(b) - J(b+1)``, and the loop is the merge "take a start step iff dl_a > dr_b". A
    merge of that kind equals the sorted merge of both sequences' prefix minima, so the position of every
    step follows from two ``searchsorted`` calls. The start stops for good at the first ``dl_a == 0``; the
    end moves whenever ``J`` drops. The walk collapses when the bounds meet (the first such step is
    decided with torch's clamps) and ends when ``alpha >= beta``.

    Returns ``(starts, ends, count)``: ``n`` candidates (the first ``count`` are real)."""
    idt = index_dtype(xp)
    dev = _device(cs)
    alphas_np, betas_np = _walk_tables()
    a_np, bmax_np = _walk_prefix(n)
    f32 = xp.float32
    last_b = betas_np.shape[0] - 1
    with _float64_scope(xp):
        t64 = xp.astype(total, xp.float64)
        thr_a = xp.astype(xp.asarray(a_np, device=dev) * t64, f32)  # (alpha * total) compared in float32
        # end side: bin i stays inside while b < bt_i = #{b : float32(beta_b * total) >= cs_i}. beta_b is
        # within 1e-11 of 1 - b * 1e-5, so the count switches within 3 steps of (1 - cs_i / total) * 1e5:
        # only those 7 thresholds are formed and compared.
        c64 = xp.astype(cs, xp.float64)
        est = xp.floor((1.0 - _div(c64, t64, xp)) * 1e5)
        est = xp.where(xp.isfinite(est), est, xp.zeros_like(est))
        base = xp.astype(xp.clip(est - 3.0, 0.0, float(last_b)), idt)
        window = xp.minimum(base[:, None] + xp.arange(7, dtype=idt, device=dev)[None, :], last_b)
        betas = xp.asarray(betas_np, device=dev)
        thr_b = xp.astype(xp.reshape(xp.take(betas, xp.reshape(window, (-1,))), window.shape) * t64, f32)
    inside = (thr_b >= cs[:, None]) & (window - base[:, None] == xp.arange(7, dtype=idt, device=dev)[None, :])
    bt = base + xp.sum(xp.astype(inside, idt), axis=1, dtype=idt)
    bt = xp.where(total > 0, bt, xp.full_like(bt, last_b + 1))
    k = xp.astype(xp.searchsorted(cs, thr_a, side="left"), idt)  # k(a), a in [0, n + 1]
    bt = xp.maximum(bt, xp.ones_like(bt))  # J(0) = n - 1 whatever the sums say; non-increasing in i
    neg_bt = -bt

    def end_after(b: Array) -> Array:  # J(b) = #{i : bt_i > b} - 1
        return xp.astype(xp.searchsorted(neg_bt, -b, side="left"), idt) - 1

    ar = xp.arange(n + 2, dtype=idt, device=dev)
    j_b = end_after(ar)
    dr = _cummin(j_b[:-1] - j_b[1:], xp)  # prefix minima over b in [0, n]
    dl = _cummin(k[1:] - k[:-1], xp)  # over a in [0, n]
    a_star = xp.sum(xp.astype(dl > 0, idt))
    b0 = xp.sum(xp.astype(dr > 0, idt))
    # merge positions: b steps before start step a; start steps before end step b (phase 1: b < b0)
    nb = xp.astype(xp.searchsorted(-dr, -dl, side="right"), idt)  # #{b : dr'_b >= dl'_a}
    big = xp.asarray(4 * n + 8, dtype=idt, device=dev)
    rank_a = xp.where(ar[:-1] < a_star, ar[:-1] + nb, big)  # (n + 1,), increasing
    # end steps: one per run of equal bt (drop of J); ordinal q by increasing b = decreasing i
    first = xp.concat([xp.ones((1,), dtype=xp.bool, device=dev), bt[1:] != bt[:-1]])
    cf = xp.cumulative_sum(xp.astype(first, idt))
    n_end = cf[-1]
    # candidate r: a start step if some rank_a == r, else the (r - #start steps before r)-th end step
    r = ar[:n]
    ia = xp.astype(xp.searchsorted(rank_a, r, side="left"), idt)
    is_a = xp.take(rank_a, xp.minimum(ia, n)) == r
    q = r - ia
    i_end = xp.astype(xp.searchsorted(cf, n_end - q, side="left"), idt)
    i_end = xp.clip(i_end, 0, n - 1)
    b_end = xp.take(bt, i_end) - 1
    y_end = xp.take(dr, xp.clip(b_end, 0, n))
    a_end = xp.where(b_end < b0, xp.astype(xp.searchsorted(-dl, -y_end, side="left"), idt), a_star)
    a_pre = xp.where(is_a, xp.minimum(ia, n), a_end)
    b_pre = xp.where(is_a, xp.take(nb, xp.minimum(ia, n)), b_end)
    s = xp.take(k, a_pre)
    e = end_after(b_pre)
    k_next = xp.take(k, a_pre + 1)
    j_next = end_after(b_pre + 1)
    # the step torch takes, with its clamps l <= end and r >= start (they only bind when the bounds meet)
    cap_r = j_next < s
    cap_l = (k_next > e) & ~cap_r
    to_start = xp.where(cap_l, j_next > s, is_a)
    new_s = xp.where(cap_r, s, xp.where(to_start, xp.minimum(k_next, e), s))
    new_e = xp.where(cap_r, s, xp.where(to_start, e, xp.maximum(j_next, s)))
    exists = is_a | (q < n_end)
    running = b_pre < xp.take(xp.asarray(bmax_np, dtype=idt, device=dev), a_pre)
    live = exists & running & (s < e)
    collapsed = xp.astype(live & (new_s >= new_e), idt)
    before = xp.cumulative_sum(collapsed) - collapsed  # collapses strictly before r
    valid = live & (before == 0)
    count = xp.sum(xp.astype(valid, idt))  # valid is a prefix
    zero = xp.zeros_like(new_s)
    return xp.where(valid, new_s, zero), xp.where(valid, new_e, zero + (n - 1)), count


def _errors(hist: Array, starts: Array, ends: Array, bin_width: Array, dst_nbins: int, xp: Any) -> Array:
    """torch's ``_compute_quantization_error(start, end)`` for each candidate, in torch's float32 order.

    With ``w = (max - min) / bins`` and ``d = w * (end - start + 1) / dst_nbins`` (Python floats), for
    each source bin ``i``: ``b = (i - start) * w``, ``e = b + w``, ``p = clamp(floor(b / d))``,
    ``q = clamp(floor(e / d))``, ``rho = h_i / w``, error ``rho * [((d/2)^3 - (b - (p + 1/2) d)^3) / 3
    + (q - p - 1) * ((d/2)^3 - (-d/2)^3) / 3 + ((e - (q d + d/2))^3 - (-d/2)^3) / 3]``, summed over ``i``;
    0 when ``d == 0``."""
    n = hist.shape[0]
    f32 = xp.float32
    with _float64_scope(xp):
        widths = xp.astype(ends - starts + 1, xp.float64)
        dst64 = _div(bin_width * widths, float(dst_nbins), xp)
        dst = xp.astype(dst64, f32)[:, None]
        half = xp.astype(dst64 / 2, f32)[:, None]
        is_zero = dst64 == 0
        w32 = xp.astype(bin_width, f32)
    neg_half = -half
    top = _scalar(float(dst_nbins - 1), w32, xp)
    zero = _scalar(0.0, w32, xp)
    i = xp.arange(n, dtype=starts.dtype, device=_device(hist))
    begin = rounded(xp.astype(i[None, :] - starts[:, None], f32) * w32, xp)
    end = begin + w32
    p = xp.clip(_floor_div(begin, dst, xp), zero, top)
    q = xp.clip(_floor_div(end, dst, xp), zero, top)
    density = _div(hist, w32, xp)
    half3 = rounded(half * half * half, xp)
    neg_half3 = rounded(neg_half * neg_half * neg_half, xp)
    db = begin - rounded((p + 0.5) * dst, xp)
    norm = rounded(density * _div(half3 - rounded(db * db * db, xp), 3.0, xp), xp)
    norm = norm + rounded(((q - p) - 1) * (density * _div(half3 - neg_half3, 3.0, xp)), xp)
    de = end - (rounded(q * dst, xp) + half)
    norm = norm + rounded(density * _div(rounded(de * de * de, xp) - neg_half3, 3.0, xp), xp)
    total = _sum32(norm, xp)
    return xp.where(is_zero, xp.zeros_like(total), total)


def _block_rows(n: int) -> int:
    return max(1, min(n, (1 << 20) // n))


def _search_bins(hist: Array, min_val: Array, max_val: Array, dst_nbins: int, xp: Any) -> tuple[Array, Array]:
    """(start_bin, end_bin) torch's ``_non_linear_param_search`` ends with, as 0-d index arrays."""
    n = hist.shape[0]
    cs = _cumsum32(hist, xp)
    total = _sum32(hist, xp)
    starts, ends, count = _candidates(cs, total, n, xp)
    with _float64_scope(xp):
        bin_width = _div(xp.astype(max_val, xp.float64) - xp.astype(min_val, xp.float64), float(n), xp)
    rows = _block_rows(n)
    dev = _device(hist)
    if is_jax_namespace(xp):  # possibly traced: evaluate every candidate, no host sync
        errs = xp.concat([_errors(hist, starts[i:i + rows], ends[i:i + rows], bin_width, dst_nbins, xp)
                          for i in range(0, n, rows)])  # fmt: skip
        evaluated = count
    else:  # eager: blocks of growing size until the error rises (one host read per block)
        count_host = int(count)
        blocks, done, block = [], 0, min(4, rows)
        while done < count_host:
            stop = min(count_host, done + block)
            blocks.append(_errors(hist, starts[done:stop], ends[done:stop], bin_width, dst_nbins, xp))
            seq = xp.concat([blocks[-2][-1:], blocks[-1]]) if len(blocks) > 1 else blocks[-1]
            done = stop
            if bool(xp.any(seq[1:] > seq[:-1])):
                break
            block = min(4 * block, rows)
        blocks.append(xp.zeros((n - done,), dtype=xp.float32, device=dev))
        errs = xp.concat(blocks)
        evaluated = done
    idt = starts.dtype
    r = xp.arange(n, dtype=idt, device=dev)
    # torch stops at the first candidate whose error exceeds the previous one (norm > norm_min) and
    # keeps the previous one; without a rise it keeps the last candidate; without candidates (0, n - 1)
    rises = (r[1:] < evaluated) & (errs[1:] > errs[:-1])
    never = xp.full((1,), n, dtype=idt, device=dev)
    first_rise = xp.min(xp.concat([xp.where(rises, r[1:], xp.full_like(r[1:], n)), never]))
    chosen = xp.where(first_rise < n, first_rise - 1, count - 1)
    has = chosen >= 0
    chosen = xp.reshape(xp.maximum(chosen, xp.zeros_like(chosen)), (1,))
    start = xp.where(has, xp.take(starts, chosen)[0], xp.zeros_like(count))
    end = xp.where(has, xp.take(ends, chosen)[0], xp.zeros_like(count) + (n - 1))
    return start, end


def non_linear_param_search(
    histogram: Array, min_val: Array, max_val: Array, /, *, dst_nbins: int, xp: Any = None
) -> tuple[Array, Array]:
    """The clipping range torch's ``HistogramObserver._non_linear_param_search`` picks, without its loop.

    torch walks quantile bounds ``alpha = 1e-5, 2e-5, ...`` and ``beta = 1 - 1e-5, ...`` over the
    cumulative histogram, moving the start or end bin greedily and stopping when the L2 quantization
    error (``dst_nbins`` uniform levels over ``[start, end]``, see ``_errors``) rises. Here the whole
    sequence of visited (start, end) pairs comes from cumulative-sum arithmetic, their errors are
    evaluated in batches, and the stop is a vectorized first-rise search; the result is the pair torch
    picks (same float32 arithmetic; error sums may differ by rounding order on non-torch backends).

    Returns ``(min_val + w * start, min_val + w * (end + 1))`` with ``w = (max_val - min_val) / bins``
    (float32, 0-d). ``histogram`` must be non-negative.
    """
    xp = array_namespace(histogram, min_val, max_val, xp=xp)
    if histogram.ndim != 1 or histogram.shape[0] < 1:
        raise ValueError(f"histogram must have shape (bins,) with bins >= 1, got shape {tuple(histogram.shape)}")
    n = _check_bins(histogram.shape[0], name="histogram.shape[0]")
    for name, arr in (("min_val", min_val), ("max_val", max_val)):
        if arr.ndim != 0:
            raise ValueError(f"{name} must be 0-d, got shape {tuple(arr.shape)}")
    if isinstance(dst_nbins, bool) or not isinstance(dst_nbins, (int, np.integer)) or dst_nbins < 1:
        raise ValueError(f"dst_nbins={dst_nbins!r} must be an int >= 1")
    with np.errstate(all="ignore"):
        hist = xp.astype(histogram, xp.float32)
        lo = xp.astype(min_val, xp.float32)
        hi = xp.astype(max_val, xp.float32)
        start, end = _search_bins(hist, lo, hi, int(dst_nbins), xp)
        width = _div(hi - lo, float(n), xp)
        new_min = lo + rounded(width * xp.astype(start, xp.float32), xp)
        return new_min, lo + rounded(width * xp.astype(end + 1, xp.float32), xp)


def histogram_qparams(state: HistogramState, /, spec: QuantSpec, *, xp: Any = None) -> QParams:
    """torch's ``HistogramObserver.calculate_qparams``: :func:`non_linear_param_search` with
    ``dst_nbins = 2**bits(spec.dtype)``, then :func:`calculate_qparams` on the range found. A state that
    has seen nothing gives ``scale = 1``, ``zero_point = 0`` (torch also warns; adapters do that).
    Per-tensor schemes and integer dtypes only, as in torch."""
    _check_state(state)
    xp = array_namespace(state.histogram, xp=xp)
    if not spec.qscheme.is_per_tensor:
        raise ValueError(f"spec.qscheme={spec.qscheme.value} is not supported; allowed: per_tensor_affine, "
                         "per_tensor_symmetric")  # fmt: skip
    if spec.dtype not in _DST_BITS:
        raise ValueError(f"spec.dtype={spec.dtype} is not supported by the histogram search; allowed: "
                         + ", ".join(_DST_BITS))  # fmt: skip
    new_min, new_max = non_linear_param_search(
        state.histogram, state.min_val, state.max_val, dst_nbins=2 ** _DST_BITS[spec.dtype], xp=xp
    )
    empty = (state.min_val == INF) & (state.max_val == -INF)
    new_min = xp.where(empty, state.min_val, new_min)
    new_max = xp.where(empty, state.max_val, new_max)
    return calculate_qparams(new_min, new_max, spec, xp=xp)
