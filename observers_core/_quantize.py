"""Affine quantize-dequantize (fake quantization), to measure the error of a choice of qparams."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._namespace import (
    along_axis, array_namespace, check_broadcasts, check_real, device_of, discarded_invalid, is_jax_namespace,
    is_numpy_namespace, is_traced, normalize_axis, rounded, work_dtype,
)
from ._state_dict import EXTENSION_FLOATS

__all__ = ["fake_quantize"]

Array = Any


def extension_float(x: Array, xp: Any) -> bool:
    """Whether ``x`` is a NumPy array of an ml_dtypes float (bfloat16, float8_*: :data:`EXTENSION_FLOATS`),
    which NumPy's array-API functions do not count as real floating. The low-bit fake quantization takes
    them as torch and JAX take their bfloat16/float8 arrays: it returns their dtype, and the integer
    formats compute in it (ml_dtypes' operations round each result to the dtype, as torch's and JAX's do)."""
    scalar_type = getattr(x.dtype, "type", None)  # (not ``dtype.name``: computed in Python, ~3 us a call)
    return getattr(scalar_type, "__name__", None) in EXTENSION_FLOATS and is_numpy_namespace(xp)


def checked_real(x: Array, xp: Any) -> bool:
    """``TypeError`` unless ``x`` is real (:func:`check_real`) or a NumPy array of an ml_dtypes float; returns
    whether it is the latter (:func:`extension_float`)."""
    extension = extension_float(x, xp)
    if not extension:
        check_real(x, xp)
    return extension


def _clip(q: Array, lo: float, hi: float, extension: bool, xp: Any) -> Array:
    """``clip(q, lo, hi)``; for ml_dtypes floats (NumPy has no ``clip`` loop for them) ``minimum``/``maximum``
    with the bounds in ``q``'s dtype, as JAX rounds them (NaN stays NaN)."""
    if not extension:
        return xp.clip(q, lo, hi)
    return xp.minimum(xp.maximum(q, xp.asarray(lo, dtype=q.dtype)), xp.asarray(hi, dtype=q.dtype))


def _positive_zero(q: Array, xp: Any) -> Array:
    """``round(v) + z`` with ``-0.0`` as ``0.0`` on JAX, as every other backend computes it (``-0.0 + 0.0`` is
    ``0.0``; the sum is never ``-0.0``): XLA drops the addition (and the subtraction) of a zero point that is
    a compile-time zero, the symmetric signed formats' under ``jit``, so ``round(-0.001 / s) = -0.0`` came
    out as ``-0.0``. One ``where`` under ``jit``, fused into the same elementwise kernel; eager JAX (which adds
    the zero) and other backends: ``q``."""
    if not (is_jax_namespace(xp) and is_traced(q)):
        return q
    return xp.where(q == 0, xp.zeros_like(q), q)


def fake_quantize(
    x: Array,
    scale: Array,
    zero_point: Array,
    /,
    *,
    quant_min: int,
    quant_max: int,
    axis: int | None = None,
    xp: Any = None,
) -> Array:
    """``(clamp(round(x * (1 / s)) + z, Q_min, Q_max) - z) * s``, as ``torch.fake_quantize_per_*_affine``;
    a floating ``zero_point`` (``per_channel_affine_float_qparams``) is added before rounding, as torch's
    per-channel kernel does: ``(clamp(round(x * (1 / s) + z), Q_min, Q_max) - z) * s``, the last product
    rounded once (computed in float64; JAX without x64 rounds ``q - z`` first, at most an ulp off).

    ``scale``/``zero_point`` are scalars or shape-(1,) (per tensor), or shape ``(x.shape[axis],)`` per
    channel along ``axis``; any shape that broadcasts against ``x`` is accepted when ``axis`` is None.
    Rounding is half to even; the arithmetic runs in ``x``'s floating dtype (torch's kernels compute
    float16/bfloat16/float64 inputs in float32), NumPy arrays of ml_dtypes floats (bfloat16, float8_*)
    included: each operation rounded to that dtype, as torch and JAX compute theirs. NaN stays NaN (NumPy
    quietly: NaN and Inf are results here, as on torch and JAX); with an integer zero point the result is
    never ``-0.0`` (``round(v) + z`` is ``0.0``), under ``jax.jit`` too.
    """
    xp = array_namespace(x, xp=xp)
    extension = checked_real(x, xp)
    for name, value in (("quant_min", quant_min), ("quant_max", quant_max)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if quant_min > quant_max:
        raise ValueError(f"quant_min={quant_min} must be <= quant_max={quant_max}")
    if not (extension or xp.isdtype(x.dtype, "real floating")):
        x = xp.astype(x, xp.float32)
    scale = xp.astype(xp.asarray(scale, device=device_of(x)), x.dtype)
    zero_point = xp.asarray(zero_point, device=device_of(x))
    float_zero_point = xp.isdtype(zero_point.dtype, "real floating")
    zero_point = xp.astype(zero_point, x.dtype)
    if axis is not None:
        scale, zero_point = along_axis(x.shape, normalize_axis(axis, x.ndim), xp, scale=scale, zero_point=zero_point)
    else:
        check_broadcasts(x.shape, scale=scale, zero_point=zero_point)
    lo, hi = float(quant_min), float(quant_max)
    # NaN/Inf inputs or scales (inf * 0): results; for ml_dtypes floats also saturation and a scale that
    # underflows the dtype (float8: every-day cases)
    with discarded_invalid(xp, **(dict(over="ignore", divide="ignore") if extension else {})):
        if not float_zero_point:
            q = _clip(_positive_zero(xp.round(x * (1 / scale)) + zero_point, xp), lo, hi, extension, xp)
            return (q - zero_point) * scale
        q = _clip(xp.round(rounded(x * (1 / scale), xp) + zero_point), lo, hi, extension, xp)
        wide = work_dtype(xp, device_of(x))  # (q - z) * s rounded once, as torch's kernel (exact in float64)
        return xp.astype((xp.astype(q, wide) - xp.astype(zero_point, wide)) * xp.astype(scale, wide), x.dtype)
