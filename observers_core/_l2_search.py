"""torch's L2 range search (``HistogramObserver._non_linear_param_search``) and the qparams of a
histogram state, as pure array functions with no Python loop over the quantile steps.

The walk's candidates come from cumulative-sum arithmetic (:func:`_candidates`), their errors are evaluated
in blocks until one rises (:func:`_errors`; on JAX in a ``lax.while_loop``, :func:`_jax_errors`), and the
stop is a vectorized first-rise search. The arithmetic is torch 2.13's float32 CPU arithmetic, in
torch's order, so the range found is torch's.

NumPy arrays and torch CPU tensors (through zero-copy NumPy views) run the same search with compiled
kernels (numba, see ``_compiled.py``) for its loops over bins: the end-bound step counts
(:func:`_end_steps`), and the errors, candidate by candidate up to the first rise; they take the first 32
candidates first (:func:`_search_bins_compiled`). Each kernel computes the array code's operations in its
order, bit for bit.

torch tensors on the torch CUDA path (``_namespace.triton_route``) run one Triton kernel instead
(``_triton_kernels.l2_search``: torch's loop itself, one candidate per iteration, with the qparams for
:func:`histogram_qparams`) and one host read of its flags (:class:`DeviceRead`: the checks, and what torch's
adapter warns about); it adds in torch's CPU order, so its range is the host path's bit for bit.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from . import _compiled
from ._compiled import cumsum32_kernel, end_steps_kernel, errors_kernel, numpy_views, sum32_kernel
from ._dtypes import QuantSpec
from ._histogram import (
    DST_BITS,
    HistogramState,
    check_bins,
    check_state,
    sum32,
    true_divide,
)
from ._namespace import (
    clamp,
    device_constant,
    scalar_like,
    device_of,
    array_namespace,
    cummin,
    float64_scope,
    index_dtype,
    is_jax_namespace,
    is_numpy_namespace,
    is_traced,
    namespace_of,
    read_flags,
    rounded,
    triton_route,
)
from ._qparams import QParams, calculate_qparams
from ._validate import INF, check_int

__all__ = ["check_histogram", "histogram_qparams", "non_linear_param_search", "quantization_error"]

Array = Any

# ----------------------------------------------------------------------------------------------
# float32 arithmetic in torch's order


def _floor_div(a: Array, b: Array, xp: Any) -> Array:
    """``floor(a / b)`` as torch's ``div(rounding_mode="floor")`` gives it for float32 (``b > 0``): the
    exact floor of the real quotient (torch reaches it through ``fmod``, 20x slower in NumPy). The
    rounded quotient is floored and lowered by one where ``q * b > a`` (checked exactly in float64);
    an infinite ``a`` gives NaN like ``fmod``."""
    q = xp.floor(true_divide(a, b, xp))
    with float64_scope(xp):
        above = xp.astype(q, xp.float64) * xp.astype(b, xp.float64) > xp.astype(a, xp.float64)
    q = q - xp.astype(above, q.dtype)
    return xp.where(xp.isinf(a), scalar_like(float("nan"), q, xp), q)


def _cumsum32(v: Array, xp: Any) -> Array:
    """Running sums of a float32 vector as torch's CPU ``cumsum`` forms them: in float64, each rounded
    to float32 (compiled for NumPy arrays)."""
    if _compiled_on(xp):
        out = np.empty(v.shape[0], np.float32)
        cumsum32_kernel(v, out)
        return out
    with float64_scope(xp):
        return xp.astype(xp.cumulative_sum(xp.astype(v, xp.float64)), xp.float32)


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


@functools.lru_cache(maxsize=1)
def _padded_betas() -> np.ndarray:
    """``beta_b``, then 6 times ``-inf`` (steps past the last one: thresholds no running sum reaches)."""
    return np.concatenate([_walk_tables()[1], np.full(6, -np.inf)])


def _end_steps(cs: Array, total: Array, xp: Any) -> Array:
    """``bt_i = #{b : float32(beta_b * total) >= cs_i}``: bin ``i`` stays inside the end bound while ``b <
    bt_i`` (``len(betas)`` everywhere when ``total`` is not ``> 0``). ``beta_b`` is within 1e-11 of ``1 - b *
    1e-5``, so the count switches within 3 steps of ``(1 - cs_i / total) * 1e5``: only those 7 thresholds
    are formed and compared (compiled for NumPy arrays, the same float64 and float32 operations)."""
    betas = _padded_betas()
    last_b = betas.shape[0] - 7
    if _compiled_on(xp):
        out = np.empty(cs.shape[0], np.int64)
        end_steps_kernel(cs, float(total), betas, last_b, out)
        return out
    idt = index_dtype(xp)
    dev = device_of(cs)
    with float64_scope(xp):
        t64 = xp.astype(total, xp.float64)
        c64 = xp.astype(cs, xp.float64)
        est = xp.floor((1.0 - true_divide(c64, t64, xp)) * 1e5)
        est = xp.where(xp.isfinite(est), est, xp.zeros_like(est))
        base = xp.astype(clamp(est - 3.0, 0.0, float(last_b), xp), idt)
        window = xp.reshape(base[None, :] + xp.arange(7, dtype=idt, device=dev)[:, None], (-1,))  # (7 * n,)
        thr_b = xp.astype(xp.take(xp.asarray(betas, device=dev), window) * t64, xp.float32)
    bt = base + xp.sum(xp.astype(xp.reshape(thr_b, (7, cs.shape[0])) >= cs[None, :], idt), axis=0)
    return xp.where(total > 0, bt, xp.full_like(bt, last_b + 1))


def _candidates(cs: Array, total: Array, n: int, xp: Any, *, limit: int | None = None):
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

    Returns ``(starts, ends, count)``: the first ``m = limit`` candidates (all ``n`` by default; the walk
    has fewer), of which the first ``count`` are real. Candidate ``r < m`` follows at most ``r`` start
    and ``r`` end steps, so the step tables need only ``a, b <= m + 1`` (their counts saturate at ``m + 1``,
    past every rank asked for)."""
    idt = index_dtype(xp)
    dev = device_of(cs)
    m = n if limit is None else limit
    a_np, bmax_np = _walk_prefix(n)
    with float64_scope(xp):
        t64 = xp.astype(total, xp.float64)
        thr_a = xp.astype(xp.asarray(a_np[: m + 2], device=dev) * t64, xp.float32)  # alpha * total, in float32
    bt = _end_steps(cs, total, xp)
    k = xp.astype(xp.searchsorted(cs, thr_a, side="left"), idt, copy=False)  # k(a), a in [0, m + 1]
    bt = xp.maximum(bt, xp.ones_like(bt))  # J(0) = n - 1 whatever the sums say; non-increasing in i
    neg_bt = -bt

    def end_after(b: Array) -> Array:  # J(b) = #{i : bt_i > b} - 1
        return xp.astype(xp.searchsorted(neg_bt, -b, side="left"), idt, copy=False) - 1

    ar = xp.arange(m + 2, dtype=idt, device=dev)
    j_b = end_after(ar)
    dr = cummin(j_b[:-1] - j_b[1:], xp)  # prefix minima over b in [0, m]
    dl = cummin(k[1:] - k[:-1], xp)  # over a in [0, m]
    a_star = xp.sum(xp.astype(dl > 0, idt))
    b0 = xp.sum(xp.astype(dr > 0, idt))
    # merge positions: b steps before start step a; start steps before end step b (phase 1: b < b0)
    nb = xp.astype(xp.searchsorted(-dr, -dl, side="right"), idt, copy=False)  # #{b : dr'_b >= dl'_a}
    big = xp.asarray(4 * n + 8, dtype=idt, device=dev)
    rank_a = xp.where(ar[:-1] < a_star, ar[:-1] + nb, big)  # (m + 1,), increasing
    # end steps: one per run of equal bt (drop of J); ordinal q by increasing b = decreasing i
    first = xp.concat([xp.ones((1,), dtype=xp.bool, device=dev), bt[1:] != bt[:-1]])
    cf = xp.cumulative_sum(xp.astype(first, idt))
    n_end = cf[-1]
    # candidate r: a start step if some rank_a == r, else the (r - #start steps before r)-th end step
    r = ar[:m]
    ia = xp.astype(xp.searchsorted(rank_a, r, side="left"), idt, copy=False)
    is_a = xp.take(rank_a, xp.minimum(ia, m)) == r
    q = r - ia
    i_end = xp.searchsorted(cf, n_end - q, side="left")  # >= 0
    b_end = xp.take(bt, xp.minimum(i_end, n - 1)) - 1  # >= 0
    y_end = xp.take(dr, xp.minimum(b_end, m))
    a_end = xp.where(b_end < b0, xp.astype(xp.searchsorted(-dl, -y_end, side="left"), idt, copy=False), a_star)
    a_pre = xp.where(is_a, xp.minimum(ia, m), a_end)  # <= m + 1
    b_pre = xp.where(is_a, xp.take(nb, xp.minimum(ia, m)), b_end)
    s = xp.take(k, a_pre)
    e = end_after(b_pre)
    k_next = xp.take(k, xp.minimum(a_pre + 1, m + 1))  # clipped only where no step exists
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
    with float64_scope(xp):
        widths = xp.astype(ends - starts + 1, xp.float64)
        dst64 = true_divide(bin_width * widths, float(dst_nbins), xp)
        dst = xp.astype(dst64, f32)[:, None]
        half = xp.astype(dst64 / 2, f32)[:, None]
        is_zero = dst64 == 0
        w32 = xp.astype(bin_width, f32)
    neg_half = -half
    top = scalar_like(float(dst_nbins - 1), w32, xp)
    zero = scalar_like(0.0, w32, xp)
    i = xp.arange(n, dtype=starts.dtype, device=device_of(hist))
    begin = rounded(xp.astype(i[None, :] - starts[:, None], f32) * w32, xp)
    end = begin + w32
    p = xp.clip(_floor_div(begin, dst, xp), zero, top)
    q = xp.clip(_floor_div(end, dst, xp), zero, top)
    density = true_divide(hist, w32, xp)
    half3 = rounded(half * half * half, xp)
    neg_half3 = rounded(neg_half * neg_half * neg_half, xp)
    db = begin - rounded((p + 0.5) * dst, xp)
    norm = rounded(density * true_divide(half3 - rounded(db * db * db, xp), 3.0, xp), xp)
    norm = norm + rounded(((q - p) - 1) * (density * true_divide(half3 - neg_half3, 3.0, xp)), xp)
    de = end - (rounded(q * dst, xp) + half)
    norm = norm + rounded(density * true_divide(rounded(de * de * de, xp) - neg_half3, 3.0, xp), xp)
    total = sum32(norm, xp)
    return xp.where(is_zero, xp.zeros_like(total), total)


def quantization_error(histogram: Array, min_val: Array, max_val: Array, start_bin: int, end_bin: int, /, *,
                       dst_nbins: int, xp: Any = None) -> Array:
    """torch's ``HistogramObserver._compute_quantization_error(start_bin, end_bin)``: the L2 error of
    quantizing the bins ``start_bin .. end_bin`` of the histogram over ``[min_val, max_val]`` onto
    ``dst_nbins`` uniform levels, in torch's float32 order (the terms are in :func:`_errors`); 0-d float32,
    0 when the levels have zero width. The search (:func:`non_linear_param_search`) evaluates this for
    each candidate."""
    xp = array_namespace(histogram, xp=xp)
    n = histogram.shape[0]
    for name, value in (("start_bin", start_bin), ("end_bin", end_bin)):
        check_int(value, name, minimum=0, maximum=n - 1)
    with float64_scope(xp):
        bin_width = true_divide(xp.astype(max_val, xp.float64) - xp.astype(min_val, xp.float64), float(n), xp)
    starts = xp.asarray([int(start_bin)], device=device_of(histogram))
    ends = xp.asarray([int(end_bin)], device=device_of(histogram))
    return _errors(xp.astype(histogram, xp.float32), starts, ends, bin_width, int(dst_nbins), xp)[0]


def _compiled_on(xp: Any) -> bool:
    """Whether the search of NumPy arrays runs the compiled kernels."""
    return _compiled.ENABLED and is_numpy_namespace(xp)


def _errors_compiled(hist: Array, starts: Array, ends: Array, bin_width: Array, dst_nbins: int, *,
                     stop: bool = False) -> tuple[np.ndarray, int]:
    """:func:`_errors` of NumPy arrays through :func:`errors_kernel`: ``(errors, first_rise)``; with
    ``stop``, the errors after the first rise are not evaluated (left 0)."""
    out = np.zeros(starts.shape[0], np.float32)
    rise = errors_kernel(hist, starts, ends, float(bin_width), float(dst_nbins), float(dst_nbins - 1), stop, out)
    return out, rise


_FIRST_CANDIDATES = 32  # torch's loop usually stops within its first 32 candidates


def _search_bins_compiled(hist: Array, min_val: Array, max_val: Array, dst_nbins: int, xp: Any) -> tuple[Array, Array]:
    """:func:`_search_bins` of NumPy arrays: the first 32 candidates, their errors (compiled) up to the
    first rise; all candidates only when the walk goes on past them without a rise."""
    n = hist.shape[0]
    bin_width = (float(max_val) - float(min_val)) / n  # float64, as the array code
    cs = _cumsum32(hist, xp)
    total = np.asarray(sum32_kernel(hist, np.empty(n // 32 + 1, np.float32)))
    first = min(n, _FIRST_CANDIDATES)
    starts, ends, count = _candidates(cs, total, n, xp, limit=first)
    count = int(count)
    _, rise = _errors_compiled(hist, starts[:count], ends[:count], bin_width, dst_nbins, stop=True)
    if rise == count == first < n:
        starts, ends, count = _candidates(cs, total, n, xp)
        count = int(count)
        _, rise = _errors_compiled(hist, starts[first - 1:count], ends[first - 1:count], bin_width, dst_nbins,
                                   stop=True)  # fmt: skip
        rise += first - 1
    # torch keeps the candidate before the first rise, else the last one, else (0, n - 1)
    chosen = rise - 1 if rise < count else count - 1
    if chosen < 0:
        return np.asarray(0), np.asarray(n - 1)
    return np.asarray(starts[chosen]), np.asarray(ends[chosen])


_JAX_BLOCK = 16


def _jax_errors(hist: Array, starts: Array, ends: Array, count: Array, bin_width: Array, dst_nbins: int,
                xp: Any) -> tuple[Array, Array]:
    """``(errors, evaluated)`` on JAX, under ``jit``: blocks of 16 candidates in a ``lax.while_loop`` that
    ends after the block where the error first rises or the real candidates run out (errors past the
    evaluated ones are 0)."""
    import jax  # only reached with jax arrays

    n = starts.shape[0]
    blocks = -(-n // _JAX_BLOCK)
    pad = blocks * _JAX_BLOCK - n
    starts = xp.concat([starts, xp.zeros((pad,), dtype=starts.dtype)])
    ends = xp.concat([ends, xp.zeros((pad,), dtype=ends.dtype) + (n - 1)])

    def more(state):
        i, _, rose = state
        return (i < blocks) & (i * _JAX_BLOCK < count) & ~rose

    def block(state):
        i, errs, _ = state
        at = i * _JAX_BLOCK
        s = jax.lax.dynamic_slice(starts, (at,), (_JAX_BLOCK,))
        e = jax.lax.dynamic_slice(ends, (at,), (_JAX_BLOCK,))
        new = _errors(hist, s, e, bin_width, dst_nbins, xp)
        prev = jax.lax.dynamic_slice(errs, (xp.maximum(at - 1, 0),), (1,))  # the previous block's last
        seq = xp.concat([xp.where(at > 0, prev, new[:1]), new])
        return i + 1, jax.lax.dynamic_update_slice(errs, new, (at,)), xp.any(seq[1:] > seq[:-1])

    # zeros like the candidates: of their sharding type, as the blocks' errors are (on a mesh with Explicit
    # axes, outside jax.set_mesh, plain zeros would carry no mesh and dynamic_update_slice refuses the mix)
    start = (xp.asarray(0, dtype=count.dtype), xp.zeros_like(starts, dtype=xp.float32),
             xp.zeros_like(count, dtype=xp.bool))
    i, errs, _ = jax.lax.while_loop(more, block, start)
    return errs[:n], xp.minimum(i * _JAX_BLOCK, count)


def _block_rows(n: int) -> int:
    return max(1, min(n, (1 << 20) // n))


def _search_bins(hist: Array, min_val: Array, max_val: Array, dst_nbins: int, xp: Any) -> tuple[Array, Array]:
    """(start_bin, end_bin) torch's ``_non_linear_param_search`` ends with, as 0-d index arrays."""
    if _compiled_on(xp):
        return _search_bins_compiled(hist, min_val, max_val, dst_nbins, xp)
    n = hist.shape[0]
    with float64_scope(xp):
        bin_width = true_divide(xp.astype(max_val, xp.float64) - xp.astype(min_val, xp.float64), float(n), xp)
    cs = _cumsum32(hist, xp)
    total = sum32(hist, xp)
    starts, ends, count = _candidates(cs, total, n, xp)
    rows = _block_rows(n)
    dev = device_of(hist)
    if is_jax_namespace(xp):  # possibly traced: blocks in a while_loop up to the first rise, no host sync
        errs, evaluated = _jax_errors(hist, starts, ends, count, bin_width, dst_nbins, xp)
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


def check_histogram(histogram: Array, min_val: Array, max_val: Array, /, *, xp: Any = None,
                    name: str = "histogram") -> None:  # fmt: skip
    """``ValueError`` unless the counts are finite and ``>= 0`` and the range is ordered and not infinite
    (``min_val <= max_val``; NaN bounds, a state poisoned by NaN, pass: they give NaN qparams).

    Eager arrays only: the check reads three flags on the host (one sync). Under ``jax.jit`` (traced
    arrays) nothing is checked and an invalid histogram gives an unspecified range. NumPy arrays (and
    torch CPU tensors, through their views in :func:`non_linear_param_search`) take the same check in
    two plain reductions (:func:`_host_flags`: a few microseconds, where the array-API form costs about
    25 us per call)."""
    flags = _host_flags(histogram, min_val, max_val) if xp is None or is_numpy_namespace(namespace_of(xp)) else None
    if flags is None:
        xp = array_namespace(histogram, min_val, max_val, xp=xp)
        if is_traced(histogram, min_val, max_val):
            return
        with np.errstate(all="ignore"):
            lo = xp.astype(min_val, xp.float32, copy=False)
            hi = xp.astype(max_val, xp.float32, copy=False)
            flags = xp.stack([
                xp.all((histogram >= 0) & xp.isfinite(histogram)),
                ~(xp.isinf(lo) | xp.isinf(hi)),
                ~(lo > hi),
            ])
        counts_ok, finite, ordered = read_flags(flags)
    else:
        counts_ok, lo, hi = flags
        finite = not (math.isinf(lo) or math.isinf(hi))
        ordered = not lo > hi
    _raise_invalid(counts_ok, finite, ordered, lo, hi, name)


def _raise_invalid(counts_ok: bool, finite: bool, ordered: bool, lo: Any, hi: Any, name: str) -> None:
    """:func:`check_histogram`'s errors for its three flags (``lo``, ``hi``: the range as float32)."""
    if not counts_ok:
        raise ValueError(f"{name} must hold finite counts >= 0 (no negative, NaN or infinite count)")
    if not finite:
        raise ValueError(f"{name} range must be finite, got min_val={float(lo)}, max_val={float(hi)}")
    if not ordered:
        raise ValueError(f"{name} range must not decrease, got min_val={float(lo)} > max_val={float(hi)}")


_HOST_KINDS = frozenset("fiub")  # real NumPy dtypes the host check takes (others: the array-API check)
_F32 = np.dtype(np.float32)
_F32_INF_BITS = 0x7F800000  # float32 +inf as uint32; non-negative finite float32 values lie below it


def _host_flags(histogram: Array, min_val: Array, max_val: Array) -> tuple[bool, float, float] | None:
    """:func:`check_histogram`'s flags for a NumPy histogram with 0-d NumPy bounds of real dtypes:
    ``(counts_ok, lo, hi)`` with the bounds rounded to float32 (as the array-API check casts them) as
    Python floats; ``None`` for anything else. ``counts_ok`` is ``min >= 0`` (false for a NaN or
    ``-inf`` count: NumPy's ``min`` propagates NaN) and ``max`` not infinite, the same answer as
    ``all((h >= 0) & isfinite(h))``. A float32 histogram is first read as uint32 in one integer
    ``max``: below the bits of ``+inf`` exactly when every count is ``+0.0`` or a positive finite value
    (``-0.0``, negative, NaN and infinite counts lie above), so only a histogram that fails that test
    takes the two float reductions."""
    if type(histogram) is not np.ndarray or histogram.dtype.kind not in _HOST_KINDS:
        return None
    bounds = []
    for bound in (min_val, max_val):
        if not isinstance(bound, (np.ndarray, np.generic)) or bound.ndim != 0:
            return None
        if bound.dtype is not _F32:
            if bound.dtype.kind not in _HOST_KINDS:
                return None
            with np.errstate(all="ignore"):  # float64 beyond float32's range: inf or 0, silently
                bound = np.float32(bound)
        bounds.append(float(bound))
    counts_ok = True
    if histogram.size and not (histogram.dtype is _F32 and int(histogram.view(np.uint32).max()) < _F32_INF_BITS):
        counts_ok = float(histogram.min()) >= 0  # Python floats: no warning for NaN
        if counts_ok and histogram.dtype.kind == "f":
            counts_ok = not math.isinf(histogram.max())
    return counts_ok, bounds[0], bounds[1]


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
    (float32, 0-d). Eagerly, :func:`check_histogram` rejects negative, NaN or infinite counts and an
    infinite or decreasing range with ``ValueError``; under ``jax.jit`` nothing is checked (no host sync).
    On the torch CUDA path: one Triton kernel and one host read (the check's flags).
    """
    xp = array_namespace(histogram, min_val, max_val, xp=xp)
    if histogram.ndim != 1 or histogram.shape[0] < 1:
        raise ValueError(f"histogram must have shape (bins,) with bins >= 1, got shape {tuple(histogram.shape)}")
    check_bins(histogram.shape[0], name="histogram.shape[0]")
    for name, arr in (("min_val", min_val), ("max_val", max_val)):
        if arr.ndim != 0:
            raise ValueError(f"{name} must be 0-d, got shape {tuple(arr.shape)}")
    if isinstance(dst_nbins, bool) or not isinstance(dst_nbins, (int, np.integer)) or dst_nbins < 1:
        raise ValueError(f"dst_nbins={dst_nbins!r} must be an int >= 1")
    if dst_nbins <= 2**53 and triton_route(histogram, min_val, max_val, xp=xp):  # torch CUDA: one kernel, one read
        with np.errstate(all="ignore"):
            hist, lo, hi = (xp.astype(a, xp.float32, copy=False) for a in (histogram, min_val, max_val))
        (found, _, _), _ = _device_search(hist, lo, hi, int(dst_nbins), xp)
        return found[0], found[1]
    originals = numpy_views(xp, histogram, min_val, max_val)  # torch CPU: the same check in NumPy (cheaper)
    if originals is not None:
        check_histogram(*originals)
    else:
        check_histogram(histogram, min_val, max_val, xp=xp)
    with np.errstate(all="ignore"):
        hist = xp.astype(histogram, xp.float32, copy=False)
        lo = xp.astype(min_val, xp.float32, copy=False)
        hi = xp.astype(max_val, xp.float32, copy=False)
        if originals is not None and hist is histogram and lo is min_val and hi is max_val:
            views = originals  # float32 already: the views of the casts are the views taken for the check
        else:
            views = numpy_views(xp, hist, lo, hi)
        if views is not None:  # torch CPU tensors: the NumPy search on their views, results as tensors
            new = _search_range(*views, int(dst_nbins), array_namespace(views[0]))
            return tuple(xp.asarray(v, device=device_of(hist)) for v in new)
        return _search_range(hist, lo, hi, int(dst_nbins), xp)


def _search_range(hist: Array, lo: Array, hi: Array, dst_nbins: int, xp: Any) -> tuple[Array, Array]:
    """``(lo + w * start, lo + w * (end + 1))`` for the bins :func:`_search_bins` finds, ``w = (hi - lo) / n``."""
    start, end = _search_bins(hist, lo, hi, dst_nbins, xp)
    width = true_divide(hi - lo, float(hist.shape[0]), xp)
    new_min = lo + rounded(width * xp.astype(start, xp.float32), xp)
    return new_min, lo + rounded(width * xp.astype(end + 1, xp.float32), xp)


def histogram_qparams(state: HistogramState, /, spec: QuantSpec, *, xp: Any = None) -> QParams:
    """torch's ``HistogramObserver.calculate_qparams``: :func:`non_linear_param_search` with
    ``dst_nbins = 2**bits(spec.dtype)``, then :func:`calculate_qparams` on the range found. A state that
    has seen nothing gives ``scale = 1``, ``zero_point = 0`` (torch also warns; adapters do that).
    Per-tensor schemes and integer dtypes only, as in torch. Invalid histograms: see
    :func:`check_histogram` (eager ``ValueError``; unchecked under ``jax.jit``). A float32 state on the
    torch CUDA path: one Triton kernel and one host read (:func:`histogram_qparams_on_device`)."""
    check_state(state)
    xp = array_namespace(state.histogram, xp=xp)
    _check_spec(spec)
    if device_qparams_route(state, xp=xp):  # torch CUDA: one kernel, one host read (the check)
        qparams, read = histogram_qparams_on_device(state, spec)
        check_read(read)
        return qparams
    empty = (state.min_val == INF) & (state.max_val == -INF)
    zero = xp.zeros_like(state.min_val)
    new_min, new_max = non_linear_param_search(  # an empty state searches [0, 0]; its result is replaced
        state.histogram, xp.where(empty, zero, state.min_val), xp.where(empty, zero, state.max_val),
        dst_nbins=2 ** DST_BITS[spec.dtype], xp=xp,
    )
    new_min = xp.where(empty, state.min_val, new_min)
    new_max = xp.where(empty, state.max_val, new_max)
    return calculate_qparams(new_min, new_max, spec, xp=xp)


def _check_spec(spec: QuantSpec) -> None:
    """``ValueError`` unless the histogram search takes ``spec`` (per tensor, an integer dtype)."""
    if not spec.qscheme.is_per_tensor:
        raise ValueError(f"spec.qscheme={spec.qscheme.value} is not supported; allowed: per_tensor_affine, "
                         "per_tensor_symmetric")  # fmt: skip
    if spec.dtype not in DST_BITS:
        raise ValueError(f"spec.dtype={spec.dtype} is not supported by the histogram search; allowed: "
                         + ", ".join(DST_BITS))  # fmt: skip


# ----------------------------------------------------------------------------------------------
# the torch CUDA path: the search (and the qparams) in one Triton kernel


class DeviceRead(NamedTuple):
    """What the one host read after the kernel says: :func:`check_histogram`'s flags, the state's own
    facts torch's adapter warns about, and the range as searched (float32 values as Python floats)."""

    counts_ok: bool
    finite: bool
    ordered: bool
    empty: bool  # the state has seen nothing: (+inf, -inf)
    nan: bool  # min_val or max_val is NaN
    lo: float
    hi: float


def check_read(read: DeviceRead, /, *, name: str = "histogram") -> None:
    """:func:`check_histogram`'s errors from a :class:`DeviceRead`."""
    _raise_invalid(read.counts_ok, read.finite, read.ordered, read.lo, read.hi, name)


def _device_search(hist: Array, lo: Array, hi: Array, dst_nbins: int, xp: Any, qparams: dict | None = None,
                   *, check: bool = True) -> tuple[tuple[Array, Array, Array], DeviceRead]:
    """``_triton_kernels.l2_search`` (float32 inputs) with the walk tables on the device, and the one host
    read of its flags: ``((range, scale, zero_point), read)``; with ``check``, :func:`check_histogram`'s
    errors are raised from the read."""
    from . import _triton_kernels

    tables = [device_constant(t, xp, device_of(hist)) for t in _walk_tables()]
    found, scale, zero_point, flags = _triton_kernels.l2_search(hist, lo, hi, dst_nbins, *tables, qparams=qparams)
    values = flags.tolist()  # the host read
    read = DeviceRead(*(bool(v) for v in values[:5]), values[5], values[6])
    if check:
        check_read(read)
    return (found, scale, zero_point), read


def device_qparams_route(state: HistogramState, /, *, xp: Any = None) -> bool:
    """Whether :func:`histogram_qparams_on_device` takes ``state``: float32 torch tensors on the torch CUDA
    path (``_namespace.triton_route``)."""
    xp = array_namespace(state.histogram, xp=xp)
    return (triton_route(*state, xp=xp) and state.histogram.ndim == 1
            and all(a.dtype == xp.float32 for a in state))  # fmt: skip


def histogram_qparams_on_device(state: HistogramState, /, spec: QuantSpec, *, dst_nbins: int | None = None,
                                eps: Array | None = None) -> tuple[QParams, DeviceRead]:
    """:func:`histogram_qparams` on the torch CUDA path (:func:`device_qparams_route`) in one Triton kernel
    and one host read, which is returned with the qparams instead of raising: the caller raises
    (:func:`check_histogram`'s errors from the read) and warns. ``dst_nbins``: the search's levels
    (``2**bits(spec.dtype)`` by default); ``eps``: a float32 tensor on the state's device (the torch
    observer's ``eps`` buffer) read by the kernel in place of ``spec.eps``."""
    _check_spec(spec)
    xp = array_namespace(state.histogram)
    levels = 2 ** DST_BITS[spec.dtype] if dst_nbins is None else int(dst_nbins)
    qparams = dict(symmetric=spec.qscheme.is_symmetric, quant_min=spec.quant_min, quant_max=spec.quant_max,
                   zero_point=spec.symmetric_zero_point if spec.qscheme.is_symmetric else 0,
                   eps=float(np.float32(spec.eps)) if eps is None else eps)  # fmt: skip
    (_, scale, zero_point), read = _device_search(state.histogram, state.min_val, state.max_val, levels, xp, qparams,
                                                  check=False)  # fmt: skip
    return QParams(scale, zero_point), read
