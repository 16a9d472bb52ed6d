"""Affine quantize-dequantize (fake quantization), to measure the error of a choice of qparams."""

from __future__ import annotations

from typing import Any

from ._namespace import array_namespace, device_of, check_real, normalize_axis

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
    """``(clamp(round(x * (1 / s)) + z, Q_min, Q_max) - z) * s``, as ``torch.fake_quantize_per_*_affine``.

    ``scale``/``zero_point`` are scalars or shape-(1,) (per tensor), or shape ``(x.shape[axis],)`` per
    channel along ``axis``; any shape that broadcasts against ``x`` is accepted when ``axis`` is None.
    Rounding is half to even; the arithmetic runs in ``x``'s floating dtype. NaN stays NaN.
    """
    xp = array_namespace(x, xp=xp)
    check_real(x, xp)
    if quant_min > quant_max:
        raise ValueError(f"quant_min={quant_min} must be <= quant_max={quant_max}")
    if not xp.isdtype(x.dtype, "real floating"):
        x = xp.astype(x, xp.float32)
    scale = xp.astype(xp.asarray(scale, device=device_of(x)), x.dtype)
    zero_point = xp.astype(xp.asarray(zero_point, device=device_of(x)), x.dtype)
    if axis is not None:
        axis = normalize_axis(axis, x.ndim)
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        scale = xp.reshape(scale, tuple(shape))
        zero_point = xp.reshape(zero_point, tuple(shape))
    q = xp.round(x * (1 / scale)) + zero_point
    q = xp.clip(q, float(quant_min), float(quant_max))
    return (q - zero_point) * scale
