"""Histogram calibration searches (KL/entropy, MSE, percentile) and a histogram state to feed them.

Every search is a pure function of a histogram: ``hist`` holds the counts, shape ``(bins,)`` for one
tensor or ``(..., bins)`` with leading channel dimensions, and ``edges`` its ``bins + 1`` bin edges,
shape ``(bins + 1,)`` (shared by all channels) or ``hist.shape[:-1] + (bins + 1,)``. Every candidate
threshold is evaluated at once (closed forms over prefix sums; no Python loop over candidates), so
the searches run under ``jax.jit`` and on GPUs. Arithmetic is float64 where the namespace has it
(numpy, torch, cupy, array_api_strict, JAX with x64) and float32 otherwise (JAX by default), where
near-ties may resolve differently. Thresholds come back in the dtype of ``edges``.

Counts must be >= 0 (the searches cannot check data under ``jit``); a NaN or Inf count makes that
channel's threshold NaN.

The histogram state (:class:`CalibHistogram`) counts values on a power-of-two grid, bin width
``w = 2**e`` and first edge ``lo = n * w``: a value's bin ``floor(x / w) - n`` is exact, a growing
range re-bins the old counts exactly (``2**k`` old bins per new bin), and two states merge exactly
and associatively, so batches, devices and hosts combine in any order.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Callable, NamedTuple

import numpy as np
from array_api_compat import device as _device

from ._collective import check_collective, reduce_range
from ._compiled import (
    calib_counts_kernel, gather_sums_kernel, grid_kernel, host_arrays, host_view, kl_curve_kernel, kl_log_inputs_kernel, mse_level_errors_kernel,
    mse_prepare_kernel, percentile_rows_kernel, pick_kernel, split_ranges, split_sum, threads,
)
from ._dtypes import QScheme, QuantSpec
from ._minmax import host_finite_range
from ._histogram import MAX_BINS
from ._validate import INF, check_bool, check_float, check_int
from ._namespace import (
    namespace_of,
    channel_rows,
    array_namespace,
    bincount,
    check_real,
    check_same_device,
    clamp,
    device_constant,
    discarded_invalid,
    from_host,
    index_dtype,
    is_cupy_namespace,
    is_finite,
    is_jax_namespace,
    is_torch_namespace,
    is_traced,
    midpoint,
    read_flags,
    normalize_axis,
    on_host,
    work_dtype,
    size,
    take,
)
from ._qparams import calculate_qparams
from ._quantize import fake_quantize

__all__ = [
    "CalibHistogram",
    "SearchCurve",
    "calib_histogram_edges",
    "calib_histogram_init",
    "calib_histogram_merge",
    "calib_histogram_update",
    "histogram_quantization_error",
    "kl_divergences",
    "kl_threshold",
    "mse_errors",
    "mse_threshold",
    "percentile_range",
]

Array = Any
#: Most intermediate elements one channel chunk of a search materialises (bounds peak memory).
_CHUNK_ELEMENTS = 1 << 22
#: The same bound on an eager GPU (torch CUDA, CuPy), where each chunk costs tens of kernel launches: on an
#: H200, per-channel MSE forwards of (64, 4096) with 4096 channels took 257 ms at 2**22 and 61 ms at 2**24
#: (H200, 2026-11-26, commit f04c117: `git log -p benchmarks/RESULTS.md`); temporaries of up to 2**24 elements each.
_DEVICE_CHUNK_ELEMENTS = 1 << 24


class SearchCurve(NamedTuple):
    """Every candidate of a search.

    ``index`` (K,): the candidate's bin index (static); ``threshold`` (..., K): its clipping
    threshold; ``objective`` (..., K): the value the search minimises.
    """

    index: Array
    threshold: Array
    objective: Array


# ----------------------------------------------------------------------------------------------
# Validation and shared plumbing
# ----------------------------------------------------------------------------------------------




def _check_ties(ties: Any) -> str:
    if ties not in ("first", "last"):
        raise ValueError(f"ties={ties!r} is not allowed; allowed: 'first' (smallest threshold), 'last' (largest)")
    return ties


def _default_tie_tol(xp: Any, dtype: Any) -> float:
    """2**-40 in float64 arithmetic, 2**-16 in float32 (a few hundred ulps of the accumulated sums)."""
    return 2.0**-40 if dtype == xp.float64 else 2.0**-16


class _Hist(NamedTuple):
    counts: Array  # (C, B), work dtype
    out_edges: Array  # (C, B + 1), the caller's edges (exact) in the output dtype (a broadcast view)
    lead: tuple  # leading (channel) shape of the results
    dtype: Any  # work dtype
    device: Any

    def edges(self, xp: Any) -> Array:
        """The edges (C, B + 1) in the work dtype."""
        return xp.astype(self.out_edges, self.dtype, copy=False)


def check_hist_values(hist: Array, edges: Array, xp: Any) -> None:
    """``ValueError`` unless the counts are finite and ``>= 0`` and the edges finite and non-decreasing.

    Eager arrays only (one host read of two flags); under ``jax.jit`` nothing is checked. The searches
    call it unless ``check=False`` (an observer's own histogram is valid by construction); with
    ``check=False`` an invalid histogram gives an unspecified result or error."""
    if is_traced(hist, edges):
        return
    with discarded_invalid(xp):
        edge_rows = xp.reshape(edges, (-1, edges.shape[-1]))
        flags = xp.stack([
            xp.all((hist >= 0) & xp.isfinite(xp.astype(hist, xp.float64 if hist.dtype == xp.float64 else xp.float32))),
            xp.all(xp.isfinite(edge_rows)) & xp.all(edge_rows[:, 1:] >= edge_rows[:, :-1]),
        ])
    _raise_unless(*read_flags(flags))


def _raise_unless(counts_ok: bool, edges_ok: bool) -> None:
    """The errors of :func:`check_hist_values` (the host fast paths compute the same two flags)."""
    if not counts_ok:
        raise ValueError("hist must hold finite counts >= 0 (no negative, NaN or infinite count)")
    if not edges_ok:
        raise ValueError("edges must be finite and non-decreasing")


def _hist_shape(hist: Array, edges: Array, xp: Any, real: bool = False) -> tuple[int, tuple]:
    """``(bins, leading shape)`` of a histogram; ``TypeError``/``ValueError`` for wrong dtypes or shapes
    (``real``: the dtypes are known to be real, integer or floating)."""
    if not real:
        check_real(hist, xp, name="hist")
        check_real(edges, xp, name="edges")
    if hist.ndim < 1 or hist.shape[-1] < 1:
        raise ValueError(f"hist must have shape (..., bins) with bins >= 1, got shape {tuple(hist.shape)}")
    bins = hist.shape[-1]
    lead = tuple(hist.shape[:-1])
    if edges.ndim < 1 or edges.shape[-1] != bins + 1 or (edges.ndim > 1 and tuple(edges.shape[:-1]) != lead):
        raise ValueError(
            f"edges must have shape ({bins + 1},) or {lead + (bins + 1,)} for hist of shape "
            f"{tuple(hist.shape)}, got {tuple(edges.shape)}"
        )
    return bins, lead


def _prepare(hist: Array, edges: Array, xp: Any, check: bool = True) -> _Hist:
    """Validate a histogram: counts as ``(C, B)`` in the work dtype, edges as a ``(C, B + 1)`` view."""
    bins, lead = _hist_shape(hist, edges, xp)
    if check_bool(check, "check"):
        check_hist_values(hist, edges, xp)
    device = _device(hist)
    dtype = work_dtype(xp, device)
    channels = math.prod(lead)
    counts = xp.reshape(xp.astype(hist, dtype, copy=False), (channels, bins))
    out_dtype = edges.dtype if xp.isdtype(edges.dtype, "real floating") else dtype
    out_edges = xp.reshape(xp.astype(edges, out_dtype, copy=False), (-1, bins + 1))
    out_edges = xp.broadcast_to(out_edges, (channels, bins + 1))
    return _Hist(counts, out_edges, lead, dtype, device)


def _index_array(table: np.ndarray, xp: Any, device: Any) -> Array:
    """A static (shape-only) NumPy integer table as an index array of the namespace."""
    np_dtype = np.int64 if index_dtype(xp) == xp.int64 else np.int32
    return device_constant(np.ascontiguousarray(table, dtype=np_dtype), xp, device)


def _take_shared(table: Array, index: Array, xp: Any) -> Array:
    """``table[c, index]`` for every channel: ``table`` (C, N), ``index`` any shape -> (C, *index.shape)."""
    out = take(table, xp.reshape(index, (-1,)), -1, xp)
    return xp.reshape(out, (table.shape[0],) + tuple(index.shape))


def _take_each(table: Array, index: Array, xp: Any) -> Array:
    """``table[c, index[c, ...]]``: ``table`` (C, N), ``index`` (C, ...) -> (C, ...)."""
    channels, n = table.shape
    if channels == 1:
        return xp.reshape(take(table[0, :], xp.reshape(index, (-1,)), 0, xp), tuple(index.shape))
    offsets = xp.arange(channels, dtype=index.dtype, device=_device(table)) * n
    flat = index + xp.reshape(offsets, (channels,) + (1,) * (index.ndim - 1))
    out = take(xp.reshape(table, (-1,)), xp.reshape(flat, (-1,)), 0, xp)
    return xp.reshape(out, tuple(index.shape))


def _chunk_elements(x: Array, xp: Any) -> int:
    """The chunk bound for ``x``: ``_DEVICE_CHUNK_ELEMENTS`` on an eager GPU (torch CUDA, CuPy), else
    ``_CHUNK_ELEMENTS`` (host memory, JAX, array_api_strict)."""
    eager_gpu = (is_torch_namespace(xp) or is_cupy_namespace(xp)) and not on_host(x, xp)
    return _DEVICE_CHUNK_ELEMENTS if eager_gpu else _CHUNK_ELEMENTS


def _by_channel_chunks(fn: Any, per_channel: int, xp: Any, *arrays: Array) -> Array:
    """``fn(*arrays)`` on slices of the channel axis that each hold at most :func:`_chunk_elements`
    intermediate elements (a static loop over chunks, never over candidates), concatenated."""
    channels = arrays[0].shape[0]
    step = max(1, _chunk_elements(arrays[0], xp) // max(per_channel, 1))
    if step >= channels:
        return fn(*arrays)
    parts = [fn(*(a[c : c + step, ...] for a in arrays)) for c in range(0, channels, step)]
    return xp.concat(parts, axis=0)


def _channel_chunks(fn: Any, per_channel: int, xp: Any, *arrays: Array) -> Array:
    """:func:`_by_channel_chunks`, on JAX as one ``lax.map`` over equal chunks (the channels padded with
    copies of the last): one compiled body instead of one per chunk (256 channels of the float32 MSE level
    sums: 32 chunks, ~30 s to compile)."""
    channels = arrays[0].shape[0]
    step = max(1, _CHUNK_ELEMENTS // max(per_channel, 1))  # (JAX: not an eager GPU framework)
    if step >= channels or not is_jax_namespace(xp):
        return _by_channel_chunks(fn, per_channel, xp, *arrays)
    import jax

    chunks = -(-channels // step)
    pad = chunks * step - channels

    def split(a: Array) -> Array:
        if pad:
            a = xp.concat([a, xp.broadcast_to(a[-1:, ...], (pad,) + tuple(a.shape[1:]))], axis=0)
        return xp.reshape(a, (chunks, step) + tuple(a.shape[1:]))

    out = jax.lax.map(lambda parts: fn(*parts), tuple(split(a) for a in arrays))
    return xp.reshape(out, (chunks * step,) + tuple(out.shape[2:]))[:channels, ...]


def _pick(objective: Array, slack: Callable[[Array], Any], ties: str, xp: Any) -> Array:
    """Index (C,) of the best candidate of ``objective`` (C, K): every candidate within
    ``slack(minimum)`` of the minimum ties with it; ``ties="last"`` takes the largest index among them, ``"first"`` the
    smallest. All ``+inf``: every candidate ties."""
    best = xp.min(objective, axis=-1, keepdims=True)
    near = xp.astype(objective <= best + slack(best), xp.int8)
    if ties == "first":
        return xp.argmax(near, axis=-1)
    return (objective.shape[-1] - 1) - xp.argmax(xp.flip(near, axis=-1), axis=-1)


def _pick_host(objective: Array, tol: float, slack: np.ndarray | None, ties: str, xp: Any) -> np.ndarray | None:
    """:func:`_pick` of a host float64 NumPy ``objective`` (C, K) by :func:`~observers_core._compiled.pick_kernel`
    (the same comparisons, one call instead of ten), with the slack ``tol`` (``slack`` None, KL's) or
    ``tol * best + slack[c]`` (MSE's); ``None`` where it does not apply (kernels off, other arrays)."""
    views = host_arrays(pick_kernel, xp, objective, dtype=np.float64)
    if views is None or views[0].ndim != 2 or views[0].shape[1] == 0:
        return None
    values = views[0]
    out = np.empty(values.shape[0], dtype=np.int64)
    relative = slack is not None
    pick_kernel(np.ascontiguousarray(values), float(tol), slack if relative else np.zeros(values.shape[0]), relative,
                ties == "last", out)
    return out


def _select(values: Array, index: Array, xp: Any) -> Array:
    """``values[c, index[c]]``: ``values`` (C, K), ``index`` (C,) -> (C,)."""
    index = xp.reshape(xp.astype(index, index_dtype(xp)), (-1, 1))
    return _take_each(values, index, xp)[:, 0]


def _xlogx(x: Array, xp: Any) -> Array:
    """``x log x`` with ``0 log 0 = 0``."""
    positive = x > 0
    return xp.where(positive, x * xp.log(xp.where(positive, x, 1.0)), 0.0)


def _cumsum0(x: Array, xp: Any) -> Array:
    """Prefix sums along the last axis with a leading 0: ``S[..., j] = sum(x[..., :j])``."""
    return xp.cumulative_sum(x, axis=-1, include_initial=True)


def _shaped(values: Array, h: _Hist, xp: Any) -> Array:
    """(C, ...) results back to the histogram's leading shape."""
    return xp.reshape(values, h.lead + tuple(values.shape[1:]))


def _result(threshold: Array, h: _Hist, xp: Any) -> Array:
    """A per-channel threshold (C,) in the histogram's leading shape; NaN where the counts are not
    all finite (a NaN or Inf count poisons the search, as NaN data poisons a min/max observer)."""
    broken = ~xp.isfinite(xp.sum(h.counts, axis=-1))
    return _shaped(xp.where(broken, xp.full_like(threshold, float("nan")), threshold), h, xp)


# ----------------------------------------------------------------------------------------------
# KL divergence (entropy) search: the TensorRT algorithm, as ModelOpt's _compute_amax_entropy
# ----------------------------------------------------------------------------------------------


def _levels(num_bits: int, unsigned: bool, num_levels: int | None) -> int:
    check_int(num_bits, "num_bits", minimum=1, maximum=62)
    unsigned = check_bool(unsigned, "unsigned")
    if num_levels is None:
        return 1 << (num_bits - 1 + int(unsigned))
    return check_int(num_levels, "num_levels", minimum=1)


@functools.lru_cache(maxsize=32)
def _kl_tables(bins: int, start: int, stride: int, levels: int) -> tuple[np.ndarray, ...]:
    """Static tables of the candidates ``i = start, start + stride, ..., <= bins`` (bins kept):
    ``i``, group boundaries ``ceil(g * i / levels)`` (K, levels + 1), and, flattened over
    (K, levels), each group's first and end bins."""
    i = np.arange(start, bins + 1, stride, dtype=np.int64)
    g = np.arange(levels + 1, dtype=np.int64)
    bounds = (g[None, :] * i[:, None] + levels - 1) // levels
    first = np.ascontiguousarray(bounds[:, :-1]).reshape(-1)
    end = np.ascontiguousarray(bounds[:, 1:]).reshape(-1)
    return i, bounds, first, end


@functools.lru_cache(maxsize=32)
def _kl_ranges(bins: int, start: int, stride: int, levels: int) -> tuple[np.ndarray, ...]:
    """The distinct bin ranges ``[first, end)`` among all candidates' groups (``U``; 18748 of the
    245888 groups for 2048 bins and 128 levels), the range of each group (K * levels,) and that of
    each candidate's last kept bin's group ``floor((i - 1) * levels / i)`` (K,)."""
    i, _, first, end = _kl_tables(bins, start, stride, levels)
    keys, group_range = np.unique(first * (bins + 1) + end, return_inverse=True)
    last_group = np.arange(i.size, dtype=np.int64) * levels + ((i - 1) * levels) // i
    return keys // (bins + 1), keys % (bins + 1), group_range.reshape(-1), group_range.reshape(-1)[last_group]


@functools.lru_cache(maxsize=8)
def _kl_dense_tables(bins: int, start: int, stride: int, levels: int) -> np.ndarray:
    """Position of each (candidate, bin) in the flattened (K, levels + 1) group table: the bin's group
    ``floor(j * levels / i)`` for kept bins ``j < i``, the all-zero column ``levels`` otherwise."""
    i = np.arange(start, bins + 1, stride, dtype=np.int64)[:, None]
    j = np.arange(bins, dtype=np.int64)[None, :]
    group = np.where(j < i, (j * levels) // np.maximum(i, 1), levels)
    return np.arange(i.shape[0], dtype=np.int64)[:, None] * (levels + 1) + group


def _kl_groups(cs: Array, nz: Array, first: Array, end: Array, xp: Any) -> tuple[Array, Array]:
    """Count ``G`` and non-empty bins ``n`` of every group of every candidate, (C, K * levels), from
    the prefix sums ``cs``/``nz`` (C, B + 1) and the groups' flattened bin ranges ``[first, end)``."""
    g_count = _take_shared(cs, end, xp) - _take_shared(cs, first, xp)
    g_nonzero = _take_shared(nz, end, xp) - _take_shared(nz, first, xp)
    return g_count, g_nonzero


def _kl_strict(b: Array, key: tuple, xp: Any, device: Any) -> Array:
    """KL(P || Q) of every candidate in closed form, O(levels) work per candidate.

    With ``T = sum(b)``, kept mass ``C_i = sum(b[:i])``, tail ``t_i = T - C_i``, ``l = i - 1`` the last
    kept bin, and the groups ``g`` of the kept bins holding ``G_g`` counts over ``n_g`` non-empty bins
    (so ``Q_j = G_g / n_g`` on non-empty bins), ``P`` = ``b[:i]`` with ``t_i`` added to ``b_l``:
    ``KL_i = (sum_{j<l} b_j log b_j + (b_l + t_i) log(b_l + t_i) - sum_g G_g log(G_g / n_g)
    - [b_l > 0] t_i log(G_g(l) / n_g(l))) / T - log T + log C_i``.
    ``+inf`` where ``P > 0 = Q`` (the tail lands on an empty last bin), ``C_i = 0`` or ``T = 0``.
    ``G_g log(G_g / n_g)`` is computed once per distinct bin range (:func:`_kl_ranges`). Host float64
    NumPy counts go through :func:`_kl_strict_host` (the same bits).
    """
    fast = _kl_strict_host(b, key, xp)
    if fast is not None:
        return fast
    cand_np = _kl_tables(*key)[0]
    levels, count = key[3], cand_np.size
    first_np, end_np, group_range_np, last_range_np = _kl_ranges(*key)
    first, end = _index_array(first_np, xp, device), _index_array(end_np, xp, device)
    group_range, last_range = _index_array(group_range_np, xp, device), _index_array(last_range_np, xp, device)
    tiny = float(np.finfo(np.float64 if b.dtype == xp.float64 else np.float32).tiny)

    cs = _cumsum0(b, xp)
    nz = _cumsum0(xp.astype(b > 0, b.dtype), xp)

    def group_terms(cs_c: Array, nz_c: Array) -> Array:
        g_count, g_nonzero = _kl_groups(cs_c, nz_c, first, end, xp)  # (C, U)
        # log(G / n) where G > 0 (then n >= 1); an empty group's term G log(...) is 0 * finite.
        log_q = xp.log(clamp(g_count, tiny, None, xp)) - xp.log(clamp(g_nonzero, 1.0, None, xp))
        terms = g_count * log_q
        if host_arrays(gather_sums_kernel, xp, terms, dtype=np.float64) is not None:
            sum_glog = gather_sums_kernel(terms, group_range, levels)  # NumPy's sums, no (C, K, levels) temporary
        else:
            sum_glog = xp.sum(xp.reshape(_take_shared(terms, group_range, xp), (-1, count, levels)), axis=-1)
        return xp.stack([sum_glog, _take_shared(log_q, last_range, xp)], axis=-1)

    terms = _by_channel_chunks(group_terms, count * levels, xp, cs, nz)
    sum_glog, last_log_q = terms[..., 0], terms[..., 1]

    cand = _index_array(cand_np, xp, device)
    last = cand - 1
    total = cs[:, -1:]
    kept = _take_shared(cs, cand, xp)
    tail = total - kept
    b_last = _take_shared(b, last, xp)
    p_log_p = _take_shared(_cumsum0(_xlogx(b, xp), xp), last, xp) + _xlogx(b_last + tail, xp)
    p_log_q = sum_glog + xp.where(b_last > 0, tail * last_log_q, 0.0)
    safe_total = xp.where(total > 0, total, 1.0)
    kl = (p_log_p - p_log_q) / safe_total - xp.log(safe_total) + xp.log(xp.where(kept > 0, kept, 1.0))
    invalid = (total <= 0) | (kept <= 0) | ((b_last <= 0) & (tail > 0))
    return xp.where(invalid, INF, clamp(kl, 0.0, None, xp))


@functools.lru_cache(maxsize=8)
def _log_counts(bins: int) -> np.ndarray:
    """NumPy's log of ``max(n, 1)`` for ``n = 0 .. bins``, a contiguous float64 table (read-only)."""
    table = np.log(np.maximum(np.arange(bins + 1, dtype=np.float64), 1.0))
    table.flags.writeable = False
    return table


def _kl_strict_host(b: Array, key: tuple, xp: Any) -> np.ndarray | None:
    """:func:`_kl_strict` of host float64 NumPy counts by two compiled kernels and one ``np.log`` between them
    (:func:`~observers_core._compiled.kl_log_inputs_kernel`, :func:`~observers_core._compiled.kl_curve_kernel`):
    the array code's float64 operations in its order (its sums in NumPy's pairwise order, its logs NumPy's,
    taken of the same values in contiguous arrays, the logs of the non-empty bin counts from a table), so the
    same bits, in a few calls instead of ~100 NumPy calls. ``None`` where it does not apply (other namespaces
    or dtypes, kernels off, a negative or non-finite count, a total from 2**1000): the array code runs."""
    views = host_arrays(kl_curve_kernel, xp, b, dtype=np.float64)
    if views is None:
        return None
    counts = np.ascontiguousarray(views[0])
    cand = _kl_tables(*key)[0]
    first, end, group_range, last_range = _kl_ranges(*key)
    channels, bins = counts.shape
    width = first.size + bins + 2 * cand.size + 1
    out = np.empty((channels, cand.size))
    step = max(1, _CHUNK_ELEMENTS // width)  # channels at a time, bounding the temporaries as the array code does
    for c in range(0, channels, step):
        rows = counts[c : c + step]
        cs, nonzero = np.empty((rows.shape[0], bins + 1)), np.empty((rows.shape[0], first.size), dtype=np.int64)
        args = np.empty((rows.shape[0], width))
        if not kl_log_inputs_kernel(rows, first, end, cand, float(np.finfo(np.float64).tiny), cs, nonzero, args):
            return None
        kl_curve_kernel(rows, cs, first, end, group_range, last_range, cand, key[3], nonzero, _log_counts(bins),
                        np.log(args), out[c : c + step])
    return out


def _smoothed(x: Array, inside: Array, count: Array, eps: float, xp: Any) -> tuple[Array, Array]:
    """MXNet / ONNX Runtime ``smooth_distribution`` over the kept bins: zeros become ``eps``, non-zeros
    lose ``eps * n_zero / n_nonzero`` (the total is kept). Also returns where it is malformed."""
    nonzero = inside & (x > 0)
    n_nonzero = xp.sum(xp.astype(nonzero, x.dtype), axis=-1, keepdims=True)
    n_zero = count - n_nonzero
    eps1 = eps * n_zero / xp.where(n_nonzero > 0, n_nonzero, 1.0)
    smooth = xp.where(nonzero, x - eps1, xp.where(inside, xp.full_like(x, eps), 0.0))
    bad = (n_nonzero[..., 0] <= 0) | xp.any(inside & (smooth <= 0), axis=-1)
    return smooth, bad


def _kl_smoothed(b: Array, key: tuple, smoothing: float, xp: Any, device: Any) -> Array:
    """KL(P~ || Q~) of every candidate with P and Q smoothed (:func:`_smoothed`), then normalised.
    Dense over (candidate, bin): O(bins) work and memory per candidate."""
    cand_np, bounds_np, first_np, end_np = _kl_tables(*key)
    bins = b.shape[-1]
    levels = bounds_np.shape[1] - 1
    first, end = _index_array(first_np, xp, device), _index_array(end_np, xp, device)
    position = _index_array(_kl_dense_tables(*key), xp, device)
    j = xp.arange(bins, device=device)
    cand = _index_array(cand_np, xp, device)
    inside = j[None, :] < cand[:, None]  # (K, B)
    is_last = j[None, :] == (cand[:, None] - 1)
    kept_bins = xp.astype(cand[:, None], b.dtype)

    cs = _cumsum0(b, xp)
    nz = _cumsum0(xp.astype(b > 0, b.dtype), xp)
    total = cs[:, -1:]

    def per_chunk(b_c: Array, cs_c: Array, nz_c: Array) -> Array:
        g_count, g_nonzero = _kl_groups(cs_c, nz_c, first, end, xp)
        q_group = xp.reshape(g_count / clamp(g_nonzero, 1.0, None, xp), (-1, cand_np.size, levels))
        q_group = xp.concat([q_group, xp.zeros_like(q_group[..., :1])], axis=-1)
        q = _take_shared(xp.reshape(q_group, (q_group.shape[0], -1)), position, xp)
        q = xp.where(b_c[:, None, :] > 0, q, 0.0)
        tail = cs_c[:, -1:] - _take_shared(cs_c, cand, xp)
        p = xp.where(inside, b_c[:, None, :], 0.0) + xp.where(is_last, tail[..., None], 0.0)
        p, bad_p = _smoothed(p, inside, kept_bins, smoothing, xp)
        q, bad_q = _smoothed(q, inside, kept_bins, smoothing, xp)
        p = p / xp.sum(p, axis=-1, keepdims=True)
        q = q / xp.where(bad_q[..., None], 1.0, xp.sum(q, axis=-1, keepdims=True))
        ratio = xp.where(inside & ~bad_q[..., None], p / xp.where(q > 0, q, 1.0), 1.0)
        kl = xp.sum(xp.where(inside, p * xp.log(xp.where(ratio > 0, ratio, 1.0)), 0.0), axis=-1)
        return xp.where(bad_p | bad_q, INF, clamp(kl, 0.0, None, xp))

    kl = _by_channel_chunks(per_chunk, cand_np.size * bins, xp, b, cs, nz)
    return xp.where(total <= 0, INF, kl)


def _kl_search(
    hist, edges, *, num_bits, unsigned, num_levels, start_bin, stride, smoothing, flatten_first_bin, check, xp
) -> tuple[_Hist, SearchCurve]:
    xp = array_namespace(hist, edges, xp=xp)
    h = _prepare(hist, edges, xp, check)
    bins = h.counts.shape[-1]
    levels = _levels(num_bits, unsigned, num_levels)
    if bins < levels:
        raise ValueError(
            f"hist has {bins} bins, fewer than the {levels} quantized levels it is merged into "
            f"(num_bits={num_bits}, unsigned={unsigned}, num_levels={num_levels}); use at least {levels} bins"
        )
    start_bin = levels if start_bin is None else check_int(start_bin, "start_bin", minimum=1, maximum=bins)
    stride = check_int(stride, "stride", minimum=1)
    smoothing = check_float(smoothing, "smoothing", minimum=0.0)
    b = h.counts
    if check_bool(flatten_first_bin, "flatten_first_bin") and bins > 1:
        b = xp.concat([b[:, 1:2], b[:, 1:]], axis=-1)
    key = (bins, start_bin, stride, levels)
    if smoothing == 0:
        kl = _kl_strict(b, key, xp, h.device)
    else:
        kl = _kl_smoothed(b, key, smoothing, xp, h.device)
    index = _index_array(_kl_tables(*key)[0], xp, h.device)
    return h, SearchCurve(index, _take_shared(h.out_edges, index, xp), kl)


def _shaped_curve(curve: SearchCurve, h: _Hist, xp: Any) -> SearchCurve:
    return SearchCurve(curve.index, _shaped(curve.threshold, h, xp), _shaped(curve.objective, h, xp))


def kl_divergences(
    hist: Array,
    edges: Array,
    /,
    *,
    num_bits: int = 8,
    unsigned: bool = False,
    num_levels: int | None = None,
    start_bin: int | None = None,
    stride: int = 1,
    smoothing: float = 0.0,
    flatten_first_bin: bool = True,
    check: bool = True,
    xp: Any = None,
) -> SearchCurve:
    """KL divergence of every candidate threshold ``edges[i]``, ``i = start_bin, start_bin + stride,
    ..., <= bins`` (the TensorRT entropy calibration, as ModelOpt's ``_compute_amax_entropy``).

    For a histogram of ``|x|`` (``edges[0] = 0``): the reference ``P`` is ``hist[:i]`` with the clipped
    tail ``sum(hist[i:])`` added to its last bin; the candidate ``Q`` merges ``hist[:i]`` into
    ``num_levels`` groups (bin ``j`` in group ``floor(j * num_levels / i)``) and spreads each group's
    count evenly over its non-empty bins (empty bins stay 0). The objective is
    ``KL(P || Q) = sum_j p_j log(p_j / q_j)`` of the normalised distributions.

    - ``num_levels`` defaults to ``2**(num_bits - 1 + unsigned)`` (128 for int8); ``hist`` needs at
      least that many bins. ``start_bin`` defaults to ``num_levels`` (ModelOpt: 128) and must be in
      ``[1, bins]``; ``stride >= 1``.
    - ``flatten_first_bin`` (ModelOpt's ``bins[0] = bins[1]``): the first bin's count is replaced by
      the second's so a spike of exact zeros (ReLU, padding) does not dominate ``P``.
    - Zero bins, ``smoothing=0`` (ModelOpt, TensorRT): none. A candidate whose tail lands on an empty
      last bin (``p > 0 = q``), or that keeps no data, has ``KL = +inf`` (ModelOpt gets NaN from
      scipy for the latter, and its argmin then picks it). ``smoothing=eps > 0`` (MXNet, ONNX
      Runtime use ``1e-4``): ``P`` and ``Q`` (counts over the kept bins) are smoothed first, zeros
      becoming ``eps`` and non-zeros losing ``eps * n_zero / n_nonzero``; a candidate whose
      smoothing fails (all zero, or a count driven <= 0) is ``+inf``. Smoothing costs O(bins) per
      candidate instead of O(num_levels).
    """
    h, curve = _kl_search(
        hist, edges, num_bits=num_bits, unsigned=unsigned, num_levels=num_levels, start_bin=start_bin,
        stride=stride, smoothing=smoothing, flatten_first_bin=flatten_first_bin, check=check, xp=xp,
    )
    return _shaped_curve(curve, h, array_namespace(hist, edges, xp=xp))


def kl_threshold(
    hist: Array,
    edges: Array,
    /,
    *,
    num_bits: int = 8,
    unsigned: bool = False,
    num_levels: int | None = None,
    start_bin: int | None = None,
    stride: int = 1,
    smoothing: float = 0.0,
    flatten_first_bin: bool = True,
    ties: str = "last",
    tie_tol: float | None = None,
    check: bool = True,
    xp: Any = None,
) -> Array:
    """The threshold ``edges[i]`` of least KL divergence (see :func:`kl_divergences`), per channel.

    Ties: candidates within ``tie_tol`` nats of the least divergence tie; ``ties="last"`` (ModelOpt's
    ``last_argmin``) takes the largest threshold among them, ``"first"`` the smallest. ``tie_tol``
    defaults to ``2**-40`` (float64 arithmetic) or ``2**-16`` (float32). All ``+inf`` (an empty
    histogram): every candidate ties.
    """
    ties = _check_ties(ties)
    tie_tol = check_float(tie_tol, "tie_tol", minimum=0.0, allow_none=True)
    h, curve = _kl_search(
        hist, edges, num_bits=num_bits, unsigned=unsigned, num_levels=num_levels, start_bin=start_bin,
        stride=stride, smoothing=smoothing, flatten_first_bin=flatten_first_bin, check=check, xp=xp,
    )
    xp = array_namespace(hist, edges, xp=xp)
    tol = _default_tie_tol(xp, h.dtype) if tie_tol is None else tie_tol
    best = _pick_host(curve.objective, tol, None, ties, xp)
    if best is None:
        best = _pick(curve.objective, lambda _: tol, ties, xp)
    return _result(_select(curve.threshold, best, xp), h, xp)


# ----------------------------------------------------------------------------------------------
# MSE search: ModelOpt's _compute_amax_mse, Quark's get_min_max_by_mse, Horizon's stride
# ----------------------------------------------------------------------------------------------


def _squared_error(counts: Array, centers: Array, scale: Array, zero_point: Array, spec_range, norm, xp) -> Array:
    """``sum_j h_j ((fq(c_j) - c_j) / norm)**2`` for every column of ``scale``/``zero_point`` (C, K), with
    ``fq`` :func:`fake_quantize` over ``spec_range``; counts and centers (C, B). Dense: O(B) per candidate."""
    quant_min, quant_max = spec_range
    c = centers[:, None, :]
    fq = fake_quantize(c, scale[..., None], zero_point[..., None], quant_min=quant_min, quant_max=quant_max, xp=xp)
    d = (fq - c) / norm[:, None, None]
    return xp.sum(counts[:, None, :] * d * d, axis=-1)


def _integral(prefix: np.ndarray) -> bool:
    """Whether the host prefix sums of counts (float64) are all integers that int64 holds."""
    with np.errstate(invalid="ignore"):
        return bool(np.all((np.floor(prefix) == prefix) & (np.abs(prefix) < 2.0**62)))


def _level_width(edges: Array, scale: Array, xp: Any) -> Array:
    """The bin width ``w`` (C, 1) of the level sums: the histogram's, or for a zero-width histogram (all
    edges equal) ``2**-40`` of the largest candidate step, which keeps the sums finite. Computed once for
    every candidate, also where they run in blocks (:func:`_candidate_blocks`)."""
    bins = edges.shape[-1] - 1
    return xp.maximum((edges[:, -1:] - edges[:, :1]) / bins, xp.max(scale, axis=-1, keepdims=True) * 2.0**-40)


def _level_grid(edges: Array, scale: Array, width: Array | None, xp: Any) -> tuple[Array, Array, Array]:
    """``(w, r, o)`` of the level sums, in bin units: the bin width ``w`` (:func:`_level_width`, or ``width``
    computed once for every candidate), the candidates' steps ``r = s / w`` and ``o = a / w + 1/2``
    (``a = edges[0]``)."""
    w = _level_width(edges, scale, xp) if width is None else width
    return w, scale / w, edges[:, :1] / w + 0.5


def _level_first_bin(m: Any, r: Array, off: Array, bins: int, xp: Any) -> Array:
    """``n_m = clip(ceil((m - 1/2) r - o), 0, B)``: the first bin of level ``m`` (as a float)."""
    return clamp(xp.ceil((m - 0.5) * r - off), 0.0, float(bins), xp)


def _squared_error_by_levels(counts, edges, scale, levels, norm, xp, width=None) -> tuple[Array, Array]:
    """The sum of :func:`_squared_error` for uniform bins of non-negative data, summed by quantization
    level instead of by bin (O(levels) per candidate), and a bound on its rounding error.

    In bin units (center of bin ``j`` at ``j``, ``r = s / w``, ``o = a / w + 1/2`` with ``a = edges[0]``),
    level ``m = q - z`` (``0 <= m < M``) dequantizes to ``u_m = m r - o`` and holds the bins
    ``n_m <= j < n_{m+1}``, ``n_m = clip(ceil((m - 1/2) r - o), 0, B)`` (``n_0 = 0``, ``n_M = B``: the end
    levels take everything beyond). With prefix sums ``P0 = sum h``, ``P1 = sum h j`` (exact for integer
    counts) and ``S_p = sum_j h_j j**p``, Abel summation of ``sum_m sum_{j in m} h_j (j - u_m)**2`` gives
    ``S2 - 2 u_top S1 + u_top**2 S0 + 2 r X1 - r**2 Y1 + 2 r o Y0`` with ``X1 = sum_m P1[n_m]``,
    ``Y0 = sum_m P0[n_m]``, ``Y1 = sum_m (2m - 1) P0[n_m]`` over ``m = 1 .. M - 1``. The terms cancel, so
    the bound (a few ulps of their magnitudes) is used as the tie slack.
    """
    channels, bins = counts.shape
    dtype = counts.dtype
    device = _device(counts)
    j = xp.arange(bins, dtype=dtype, device=device)
    p0 = _cumsum0(counts, xp)
    p1 = _cumsum0(counts * j, xp)
    s0, s1 = p0[:, -1:], p1[:, -1:]
    s2 = xp.sum(counts * j * j, axis=-1, keepdims=True)
    w, r, off = _level_grid(edges, scale, width, xp)

    def boundary_sums(p0_c, p1_c, r_c, off_c):
        m = xp.arange(1, levels, dtype=dtype, device=device)
        weights = xp.stack([xp.ones_like(m), 2 * m - 1], axis=-1)  # (M - 1, 2)
        n = xp.astype(_level_first_bin(m, r_c[..., None], off_c[..., None], bins, xp), index_dtype(xp))
        g0 = _take_each(p0_c, xp.reshape(n, (n.shape[0], -1)), xp)
        g1 = _take_each(p1_c, xp.reshape(n, (n.shape[0], -1)), xp)
        y = xp.matmul(xp.reshape(g0, tuple(n.shape)), weights)  # (C, K, 2): Y0, Y1
        x1 = xp.sum(xp.reshape(g1, tuple(n.shape)), axis=-1)
        return xp.concat([y, x1[..., None]], axis=-1)

    unit = (w / norm[:, None]) ** 2
    hosts = [host_view(a, xp) for a in (p0, p1, r, off)] if levels > 1 and dtype == xp.float64 else [None]
    if all(h is not None for h in hosts) and _integral(hosts[0]):  # host memory with the compiled kernels: no
        # (C, K, M) temporaries; the kernel sums the prefix sums as int64, so only for integer counts
        p0_h, p1_h, r_h, off_h = hosts
        consts = np.concatenate([np.reshape(host_view(a, xp), (channels, 1)) for a in (s0, s1, s2, unit)], axis=1)
        err, bound = np.empty(r_h.shape, dtype=np.float64), np.empty(r_h.shape, dtype=np.float64)
        candidates = r_h.shape[1]  # shared by threads (exact sums: the same result on any number of threads)
        split_ranges(mse_level_errors_kernel, candidates, threads(r_h.size * levels), p0_h, p1_h, r_h,
                     np.reshape(off_h, (channels,)), consts, levels, bins, 16 * _eps_of(dtype, xp), err, bound,
                     chunk=256)
        return xp.asarray(err), xp.asarray(bound)
    if levels > 1:
        sums = _by_channel_chunks(boundary_sums, r.shape[1] * (levels - 1) * 3, xp, p0, p1, r, off)
        y0, y1, x1 = sums[..., 0], sums[..., 1], sums[..., 2]
    else:
        y0 = y1 = x1 = xp.zeros_like(r)
    u_top = (levels - 1) * r - off
    terms = (s2, 2 * u_top * s1, u_top * u_top * s0, 2 * r * x1, r * r * y1, 2 * r * off * y0)
    err = terms[0] - terms[1] + terms[2] + terms[3] - terms[4] + terms[5]
    bound = 16 * _eps_of(dtype, xp) * sum(xp.abs(t) for t in terms)
    return clamp(err, 0.0, None, xp) * unit, bound * unit


#: Longest inner level (in bins) whose window moments stay below 2**31 with counts split into 16-bit limbs:
#: ``(2**16 - 1) * sum(t**2 for t < 46) < 2**31``.
_LIMB_SPAN = 46


def _apart(x: Array, xp: Any) -> Array:
    """``x``, materialized on JAX (``lax.optimization_barrier``): XLA CPU fuses a gather or a transpose
    into each of its consumers otherwise, gathering again per consumer or reading with strides (1.5x to
    3x slower for the level sums)."""
    if is_jax_namespace(xp):
        import jax

        return jax.lax.optimization_barrier(x)
    return x


def _window_sums(prefix: Array, top2: Array, n: Array, r: Array, off: Array, limbs: int, xp: Any) -> Array:
    """``sum_m A2_m + 2 d_m A1_m + d_m**2 A0_m`` over the inner levels ``m = 0 .. M - 2`` (C, K), for
    :func:`_squared_error_by_levels32`; ``n`` (C, K, M) the levels' first bins (float), ``A_p`` the windows'
    moments about their first bin ``a_m = n_m``, computed mod 2**32 from prefix sums (so exactly: their
    true values are below 2**31), then as float32.

    ``prefix`` (C, B + 1, parts) int32: the prefix sums (mod 2**32) of the counts times ``j**p``: with two
    16-bit ``limbs``, ``p = 0, 1, 2`` of each limb (``A_p`` of each window from its own sums); with one,
    ``p = 0, 1``, and ``A2`` is only needed in total, ``sum_m A2_m = P2[n_{M-1}] - 2 sum_m a_m D1_m +
    sum_m a_m**2 D0_m`` (``D_p`` the windows' sums of ``h j**p``), with ``top2`` (C, K) = ``P2[n_{M-1}]``."""
    channels, size, parts = prefix.shape
    _, count, levels = n.shape
    index = xp.astype(n, xp.int32)
    offsets = xp.reshape(xp.arange(channels, dtype=xp.int32, device=_device(n)) * size, (channels, 1, 1))
    table = _apart(xp.reshape(prefix, (channels * size, parts)), xp)
    flat = xp.reshape(index + offsets, (-1,))
    rows = table[flat, ...] if is_jax_namespace(xp) else take(table, flat, 0, xp)  # (JAX: no bound checks)
    g = xp.reshape(_apart(rows, xp), (channels, count, levels, parts))
    g = _apart(xp.permute_dims(g, (3, 0, 1, 2)), xp)  # (parts, C, K, M)
    d = g[..., 1:] - g[..., :-1]  # window sums of h j**p (mod 2**32)
    a = index[..., :-1]  # each window's first bin
    dtype = r.dtype
    d0, d1 = d[:limbs, ...], d[limbs : 2 * limbs, ...]
    moments = [d0, d1 - a * d0]  # about the first bin (mod 2**32, so exactly)
    if limbs == 2:
        moments.append(d[2 * limbs :, ...] - 2 * a * d1 + (a * a) * d0)

    def value(x: Array) -> Array:
        v = xp.astype(x[0, ...], dtype)
        return v if limbs == 1 else v + 65536.0 * xp.astype(x[1, ...], dtype)

    a0, a1 = value(moments[0]), value(moments[1])
    m = xp.arange(levels - 1, dtype=dtype, device=_device(n))
    delta = n[..., :-1] - (m * r[..., None] - off[..., None])  # first bin - the level's value
    ones = xp.ones((levels - 1,), dtype=dtype, device=_device(n))  # sums over m (XLA CPU: 3x faster than sum)
    out = xp.matmul(delta * (2 * a1 + delta * a0), ones)
    if limbs == 2:
        return out + xp.matmul(value(moments[2]), ones)
    a2 = top2 - 2 * xp.sum(a * d1[0, ...], axis=-1, dtype=xp.int32) + xp.sum((a * a) * d0[0, ...], axis=-1, dtype=xp.int32)
    return out + xp.astype(a2, dtype)


def _candidate_blocks(fn: Callable[[Array, Array], Array], scale: Array, zero_point: Array, per_candidate: int,
                      xp: Any, budget: int) -> Array:
    """``fn(scale, zero_point)`` (C, K) -> (..., C, K) on blocks of candidates whose temporaries,
    ``per_candidate`` elements each, hold at most ``budget`` elements together; ``fn`` at once where all fit.
    JAX: one ``lax.map`` over equal blocks (the last padded with copies of the last candidate), so one
    compiled body; other libraries: a loop. Every candidate's result is its own, so blocks give what one call
    would."""
    channels, count = scale.shape
    block = max(1, budget // max(per_candidate, 1))
    if block >= count:
        return fn(scale, zero_point)
    if not is_jax_namespace(xp):
        parts = [fn(scale[:, k : k + block], zero_point[:, k : k + block]) for k in range(0, count, block)]
        return xp.concat(parts, axis=-1)
    import jax

    pad = -count % block
    if pad:
        scale = xp.concat([scale, xp.broadcast_to(scale[:, -1:], (channels, pad))], axis=-1)
        zero_point = xp.concat([zero_point, xp.broadcast_to(zero_point[:, -1:], (channels, pad))], axis=-1)

    def blocks(v: Array) -> Array:
        return xp.permute_dims(xp.reshape(v, (channels, -1, block)), (1, 0, 2))

    out = jax.lax.map(lambda sz: fn(sz[0], sz[1]), (blocks(scale), blocks(zero_point)))  # (blocks, ..., C, block)
    out = xp.moveaxis(out, 0, -2)
    return xp.reshape(out, tuple(out.shape[:-2]) + (-1,))[..., :count]


#: The by-bin fallback of the float32 level sums on JAX runs in candidate blocks of at most this many
#: elements: XLA allocates the buffers of every ``lax.switch`` branch, also of those that do not run (63 MB
#: for 2048 bins by bin at once, ~3 ms).
_SWITCH_BRANCH_ELEMENTS = 1 << 17
#: The level sums of one channel's candidates hold ``candidates * levels * 6`` elements at once; beyond this
#: many they run in candidate blocks (int16's 32768 levels by ~32k candidates: tens of GB at once). Channels
#: are chunked inside (``_channel_chunks``).
_LEVEL_SUM_ELEMENTS = 1 << 25


def _squared_error_by_levels32(counts, edges, scale, levels, norm, dense, xp, limbs: int | None = None, width=None,
                               choice=None) -> Array:
    """:func:`_squared_error_by_levels` in float32 arithmetic (JAX without x64), where the float64
    formula's terms (``S2`` ~ ``N B**2`` against an error ~ ``N r**2``) cancel beyond float32's 24 bits.

    Each level ``m`` sums ``h_j (j - u_m)**2`` over its window of bins ``n_m <= j < n_{m+1}`` as
    ``A2 + 2 d A1 + d**2 A0``, ``d = n_m - u_m`` (``|d| <= r``), ``A_p = sum h_j (j - n_m)**p``: small
    non-negative moments, exact integers when the counts are integers, computed from int32 prefix sums
    (mod 2**32) of ``h j**p``, of the counts as they are or split in two 16-bit limbs. The top level (all
    bins beyond) takes suffix moments about ``n``, float sums of non-negative terms. Nothing cancels
    beyond a few ``r**2``, so the result is as accurate as the bin-by-bin sum (relative ~1e-6).

    Exact only where every count is an integer in ``[0, 2**31)`` and every window's moments stay
    below 2**31: one limb if ``N (L - 1)**2 <= 2**30`` (``N`` the total, ``L`` the longest inner window),
    two if ``L <= 46``; otherwise ``dense()`` (the bin-by-bin sum), chosen on the host (eager) or by
    ``lax.switch`` (JAX, traced). ``limbs`` (tests): 0 (by bin), 1 or 2 regardless of the counts.
    ``width``/``choice``: :func:`_level_width` and :func:`_limb_choice` of every candidate, where the
    candidates run in blocks (``scale`` one block)."""
    channels, bins = counts.shape
    dtype = counts.dtype
    device = _device(counts)
    w, r, off = _level_grid(edges, scale, width, xp)
    m = xp.arange(levels, dtype=dtype, device=device)
    n = _level_first_bin(m, r[..., None], off[..., None], bins, xp)
    n = xp.where(m == 0, 0.0, n)  # (C, K, M): n_0 = 0, the levels' first bins

    # The top level (every bin from n_{M-1} on), from suffix moments T_p(x) = sum_{j >= x} h_j (j - x)**p:
    # T1(x) = sum_{y > x} T0(y), T2(x) = sum_{y > x} 2 T1(y) + T0(y) (non-negative terms).
    def suffix(v: Array) -> Array:
        return xp.flip(xp.cumulative_sum(xp.flip(v, axis=-1), axis=-1, include_initial=True), axis=-1)

    t0 = suffix(counts)
    t1 = suffix(t0[:, 1:])
    t2 = suffix(2 * t1[:, 1:] + t0[:, 1:])
    top_index = xp.astype(n[..., -1], index_dtype(xp))
    tp = [_take_each(t, top_index, xp) for t in (t0, t1, t2)]
    d_top = n[..., -1] - ((levels - 1) * r - off)
    top = tp[2] + d_top * (2 * tp[1] + d_top * tp[0])
    unit = (w / norm[:, None]) ** 2
    if levels == 1:
        return clamp(top, 0.0, None, xp) * unit

    # Prefix sums (mod 2**32) of h j**p, p = 0, 1, 2, for both 16-bit limbs of the counts (C, B + 1, 6), made
    # before the branches: XLA would otherwise recompute the cumulative sums inside the gathers (2x slower).
    valid = (counts >= 0) & (counts < 2.0**31) & (xp.floor(counts) == counts)  # (False for NaN, inf)
    h = xp.astype(xp.where(valid, counts, 0.0), xp.int32)
    j = xp.arange(bins, dtype=xp.int32, device=device)
    terms = [v * jp for jp in (1, j, j * j) for v in (h & 0xFFFF, h >> 16)]  # int32, mod 2**32
    prefix = xp.cumulative_sum(xp.stack(terms, axis=-1), axis=1, include_initial=True, dtype=xp.int32)

    def by_level(limbs: int) -> Array:
        if limbs == 1:  # the sums of the counts themselves (mod 2**32): P0, P1, and P2 at n_{M-1} only
            table = prefix[..., 0::2] + 65536 * prefix[..., 1::2]
            top2 = _take_each(table[..., 2], xp.astype(n[..., -1], index_dtype(xp)), xp)
            table = table[..., :2]
        else:
            table, top2 = prefix, xp.zeros(n.shape[:2], dtype=xp.int32, device=device)
        inner = _channel_chunks(
            lambda p_c, t_c, n_c, r_c, o_c: _window_sums(p_c, t_c, n_c, r_c, o_c, limbs, xp),
            n.shape[1] * levels * table.shape[-1], xp, table, top2, n, r, off,
        )
        return clamp(inner + top, 0.0, None, xp) * unit

    branches = (dense, lambda: by_level(1), lambda: by_level(2))
    if limbs is not None:
        return branches[limbs]()
    if choice is None:
        choice = _limb_choice(counts, n[..., 1], r, xp)
    if is_traced(counts, edges, scale) and is_jax_namespace(xp):
        import jax

        return jax.lax.switch(choice, branches)
    return branches[int(choice)]()


def _limb_choice(counts: Array, first_window: Array, r: Array, xp: Any) -> Array:
    """Which sums :func:`_squared_error_by_levels32` can take exactly: 1 or 2 limbs, or 0 (by bin);
    ``first_window`` (C, K) is ``n_1``, ``r`` (C, K) the candidates' steps in bins."""
    # The longest inner window: n_{m+1} - n_m <= ceil(r) + 1 for m >= 1 (ceil(t + r) <= ceil(t) + ceil(r), and an
    # ulp of rounding in t), and n_1 for m = 0.
    span = xp.maximum(xp.max(xp.ceil(r), axis=-1) + 1, xp.max(first_window, axis=-1))  # (C,)
    valid = (counts >= 0) & (counts < 2.0**31) & (xp.floor(counts) == counts)  # (False for NaN, inf)
    total = xp.sum(counts, axis=-1)
    exact = xp.all(valid)
    one_limb = exact & xp.all(total * clamp(span - 1, 1.0, None, xp) ** 2 <= 2.0**30)
    two_limbs = exact & xp.all(span <= _LIMB_SPAN)
    return xp.where(one_limb, 1, xp.where(two_limbs, 2, 0))


def error_norm(edges: Array, xp: Any) -> Array:
    """The unit of the squared-error sums, per channel: the smallest power of two ``>= max |edges|``
    (1 for an empty or non-finite range), at most ``2**-emin`` (``2**126`` in float32) so that ``1 / norm``
    is a normal number. A power of two makes ``d / norm`` exact, also where XLA (JAX, which flushes
    subnormals) divides by multiplying with the reciprocal; errors of data near float32's maximum then
    neither overflow nor vanish."""
    norm = xp.max(xp.abs(edges), axis=-1)
    norm = xp.where((norm > 0) & (norm < INF), norm, 1.0)
    cap = 2.0**1022 if norm.dtype == xp.float64 else 2.0**126
    return clamp(_pow2_at_least(norm, xp), None, cap, xp)


def bin_centers(edges: Array, xp: Any) -> Array:
    """The centers ``(e[j] + e[j + 1]) / 2`` of the bins along the last axis, with no overflow: where the
    sum overflows (edges beyond half of the dtype's maximum, e.g. 1.7e38 in float32) the center is
    ``e[j] / 2 + e[j + 1] / 2``, the same value (halving is exact away from subnormals)."""
    return midpoint(edges[..., :-1], edges[..., 1:], xp)


def _eps_of(dtype: Any, xp: Any) -> float:
    return float(np.finfo(np.float64 if dtype == xp.float64 else np.float32).eps)


def mse_window(spec: QuantSpec) -> tuple[int, int]:
    """The levels ``[z, quant_max]`` that non-negative data can reach: the candidates' zero point ``z``
    (for the range ``[0, amax]``: the symmetric zero point, ``quant_min`` when affine, 0 for float
    qparams) up to ``quant_max``."""
    if spec.qscheme.is_symmetric:
        low = spec.symmetric_zero_point
    elif spec.qscheme is QScheme.PER_CHANNEL_AFFINE_FLOAT_QPARAMS:
        low = min(max(0, spec.quant_min), spec.quant_max)
    else:
        low = spec.quant_min
    return low, spec.quant_max


def _mse_host(h: _Hist, cand: np.ndarray, spec: QuantSpec, levels: int, xp: Any
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The float64 level sums of :func:`_mse_search` for host NumPy counts: ``(errors, bounds, norm)`` from
    :func:`~observers_core._compiled.mse_prepare_kernel` (bin centers, scales, :func:`error_norm`, prefix sums
    and the other inputs of the level sums, in one call) and
    :func:`~observers_core._compiled.mse_level_errors_kernel`, the array code's float64 operations in its order
    (the same bits). ``None`` where it does not apply (other namespaces, kernels off, one level, an edge not
    finite, ``max |edges|`` subnormal, counts whose prefix sums are not integers below 2**62)."""
    views = host_arrays(mse_prepare_kernel, xp, h.counts)
    if views is None or levels <= 1 or h.dtype != xp.float64:
        return None
    counts = np.ascontiguousarray(views[0], dtype=np.float64)
    edges = h.out_edges[:1] if h.out_edges.strides[0] == 0 else h.out_edges  # (shared edges: one row)
    edges = np.ascontiguousarray(edges, dtype=np.float64)
    channels, bins = counts.shape
    count = cand.size
    p0, p1 = np.empty((channels, bins + 1)), np.empty((channels, bins + 1))
    r, off, consts, norm = np.empty((channels, count)), np.empty(channels), np.empty((channels, 4)), np.empty(channels)
    qrange = float(spec.quant_max - spec.quant_min)
    if spec.qscheme is QScheme.PER_CHANNEL_AFFINE_FLOAT_QPARAMS:
        mode, divisor = 1, qrange
    else:
        mode, divisor = 0, qrange / 2 if spec.qscheme.is_symmetric else qrange
    eps = float(np.float32(spec.eps))  # (calculate_qparams's eps is float32)
    if mse_prepare_kernel(counts, edges, cand, mode, divisor, eps, p0, p1, r, off, consts, norm):
        return None
    err, bound = np.empty((channels, count)), np.empty((channels, count))
    split_ranges(mse_level_errors_kernel, count, threads(r.size * levels), p0, p1, r, off, consts, levels, bins,
                 16 * _eps_of(h.dtype, xp), err, bound, chunk=256)
    return err, bound, norm


@functools.lru_cache(maxsize=64)
def _mse_candidates(start_bin: int, bins: int, stride: int) -> np.ndarray:
    """The MSE search's candidate bins ``start_bin, start_bin + stride, ... < bins``: a cached constant (never
    written to), so :func:`_index_array` copies it to a GPU once (a fresh table each call waits for it)."""
    return np.arange(start_bin, bins, stride, dtype=np.int64)


def _mse_search(hist, edges, *, spec, start_bin, stride, check, xp, thresholds: bool = True
                ) -> tuple[_Hist, SearchCurve, Array, Array | None]:
    """The candidates, with ``objective`` the error sums in units of ``norm`` (:func:`error_norm`,
    so huge ranges do not overflow), ``norm`` and the sums' rounding bound (None when by bin).
    ``thresholds=False``: the curve's ``threshold`` may be None (the host path leaves it to the caller)."""
    xp = array_namespace(hist, edges, xp=xp)
    if not isinstance(spec, QuantSpec):
        raise TypeError(f"spec must be a QuantSpec (see quant_spec(...)), got {type(spec).__name__} {spec!r}")
    h = _prepare(hist, edges, xp, check)
    bins = h.counts.shape[-1]
    if start_bin is None:
        start_bin = min(128, bins - 1)
    start_bin = check_int(start_bin, "start_bin", minimum=0, maximum=bins - 1)
    stride = check_int(stride, "stride", minimum=1)
    cand_np = _mse_candidates(start_bin, bins, stride)
    cand = _index_array(cand_np, xp, h.device)
    low, high = mse_window(spec)
    host = _mse_host(h, cand_np, spec, high - low + 1, xp) if high - low + 1 <= bins else None
    if host is not None:
        err, noise, norm = host
        threshold = _take_shared(bin_centers(h.out_edges, xp), cand, xp) if thresholds else None
        return h, SearchCurve(cand, threshold, err), norm, noise
    h_edges = h.edges(xp)
    centers = bin_centers(h_edges, xp)
    amax = _take_shared(centers, cand, xp)  # (C, K)
    qp = calculate_qparams(xp.zeros_like(amax), amax, spec, xp=xp)
    scale = xp.astype(qp.scale, h.dtype)
    norm = error_norm(h_edges, xp)
    levels = high - low + 1

    zero_point = xp.astype(qp.zero_point, h.dtype)

    def by_bin(s: Array, z: Array, switch_branch: bool = False) -> Array:
        if switch_branch and is_jax_namespace(xp):  # the fallback of the float32 level sums: a lax.switch branch
            return _candidate_blocks(lambda s, z: _squared_error(h.counts, centers, s, z, (low, high), norm, xp),
                                     s, z, s.shape[0] * bins, xp, _SWITCH_BRANCH_ELEMENTS)
        return _by_channel_chunks(
            lambda c, e, s, z, n: _squared_error(c, e, s, z, (low, high), n, xp),
            s.shape[-1] * bins * 4, xp, h.counts, centers, s, z, norm,
        )

    noise = None  # by bin every term is computed directly: no cancellation to allow for
    if levels <= bins:  # by level, in blocks of candidates where all at once would not fit
        width = _level_width(h_edges, scale, xp)
        per_candidate = levels * 6
        if h.dtype == xp.float64:
            sums = _candidate_blocks(
                lambda s, z: xp.stack(_squared_error_by_levels(h.counts, h_edges, s, levels, norm, xp, width=width)),
                scale, zero_point, per_candidate, xp, _LEVEL_SUM_ELEMENTS)
            err, noise = sums[0, ...], sums[1, ...]
        else:  # float32: exact window sums where the counts allow, else by bin (one choice for every block)
            _, r, off = _level_grid(h_edges, scale, width, xp)
            choice = _limb_choice(h.counts, _level_first_bin(1.0, r, off, bins, xp), r, xp)
            err = _candidate_blocks(
                lambda s, z: _squared_error_by_levels32(h.counts, h_edges, s, levels, norm, lambda: by_bin(s, z, True),
                                                        xp, width=width, choice=choice),
                scale, zero_point, per_candidate, xp, _LEVEL_SUM_ELEMENTS)
    else:
        err = by_bin(scale, zero_point)
    out_centers = bin_centers(h.out_edges, xp)
    threshold = _take_shared(xp.astype(out_centers, h.out_edges.dtype), cand, xp)
    return h, SearchCurve(cand, threshold, err), norm, noise


def mse_errors(
    hist: Array, edges: Array, /, *, spec: QuantSpec, start_bin: int | None = None, stride: int = 1,
    check: bool = True, xp: Any = None,
) -> SearchCurve:
    """Expected squared quantization error of every candidate threshold ``amax = c_k`` (bin center
    ``c_k``, ``k = start_bin, start_bin + stride, ..., < bins``).

    The candidate quantizer is ``calculate_qparams(0, amax, spec)`` (Quark's ``get_min_max_by_mse``;
    ModelOpt's int8 is ``quant_spec("qint8", "per_tensor_symmetric", quant_min=-127, quant_max=127)``,
    its unsigned ``quant_spec("quint8")``), and every bin's count sits at its center:
    ``E(amax) = sum_j h_j (fq(c_j) - c_j)**2 / sum_j h_j``, ``fq`` :func:`fake_quantize` over the levels
    non-negative data reaches (``[zero_point, quant_max]``). For histograms of ``|x|`` or of non-negative
    data with uniform bins, as ModelOpt and Quark collect. ``start_bin`` defaults to ``min(128, bins - 1)``
    (ModelOpt: 128; Quark: 2045) and must be in ``[0, bins - 1]``; ``stride >= 1`` (Horizon).

    In float64 with at most ``bins`` levels the sum runs by level (O(levels) per candidate, accurate to
    about ``1e-10`` relative); in float32 (JAX without x64) too where the counts are integers and the
    levels' windows narrow enough for exact int32 window sums (:func:`_squared_error_by_levels32`; about
    ``1e-6`` relative); otherwise by bin with :func:`fake_quantize` (O(bins) per candidate).
    """
    xp = array_namespace(hist, edges, xp=xp)
    h, curve, norm, _ = _mse_search(hist, edges, spec=spec, start_bin=start_bin, stride=stride, check=check, xp=xp)
    total = xp.sum(h.counts, axis=-1, keepdims=True)
    objective = curve.objective * norm[:, None] ** 2 / xp.where(total == 0, 1.0, total)  # squared data units
    return _shaped_curve(curve._replace(objective=objective), h, xp)


def mse_threshold(
    hist: Array,
    edges: Array,
    /,
    *,
    spec: QuantSpec,
    start_bin: int | None = None,
    stride: int = 1,
    ties: str = "first",
    tie_tol: float | None = None,
    check: bool = True,
    xp: Any = None,
) -> Array:
    """The bin center ``amax`` of least expected squared error (see :func:`mse_errors`), per channel.

    Ties: candidates within ``tie_tol * E_min`` plus the sum's rounding-error bound of the least error
    tie; ``ties="first"`` (ModelOpt's and Quark's ``argmin``) takes the smallest threshold among them,
    ``"last"`` the largest. ``tie_tol`` defaults to ``2**-40`` (float64 arithmetic) or ``2**-16``
    (float32). Quantization parameters: ``calculate_qparams(0, amax, spec)``.
    """
    ties = _check_ties(ties)
    tie_tol = check_float(tie_tol, "tie_tol", minimum=0.0, allow_none=True)
    xp = array_namespace(hist, edges, xp=xp)
    h, curve, _, noise = _mse_search(hist, edges, spec=spec, start_bin=start_bin, stride=stride, check=check, xp=xp,
                                     thresholds=False)
    tol = _default_tie_tol(xp, h.dtype) if tie_tol is None else tie_tol
    if curve.threshold is None:  # the host path: the pick by a kernel, then the picked bins' centers
        slack = 2 * np.max(noise, axis=-1)
        best = _pick_host(curve.objective, tol, slack, ties, xp)
        if best is None:
            best = _pick(curve.objective, lambda m: tol * m + slack[:, None], ties, xp)
        rows, picked = np.arange(best.shape[0]), curve.index[best]
        return _result(midpoint(h.out_edges[rows, picked], h.out_edges[rows, picked + 1], xp), h, xp)
    slack = 0.0 if noise is None else 2 * xp.max(noise, axis=-1, keepdims=True)
    best = _pick(curve.objective, lambda m: tol * m + slack, ties, xp)
    return _result(_select(curve.threshold, best, xp), h, xp)


def histogram_quantization_error(
    hist: Array,
    edges: Array,
    scale: Array,
    zero_point: Array,
    /,
    *,
    quant_min: int,
    quant_max: int,
    check: bool = True,
    xp: Any = None,
) -> Array:
    """Expected squared error of quantizing the histogram's data with ``scale``/``zero_point``:
    ``sum_j h_j (fq(c_j) - c_j)**2 / sum_j h_j`` (0 for an empty histogram), ``c_j`` the bin centers,
    ``fq`` :func:`fake_quantize`. ``scale``/``zero_point``: scalars or one per channel (``hist.shape[:-1]``).
    Works for any histogram (signed or of ``|x|``): it compares the qparams of several methods (MixObserver).
    """
    xp = array_namespace(hist, edges, xp=xp)
    h = _prepare(hist, edges, xp, check)
    if quant_min > quant_max:
        raise ValueError(f"quant_min={quant_min} must be <= quant_max={quant_max}")
    channels = h.counts.shape[0]
    scale = xp.broadcast_to(xp.reshape(xp.astype(xp.asarray(scale, device=h.device), h.dtype), (-1, 1)), (channels, 1))
    zero_point = xp.astype(xp.asarray(zero_point, device=h.device), h.dtype)
    zero_point = xp.broadcast_to(xp.reshape(zero_point, (-1, 1)), (channels, 1))
    h_edges = h.edges(xp)
    centers = bin_centers(h_edges, xp)
    norm = error_norm(h_edges, xp)
    err = _squared_error(h.counts, centers, scale, zero_point, (quant_min, quant_max), norm, xp)[:, 0]
    total = xp.sum(h.counts, axis=-1)
    empty = total == 0
    return _shaped(xp.where(empty, 0.0, err * norm**2 / xp.where(empty, 1.0, total)), h, xp)


# ----------------------------------------------------------------------------------------------
# Percentile
# ----------------------------------------------------------------------------------------------


_HOST_DTYPES = "bhilqBHILQfd"  # NumPy's type characters of the integer, float32 and float64 dtypes


def _percentile_host(hist: Array, edges: Array, keep: float, symmetric: bool, check: bool, xp: Any
                     ) -> tuple[Array, Array] | None:
    """:func:`percentile_range` for host arrays (NumPy, torch CPU) with integer counts, by
    :func:`~observers_core._compiled.percentile_rows_kernel`: one pass over each row (its total and the
    checks of :func:`check_hist_values`), then a scan from the top for the bin; the array code's bins and
    errors exactly. ``None`` where it does not apply (other arrays or dtypes, kernels off, non-integer counts,
    totals from 2**53, invalid counts with ``check=False``): the array code runs."""
    hv, ev = host_view(hist, xp), host_view(edges, xp)
    if hv is None or ev is None:
        return None
    hd, ed = hv.dtype, ev.dtype
    if hd.char not in _HOST_DTYPES or ed.char not in _HOST_DTYPES or not (hd.isnative and ed.isnative):
        return None
    bins, lead = _hist_shape(hv, ev, xp, real=True)  # (the views' shapes are the arrays', and cheaper for torch)
    if bins >= 1 << 22:  # (int64 totals)
        return None
    counts, rows = hv.reshape(-1, bins), ev.reshape(-1, bins + 1)
    vals = np.empty((2, counts.shape[0]), ed if ed.kind == "f" else np.float64)  # lo, hi
    status = percentile_rows_kernel(counts, rows, keep, symmetric, "fiu".index(counts.dtype.kind), vals)
    if check:
        _raise_unless(not status & 1, not status & 2)
    if status & 5:
        return None
    return from_host(vals[0].reshape(lead), xp), from_host(vals[1].reshape(lead), xp)


def percentile_range(
    hist: Array, edges: Array, /, *, percentile: float = 99.99, symmetric: bool = True, check: bool = True,
    xp: Any = None,
) -> tuple[Array, Array]:
    """The range ``(lo, hi)`` that keeps ``percentile`` percent of the histogram's data.

    ``S_j = sum(hist[:j + 1])``, ``N = S[-1]``, ``p = percentile / 100``:

    - ``symmetric=True`` (a histogram of ``|x|``; ModelOpt's ``_compute_amax_percentile``, Quark's
      symmetric ``get_min_max_by_percentile``, Horizon): ``hi = edges[i]`` with ``i`` the first bin
      where ``S_i >= p N`` (the left edge of the bin where the cumulative histogram reaches ``p``),
      ``lo = 0``.
    - ``symmetric=False`` (a signed histogram): each tail keeps ``(1 - p) / 2``:
      ``hi = edges[i]``, ``i`` the first bin with ``S_i >= (1 - (1 - p) / 2) N``, and ``lo`` the
      mirror image, ``edges[bins - i']`` with ``i'`` the same index counted from the top, so reversing
      the histogram negates the range exactly.

    ``percentile`` must be in ``(0, 100]``. Comparisons use cumulative counts (exact for integer
    counts), not a cumulative sum of fractions; the target ``p N`` is rounded to the work dtype, so in
    float32 (JAX without x64) a bin whose cumulative count lies within float32's rounding of ``p N`` may
    be taken one bin lower than in float64. An empty histogram gives ``hi = edges[0]`` and, when
    not symmetric, ``lo = edges[-1]`` (an inverted range: ``calculate_qparams`` falls back to scale 1).
    """
    xp = array_namespace(hist, edges, xp=xp)
    if isinstance(percentile, bool) or not isinstance(percentile, numbers.Real):
        raise TypeError(f"percentile must be a float, got {type(percentile).__name__} {percentile!r}")
    percentile = float(percentile)
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile={percentile} is out of range; allowed: 0 < percentile <= 100")
    symmetric = check_bool(symmetric, "symmetric")
    keep = percentile / 100 if symmetric else 1 - (100 - percentile) / 200
    fast = _percentile_host(hist, edges, keep, symmetric, check_bool(check, "check"), xp)
    if fast is not None:
        return fast
    h = _prepare(hist, edges, xp, check)
    bins = h.counts.shape[-1]
    cum = xp.cumulative_sum(h.counts, axis=-1)
    target = keep * cum[:, -1:]
    # The first bin whose cumulative count reaches the target (one exists: keep <= 1).
    hi = _select(h.out_edges, xp.argmax(xp.astype(cum >= target, xp.int8), axis=-1), xp)
    if symmetric:
        return _result(xp.zeros_like(hi), h, xp), _result(hi, h, xp)
    from_top = xp.cumulative_sum(xp.flip(h.counts, axis=-1), axis=-1)
    lo_index = bins - xp.argmax(xp.astype(from_top >= target, xp.int8), axis=-1)
    lo = _select(h.out_edges, lo_index, xp)
    return _result(lo, h, xp), _result(hi, h, xp)


# ----------------------------------------------------------------------------------------------
# Histogram state on a power-of-two grid
# ----------------------------------------------------------------------------------------------


class CalibHistogram(NamedTuple):
    """Counts on the grid ``edges = lo + width * arange(bins + 1)``, and the range they cover.

    ``counts`` (..., bins): integer counts (the namespace's index dtype); ``lo`` (...): the first edge, a
    multiple of ``width``; ``width`` (...): the bin width, a power of two, 0 while nothing was counted;
    ``min_val``/``max_val`` (...): the range of the counted values (with 0 in absolute mode),
    ``+inf``/``-inf`` while nothing was counted. ``(...)`` is ``()`` per tensor or ``(C,)`` per channel.
    The grid is a function of the range and the widths seen, which makes updates and merges exact,
    associative and commutative.
    """

    counts: Array
    lo: Array
    width: Array
    min_val: Array
    max_val: Array


def check_calib_bins(bins: Any) -> int:
    """``bins`` of a calibration histogram: an int in ``[2, 2**24]`` (bins are indexed in the values' float
    type, float32 for float32 data, whose integers are exact up to ``2**24``)."""
    return check_int(bins, "bins", minimum=2, maximum=MAX_BINS)


def calib_histogram_init(
    *, bins: int = 2048, num_channels: int | None = None, dtype: Any = None, device: Any = None, xp: Any
) -> CalibHistogram:
    """An empty histogram state of ``bins`` bins (2 to 2**24), per tensor or of ``num_channels`` channels.

    ``dtype`` (float32 by default) is that of the grid and range, and values are binned in it."""
    bins = check_calib_bins(bins)
    shape = () if num_channels is None else (check_int(num_channels, "num_channels", minimum=1),)
    xp = namespace_of(xp)
    dtype = xp.float32 if dtype is None else dtype
    return CalibHistogram(
        xp.zeros(shape + (bins,), dtype=index_dtype(xp), device=device),
        xp.zeros(shape, dtype=dtype, device=device),
        xp.zeros(shape, dtype=dtype, device=device),
        xp.full(shape, INF, dtype=dtype, device=device),
        xp.full(shape, -INF, dtype=dtype, device=device),
    )


@functools.lru_cache(maxsize=2)
def _pow2_table(double: bool) -> np.ndarray:
    """``2**k`` for the normal exponents ``k = emin .. emax`` (``-1022 .. 1023`` in float64, ``-126 .. 127``
    in float32), exact (``math.ldexp``)."""
    low, high = (-1022, 1023) if double else (-126, 127)
    return np.array([math.ldexp(1.0, k) for k in range(low, high + 1)], dtype=np.float64 if double else np.float32)


def _exp2(e: Array, xp: Any) -> Array:
    """``2**e`` for integer-valued ``e`` in the normal exponents (``[-1022, 1023]`` in float64, ``[-126, 127]`` in
    float32), exactly: looked up in a table of powers of two (``pow``, ``exp2`` and ``log2`` are not exact on
    every backend)."""
    double = e.dtype == xp.float64
    table = device_constant(_pow2_table(double), xp, _device(e))
    index = xp.astype(e, index_dtype(xp)) + (1022 if double else 126)
    return xp.reshape(take(table, xp.reshape(index, (-1,)), 0, xp), tuple(e.shape))


def _pow2_at_least(v: Array, xp: Any) -> Array:
    """The smallest power of two ``>= v``, for normal finite ``v > 0``."""
    low, high = (-1022.0, 1023.0) if v.dtype == xp.float64 else (-126.0, 127.0)
    p = _exp2(clamp(xp.ceil(xp.log2(v)), low, high, xp), xp)
    p = xp.where(p * 0.5 >= v, p * 0.5, p)  # log2 may be off by an ulp either way
    return xp.where(p < v, p * 2, p)


def _floor_div(v: Array, w: Array, xp: Any) -> Array:
    """``floor(v / w)`` for a power of two ``w > 0``, exactly: ``v / w`` is exact unless it underflows,
    and a negative ``v`` whose quotient underflows to ``-0`` lies in the bin below 0 (floor ``-1``)."""
    q = v / w
    return xp.where((q == 0) & (v < 0), -1.0, xp.floor(q))


def _range_caps(dtype: Any, xp: Any) -> tuple[float, float]:
    """The grid's range caps ``-2**emax`` and ``2**emax (1 - 2**-digits)``, the largest float below ``2**emax``
    (float32: ``+-2**127``; float64: ``+-2**1023``)."""
    digits, emax = (53, 1023) if dtype == xp.float64 else (24, 127)
    return -(2.0**emax), 2.0**emax * (1 - 2.0**-digits)


def _grid(low: Array, high: Array, min_width: Array, bins: int, xp: Any) -> tuple[Array, Array]:
    """The canonical grid for the range ``[low, high]``: the smallest power-of-two width ``w`` with
    ``w >= min_width``, ``w >= max(|low|, |high|) * 2**(2 - digits)`` (every ``x / w`` then has an exact
    integer part) and ``floor(high / w) - floor(low / w) < bins``; ``lo = floor(low / w) * w``.
    Both bounds are clamped into ``[-2**emax, 2**emax)`` (2**127 in float32, :func:`_range_caps`) so the
    grid stays finite, and values beyond count as the caps (binning caps them: a value at float32's maximum
    falls in the bin of ``2**127``'s predecessor on every grid, so re-binning moves it where a single pass
    bins it). An empty range (``low > high``) gives ``(0, 0)``. Host NumPy arrays go
    through :func:`_grid_host` (the same bits)."""
    fast = _grid_host(low, high, min_width, bins, xp)
    if fast is not None:
        return fast
    dtype = low.dtype
    digits = 53 if dtype == xp.float64 else 24
    low_cap, high_cap = _range_caps(dtype, xp)
    smallest_normal = 2.0**-1022 if dtype == xp.float64 else 2.0**-126
    empty = ~(low <= high)
    low = xp.where(empty, 0.0, clamp(low, low_cap, high_cap, xp))
    high = xp.where(empty, 0.0, clamp(high, low_cap, high_cap, xp))
    need = xp.maximum(high / bins - low / bins, min_width)
    need = xp.maximum(need, clamp(xp.maximum(xp.abs(low), xp.abs(high)) * 2.0 ** (2 - digits), smallest_normal, None, xp))
    width = _pow2_at_least(need, xp)
    for _ in range(2):  # width >= range / bins: one doubling suffices for bins >= 3, two for bins = 2
        width = xp.where(_floor_div(high, width, xp) - _floor_div(low, width, xp) >= bins, width * 2, width)
    lo = _floor_div(low, width, xp) * width
    return xp.where(empty, 0.0, lo), xp.where(empty, 0.0, width)


def _grid_host(low: Array, high: Array, min_width: Array, bins: int, xp: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_grid` of host NumPy float32/float64 rows (C,) by :func:`~observers_core._compiled.grid_kernel`:
    one call instead of ~40 NumPy calls on C values. ``None`` where it does not apply (other arrays or dtypes,
    kernels off, ``bins`` from 2**24, where the dtype's conversion of ``bins`` would round, a NaN bound)."""
    views = host_arrays(grid_kernel, xp, low, high, min_width)
    if views is None or bins >= 1 << 24 or views[0].ndim != 1 or views[0].dtype not in (np.float32, np.float64) or any(
            v.dtype != views[0].dtype or v.shape != views[0].shape for v in views):
        return None
    t = views[0].dtype.type
    digits, smallest_normal = (53, 2.0**-1022) if t is np.float64 else (24, 2.0**-126)
    low_cap, high_cap = _range_caps(views[0].dtype, np)
    lo, width = np.empty_like(views[0]), np.empty_like(views[0])
    if not grid_kernel(*views, t(bins), t(low_cap), t(high_cap), t(2.0 ** (2 - digits)), t(smallest_normal), lo, width):
        return None
    return lo, width


def _div_pow2(x: Array, w: Array, xp: Any) -> Array:
    """``x / w`` for powers of two ``w`` and multiples ``x`` of ``w``, exactly, also where ``1 / w`` is
    subnormal: XLA divides by a broadcast divisor as a multiplication by its reciprocal, and on the CPU
    flushes ``1 / 2**127`` to 0. Both are scaled by ``2**-64`` where ``w >= 2**64`` (exact: ``x / 2**64`` is a
    multiple of ``w / 2**64 >= 1``)."""
    s = xp.where(w >= 2.0**64, xp.full_like(w, 2.0**-64), 1.0)
    return (x * s) / (w * s)


def _rebin(counts: Array, lo: Array, width: Array, new_lo: Array, new_width: Array, xp: Any) -> Array:
    """Counts of the grid ``(lo, width)`` on the coarser aligned grid ``(new_lo, new_width)``, exactly:
    new bin ``m`` (left edge ``e_m = (new_lo / new_width + m) * new_width``) takes the old bins from
    ``first_m = clip(e_m / width - lo / width, 0, bins)`` on, summed through prefix sums; the first and last
    new bins also take every old bin below or beyond the new grid (as binning clips into the end bins).
    Both grids are multiples of ``width``, so ``e_m`` and ``first_m`` are exact wherever the result lies in
    ``[0, bins]``; outside it they may round or overflow to ``+inf`` and are clipped. Neither
    ``new_lo + m * new_width`` nor ``e_m - lo`` is formed (``2 * 2**127`` and ``2**127 - -2**127`` overflow
    float32 where the edge and the index do not), nor a ratio of widths (``new_width / width`` overflows
    float32 for a zeros-only state at ``2**-126``).
    Host arrays on the same filled grid (a KL accumulator whose range stopped growing) are returned as they are."""
    bins = counts.shape[-1]
    grids = [host_view(a, xp) for a in (lo, width, new_lo, new_width)]
    if all(g is not None for g in grids) and bool(np.all((grids[0] == grids[2]) & (grids[1] == grids[3]) & (grids[1] > 0))):
        return counts  # first_m = m: every bin stays
    filled = width > 0
    safe_w = xp.where(filled, width, 1.0)
    m = xp.arange(bins + 1, dtype=lo.dtype, device=_device(lo))
    safe_new_w = xp.where(new_width > 0, new_width, 1.0)
    with discarded_invalid(xp, over="ignore"):  # edges beyond float's range overflow to inf, clipped below
        edges = ((new_lo / safe_new_w)[:, None] + m) * new_width[:, None]  # exact; m * new_width may overflow
        first = clamp(_div_pow2(edges, safe_w[:, None], xp) - (lo / safe_w)[:, None], 0.0, float(bins), xp)
    first = xp.where((m == 0)[None, :], 0.0, xp.where((m == bins)[None, :], float(bins), first))
    at = _take_each(_cumsum0(counts, xp), xp.astype(first, index_dtype(xp)), xp)
    return xp.where(filled[:, None], at[:, 1:] - at[:, :-1], xp.zeros_like(counts))


def _rows(state: CalibHistogram, xp: Any) -> CalibHistogram:
    """The state with one row per channel: counts (C, bins), the rest (C,)."""
    bins = state.counts.shape[-1]
    return CalibHistogram(xp.reshape(state.counts, (-1, bins)), *(xp.reshape(a, (-1,)) for a in state[1:]))


def _unrows(like: CalibHistogram, rows: CalibHistogram, xp: Any) -> CalibHistogram:
    return CalibHistogram(
        xp.reshape(xp.astype(rows.counts, like.counts.dtype), tuple(like.counts.shape)),
        *(xp.reshape(r, tuple(a.shape)) for r, a in zip(rows[1:], like[1:])),
    )


def _combine(a: CalibHistogram, low: Array, high: Array, min_width: Array, xp: Any, fresh: bool = False
             ) -> tuple[CalibHistogram, Array, Array]:
    """``a``'s counts moved onto the canonical grid of ``a``'s range joined with ``[low, high]`` (``fresh``:
    ``a`` is :func:`calib_histogram_init`'s, all zero, nothing to re-bin)."""
    bins = a.counts.shape[-1]
    min_val = xp.minimum(a.min_val, low)
    max_val = xp.maximum(a.max_val, high)
    lo, width = _grid(min_val, max_val, xp.maximum(a.width, min_width), bins, xp)
    counts = xp.zeros_like(a.counts) if fresh else _rebin(a.counts, a.lo, a.width, lo, width, xp)
    return CalibHistogram(counts, lo, width, min_val, max_val), lo, width


def calib_histogram_update(
    state: CalibHistogram,
    x: Array,
    /,
    *,
    axis: int | None = None,
    absolute: bool = False,
    xp: Any = None,
    collective: Any = None,
) -> CalibHistogram:
    """Count ``x`` (``|x|`` with ``absolute``) into the state, per tensor or per channel along ``axis``.

    The grid grows as needed: the new one is the canonical grid (see :class:`CalibHistogram`) of the
    joint range with a width at least the old one, and the old counts are re-binned onto it exactly.
    With ``absolute`` the range includes 0, so the grid starts at 0 (``lo = 0``) as the KL and MSE
    searches expect. NaN and +/-Inf are not counted. Values are cast to the state's float dtype
    (float16, bfloat16 and integer inputs are fine). Empty ``x``: no-op. Same as merging the state with
    a fresh state updated with ``x``. With a :class:`~observers_core.Collective`, ``x`` is every member's:
    the members agree on the range (min/max), then sum the integer counts on the common grid.
    """
    xp = array_namespace(state.counts, xp=xp)
    check_real(x, xp)
    check_same_device(x, state.counts, xp)
    absolute = check_bool(absolute, "absolute")
    if check_collective(collective) is None and size(x) == 0:
        return state
    return _histogram_update(state, x, axis, absolute, xp, collective, None, False)


def abs_histogram_update(state: CalibHistogram, x: Array, seen: tuple[Array, Array], /, *, axis: int | None,
                         xp: Any, fresh: bool = False) -> CalibHistogram:
    """``calib_histogram_update(state, x, axis=axis, absolute=True)`` (no collective, ``x`` not empty) for a
    caller that already holds ``seen``, the finite range ``(min, max)`` of ``x`` per channel as the state's
    dtype (:func:`~observers_core.minmax_update` with ``ignore_nonfinite``): one pass over ``x`` fewer.
    ``|x|`` reaches ``max(-min, max)``, so ``seen`` gives the same range, bit for bit, where casting ``x``
    to the state's dtype creates no infinity (``x`` of that dtype or a narrower one). ``fresh``: ``state``
    is :func:`calib_histogram_init`'s (no old counts to re-bin)."""
    return _histogram_update(state, x, axis, True, xp, None, seen, fresh)


def _histogram_update(state, x, axis, absolute, xp, collective, seen, fresh) -> CalibHistogram:
    """:func:`calib_histogram_update` after its checks; ``seen``, ``fresh``: as in :func:`abs_histogram_update`."""
    rows = _rows(state, xp)
    channels, bins = rows.counts.shape
    if axis is None:
        if state.lo.ndim != 0:
            raise ValueError(f"a per-channel state of shape {tuple(state.lo.shape)} needs axis=<channel axis>")
    else:
        axis = normalize_axis(axis, x.ndim)
        if tuple(state.lo.shape) != (x.shape[axis],):
            raise ValueError(
                f"x has {x.shape[axis]} channels along axis {axis} but the state holds "
                f"{tuple(state.lo.shape)}; build the state with num_channels={x.shape[axis]}"
            )
    values = xp.astype(channel_rows(x, axis, xp), rows.lo.dtype, copy=False)
    # host memory with the compiled kernels: one pass each for range and counts
    host = host_view(values, xp) if size(x) > 0 else None
    if host is None and size(x) > 0:  # the array code counts |x| of the finite values
        if absolute:
            values = xp.abs(values)
        finite = is_finite(values, xp)
    if size(x) == 0:  # only with a collective: this member contributes nothing
        low, high = xp.full_like(rows.min_val, INF), xp.full_like(rows.max_val, -INF)
    elif host is not None or seen is not None:  # the signed finite range per row; |x| reaches max(-low, high)
        low, high = host_finite_range(values, (1,), xp) if seen is None else (
            xp.reshape(xp.astype(a, rows.lo.dtype), (channels,)) for a in seen)
        if absolute:  # (+0.0, never -0.0)
            low, high = xp.where(low <= high, 0.0, low), xp.maximum(-low, high) + 0.0
    else:
        low = xp.min(xp.where(finite, values, INF), axis=-1)
        high = xp.max(xp.where(finite, values, -INF), axis=-1)
    if absolute:
        low = xp.where(low <= high, 0.0, low)
    low, high = reduce_range(low, high, collective)
    merged, lo, width = _combine(rows, low, high, xp.zeros_like(low), xp, fresh)
    if size(x) == 0:
        fresh = xp.zeros_like(merged.counts)
    elif host is not None:
        grids = zip(host_view(lo, xp), host_view(width, xp))
        high_cap = host[0].dtype.type(_range_caps(host[0].dtype, np)[1])
        fresh = xp.asarray(np.stack([
            split_sum(calib_counts_kernel, row, threads(row.shape[0]), absolute, low_edge, w, bins, high_cap)
            for row, (low_edge, w) in zip(host, grids)
        ]))
    else:  # values beyond the grid's range cap count as the cap (see _grid)
        safe_w = xp.where(width > 0, width, 1.0)
        capped = clamp(values, None, _range_caps(values.dtype, xp)[1], xp)
        index = _floor_div(xp.where(finite, capped, 0.0), safe_w[:, None], xp) - (lo / safe_w)[:, None]
        index = xp.astype(xp.clip(index, 0.0, float(bins - 1)), index_dtype(xp))
        offsets = xp.arange(channels, dtype=index.dtype, device=_device(index))[:, None] * bins
        flat = xp.where(finite, index + offsets, channels * bins)
        fresh = bincount(xp.reshape(flat, (-1,)), channels * bins, xp)
    fresh = xp.reshape(xp.astype(fresh, merged.counts.dtype), (channels, bins))
    if collective is not None:
        fresh = collective.sum(fresh)
    return _unrows(state, merged._replace(counts=merged.counts + fresh), xp)


def calib_histogram_merge(a: CalibHistogram, b: CalibHistogram, /, *, xp: Any = None) -> CalibHistogram:
    """The histogram of both states' data, exactly: both move onto the canonical grid of the joint
    range with the larger width, then add. Associative and commutative, with an empty state
    (:func:`calib_histogram_init`) as identity."""
    xp = array_namespace(a.counts, b.counts, xp=xp)
    if tuple(a.counts.shape) != tuple(b.counts.shape):
        raise ValueError(f"cannot merge histogram states of shapes {tuple(a.counts.shape)} and {tuple(b.counts.shape)}")
    ra, rb = _rows(a, xp), _rows(b, xp)
    merged, lo, width = _combine(ra, rb.min_val, rb.max_val, rb.width, xp)
    other = _rebin(rb.counts, rb.lo, rb.width, lo, width, xp)
    return _unrows(a, merged._replace(counts=merged.counts + other), xp)


def calib_histogram_edges(state: CalibHistogram, /, *, xp: Any = None) -> Array:
    """The ``bins + 1`` edges ``lo + width * arange(bins + 1)``, computed exactly (and without overflow)
    as ``(lo / width + j) * width``; shape ``(..., bins + 1)``. All 0 for an empty state."""
    xp = array_namespace(state.lo, xp=xp)
    bins = state.counts.shape[-1]
    steps = xp.arange(bins + 1, dtype=state.lo.dtype, device=_device(state.lo))
    width = state.width[..., None]
    start = state.lo[..., None] / xp.where(width > 0, width, 1.0)
    return (start + steps) * width
