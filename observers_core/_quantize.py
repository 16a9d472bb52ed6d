"""Affine quantize-dequantize (fake quantization), to measure the error of a choice of qparams."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._namespace import array_namespace, device_of, check_real, normalize_axis, rounded, size, work_dtype

__all__ = ["fake_quantize"]

Array = Any


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
    float16/bfloat16/float64 inputs in float32). NaN stays NaN.
    """
    xp = array_namespace(x, xp=xp)
    check_real(x, xp)
    for name, value in (("quant_min", quant_min), ("quant_max", quant_max)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if quant_min > quant_max:
        raise ValueError(f"quant_min={quant_min} must be <= quant_max={quant_max}")
    if not xp.isdtype(x.dtype, "real floating"):
        x = xp.astype(x, xp.float32)
    scale = xp.astype(xp.asarray(scale, device=device_of(x)), x.dtype)
    zero_point = xp.asarray(zero_point, device=device_of(x))
    float_zero_point = xp.isdtype(zero_point.dtype, "real floating")
    zero_point = xp.astype(zero_point, x.dtype)
    if axis is not None:
        axis = normalize_axis(axis, x.ndim)
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        for name, value in (("scale", scale), ("zero_point", zero_point)):
            if size(value) != x.shape[axis]:
                raise ValueError(f"{name} must hold one value per channel along axis={axis} ({x.shape[axis]}), "
                                 f"got shape {tuple(value.shape)}")
        scale = xp.reshape(scale, tuple(shape))
        zero_point = xp.reshape(zero_point, tuple(shape))
    if not float_zero_point:
        q = xp.clip(xp.round(x * (1 / scale)) + zero_point, float(quant_min), float(quant_max))
        return (q - zero_point) * scale
    q = xp.clip(xp.round(rounded(x * (1 / scale), xp) + zero_point), float(quant_min), float(quant_max))
    wide = work_dtype(xp, device_of(x))  # (q - z) * s rounded once, as torch's kernel (exact in float64)
    return xp.astype((xp.astype(q, wide) - xp.astype(zero_point, wide)) * xp.astype(scale, wide), x.dtype)
