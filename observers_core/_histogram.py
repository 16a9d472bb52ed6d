"""Histogram statistics of ``HistogramObserver`` (torch.histc binning and the running state), as pure
array functions; the L2 search on the result is in ``_l2_search.py``.

State is data: :class:`HistogramState` is a NamedTuple (a JAX pytree) of a float32 ``(bins,)`` histogram
and 0-d float32 ``min_val``/``max_val`` (``+inf``/``-inf`` until something is seen). Every function is
branch-free over array values (``where`` over all branches, static shapes), so ``histogram_update`` and
``histogram_merge`` run under ``jax.jit``; eager host arrays (NumPy, torch CPU) take the branch they need
and the compiled kernels (``_compiled.py``). The arithmetic reproduces torch 2.13's CPU kernels in float32
and in the same operation order, so states equal torch's bit for bit (see the notes on each function for
the few documented exceptions).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import array_api_compat
import numpy as np

from ._collective import check_collective, reduce_range
from ._compiled import counts_kernel, host_scalar, host_view, numpy_views, rebin_kernel, split_sum, threads
from ._minmax import aminmax
from ._validate import INF, check_bool, check_int
from ._namespace import (
    namespace_of,
    array_namespace,
    bincount,
    bincount_weighted,
    check_real,
    check_same_device,
    divide_by_constant,
    is_finite,
    float64_scope,
    index_dtype,
    is_jax_namespace,
    is_numpy_namespace,
    is_torch_namespace,
    on_host,
    scalar_like,
    size,
    triton_route,
)

__all__ = [
    "HistogramState",
    "histogram",
    "histogram_init",
    "histogram_merge",
    "histogram_update",
    "histogram_update_counting",
]

Array = Any
MAX_BINS = 2**24  # bin indices and counts stay exact in float32 below this
_F32_MAX = float(np.finfo(np.float32).max)
_SCALE = 2.0**-26  # rescales (x - lo) * bins when it would overflow float32 (bins <= 2**24)

# dst_nbins of torch's HistogramObserver: 2 ** torch.iinfo(dtype).bits (quint4x2 is stored in 8 bits).
DST_BITS = {
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


def check_bins(bins: Any, *, name: str = "bins") -> int:
    """``bins`` as an int in ``[1, 2**24]`` (``TypeError``/``ValueError`` naming ``name``)."""
    return check_int(bins, name, minimum=1, maximum=MAX_BINS)


def check_upsample_rate(upsample_rate: Any) -> int:
    """``upsample_rate`` as an int in ``[1, 65536]``."""
    return check_int(upsample_rate, "upsample_rate", minimum=1, maximum=2**16)


def check_state(state: Any, *, name: str = "state") -> int:
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
    return check_bins(hist.shape[0], name=f"{name}.histogram.shape[0]")


def _device(x: Array) -> Any:
    return array_api_compat.device(x)


def true_divide(a: Array, b: Any, xp: Any) -> Array:
    """``a / b`` as IEEE division. XLA (JAX) turns a division by a scalar or a constant into a
    multiplication by the reciprocal, which can be off in the last bit: Python-number divisors go through
    :func:`divide_by_constant`; an array divisor is spread over ``a``'s elements through ``(a == a)``
    (NaN elements stay NaN), which keeps the true division. Plain ``/`` elsewhere."""
    if not hasattr(b, "dtype"):
        return divide_by_constant(a, float(b), xp)
    if is_jax_namespace(xp):
        return a / (b * xp.astype(a == a, b.dtype))
    return a / b


def _fma32(a: Array, m: Array, c: Array, xp: Any) -> Array:
    """``float32(a * m + c)`` rounded once (a fused multiply-add): ``a``, ``c`` float32, ``m`` integral.

    ``a * m`` is exact in float64; the sum is rounded to float64 and its error kept (TwoSum), and the one
    case where rounding twice differs from rounding once (a float32 half-way point) is decided by that
    error's sign."""
    f32, f64 = xp.float32, xp.float64
    with float64_scope(xp):
        p = xp.astype(a, f64) * xp.astype(m, f64)
        c64 = xp.astype(c, f64)
        s = p + c64
        bv = s - p
        err = (p - (s - bv)) + (c64 - bv)
        r = xp.astype(s, f32)
        r64 = xp.astype(r, f64)
        toward = xp.where(s > r64, scalar_like(INF, r, xp), scalar_like(-INF, r, xp))
        r2 = xp.nextafter(r, toward)
        tie = (s == (r64 + xp.astype(r2, f64)) / 2) & (err != 0) & (s != r64)
        fixed = xp.where(err > 0, xp.maximum(r, r2), xp.minimum(r, r2))
        return xp.where(tie, fixed, r)


def _linspace(start: Array, end: Array, steps: int, xp: Any) -> Array:
    """``torch.linspace(start, end, steps)`` in float32 as torch's CPU kernel computes it:
    ``step = (end - start) / (steps - 1)``; element ``i`` is ``start + step * i`` for ``i < steps // 2``
    and ``end - step * (steps - 1 - i)`` otherwise, each a fused multiply-add (x86-64 builds of torch
    contract them; verified bit for bit against torch 2.13; torch's CUDA kernel computes the same, with the
    step divided on the host). Tensors in host memory get ``torch.linspace`` itself; on a GPU it would read
    ``start`` and ``end`` on the host (a synchronisation), so the formula runs there, its step a true
    division by a 0-d tensor (torch's CUDA kernels divide by a Python number as a multiplication by its
    reciprocal)."""
    if is_torch_namespace(xp) and on_host(start, xp):
        import torch  # only reached with torch tensors

        return torch.linspace(start, end, steps, dtype=start.dtype, device=start.device)
    idt = index_dtype(xp)
    if is_torch_namespace(xp):
        step = (end - start) / scalar_like(float(steps - 1), start, xp)
    else:
        step = true_divide(end - start, float(steps - 1), xp)
    i = xp.arange(steps, dtype=idt, device=_device(start))
    lower = i < steps // 2
    m = xp.where(lower, i, steps - 1 - i)
    return _fma32(xp.where(lower, step, -step), m, xp.where(lower, start, end), xp)


# ----------------------------------------------------------------------------------------------
# counting: one native kernel per namespace, one portable fallback


# ----------------------------------------------------------------------------------------------
# torch.histc

def _histc_range(lo: Array, hi: Array, data_lo: Array, data_hi: Array, xp: Any) -> tuple[Array, Array]:
    """torch.histc's outer edges: if ``lo == hi`` use the data's range; if that is a single value ``c``
    too, widen it to ``[min(c - 1, prev(c)), max(c + 1, next(c))]`` (torch >= 2.1's float rule)."""
    degenerate = (lo == hi) & (data_lo <= data_hi)
    lo = xp.where(degenerate, data_lo, lo)
    hi = xp.where(degenerate, data_hi, hi)
    point = lo == hi
    big = scalar_like(float(xp.finfo(lo.dtype).max), lo, xp)
    wide_lo = xp.minimum(xp.nextafter(lo, -big), lo - 1)
    wide_hi = xp.maximum(xp.nextafter(hi, big), hi + 1)
    return xp.where(point, wide_lo, lo), xp.where(point, wide_hi, hi)


def _finite_range(xf: Array, xp: Any) -> tuple[Array, Array]:
    """``(min, max)`` of the finite values of 1-D ``xf`` (``(+inf, -inf)`` if none), one kernel per
    namespace; in host memory a plain min and max first, which is the answer when both are finite."""
    if on_host(xf, xp):
        lo, hi = aminmax(xf, xp=xp)  # the common case first: all finite (a free host check here)
        if math.isfinite(float(lo)) and math.isfinite(float(hi)):
            return lo, hi
    if is_numpy_namespace(xp):
        finite = np.isfinite(xf)
        return (np.asarray(np.min(xf, where=finite, initial=np.inf), dtype=xf.dtype),
                np.asarray(np.max(xf, where=finite, initial=-np.inf), dtype=xf.dtype))  # fmt: skip
    if is_torch_namespace(xp):
        import torch  # only reached with torch tensors

        lo = torch.amin(torch.nan_to_num(xf, nan=INF, posinf=INF, neginf=INF))
        return lo, torch.amax(torch.nan_to_num(xf, nan=-INF, posinf=-INF, neginf=-INF))
    return aminmax(xf, ignore_nonfinite=True, xp=xp)




def _bin_scale(lo: Array, hi: Array, bins: int, xp: Any) -> tuple[Array, Array, Array, Array]:
    """``(half, lo * half, num, den)`` for :func:`_positions` on ``bins`` bins over ``[lo, hi]`` (``lo < hi``
    finite): ``half = 1/2`` where ``hi - lo`` overflows float, else 1; ``num / den = bins / (hi*half - lo*half)``,
    both scaled by ``2**-26`` (exact, same quotient) where ``(hi - lo) * bins`` would overflow."""
    half = xp.where(is_finite(hi - lo, xp), scalar_like(1.0, lo, xp), scalar_like(0.5, lo, xp))
    width = hi * half - lo * half
    over = ~is_finite(width * float(bins), xp)
    num = xp.where(over, scalar_like(bins * _SCALE, lo, xp), scalar_like(float(bins), lo, xp))
    den = xp.where(over, width * _SCALE, width)
    return half, lo * half, num, den


def _positions(v: Array, scale: tuple[Array, Array, Array, Array], xp: Any) -> Array:
    """torch.histc's bin position ``(v - lo) * bins / (hi - lo)`` (before truncation) in ``v``'s float
    arithmetic, as ``(v * half - lo * half) * num / den`` with ``scale`` from :func:`_bin_scale`."""
    half, lo_half, num, den = scale
    return true_divide((v * half - lo_half) * num, den, xp)


def _counts(xf: Array, bins: int, lo: Array, hi: Array, xp: Any, *, bounded: bool) -> Array:
    """Integer counts, length ``bins + 3``: ``[0, bins]`` by torch.histc's bin formula (``bins`` is the value
    ``hi`` itself, folded into the last bin by the caller), ``bins + 1`` NaN, ``bins + 2`` +/-inf and (when
    ``bounded``) values outside ``[lo, hi]``; ``lo < hi`` finite, as :func:`_histc_range` returns them.

    Bin of ``x``: ``trunc((x - lo) * bins / (hi - lo))`` (:func:`_positions`) in ``xf``'s float arithmetic."""
    scale = _bin_scale(lo, hi, bins, xp)
    nan_bin, out_bin = float(bins + 1), float(bins + 2)
    host = host_view(xf, xp)
    if host is not None:
        half, lo_half, num, den = scale
        bounds = (host_scalar(v) for v in (lo, hi, lo_half, half, num, den))
        return xp.asarray(split_sum(counts_kernel, host, threads(host.shape[0]), *bounds, bins, bounded))
    pos = _positions(xf, scale, xp)
    # finite values below lo clip to bin 0 and above hi to out_bin, as the compiled kernel does (when
    # bounded, out_bin below); +inf clips to out_bin, -inf is put there
    pos = xp.where(xp.isnan(pos), nan_bin, xp.where(pos == -INF, out_bin, xp.clip(pos, 0.0, out_bin)))
    if bounded:
        pos = xp.where((xf >= lo) & (xf <= hi) | xp.isnan(xf), pos, out_bin)
    return bincount(xp.astype(pos, index_dtype(xp)), bins + 3, xp)


def _histc(xf: Array, bins: int, lo: Array, hi: Array, xp: Any, *, data: tuple[Array, Array],
           bounded: bool = True, integer: bool = False) -> tuple[Array, Array, Array]:  # fmt: skip
    """``(float counts, number of NaN, number of the other values not counted)`` of ``xf`` (1-D float) in
    ``bins`` equal bins over ``[lo, hi]`` (0-d, ``xf.dtype``), exactly as ``torch.histc``: the value ``hi``
    in the last bin; NaN, +/-inf and values outside ``[lo, hi]`` not counted; ``data`` is the range of the
    finite values of ``xf`` (used when ``lo == hi``). ``bounded=False`` when every finite value is known to lie in ``[lo, hi]``.
    Counted in integers, converted to float at the end (``integer``: left as integers)."""
    lo, hi = _histc_range(lo, hi, data[0], data[1], xp)
    ok = (hi > lo) & is_finite(lo, xp) & is_finite(hi, xp)
    lo = xp.where(ok, lo, scalar_like(0.0, lo, xp))
    hi = xp.where(ok, hi, scalar_like(1.0, hi, xp))
    c = _counts(xf, bins, lo, hi, xp, bounded=bounded)
    last = xp.reshape(c[bins - 1] + c[bins], (1,))
    counts = xp.concat([c[: bins - 1], last])
    counts = xp.where(ok, counts, xp.zeros_like(counts))
    return (counts if integer else xp.astype(counts, xf.dtype)), c[bins + 1], c[bins + 2]


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

    Kernels: a compiled one-pass kernel for NumPy arrays and torch CPU tensors (numba, see
    ``_compiled.py``); otherwise the bin positions are counted by :func:`~observers_core._namespace.bincount`
    (``np.bincount``, ``jnp.bincount(length=)``, ``torch.histc`` on CUDA, a CuPy scatter-add; other
    namespaces sort and count with ``searchsorted``).
    """
    xp = array_namespace(x, xp=xp)
    check_real(x, xp)
    bins = check_bins(bins)
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
    bins = check_bins(bins)
    xp = namespace_of(xp)
    return HistogramState(
        xp.zeros((bins,), dtype=xp.float32, device=device),
        xp.asarray(INF, dtype=xp.float32, device=device),
        xp.asarray(-INF, dtype=xp.float32, device=device),
    )


def _rebin(hist: Array, old_min: Array, old_max: Array, new_min: Array, new_max: Array, up: int, xp: Any) -> Array:
    """torch's ``_upscale_histogram``: split each bin into ``up`` equal parts of ``h / up``, place each part
    by its midpoint ``linspace(old_min, old_max, bins*up + 1)[:-1] + (old_max - old_min) / (2*bins*up)``
    into the new bins ``linspace(new_min, new_max, bins + 1)`` (``bucketize(right=True) - 1``, clamped),
    and add the parts up in order (float32).

    Where ``new_max - new_min`` overflows float32 (a range wider than float32's maximum: torch's
    ``linspace`` gives NaN edges there and its result is undefined), all four bounds are halved first
    (exact), which places every part where torch's formula means it, identically on every path."""
    half = xp.where(is_finite(new_max - new_min, xp), scalar_like(1.0, new_min, xp), scalar_like(0.5, new_min, xp))
    old_min, old_max, new_min, new_max = (v * half for v in (old_min, old_max, new_min, new_max))
    host = host_view(hist, xp)
    if host is not None:
        bounds = (host_scalar(v) for v in (old_min, old_max, new_min, new_max))
        return xp.asarray(rebin_kernel(host, *bounds, up))
    bins = hist.shape[0]
    parts = xp.reshape(xp.broadcast_to(xp.reshape(true_divide(hist, float(up), xp), (bins, 1)), (bins, up)), (-1,))
    part_width = true_divide(old_max - old_min, float(bins * up), xp)
    mids = _linspace(old_min, old_max, bins * up + 1, xp)[:-1] + 0.5 * part_width
    edges = _linspace(new_min, new_max, bins + 1, xp)
    idx = xp.searchsorted(edges, mids, side="right") - 1
    idx = xp.clip(idx, 0, bins - 1)
    return bincount_weighted(idx, parts, bins, xp)


# ----------------------------------------------------------------------------------------------
# float32 sums in torch's CPU order (the histogram's total, here and in the L2 search)


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


def sum32(v: Array, xp: Any) -> Array:
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


def _numpy_namespace() -> Any:
    import array_api_compat.numpy  # the namespace array_namespace gives NumPy arrays

    return array_api_compat.numpy


def _point_mass(hist: Array, c: Array, new_min: Array, new_max: Array, xp: Any) -> Array:
    """``sum(hist)`` (torch's order, :func:`sum32`) in the bin of the single value ``c`` on ``[new_min, new_max]``
    (``torch.histc(c) * sum``; ``new_min < new_max`` finite, ``c`` between them), zeros elsewhere (also for a NaN range)."""
    bins = hist.shape[0]
    position = _positions(c, _bin_scale(new_min, new_max, bins, xp), xp)  # in [0, bins]
    index = xp.clip(xp.floor(position), 0.0, float(bins - 1))  # c = new_max (position bins): the last bin
    onehot = xp.arange(bins, dtype=hist.dtype, device=_device(hist)) == index
    return xp.where(onehot, sum32(hist, xp), xp.zeros_like(hist))


def _to_range(state: HistogramState, new_min: Array, new_max: Array, up: int, xp: Any) -> Array:
    """``state.histogram`` moved onto ``[new_min, new_max]`` (which contains the state's range) the way
    torch's ``_combine_histograms`` does: unchanged on the same range; all of it in the bin of the single
    value when ``min_val == max_val``; re-binned through ``up`` sub-bins otherwise; zeros when empty."""
    hist, old_min, old_max = state
    empty = (old_min == INF) | (old_max == -INF)
    same = (old_min == new_min) & (old_max == new_max)
    point = (old_min == old_max) & ~same
    if on_host(hist, xp):  # eager, and reading a flag is free: compute only the branch taken
        if bool(empty):
            return xp.zeros_like(hist)
        if bool(same):
            return hist
        if bool(point):
            return _point_mass(hist, old_min, new_min, new_max, xp)
        return _rebin(hist, old_min, old_max, new_min, new_max, up, xp)
    # every branch is computed (jit, devices); the unused ones get harmless finite inputs
    rebin = ~(empty | same | point)
    zero, one = scalar_like(0.0, old_min, xp), scalar_like(1.0, old_min, xp)
    lo = xp.where(rebin, old_min, zero)
    hi = xp.where(rebin, old_max, one)
    nlo = xp.where(rebin, new_min, zero)
    nhi = xp.where(rebin, new_max, one)
    rebinned = _rebin(hist, lo, hi, nlo, nhi, up, xp)
    at_point = _point_mass(hist, xp.where(point, old_min, zero), xp.where(point, new_min, zero),
                           xp.where(point, new_max, one), xp)  # fmt: skip
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
    collective: Any = None,
) -> HistogramState:
    """One ``HistogramObserver.forward`` (torch >= 2.5): the state after also seeing ``x`` (with a
    :class:`~observers_core.Collective`, every member's ``x``: see :func:`histogram_update_counting`).

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
    return histogram_update_counting(state, x, upsample_rate=upsample_rate, ignore_nonfinite=ignore_nonfinite,
                                     xp=xp, collective=collective)[0]  # fmt: skip


def histogram_update_counting(
    state: HistogramState,
    x: Array,
    /,
    *,
    upsample_rate: int = 16,
    ignore_nonfinite: bool = False,
    xp: Any = None,
    collective: Any = None,
) -> tuple[HistogramState, Array]:
    """:func:`histogram_update`, plus ``[number of +/-inf, number of NaN]`` in ``x`` (1-D integer array),
    counted while binning: what an adapter needs for torch's warnings without another pass over ``x``.

    With a :class:`~observers_core.Collective` the batch is every member's: the members agree on the
    batch's range first (min/max), bin their own values on the new range and sum the integer counts
    (and the inf/NaN counts), so each ends with the state of one update on the concatenated batch."""
    bins = check_state(state)
    up = check_upsample_rate(upsample_rate)
    ignore_nonfinite = check_bool(ignore_nonfinite, "ignore_nonfinite")
    xp = array_namespace(state.histogram, xp=xp)
    check_real(x, xp)
    check_same_device(x, state.histogram, xp)
    if check_collective(collective) is None and size(x) == 0:
        return state, xp.zeros(2, dtype=index_dtype(xp), device=_device(state.histogram))
    if collective is None and bins * up <= MAX_BINS and triton_route(state.histogram, x, xp=xp):  # torch CUDA:
        # three fused kernels (sub-bin indices exact in float32 and int32)
        from . import _triton_kernels

        new, nonfinite = _triton_kernels.histogram_update(*state, x, up=up, ignore_nonfinite=ignore_nonfinite)
        return HistogramState(*new), nonfinite
    views = numpy_views(xp, *state, x)
    if views is not None:  # torch CPU: run as NumPy, hand torch tensors back
        import torch  # only reached with torch tensors

        out, nonfinite = _update_counting(HistogramState(*views[:3]), views[3], bins, up, ignore_nonfinite,
                                          _numpy_namespace(), collective)
        return HistogramState(*(torch.from_numpy(np.asarray(a)) for a in out)), torch.from_numpy(nonfinite)
    return _update_counting(state, x, bins, up, ignore_nonfinite, xp, collective)


def _update_counting(state: HistogramState, x: Array, bins: int, up: int, ignore_nonfinite: bool, xp: Any,
                     collective: Any) -> tuple[HistogramState, Array]:
    """:func:`histogram_update_counting` after its checks (``bins``: the state's; ``up``: the upsample rate)."""
    with np.errstate(all="ignore"):
        xf = xp.astype(xp.reshape(x, (-1,)), xp.float32, copy=False)
        host = host_view(xf, xp) if is_numpy_namespace(xp) and collective is None and size(xf) > 0 else None
        if host is not None:
            return _update_on_host(state, host, bins, up, ignore_nonfinite, xp)
        if size(xf) == 0:  # only with a collective: this member contributes nothing
            x_lo, x_hi = scalar_like(INF, state.min_val, xp), scalar_like(-INF, state.min_val, xp)
        else:
            x_lo, x_hi = _finite_range(xf, xp)
        x_lo, x_hi = reduce_range(x_lo, x_hi, collective)
        poisoned = xp.isnan(state.min_val) | xp.isnan(state.max_val)  # kept as is; x binned for its counts
        fresh = (state.min_val == INF) | (state.max_val == -INF) | poisoned
        new_min = xp.where(fresh, x_lo, xp.minimum(state.min_val, x_lo))
        new_max = xp.where(fresh, x_hi, xp.maximum(state.max_val, x_hi))
        # every finite value lies in [new_min, new_max]: no bounds check needed, so the counts' last
        # entry holds the +/-inf
        batch, nans, infs = _histc(xf, bins, new_min, new_max, xp, data=(x_lo, x_hi), bounded=False,
                                   integer=collective is not None)
        if collective is not None:  # one sum for the counts and the NaN/inf tallies
            summed = collective.sum(xp.concat([batch, xp.reshape(xp.astype(nans, batch.dtype), (1,)),
                                               xp.reshape(xp.astype(infs, batch.dtype), (1,))]))
            batch, nans, infs = xp.astype(summed[:bins], xf.dtype), summed[bins], summed[bins + 1]
        hist = batch + _to_range(state, new_min, new_max, up, xp)
        seen = x_lo <= x_hi
        hist = xp.where(seen, hist, state.histogram)
        new_min = xp.where(seen, new_min, state.min_val)
        new_max = xp.where(seen, new_max, state.max_val)
        if not ignore_nonfinite:
            poisoned = poisoned | (nans > 0)
        nan = scalar_like(float("nan"), new_min, xp)
        new = HistogramState(
            xp.where(poisoned, state.histogram, hist),
            xp.where(poisoned, nan, new_min),
            xp.where(poisoned, nan, new_max),
        )
        return new, xp.stack([infs, nans])


def _update_on_host(state: HistogramState, host: np.ndarray, bins: int, up: int, ignore_nonfinite: bool,
                    xp: Any) -> tuple[HistogramState, np.ndarray]:
    """:func:`histogram_update_counting` of a non-empty float32 NumPy ``host`` without a collective: the array
    code's float32 operations on NumPy scalars, each branch decided in Python (the array code computes
    every branch with ``where`` on 0-d arrays: about a hundred NumPy calls of a few microseconds each, the
    larger part of an update of a small tensor). Same bits (tests/test_device_path_on_cpu.py)."""
    f32 = np.float32
    old_min, old_max = f32(state.min_val), f32(state.max_val)
    x_lo, x_hi = host.min(), host.max()
    if not (np.isfinite(x_lo) and np.isfinite(x_hi)):
        x_lo, x_hi = (f32(v) for v in _finite_range(host, xp))
    poisoned = bool(np.isnan(old_min) or np.isnan(old_max))
    fresh = poisoned or old_min == INF or old_max == -INF
    new_min = x_lo if fresh else np.minimum(old_min, x_lo)
    new_max = x_hi if fresh else np.maximum(old_max, x_hi)
    lo, hi = new_min, new_max  # _histc_range, _histc's check and _bin_scale, branch by branch
    if lo == hi and x_lo <= x_hi:
        lo, hi = x_lo, x_hi
    if lo == hi:
        big = f32(_F32_MAX)
        lo, hi = np.minimum(np.nextafter(lo, -big), lo - 1), np.maximum(np.nextafter(hi, big), hi + 1)
    ok = bool(hi > lo and np.isfinite(lo) and np.isfinite(hi))
    if not ok:
        lo, hi = f32(0.0), f32(1.0)
    half = f32(1.0) if np.isfinite(hi - lo) else f32(0.5)
    width = hi * half - lo * half
    num, den = (f32(bins * _SCALE), width * f32(_SCALE)) if not np.isfinite(width * f32(bins)) else (f32(bins), width)
    c = split_sum(counts_kernel, host, threads(host.shape[0]), lo, hi, lo * half, half, num, den, bins, False)
    nonfinite = c[[bins + 2, bins + 1]]
    if poisoned or (not ignore_nonfinite and c[bins + 1] > 0):
        nan = np.asarray(np.nan, dtype=np.float32)
        return HistogramState(np.array(state.histogram), nan, nan.copy()), nonfinite
    if not x_lo <= x_hi:  # nothing finite in the batch
        return HistogramState(*(np.array(a) for a in state)), nonfinite
    batch = np.zeros(bins, dtype=np.float32)
    if ok:  # the value hi itself (position bins) goes into the last bin
        batch[:bins - 1], batch[bins - 1] = c[:bins - 1], c[bins - 1] + c[bins]
    new_min, new_max = np.asarray(new_min), np.asarray(new_max)
    return HistogramState(batch + _to_range(state, new_min, new_max, up, xp), new_min, new_max), nonfinite


def histogram_merge(a: HistogramState, b: HistogramState, /, *, upsample_rate: int = 16, xp: Any = None) -> HistogramState:
    """Two states on possibly different ranges as one over ``[min(a.min, b.min), max(a.max, b.max)]``:
    each histogram moved onto that range as :func:`histogram_update` moves the old one, then added.
    Commutative, with :func:`histogram_init` as identity; re-binning is lossy, so it is associative only
    up to that loss, and ``merge(a, batch state)`` differs from ``update(a, batch)`` unless the batch
    state's range already is the merged range (update bins the raw values). A NaN-poisoned side (NaN
    ``min_val``/``max_val``, see :func:`histogram_update`) poisons the result: NaN range, and the two
    histograms added bin by bin (no range to move them onto; the total count is kept)."""
    bins_a, bins_b = check_state(a, name="a"), check_state(b, name="b")
    xp = array_namespace(a.histogram, b.histogram, xp=xp)
    if bins_a != bins_b:
        raise ValueError(f"a has {bins_a} bins and b has {bins_b}; merge needs the same number of bins")
    up = check_upsample_rate(upsample_rate)
    with np.errstate(all="ignore"):
        new_min = xp.minimum(a.min_val, b.min_val)
        new_max = xp.maximum(a.max_val, b.max_val)
        hist = _to_range(a, new_min, new_max, up, xp) + _to_range(b, new_min, new_max, up, xp)
        poisoned = xp.isnan(new_min) | xp.isnan(new_max)
        return HistogramState(xp.where(poisoned, a.histogram + b.histogram, hist), new_min, new_max)
