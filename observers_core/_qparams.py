"""Scale and zero point from min/max, bit-for-bit as torch's ``_calculate_qparams`` (torch 2.13)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ._dtypes import QScheme, QuantSpec
from ._namespace import array_namespace, check_real, device_of, discarded_invalid, divide_by_constant, index_dtype, scalar_like

__all__ = ["QParams", "UNINITIALIZED_WARNING", "calculate_qparams"]

Array = Any


#: torch.ao's warning when qparams are asked of an observer that has seen nothing (every family's adapters).
UNINITIALIZED_WARNING = "must run observer before calling calculate_qparams. Returning default values."


class QParams(NamedTuple):
    """Quantization parameters: ``x_q = clamp(round(x / scale) + zero_point, quant_min, quant_max)``."""

    scale: Array
    zero_point: Array


def calculate_qparams(min_val: Array, max_val: Array, /, spec: QuantSpec, *, xp: Any = None) -> QParams:
    """Scale and zero point for the range ``[min_val, max_val]`` (0-d per tensor, or one per channel).

    Arithmetic is in the range's floating dtype (float32 for integer ranges) with the same operation order
    as torch, so results are bit-for-bit equal, also for the float16/bfloat16/float64 buffers of a torch
    observer converted by ``.half()``/``.bfloat16()``/``.double()``:

    - affine: ``s = max((max(x_max, 0) - min(x_min, 0)) / float(Q_max - Q_min), eps)``,
      ``z = clamp(Q_min - int32(round(min(x_min, 0) / s)), Q_min, Q_max)`` (int32);
    - symmetric: ``s = max(max(-min(x_min, 0), max(x_max, 0)) / (float(Q_max - Q_min) / 2), eps)``,
      ``z = spec.symmetric_zero_point`` (int64);
    - float qparams: ``s = where(s' > eps, s', 1)`` with ``s' = (x_max - x_min) / float(Q_max - Q_min)``,
      ``z = -x_min / s`` (the range's dtype).

    ``eps`` is rounded to float32 (torch's ``eps`` buffer), then cast to the range's dtype, as that buffer is
    by ``.half()``/``.double()``: an ``eps`` below that dtype's smallest subnormal (float16: ``6e-8``)
    becomes 0 there, so a zero float16 range then gets scale 0, as in torch. Integer ranges are cast to
    float32 first (torch would subtract and negate them in their integer dtype, which wraps for int8's
    ``-(-128)``; its observers never hold integer ranges).

    Entries whose range is invalid (``min_val > max_val``, which includes a never-updated state of
    ``+inf``/``-inf``) get torch's fallback ``s = 1``, ``z = 0``; torch raises for ``min > max`` on an
    updated state, a data-dependent check that the adapters make outside of the core.
    Per-tensor (0-d) inputs give shape-(1,) results, as in torch. A NaN or infinite range gives a NaN or
    infinite scale, silently on every framework (NumPy's floating-point warnings are off here).
    """
    if not isinstance(spec, QuantSpec):
        raise TypeError(f"spec must be a QuantSpec (see observers_core.quant_spec), got {type(spec).__name__}")
    xp = array_namespace(min_val, max_val, xp=xp)
    check_real(min_val, xp, name="min_val")
    check_real(max_val, xp, name="max_val")
    with discarded_invalid(xp, over="ignore", divide="ignore"):
        return _calculate_qparams(min_val, max_val, spec, xp)


def _calculate_qparams(min_val: Array, max_val: Array, spec: QuantSpec, xp: Any) -> QParams:
    if not xp.isdtype(min_val.dtype, "real floating"):
        min_val, max_val = xp.astype(min_val, xp.float32), xp.astype(max_val, xp.float32)
    dtype = min_val.dtype
    # eps as torch's float32 eps buffer, in the range's dtype (the buffer converts with the module's others)
    eps = scalar_like(float(np.float32(spec.eps)), min_val, xp)
    zero = xp.zeros((), dtype=dtype, device=device_of(min_val))
    min_val_neg = xp.minimum(min_val, zero)
    max_val_pos = xp.maximum(max_val, zero)
    qrange = float(spec.quant_max - spec.quant_min)

    if spec.qscheme.is_symmetric:
        max_val_pos = xp.maximum(-min_val_neg, max_val_pos)
        scale = xp.maximum(divide_by_constant(max_val_pos, qrange / 2, xp), eps)
        zero_point = xp.full(min_val.shape, spec.symmetric_zero_point, dtype=index_dtype(xp), device=device_of(min_val))
    elif spec.qscheme is QScheme.PER_CHANNEL_AFFINE_FLOAT_QPARAMS:
        scale = divide_by_constant(max_val - min_val, qrange, xp)
        scale = xp.where(scale > eps, scale, xp.ones_like(scale))
        zero_point = -1 * min_val / scale
    else:
        scale = xp.maximum(divide_by_constant(max_val_pos - min_val_neg, qrange, xp), eps)
        rounded = xp.astype(xp.round(min_val_neg / scale), xp.int32)
        zero_point = xp.clip(spec.quant_min - rounded, spec.quant_min, spec.quant_max)
        zero_point = xp.astype(zero_point, xp.int32)

    invalid = min_val > max_val
    scale = xp.where(invalid, xp.ones_like(scale), scale)
    zero_point = xp.where(invalid, xp.zeros_like(zero_point), zero_point)
    if scale.ndim == 0:
        scale = xp.reshape(scale, (1,))
    if zero_point.ndim == 0:
        zero_point = xp.reshape(zero_point, (1,))
    return QParams(scale, zero_point)
