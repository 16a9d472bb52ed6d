"""Triton kernel of the LLM family's MSE grid search on the torch CUDA path: one launch per tensor screens
every candidate of every group (:func:`grid_screen`), as :func:`observers_core._compiled.grid_screen_kernel`
does on the host (the same arithmetic; see ``observers_core.families.llm._screened_search`` for how the
screen's bounds decide the search and which groups the array code evaluates exactly).

Imported lazily, only on the torch CUDA path (``_namespace.triton_route``: torch CUDA tensors, or CPU
tensors inside :func:`observers_core.testing.cuda_path_on_cpu`, run through Triton's interpreter by
``_triton_kernels.launch``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_kernels import launch

__all__ = ["grid_screen"]

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
def _grid_screen_kernel(x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, bad_ptr, G, N, GS, T, qmin, qmax, qbound, norm,
                        emin, mbits, HAS_ZP: tl.constexpr, HAS_W: tl.constexpr, IS_FLOAT: tl.constexpr,
                        BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
    """Groups ``[pid * BLOCK_G, ...)``: ``out[t, g] = sum_i w_i |fq_t(v_i) - v_i| ** norm`` (float64, the
    power approximate, ``fq`` exactly the array code's float32 operations), ``bad[g] = 1`` for a group with
    a non-finite value or weight, or a candidate scale that is not positive and finite or might overflow.
    Value ``i`` of group ``g`` is ``x[i // GS, g, i % GS]`` (``x`` contiguous ``(N / GS, G, GS)``)."""
    pid = tl.program_id(0)
    g = pid * BLOCK_G + tl.arange(0, BLOCK_G)
    gmask = g < G
    g64 = g.to(tl.int64)
    finite = gmask
    top = tl.zeros([BLOCK_G], dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        j = n0 + tl.arange(0, BLOCK_N)
        mask = gmask[:, None] & (j < N)[None, :]
        off = (j // GS).to(tl.int64)[None, :] * G * GS + g64[:, None] * GS + (j % GS)[None, :]
        v = tl.load(x_ptr + off, mask=mask, other=0.0)
        ok = tl.abs(v) < float("inf")
        if HAS_W:
            w = tl.load(w_ptr + off, mask=mask, other=0.0)
            ok = ok & (tl.abs(w) < float("inf"))
        finite = finite & (tl.min(tl.where(mask, ok, True).to(tl.int32), axis=1) > 0)
        top = tl.maximum(top, tl.max(tl.where(mask & ok, tl.abs(v), 0.0), axis=1))
    bad = ~finite
    for t in range(T):
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
            y = tl.div_rn(v, s[:, None])
            if HAS_ZP:
                y = y + z[:, None]
            y = tl.minimum(tl.maximum(y, qmin), qmax)
            if IS_FLOAT:  # the nearest E2M1 / E4M3 value: quantum 2 ** (max(e, emin) - mbits), e the binade of |y|
                e = ((tl.abs(y).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
                e = tl.maximum(e, emin)
                quantum = ((e - mbits + 127) << 23).to(tl.float32, bitcast=True)
                q = _round_even(tl.div_rn(y, quantum)) * quantum
            else:
                q = _round_even(y)
            if HAS_ZP:
                q = q - z[:, None]
            d = tl.abs(q * s[:, None] - v).to(tl.float64)
            term = _pow_approx(tl.where(d > 0.0, d, 1.0), norm)
            if HAS_W:
                term = term * tl.load(w_ptr + off, mask=mask, other=0.0).to(tl.float64)
            acc += tl.sum(tl.where(mask & (d > 0.0), term, 0.0), axis=1)
        tl.store(out_ptr + t * G + g64, acc, mask=gmask)
    tl.store(bad_ptr + g64, bad.to(tl.uint8), mask=gmask)


def grid_screen(observed: torch.Tensor, weights: torch.Tensor | None, scale: torch.Tensor, zero_point: torch.Tensor,
                *, has_zp: bool, qmin: float, qmax: float, element: tuple[int, int] | None,
                norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch: ``(approx, bad)`` of ``grid_screen_kernel`` for the flattened float32 ``observed``
    ``(n, *qparam_shape, group)`` (``weights`` the same shape, or ``None``), candidate ``scale`` and
    ``zero_point`` ``(T, G)``; ``element``: ``(emin, mbits)`` of an FP4/FP8 element, ``None`` for ints."""
    n, gs = observed.shape[0], observed.shape[-1]
    t, g = scale.shape
    x = observed.reshape(n, g, gs).contiguous()
    w = x if weights is None else weights.reshape(n, g, gs).contiguous()
    approx = torch.empty((t, g), dtype=torch.float64, device=x.device)
    bad = torch.empty((g,), dtype=torch.uint8, device=x.device)
    count = n * gs
    block_n = min(triton.next_power_of_2(count), 256)
    tile = _CPU_TILE if x.device.type == "cpu" else _GPU_TILE
    block_g = max(1, min(triton.next_power_of_2(g), tile // block_n))
    emin, mbits = element if element is not None else (0, 0)
    launch(_grid_screen_kernel, (triton.cdiv(g, block_g),), x, w, scale.contiguous(),
           zero_point.to(torch.float32).contiguous(), approx, bad, g, count, gs, t, float(qmin), float(qmax),
           float(max(abs(qmin), abs(qmax))), float(norm), emin, mbits, HAS_ZP=has_zp, HAS_W=weights is not None,
           IS_FLOAT=element is not None, BLOCK_G=block_g, BLOCK_N=block_n)
    return approx, bad
