"""Compiled CPU kernels (numba), optional: every kernel of the package lives here, and this is the one
place that knows whether they are available.

The array-API code is the reference and runs everywhere (every namespace, every device, under
``jax.jit``). Where a loop over the data cannot be written with array operations without large
temporaries or many small kernel launches (binning a tensor into a histogram, the per-candidate error
sums of the L2 search), host-memory arrays (NumPy, and torch CPU tensors through a zero-copy NumPy view)
go through a numba kernel instead, computing the same float32 operations in the same order. Kernels are
compiled on first use and cached on disk (``cache=True``).

numba comes with the ``torch`` and ``test`` extras (``pip install observers-core[fast]`` alone). Without
it, or with ``OBSERVERS_CORE_NO_NUMBA=1`` in the environment, or ``ENABLED = False`` at run time (the
tests switch it to check both paths), the array-API code runs.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from . import _namespace
from ._namespace import is_numpy_namespace, is_torch_namespace

try:
    import numba
    from numba.core import types as _types
    from numba.extending import intrinsic as _intrinsic
except ImportError:  # optional: the array-API code runs instead
    numba = None

__all__ = [
    "ENABLED", "AVAILABLE", "fma", "host_arrays", "host_scalar", "host_view", "kernel", "numba", "numpy_views",
    "split_ranges", "split_sum", "threads",
    # histogram and L2-search kernels
    "cascade_kernel", "clip_kernel", "counts_kernel", "cumsum32_kernel", "end_steps_kernel", "errors_kernel",
    "floor_div_kernel", "linspace_kernel", "rebin_kernel", "sum32_kernel",
    # finite ranges and the calibration histogram
    "abs_max_kernel", "calib_counts_kernel", "finite_range_kernel", "fq_block_sums_kernel", "gather_sums_kernel",
    "grid_kernel", "kl_curve_kernel", "kl_log_inputs_kernel", "mse_level_errors_kernel", "mse_prepare_kernel",
    "pairwise_blocks", "pairwise_combine", "pairwise_gather_sum", "pairwise_sum_kernel", "percentile_rows_kernel",
    "pick_kernel",
]  # fmt: skip

AVAILABLE = numba is not None
ENABLED = AVAILABLE and os.environ.get("OBSERVERS_CORE_NO_NUMBA", "") in ("", "0")

Array = Any


def kernel(*, parallel: bool = False) -> Callable[[Callable], Callable | None]:
    """``numba.njit`` (no fastmath: IEEE float32 operations as written, no contraction into FMAs; cached
    on disk; releases the GIL); ``None`` in place of the function without numba."""

    def decorate(fn: Callable) -> Callable | None:
        if numba is None:
            return None
        return numba.njit(cache=True, nogil=True, parallel=parallel, error_model="numpy")(fn)

    return decorate


if numba is not None:

    @_intrinsic
    def fma(typingctx, a, b, c):
        """``a * b + c`` rounded once (LLVM's ``fma``), inside kernels; all three the same float type."""
        if not (a == b == c and isinstance(a, _types.Float)):
            return None

        def codegen(context, builder, signature, args):
            return builder.fma(*args)

        return a(a, b, c), codegen

else:
    fma = None


def host_view(x: Array, xp: Any) -> np.ndarray | None:
    """``x`` as a NumPy array without a copy when a compiled kernel may take it (kernels enabled, ``x`` a
    NumPy array or a torch CPU tensor of a dtype NumPy has that needs no grad); ``None`` otherwise."""
    if not ENABLED:
        return None
    if is_numpy_namespace(xp):
        return np.asarray(x)
    if is_torch_namespace(xp) and not _namespace.CUDA_PATH_ON_CPU:
        try:  # torch refuses tensors off the CPU, tensors that need grad and dtypes NumPy lacks
            return x.numpy()
        except (RuntimeError, TypeError):
            return None
    return None


def host_arrays(kernel: Callable | None, xp: Any, *arrays: Array, dtype: Any = None) -> tuple[np.ndarray, ...] | None:
    """The NumPy arrays a compiled host path of the core takes, or ``None`` where the array code runs
    instead: ``kernel`` missing (no numba), kernels disabled, a namespace other than NumPy's (such a path
    returns NumPy arrays; the torch adapters hand CPU tensors to the core as NumPy views), or an array
    not of ``dtype`` (when given)."""
    if kernel is None or not ENABLED or not is_numpy_namespace(xp):
        return None
    views = tuple(np.asarray(a) for a in arrays)
    if dtype is not None and any(v.dtype != dtype for v in views):
        return None
    return views


def numpy_views(xp: Any, *arrays: Array) -> tuple[np.ndarray, ...] | None:
    """Zero-copy NumPy views of torch CPU tensors (cast to float32 first where NumPy has no such dtype),
    for functions that run torch CPU tensors as NumPy arrays when the kernels are enabled: the same
    float32 arithmetic, and NumPy's operations on small arrays cost a fraction of torch's. ``None``
    for anything else (kernels disabled, other namespaces, other devices)."""
    if not ENABLED or not is_torch_namespace(xp) or _namespace.CUDA_PATH_ON_CPU or \
            any(a.device.type != "cpu" for a in arrays):
        return None
    import torch  # only reached with torch tensors

    to_float = (torch.bfloat16, torch.complex32)
    return tuple((a.float() if a.dtype in to_float else a).detach().numpy() for a in arrays)


def host_scalar(x: Array) -> np.generic:
    """A 0-d NumPy array or torch CPU tensor as a NumPy scalar of its dtype (so a float32 bound stays
    float32 inside a kernel)."""
    return (x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x))[()]


def threads(n: int, *, grain: int = 1 << 16) -> int:
    """How many threads :func:`split_sum` may use on ``n`` elements: ``OBSERVERS_CORE_THREADS`` where it is
    set, else the calling thread plus the CPUs of this process that torch's intra-op threads leave free
    (all of them when torch is not loaded, none at torch's default of one thread per core); at most one
    per ``grain`` elements.

    Between a model's layers torch's OpenMP threads hold the other cores (they spin after each parallel
    op), so pool threads there compete with them: on the 2-core benchmark machine a whole calibration run
    was no faster with a pool thread than with the calling thread alone
    (``benchmarks/bench_kernel_threads.py``). ``torch.set_num_threads(k)`` leaves ``cpus - k`` of them to
    these kernels."""
    fixed = os.environ.get("OBSERVERS_CORE_THREADS", "")
    if fixed and (not fixed.isdigit() or int(fixed) < 1):
        raise ValueError(f"OBSERVERS_CORE_THREADS must be a positive integer, got {fixed!r}")
    if n < 2 * grain:  # one thread whatever the setting (no system call for small inputs)
        return 1
    if fixed:
        workers = int(fixed)
    else:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "get_num_threads"):
            workers = workers - torch.get_num_threads() + 1
    return max(1, min(workers, n // grain))


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def split_sum(fn: Callable, x: np.ndarray, workers: int, *args: Any, chunk: int = 1 << 16) -> np.ndarray:
    """``fn(x, *args)`` for a kernel whose result adds up over slices of ``x`` (counts), on up to
    ``workers`` threads (the kernels release the GIL): the calling thread and ``workers - 1`` pool threads
    take ``chunk``-element slices in turn until none is left, and the partial results are summed.

    The calling thread never waits for a pool thread. Slices are claimed, not assigned, so a pool thread
    that gets no CPU (torch's OpenMP threads spin for a while after each parallel op) leaves the unclaimed
    ones to the others; a slice a pool thread claimed and has not finished when the calling thread runs
    out of work is counted again by the calling thread (every slice's count is the same whoever makes it,
    and the late one is dropped). The worst case is the one-thread time plus one slice per pool thread."""
    if workers <= 1 or x.shape[0] <= chunk:
        return fn(x, *args)
    starts = range(0, x.shape[0], chunk)
    parts: list = [None] * len(starts)
    claims = iter(range(len(starts)))  # next() on it is atomic under the GIL

    def work() -> None:
        for k in claims:
            parts[k] = fn(x[starts[k]:starts[k] + chunk], *args)

    pool = _executor(workers)
    helpers = [pool.submit(work) for _ in range(workers - 1)]
    work()
    for helper in helpers:
        helper.cancel()  # one that never started
    for k, part in enumerate(parts):  # claimed by a pool thread that is still at it (or descheduled)
        if part is None:
            parts[k] = fn(x[starts[k]:starts[k] + chunk], *args)
    return sum(parts)


def split_ranges(fn: Callable, count: int, workers: int, *args: Any, chunk: int) -> None:
    """``fn(start, stop, *args)`` over ``[0, count)`` in ``chunk``-long ranges, claimed by up to ``workers``
    threads as in :func:`split_sum`, for a kernel that writes each range's results into its own part of
    an output: the result does not depend on the threads. Unlike :func:`split_sum`, the calling thread
    waits for a range a pool thread has started (a late write into the caller's output could land after
    the caller has moved on)."""
    if workers <= 1 or count <= chunk:
        fn(0, count, *args)
        return
    starts = iter(range(0, count, chunk))

    def work() -> None:
        for start in starts:
            fn(start, min(start + chunk, count), *args)

    _claimed(work, workers)


def _executor(workers: int) -> ThreadPoolExecutor:
    """The shared pool, with at least ``workers - 1`` threads."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < workers - 1:
            _pool = ThreadPoolExecutor(max_workers=workers - 1, thread_name_prefix="observers_core")
        return _pool


def _claimed(work: Callable[[], Any], workers: int) -> list:
    """``work()`` on the calling thread and ``workers - 1`` pool threads; the results of those that ran."""
    pool = _executor(workers)
    helpers = [pool.submit(work) for _ in range(workers - 1)]
    return [work()] + [helper.result() for helper in helpers if not helper.cancel()]  # cancelled: never started


# --- histogram and L2-search kernels (observers_core._histogram, observers_core._l2_search) ---
# Each computes the float32 operations of the array-API function it names, in its order, bit for bit.

_CHUNK = 4096  # counts_kernel bins this many values (vectorized), then counts them
_TALLY_SPAN = 1 << 30  # values counted into int32 tallies before they are added into the int64 counts
#: rows of a tally (:func:`_tally` is written for two): value ``j`` is counted in row ``j % 2``, so a run of
#: one bin (the zeros of a ReLU output) makes two independent chains of increments instead of one
_LANES = 2


@kernel()
def _tally(idx, n, tally, counts, done):  # pragma: no cover (compiled)
    """``tally[j % 2, idx[j]] += 1`` for ``j < n``, then, after every ``_TALLY_SPAN`` values and after the
    last chunk, the rows of the int32 ``(_LANES, L)`` ``tally`` added into the int64 ``counts`` and
    cleared (no row reaches 2**31 in a span). ``done``: the values counted before this chunk, ``-1`` for the
    last chunk. Unsigned indices (no wraparound checks), int32 tallies and two rows count fastest: on
    1.6M values of a ReLU output (half zeros) 2.3 ms with one row, 1.5 with two, 1.2-1.5 with four, but
    four rows (32 KB for 2051 bins, a whole L1 cache) are 10% slower than one on uniform data."""
    whole = n - n % 2
    for j in range(0, whole, 2):
        tally[0, idx[j]] += 1
        tally[1, idx[j + 1]] += 1
    if whole < n:
        tally[0, idx[whole]] += 1
    if done < 0 or (done + n) % _TALLY_SPAN == 0:
        for b in range(tally.shape[1]):
            counts[b] += np.int64(tally[0, b]) + np.int64(tally[1, b])
            tally[0, b] = tally[1, b] = 0


@kernel()
def counts_kernel(x, lo, hi, lo_half, half, num, den, bins, bounded):  # pragma: no cover (compiled)
    """:func:`_counts` for host memory: the same float32 operations per element, ``_CHUNK`` values at a
    time binned branch-free (so it vectorizes: the slice keeps indices non-negative, which numba needs
    to drop its wraparound checks), then counted."""
    zero, nan_bin, out_bin = x.dtype.type(0), x.dtype.type(bins + 1), x.dtype.type(bins + 2)
    counts = np.zeros(bins + 3, dtype=np.int64)
    tally = np.zeros((_LANES, bins + 3), dtype=np.int32)
    idx = np.empty(_CHUNK, dtype=np.uint32)
    for start in range(0, x.shape[0], _CHUNK):
        chunk = x[start:start + _CHUNK]
        for j in range(chunk.shape[0]):
            v = chunk[j]
            pos = (v * half - lo_half) * num / den
            b = zero if pos <= zero else pos
            b = out_bin if b >= out_bin else b
            b = out_bin if pos - pos != zero else b  # +/-inf (and NaN, next line)
            b = out_bin if bounded and not (lo <= v <= hi) else b
            idx[j] = np.uint32(nan_bin if pos != pos else b)
        _tally(idx, chunk.shape[0], tally, counts, -1 if start + _CHUNK >= x.shape[0] else start)
    return counts


@kernel()
def linspace_kernel(start, end, steps):  # pragma: no cover (compiled; checked against torch.linspace)
    """:func:`_linspace` for host memory, with true fused multiply-adds."""
    out = np.empty(steps, dtype=np.float32)
    step = (end - start) / np.float32(steps - 1)
    for i in range(steps):
        out[i] = fma(step, np.float32(i), start) if i < steps // 2 else fma(-step, np.float32(steps - 1 - i), end)
    return out


@kernel()
def rebin_kernel(hist, old_min, old_max, new_min, new_max, up):  # pragma: no cover (compiled)
    """:func:`_rebin` for host memory: the same float32 operations, one pass. The sub-bin midpoints are
    found among the edges by a forward scan (they rise with ``i``; a midpoint below the previous one
    restarts the scan, so the bucket is ``bucketize``'s in every case) and added up in order."""
    bins = hist.shape[0]
    parts = bins * up
    half_width = np.float32(0.5) * ((old_max - old_min) / np.float32(parts))
    mids = linspace_kernel(old_min, old_max, parts + 1)
    edges = linspace_kernel(new_min, new_max, bins + 1)
    out = np.zeros(bins, dtype=np.float32)
    j, previous = 0, -np.inf
    for i in range(parts):
        mid = mids[i] + half_width
        if mid < previous:
            j = 0
        previous = mid
        while j <= bins and edges[j] <= mid:  # j = #{edges <= mid}
            j += 1
        out[min(max(j - 1, 0), bins - 1)] += hist[i // up] / np.float32(up)
    return out


@kernel()
def cumsum32_kernel(v, out):  # pragma: no cover (compiled)
    """:func:`_cumsum32` of a NumPy array into ``out``: one float64 sum, left to right."""
    acc = 0.0
    for i in range(v.shape[0]):
        acc += np.float64(v[i])
        out[i] = np.float32(acc)


@kernel()
def end_steps_kernel(cs, total, betas, last_b, out):  # pragma: no cover (compiled)
    """:func:`_end_steps` of a NumPy array (``total`` a Python float, ``betas`` the padded table)."""
    for i in range(cs.shape[0]):
        if not total > 0.0:
            out[i] = last_b + 1
            continue
        est = np.floor((1.0 - np.float64(cs[i]) / total) * 1e5)
        if not np.isfinite(est):
            est = 0.0
        base = np.int64(min(max(est - 3.0, 0.0), np.float64(last_b)))
        count = 0
        for j in range(7):
            if np.float32(betas[base + j] * total) >= cs[i]:
                count += 1
        out[i] = base + count


@kernel()
def cascade_kernel(x, m):  # pragma: no cover (compiled)
    """:func:`~observers_core._histogram._cascade_last` of ``x[:m]`` (``x`` is overwritten): sums of 16, of 16 of those, ... (3
    levels), then ``((l0 + l1) + l2) + l3`` over the levels' leftovers."""
    zero = np.float32(0.0)
    left = np.zeros(4, np.float32)
    size = m
    for level in range(3):
        groups = size // 16
        acc = zero
        for j in range(16 * groups, size):
            acc += x[j]
        left[level] = acc
        for g in range(groups):
            acc = zero
            for j in range(16 * g, 16 * g + 16):
                acc += x[j]
            x[g] = acc
        size = groups
    acc = zero
    for j in range(size):
        acc += x[j]
    return ((left[0] + left[1]) + left[2]) + acc


@kernel()
def sum32_kernel(v, scratch):  # pragma: no cover (compiled)
    """:func:`~observers_core._histogram.sum32` of a 1-D float32 array (torch's ``cascade_sum`` order); ``scratch`` holds at least
    ``v.shape[0] // 32 + 1`` float32."""
    n = v.shape[0]
    lanes = 8 if n >= 8 else 1
    nvec = n // lanes
    ilp = nvec // 4
    cols = 4 * lanes
    part = np.empty(cols, np.float32)
    for c in range(cols):  # column c of the (ilp, 4 * lanes) blocks
        for j in range(ilp):
            scratch[j] = v[j * cols + c]
        part[c] = cascade_kernel(scratch, ilp)
    acc = part[:lanes].copy()
    for t in range(4 * ilp, nvec):
        for lane in range(lanes):
            acc[lane] += v[t * lanes + lane]
    for k in range(1, 4):
        for lane in range(lanes):
            acc[lane] += part[k * lanes + lane]
    if lanes == 1:
        return acc[0]
    out = np.float32(0.0)
    for i in range(nvec * lanes, n):
        out += v[i]
    for lane in range(lanes):
        out += acc[lane]
    return out


@kernel()
def floor_div_kernel(a, b):  # pragma: no cover (compiled)
    """:func:`_floor_div` of two float32 scalars."""
    if np.isinf(a):
        return np.float32(np.nan)
    q = np.float32(np.floor(a / b))
    if np.float64(q) * np.float64(b) > np.float64(a):
        q -= np.float32(1.0)
    return q


@kernel()
def clip_kernel(x, top):  # pragma: no cover (compiled)
    """``clip(x, 0, top)`` as NumPy's (NaN stays NaN)."""
    if np.isnan(x):
        return x
    return min(max(x, np.float32(0.0)), top)


@kernel()
def errors_kernel(hist, starts, ends, bin_width, dst_nbins, top, stop, out):  # pragma: no cover (compiled)
    """:func:`_errors` for host arrays: the same float32 operations in the same order, each row summed
    in :func:`~observers_core._histogram.sum32`'s order, into ``out`` (float32). ``bin_width``, ``dst_nbins`` and ``top =
    dst_nbins - 1`` are Python floats. Returns the index of the first error above the previous one
    (``len(starts)`` if none); with ``stop``, the candidates after it are not evaluated (``out`` keeps
    what it held there)."""
    n = hist.shape[0]
    w32 = np.float32(bin_width)
    top = np.float32(top)
    three, half_one, one = np.float32(3.0), np.float32(0.5), np.float32(1.0)
    density = np.empty(n, np.float32)
    for i in range(n):
        density[i] = hist[i] / w32
    row = np.empty(n, np.float32)
    scratch = np.empty(n // 32 + 1, np.float32)
    rise = starts.shape[0]
    for c in range(starts.shape[0]):
        s = starts[c]
        dst64 = bin_width * np.float64(ends[c] - s + 1) / dst_nbins
        out[c] = np.float32(0.0)
        if dst64 != 0.0:
            dst = np.float32(dst64)
            half = np.float32(dst64 / 2.0)
            neg_half = -half
            half3 = half * half * half
            neg_half3 = neg_half * neg_half * neg_half
            inner = (half3 - neg_half3) / three
            for i in range(n):
                begin = np.float32(i - s) * w32
                end = begin + w32
                p = clip_kernel(floor_div_kernel(begin, dst), top)
                q = clip_kernel(floor_div_kernel(end, dst), top)
                d = density[i]
                db = begin - (p + half_one) * dst
                norm = d * ((half3 - db * db * db) / three)
                norm = norm + ((q - p) - one) * (d * inner)
                de = end - (q * dst + half)
                row[i] = norm + d * ((de * de * de - neg_half3) / three)
            out[c] = sum32_kernel(row, scratch)
        if c > 0 and out[c] > out[c - 1] and rise == starts.shape[0]:
            rise = c
            if stop:
                break
    return rise


# --- finite ranges and the calibration histogram (observers_core._minmax, observers_core._calibration) ---
# One pass over the data each, instead of the array-API code's masked copies; same float operations.


@kernel()
def finite_range_kernel(x, absolute):  # pragma: no cover (compiled)
    """Per row of the 2-D float ``x``: ``(min, max)`` of its finite values (of ``|x|`` with ``absolute``),
    ``(+inf, -inf)`` for a row with none; as ``min(where(isfinite(x), x, inf))`` and the max likewise."""
    rows = x.shape[0]
    inf = x.dtype.type(np.inf)
    zero = x.dtype.type(0)
    lo = np.full(rows, inf, dtype=x.dtype)
    hi = np.full(rows, -inf, dtype=x.dtype)
    for r in range(rows):
        a, b = inf, -inf
        row = x[r]
        for j in range(row.shape[0]):
            v = row[j]
            if absolute:
                v = abs(v)
            if v - v == zero:  # finite
                a = v if v < a else a
                b = v if v > b else b
        lo[r], hi[r] = a, b
    return lo, hi


@kernel()
def calib_counts_kernel(x, absolute, lo, width, bins, high_cap):  # pragma: no cover (compiled)
    """:func:`calib_histogram_update`'s counts of the 1-D float ``x`` on the grid ``(lo, width)`` (scalars
    of ``x``'s dtype): ``floor(v / w)`` (``-1`` where a negative ``v / w`` underflows to 0) minus
    ``lo / w``, clipped to ``[0, bins - 1]``, with ``v`` capped to ``high_cap`` (the grid range's cap, a
    scalar of ``x``'s dtype); non-finite values are not counted. ``_CHUNK`` values at a
    time are binned branch-free (so it vectorizes), then counted; :func:`split_sum` can share the work."""
    zero, one = x.dtype.type(0), x.dtype.type(1)
    top, discard = x.dtype.type(bins - 1), x.dtype.type(bins)
    w = width if width > zero else one
    base = lo / w
    counts = np.zeros(bins + 1, dtype=np.int64)
    tally = np.zeros((_LANES, bins + 1), dtype=np.int32)
    idx = np.empty(_CHUNK, dtype=np.uint32)
    for start in range(0, x.shape[0], _CHUNK):
        chunk = x[start:start + _CHUNK]
        for j in range(chunk.shape[0]):
            v = chunk[j]
            v = abs(v) if absolute else v
            c = high_cap if v > high_cap else v
            q = c / w
            f = x.dtype.type(np.floor(q))
            f = -one if (q == zero) & (c < zero) else f
            i = f - base
            i = zero if i < zero else i
            i = top if i > top else i
            idx[j] = np.uint32(discard if v - v != zero else i)
        _tally(idx, chunk.shape[0], tally, counts, -1 if start + _CHUNK >= x.shape[0] else start)
    return counts[:bins]


@kernel()
def _floor_div_pow2(v, w, minus_one):  # pragma: no cover (compiled)
    """:func:`_floor_div` of two scalars of one float type (``minus_one`` of that type)."""
    q = v / w
    return minus_one if q == 0 and v < 0 else np.floor(q)


@kernel()
def _np_maximum(a, b):  # pragma: no cover (compiled)
    """``np.maximum`` of two scalars: NaN if either is NaN."""
    return a if a >= b or a != a else b


@kernel()
def grid_kernel(low, high, min_width, bins, low_cap, high_cap, digits_scale, smallest, lo_out, width_out
                ):  # pragma: no cover (compiled)
    """:func:`_grid` of the 1-D float ``low``, ``high`` and ``min_width`` (one float type; ``bins`` and the
    bounds ``-2**emax``, ``2**emax (1 - 2**-digits)``, ``2**(2 - digits)`` and the smallest normal number as
    scalars of that type) into ``lo_out``/``width_out``: the array code's operations in that type, in its
    order. The width is the smallest power of two ``>= need`` (``need`` is at least the smallest normal
    number), from ``frexp``: the array code's ``log2`` with its corrections gives exactly that power of two,
    and ``2 * 2**emax`` (infinite) for a ``need`` above ``2**emax`` (an infinite bound). Returns False where
    a ``need`` is NaN (the array code's exponent table lookup then fails; it runs instead)."""
    zero, two, minus_one = low.dtype.type(0), low.dtype.type(2), low.dtype.type(-1)
    top = -low_cap  # 2**emax
    for i in range(low.shape[0]):
        lo, hi = low[i], high[i]
        empty = not lo <= hi
        lo, hi = _np_maximum(lo, low_cap), _np_maximum(hi, low_cap)
        lo = zero if empty else (lo if lo <= high_cap or lo != lo else high_cap)  # np.minimum
        hi = zero if empty else (hi if hi <= high_cap or hi != hi else high_cap)
        need = _np_maximum(hi / bins - lo / bins, min_width[i])
        need = _np_maximum(need, _np_maximum(_np_maximum(abs(lo), abs(hi)) * digits_scale, smallest))
        if need != need:
            return False
        if need > top:
            width = top * two
        else:
            mant, expo = math.frexp(np.float64(need))  # need = mant * 2**expo, 0.5 <= mant < 1
            width = low.dtype.type(math.ldexp(1.0, expo - 1 if mant == 0.5 else expo))
        for _ in range(2):
            if _floor_div_pow2(hi, width, minus_one) - _floor_div_pow2(lo, width, minus_one) >= bins:
                width = width * two
        lo_out[i] = zero if empty else _floor_div_pow2(lo, width, minus_one) * width
        width_out[i] = zero if empty else width
    return True


@kernel()
def abs_max_kernel(rows):  # pragma: no cover (compiled)
    """Per row of the 2-D float ``rows``: the largest ``|v|`` over its finite values, as float64 (0 for
    none): ``max(abs(where(isfinite(x), x, 0)))`` of the float64 rows."""
    out = np.zeros(rows.shape[0], dtype=np.float64)
    for r in range(rows.shape[0]):
        m = 0.0
        row = rows[r]
        for j in range(row.shape[0]):
            v = np.float64(row[j])
            if v - v == 0.0:
                a = abs(v)
                m = a if a > m else m
        out[r] = m
    return out


@kernel()
def fq_block_sums_kernel(first, stop, rows, blocks, inv_scale, scale, zero_point, float_zero_point, inv_norm,
                         quant_min, quant_max, out):  # pragma: no cover (compiled)
    """The sums behind :func:`candidate_errors` of the float ``rows`` (C, N) over the blocks ``first`` to
    ``stop`` of ``blocks = pairwise_blocks(N)``, into ``out`` (C, K + 1, blocks): for each row ``c`` and
    candidate ``k``, the sum over the block of ``e**2`` (:func:`_fq_square`) in NumPy's order, the last row
    of ``out`` counting the finite ``v``. ``float_zero_point``: the zero points are floats (added before
    rounding, as torch's per-channel kernel does for them), else integers (added after).

    Two candidates at a time (an odd last one paired with itself), each value loaded once, and no ``e**2``
    stored: :func:`_pairwise_block`'s eight running sums ``r_j = a[j] + a[j + 8] + ...`` (NumPy's, below
    ``end = n - n % 8``) are ``lanes[i + 8] = a[i] + lanes[i]`` for ``i < end`` from ``lanes[:8] = 0``, the
    same additions in the same order (``0 + a == a`` for these ``a``: never -0.0), ``r_j`` ending in
    ``lanes[end + j]``; a loop that vectorizes (slices keep the indices non-negative: numba then drops its
    wraparound checks). Then ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))`` and the rest one by one,
    as NumPy's; below 8 values ``end`` is 0 and the sum runs from 0 one by one, as NumPy's."""
    channels, k_count = scale.shape
    lanes0, lanes1 = np.zeros(136, dtype=np.float64), np.zeros(136, dtype=np.float64)  # [:8] stay 0
    out0, out1 = lanes0[8:], lanes1[8:]
    for c in range(channels):
        row = rows[c]
        w = inv_norm[c]
        for b in range(first, stop):
            block = row[blocks[b, 0]:blocks[b, 0] + blocks[b, 1]]
            size = block.shape[0]
            count = 0
            for i in range(size):
                count += 1 if block[i] - block[i] == 0 else 0
            out[c, k_count, b] = count
            end = size - size % 8 if size >= 8 else 0
            body, rest = block[:end], block[end:]
            for k in range(0, k_count, 2):
                j = min(k + 1, k_count - 1)
                s0, inv_s0, s1, inv_s1 = scale[c, k], inv_scale[c, k], scale[c, j], inv_scale[c, j]
                z0, z1 = np.float64(zero_point[c, k]), np.float64(zero_point[c, j])
                if float_zero_point:  # rint(v / s + z), clamped to [Q_min, Q_max], minus z
                    shift0, low0, high0 = z0, quant_min, quant_max
                    shift1, low1, high1 = z1, quant_min, quant_max
                else:  # rint(v / s) clamped to [Q_min - z, Q_max - z]: the same integers
                    shift0, low0, high0 = 0.0, quant_min - z0, quant_max - z0
                    shift1, low1, high1 = 0.0, quant_min - z1, quant_max - z1
                for i in range(body.shape[0]):
                    v = body[i]
                    out0[i] = _fq_square(v, inv_s0, s0, shift0, low0, high0, w) + lanes0[i]
                    out1[i] = _fq_square(v, inv_s1, s1, shift1, low1, high1, w) + lanes1[i]
                res0 = _eight_lanes(lanes0[end:end + 8]) if end else 0.0
                res1 = _eight_lanes(lanes1[end:end + 8]) if end else 0.0
                for i in range(rest.shape[0]):
                    res0 += _fq_square(rest[i], inv_s0, s0, shift0, low0, high0, w)
                    res1 += _fq_square(rest[i], inv_s1, s1, shift1, low1, high1, w)
                out[c, k, b], out[c, j, b] = res0, res1


@kernel()
def _eight_lanes(r):  # pragma: no cover (compiled)
    """NumPy's pairwise total of its eight running sums ``r``: ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))``."""
    return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))


@kernel()
def _fq_square(v, inv_s, s, shift, low, high, w):  # pragma: no cover (compiled)
    """``e**2`` with ``e = ((clamp(rint(v * inv_s + shift), low, high) - shift) * s - v) * w`` in float64, 0 for
    a ``v`` that is not finite: :func:`fq_block_sums_kernel`'s term, with ``inv_s = 1 / s`` and ``z`` as the
    array code computes them. Integer zero points: ``shift = 0``, ``low, high = Q_min - z, Q_max - z`` (the
    array code's ``clamp(rint(v * inv_s) + z, Q_min, Q_max) - z``: integers, the same values); float zero
    points: ``shift = z``, ``low, high = Q_min, Q_max`` (its ``clamp(rint(v * inv_s + z), ...) - z``);
    ``w = 1 / norm``, a power of two, whose product equals the array code's quotient ``/ norm``."""
    v = np.float64(v)
    q = np.rint(v * inv_s + shift)
    q = low if q < low else q
    q = high if q > high else q
    e = ((q - shift) * s - v) * w
    return e * e if v - v == 0.0 else 0.0


@kernel()
def mse_level_errors_kernel(first, stop, p0, p1, r, off, consts, levels, bins, eps16, err, bound):  # pragma: no cover
    """:func:`_squared_error_by_levels` for host arrays, candidates ``first`` to ``stop``: for each channel
    ``c`` and candidate ``k``, with ``n_m = clip(ceil((m - 1/2) r - o), 0, bins)`` over ``m = 1 .. levels - 1``,
    the boundary sums ``Y0 = sum P0[n_m]``, ``Y1 = sum (2m - 1) P0[n_m]``, ``X1 = sum P1[n_m]``, then the error
    ``max(S2 - 2 u S1 + u**2 S0 + 2 r X1 - r**2 Y1 + 2 r o Y0, 0) * unit`` (``u = (levels - 1) r - o``) into
    ``err`` and its bound ``eps16 * (sum of the six terms' magnitudes) * unit`` into ``bound`` (C, K).
    ``consts`` (C, 4): ``S0, S1, S2, unit``; ``off`` (C,). Every float64 operation is the array code's, in its
    order; the prefix sums of integer counts are integers, summed here as int64: exact, so equal to the
    array code's sums (below 2**53, where those are exact)."""
    top = np.float64(bins)
    top_level = np.float64(levels - 1)
    half = np.arange(1, levels).astype(np.float64) - 0.5  # m - 1/2, exactly
    index = np.empty(levels - 1, dtype=np.uint32)  # (unsigned 32-bit indices vectorize)
    for c in range(r.shape[0]):
        q0, q1 = p0[c].astype(np.int64), p1[c].astype(np.int64)
        ok, s0, s1, s2, unit = off[c], consts[c, 0], consts[c, 1], consts[c, 2], consts[c, 3]
        for k in range(first, stop):
            rk = r[c, k]
            for i in range(half.shape[0]):  # the boundaries first (vectorized), then the gathers: ~1.5x faster
                n = np.ceil(half[i] * rk - ok)
                n = 0.0 if n < 0.0 else n
                n = top if n > top else n
                index[i] = np.uint32(np.int32(n))
            y0 = y1 = x1 = 0
            for i in range(half.shape[0]):
                g = q0[index[i]]
                y0 += g
                y1 += (2 * i + 1) * g
                x1 += q1[index[i]]
            u = top_level * rk - ok
            t1 = 2.0 * u * s1
            t2 = u * u * s0
            t3 = 2.0 * rk * np.float64(x1)
            t4 = rk * rk * np.float64(y1)
            t5 = 2.0 * rk * ok * np.float64(y0)
            e = s2 - t1 + t2 + t3 - t4 + t5
            err[c, k] = (e if e >= 0.0 or e != e else 0.0) * unit  # np.maximum(e, 0.0): NaN and -0.0 kept
            bound[c, k] = eps16 * (abs(s2) + abs(t1) + abs(t2) + abs(t3) + abs(t4) + abs(t5)) * unit


@kernel()
def _pairwise_block(a):  # pragma: no cover (compiled)
    """NumPy's ``pairwise_sum`` of a 1-D float64 array of at most 128 values: below 8 one by one from 0,
    else eight running sums combined as ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))``, then the rest."""
    n = a.shape[0]
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[i]
        return res
    r0, r1, r2, r3, r4, r5, r6, r7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
    stop = n - n % 8
    for i in range(8, stop, 8):
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(stop, n):
        res += a[i]
    return res


@kernel()
def pairwise_blocks(n):  # pragma: no cover (compiled)
    """The blocks ``(start, size)`` (L, 2) that NumPy's contiguous float64 sum of ``n`` values adds one by
    one, in order (``pairwise_sum``: above 128 values it sums the halves ``n2 = n // 2 - (n // 2) % 8``
    and ``n - n2`` and adds them; a block of at most 128 is :func:`_pairwise_block`)."""
    out = np.empty((n // 64 + 2, 2), dtype=np.int64)
    starts = np.empty(64, dtype=np.int64)
    sizes = np.empty(64, dtype=np.int64)
    top, count = 0, 0
    starts[0], sizes[0] = 0, n
    while top >= 0:  # depth first, left half first
        start, m = starts[top], sizes[top]
        top -= 1
        if m <= 128:
            out[count, 0], out[count, 1] = start, m
            count += 1
            continue
        half = m // 2 - (m // 2) % 8
        starts[top + 1], sizes[top + 1] = start + half, m - half
        starts[top + 2], sizes[top + 2] = start, half
        top += 2
    return out[:count]


@kernel()
def _pairwise_walk(a, block_sums, n, sizes, phase, sums):  # pragma: no cover (compiled)
    """NumPy's float64 sum of ``n`` values in its pairwise order (``pairwise_sum``: above 128 values it
    adds the sums of the halves ``n2 = n // 2 - (n // 2) % 8`` and ``n - n2``), the halves visited depth
    first, left first. A block of at most 128 values is :func:`_pairwise_block` of ``a`` where ``a`` holds
    the values (one row), else the next column of ``block_sums`` (R, L): the sums of :func:`pairwise_blocks`
    of R rows of ``n`` values, in order, all rows walked at once. ``sizes``, ``phase`` (int64, at least 64)
    and ``sums`` (float64, (at least 64, R)) are scratch; the rows' sums end in ``sums[0]``, the first
    is returned."""
    rows = sums.shape[1]
    depth, filled, taken, offset = 0, 0, 0, 0
    sizes[0], phase[0] = n, 0
    while depth >= 0:
        m = sizes[depth]
        if m <= 128:  # a block: its sums go on the value stack
            if a.shape[0] > 0:
                sums[filled, 0] = _pairwise_block(a[offset:offset + m])
                offset += m
            else:
                for r in range(rows):
                    sums[filled, r] = block_sums[r, taken]
                taken += 1
            filled, depth = filled + 1, depth - 1
        elif phase[depth] == 2:  # both halves done
            filled -= 1
            for r in range(rows):
                sums[filled - 1, r] = sums[filled - 1, r] + sums[filled, r]
            depth -= 1
        else:
            half = m // 2 - (m // 2) % 8
            phase[depth] += 1
            sizes[depth + 1] = half if phase[depth] == 1 else m - half
            phase[depth + 1] = 0
            depth += 1
    return sums[0, 0]


@kernel()
def pairwise_combine(block_sums, n):  # pragma: no cover (compiled)
    """NumPy's sums of ``n`` values for each row of ``block_sums`` (R, L), the sums of its
    :func:`pairwise_blocks` in order (float64 (R,)): each pair of halves added as ``left + right``, as
    ``pairwise_sum`` does; one walk for all rows."""
    if n <= 128:
        return block_sums[:, 0].copy()
    sums = np.empty((64, block_sums.shape[0]), dtype=np.float64)
    _pairwise_walk(block_sums[0, :0], block_sums, n, np.empty(64, dtype=np.int64), np.empty(64, dtype=np.int64), sums)
    return sums[0].copy()


@kernel()
def pairwise_sum_kernel(a):  # pragma: no cover (compiled)
    """``np.sum`` of a contiguous 1-D float64 array, bit for bit (:func:`_pairwise_walk`)."""
    n = a.shape[0]
    if n <= 128:
        return _pairwise_block(a)
    return _pairwise_walk(a, np.empty((1, 0), dtype=np.float64), n, np.empty(64, dtype=np.int64),
                          np.empty(64, dtype=np.int64), np.empty((64, 1), dtype=np.float64))


@kernel()
def gather_sums_kernel(values, index, length):  # pragma: no cover (compiled)
    """``sum(values[:, index].reshape(C, -1, length), axis=-1)`` for float64 ``values`` (C, U): the
    sums of consecutive runs of ``length`` gathered values, each in NumPy's order
    (:func:`pairwise_sum_kernel`), without the (C, K, length) temporary."""
    channels = values.shape[0]
    count = index.shape[0] // length
    out = np.empty((channels, count), dtype=np.float64)
    run = np.empty(length, dtype=np.float64)
    for c in range(channels):
        for k in range(count):
            for j in range(length):
                run[j] = values[c, index[k * length + j]]
            out[c, k] = pairwise_sum_kernel(run)
    return out



@kernel()
def pairwise_gather_sum(values, index, start, n, run, sizes, phase, sums):  # pragma: no cover (compiled)
    """``np.sum(values[index[start:start + n]])`` (float64, bit for bit) without allocations: the values
    gathered into the scratch ``run`` (at least ``n`` long), then :func:`_pairwise_walk` (``sizes``,
    ``phase``, ``sums`` (64, 1): its scratch)."""
    for i in range(n):
        run[i] = values[index[start + i]]
    if n <= 128:
        return _pairwise_block(run[:n])
    return _pairwise_walk(run[:n], np.empty((1, 0), dtype=np.float64), n, sizes, phase, sums)


@kernel()
def kl_log_inputs_kernel(b, first, end, cand, tiny, cs, nonzero, logs):  # pragma: no cover (compiled)
    """The first half of :func:`_kl_strict` for host float64 counts ``b`` (C, B): the prefix sums ``cs`` of
    the counts (C, B + 1) and those of ``b > 0`` (``np.cumsum``'s order: left to right, the first element
    copied); for the U distinct group ranges ``[first, end)``, ``max(n, 1)`` (``n`` the non-empty bins, an
    integer <= B) into ``nonzero`` (C, U) int64; and per row of ``logs`` (C, U + B + 2K + 1) every other
    argument the array code takes the log of, in this order: ``max(G, tiny)`` of the ranges (``G`` the
    difference of ``cs``), ``where(b > 0, b, 1)``, ``where(v > 0, v, 1)`` with ``v = b[i - 1] + (T - C_i)`` and
    ``where(C_i > 0, C_i, 1)`` for the K candidates ``i`` (``C_i = cs[i]``, ``T = cs[B]``), and
    ``where(T > 0, T, 1)``. The caller takes ``np.log`` of ``logs`` (NumPy's log, as the array code's, on a
    contiguous array) and passes it to :func:`kl_curve_kernel`. Returns False, leaving the rest unspecified,
    where a count is negative or not finite or a row's total reaches 2**1000 (the array code runs then:
    below, no product, sum or quotient overflows, so there is no NaN or infinity to reproduce)."""
    channels, bins = b.shape
    ranges, count = first.shape[0], cand.shape[0]
    z = np.empty(bins + 1, dtype=np.float64)
    for c in range(channels):
        row, s, out = b[c], cs[c], logs[c]
        s[0], z[0] = 0.0, 0.0
        low = 0.0
        if bins > 0:
            s[1] = row[0]
            z[1] = 1.0 if row[0] > 0.0 else 0.0
            low = row[0]
        for j in range(1, bins):
            s[j + 1] = s[j] + row[j]
            z[j + 1] = z[j] + (1.0 if row[j] > 0.0 else 0.0)
            low = row[j] if row[j] < low else low
        total = s[bins]
        if not (low >= 0.0 and total < 2.0**1000):  # (False for NaN; an inf count makes the total inf)
            return False
        for u in range(ranges):
            g = s[end[u]] - s[first[u]]
            n = z[end[u]] - z[first[u]]
            out[u] = tiny if g < tiny else g  # np.maximum(G, tiny)
            nonzero[c, u] = 1 if n < 1.0 else np.int64(n)
        base = ranges
        for j in range(bins):
            out[base + j] = row[j] if row[j] > 0.0 else 1.0
        base += bins
        for k in range(count):
            kept = s[cand[k]]
            v = row[cand[k] - 1] + (total - kept)
            out[base + k] = v if v > 0.0 else 1.0
            out[base + count + k] = kept if kept > 0.0 else 1.0
        out[base + 2 * count] = total if total > 0.0 else 1.0
    return True


@kernel()
def kl_curve_kernel(b, cs, first, end, group_range, last_range, cand, levels, nonzero, log_n, logs, out
                    ):  # pragma: no cover (compiled)
    """The rest of :func:`_kl_strict` for host float64 counts, from :func:`kl_log_inputs_kernel`'s prefix sums,
    ``nonzero`` and the logs of its arguments (``logs``), with ``log_n`` (B + 1,) NumPy's log of
    ``max(0, 1), 1, 2, ..., B`` (the same values as the array code's ``log(max(n, 1))``): KL of every candidate
    into ``out`` (C, K), every float64 operation the array code's, in its order: ``log_q = log max(G, tiny) -
    log max(n, 1)`` and ``G log_q`` per distinct range, their sums over each candidate's ``levels`` groups
    (``group_range``) in NumPy's pairwise order (:func:`pairwise_gather_sum`), the prefix sums of ``x log x``
    (left to right), then ``p_log_p``, ``p_log_q``, the divergence, its clamp at 0 and the ``+inf`` of
    invalid candidates."""
    channels, bins = b.shape
    ranges, count = first.shape[0], cand.shape[0]
    log_q = np.empty(ranges, dtype=np.float64)
    terms = np.empty(ranges, dtype=np.float64)
    xlogx = np.empty(bins + 1, dtype=np.float64)
    sizes = np.empty(64, dtype=np.int64)
    phase = np.empty(64, dtype=np.int64)
    sums = np.empty((64, 1), dtype=np.float64)
    run = np.empty(levels, dtype=np.float64)
    for c in range(channels):
        row, s, lg, nz = b[c], cs[c], logs[c], nonzero[c]
        for u in range(ranges):
            log_q[u] = lg[u] - log_n[nz[u]]
            terms[u] = (s[end[u]] - s[first[u]]) * log_q[u]
        base = ranges
        xlogx[0] = 0.0
        for j in range(bins):  # cumsum of where(b > 0, b * log(b), 0), the first element copied
            t = row[j] * lg[base + j] if row[j] > 0.0 else 0.0
            xlogx[j + 1] = t if j == 0 else xlogx[j] + t
        base += bins
        total = s[bins]
        safe_total = total if total > 0.0 else 1.0
        log_total = lg[base + 2 * count]
        for k in range(count):
            sum_glog = pairwise_gather_sum(terms, group_range, k * levels, levels, run, sizes, phase, sums)
            i = cand[k]
            kept = s[i]
            tail = total - kept
            b_last = row[i - 1]
            v = b_last + tail
            p_log_p = xlogx[i - 1] + (v * lg[base + k] if v > 0.0 else 0.0)
            p_log_q = sum_glog + (tail * log_q[last_range[k]] if b_last > 0.0 else 0.0)
            kl = (p_log_p - p_log_q) / safe_total - log_total + lg[base + count + k]
            if total <= 0.0 or kept <= 0.0 or (b_last <= 0.0 and tail > 0.0):
                out[c, k] = np.inf
            else:
                out[c, k] = kl if kl >= 0.0 else 0.0  # np.maximum(kl, 0.0) (kl is finite here)


@kernel()
def mse_prepare_kernel(counts, edges, cand, mode, divisor, eps, p0, p1, r, off, consts, norms):  # pragma: no cover
    """The inputs of :func:`mse_level_errors_kernel` for :func:`_mse_search` of host float64 counts (C, B) with
    float64 ``edges`` (C or 1, B + 1) and the candidate bins ``cand`` (K,), every float64 operation the array
    code's, in its order: the candidates' ``amax`` (bin centers, :func:`midpoint`), their scales as
    :func:`calculate_qparams` computes them from ``(0, amax)`` (``mode`` 0: ``max(max(amax, 0) / divisor, eps)``,
    symmetric and affine; 1: ``(amax - 0) / divisor``, 1 unless above ``eps`` (float qparams); 1 where
    ``amax < 0``), the prefix sums ``p0``/``p1`` of ``h`` and ``h j`` (C, B + 1; left to right, the first
    element copied), ``S2 = sum h j j`` (NumPy's pairwise order), ``w``, ``r = s / w`` into ``r`` (C, K),
    ``o = a / w + 1/2`` into ``off`` (C,), ``S0, S1, S2, (w / norm)**2`` into ``consts`` (C, 4), and ``norm``
    (:func:`error_norm`) into ``norms`` (C,): the smallest power of two ``>= max |edges|`` (1 for 0), at most
    2**1022, from ``frexp`` (the array code's ``log2`` with its corrections gives that power of two exactly). Returns 0, or where the array code must run instead
    (results unspecified): 1 an edge is not finite, 2 ``max |edges|`` is subnormal, 3 the prefix sums of
    the counts are not all integers below 2**62 (what :func:`_integral` asks of the compiled level sums)."""
    channels, bins = counts.shape
    count = cand.shape[0]
    fbins = np.float64(bins)
    squares = np.empty(bins, dtype=np.float64)
    scale = np.empty(count, dtype=np.float64)
    for c in range(channels):
        e = edges[c if edges.shape[0] > 1 else 0]
        row, q0, q1 = counts[c], p0[c], p1[c]
        norm = 0.0
        for j in range(bins + 1):
            v = e[j]
            if v - v != 0.0:
                return 1
            a = abs(v)
            norm = a if a > norm else norm
        if norm == 0.0:
            norm = 1.0
        elif norm < 2.0**-1022:
            return 2
        mant, expo = math.frexp(norm)  # norm = mant * 2**expo, 0.5 <= mant < 1
        if expo >= 1023:  # the power of two is 2**1022 (mant 0.5) or above: the cap
            norm = 2.0**1022
        else:
            norm = math.ldexp(1.0, expo - 1) if mant == 0.5 else math.ldexp(1.0, expo)
        q0[0], q1[0] = 0.0, 0.0
        for j in range(bins):
            t = row[j] * np.float64(j)
            q0[j + 1] = row[j] if j == 0 else q0[j] + row[j]
            q1[j + 1] = t if j == 0 else q1[j] + t
            squares[j] = t * np.float64(j)
        for j in range(bins + 1):
            v = q0[j]
            if not (np.floor(v) == v and abs(v) < 2.0**62):
                return 3
        top = -np.inf
        for k in range(count):
            u, v = e[cand[k]], e[cand[k] + 1]
            amax = (u + v) / 2.0
            if amax - amax != 0.0:  # (u + v overflowed; u and v are finite)
                amax = u / 2.0 + v / 2.0
            if amax < 0.0:
                s = 1.0
            elif mode == 0:
                s = (amax if amax > 0.0 else 0.0) / divisor
                s = s if s >= eps else eps
            else:
                s = (amax - 0.0) / divisor
                s = s if s > eps else 1.0
            scale[k] = s
            top = s if s > top else top
        w = (e[bins] - e[0]) / fbins
        floor_w = top * 2.0**-40
        w = w if w >= floor_w else floor_w
        for k in range(count):
            r[c, k] = scale[k] / w
        off[c] = e[0] / w + 0.5
        unit = w / norm
        consts[c, 0], consts[c, 1], consts[c, 3] = q0[bins], q1[bins], unit * unit
        consts[c, 2] = pairwise_sum_kernel(squares)
        norms[c] = norm
    return 0


@kernel()
def pick_kernel(objective, tol, slack, relative, last, out):  # pragma: no cover (compiled)
    """:func:`_pick` of a float64 ``objective`` (C, K) into ``out`` (C,): with ``best`` its row's minimum (NaN if
    any is NaN, as ``np.min``), the candidates ``<= best + tol`` (``relative``: ``<= best + (tol * best +
    slack[c])``) tie; ``last``: the largest index among them, else the smallest; none (a NaN row): K - 1 or 0."""
    channels, count = objective.shape
    for c in range(channels):
        row = objective[c]
        best = row[0]
        for k in range(count):
            v = row[k]
            best = v if v < best or v != v else best
            if v != v:
                break
        limit = best + (tol * best + slack[c]) if relative else best + tol
        pick = count - 1 if last else 0
        if last:
            for k in range(count - 1, -1, -1):
                if row[k] <= limit:
                    pick = k
                    break
        else:
            for k in range(count):
                if row[k] <= limit:
                    pick = k
                    break
        out[c] = pick


_PCT_BLOCK = 128  # percentile_rows_kernel sums the counts in blocks of this many bins, then scans the blocks
_PCT_SHIFT = 2.0**52  # an integer count v in [0, 2**52): the bits of v + 2**52, as an int64, are
_PCT_SHIFT_BITS = 0x4330000000000000  # these plus v

if numba is not None:

    @_intrinsic
    def _float_bits(typingctx, x):
        """The bits of a float64 as an int64 (a bitcast), inside kernels."""
        if x != _types.float64:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(_types.int64))

        return _types.int64(x), codegen

else:
    _float_bits = None


@kernel()
def _int_row_blocks(row, blocks):  # pragma: no cover (compiled)
    """One pass over a row of integer counts: the block sums into ``blocks`` (int64; the last holds the bins
    after the full blocks); returns the OR of the counts, which has the sign bit, or a bit from 40 up,
    exactly when one of them has (the caller tests it: a test here stops LLVM vectorizing the loop)."""
    n = row.shape[0]
    full = n // _PCT_BLOCK
    bits = 0
    for b in range(full + 1):
        base = b * _PCT_BLOCK
        acc = 0
        for j in range(_PCT_BLOCK if b < full else n - base):
            v = np.int64(row[base + j])
            acc += v
            bits |= v
        blocks[b] = acc
    return bits


@kernel()
def _float_row_blocks(row, blocks):  # pragma: no cover (compiled)
    """The block sums of a row of float counts, as :func:`_int_row_blocks`, branch-free (vectorized): with
    ``t = v + 2**52`` and ``d = bits(t) - bits(2**52)`` (int64), every count is an integer in ``[0, 2**40)``
    (the int64 sums of :func:`_int_row_blocks` are exact) iff every ``t - 2**52 == v`` (false for NaN) and
    the OR of the ``d`` lies in ``[0, 2**40)``: ``d`` does exactly for ``t`` in ``[2**52, 2**52 + 2**40)``,
    where ``t - 2**52`` is exact, an integer, and equal to ``d``; then the block sums of the ``d`` are those
    of the counts. Otherwise a second pass gives the status: 1 a count is negative or not finite, else 4
    (the block sums unspecified: the caller runs the array code); 0 when fine."""
    n = row.shape[0]
    full = n // _PCT_BLOCK
    bits, inexact = 0, 0
    for b in range(full + 1):
        base = b * _PCT_BLOCK
        acc = 0
        for j in range(_PCT_BLOCK if b < full else n - base):
            v = np.float64(row[base + j])
            t = v + _PCT_SHIFT
            d = _float_bits(t) - _PCT_SHIFT_BITS
            acc += d
            bits |= d
            inexact |= t - _PCT_SHIFT != v
        blocks[b] = acc
    if 0 <= bits < 2**40 and not inexact:
        return 0
    for j in range(n):
        v = np.float64(row[j])
        if not 0.0 <= v < np.inf:  # (NaN too)
            return 1
    return 4


@kernel()
def _edges_ok(e):  # pragma: no cover (compiled)
    """Whether the edges are finite and non-decreasing: ``e[j + 1] >= e[j]`` everywhere (false for NaN)
    and finite ends (which then make every edge finite); one branch-free pass."""
    bad = 0
    n = e.shape[0] - 1
    for j in range(n):
        bad |= not e[j + 1] >= e[j]
    return bad == 0 and e[0] - e[0] == 0 and e[n] - e[n] == 0


@kernel()
def percentile_rows_kernel(counts, edges, keep, symmetric, integer, vals):  # pragma: no cover
    """:func:`percentile_range` for the rows of ``counts`` (C, B) (``integer``: 1 a signed integer dtype, 2 an
    unsigned one, 0 a float dtype), edges (C or 1, B + 1): ``vals[1, c] = edges[c, i]``, ``i`` the first bin
    whose cumulative count ``S_i`` reaches ``target = keep * N`` (``N`` the row's total), ``vals[0, c]`` 0,
    with ``symmetric=False`` ``edges[c, bins - i']`` for the first ``i'`` whose count from the top reaches
    it. Returns the OR of the rows' statuses: bit 1 a count negative or not finite, bit 2 the edges not
    finite or decreasing (shared edges: checked with row 0 only), bit 4 the sums not exact; it stops at the
    first row with bit 1 or 4 (then ``vals`` is unspecified and the caller runs the array code). One
    thread: the pass reads the counts at memory speed (a second thread made 256 x 2048 counts slower on
    the 2-core benchmark machine).

    For integer counts with ``N < 2**53`` every partial sum is an exact integer in any order: one pass
    sums the row in blocks of ``_PCT_BLOCK`` bins (and checks it), then ``S_{i-1} = N - sum(counts[i:]) >=
    target``, i.e. ``sum(counts[i:]) <= N - ceil(target)``, is found by a scan from the top over the block
    sums, then over the bins of one block (from the bottom for ``i'``): the array code's comparisons exactly."""
    channels, bins = counts.shape
    full = bins // _PCT_BLOCK
    blocks = np.empty(full + 1, dtype=np.int64)
    shared = edges.shape[0] == 1
    result = 0
    for c in range(channels):
        row = counts[c]
        e = edges[0 if shared else c]
        if integer:  # status 1: a count is negative, 4: one reaches 2**40 (int64 block sums might overflow;
            bits = _int_row_blocks(row, blocks)  # unsigned: also from 2**63 up)
            status = 1 if bits < 0 and integer == 1 else (0 if 0 <= bits < 2**40 else 4)
        else:
            status = _float_row_blocks(row, blocks)
        status |= 0 if (shared and c > 0) or _edges_ok(e) else 2
        total = 0
        for b in range(full + 1):
            total += blocks[b]
        status |= 0 if status & 1 or total < 2**53 else 4
        result |= status
        if status & 5:
            return result
        slack = total - np.int64(np.ceil(keep * np.float64(total)))  # >= 0 (keep <= 1)
        b, suffix = full, 0  # block b holds bins [b * _PCT_BLOCK, min(bins, (b + 1) * _PCT_BLOCK))
        while b >= 1 and suffix + blocks[b] <= slack:  # every move down through block b is taken
            suffix += blocks[b]
            b -= 1
        i = min(bins, (b + 1) * _PCT_BLOCK) - 1
        while i > 0 and suffix + np.int64(row[i]) <= slack:
            suffix += np.int64(row[i])
            i -= 1
        vals[1, c] = e[i]
        vals[0, c] = 0
        if not symmetric:  # the first i' with sum(row[bins - 1 - i':]) >= target is bins - 1 - k, k the last
            b, prefix = 0, 0  # with sum(row[:k]) <= slack (from the bottom)
            while b < full and (b + 1) * _PCT_BLOCK <= bins - 1 and prefix + blocks[b] <= slack:
                prefix += blocks[b]
                b += 1
            k = b * _PCT_BLOCK
            while k < bins - 1 and prefix + np.int64(row[k]) <= slack:
                prefix += np.int64(row[k])
                k += 1
            vals[0, c] = e[k + 1]
    return result


# --- the LLM family's MSE grid search (observers_core.families.llm) ---

__all__ += ["grid_screen_kernel"]

_LN2 = 0.6931471805599453
_INV_LN2 = 1.4426950408889634
_SQRT2 = 1.4142135623730951
#: relative error bound of :func:`grid_screen_kernel`'s ``d**norm`` (``norm <= 6``): ``6 * 3e-8`` from ``log``,
#: ``1.7e-7`` from ``exp``, float64 rounding far below; about 2.5x that
SCREEN_ERROR = 2.0**-20


@kernel()
def grid_screen_kernel(first, stop, rows, weights, scale, zero_point, has_zp, qmin, qmax, is_float, emin, mbits,
                       norm, out, bad):  # pragma: no cover (compiled)
    """Approximate errors of the grid search for the groups ``first`` to ``stop`` of ``rows`` (G, N) float32:
    ``out[t, g] = sum_i w_i |fq_t(v_i) - v_i| ** norm`` (float64; ``w = 1`` when ``weights`` is empty), with
    ``fq_t(v) = (R(clamp(v / s + z, qmin, qmax)) - z) * s`` in float32 exactly as the array code computes it
    (``s = scale[t, g]``, ``z = zero_point[t, g]`` if ``has_zp``; ``R`` rint, or the nearest E2M1/E4M3 value
    for ``is_float``: quantum ``2**(max(floor(log2|y|), emin) - mbits)``); float32 ``+ - * /`` are float64
    operations rounded to float32 (the same result: 53 >= 2 * 24 + 2). Only ``d**norm`` is approximate:
    ``exp(norm * log d)`` from the float64 exponent and mantissa: ``log`` of the mantissa ``m`` in
    ``[sqrt(1/2), sqrt(2)]`` as ``2 atanh(u)``, ``u = (m - 1) / (m + 1)``, to ``u**7`` (the rest is below
    ``3e-8``), ``exp`` on ``|r| <= ln2 / 2`` to ``r**6`` (below ``1.7e-7`` relative): the result is within
    :data:`SCREEN_ERROR` (relative) for ``0 < norm <= 6`` (every ``d**norm`` of a float32 ``d > 0`` is a
    normal float64); ``d = 0`` counts 0. ``bad[g] = 1``
    for a group with a non-finite value or a candidate whose scale is not positive and finite or might
    overflow ``fq`` (the caller evaluates those exactly). Each loop over the N values vectorizes."""
    groups, n = rows.shape
    steps = scale.shape[0]
    has_w = weights.shape[0] > 0
    d = np.empty(n, dtype=np.float64)
    d_bits = d.view(np.int64)
    m = np.empty(n, dtype=np.float64)
    m_bits = m.view(np.int64)
    a = np.empty(n, dtype=np.float64)
    two = np.empty(n, dtype=np.float64)
    two_bits = two.view(np.int64)
    k = np.empty(n, dtype=np.int64)
    v64 = np.empty(n, dtype=np.float64)
    w64 = np.ones(n, dtype=np.float64)
    lanes = np.zeros(n + 8, dtype=np.float64)  # [:8] stay 0
    qbound = max(abs(qmin), abs(qmax))
    for g in range(first, stop):
        row = rows[g]
        top = 0.0
        finite = True
        for i in range(n):
            v = np.float64(row[i])
            v64[i] = v
            finite = finite and v - v == 0.0
            top = max(top, abs(v))
        if has_w:
            for i in range(n):
                w64[i] = np.float64(weights[g, i])
                finite = finite and w64[i] - w64[i] == 0.0
        if not finite:
            bad[g] = 1
            continue
        for t in range(steps):
            s = np.float64(scale[t, g])
            z = np.float64(zero_point[t, g]) if has_zp else 0.0
            if not (s > 0.0 and s * (qbound + abs(z)) + top < 1e38 and z - z == 0.0):
                bad[g] = 1
                break
            if is_float:
                for i in range(n):
                    y = np.float64(np.float32(v64[i] / s))
                    if has_zp:
                        y = np.float64(np.float32(y + z))
                    y = qmin if y < qmin else y
                    y = qmax if y > qmax else y
                    m[i] = abs(y)
                for i in range(n):  # the quantum 2 ** (max(e, emin) - mbits), e the binade of |y|
                    e = ((m_bits[i] >> 52) & 0x7FF) - 1023
                    e = emin if e < emin else e
                    two_bits[i] = (e - mbits + 1023) << 52
                for i in range(n):
                    y = np.float64(np.float32(v64[i] / s))
                    if has_zp:
                        y = np.float64(np.float32(y + z))
                    y = qmin if y < qmin else y
                    y = qmax if y > qmax else y
                    q = np.rint(y / two[i]) * two[i]
                    if has_zp:
                        q = np.float64(np.float32(q - z))
                    d[i] = np.float64(np.float32(abs(np.float64(np.float32(q * s)) - v64[i])))
            else:
                for i in range(n):
                    y = np.float64(np.float32(v64[i] / s))
                    if has_zp:
                        y = np.float64(np.float32(y + z))
                    y = qmin if y < qmin else y
                    y = qmax if y > qmax else y
                    q = np.rint(y)
                    if has_zp:
                        q = np.float64(np.float32(q - z))
                    d[i] = np.float64(np.float32(abs(np.float64(np.float32(q * s)) - v64[i])))
            for i in range(n):  # d = 2**k * m, m in [1, 2)
                b = d_bits[i]
                m_bits[i] = (b & 0xFFFFFFFFFFFFF) | 0x3FF0000000000000
                k[i] = (b >> 52) - 1023
            for i in range(n):
                mm = m[i]
                kk = np.float64(k[i])
                up = mm > _SQRT2
                mm = mm * 0.5 if up else mm
                kk = kk + 1.0 if up else kk
                u = (mm - 1.0) / (mm + 1.0)  # log(mm) = 2 atanh(u), |u| <= 0.1716
                uu = u * u
                log_m = 2.0 * u * (1.0 + uu * (1.0 / 3 + uu * (1.0 / 5 + uu * (1.0 / 7))))
                y = norm * (kk * _LN2 + log_m)
                j = np.rint(y * _INV_LN2)
                r = y - j * _LN2  # |r| <= 0.347
                a[i] = 1.0 + r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r / 720)))))
                k[i] = np.int64(j)
            for i in range(n):
                two_bits[i] = (k[i] + 1023) << 52
            for i in range(n):
                term = a[i] * two[i] * w64[i]
                lanes[i + 8] = (term if d[i] > 0.0 else 0.0) + lanes[i]
            if n >= 8:
                r8 = lanes[n:n + 8]
                out[t, g] = ((r8[0] + r8[1]) + (r8[2] + r8[3])) + ((r8[4] + r8[5]) + (r8[6] + r8[7]))
            else:
                total = 0.0
                for i in range(n):
                    total += lanes[i + 8] - lanes[i]
                out[t, g] = total
    return 0
