"""Triton kernels of the LLM family's MSE grid search on the torch CUDA path
(``observers_core.families.llm._device_search``): :func:`screen` (one launch per tensor) computes every
candidate's qparams and screens every candidate of every group, as
:func:`observers_core._compiled.grid_screen_kernel` does on the host (the same arithmetic; see
``llm._screened_search`` for the bounds), and decides each step; :func:`exact_diff` gives the undecided
groups' ``|fq(x) - x|`` for torch's ``pow`` and ``sum`` (the array code's errors), :func:`exact_rows` their
improvements; :func:`pick` runs llm-compressor's stopping rule and writes each group's range.

Imported lazily, only on the torch CUDA path (``_namespace.triton_route``: torch CUDA tensors, or CPU
tensors inside :func:`observers_core.testing.cuda_path_on_cpu`, run through Triton's interpreter by
``_triton_kernels.launch``).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from ._triton_kernels import float32_parts, launch

__all__ = ["screen", "exact_diff", "exact_rows", "pick"]

_GPU_TILE = 2048  # values per program tile
_CPU_TILE = 1 << 16  # the interpreter runs programs one after another: fewer, larger ones


@triton.jit
def _round_even(y):
    """``rint(y)`` in float32: ``(|y| + 2**23) - 2**23`` with ``y``'s sign for ``|y| < 2**23`` (the sum's ulp is
    1: rounded to the nearest integer, ties to even); larger ``|y|`` are integers."""
    a = tl.abs(y)
    r = tl.where(a < 8388608.0, (a + 8388608.0) - 8388608.0, a)
    return tl.where(y < 0.0, -r, r)


@triton.jit
def _pow_approx(d, norm):
    """``d ** norm`` in float64 for float64 ``d > 0`` (``d = 0``: unspecified, masked by the caller), as
    ``grid_screen_kernel``: ``exp(norm * log d)`` from the exponent and mantissa, ``log`` of the mantissa
    by ``2 atanh(u)`` to ``u**7``, ``exp`` by its Taylor series to ``r**6`` on ``|r| <= ln2 / 2`` (``j`` the
    nearest integer to ``y / ln2``; a tie either way keeps the bound)."""
    bits = d.to(tl.int64, bitcast=True)
    m = ((bits & 0xFFFFFFFFFFFFF) | 0x3FF0000000000000).to(tl.float64, bitcast=True)
    k = ((bits >> 52) - 1023).to(tl.float64)
    up = m > 1.4142135623730951
    m = tl.where(up, m * 0.5, m)
    k = tl.where(up, k + 1.0, k)
    u = (m - 1.0) / (m + 1.0)
    uu = u * u
    log_m = 2.0 * u * (1.0 + uu * (1.0 / 3 + uu * (1.0 / 5 + uu * (1.0 / 7))))
    y = norm * (k * 0.6931471805599453 + log_m)
    j = tl.floor(y * 1.4426950408889634 + 0.5)
    r = y - j * 0.6931471805599453
    a = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r / 720)))))
    two = ((j.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)
    return a * two


@triton.jit
def _factor(i, grid_a, grid_b, grid_c):
    """llm-compressor's shrink factor ``1 - i / grid`` as Python computes it (float64) rounded to float32,
    ``grid`` the exact float64 sum of three float32 parts (``float32_parts``)."""
    zero = tl.zeros([1], dtype=tl.float64)
    grid = ((zero + grid_a) + grid_b) + grid_c
    return (1.0 - (zero + i) / grid).to(tl.float32)


@triton.jit
def _mx_scale(amax, mx_offset):
    """``calculate_qparams``' MX scale ``2 ** (code - 127)`` of float32 ``amax >= 0`` (not NaN) by bit
    manipulation: ``k`` = ``amax``'s binade, plus 1 where its mantissa is ``>= 1.75``; ``code = clip(k + 127 -
    mx_offset, 0, 255)``, 0 below the smallest normal, 255 (``inf``) for ``inf`` or ``k > 127``; code 0 is the
    subnormal ``2 ** -127``."""
    bits = amax.to(tl.int32, bitcast=True)
    k = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) >= 0x600000).to(tl.int32)
    code = tl.minimum(tl.maximum(k + 127 - mx_offset, 0), 255)
    code = tl.where(amax < 1.1754943508222875e-38, 0, code)
    code = tl.where((k > 127) | (amax == float("inf")), 255, code)
    return tl.where(code == 0, 0x400000, code << 23).to(tl.float32, bitcast=True)


@triton.jit
def _candidate(base_lo, base_hi, p, qmin, qmax, divisor, zp_lo, zp_hi, eps, mx_offset, HAS_ZP: tl.constexpr):
    """``calculate_qparams`` of the range ``[base_lo, base_hi] * p`` (float32): ``divisor`` is ``(qmax - qmin) /
    2`` symmetric, ``qmax - qmin`` asymmetric; a zero scale becomes ``eps``; the zero point ``clamp(qmin -
    min / s)`` rounded to even in ``[zp_lo, zp_hi]``, NaN to 0 as torch casts it. ``mx_offset >= 0``
    (symmetric MX, ``floor(log2(element max))``): the E8M0 scale of :func:`_mx_scale` (a NaN range: the
    scale is unspecified; every candidate of that group is then NaN, so the pick is the same)."""
    c_lo = base_lo * p
    c_hi = base_hi * p
    c_lo = tl.where(c_lo != c_lo, c_lo, tl.minimum(c_lo, 0.0))  # torch.min / max keep NaN
    c_hi = tl.where(c_hi != c_hi, c_hi, tl.maximum(c_hi, 0.0))
    if HAS_ZP:
        s = tl.div_rn(c_hi - c_lo, tl.zeros_like(c_lo) + divisor)
        zq = qmin - tl.div_rn(c_lo, s)
        zq_nan = zq != zq
        zq = tl.minimum(tl.maximum(tl.minimum(tl.maximum(zq, qmin), qmax), zp_lo), zp_hi)
        z = tl.where(zq_nan, 0.0, _round_even(zq))
    else:
        amax = tl.where(c_lo != c_lo, c_lo, tl.where(c_hi != c_hi, c_hi, tl.maximum(tl.abs(c_lo), c_hi)))
        s = tl.div_rn(amax, tl.zeros_like(c_lo) + divisor)
        if mx_offset >= 0:
            s = _mx_scale(tl.where(amax != amax, 0.0, amax), mx_offset)
        z = tl.zeros_like(c_lo)
    return tl.where(s == 0.0, eps, s), z


@triton.jit
def _fake_quantize(v, s, z, qmin, qmax, emin, mbits, HAS_ZP: tl.constexpr, IS_FLOAT: tl.constexpr):
    """``fake_quantize`` with the array code's float32 operations: ``(round(clamp(v / s + z)) - z) * s``,
    rounded to even or to the nearest E2M1 / E4M3 value (quantum ``2 ** (max(e, emin) - mbits)``, ``e`` the
    binade of ``|y|``)."""
    y = tl.div_rn(v, s)
    if HAS_ZP:
        y = y + z
    y = tl.where(y != y, y, tl.minimum(tl.maximum(y, qmin), qmax))  # torch.clamp keeps NaN
    if IS_FLOAT:
        e = ((tl.abs(y).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        e = tl.maximum(e, emin)
        quantum = ((e - mbits + 127) << 23).to(tl.float32, bitcast=True)
        q = _round_even(tl.div_rn(y, quantum)) * quantum
    else:
        q = _round_even(y)
    if HAS_ZP:
        q = q - z
    return q * s


@triton.jit
def _search_screen_kernel(x_ptr, w_ptr, lo_ptr, hi_ptr, s_ptr, z_ptr, improved_ptr, unsure_ptr, G, N, GS, T,
                          expand, grid_a, grid_b, grid_c, qmin, qmax, qbound, divisor, zp_lo, zp_hi, eps, mx_offset, norm,
                          emin, mbits, rel, slack_unit, HAS_ZP: tl.constexpr, HAS_W: tl.constexpr,
                          IS_FLOAT: tl.constexpr, CANDIDATES: tl.constexpr, BLOCK_G: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    """Groups ``[pid * BLOCK_G, ...)``: every candidate's ``A_t = sum_i w_i |fq_t(v_i) - v_i| ** norm``
    (float64, the power approximate, ``fq`` exactly the array code's float32 operations), then the screen's
    decisions: with ``lo, hi = A (1 -/+ rel) -/+ slack`` (``slack = slack_unit max(1, max w)``) step ``t``
    surely improves (``improved[t, g] = 1``) when ``hi_t < min(lo_<t)``, surely not when ``lo_t >=
    min(hi_<t)``; ``unsure[g] = 1`` when some step is neither, ``A`` or ``hi`` is not finite / reaches
    float32's max, the group holds a non-finite value or weight, or a candidate scale is not positive and
    finite or might overflow. A step whose scale and zero point equal the previous step's (MX's power-of-two
    scales) has its ``fq``, so the array code's error equals the previous one: surely not improved
    (improving is ``err_t < min(err_<t)``).

    ``CANDIDATES``: candidate ``t``'s scale and zero point computed here from the group's range ``[lo,
    hi] * expand * p_t`` as ``calculate_qparams`` does (``divisor``: ``(qmax - qmin) / 2`` symmetric,
    ``qmax - qmin`` asymmetric; a zero scale becomes ``eps``; the zero point ``clamp(qmin - min / s)``
    rounded to even in ``[zp_lo, zp_hi]``, NaN to 0 as torch casts it); else read from ``s``, ``z`` ``(T, G)``.
    Value ``i`` of group ``g`` is ``x[i // GS, g, i % GS]`` (``x`` contiguous ``(N / GS, G, GS)``)."""
    pid = tl.program_id(0)
    g = pid * BLOCK_G + tl.arange(0, BLOCK_G)
    gmask = g < G
    g64 = g.to(tl.int64)
    finite = gmask
    top = tl.zeros([BLOCK_G], dtype=tl.float32)
    w_top = tl.zeros([BLOCK_G], dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        j = n0 + tl.arange(0, BLOCK_N)
        mask = gmask[:, None] & (j < N)[None, :]
        off = (j // GS).to(tl.int64)[None, :] * G * GS + g64[:, None] * GS + (j % GS)[None, :]
        v = tl.load(x_ptr + off, mask=mask, other=0.0)
        ok = tl.abs(v) < float("inf")
        if HAS_W:
            w = tl.load(w_ptr + off, mask=mask, other=0.0)
            ok = ok & (tl.abs(w) < float("inf"))
            w_top = tl.maximum(w_top, tl.max(tl.where(mask & ok, w, 0.0), axis=1))
        finite = finite & (tl.min(tl.where(mask, ok, True).to(tl.int32), axis=1) > 0)
        top = tl.maximum(top, tl.max(tl.where(mask & ok, tl.abs(v), 0.0), axis=1))
    bad = ~finite
    slack = (tl.zeros([BLOCK_G], dtype=tl.float64) + slack_unit) * tl.maximum(w_top, 1.0).to(tl.float64)
    rel64 = tl.zeros([BLOCK_G], dtype=tl.float64) + rel
    if CANDIDATES:
        base_lo = tl.load(lo_ptr + g64, mask=gmask, other=0.0) * expand
        base_hi = tl.load(hi_ptr + g64, mask=gmask, other=0.0) * expand
    min_lo = tl.full([BLOCK_G], 3.4028234663852886e38, dtype=tl.float64)
    min_hi = min_lo
    s_prev = tl.full([BLOCK_G], float("nan"), dtype=tl.float32)
    z_prev = tl.zeros([BLOCK_G], dtype=tl.float32)
    for t in range(T):
        if CANDIDATES:
            s, z = _candidate(base_lo, base_hi, _factor(t, grid_a, grid_b, grid_c), qmin, qmax, divisor, zp_lo,
                              zp_hi, eps, mx_offset, HAS_ZP)
        else:
            s = tl.load(s_ptr + t * G + g64, mask=gmask, other=1.0)
            if HAS_ZP:
                z = tl.load(z_ptr + t * G + g64, mask=gmask, other=0.0)
            else:
                z = tl.zeros([BLOCK_G], dtype=tl.float32)
        s64 = s.to(tl.float64)
        fits = (s64 > 0.0) & (s64 * (qbound + tl.abs(z.to(tl.float64))) + top.to(tl.float64) < 1e38)
        bad = bad | ~(fits & (tl.abs(z) < float("inf")))
        acc = tl.zeros([BLOCK_G], dtype=tl.float64)
        for n0 in range(0, N, BLOCK_N):
            j = n0 + tl.arange(0, BLOCK_N)
            mask = gmask[:, None] & (j < N)[None, :]
            off = (j // GS).to(tl.int64)[None, :] * G * GS + g64[:, None] * GS + (j % GS)[None, :]
            v = tl.load(x_ptr + off, mask=mask, other=0.0)
            fq = _fake_quantize(v, s[:, None], z[:, None], qmin, qmax, emin, mbits, HAS_ZP, IS_FLOAT)
            d = tl.abs(fq - v).to(tl.float64)
            term = _pow_approx(tl.where(d > 0.0, d, 1.0), norm)
            if HAS_W:
                term = term * tl.load(w_ptr + off, mask=mask, other=0.0).to(tl.float64)
            acc += tl.sum(tl.where(mask & (d > 0.0), term, 0.0), axis=1)
        lo = acc * (1.0 - rel64) - slack
        hi = acc * (1.0 + rel64) + slack
        bad = bad | ~(tl.abs(acc) < float("inf")) | ~(hi < 3.4028234663852886e38)
        same = (s == s_prev) & (z == z_prev)  # the previous step's fq(x): its error, which never improves on it
        s_prev = s
        z_prev = z
        sure = (hi < min_lo) & ~same
        bad = bad | ~(sure | same | (lo >= min_hi))
        min_lo = tl.minimum(min_lo, lo)
        min_hi = tl.minimum(min_hi, hi)
        tl.store(improved_ptr + t * G + g64, sure.to(tl.uint8), mask=gmask)
    tl.store(unsure_ptr + g64, bad.to(tl.uint8), mask=gmask)


@triton.jit
def _exact_diff_kernel(x_ptr, lo_ptr, hi_ptr, s_ptr, z_ptr, idx_ptr, d_ptr, G, E, N, GS, T, expand, grid_a, grid_b,
                       grid_c, qmin, qmax, divisor, zp_lo, zp_hi, eps, mx_offset, emin, mbits, HAS_ZP: tl.constexpr,
                       IS_FLOAT: tl.constexpr, CANDIDATES: tl.constexpr, BLOCK_N: tl.constexpr):
    """``d[t, i // GS, e, i % GS] = |fq_t(v_i) - v_i|`` (float32, the array code's bits) for group ``idx[e]``
    (program ``(e, t)``), the candidates as in ``_search_screen_kernel``: the array code's ``|q - x|`` of
    those groups, laid out as ``error_table`` lays it out."""
    e = tl.program_id(0)
    t = tl.program_id(1)
    g = tl.load(idx_ptr + e).to(tl.int64)
    if CANDIDATES:
        base_lo = tl.load(lo_ptr + g) * expand
        base_hi = tl.load(hi_ptr + g) * expand
        s, z = _candidate(base_lo, base_hi, _factor(t, grid_a, grid_b, grid_c), qmin, qmax, divisor, zp_lo, zp_hi,
                          eps, mx_offset, HAS_ZP)
    else:
        s = tl.load(s_ptr + t * G + g)
        z = tl.load(z_ptr + t * G + g)
    for n0 in range(0, N, BLOCK_N):
        j = n0 + tl.arange(0, BLOCK_N)
        mask = j < N
        row = (j // GS).to(tl.int64)
        v = tl.load(x_ptr + row * G * GS + g * GS + j % GS, mask=mask, other=0.0)
        fq = _fake_quantize(v, s, z, qmin, qmax, emin, mbits, HAS_ZP, IS_FLOAT)
        tl.store(d_ptr + ((t * (N // GS) + row) * E + e) * GS + j % GS, tl.abs(fq - v), mask=mask)


@triton.jit
def _exact_rows_kernel(err_ptr, idx_ptr, improved_ptr, E, T, G, BLOCK_E: tl.constexpr):
    """``improvements`` of the exact error rows ``err`` ``(T, E)`` (float32) of groups ``idx`` (``E``),
    written into their columns of ``improved`` ``(T, G)``: step ``t`` improves when ``err[t] <
    min(float32 max, err[:t])`` (NaN never)."""
    pid = tl.program_id(0)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E)
    emask = e < E
    col = tl.load(idx_ptr + e, mask=emask, other=0)
    best = tl.full([BLOCK_E], 3.4028234663852886e38, dtype=tl.float32)
    for t in range(T):
        v = tl.load(err_ptr + t * E + e, mask=emask, other=0.0)
        better = v < best
        best = tl.where(better, v, best)
        tl.store(improved_ptr + t * G + col, better.to(tl.uint8), mask=emask)


@triton.jit
def _search_pick_kernel(improved_ptr, any_ptr, lo_ptr, hi_ptr, min_ptr, max_ptr, G, T, expand, grid_a, grid_b,
                        grid_c, patience, STOPS: tl.constexpr, BLOCK_G: tl.constexpr):
    """llm-compressor's stopping rule and choice for groups ``[pid * BLOCK_G, ...)``: step ``t`` runs while
    the loop has not stopped (``STOPS``: after ``patience`` consecutive steps in which no group improved,
    ``any[t]`` the OR of ``improved[t, :]``); each group keeps the range of its last improving step run,
    ``[lo, hi] * expand * p_t``, else ``[lo, hi] * expand``."""
    pid = tl.program_id(0)
    g = pid * BLOCK_G + tl.arange(0, BLOCK_G)
    gmask = g < G
    g64 = g.to(tl.int64)
    pick = tl.full([BLOCK_G], -1, dtype=tl.int32)
    stopped = tl.full([], 0, dtype=tl.int32)
    stale = tl.full([], 0, dtype=tl.int32)
    for t in range(T):
        runs = stopped == 0
        imp = tl.load(improved_ptr + t * G + g64, mask=gmask, other=0)
        pick = tl.where((imp != 0) & runs, t, pick)
        hit = (tl.load(any_ptr + t) != 0) & runs
        stale = tl.where(hit, 0, stale + 1)
        if STOPS:
            stopped = tl.where(~hit & (stale >= patience), 1, stopped)
    keep = pick >= 0
    p = _factor(tl.where(keep, pick, 0), grid_a, grid_b, grid_c)
    base_lo = tl.load(lo_ptr + g64, mask=gmask, other=0.0) * expand
    base_hi = tl.load(hi_ptr + g64, mask=gmask, other=0.0) * expand
    tl.store(min_ptr + g64, tl.where(keep, base_lo * p, base_lo), mask=gmask)
    tl.store(max_ptr + g64, tl.where(keep, base_hi * p, base_hi), mask=gmask)


def _blocks(g: int, count: int, on_cpu: bool) -> tuple[int, int]:
    block_n = min(triton.next_power_of_2(count), 256)
    tile = _CPU_TILE if on_cpu else _GPU_TILE
    return max(1, min(triton.next_power_of_2(g), tile // block_n)), block_n


def screen(observed: torch.Tensor, weights: torch.Tensor | None, lo: torch.Tensor, hi: torch.Tensor, *,
           steps: int, expand: float, grid: float, qmin: float, qmax: float, element: tuple[int, int] | None,
           norm: float, rel: float, slack: float, candidates: tuple[int, float, float, float, int] | None = None,
           scale: torch.Tensor | None = None, zero_point: torch.Tensor | None = None,
           has_zp: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch of ``_search_screen_kernel``: ``(improved, unsure)``, uint8 ``(steps, G)`` and ``(G,)``, for
    the flattened float32 ``observed`` ``(n, *qparam_shape, group)`` (``weights`` the same shape, or
    ``None``), the groups' ranges ``lo``, ``hi`` (``G`` values, before ``expand``). ``candidates``:
    ``(has_zp, divisor, zp_lo, zp_hi, mx_offset)`` to compute the candidates' qparams in the kernel; else ``scale``,
    ``zero_point`` ``(steps, G)`` and ``has_zp``. ``element``: ``(emin, mbits)`` of an FP4/FP8 element,
    ``None`` for ints; ``rel`` is rounded up to float32 (a wider margin)."""
    n, gs = observed.shape[0], observed.shape[-1]
    g = lo.numel()
    x = observed.reshape(n, g, gs).contiguous()
    w = x if weights is None else weights.reshape(n, g, gs).contiguous()
    improved = torch.empty((steps, g), dtype=torch.uint8, device=x.device)
    unsure = torch.empty((g,), dtype=torch.uint8, device=x.device)
    block_g, block_n = _blocks(g, n * gs, x.device.type == "cpu")
    emin, mbits = element if element is not None else (0, 0)
    rel32 = np.float32(rel)
    if float(rel32) < rel:
        rel32 = np.nextafter(rel32, np.float32(np.inf))
    has_zp, divisor, zp_lo, zp_hi, mx_offset, scale, zero_point = _candidate_tables(candidates, has_zp, scale,
                                                                                     zero_point, x)
    launch(_search_screen_kernel, (triton.cdiv(g, block_g),), x, w, lo.reshape(g), hi.reshape(g), scale, zero_point,
           improved, unsure, g, n * gs, gs, steps, float(np.float32(expand)), *float32_parts(float(grid)), float(qmin),
           float(qmax), float(max(abs(qmin), abs(qmax))), float(divisor), float(zp_lo), float(zp_hi), 2.0**-23,
           int(mx_offset), float(norm), emin, mbits, float(rel32), float(slack), HAS_ZP=bool(has_zp), HAS_W=weights is not None,
           IS_FLOAT=element is not None, CANDIDATES=candidates is not None, BLOCK_G=block_g, BLOCK_N=block_n)
    return improved, unsure


def _candidate_tables(candidates: tuple[int, float, float, float, int] | None, has_zp: bool,
                      scale: torch.Tensor | None, zero_point: torch.Tensor | None, x: torch.Tensor) -> tuple:
    """The kernels' candidate arguments: with ``candidates = (has_zp, divisor, zp_lo, zp_hi, mx_offset)`` the
    kernel computes each step's scale and zero point itself (the tables are unread; ``mx_offset`` -1, or
    symmetric MX's ``floor(log2(element max))``); else it reads the given ``scale`` and ``zero_point`` tables."""
    if candidates is not None:
        return (*candidates, x, x)
    return has_zp, 1.0, 1.0, 1.0, -1, scale.contiguous(), zero_point.to(torch.float32).contiguous()


def exact_diff(observed: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, idx: torch.Tensor, *, steps: int,
               expand: float, grid: float, qmin: float, qmax: float, element: tuple[int, int] | None,
               candidates: tuple[int, float, float, float, int] | None = None, scale: torch.Tensor | None = None,
               zero_point: torch.Tensor | None = None, has_zp: bool = False, **_: object) -> torch.Tensor:
    """One launch of ``_exact_diff_kernel``: ``|fq_t(x) - x|`` ``(steps, n, len(idx), group)`` float32 for the
    groups ``idx`` of the flattened ``observed`` (the arguments as :func:`screen`'s)."""
    n, gs = observed.shape[0], observed.shape[-1]
    g, e = lo.numel(), idx.shape[0]
    x = observed.reshape(n, g, gs).contiguous()
    d = torch.empty((steps, n, e, gs), dtype=torch.float32, device=x.device)
    emin, mbits = element if element is not None else (0, 0)
    has_zp, divisor, zp_lo, zp_hi, mx_offset, scale, zero_point = _candidate_tables(candidates, has_zp, scale,
                                                                                     zero_point, x)
    launch(_exact_diff_kernel, (e, steps), x, lo.reshape(g), hi.reshape(g), scale, zero_point,
           idx.to(torch.int64).contiguous(), d, g, e, n * gs, gs, steps, float(np.float32(expand)),
           *float32_parts(float(grid)), float(qmin), float(qmax), float(divisor), float(zp_lo), float(zp_hi), 2.0**-23,
           int(mx_offset), emin, mbits, HAS_ZP=bool(has_zp), IS_FLOAT=element is not None, CANDIDATES=candidates is not None,
           BLOCK_N=min(triton.next_power_of_2(n * gs), 1024))
    return d


def exact_rows(improved: torch.Tensor, err: torch.Tensor, idx: torch.Tensor) -> None:
    """One launch of ``_exact_rows_kernel``: the columns ``idx`` of ``improved`` (uint8 ``(T, G)``) from the
    array code's exact float32 errors ``err`` ``(T, len(idx))``, in place."""
    t, g = improved.shape
    e = idx.shape[0]
    block_e = min(triton.next_power_of_2(e), _CPU_TILE if improved.device.type == "cpu" else 256)
    launch(_exact_rows_kernel, (triton.cdiv(e, block_e),), err.to(torch.float32).reshape(t, e).contiguous(),
           idx.to(torch.int64).contiguous(), improved, e, t, g, BLOCK_E=block_e)


def pick(improved: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, *, expand: float, grid: float, patience: int,
         stops: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Two launches: the OR of each step's row of ``improved`` (uint8 ``(T, G)``, an aten ``amax``), then
    ``_search_pick_kernel``: each group's searched ``(min, max)`` (``G`` float32 values each)."""
    t, g = improved.shape
    steps_hit = torch.amax(improved, dim=1)
    best_lo = torch.empty((g,), dtype=torch.float32, device=improved.device)
    best_hi = torch.empty_like(best_lo)
    block_g = min(triton.next_power_of_2(g), _CPU_TILE if improved.device.type == "cpu" else 1024)
    launch(_search_pick_kernel, (triton.cdiv(g, block_g),), improved, steps_hit, lo.reshape(g), hi.reshape(g),
           best_lo, best_hi, g, t, float(np.float32(expand)), *float32_parts(float(grid)), int(patience), STOPS=bool(stops),
           BLOCK_G=block_g)
    return best_lo, best_hi
