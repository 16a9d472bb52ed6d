"""Triton kernels of the torch CUDA path: a few fused kernels per observer step instead of one launch per
array operation (on a GPU an eager operation costs a 5-20 us launch whatever its size).

Imported lazily, only when a step runs on the torch CUDA path (``_namespace.triton_route``: torch CUDA
tensors, or CPU tensors inside :func:`observers_core.testing.cuda_path_on_cpu`) and triton is installed.
Each kernel computes the float32 operations of the array-API step it replaces, in its order and with
the same roundings (IEEE division ``div_rn``, explicit ``fma`` where the array code rounds once, and no
contraction of ``a * b + c``: launched with ``enable_fp_fusion=False``), so the states equal the host
path's bit for bit (tests/test_device_path_on_cpu.py runs every kernel through Triton's interpreter).
Integer counts are added with integer atomics (exact, order-free). The re-binned old histogram is a
float32 scatter-add: in index order under the interpreter (as the host path adds), in any order on a GPU
(as torch's CUDA ``index_add_`` that it replaces). The KL search computes in float64 (the array code's
work dtype; float64 ``/`` is IEEE division), its group sums in NumPy's pairwise order: its curve is the
NumPy host path's bit for bit under the interpreter; torch's own sum order and logs may differ from it in
the last bits (docs/gpu-kernels.md).

CPU tensors run through Triton's interpreter, per launch (:func:`launch`), whether or not triton was
imported with ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language import core as _tl_core  # noqa: F401  (patched for the interpreter: _interpreting)

from . import _namespace

__all__ = ["clip_average", "histogram_update", "kl_accumulate", "kl_curve", "kl_search_amax", "kl_search_applies",
           "l2_search", "launch", "mix_pick", "moving_average", "mse_amax", "mse_applies", "percentile_amax",
           "range_abs_histogram"]

_INF = float("inf")
_F32_MAX = 3.4028234663852886e38
_SCALE = 2.0**-26  # _histogram._SCALE
_GPU_BLOCK = 1024
_CPU_BLOCK = 4096  # the interpreter runs programs one after another: fewer, larger ones
_MAX_PROGRAMS = 1024  # partial results per reduction (reduced again by every program of the next kernel)

# ------------------------------------------------------------------------------------------------------
# launching


_interpreted: dict = {}  # kernel function -> its InterpretedFunction
_rewritten: dict = {}  # device function -> its interpretable rewrite


@contextlib.contextmanager
def _interpreting():
    """While a kernel runs in Triton's interpreter: ``@triton.jit`` functions it calls (ours and
    ``triton.language``'s own, compiled objects unless triton was imported under ``TRITON_INTERPRET=1``)
    run interpreted too. ``triton.language`` (``tl`` and ``tl.core``) is patched for the interpreter once
    here and restored on exit (``InterpretedFunction`` would patch it again at every device-function call,
    most of the run time, and leave ``tl.core`` patched, which would break later compiled launches)."""
    from triton.runtime import interpreter  # (its _patch_lang: triton's own helper, private; pinned triton 3.9)
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if isinstance(_histogram_range_kernel, InterpretedFunction):  # imported under TRITON_INTERPRET=1
        yield
        return

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        fn = _rewritten.get(self.fn)
        if fn is None:
            fn = _rewritten[self.fn] = InterpretedFunction(self.fn).rewrite()
        return fn(*args, **kwargs)

    original = JITFunction.__call__
    scope = interpreter._patch_lang(_interpreting_probe)  # this module's globals hold tl and tl.core
    JITFunction.__call__ = call
    builder = interpreter.interpreter_builder
    options = builder.options  # int32 overflow checks: computed at every add, asserted only in debug mode
    builder.options = dataclasses.replace(options, sanitize_overflow=options.debug)
    try:
        yield
    finally:
        builder.options = options
        JITFunction.__call__ = original
        scope.restore()


def _interpreting_probe() -> None:
    """(Its globals, this module's, name ``tl`` and ``_tl_core`` for ``_patch_lang``.)"""


def launch(kernel: Any, grid: tuple, *args: Any, **meta: Any) -> None:
    """``kernel[grid](*args, **meta)``, without contraction into FMAs; through the interpreter when the
    tensors are on the CPU (``cuda_path_on_cpu``). Listeners (``_namespace.LAUNCH_LISTENERS``) hear it."""
    name = getattr(kernel, "__name__", None) or kernel.fn.__name__
    for listener in _namespace.LAUNCH_LISTENERS:
        listener(name, True)
    try:
        on_cpu = any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args)
        if on_cpu:
            from triton.runtime.interpreter import InterpretedFunction

            with _interpreting(), np.errstate(all="ignore"):  # (inf - inf in lanes a where drops)
                fn = kernel if isinstance(kernel, InterpretedFunction) else _interpreted.get(kernel.fn)
                if fn is None:
                    fn = _interpreted[kernel.fn] = InterpretedFunction(kernel.fn)
                fn[grid](*args, **meta)
        else:
            kernel[grid](*args, **meta, enable_fp_fusion=False)
    finally:
        for listener in _namespace.LAUNCH_LISTENERS:
            listener(name, False)


def float32_parts(value: float) -> tuple[float, float, float]:
    """``value`` as three float32 numbers whose float64 sum ``(a + b) + c`` is ``value`` exactly (Triton takes
    Python floats as float32 arguments); ``ValueError`` where that fails (beyond float32's exponents)."""
    parts, rest = [], value
    for _ in range(3):
        parts.append(float(np.float32(rest)))
        rest -= parts[-1]
    if (parts[0] + parts[1]) + parts[2] != value:
        raise ValueError(f"{value!r} is not the sum of three float32 numbers")
    return parts[0], parts[1], parts[2]


def _block(x: torch.Tensor) -> int:
    return _CPU_BLOCK if x.device.type == "cpu" else _GPU_BLOCK


# ------------------------------------------------------------------------------------------------------
# shared device functions


@triton.jit
def _finite(v):
    return tl.abs(v) < float("inf")  # NaN compares false


@triton.jit
def _next_down(x):
    """``nextafter(x, -float32 max)`` (float32, 0-d or block)."""
    bits = x.to(tl.int32, bitcast=True)
    moved = tl.where(x == 0.0, -2147483647, tl.where(x > 0.0, bits - 1, bits + 1))  # -2147483647: -denorm_min
    out = moved.to(tl.float32, bitcast=True)
    out = tl.where(x < -3.4028234663852886e38, -3.4028234663852886e38, out)  # -inf
    out = tl.where(x == -3.4028234663852886e38, x, out)
    return tl.where(x != x, x, out)


@triton.jit
def _next_up(x):
    """``nextafter(x, float32 max)``."""
    return -_next_down(-x)


@triton.jit
def _linspace_at(start, end, step, i, steps):
    """Element ``i`` of ``torch.linspace(start, end, steps)`` (``_histogram._linspace``: ``step`` given)."""
    lower = i < steps // 2
    m = tl.where(lower, i, steps - 1 - i).to(tl.float32)
    return tl.where(lower, tl.fma(step, m, start), tl.fma(-step, m, end))


@triton.jit
def _histogram_scalars(part_f, part_i, P, smin_ptr, smax_ptr, binsf, IGNORE: tl.constexpr, PBLOCK: tl.constexpr):
    """Every 0-d decision of ``_histogram._update_counting`` from the partial ranges/counts of the batch
    (``_histogram_range_kernel``) and the state's range, in its float32 operations."""
    p = tl.arange(0, PBLOCK)
    pm = p < P
    x_lo = tl.min(tl.load(part_f + p, mask=pm, other=float("inf")), axis=0)
    x_hi = tl.max(tl.load(part_f + P + p, mask=pm, other=-float("inf")), axis=0)
    nans = tl.sum(tl.load(part_i + p, mask=pm, other=0), axis=0)
    infs = tl.sum(tl.load(part_i + P + p, mask=pm, other=0), axis=0)
    total = tl.sum(tl.load(part_f + 2 * P + p, mask=pm, other=0.0), axis=0)
    smin = tl.load(smin_ptr)
    smax = tl.load(smax_ptr)
    # the new range
    poisoned = (smin != smin) | (smax != smax)
    fresh = (smin == float("inf")) | (smax == -float("inf")) | poisoned
    new_min = tl.where(fresh, x_lo, tl.minimum(smin, x_lo))
    new_max = tl.where(fresh, x_hi, tl.maximum(smax, x_hi))
    # torch.histc's range (_histc_range) and its check (_histc)
    degenerate = (new_min == new_max) & (x_lo <= x_hi)
    lo = tl.where(degenerate, x_lo, new_min)
    hi = tl.where(degenerate, x_hi, new_max)
    point = lo == hi
    wide_lo = tl.minimum(_next_down(lo), lo - 1.0)
    wide_hi = tl.maximum(_next_up(hi), hi + 1.0)
    lo = tl.where(point, wide_lo, lo)
    hi = tl.where(point, wide_hi, hi)
    ok = (hi > lo) & _finite(lo) & _finite(hi)
    lo = tl.where(ok, lo, 0.0)
    hi = tl.where(ok, hi, 1.0)
    # _bin_scale
    half = tl.where(_finite(hi - lo), 1.0, 0.5)
    width = hi * half - lo * half
    over = ~_finite(width * binsf)
    num = tl.where(over, binsf * 1.4901161193847656e-08, binsf)  # 2**-26
    den = tl.where(over, width * 1.4901161193847656e-08, width)
    lo_half = lo * half
    # the old histogram moved onto the new range (_to_range) and the final choices
    seen = x_lo <= x_hi
    if not IGNORE:
        poisoned = poisoned | (nans > 0)
    empty = (smin == float("inf")) | (smax == -float("inf"))
    same = (smin == new_min) & (smax == new_max)
    old_point = (smin == smax) & ~same
    rebin = ~(empty | same | old_point) & seen & ~poisoned
    return (x_lo, x_hi, nans, infs, total, smin, smax, new_min, new_max, ok, half, lo_half, num, den, seen,
            poisoned, empty, same, old_point, rebin)


# ------------------------------------------------------------------------------------------------------
# HistogramObserver.forward: three kernels


@triton.jit
def _histogram_range_kernel(x_ptr, n, hist_ptr, bins, part_f, part_i, counts_ptr, rebin_ptr, P, ITERS, HITERS,
                            BLOCK: tl.constexpr):
    """Program ``pid``: the finite range and NaN/inf counts of its part of ``x`` (``ITERS`` blocks), the sum
    of its part of the old histogram (``HITERS`` blocks), written to the partials; zeroes its part of the
    counts and of the re-binned histogram (the next kernel adds into them)."""
    pid = tl.program_id(0)
    r = tl.arange(0, BLOCK)
    lo_acc = tl.full([BLOCK], float("inf"), tl.float32)
    hi_acc = tl.full([BLOCK], -float("inf"), tl.float32)
    nan_acc = tl.zeros([BLOCK], tl.int64)
    inf_acc = tl.zeros([BLOCK], tl.int64)
    for it in range(0, ITERS):
        offs = (pid.to(tl.int64) * ITERS + it) * BLOCK + r
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
        finite = m & _finite(v)
        lo_acc = tl.where(finite, tl.minimum(lo_acc, v), lo_acc)
        hi_acc = tl.where(finite, tl.maximum(hi_acc, v), hi_acc)
        nan_acc += (m & (v != v)).to(tl.int64)
        inf_acc += (m & (tl.abs(v) == float("inf"))).to(tl.int64)
    tl.store(part_f + pid, tl.min(lo_acc, axis=0))
    tl.store(part_f + P + pid, tl.max(hi_acc, axis=0))
    tl.store(part_i + pid, tl.sum(nan_acc, axis=0))
    tl.store(part_i + P + pid, tl.sum(inf_acc, axis=0))
    total = tl.zeros([BLOCK], tl.float32)
    for it in range(0, HITERS):
        offs = (pid.to(tl.int64) * HITERS + it) * BLOCK + r
        total += tl.load(hist_ptr + offs, mask=offs < bins, other=0.0)
        tl.store(counts_ptr + offs, tl.zeros([BLOCK], tl.int64), mask=offs < bins + 3)
        tl.store(rebin_ptr + offs, tl.zeros([BLOCK], tl.float32), mask=offs < bins)
    tl.store(part_f + 2 * P + pid, tl.sum(total, axis=0))


@triton.jit
def _histogram_bin_kernel(x_ptr, n, hist_ptr, bins, binsf, up, upf, partsf, smin_ptr, smax_ptr, part_f, part_i, P,
                          counts_ptr, rebin_ptr, ITERS, RITERS, IGNORE: tl.constexpr, PBLOCK: tl.constexpr,
                          BLOCK: tl.constexpr, NSTEPS: tl.constexpr):
    """Program ``pid``: bins its part of ``x`` on the new range (torch.histc's bin formula, integer atomics
    into ``bins + 3`` counts: ``bins`` the value hi, ``bins + 1`` NaN, ``bins + 2`` +/-inf), and adds its part
    of the old histogram's ``bins * up`` sub-bins into the re-binned histogram (``_histogram._rebin``:
    midpoint, ``bucketize(right=True) - 1`` on the new edges, clamped) when the state is re-binned."""
    pid = tl.program_id(0)
    r = tl.arange(0, BLOCK)
    (x_lo, x_hi, nans, infs, total, smin, smax, new_min, new_max, ok, half, lo_half, num, den, seen, poisoned,
     empty, same, old_point, rebin) = _histogram_scalars(part_f, part_i, P, smin_ptr, smax_ptr, binsf, IGNORE,
                                                         PBLOCK)
    nan_bin = binsf + 1.0
    out_bin = binsf + 2.0
    for it in range(0, ITERS):
        offs = (pid.to(tl.int64) * ITERS + it) * BLOCK + r
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
        pos = tl.div_rn((v * half - lo_half) * num, den)
        b = tl.where(pos != pos, nan_bin,
                     tl.where(pos == -float("inf"), out_bin, tl.minimum(tl.maximum(pos, 0.0), out_bin)))
        tl.atomic_add(counts_ptr + b.to(tl.int64), tl.full([BLOCK], 1, tl.int64), mask=m, sem="relaxed")
    if rebin:
        parts = bins * up
        h2 = tl.where(_finite(new_max - new_min), 1.0, 0.5)
        omin = smin * h2
        omax = smax * h2
        nmin = new_min * h2
        nmax = new_max * h2
        step = tl.div_rn(omax - omin, partsf)  # = the part width
        half_width = 0.5 * step
        estep = tl.div_rn(nmax - nmin, binsf)
        for it in range(0, RITERS):
            i = (pid.to(tl.int64) * RITERS + it) * BLOCK + r
            m = i < parts
            mid = _linspace_at(omin, omax, step, i, parts + 1) + half_width
            below = tl.zeros([BLOCK], tl.int64)  # #{edges <= mid}: binary search over the bins + 1 edges
            above = tl.full([BLOCK], 0, tl.int64) + bins + 1
            for _ in tl.static_range(NSTEPS):
                active = below < above
                k = (below + above) // 2
                le = _linspace_at(nmin, nmax, estep, k, bins + 1) <= mid
                below = tl.where(active & le, k + 1, below)
                above = tl.where(active & ~le, k, above)
            idx = tl.minimum(tl.maximum(below - 1, 0), bins - 1)
            part = tl.div_rn(tl.load(hist_ptr + i // up, mask=m, other=0.0), upf)
            tl.atomic_add(rebin_ptr + idx, part, mask=m, sem="relaxed")


@triton.jit
def _histogram_finish_kernel(hist_ptr, bins, binsf, smin_ptr, smax_ptr, part_f, part_i, P, counts_ptr, rebin_ptr,
                             out_ptr, min_out, max_out, nonfinite_out, IGNORE: tl.constexpr, PBLOCK: tl.constexpr,
                             BLOCK: tl.constexpr):
    """The new histogram: the batch's counts (the value hi folded into the last bin; float32) plus the old
    histogram moved onto the new range (zeros when empty, itself on the same range, its total in the bin of
    the old single value, else re-binned); the old state where nothing finite was seen or NaN poisons it."""
    pid = tl.program_id(0)
    (x_lo, x_hi, nans, infs, total, smin, smax, new_min, new_max, ok, half, lo_half, num, den, seen, poisoned,
     empty, same, old_point, rebin) = _histogram_scalars(part_f, part_i, P, smin_ptr, smax_ptr, binsf, IGNORE,
                                                         PBLOCK)
    # the bin of the old single value on [new_min, new_max] (_point_mass), where there is one
    p_half = tl.where(_finite(new_max - new_min), 1.0, 0.5)
    p_width = new_max * p_half - new_min * p_half
    p_over = ~_finite(p_width * binsf)
    p_num = tl.where(p_over, binsf * 1.4901161193847656e-08, binsf)
    p_den = tl.where(p_over, p_width * 1.4901161193847656e-08, p_width)
    position = tl.div_rn((smin * p_half - new_min * p_half) * p_num, p_den)
    position = tl.where(old_point, position, 0.0)
    at = tl.minimum(tl.maximum(tl.floor(position), 0.0), binsf - 1.0).to(tl.int64)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < bins
    c = tl.load(counts_ptr + offs, mask=m, other=0)
    c += tl.load(counts_ptr + bins + offs * 0, mask=m & (offs == bins - 1), other=0)
    batch = tl.where(ok, c, 0).to(tl.float32)
    old = tl.load(hist_ptr + offs, mask=m, other=0.0)
    moved = tl.where(old_point, tl.where(offs == at, total, 0.0), tl.load(rebin_ptr + offs, mask=m, other=0.0))
    moved = tl.where(same, old, moved)
    moved = tl.where(empty, 0.0, moved)
    new = batch + moved
    new = tl.where(seen & ~poisoned, new, old)
    tl.store(out_ptr + offs, new, mask=m)
    if pid == 0:
        lo = tl.where(seen, new_min, smin)
        hi = tl.where(seen, new_max, smax)
        tl.store(min_out, tl.where(poisoned, float("nan"), lo))
        tl.store(max_out, tl.where(poisoned, float("nan"), hi))
        tl.store(nonfinite_out, infs)
        tl.store(nonfinite_out + 1, nans)


def histogram_update(hist: torch.Tensor, min_val: torch.Tensor, max_val: torch.Tensor, x: torch.Tensor, *,
                     up: int, ignore_nonfinite: bool) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """``_histogram._update_counting`` (no collective) in three kernels: ``((histogram, min_val, max_val),
    [number of +/-inf, number of NaN])`` as new tensors. ``x`` non-empty, any real dtype (binned in float32)."""
    bins = hist.shape[0]
    xf = x.reshape(-1)
    if xf.dtype not in (torch.float32, torch.float16, torch.bfloat16) or not xf.is_contiguous():
        xf = xf.to(torch.float32).contiguous()  # (float16/bfloat16 widen exactly inside the kernels)
    n = xf.shape[0]
    block = _block(xf)
    programs = max(1, min(triton.cdiv(n, block), _MAX_PROGRAMS))
    iters = triton.cdiv(triton.cdiv(n, programs), block)
    hiters = triton.cdiv(triton.cdiv(bins + 3, programs), block)
    parts = bins * up
    bin_programs = max(programs, min(triton.cdiv(parts, block), _MAX_PROGRAMS))
    riters = triton.cdiv(triton.cdiv(parts, bin_programs), block)
    pblock = triton.next_power_of_2(programs)
    nsteps = max(1, math.ceil(math.log2(bins + 2)))
    device = hist.device
    part_f = torch.empty(3 * programs, dtype=torch.float32, device=device)
    part_i = torch.empty(2 * programs, dtype=torch.int64, device=device)
    counts = torch.empty(bins + 3, dtype=torch.int64, device=device)
    rebinned = torch.empty(bins, dtype=torch.float32, device=device)
    out = torch.empty(bins, dtype=torch.float32, device=device)
    new_min = torch.empty((), dtype=torch.float32, device=device)
    new_max = torch.empty((), dtype=torch.float32, device=device)
    nonfinite = torch.empty(2, dtype=torch.int64, device=device)
    launch(_histogram_range_kernel, (programs,), xf, n, hist, bins, part_f, part_i, counts, rebinned, programs,
           iters, hiters, BLOCK=block)
    binsf, upf, partsf = float(bins), float(up), float(parts)  # (Python floats go in as float32)
    launch(_histogram_bin_kernel, (bin_programs,), xf, n, hist, bins, binsf, up, upf, partsf, min_val, max_val,
           part_f, part_i, programs, counts, rebinned, iters, riters, IGNORE=bool(ignore_nonfinite), PBLOCK=pblock,
           BLOCK=block, NSTEPS=nsteps)
    launch(_histogram_finish_kernel, (triton.cdiv(bins, block),), hist, bins, binsf, min_val, max_val, part_f, part_i,
           programs, counts, rebinned, out, new_min, new_max, nonfinite, IGNORE=bool(ignore_nonfinite),
           PBLOCK=pblock, BLOCK=block)
    return (out, new_min, new_max), nonfinite


# ------------------------------------------------------------------------------------------------------
# MovingAverage(PerChannel)MinMaxObserver.forward: the average in one kernel after torch's aminmax


@triton.jit
def _moving_average_kernel(lo_ptr, hi_ptr, smin_ptr, smax_ptr, c, min_out, max_out, n, KEEP_UNSEEN: tl.constexpr,
                           BLOCK: tl.constexpr):
    """``_minmax.moving_average_update`` after the batch range: ``min + c * (lo - min)`` (max alike), the
    batch range where the state is ``(+inf, -inf)``, the state kept where the batch saw nothing finite
    (``KEEP_UNSEEN``)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    lo = tl.load(lo_ptr + offs, mask=m, other=0.0)
    hi = tl.load(hi_ptr + offs, mask=m, other=0.0)
    smin = tl.load(smin_ptr + offs, mask=m, other=0.0)
    smax = tl.load(smax_ptr + offs, mask=m, other=0.0)
    fresh = (smin == float("inf")) & (smax == -float("inf"))  # minimum(min, -max) == inf (NaN: False)
    new_min = tl.where(fresh, lo, smin + c * (lo - smin))
    new_max = tl.where(fresh, hi, smax + c * (hi - smax))
    if KEEP_UNSEEN:
        seen = ~((lo == float("inf")) & (hi == -float("inf")))
        new_min = tl.where(seen, new_min, smin)
        new_max = tl.where(seen, new_max, smax)
    tl.store(min_out + offs, new_min, mask=m)
    tl.store(max_out + offs, new_max, mask=m)


def moving_average(min_val: torch.Tensor, max_val: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, c: float, *,
                   keep_unseen: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The new float32 ``(min_val, max_val)`` of a moving-average step (one kernel; ``c`` as float32, as
    torch multiplies a float32 tensor by a Python number)."""
    n = min_val.numel()
    new_min, new_max = torch.empty_like(min_val), torch.empty_like(max_val)
    block = max(16, min(triton.next_power_of_2(n), _block(min_val)))
    launch(_moving_average_kernel, (triton.cdiv(n, block),), lo.contiguous(), hi.contiguous(), min_val.contiguous(),
           max_val.contiguous(), float(c), new_min, new_max, n, KEEP_UNSEEN=bool(keep_unseen), BLOCK=block)
    return new_min, new_max


# ------------------------------------------------------------------------------------------------------
# calibration observers: the batch's clipped range averaged into the state, one kernel


@triton.jit
def _clip_to(v, amax):
    """``minimum(maximum(v, -amax), amax)``, NaN propagated (torch's ``maximum``/``minimum``)."""
    return tl.minimum(tl.maximum(v, -amax, propagate_nan=tl.PropagateNan.ALL), amax, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _clip_average_kernel(lo_ptr, hi_ptr, amax_ptr, smin_ptr, smax_ptr, c, one_minus_c, min_out, max_out, n,
                         CLIP: tl.constexpr, BLOCK: tl.constexpr):
    """``families.calibration.clip_range`` (``CLIP``) then ``average_range``, per entry: the range clipped
    into ``[-amax, amax]`` (an unseen range kept), averaged by ``min + c * (lo - min)`` over the finite
    ends of ``[lo, hi]`` (the first range initialises, an unseen one changes nothing), with the convex
    ``min * (1 - c) + lo * c`` where the formula overflows, and on both sides where it leaves min > max."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    lo = tl.load(lo_ptr + offs, mask=m, other=0.0)
    hi = tl.load(hi_ptr + offs, mask=m, other=0.0)
    smin = tl.load(smin_ptr + offs, mask=m, other=0.0)
    smax = tl.load(smax_ptr + offs, mask=m, other=0.0)
    if CLIP:
        amax = tl.load(amax_ptr + offs, mask=m, other=0.0)
        seen = lo <= hi
        lo = tl.where(seen, _clip_to(lo, amax), lo)
        hi = tl.where(seen, _clip_to(hi, amax), hi)
    # moving_average_update of the pairs [lo, hi] with ignore_nonfinite: their finite min and max
    lo_f = _finite(lo)
    hi_f = _finite(hi)
    b_lo = tl.where(lo_f, lo, float("inf"))
    b_lo = tl.where(hi_f & ~(hi >= b_lo), hi, b_lo)
    b_hi = tl.where(lo_f, lo, -float("inf"))
    b_hi = tl.where(hi_f & ~(hi <= b_hi), hi, b_hi)
    fresh = (smin == float("inf")) & (smax == -float("inf"))
    v_min = tl.where(fresh, b_lo, smin + c * (b_lo - smin))
    v_max = tl.where(fresh, b_hi, smax + c * (b_hi - smax))
    got = ~((b_lo == float("inf")) & (b_hi == -float("inf")))
    v_min = tl.where(got, v_min, smin)
    v_max = tl.where(got, v_max, smax)
    # the convex form where the formula overflows or crosses
    convex_min = smin * one_minus_c + lo * c
    convex_max = smax * one_minus_c + hi * c
    a_min = tl.where(_finite(smin) & lo_f & ~_finite(v_min), convex_min, v_min)
    a_max = tl.where(_finite(smax) & hi_f & ~_finite(v_max), convex_max, v_max)
    disordered = (a_min > a_max) & (lo <= hi)
    tl.store(min_out + offs, tl.where(disordered, convex_min, a_min), mask=m)
    tl.store(max_out + offs, tl.where(disordered, convex_max, a_max), mask=m)


def clip_average(min_val: torch.Tensor, max_val: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                 amax: torch.Tensor | None, c: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The new float32 ``(min_val, max_val)`` of a calibration batch (one kernel): ``[lo, hi]`` clipped into
    ``[-amax, amax]`` (``amax`` None: not clipped), then averaged into the state with constant ``c``."""
    n = min_val.numel()
    new_min, new_max = torch.empty_like(min_val), torch.empty_like(max_val)
    block = max(16, min(triton.next_power_of_2(n), _block(min_val)))
    amax_arg = lo if amax is None else amax.to(torch.float32).contiguous()
    launch(_clip_average_kernel, (triton.cdiv(n, block),), lo.contiguous(), hi.contiguous(), amax_arg,
           min_val.contiguous(), max_val.contiguous(), float(c), float(1.0 - c), new_min, new_max, n,
           CLIP=amax is not None, BLOCK=block)
    return new_min, new_max


# ------------------------------------------------------------------------------------------------------
# calibration observers: the batch's finite range and the histogram of |x| on its canonical grid


@triton.jit
def _pow2_at_least(v):
    """The smallest power of two ``>= v`` (float32, normal ``v > 0``; beyond 2**127: inf), exactly."""
    bits = v.to(tl.int32, bitcast=True)
    up = ((bits >> 23) + 1) << 23  # the next exponent, mantissa 0 (exponent 255: inf)
    return tl.where((bits & 0x7FFFFF) == 0, v, up.to(tl.float32, bitcast=True))


@triton.jit
def _floor_div(v, w):
    """``_calibration._floor_div``: ``floor(v / w)`` for a power of two ``w > 0``, a negative ``v`` whose
    quotient underflows to -0 in bin -1."""
    q = tl.div_rn(v, w)
    return tl.where((q == 0.0) & (v < 0.0), -1.0, tl.floor(q))


@triton.jit
def _row_range(part_ptr, row, R, PBLOCK: tl.constexpr):
    """The finite ``(min, max)`` of row ``row`` from its ``R`` partials."""
    p = tl.arange(0, PBLOCK)
    pm = p < R
    low = tl.min(tl.load(part_ptr + 2 * (row * R + p), mask=pm, other=float("inf")), axis=0)
    high = tl.max(tl.load(part_ptr + 2 * (row * R + p) + 1, mask=pm, other=-float("inf")), axis=0)
    return low, high


@triton.jit
def _abs_grid(low, high, binsf):
    """``_calibration._grid`` of the histogram of ``|x|`` for the signed finite range ``[low, high]``
    (``_histogram_update`` with ``seen``, absolute, fresh state): ``(min_val, max_val, lo, width)``."""
    a_low = tl.where(low <= high, 0.0, low)
    a_high = tl.maximum(-low, high) + 0.0
    a_low = tl.where(a_low <= a_high, 0.0, a_low)
    lo, width = _canonical_grid(a_low, a_high, 0.0, binsf)
    return a_low, a_high, lo, width


@triton.jit
def _canonical_grid(low, high, min_width, binsf):
    """``_calibration._grid``: the smallest power-of-two width ``>= min_width``, ``>= max(|low|, |high|) *
    2**-22`` (at least ``2**-126``) and ``>= high / bins - low / bins`` with ``floor(high / w) - floor(low / w)
    < bins``, ``lo = floor(low / w) * w``; the bounds clamped into ``[-2**127, 2**127 (1 - 2**-24)]``;
    ``(0, 0)`` for an empty range."""
    empty = ~(low <= high)
    g_low = tl.where(empty, 0.0, tl.minimum(tl.maximum(low, -1.7014118346046923e38), 1.7014117331926443e38))
    g_high = tl.where(empty, 0.0, tl.minimum(tl.maximum(high, -1.7014118346046923e38), 1.7014117331926443e38))
    need = tl.maximum(tl.div_rn(g_high, binsf) - tl.div_rn(g_low, binsf), min_width)
    need = tl.maximum(need, tl.maximum(tl.maximum(tl.abs(g_low), tl.abs(g_high)) * 2.384185791015625e-07,
                                       1.1754943508222875e-38))  # * 2**-22, at least 2**-126
    width = _pow2_at_least(need)
    width = tl.where(_floor_div(g_high, width) - _floor_div(g_low, width) >= binsf, width * 2.0, width)
    width = tl.where(_floor_div(g_high, width) - _floor_div(g_low, width) >= binsf, width * 2.0, width)
    lo = _floor_div(g_low, width) * width
    return tl.where(empty, 0.0, lo), tl.where(empty, 0.0, width)


@triton.jit
def _count_abs(x_ptr, N, row, rm, p, ITERS, lo, width, binsf, counts_ptr, bins, BLOCK: tl.constexpr):
    """``|x|`` of program ``p``'s part of the rows ``row`` (``(ROWS, 1)`` blocks, as ``rm`` (row in range),
    ``lo`` and ``width``; ``ITERS`` blocks each) counted (integer atomics) into bin
    ``clip(floor(min(|v|, 2**127 (1 - 2**-24)) / width) - lo / width, 0, bins - 1)`` (finite values only)."""
    safe_w = tl.where(width > 0.0, width, 1.0)
    start = tl.div_rn(lo, safe_w)
    r = tl.arange(0, BLOCK)[None, :]
    for it in range(0, ITERS):
        offs = (p.to(tl.int64) * ITERS + it) * BLOCK + r
        m = rm & (offs < N)
        v = tl.abs(tl.load(x_ptr + row * N + offs, mask=m, other=0.0))
        finite = _finite(v)
        capped = tl.minimum(v, 1.7014117331926443e38)  # the grid's range cap (_calibration._range_caps)
        index = _floor_div(tl.where(finite, capped, 0.0), safe_w) - start
        index = tl.minimum(tl.maximum(index, 0.0), binsf - 1.0).to(tl.int64)
        tl.atomic_add(counts_ptr + row * bins + index, tl.full([1, BLOCK], 1, tl.int64), mask=m & finite,
                      sem="relaxed")


@triton.jit
def _rows_range_kernel(x_ptr, N, part_ptr, counts_ptr, bins, R, ITERS, HITERS, BLOCK: tl.constexpr):
    """Program ``(row, p)``: the finite min/max of its part of the row (``ITERS`` blocks) into the partials;
    zeroes its part of the row's counts."""
    row = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    r = tl.arange(0, BLOCK)
    lo_acc = tl.full([BLOCK], float("inf"), tl.float32)
    hi_acc = tl.full([BLOCK], -float("inf"), tl.float32)
    for it in range(0, ITERS):
        offs = (p.to(tl.int64) * ITERS + it) * BLOCK + r
        m = offs < N
        v = tl.load(x_ptr + row * N + offs, mask=m, other=0.0)
        finite = m & _finite(v)
        lo_acc = tl.where(finite, tl.minimum(lo_acc, v), lo_acc)
        hi_acc = tl.where(finite, tl.maximum(hi_acc, v), hi_acc)
    tl.store(part_ptr + 2 * (row * R + p), tl.min(lo_acc, axis=0))
    tl.store(part_ptr + 2 * (row * R + p) + 1, tl.max(hi_acc, axis=0))
    for it in range(0, HITERS):
        offs = (p.to(tl.int64) * HITERS + it) * BLOCK + r
        tl.store(counts_ptr + row * bins + offs, tl.zeros([BLOCK], tl.int64), mask=offs < bins)


@triton.jit
def _abs_histogram_kernel(x_ptr, N, part_ptr, counts_ptr, bins, binsf, R, ITERS, lo_out, hi_out, grid_out,
                          PBLOCK: tl.constexpr, BLOCK: tl.constexpr):
    """Program ``(row, p)``: the row's range and grid from the partials, then ``|x|`` of its part of the row
    counted (``_count_abs``); program ``(row, 0)`` writes the row's range and the histogram's ``lo, width,
    min_val, max_val``."""
    row = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    low, high = _row_range(part_ptr, row, R, PBLOCK)
    a_low, a_high, lo, width = _abs_grid(low, high, binsf)
    rows = row + tl.zeros([1, 1], tl.int64)
    _count_abs(x_ptr, N, rows, rows >= 0, p, ITERS, lo, width, binsf, counts_ptr, bins, BLOCK)
    if p == 0:
        tl.store(lo_out + row, low)
        tl.store(hi_out + row, high)
        channels = tl.num_programs(0)
        tl.store(grid_out + row, lo)
        tl.store(grid_out + channels + row, width)
        tl.store(grid_out + 2 * channels + row, a_low)
        tl.store(grid_out + 3 * channels + row, a_high)


def _channel_rows(x: torch.Tensor, axis: int | None) -> torch.Tensor:
    """``x`` as contiguous rows: one (per tensor) or one per channel along the normalised ``axis``."""
    rows = x.reshape(1, -1) if axis is None else torch.movedim(x, axis, 0).reshape(x.shape[axis], -1)
    return rows.contiguous()


def range_abs_histogram(x: torch.Tensor, axis: int | None, bins: int) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """``families.calibration``'s ``observed_range`` and ``abs_histogram`` of a non-empty float32 ``x`` (per
    tensor, or per channel along the normalised ``axis``) in two kernels: ``(lo, hi, (counts, lo, width,
    min_val, max_val))`` as new tensors (int64 counts)."""
    rows = _channel_rows(x, axis)
    channels, n = rows.shape
    block = _block(rows)
    per_row = max(1, min(triton.cdiv(n, block), max(1, _MAX_PROGRAMS // channels)))
    iters = triton.cdiv(triton.cdiv(n, per_row), block)
    hiters = triton.cdiv(triton.cdiv(bins, per_row), block)
    device = x.device
    parts = torch.empty(2 * channels * per_row, dtype=torch.float32, device=device)
    counts = torch.empty((channels, bins), dtype=torch.int64, device=device)
    lo = torch.empty(channels, dtype=torch.float32, device=device)
    hi = torch.empty(channels, dtype=torch.float32, device=device)
    grid = torch.empty((4, channels), dtype=torch.float32, device=device)  # lo, width, min_val, max_val
    launch(_rows_range_kernel, (channels, per_row), rows, n, parts, counts, bins, per_row, iters, hiters, BLOCK=block)
    launch(_abs_histogram_kernel, (channels, per_row), rows, n, parts, counts, bins, float(bins), per_row, iters, lo,
           hi, grid, PBLOCK=triton.next_power_of_2(per_row), BLOCK=block)
    lead = () if axis is None else (channels,)
    hist = (counts.reshape(lead + (bins,)),) + tuple(grid[k].reshape(lead) for k in range(4))
    return lo.reshape(lead), hi.reshape(lead), hist


@triton.jit
def _percentile_kernel(counts_ptr, lo_ptr, width_ptr, k1, k2, k3, bins, amax_out, BLOCK: tl.constexpr):
    """Program ``row``: ``_calibration.percentile_range(symmetric=True)[1]`` of the row's integer counts on the
    grid ``(lo, width)``: the left edge ``(lo / width + i) * width`` of the first bin ``i`` whose cumulative
    count reaches ``keep * total`` (float64, as the array code's work dtype; ``keep = k1 + k2 + k3`` exactly,
    three float32 arguments)."""
    row = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], tl.int64)
    for start in range(0, bins, BLOCK):
        total += tl.load(counts_ptr + row * bins + start + r, mask=start + r < bins, other=0)
    keep = (tl.cast(k1, tl.float64) + tl.cast(k2, tl.float64)) + tl.cast(k3, tl.float64)
    target = keep * tl.sum(total, axis=0).to(tl.float64)
    carry = tl.zeros([], tl.int64)
    first = tl.full([], 0, tl.int32) + bins  # (no bin reached: cannot happen, keep <= 1)
    for start in range(0, bins, BLOCK):
        c = tl.load(counts_ptr + row * bins + start + r, mask=start + r < bins, other=0)
        cum = tl.cumsum(c, axis=0) + carry
        reached = (cum.to(tl.float64) >= target) & (start + r < bins)
        first = tl.minimum(first, tl.min(tl.where(reached, start + r, bins), axis=0))
        carry += tl.sum(c, axis=0)
    width = tl.load(width_ptr + row)
    start_edge = tl.div_rn(tl.load(lo_ptr + row), tl.where(width > 0.0, width, 1.0))
    tl.store(amax_out + row, (start_edge + first.to(tl.float32)) * width)


def percentile_amax(counts: torch.Tensor, lo: torch.Tensor, width: torch.Tensor, keep: float) -> torch.Tensor:
    """``families.calibration.search_amax("percentile", ...)`` of a histogram of ``|x|`` (int64 counts
    ``(..., bins)``, float32 grid): one kernel, one program per row."""
    bins = counts.shape[-1]
    rows = counts.reshape(-1, bins).contiguous()
    amax = torch.empty(lo.shape, dtype=torch.float32, device=counts.device)
    launch(_percentile_kernel, (rows.shape[0],), rows, lo.reshape(-1).contiguous(), width.reshape(-1).contiguous(),
           *float32_parts(keep), bins, amax, BLOCK=min(triton.next_power_of_2(bins), 4096))
    return amax


# ------------------------------------------------------------------------------------------------------
# HistogramObserver.calculate_qparams: torch's L2 search and the qparams, one single-program kernel


@triton.jit
def _cascade_level(src, size, dst, COLS: tl.constexpr, GB: tl.constexpr):
    """One level of ``_histogram._cascade_last`` for ``COLS`` columns (element ``j`` of column ``c`` at
    ``src + j * COLS + c``): the sequential sum of each 16 into ``dst`` (same layout; ``GB`` groups of all
    columns at a time) and the sequential sum of the ``size % 16`` left over; returns ``(that sum, size // 16)``."""
    groups = size // 16
    c = tl.arange(0, COLS)
    left = tl.zeros([COLS], tl.float32)
    for j in range(16 * groups, size):
        left += tl.load(src + j * COLS + c)
    t = tl.arange(0, GB * COLS)
    for first in range(0, groups, GB):
        g = first + t // COLS
        m = g < groups
        acc = tl.zeros([GB * COLS], tl.float32)
        for k in tl.static_range(16):
            acc += tl.load(src + (16 * g + k) * COLS + t % COLS, mask=m, other=0.0)
        tl.store(dst + g * COLS + t % COLS, acc, mask=m)
    tl.debug_barrier()
    return left, groups


@triton.jit
def _sum32(v_ptr, n, lvl_ptr, LANES: tl.constexpr, GB: tl.constexpr):
    """``_histogram.sum32`` of ``v[0:n]`` (float32, torch's CPU ``cascade_sum`` order: ``4 * LANES`` columns
    each summed in a 16-ary cascade, then the vectors left over, the columns into ``LANES`` lanes, the
    scalar tail and the lanes); ``lvl_ptr``: scratch of ``n // 8 + 64`` float32."""
    COLS: tl.constexpr = 4 * LANES
    c = tl.arange(0, COLS)
    nvec = n // LANES
    ilp = nvec // 4
    l0, g0 = _cascade_level(v_ptr, ilp, lvl_ptr, COLS, GB)
    x2 = lvl_ptr + g0 * COLS
    l1, g1 = _cascade_level(lvl_ptr, g0, x2, COLS, GB)
    x3 = x2 + g1 * COLS
    l2, g2 = _cascade_level(x2, g1, x3, COLS, GB)
    rest = tl.zeros([COLS], tl.float32)
    for j in range(0, g2):
        rest += tl.load(x3 + j * COLS + c)
    part_ptr = x3 + g2 * COLS
    tl.store(part_ptr + c, ((l0 + l1) + l2) + rest)
    tl.debug_barrier()
    lane = tl.arange(0, LANES)
    acc = tl.load(part_ptr + lane)
    for t in range(4 * ilp, nvec):
        acc += tl.load(v_ptr + t * LANES + lane)
    for k in tl.static_range(1, 4):
        acc += tl.load(part_ptr + k * LANES + lane)
    if LANES == 1:
        out = tl.sum(acc, axis=0)
    else:
        acc_ptr = part_ptr + COLS
        tl.store(acc_ptr + lane, acc)
        tl.debug_barrier()
        out = tl.zeros([], tl.float32)
        for i in range(nvec * LANES, n):
            out += tl.load(v_ptr + i)
        for k in tl.static_range(LANES):
            out += tl.load(acc_ptr + k)
    return out


@triton.jit
def _cumsum32(h_ptr, n, cs_ptr, p_ptr, BLOCK: tl.constexpr):
    """``_l2_search._cumsum32``: the running sums of ``h`` in float64, left to right, each rounded to float32
    (``p_ptr``: float64 scratch of ``n``): float64 prefix sums by blocks (a scan: any order), then
    :func:`_checked_cumsum`."""
    r = tl.arange(0, BLOCK)
    carry = tl.zeros([], tl.float64)
    for s0 in range(0, n, BLOCK):
        i = s0 + r
        m = i < n
        p = carry + tl.cumsum(tl.load(h_ptr + i, mask=m, other=0.0).to(tl.float64), axis=0)
        tl.store(p_ptr + i, p, mask=m)
        tl.debug_barrier()
        carry = tl.load(p_ptr + tl.minimum(s0 + BLOCK, n) - 1)
    _checked_cumsum(h_ptr, n, cs_ptr, p_ptr, BLOCK)


@triton.jit
def _checked_cumsum(h_ptr, n, cs_ptr, p_ptr, BLOCK: tl.constexpr):
    """``cs = float32(p)`` where every ``p_i`` is ``p_{i-1} + h_i`` rounded once (``p_{-1} = 0``): then, by
    induction, ``p`` holds the left-to-right float64 sums; else those sums are formed one at a time."""
    r = tl.arange(0, BLOCK)
    bad = tl.zeros([BLOCK], tl.int32)
    for s0 in range(0, n, BLOCK):
        i = s0 + r
        m = i < n
        x = tl.load(h_ptr + i, mask=m, other=0.0).to(tl.float64)
        before = tl.load(p_ptr + i - 1, mask=m & (i > 0), other=0.0)
        p = tl.load(p_ptr + i, mask=m, other=0.0)
        bad += (m & (before + x != p)).to(tl.int32)
        tl.store(cs_ptr + i, p.to(tl.float32), mask=m)
    if tl.sum(bad, axis=0) > 0:
        acc = tl.zeros([], tl.float64)
        for i0 in range(0, n, 16):
            for k in tl.static_range(16):
                j = i0 + k
                acc += tl.load(h_ptr + j, mask=j < n, other=0.0).to(tl.float64)
                tl.store(cs_ptr + j, acc.to(tl.float32), mask=j < n)
    tl.debug_barrier()


@triton.jit
def _cs_counts(cs_ptr, n, thr_a, thr_b, BLOCK: tl.constexpr):
    """``(#{i : cs_i < thr_a}, #{i : cs_i > thr_b})``."""
    r = tl.arange(0, BLOCK)
    below = tl.zeros([], tl.int32)
    above = tl.zeros([], tl.int32)
    for s0 in range(0, n, BLOCK):
        v = tl.load(cs_ptr + s0 + r, mask=s0 + r < n, other=float("nan"))  # (NaN: neither)
        below += tl.sum((v < thr_a).to(tl.int32), axis=0)
        above += tl.sum((v > thr_b).to(tl.int32), axis=0)
    return below, above


@triton.jit
def _div_floor(a, b):
    """``_l2_search._floor_div``: ``floor(a / b)`` as torch's ``div(rounding_mode="floor")`` (``b > 0``): the
    rounded quotient floored, lowered by one where ``q * b > a`` in float64; NaN for an infinite ``a``."""
    q = tl.floor(tl.div_rn(a, b))
    q = q - (q.to(tl.float64) * b.to(tl.float64) > a.to(tl.float64)).to(tl.float32)
    return tl.where(tl.abs(a) == float("inf"), float("nan"), q)


@triton.jit
def _l2_error(hist_ptr, n, start, end, bin_width, dst_nbins, top, row_ptr, lvl_ptr, BLOCK: tl.constexpr,
              LANES: tl.constexpr, GB: tl.constexpr):
    """``_l2_search._errors`` of the candidate ``(start, end)`` (``bin_width``, ``dst_nbins`` float64, ``top``
    ``float32(dst_nbins - 1)``): the per-bin errors in its float32 operations into ``row``, summed in
    :func:`_sum32`'s order; 0 where the levels have zero width."""
    nan: tl.constexpr = tl.PropagateNan.ALL
    dst64 = bin_width * (end - start + 1).to(tl.float64) / dst_nbins
    out = tl.zeros([], tl.float32)
    if dst64 != 0.0:
        dst = dst64.to(tl.float32)
        half = (dst64 / 2.0).to(tl.float32)
        neg_half = -half
        w32 = bin_width.to(tl.float32)
        half3 = half * half * half
        neg_half3 = neg_half * neg_half * neg_half
        inner = tl.div_rn(half3 - neg_half3, 3.0)
        r = tl.arange(0, BLOCK)
        tl.debug_barrier()  # (the previous sum has read row and the scratch)
        for s0 in range(0, n, BLOCK):
            i = s0 + r
            m = i < n
            begin = (i - start).to(tl.float32) * w32
            stop = begin + w32
            p = tl.minimum(tl.maximum(_div_floor(begin, dst), 0.0, propagate_nan=nan), top, propagate_nan=nan)
            q = tl.minimum(tl.maximum(_div_floor(stop, dst), 0.0, propagate_nan=nan), top, propagate_nan=nan)
            density = tl.div_rn(tl.load(hist_ptr + i, mask=m, other=0.0), w32)
            db = begin - (p + 0.5) * dst
            norm = density * tl.div_rn(half3 - db * db * db, 3.0)
            norm = norm + ((q - p) - 1.0) * (density * inner)
            de = stop - (q * dst + half)
            norm = norm + density * tl.div_rn(de * de * de - neg_half3, 3.0)
            tl.store(row_ptr + i, norm, mask=m)
        tl.debug_barrier()
        out = _sum32(row_ptr, n, lvl_ptr, LANES, GB)
    return out


@triton.jit
def _round_half_even(x):
    """``torch.round`` of float32 ``x`` (ties to even)."""
    f = tl.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)


@triton.jit
def _end_count(betas_ptr, nbeta, cs_end, total, BSTEPS: tl.constexpr):
    """``#{b : float32(beta_b * total) >= cs_end}`` (a prefix of the ``nbeta`` steps, the thresholds falling
    with ``b``): counted over the 8 steps from 3 before ``(1 - cs_end / total) * 1e5`` (``beta_b`` is within
    1e-11 of ``1 - b * 1e-5``) when the steps either side confirm it, else by binary search."""
    est = tl.floor((1.0 - cs_end.to(tl.float64) / total) * 1e5)
    est = tl.where(tl.abs(est) < float("inf"), est, 0.0)  # (NaN: 0)
    base = tl.minimum(tl.maximum(est - 3.0, 0.0), (nbeta - 1).to(tl.float64)).to(tl.int32)
    w = base + tl.arange(0, 8)
    inside = (tl.load(betas_ptr + w, mask=w < nbeta, other=0.0) * total).to(tl.float32) >= cs_end
    count = base + tl.sum((inside & (w < nbeta)).to(tl.int32), axis=0)
    before = (tl.load(betas_ptr + base - 1, mask=base > 0, other=0.0) * total).to(tl.float32) >= cs_end
    after = (tl.load(betas_ptr + base + 8, mask=base + 8 < nbeta, other=0.0) * total).to(tl.float32) >= cs_end
    if ~((base == 0) | before) | ((base + 8 < nbeta) & after):
        lo_b = tl.zeros([], tl.int32)
        hi_b = lo_b + nbeta
        for _ in tl.static_range(BSTEPS):
            active = lo_b < hi_b
            mid = (lo_b + hi_b) // 2
            ge = (tl.load(betas_ptr + mid, mask=active, other=0.0) * total).to(tl.float32) >= cs_end
            lo_b = tl.where(active & ge, mid + 1, lo_b)
            hi_b = tl.where(active & ~ge, mid, hi_b)
        count = lo_b
    return count


@triton.jit
def _l2_search_kernel(hist_ptr, n, smin_ptr, smax_ptr, alphas_ptr, betas_ptr, nbeta, cs_ptr, p_ptr, row_ptr, lvl_ptr,
                      dst_nbins, eps, eps_ptr, qrange, qmin, qmax, zp_sym, range_out, scale_out, zp_out,
                      flags_out, EMPTY_AS_ZERO: tl.constexpr, QPARAMS: tl.constexpr, SYMMETRIC: tl.constexpr,
                      EPS_PTR: tl.constexpr, BLOCK: tl.constexpr, LANES: tl.constexpr, GB: tl.constexpr,
                      BSTEPS: tl.constexpr):
    """One program: :func:`check_histogram`'s flags, torch's greedy L2 search (``_l2_search._search_bins``),
    the range found and (``QPARAMS``) ``calculate_qparams`` of it.

    The search runs torch's loop itself, one candidate per iteration: at step counts ``(a, b)`` the start
    bound ``l`` is the first bin whose running sum reaches ``alpha_{a+1} * total`` and the end bound ``r``
    the last one not above ``beta_{b+1} * total`` (clamped into ``[start, end]``, counts over ``cs``);
    a start step when ``l - start > end - r``, else an end step. A step that moves nothing (``l = start``,
    ``r = end``: an end step) is skipped with all those after it up to the first ``b`` whose threshold falls
    below ``cs[end]`` (binary search over the ``beta`` table). Each move's error is evaluated
    (:func:`_l2_error`); the loop stops at the first rise, when the bounds meet or when ``alpha >= beta``."""
    nan: tl.constexpr = tl.PropagateNan.ALL
    smin = tl.load(smin_ptr)
    smax = tl.load(smax_ptr)
    empty = (smin == float("inf")) & (smax == -float("inf"))
    lo = smin
    hi = smax
    if EMPTY_AS_ZERO:
        lo = tl.where(empty, 0.0, smin)
        hi = tl.where(empty, 0.0, smax)
    r = tl.arange(0, BLOCK)
    bad = tl.zeros([BLOCK], tl.int32)
    for s0 in range(0, n, BLOCK):
        h = tl.load(hist_ptr + s0 + r, mask=s0 + r < n, other=0.0)
        bad += (~((h >= 0.0) & _finite(h))).to(tl.int32)
    counts_ok = tl.sum(bad, axis=0) == 0
    finite = ~((tl.abs(lo) == float("inf")) | (tl.abs(hi) == float("inf")))
    ordered = ~(lo > hi)
    start = tl.zeros([], tl.int32)
    bins = start + n  # (n as a tensor: triton passes n == 1 as a constant)
    end = bins - 1
    if counts_ok & finite & ordered:
        _cumsum32(hist_ptr, n, cs_ptr, p_ptr, BLOCK)
        total = _sum32(hist_ptr, n, lvl_ptr, LANES, GB).to(tl.float64)
        bin_width = (hi.to(tl.float64) - lo.to(tl.float64)) / bins.to(tl.float64)
        levels = tl.zeros([], tl.int64) + dst_nbins  # (an int: exact in float64 below 2**53)
        top = (levels - 1).to(tl.float32)
        levels_f = levels.to(tl.float64)
        a = tl.zeros([], tl.int32)
        b = tl.zeros([], tl.int32)
        prev = tl.full([], float("inf"), tl.float32)
        going = (start < end) & (tl.load(alphas_ptr) < tl.load(betas_ptr))
        while going:
            thr_a = (tl.load(alphas_ptr + a + 1) * total).to(tl.float32)
            thr_b = (tl.load(betas_ptr + b + 1) * total).to(tl.float32)
            below, above = _cs_counts(cs_ptr, n, thr_a, thr_b, BLOCK)
            left = tl.minimum(tl.maximum(below, start), end)
            right = tl.minimum(tl.maximum(n - above - 1, start), end)
            to_start = (left - start) > (end - right)
            if ~to_start & (right == end):  # no move: skip to the first b whose beta_{b+1} * total < cs[end]
                b = tl.maximum(b + 1, _end_count(betas_ptr, nbeta, tl.load(cs_ptr + end), total, BSTEPS) - 1)
                thr_b = (tl.load(betas_ptr + b + 1, mask=b + 1 < nbeta, other=0.0) * total).to(tl.float32)
                _, above = _cs_counts(cs_ptr, n, thr_a, thr_b, BLOCK)
                right = tl.minimum(tl.maximum(n - above - 1, start), end)  # (left = start: an end step)
            rise = ~(tl.load(alphas_ptr + a) < tl.load(betas_ptr + b))  # (the loop's end)
            if ~rise:
                new_start = tl.where(to_start, left, start)
                new_end = tl.where(to_start, end, right)
                a = tl.where(to_start, a + 1, a)
                b = tl.where(to_start, b, b + 1)
                norm = prev  # after a NaN error nothing rises again: the walk goes on without errors
                if prev == prev:
                    norm = _l2_error(hist_ptr, n, new_start, new_end, bin_width, levels_f, top, row_ptr, lvl_ptr,
                                     BLOCK, LANES, GB)
                rise = norm > prev
                start = tl.where(rise, start, new_start)
                end = tl.where(rise, end, new_end)
                prev = norm
            going = ~rise & (start < end) & (tl.load(alphas_ptr + a) < tl.load(betas_ptr + b))
    width = tl.div_rn(hi - lo, bins.to(tl.float32))
    new_min = lo + width * start.to(tl.float32)
    new_max = lo + width * (end + 1).to(tl.float32)
    tl.store(range_out, new_min)
    tl.store(range_out + 1, new_max)
    if QPARAMS:  # _qparams._calculate_qparams of the range (the state's own where it is empty)
        v_min = tl.where(empty, smin, new_min)
        v_max = tl.where(empty, smax, new_max)
        invalid = v_min > v_max  # (an empty state): scale 1, zero point 0
        if EPS_PTR:
            e = tl.load(eps_ptr)
        else:
            e = eps
        min_neg = tl.minimum(v_min, 0.0, propagate_nan=nan)
        max_pos = tl.maximum(v_max, 0.0, propagate_nan=nan)
        if SYMMETRIC:
            max_pos = tl.maximum(-min_neg, max_pos, propagate_nan=nan)
            scale = tl.maximum(tl.div_rn(max_pos, qrange), e, propagate_nan=nan)
            zp = tl.zeros([], tl.int64) + zp_sym
        else:
            scale = tl.maximum(tl.div_rn(max_pos - min_neg, qrange), e, propagate_nan=nan)
            rq = _round_half_even(tl.div_rn(min_neg, scale))
            # float -> int32 as on x86 (NaN and out-of-range values: INT32_MIN), not the GPU's saturation
            ri = tl.where((rq >= -2147483648.0) & (rq < 2147483648.0), rq, -2147483648.0).to(tl.int64)
            d = ((qmin - ri + 2147483648) & 4294967295) - 2147483648  # quant_min - ri in int32, wrapping
            zp = tl.minimum(tl.maximum(d, qmin), qmax).to(tl.int32)
        tl.store(scale_out, tl.where(invalid, 1.0, scale))
        tl.store(zp_out, tl.where(invalid, 0, zp))
    tl.store(flags_out, counts_ok.to(tl.float64))
    tl.store(flags_out + 1, finite.to(tl.float64))
    tl.store(flags_out + 2, ordered.to(tl.float64))
    tl.store(flags_out + 3, empty.to(tl.float64))
    tl.store(flags_out + 4, ((smin != smin) | (smax != smax)).to(tl.float64))
    tl.store(flags_out + 5, lo.to(tl.float64))
    tl.store(flags_out + 6, hi.to(tl.float64))


def l2_search(hist: torch.Tensor, min_val: torch.Tensor, max_val: torch.Tensor, dst_nbins: int, alphas: torch.Tensor,
              betas: torch.Tensor, *, qparams: dict | None = None) -> tuple[torch.Tensor, ...]:
    """``_l2_search`` on the torch CUDA path in one kernel: ``(range, scale, zero_point, flags)`` as new tensors:
    ``range = [new_min, new_max]`` (float32) of the search on ``[min_val, max_val]`` (float32 0-d; float32
    ``hist``), and ``flags = [counts ok, range finite, ordered, empty, NaN, lo, hi]`` (float64:
    :func:`check_histogram`'s checks, read on the host at once). ``alphas``, ``betas``: the walk tables
    (float64, on the device). With ``qparams`` (``symmetric``, ``quant_min``, ``quant_max``, ``zero_point``,
    ``eps``: a float or a float32 tensor read on the device), an empty state searches ``[0, 0]`` and the
    qparams of the range found are computed too (scale ``(1,)`` float32, zero point ``(1,)`` int32, int64
    when symmetric); else ``scale`` and ``zero_point`` are None."""
    n = hist.shape[0]
    device = hist.device
    hist = hist.contiguous()
    lanes = 8 if n >= 8 else 1
    block = max(16, min(triton.next_power_of_2(n), _block(hist)))
    f32 = torch.float32
    cs = torch.empty(n, dtype=f32, device=device)
    prefix = torch.empty(n, dtype=torch.float64, device=device)
    row = torch.empty(n, dtype=f32, device=device)
    lvl = torch.empty(n // 8 + 64, dtype=f32, device=device)
    out = torch.empty(2, dtype=f32, device=device)
    flags = torch.empty(7, dtype=torch.float64, device=device)
    q = qparams or {}
    symmetric = bool(q.get("symmetric", False))
    eps = q.get("eps", 1.0)
    eps_ptr = eps if isinstance(eps, torch.Tensor) else out
    scale = torch.empty(1, dtype=f32, device=device)
    zero_point = torch.empty(1, dtype=torch.int64 if symmetric else torch.int32, device=device)
    qrange = float(q.get("quant_max", 1) - q.get("quant_min", 0))
    launch(_l2_search_kernel, (1,), hist, n, min_val, max_val, alphas, betas, betas.shape[0], cs, prefix, row, lvl,
           int(dst_nbins), 1.0 if isinstance(eps, torch.Tensor) else float(eps), eps_ptr,
           qrange / 2 if symmetric else qrange, int(q.get("quant_min", 0)), int(q.get("quant_max", 0)),
           int(q.get("zero_point", 0)), out, scale, zero_point, flags, EMPTY_AS_ZERO=qparams is not None,
           QPARAMS=qparams is not None, SYMMETRIC=symmetric, EPS_PTR=isinstance(eps, torch.Tensor), BLOCK=block,
           LANES=lanes, GB=min(64, triton.next_power_of_2(max(1, n // lanes // 64))),
           BSTEPS=max(1, math.ceil(math.log2(betas.shape[0] + 1))))
    if qparams is None:
        return out, None, None, flags
    return out, scale, zero_point, flags
# ======================================================================================================
# KL (KLObserver.forward; MixObserver's KL candidate): the KL search over a histogram of |x|, and the
# accumulator's update (the batch's range and |x| counted, the old counts re-binned onto the new grid)
# ======================================================================================================


@triton.jit
def _kl_prefix_kernel(counts_ptr, channels, bins, prefix_ptr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Programs of ``ROWS`` rows: the prefix sums (``bins + 1`` each, a leading 0) of each row's counts with
    the first bin flattened (``b_0 = b_1``), float64: of the counts, of the non-empty bins (both exact,
    int64), and of ``b log b`` (``0 log 0 = 0``), added in index order (each chunk's scan starts from the
    carry; the interpreter's scan is sequential, a GPU's a tree)."""
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    rm = row < channels
    r = tl.arange(0, BLOCK)[None, :]
    src = counts_ptr + row * bins
    cs_out = prefix_ptr + row * 3 * (bins + 1)
    nz_out = cs_out + (bins + 1)
    px_out = nz_out + (bins + 1)
    zero = tl.zeros([ROWS, 1], tl.float64)
    tl.store(cs_out, zero, mask=rm)
    tl.store(nz_out, zero, mask=rm)
    tl.store(px_out, zero, mask=rm)
    second = tl.load(src + 1, mask=rm, other=0)
    cs_carry = tl.zeros([ROWS, 1], tl.int64)
    nz_carry = tl.zeros([ROWS, 1], tl.int64)
    px_carry = tl.zeros([ROWS, 1], tl.float64)
    for start in range(0, bins, BLOCK):
        j = start + r
        m = rm & (j < bins)
        c = tl.load(src + j, mask=m, other=0)
        c = tl.where(j == 0, second, c)
        cs = tl.cumsum(c, axis=1) + cs_carry
        nz = tl.cumsum((c > 0).to(tl.int64), axis=1) + nz_carry
        b = c.to(tl.float64)
        xlogx = tl.where(c > 0, b * tl.log(tl.where(c > 0, b, 1.0)), 0.0)
        px = tl.cumsum(tl.where(r == 0, px_carry + xlogx, xlogx), axis=1)
        tl.store(cs_out + 1 + j, cs.to(tl.float64), mask=m)
        tl.store(nz_out + 1 + j, nz.to(tl.float64), mask=m)
        tl.store(px_out + 1 + j, px, mask=m)
        last = r == tl.minimum(bins - start, BLOCK) - 1
        cs_carry = tl.sum(tl.where(last, cs, 0), axis=1)[:, None]
        nz_carry = tl.sum(tl.where(last, nz, 0), axis=1)[:, None]
        px_carry = tl.sum(tl.where(last, px, 0.0), axis=1)[:, None]  # (one term: exact)


@triton.jit
def _kl_group_terms(cs_ptr, nz_ptr, i, g, levels, inside):
    """``G log(G / n)`` of the groups ``g`` of the candidates ``i`` (blocks that broadcast), whose bins are
    ``[ceil(g i / L), ceil((g + 1) i / L))``, ``G`` their count over ``n`` non-empty bins (from the prefix
    sums): ``log_q = log max(G, tiny) - log max(n, 1)`` (an empty group's term is ``0 * finite``)."""
    first = (g * i + levels - 1) // levels
    end = ((g + 1) * i + levels - 1) // levels
    count = tl.load(cs_ptr + end, mask=inside, other=0.0) - tl.load(cs_ptr + first, mask=inside, other=0.0)
    nonzero = tl.load(nz_ptr + end, mask=inside, other=0.0) - tl.load(nz_ptr + first, mask=inside, other=0.0)
    log_q = tl.log(tl.maximum(count, 2.2250738585072014e-308)) - tl.log(tl.maximum(nonzero, 1.0))
    return count * log_q, log_q


@triton.jit
def _kl_leaf_sum(cs_ptr, nz_ptr, i, km, levels, start, size, KBLOCK: tl.constexpr):
    """NumPy's ``pairwise_sum`` of the terms of the groups ``start .. start + size - 1`` (``size <= 128``) of
    each candidate: below 8 one by one from 0, else eight running sums (lane ``j`` takes the terms
    ``j, j + 8, ...``) combined as ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))``, then the rest one
    by one (``_compiled._pairwise_block``). Sums of two terms are exact in either order."""
    res = tl.zeros([KBLOCK], tl.float64)
    stop = size - size % 8
    if size >= 8:
        lane = tl.arange(0, 8).to(tl.int64)
        r = tl.zeros([KBLOCK, 8], tl.float64)
        for q in range(0, stop, 8):
            t, _ = _kl_group_terms(cs_ptr[:, None], nz_ptr[:, None], i[:, None], (start + q + lane)[None, :], levels,
                                   km[:, None])
            r = tl.where(q == 0, t, r + t)
        pairs = tl.sum(tl.reshape(r, [KBLOCK, 4, 2]), axis=2)
        quads = tl.sum(tl.reshape(pairs, [KBLOCK, 2, 2]), axis=2)
        res = tl.sum(quads, axis=1)
    else:
        stop = 0
    for g in range(start + stop, start + size):
        t, _ = _kl_group_terms(cs_ptr, nz_ptr, i, g + i * 0, levels, km)
        res += t
    return res


@triton.jit
def _kl_curve_kernel(prefix_ptr, channels, bins, levels, leaf, K, kl_ptr, LEAVES: tl.constexpr, TREE: tl.constexpr,
                     KBLOCK: tl.constexpr):
    """Program ``p``: ``_calibration._kl_strict`` of ``KBLOCK`` (row, candidate) pairs (``p * KBLOCK + lane``
    over ``channels * K``), candidate ``i = levels + k`` (``start_bin = levels``, stride 1), from the row's
    prefix sums (``_kl_prefix_kernel``), float64, each operation the array code's in its order:
    ``KL = (sum_{j<l} b log b + (b_l + t) log(b_l + t) - sum_g G log(G / n) - [b_l > 0] t log(G_l / n_l)) / T
    - log T + log C`` (kept ``C``, tail ``t = T - C``, last kept bin ``l = i - 1`` in group
    ``floor(l L / i)``), ``+inf`` where invalid. The sum over the ``L`` groups is NumPy's pairwise sum (the
    host path's): one block (``L <= 128``), or ``LEAVES = 2**TREE`` blocks of ``leaf = 128`` added as a
    perfect binary tree (``L`` a power of two)."""
    flat = tl.program_id(0).to(tl.int64) * KBLOCK + tl.arange(0, KBLOCK)
    km = flat < channels * K
    row = tl.where(km, flat // K, 0)
    k = flat % K
    i = tl.where(km, levels + k, bins)
    cs_ptr = prefix_ptr + row * 3 * (bins + 1)
    nz_ptr = cs_ptr + (bins + 1)
    px_ptr = nz_ptr + (bins + 1)
    total = tl.load(cs_ptr + bins + i * 0)  # (a block: 0-d and block booleans do not mix in the interpreter)
    kept = tl.load(cs_ptr + i)
    b_last = kept - tl.load(cs_ptr + i - 1)
    tail = total - kept
    if LEAVES == 1:
        sum_glog = _kl_leaf_sum(cs_ptr, nz_ptr, i, km, levels, 0, leaf, KBLOCK)
    else:
        column = tl.arange(0, LEAVES)[None, :]
        sums = tl.zeros([KBLOCK, LEAVES], tl.float64)
        for f in tl.static_range(LEAVES):
            part = _kl_leaf_sum(cs_ptr, nz_ptr, i, km, levels, f * leaf, leaf, KBLOCK)
            sums = tl.where(column == f, part[:, None], sums)
        for step in tl.static_range(TREE):  # adjacent pairs, level by level
            sums = tl.sum(tl.reshape(sums, [KBLOCK, LEAVES >> (step + 1), 2]), axis=2)
        sum_glog = tl.reshape(sums, [KBLOCK])
    _, last_log_q = _kl_group_terms(cs_ptr, nz_ptr, i, ((i - 1) * levels) // i, levels, km)
    end_mass = b_last + tail
    p_log_p = tl.load(px_ptr + i - 1) + tl.where(end_mass > 0, end_mass * tl.log(tl.where(end_mass > 0, end_mass, 1.0)),
                                                  0.0)
    p_log_q = sum_glog + tl.where(b_last > 0, tail * last_log_q, 0.0)
    safe_total = tl.where(total > 0, total, 1.0)
    kl = (p_log_p - p_log_q) / safe_total - tl.log(safe_total) + tl.log(tl.where(kept > 0, kept, 1.0))
    invalid = (total <= 0) | (kept <= 0) | ((b_last <= 0) & (tail > 0))
    kl = tl.where(invalid, float("inf"), tl.maximum(kl, 0.0, propagate_nan=tl.PropagateNan.ALL))
    tl.store(kl_ptr + flat, kl, mask=km)


@triton.jit
def _kl_pick_kernel(kl_ptr, channels, K, levels, lo_ptr, width_ptr, amax_out, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Programs of ``ROWS`` rows: ``_calibration._pick(ties="last")`` with the float64 tie tolerance ``2**-40``:
    the largest candidate within ``2**-40`` of the least divergence (the last one where none is, as for a NaN
    minimum), and its threshold, the edge ``(lo / width + i) * width`` (float32)."""
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    rm = row < channels
    r = tl.arange(0, BLOCK)[None, :]
    src = kl_ptr + row[:, None] * K
    best = tl.full([ROWS, BLOCK], float("inf"), tl.float64)
    for start in range(0, K, BLOCK):
        m = rm[:, None] & (start + r < K)
        best = tl.minimum(best, tl.load(src + start + r, mask=m, other=float("inf")), propagate_nan=tl.PropagateNan.ALL)
    limit = tl.min(best, axis=1)[:, None] + 9.094947017729282e-13  # + 2**-40
    last = tl.full([ROWS], -1, tl.int32)
    for start in range(0, K, BLOCK):
        m = rm[:, None] & (start + r < K)
        v = tl.load(src + start + r, mask=m, other=float("inf"))
        last = tl.maximum(last, tl.max(tl.where(m & (v <= limit), start + r, -1), axis=1))
    pick = tl.where(last < 0, K - 1, last)
    width = tl.load(width_ptr + row, mask=rm, other=0.0)
    start_edge = tl.div_rn(tl.load(lo_ptr + row, mask=rm, other=0.0), tl.where(width > 0.0, width, 1.0))
    tl.store(amax_out + row, (start_edge + (levels + pick).to(tl.float32)) * width, mask=rm)


def kl_search_applies(levels: int) -> bool:
    """Whether :func:`kl_search_amax` sums the ``levels`` group terms in NumPy's pairwise order: ``levels <= 128``
    (one block) or a power of two (blocks of 128 in a perfect tree); other counts run the array code."""
    return levels <= 128 or levels & (levels - 1) == 0


def kl_curve(counts: torch.Tensor, levels: int) -> torch.Tensor:
    """``_calibration.kl_divergences(...).objective`` (``num_levels=levels``, the defaults otherwise) of int64
    counts ``(C, bins)`` (below ``2**53``): the float64 divergence of every candidate ``i = levels .. bins``,
    ``(C, bins - levels + 1)``, in two kernels (the prefix sums, the divergences). Each float64 operation is
    the array code's, the group sums in NumPy's pairwise order: the NumPy host path's curve, bit for bit,
    through the interpreter (whose logs are NumPy's)."""
    bins = counts.shape[-1]
    if counts.dtype != torch.int64 or counts.ndim != 2 or not 1 <= levels <= bins or not kl_search_applies(levels):
        raise ValueError(f"kl_curve needs int64 counts (C, bins) and 1 <= levels <= bins, levels <= 128 or a power "
                         f"of two, got {counts.dtype} {tuple(counts.shape)}, levels={levels}")
    rows = counts.contiguous()
    channels = rows.shape[0]
    candidates = bins - levels + 1
    prefix = torch.empty((channels, 3, bins + 1), dtype=torch.float64, device=counts.device)
    kl = torch.empty((channels, candidates), dtype=torch.float64, device=counts.device)
    on_cpu = counts.device.type == "cpu"  # the interpreter: few, large programs; a GPU: small blocks
    rows_per = _kl_rows_per_program(channels, on_cpu)
    kblock = min(triton.next_power_of_2(channels * candidates), 8192 if on_cpu else 64)
    leaf = min(levels, 128)
    launch(_kl_prefix_kernel, (triton.cdiv(channels, rows_per),), rows, channels, bins, prefix, ROWS=rows_per,
           BLOCK=min(triton.next_power_of_2(bins), (1 << 14) // rows_per if on_cpu else 1024))
    launch(_kl_curve_kernel, (triton.cdiv(channels * candidates, kblock),), prefix, channels, bins, levels, leaf,
           candidates, kl, LEAVES=levels // leaf, TREE=(levels // leaf).bit_length() - 1, KBLOCK=kblock)
    return kl


def _kl_rows_per_program(channels: int, on_cpu: bool) -> int:
    return max(1, min(triton.next_power_of_2(channels), 64 if on_cpu else 1))


def kl_search_amax(counts: torch.Tensor, lo: torch.Tensor, width: torch.Tensor, levels: int) -> torch.Tensor:
    """``families.calibration.search_amax("kl", ...)`` (``_calibration.kl_threshold`` with ``num_levels=levels``,
    the defaults otherwise: ``start_bin = levels``, stride 1, no smoothing, the first bin flattened, ties to
    the last within ``2**-40``) of a histogram of ``|x|``: int64 counts ``(..., bins)`` (below ``2**53``),
    float32 grid ``lo``/``width`` ``(...)``. The amax per row on the device (float32), three kernels and no
    host read: :func:`kl_curve`, then the pick."""
    bins = counts.shape[-1]
    kl = kl_curve(counts.reshape(-1, bins), levels)
    channels, candidates = kl.shape
    amax = torch.empty(tuple(lo.shape), dtype=torch.float32, device=counts.device)
    on_cpu = counts.device.type == "cpu"
    rows_per = _kl_rows_per_program(channels, on_cpu)
    launch(_kl_pick_kernel, (triton.cdiv(channels, rows_per),), kl, channels, candidates, levels,
           lo.reshape(-1).contiguous(), width.reshape(-1).contiguous(), amax, ROWS=rows_per,
           BLOCK=min(triton.next_power_of_2(candidates), (1 << 14) // rows_per if on_cpu else 1024))
    return amax


@triton.jit
def _rebin_first(m, new_start, new_width, old_start, old_scaled_w, s, binsf):
    """``_calibration._rebin``'s first old bin of new bin ``m`` (int64 block): ``clip(e_m / w - lo / w, 0, bins)``
    with the new left edge ``e_m = (new_lo / new_w + m) * new_w`` (float32, inf beyond the range), ``e_m / w``
    as ``(e_m s) / (w s)`` (``s = 2**-64`` where ``w >= 2**64``), 0 for ``m = 0`` and ``bins`` for
    ``m = bins``; truncated to an integer as the array code's index cast."""
    mf = m.to(tl.float32)
    edge = (new_start + mf) * new_width
    first = tl.div_rn(edge * s, old_scaled_w) - old_start
    first = tl.minimum(tl.maximum(first, 0.0), binsf)
    first = tl.where(mf == 0.0, 0.0, tl.where(mf == binsf, binsf, first))
    return first.to(tl.int64)


@triton.jit
def _kl_accumulate_kernel(x_ptr, N, part_ptr, old_counts, old_lo, old_width, old_min, old_max, seen_min, seen_max,
                          counts_ptr, channels, bins, binsf, R, ITERS, RITERS, out_ptr, ROWS: tl.constexpr,
                          PBLOCK: tl.constexpr, BLOCK: tl.constexpr, RBLOCK: tl.constexpr, NSTEPS: tl.constexpr):
    """Program ``(rows, p)`` of ``families.calibration.kl_accumulate`` (no collective, float32 ``x``), ``ROWS``
    rows at once: each row's finite range from the partials (``_rows_range_kernel``), the histogram's range
    joined with that of ``|x|`` and its canonical grid (``_calibration._combine``: width at least the old
    one); then ``|x|`` of its part of each row counted, and its part of the old bins re-binned onto the new
    grid (``_rebin``: old bin ``j`` goes to the new bin ``m`` with ``first_m <= j < first_{m+1}``, found by
    binary search over ``first``, skipped where every row keeps its grid with finite edges, where
    ``first_m = m``; integer atomics, exact). Programs ``(rows, 0)`` write the new ``lo, width, min_val,
    max_val`` and the running finite range ``(minimum(low, seen_min), maximum(high, seen_max))``."""
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]  # (ROWS, 1)
    rm = row < channels
    p = tl.program_id(1)
    q = tl.arange(0, PBLOCK)[None, :]
    qm = rm & (q < R)
    low = tl.min(tl.load(part_ptr + 2 * (row * R + q), mask=qm, other=float("inf")), axis=1)[:, None]
    high = tl.max(tl.load(part_ptr + 2 * (row * R + q) + 1, mask=qm, other=-float("inf")), axis=1)[:, None]
    a_low = tl.where(low <= high, 0.0, low)  # _histogram_update's range of |x| from the signed one
    a_high = tl.maximum(-low, high) + 0.0
    a_low = tl.where(a_low <= a_high, 0.0, a_low)
    o_lo = tl.load(old_lo + row, mask=rm, other=0.0)
    o_width = tl.load(old_width + row, mask=rm, other=0.0)
    min_val = tl.minimum(tl.load(old_min + row, mask=rm, other=0.0), a_low)
    max_val = tl.maximum(tl.load(old_max + row, mask=rm, other=0.0), a_high)
    lo, width = _canonical_grid(min_val, max_val, tl.maximum(o_width, 0.0), binsf)
    _count_abs(x_ptr, N, row, rm, p, ITERS, lo, width, binsf, counts_ptr, bins, BLOCK)
    filled = o_width > 0.0  # (an old grid of width 0 holds nothing)
    safe_w = tl.where(filled, o_width, 1.0)
    new_start = tl.div_rn(lo, tl.where(width > 0.0, width, 1.0))
    old_start = tl.div_rn(o_lo, safe_w)
    s = tl.where(safe_w >= 1.8446744073709552e19, 5.421010862427522e-20, 1.0)  # 2**64, 2**-64
    old_scaled_w = safe_w * s
    # every row on the same grid with every edge finite: first_m = m exactly, every bin stays
    same = ~rm | ((lo == o_lo) & (width == o_width) & _finite((new_start + binsf) * width))
    kept = tl.min(same.to(tl.int32), axis=1)
    all_same = tl.min(kept, axis=0) == 1
    r = tl.arange(0, RBLOCK)[None, :]
    for it in range(0, RITERS):
        j = (p.to(tl.int64) * RITERS + it) * RBLOCK + r
        m = rm & filled & (j < bins)
        c = tl.load(old_counts + row * bins + j, mask=m, other=0)
        new_bin = j
        if not all_same:
            below = tl.zeros([ROWS, RBLOCK], tl.int64)  # #{m' in [0, bins]: first_m' <= j}
            above = tl.zeros([ROWS, RBLOCK], tl.int64) + bins + 1
            for _ in tl.static_range(NSTEPS):
                active = below < above
                k = (below + above) // 2
                le = _rebin_first(k, new_start, width, old_start, old_scaled_w, s, binsf) <= j
                below = tl.where(active & le, k + 1, below)
                above = tl.where(active & ~le, k, above)
            new_bin = tl.minimum(tl.maximum(below - 1, 0), bins - 1)
        tl.atomic_add(counts_ptr + row * bins + new_bin, c, mask=m & (c != 0), sem="relaxed")
    if p == 0:
        tl.store(out_ptr + row, lo, mask=rm)
        tl.store(out_ptr + channels + row, width, mask=rm)
        tl.store(out_ptr + 2 * channels + row, min_val, mask=rm)
        tl.store(out_ptr + 3 * channels + row, max_val, mask=rm)
        tl.store(out_ptr + 4 * channels + row, tl.minimum(low, tl.load(seen_min + row, mask=rm, other=0.0)), mask=rm)
        tl.store(out_ptr + 5 * channels + row, tl.maximum(high, tl.load(seen_max + row, mask=rm, other=0.0)), mask=rm)


def kl_accumulate(hist: tuple, seen: tuple, x: torch.Tensor, axis: int | None) -> tuple[tuple, tuple]:
    """``families.calibration.kl_accumulate`` (no collective) of a non-empty float32 ``x`` (per tensor, or per
    channel along the normalised ``axis``) into the accumulator ``(hist, seen)`` (``CalibHistogram`` fields:
    int64 counts ``(..., bins)``, float32 ``lo, width, min_val, max_val``; ``seen``: float32 ``(min, max)``) in
    two kernels: ``(counts, lo, width, min_val, max_val), (seen_min, seen_max)`` as new tensors."""
    old_counts = hist[0]
    bins = old_counts.shape[-1]
    rows = _channel_rows(x, axis)
    channels, n = rows.shape
    if rows.device.type == "cpu":  # the interpreter runs programs one after another: rows at once, whole rows
        block = rblock = min(triton.next_power_of_2(max(n, bins)), _CPU_BLOCK)
        rows_per = max(1, min(triton.next_power_of_2(channels), (4 * _CPU_BLOCK) // block))
        per_row = 1
    else:
        block, rows_per = _GPU_BLOCK, 1
        per_row = max(1, min(max(triton.cdiv(n, block), triton.cdiv(bins, block)), max(1, _MAX_PROGRAMS // channels)))
        rblock = min(block, triton.next_power_of_2(triton.cdiv(bins, per_row)))
    iters = triton.cdiv(triton.cdiv(n, per_row), block)
    hiters = triton.cdiv(triton.cdiv(bins, per_row), block)
    riters = triton.cdiv(triton.cdiv(bins, per_row), rblock)
    device = x.device
    parts = torch.empty(2 * channels * per_row, dtype=torch.float32, device=device)
    counts = torch.empty((channels, bins), dtype=torch.int64, device=device)
    out = torch.empty((6, channels), dtype=torch.float32, device=device)  # lo, width, min, max, seen min, max
    state = [a.reshape(-1).contiguous() for a in (*hist[1:], *seen)]  # lo, width, min_val, max_val, seen min, max
    launch(_rows_range_kernel, (channels, per_row), rows, n, parts, counts, bins, per_row, iters, hiters, BLOCK=block)
    launch(_kl_accumulate_kernel, (triton.cdiv(channels, rows_per), per_row), rows, n, parts,
           old_counts.reshape(channels, bins).contiguous(), *state, counts, channels, bins, float(bins), per_row, iters,
           riters, out, ROWS=rows_per, PBLOCK=triton.next_power_of_2(per_row), BLOCK=block, RBLOCK=rblock,
           NSTEPS=max(1, math.ceil(math.log2(bins + 2))))
    lead = () if axis is None else (channels,)
    new_hist = (counts.reshape(lead + (bins,)),) + tuple(out[k].reshape(lead) for k in range(4))
    return new_hist, (out[4].reshape(lead), out[5].reshape(lead))


# ======================================================================================================
# MSE and Mix searches (MSEObserver, MixObserver): the MSE search over the histogram of |x| in three
# kernels, Mix's candidate errors in one pass over x and its pick in one more
# ======================================================================================================


@triton.jit
def _mse_edge(startf, width, b):
    """Edge ``b`` (int) of the histogram grid as ``calib_histogram_edges`` computes it: ``(lo / width + b) * width``
    in float32, returned as float64 (``_prepare``'s work dtype)."""
    return ((startf + b.to(tl.float32)) * width).to(tl.float64)


@triton.jit
def _mse_scale(startf, width, k, start, stride, mode, d1, d2, d3, eps):
    """The scale of candidate ``k`` (bin ``start + k * stride``): ``calculate_qparams(0, amax)`` in float64 of
    its bin center ``amax = (e_b + e_{b+1}) / 2`` (``mode`` 0: ``max(max(amax, 0) / divisor, eps)``, symmetric
    and affine; 1: ``amax / divisor``, 1 unless above ``eps``, float qparams; 1 where ``amax < 0``);
    ``divisor = (d1 + d2) + d3`` exactly."""
    b = start + k * stride
    amax = (_mse_edge(startf, width, b) + _mse_edge(startf, width, b + 1)) / 2.0
    divisor = (tl.cast(d1, tl.float64) + tl.cast(d2, tl.float64)) + tl.cast(d3, tl.float64)
    eps64 = tl.cast(eps, tl.float64)
    s0 = tl.maximum(amax, 0.0) / divisor
    s0 = tl.where(s0 >= eps64, s0, eps64)
    s1 = amax / divisor
    s1 = tl.where(s1 > eps64, s1, 1.0)
    s = tl.where(mode == 0, s0, s1)
    return tl.where(amax < 0.0, 1.0, s)


@triton.jit
def _pow2_at_least64(v):
    """The smallest power of two ``>= v`` (float64, normal ``v > 0``), exactly."""
    bits = v.to(tl.int64, bitcast=True)
    up = ((bits >> 52) + 1) << 52
    return tl.where((bits & 0xFFFFFFFFFFFFF) == 0, v, up.to(tl.float64, bitcast=True))


@triton.jit
def _mse_prepare_kernel(counts_ptr, lo_ptr, width_ptr, bins, binsf, K, start, stride, mode, d1, d2, d3, eps,
                        p0_ptr, p1_ptr, consts_ptr, BLOCK: tl.constexpr, KBLOCK: tl.constexpr):
    """Program ``row``: the inputs of the level sums (``_calibration._squared_error_by_levels``): the prefix
    sums ``P0``/``P1`` of ``h`` and ``h j`` (int64, exact), and ``S0, S1, S2, unit, w, o`` (float64) with
    ``w = max((e_B - e_0) / B, max_k s_k * 2**-40)``, ``o = e_0 / w + 1/2``, ``unit = (w / norm)**2`` and
    ``norm`` the smallest power of two ``>= max |e|`` (1 for 0; ``_calibration.error_norm``)."""
    row = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK)
    carry0 = tl.zeros([], tl.int64)
    carry1 = tl.zeros([], tl.int64)
    s2 = tl.zeros([], tl.int64)
    base = row * (bins + 1)
    tl.store(p0_ptr + base, carry0)
    tl.store(p1_ptr + base, carry1)
    for j0 in range(0, bins, BLOCK):
        j = j0 + r
        m = j < bins
        h = tl.load(counts_ptr + row * bins + j, mask=m, other=0)
        hj = h * j
        tl.store(p0_ptr + base + j + 1, tl.cumsum(h, axis=0) + carry0, mask=m)
        tl.store(p1_ptr + base + j + 1, tl.cumsum(hj, axis=0) + carry1, mask=m)
        carry0 += tl.sum(h, axis=0)
        carry1 += tl.sum(hj, axis=0)
        s2 += tl.sum(hj * j, axis=0)
    width = tl.load(width_ptr + row)
    startf = tl.div_rn(tl.load(lo_ptr + row), tl.where(width > 0.0, width, 1.0))
    top = tl.full([], -float("inf"), tl.float64)
    kr = tl.arange(0, KBLOCK)
    for k0 in range(0, K, KBLOCK):
        k = k0 + kr
        s = _mse_scale(startf, width, k, start, stride, mode, d1, d2, d3, eps)
        top = tl.maximum(top, tl.max(tl.where(k < K, s, -float("inf")), axis=0))
    e0 = _mse_edge(startf, width, tl.zeros([], tl.int32))
    eb = _mse_edge(startf, width, tl.zeros([], tl.int32) + bins)
    w = (eb - e0) / tl.cast(binsf, tl.float64)
    floor_w = top * 9.094947017729282e-13  # 2**-40
    w = tl.where(w >= floor_w, w, floor_w)
    norm = tl.maximum(tl.abs(e0), tl.abs(eb))  # (the edges are monotone)
    norm = tl.where((norm > 0.0) & (norm < float("inf")), norm, 1.0)
    norm = tl.minimum(_pow2_at_least64(norm), 4.49423283715579e307)  # 2**1022
    unit = w / norm
    out = consts_ptr + row * 6
    tl.store(out, carry0.to(tl.float64))
    tl.store(out + 1, carry1.to(tl.float64))
    tl.store(out + 2, s2.to(tl.float64))
    tl.store(out + 3, unit * unit)
    tl.store(out + 4, w)
    tl.store(out + 5, e0 / w + 0.5)


@triton.jit
def _mse_errors_kernel(p0_ptr, p1_ptr, consts_ptr, lo_ptr, width_ptr, bins, binsf, K, start, stride, mode, d1, d2,
                       d3, eps, levels, err_ptr, bound_ptr, KBLOCK: tl.constexpr, LBLOCK: tl.constexpr):
    """Program ``(row, block)``: the level sums of its ``KBLOCK`` candidates, as ``_squared_error_by_levels``
    (float64, its operations in its order): ``n_m = clip(ceil((m - 1/2) r - o), 0, B)``, ``Y0 = sum P0[n_m]``,
    ``Y1 = sum (2m - 1) P0[n_m]``, ``X1 = sum P1[n_m]`` (int64: exact, as the array code's sums of integers),
    the error ``max(S2 - 2u S1 + u**2 S0 + 2r X1 - r**2 Y1 + 2r o Y0, 0) * unit`` and its rounding bound."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1) * KBLOCK + tl.arange(0, KBLOCK)
    km = k < K
    c = consts_ptr + row * 6
    s0 = tl.load(c)
    s1 = tl.load(c + 1)
    s2 = tl.load(c + 2)
    unit = tl.load(c + 3)
    w = tl.load(c + 4)
    off = tl.load(c + 5)
    width = tl.load(width_ptr + row)
    startf = tl.div_rn(tl.load(lo_ptr + row), tl.where(width > 0.0, width, 1.0))
    rk = _mse_scale(startf, width, tl.minimum(k, K - 1), start, stride, mode, d1, d2, d3, eps) / w
    y0 = tl.zeros([KBLOCK], tl.int64)
    y1 = tl.zeros([KBLOCK], tl.int64)
    x1 = tl.zeros([KBLOCK], tl.int64)
    base = row * (bins + 1)
    for m0 in range(1, levels, LBLOCK):
        m = m0 + tl.arange(0, LBLOCK)
        # m beyond the levels: (m - 1/2) = -inf, so n = 0 and P0[0] = P1[0] = 0 add nothing (rk > 0); n stays
        # in [0, B], so the loads need no mask (candidates beyond K are not stored)
        half = tl.where(m < levels, m.to(tl.float64) - 0.5, -float("inf"))
        n = tl.ceil(half[None, :] * rk[:, None] - off)
        n = tl.minimum(tl.maximum(n, 0.0), tl.cast(binsf, tl.float64)).to(tl.int64)
        g0 = tl.load(p0_ptr + base + n)
        y0 += tl.sum(g0, axis=1)
        y1 += tl.sum((2 * m - 1).to(tl.int64)[None, :] * g0, axis=1)
        x1 += tl.sum(tl.load(p1_ptr + base + n), axis=1)
    u = tl.cast(levels - 1, tl.float64) * rk - off
    t1 = 2.0 * u * s1
    t2 = u * u * s0
    t3 = 2.0 * rk * x1.to(tl.float64)
    t4 = rk * rk * y1.to(tl.float64)
    t5 = 2.0 * rk * off * y0.to(tl.float64)
    e = s2 - t1 + t2 + t3 - t4 + t5
    e = tl.where((e >= 0.0) | (e != e), e, 0.0)  # torch.clamp(e, 0): NaN and -0.0 kept
    bound = 3.552713678800501e-15 * (tl.abs(s2) + tl.abs(t1) + tl.abs(t2) + tl.abs(t3) + tl.abs(t4) + tl.abs(t5))
    tl.store(err_ptr + row * K + k, e * unit, mask=km)
    tl.store(bound_ptr + row * K + k, bound * unit, mask=km)


@triton.jit
def _mse_pick_kernel(err_ptr, bound_ptr, lo_ptr, width_ptr, K, start, stride, amax_out, KBLOCK: tl.constexpr):
    """Program ``row``: ``_calibration._pick`` (ties "first") of the errors with the slack ``2**-40 * best +
    2 * max(bound)``, then the picked bin's center ``(e_b + e_{b+1}) / 2`` in float32 (``midpoint``)."""
    row = tl.program_id(0).to(tl.int64)
    kr = tl.arange(0, KBLOCK)
    best = tl.full([], float("inf"), tl.float64)
    nan = tl.zeros([], tl.int32)
    top = tl.full([], -float("inf"), tl.float64)
    for k0 in range(0, K, KBLOCK):
        k = k0 + kr
        km = k < K
        e = tl.load(err_ptr + row * K + k, mask=km, other=float("inf"))
        best = tl.minimum(best, tl.min(e, axis=0))
        nan = tl.maximum(nan, tl.max((e != e).to(tl.int32), axis=0))
        top = tl.maximum(top, tl.max(tl.load(bound_ptr + row * K + k, mask=km, other=-float("inf")), axis=0))
    best = tl.where(nan > 0, float("nan"), best)  # torch.min: NaN wins (then nothing is near: the first)
    limit = best + (9.094947017729282e-13 * best + 2.0 * top)  # tol 2**-40
    pick = tl.zeros([], tl.int32) + K
    for k0 in range(0, K, KBLOCK):
        k = k0 + kr
        km = k < K
        near = km & (tl.load(err_ptr + row * K + k, mask=km, other=float("inf")) <= limit)
        pick = tl.minimum(pick, tl.min(tl.where(near, k, K), axis=0))
    pick = tl.where(pick == K, 0, pick)
    width = tl.load(width_ptr + row)
    startf = tl.div_rn(tl.load(lo_ptr + row), tl.where(width > 0.0, width, 1.0))
    b = start + pick * stride
    u = (startf + b.to(tl.float32)) * width
    v = (startf + (b + 1).to(tl.float32)) * width
    mean = tl.div_rn(u + v, 2.0)
    half_sum = tl.div_rn(u, 2.0) + tl.div_rn(v, 2.0)
    tl.store(amax_out + row, tl.where((tl.abs(mean) == float("inf")) & _finite(u) & _finite(v), half_sum, mean))


def mse_applies(bins: int, levels: int, divisor: float) -> bool:
    """Whether :func:`mse_amax` computes the array code's search: the level sums (``levels <= bins``) and a
    divisor that three float32 numbers hold exactly."""
    try:
        float32_parts(divisor)
    except ValueError:
        return False
    return 1 < levels <= bins


def mse_amax(counts: torch.Tensor, lo: torch.Tensor, width: torch.Tensor, *, start: int, stride: int, levels: int,
             mode: int, divisor: float, eps: float) -> torch.Tensor:
    """``_calibration.mse_threshold`` of a histogram of ``|x|`` (int64 counts ``(..., bins)`` on the grid
    ``(lo, width)``, float32) with the candidates ``start, start + stride, ... < bins``, ``levels`` quantized
    levels (:func:`mse_applies`), the scales' ``mode`` (0: ``max(amax / divisor, eps)``; 1: float qparams)
    and float32 ``eps``: three kernels (prefix sums, the candidates' level sums, the pick), float32 ``amax``
    of ``lo``'s shape."""
    bins = counts.shape[-1]
    rows = counts.reshape(-1, bins).contiguous()
    channels = rows.shape[0]
    count = len(range(start, bins, stride))
    device = counts.device
    lo_rows, width_rows = lo.reshape(-1).contiguous(), width.reshape(-1).contiguous()
    p0 = torch.empty((channels, bins + 1), dtype=torch.int64, device=device)
    p1 = torch.empty((channels, bins + 1), dtype=torch.int64, device=device)
    consts = torch.empty((channels, 6), dtype=torch.float64, device=device)
    err = torch.empty((channels, count), dtype=torch.float64, device=device)
    bound = torch.empty((channels, count), dtype=torch.float64, device=device)
    amax = torch.empty(lo.shape, dtype=torch.float32, device=device)
    cpu = device.type == "cpu"
    kblock = min(triton.next_power_of_2(count), 2048 if cpu else 32)
    lblock = min(triton.next_power_of_2(max(levels - 1, 1)), 128)
    scale_args = (count, start, stride, mode, *float32_parts(divisor), float(eps))
    launch(_mse_prepare_kernel, (channels,), rows, lo_rows, width_rows, bins, float(bins), *scale_args, p0, p1, consts,
           BLOCK=min(triton.next_power_of_2(bins), 4096), KBLOCK=min(triton.next_power_of_2(count), 1024))
    launch(_mse_errors_kernel, (channels, triton.cdiv(count, kblock)), p0, p1, consts, lo_rows, width_rows, bins,
           float(bins), *scale_args, levels, err, bound, KBLOCK=kblock, LBLOCK=lblock)
    launch(_mse_pick_kernel, (channels,), err, bound, lo_rows, width_rows, count, start, stride, amax,
           KBLOCK=min(triton.next_power_of_2(count), 1024))
    return amax


@triton.jit
def _tree_sum(v, LOG: tl.constexpr):
    """The sum of the ``2**LOG`` values ``v`` as a fixed tree: adjacent pairs ``v[2i] + v[2i + 1]`` added, level
    by level (each addition a single rounding of two values, the same on a GPU and in the interpreter)."""
    for _ in tl.static_range(LOG):
        a, b = tl.split(tl.reshape(v, [v.shape[0] // 2, 2]))
        v = a + b
    return tl.sum(v, axis=0)


@triton.jit
def _rint64(v):
    """Round half to even (float64; ``torch.round``): ``(|v| + 2**52) - 2**52`` below 2**52, with ``v``'s sign."""
    a = tl.abs(v)
    r = (a + 4503599627370496.0) - 4503599627370496.0
    r = tl.where(v < 0.0, -r, r)
    return tl.where(a < 4503599627370496.0, r, v)


@triton.jit
def _rint32(v):
    """Round half to even (float32)."""
    a = tl.abs(v)
    r = (a + 8388608.0) - 8388608.0
    r = tl.where(v < 0.0, -r, r)
    return tl.where(a < 8388608.0, r, v)


@triton.jit
def _mix_candidate(lo, hi, amax, MODE: tl.constexpr, qmin, qmax, zsym, divisor, eps):
    """A Mix candidate's range and quantizer: ``families.calibration.clip_range(lo, hi, amax)`` and
    ``calculate_qparams`` of it in float32 (``MODE`` 0 symmetric, 1 affine, 2 float qparams; torch divides by
    ``divisor`` as float32): ``(lo_k, hi_k, scale, zero_point as float64)``."""
    seen = lo <= hi
    lo_k = tl.where(seen, _clip_to(lo, amax), lo)
    hi_k = tl.where(seen, _clip_to(hi, amax), hi)
    min_neg = tl.minimum(lo_k, 0.0, propagate_nan=tl.PropagateNan.ALL)
    max_pos = tl.maximum(hi_k, 0.0, propagate_nan=tl.PropagateNan.ALL)
    if MODE == 0:
        max_pos = tl.maximum(-min_neg, max_pos, propagate_nan=tl.PropagateNan.ALL)
        scale = tl.maximum(tl.div_rn(max_pos, divisor), eps, propagate_nan=tl.PropagateNan.ALL)
        zero_point = tl.zeros_like(scale).to(tl.float64) + tl.cast(zsym, tl.float64)
    elif MODE == 1:
        scale = tl.maximum(tl.div_rn(max_pos - min_neg, divisor), eps, propagate_nan=tl.PropagateNan.ALL)
        rounded = _rint32(tl.div_rn(min_neg, scale)).to(tl.int32)
        zero_point = tl.minimum(tl.maximum(qmin - rounded, qmin), qmax).to(tl.float64)
    else:
        scale = tl.div_rn(hi_k - lo_k, divisor)
        scale = tl.where(scale > eps, scale, 1.0)
        zero_point = tl.div_rn(-lo_k, scale).to(tl.float64)
    invalid = lo_k > hi_k
    scale = tl.where(invalid, 1.0, scale)
    zero_point = tl.where(invalid, 0.0, zero_point)
    return lo_k, hi_k, scale, zero_point


@triton.jit
def _mix_block_sum(v, finite, lo, hi, amax, norm, MODE: tl.constexpr, qmin, qmax, zsym, divisor, eps,
                   LOG: tl.constexpr):
    """The tree sum over a block of ``((fq(v) - v) / norm)**2`` (0 where ``v`` is not finite), ``fq`` the
    candidate's :func:`~observers_core.fake_quantize` in float64 (``candidate_errors``' operations)."""
    lo_k, hi_k, scale, zero_point = _mix_candidate(lo, hi, amax, MODE, qmin, qmax, zsym, divisor, eps)
    s = scale.to(tl.float64)
    inv = 1.0 / s
    if MODE == 2:  # a float zero point: added before rounding
        q = _rint64(v * inv + zero_point)
    else:
        q = _rint64(v * inv) + zero_point
    q = tl.minimum(tl.maximum(q, tl.cast(qmin, tl.float64)), tl.cast(qmax, tl.float64))
    d = ((q - zero_point) * s - v) / norm
    return _tree_sum(tl.where(finite, d * d, 0.0), LOG)


@triton.jit
def _mix_errors_kernel(x_ptr, N, lo_ptr, hi_ptr, pct_ptr, kl_ptr, mse_ptr, qmin, qmax, zsym, divisor, eps, part_ptr,
                       count_ptr, NB, MODE: tl.constexpr, BLOCK: tl.constexpr, LOG: tl.constexpr):
    """Program ``(row, block)``: for each Mix candidate (minmax, percentile, kl, mse: the range clipped to
    ``+inf`` and the three ``amax``), the tree sum of the squared fake-quantization errors over the block's
    ``BLOCK`` values of the row (zeros past its end) in units of ``norm`` (``error_norm`` of the row's largest
    finite ``|x|``), into ``part[row, k, block]``; its finite values' count into ``count[row, block]``."""
    row = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    offs = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=m, other=0.0)
    finite = m & _finite(x)
    v = tl.where(finite, x.to(tl.float64), 0.0)
    lo = tl.load(lo_ptr + row)
    hi = tl.load(hi_ptr + row)
    norm = tl.abs(tl.maximum(-lo, hi, propagate_nan=tl.PropagateNan.ALL).to(tl.float64))
    norm = tl.where((norm > 0.0) & (norm < float("inf")), norm, 1.0)
    norm = tl.minimum(_pow2_at_least64(norm), 4.49423283715579e307)  # error_norm (2**1022 cap)
    out = part_ptr + (row * 4) * NB + b
    for k in tl.static_range(4):  # minmax (amax +inf), percentile, kl, mse
        if k == 0:
            amax = float("inf")
        elif k == 1:
            amax = tl.load(pct_ptr + row)
        elif k == 2:
            amax = tl.load(kl_ptr + row)
        else:
            amax = tl.load(mse_ptr + row)
        tl.store(out + k * NB, _mix_block_sum(v, finite, lo, hi, amax, norm, MODE, qmin, qmax, zsym, divisor, eps, LOG))
    tl.store(count_ptr + row * NB + b, tl.sum(finite.to(tl.int64), axis=0))


@triton.jit
def _mix_pick_kernel(part_ptr, count_ptr, NB, lo_ptr, hi_ptr, pct_ptr, kl_ptr, mse_ptr, qmin, qmax, zsym, divisor, eps,
                     lo_out, hi_out, choice_out, errors_out, MODE: tl.constexpr, NBLOCK: tl.constexpr,
                     LOG: tl.constexpr):
    """Program ``row``: the candidates' errors ``E_k = sum / max(count, 1)`` (the blocks' sums added as the
    same tree, zeros past the last block) and the first least one (``argmin``); its range, index and the errors."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, NBLOCK)
    jm = j < NB
    count = tl.sum(tl.load(count_ptr + row * NB + j, mask=jm, other=0), axis=0).to(tl.float64)
    count = tl.where(count > 0.0, count, 1.0)
    base = part_ptr + (row * 4) * NB + j
    best = _tree_sum(tl.load(base, mask=jm, other=0.0), LOG) / count
    tl.store(errors_out + row * 4, best)
    choice = tl.zeros([], tl.int64)
    for k in tl.static_range(1, 4):
        e = _tree_sum(tl.load(base + k * NB, mask=jm, other=0.0), LOG) / count
        tl.store(errors_out + row * 4 + k, e)
        better = (e < best) | ((e != e) & (best == best))  # torch.argmin: the first least, NaN first
        best = tl.where(better, e, best)
        choice = tl.where(better, k, choice)
    lo = tl.load(lo_ptr + row)
    hi = tl.load(hi_ptr + row)
    amax = tl.where(choice == 1, tl.load(pct_ptr + row), float("inf"))
    amax = tl.where(choice == 2, tl.load(kl_ptr + row), amax)
    amax = tl.where(choice == 3, tl.load(mse_ptr + row), amax)
    lo_k, hi_k, scale, zero_point = _mix_candidate(lo, hi, amax, MODE, qmin, qmax, zsym, divisor, eps)
    tl.store(lo_out + row, lo_k)
    tl.store(hi_out + row, hi_k)
    tl.store(choice_out + row, choice)


def mix_pick(x: torch.Tensor, axis: int | None, lo: torch.Tensor, hi: torch.Tensor, amax: tuple, *, mode: int,
             quant_min: int, quant_max: int, zero_point: int, divisor: float, eps: float
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``families.calibration.mix_range`` of a non-empty float32 ``x`` (per tensor, or per channel along the
    normalised ``axis``) with its finite range ``(lo, hi)`` and the percentile, KL and MSE ``amax``: the
    candidates' errors (``candidate_errors`` on the torch CUDA path: float64 terms added as a fixed tree) in
    one pass over ``x`` and the pick in a second kernel. ``mode``: 0 symmetric, 1 affine, 2 float qparams;
    ``divisor``: the qparams' ``Q_max - Q_min`` (halved when symmetric). ``(lo, hi, choice, errors)`` as new tensors
    (``errors``: the candidates' ``E_k``, float64, shape ``lo.shape + (4,)``)."""
    rows = _channel_rows(x, axis)
    channels, n = rows.shape
    cap = 4096  # blocks per row (the pick adds them in one program)
    block = max(16, min(triton.next_power_of_2(n), _block(rows)), triton.next_power_of_2(triton.cdiv(n, cap)))
    nb = triton.cdiv(n, block)
    nblock = max(2, triton.next_power_of_2(nb))
    device = x.device
    parts = torch.empty((channels, 4, nb), dtype=torch.float64, device=device)
    counts = torch.empty((channels, nb), dtype=torch.int64, device=device)
    lo_out = torch.empty(lo.shape, dtype=torch.float32, device=device)
    hi_out = torch.empty(lo.shape, dtype=torch.float32, device=device)
    choice = torch.empty(lo.shape, dtype=torch.int64, device=device)
    errors = torch.empty(tuple(lo.shape) + (4,), dtype=torch.float64, device=device)
    flat = [a.reshape(-1).to(torch.float32).contiguous() for a in (lo, hi, *amax)]
    qargs = (quant_min, quant_max, zero_point, float(divisor), float(eps))
    launch(_mix_errors_kernel, (channels, nb), rows, n, *flat, *qargs, parts, counts, nb, MODE=mode, BLOCK=block,
           LOG=int(math.log2(block)))
    launch(_mix_pick_kernel, (channels,), parts, counts, nb, *flat, *qargs, lo_out, hi_out, choice, errors, MODE=mode,
           NBLOCK=nblock, LOG=int(math.log2(nblock)))
    return lo_out, hi_out, choice, errors
