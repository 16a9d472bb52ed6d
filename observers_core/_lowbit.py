"""Fine-grained and low-bit formats: per-group integers, fp8 scaling, MX and BFP (as in AMD Quark).

Granularity follows one convention in every function here:

- ``axis=None``: per tensor;
- ``axis=a`` and no ``group_size``: per channel, one entry per index of axis ``a`` (torch's convention);
- ``axis=a`` and ``group_size=g``: per group, axis ``a`` split into consecutive groups of ``g``
  (``g=-1``: one group spanning the axis); results have ``x.shape`` with axis ``a`` replaced by the
  number of groups, so ``(R, C)`` weights grouped along ``axis=-1`` give ``(R, C // g)``, as torchao's
  ``choose_qparams_affine(block_size=(1, g))`` does.

MX and BFP are always per block along ``axis`` (default -1); their last partial block is zero-padded.
:class:`LowBitSpec` bundles a configuration (hashable, so a static ``jax.jit`` argument) and
``lowbit_stats`` / ``lowbit_qparams`` / ``lowbit_fake_quantize`` dispatch on it; statistics are a
:class:`~observers_core.MinMaxState` of per-group arrays, so ``minmax_merge`` combines batches (static
mode) and a fresh ``lowbit_stats`` is the dynamic mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._dtypes import FLOAT32_EPS
from ._minmax import MinMaxState, aminmax
from ._mx import (
    MX_ELEMENTS,
    MX_ROUNDINGS,
    BlockScale,
    ElementFormat,
    bfp_fake_quantize,
    bfp_scale,
    block_aminmax,
    blocked_aminmax,
    check_block_size,
    check_rounding,
    check_same_shape,
    compute_dtype,
    e8m0_to_float,
    from_blocks,
    mx_fake_quantize,
    mx_scale,
    round_to_element,
    to_blocks,
)
from ._namespace import (
    along_axis, array_namespace, check_broadcasts, check_real, device_of, discarded_invalid, divide_by_constant,
    normalize_axis, scalar_like,
)
from ._qparams import QParams
from ._quantize import checked_real, fake_quantize
from ._validate import check_bool

__all__ = [
    "BFP_DTYPES",
    "FP8_MAX",
    "GRANULARITIES",
    "INT_RANGES",
    "LOWBIT_DTYPES",
    "MX_DTYPES",
    "MX_ELEMENTS",
    "MX_ROUNDINGS",
    "BlockScale",
    "ElementFormat",
    "LowBitSpec",
    "bfp_fake_quantize",
    "bfp_scale",
    "block_aminmax",
    "e8m0_to_float",
    "fp8_fake_quantize",
    "fp8_scale",
    "group_aminmax",
    "group_fake_quantize",
    "group_qparams",
    "lowbit_fake_quantize",
    "lowbit_qparams",
    "lowbit_spec",
    "lowbit_stats",
    "mx_fake_quantize",
    "mx_scale",
]

Array = Any

#: Integer ranges ``(Q_min, Q_max)`` (Quark's ``calculate_qmin_qmax``, torchao's bounds).
INT_RANGES: dict[str, tuple[int, int]] = {
    "int2": (-2, 1),
    "int3": (-4, 3),
    "int4": (-8, 7),
    "uint4": (0, 15),
    "int8": (-128, 127),
    "uint8": (0, 255),
}
#: Largest finite value of the fp8 scaling dtypes.
FP8_MAX: dict[str, float] = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
_FP8_ELEMENT = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
#: MX dtype names (OCP MX v1.0 section 5.2) -> element type.
MX_DTYPES: dict[str, str] = {
    "mxfp8_e4m3": "fp8_e4m3",
    "mxfp8_e5m2": "fp8_e5m2",
    "mxfp6_e3m2": "fp6_e3m2",
    "mxfp6_e2m3": "fp6_e2m3",
    "mxfp4": "fp4_e2m1",
    "mxint8": "int8",
}
BFP_DTYPES = ("bfp16",)
LOWBIT_DTYPES = tuple(INT_RANGES) + tuple(FP8_MAX) + tuple(MX_DTYPES) + BFP_DTYPES
GRANULARITIES = ("per_tensor", "per_channel", "per_group", "per_block")


def _int_range(dtype: str) -> tuple[int, int]:
    if dtype not in INT_RANGES:
        raise ValueError(f"dtype={dtype!r} is not an integer low-bit dtype; allowed: {', '.join(INT_RANGES)}")
    return INT_RANGES[dtype]


def _fp8_format(dtype: str) -> tuple[float, ElementFormat]:
    key = dtype.removeprefix("torch.") if isinstance(dtype, str) else dtype
    if key not in FP8_MAX:
        raise ValueError(f"dtype={dtype!r} is not an fp8 scaling dtype; allowed: {', '.join(FP8_MAX)}")
    return FP8_MAX[key], MX_ELEMENTS[_FP8_ELEMENT[key]]


# --------------------------------------------------------------------------------- granularity


def _check_granularity(axis: int | None, group_size: int | None, ndim: int) -> tuple[int | None, int | None]:
    if axis is None:
        if group_size is not None:
            raise ValueError(f"group_size={group_size} needs an axis to group along; got axis=None")
        return None, None
    axis = normalize_axis(axis, ndim)
    if group_size is not None:
        group_size = check_block_size(group_size, name="group_size", allow_whole=True)
    return axis, group_size


def group_aminmax(
    x: Array, /, *, axis: int = -1, group_size: int = -1, ignore_nonfinite: bool = False, xp: Any = None
) -> tuple[Array, Array]:
    """``(min, max)`` of each group of ``group_size`` consecutive elements along ``axis``.

    ``group_size=-1`` is one group spanning the axis; a length that is not a multiple of ``group_size``
    raises ``ValueError``. Results: ``x.shape`` with ``axis`` replaced by the number of groups, in
    ``x``'s floating dtype (float32 for integers). NaN propagates unless ``ignore_nonfinite``.
    """
    return blocked_aminmax(x, axis, group_size, False, ignore_nonfinite, xp, name="group_size")


def _apply(x: Array, params: tuple[Array, ...], axis: int | None, group_size: int | None, fn: Any, xp: Any) -> Array:
    """``fn(x', *params')`` with each param (``(scale,)`` or ``(scale, zero_point)``) broadcast over its tensor /
    channel / group of ``x``."""
    named = dict(zip(("scale", "zero_point"), params))
    if axis is None:
        check_broadcasts(x.shape, **named)
        return fn(x, *params)
    if group_size is None:
        return fn(x, *along_axis(x.shape, axis, xp, **named))
    xb = to_blocks(x, axis, group_size, xp, pad=False)
    expected = xb.shape[: axis + 1] + xb.shape[axis + 2 :]
    for p in params:
        if tuple(p.shape) != tuple(expected):
            raise ValueError(
                f"qparams have shape {tuple(p.shape)} but x grouped by group_size={group_size} along axis "
                f"{axis} needs {tuple(expected)}"
            )
    y = fn(xb, *(xp.expand_dims(p, axis=axis + 1) for p in params))
    return from_blocks(y, axis, x.shape[axis], xp)


# ------------------------------------------------------------------------------------ integers


def group_qparams(
    min_val: Array,
    max_val: Array,
    /,
    *,
    dtype: str = "int4",
    symmetric: bool = False,
    eps: float = FLOAT32_EPS,
    xp: Any = None,
) -> QParams:
    """Integer scale and zero point for each ``[min_val, max_val]`` (any shape: tensor, channel, group).

    With ``(Q_min, Q_max) = INT_RANGES[dtype]``, ``m = min(x_min, 0)``, ``M = max(x_max, 0)`` (float32
    arithmetic, the operation order of torchao's ``choose_qparams_affine``):

    - asymmetric: ``s = max((M - m) / (Q_max - Q_min), eps)``,
      ``z = clip(Q_min - round(m / s), Q_min, Q_max)``;
    - symmetric: ``s = max(max(-m, M) / ((Q_max - Q_min) / 2), eps)``, ``z = int((Q_max + Q_min + 1) / 2)``
      (0 for signed types, 8 for uint4, 128 for uint8).

    ``eps`` defaults to float32 eps (torch, Quark); torchao's default is the input dtype's smallest
    normal. A range with ``min_val > max_val`` (nothing observed) gives ``s = 1, z = 0`` as in torch;
    a NaN range gives ``s = NaN, z = 0``; an infinite one ``s = inf`` (silently on every framework). ``z`` is int32.
    """
    xp = array_namespace(min_val, max_val, xp=xp)
    check_real(min_val, xp, name="min_val")
    check_real(max_val, xp, name="max_val")
    check_same_shape(min_val, max_val)
    with discarded_invalid(xp, over="ignore", divide="ignore"):  # NaN/inf scales are results, silently
        qmin, qmax = _int_range(dtype)
        dtype_f = compute_dtype(min_val, xp)
        lo, hi = xp.astype(min_val, dtype_f), xp.astype(max_val, dtype_f)
        zero = xp.zeros((), dtype=dtype_f, device=device_of(lo))
        eps_a = scalar_like(float(eps), lo, xp)
        min_neg, max_pos = xp.minimum(lo, zero), xp.maximum(hi, zero)
        if symmetric:
            scale = xp.maximum(divide_by_constant(xp.maximum(-min_neg, max_pos), float(qmax - qmin) / 2, xp), eps_a)
            zero_point = xp.full(scale.shape, int((qmax + qmin + 1) / 2), dtype=xp.int32, device=device_of(lo))
        else:
            scale = xp.maximum(divide_by_constant(max_pos - min_neg, float(qmax - qmin), xp), eps_a)
            shift = xp.round(min_neg / scale)
            shift = xp.where(xp.isfinite(shift), shift, xp.zeros_like(shift))
            zero_point = xp.astype(xp.clip(qmin - shift, float(qmin), float(qmax)), xp.int32)
        invalid = lo > hi
        scale = xp.where(invalid, xp.ones_like(scale), scale)
        zero_point = xp.where(invalid | xp.isnan(scale), xp.zeros_like(zero_point), zero_point)
    return QParams(scale, zero_point)


def group_fake_quantize(
    x: Array,
    scale: Array,
    zero_point: Array,
    /,
    *,
    dtype: str = "int4",
    axis: int | None = None,
    group_size: int | None = None,
    xp: Any = None,
) -> Array:
    """``(clip(round(x / s) + z, Q_min, Q_max) - z) * s`` with ``s, z`` per tensor, channel or group
    (see the module docstring), through :func:`observers_core.fake_quantize` (ties to even; computed in
    ``x``'s floating dtype, NumPy's ml_dtypes bfloat16/float8 included)."""
    xp = array_namespace(x, xp=xp)
    checked_real(x, xp)
    qmin, qmax = _int_range(dtype)
    axis, group_size = _check_granularity(axis, group_size, x.ndim)
    scale = xp.asarray(scale, device=device_of(x))
    zero_point = xp.asarray(zero_point, device=device_of(x))

    def fq(v: Array, s: Array, z: Array) -> Array:
        return fake_quantize(v, s, z, quant_min=qmin, quant_max=qmax, xp=xp)

    return _apply(x, (scale, zero_point), axis, group_size, fq, xp)


# ------------------------------------------------------------------------------------------- fp8


def fp8_scale(amax: Array, /, *, dtype: str = "float8_e4m3fn", eps: float = FLOAT32_EPS, xp: Any = None) -> Array:
    """``s = amax / max_fp8`` (448 for float8_e4m3fn, 57344 for float8_e5m2) in float32, per tensor,
    channel or group (any shape). An all-zero range (``s == 0``) gets ``s = eps`` (float32 eps by
    default, Quark's rule), so quantizing zeros gives zeros. NaN ``amax`` gives NaN, +Inf gives +Inf."""
    xp = array_namespace(amax, xp=xp)
    check_real(amax, xp, name="amax")
    fmax, _ = _fp8_format(dtype)
    scale = divide_by_constant(xp.astype(amax, compute_dtype(amax, xp)), fmax, xp)
    return xp.where(scale == 0, scalar_like(float(eps), scale, xp), scale)


def fp8_fake_quantize(
    x: Array,
    scale: Array,
    /,
    *,
    dtype: str = "float8_e4m3fn",
    axis: int | None = None,
    group_size: int | None = None,
    xp: Any = None,
) -> Array:
    """``fp8(clip(x / s, -max_fp8, max_fp8)) * s``, ``fp8`` rounding to nearest (ties to even), as
    ``tensor.to(torch.float8_*)`` after Quark's and torchao's clamp, computed in float32 (float64 stays
    float64). Output dtype: ``x``'s (NumPy's ml_dtypes bfloat16/float8 included; float32 for integers)."""
    xp = array_namespace(x, xp=xp)
    extension = checked_real(x, xp)
    _, fmt = _fp8_format(dtype)
    axis, group_size = _check_granularity(axis, group_size, x.ndim)
    out_dtype = x.dtype if extension or xp.isdtype(x.dtype, "real floating") else xp.float32
    cdt = compute_dtype(x, xp)
    scale = xp.astype(xp.asarray(scale, device=device_of(x)), cdt)

    def fq(v: Array, s: Array) -> Array:
        return round_to_element(v / s, fmt, xp) * s

    # NaN/Inf inputs (inf / inf, 0 * inf): results; for ml_dtypes floats also saturation
    with discarded_invalid(xp, **(dict(over="ignore") if extension else {})):
        y = _apply(xp.astype(x, cdt, copy=False), (scale,), axis, group_size, fq, xp)
    return xp.astype(y, out_dtype, copy=False)


# ------------------------------------------------------------------------------------------ spec


@dataclass(frozen=True)
class LowBitSpec:
    """A validated low-bit configuration (build it with :func:`lowbit_spec`).

    ``dtype``: one of :data:`LOWBIT_DTYPES`; ``granularity``: one of :data:`GRANULARITIES`; ``axis``:
    the channel axis (per channel) or the axis split into groups/blocks; ``group_size``: group or block
    size (-1: the whole axis); ``symmetric``: integer mapping; ``rounding``: MX shared-exponent mode;
    ``eps``: smallest integer / fp8 scale.
    """

    dtype: str
    granularity: str = "per_tensor"
    axis: int | None = None
    group_size: int | None = None
    symmetric: bool = False
    rounding: str | None = None
    eps: float = FLOAT32_EPS

    @property
    def family(self) -> str:
        """``"int"``, ``"fp8"``, ``"mx"`` or ``"bfp"``."""
        if self.dtype in INT_RANGES:
            return "int"
        if self.dtype in FP8_MAX:
            return "fp8"
        return "mx" if self.dtype in MX_DTYPES else "bfp"


def lowbit_spec(
    dtype: str,
    *,
    granularity: str | None = None,
    axis: int | None = None,
    group_size: int | None = None,
    symmetric: bool | None = None,
    rounding: str | None = None,
    eps: float = FLOAT32_EPS,
) -> LowBitSpec:
    """Validate a configuration and fill in defaults.

    Integers and fp8: ``granularity`` defaults to per tensor (no axis), per channel (axis, no
    group_size) or per group (axis and group_size); ``symmetric`` defaults to False for integers and must
    be True (the default) for fp8. MX: per block, ``axis=-1``, ``group_size=32``, ``rounding="floor"``.
    BFP16: per block, ``axis=-1``, ``group_size=8``. Bad values raise ``ValueError`` naming them.
    """
    key = dtype.removeprefix("torch.") if isinstance(dtype, str) else dtype
    if key not in LOWBIT_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not a low-bit dtype; allowed: {', '.join(LOWBIT_DTYPES)}")
    if isinstance(axis, bool) or not (axis is None or isinstance(axis, (int, np.integer))):
        raise TypeError(f"axis must be an int or None, got {type(axis).__name__} {axis!r}")
    axis = None if axis is None else int(axis)
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise TypeError(f"eps must be a float, got {type(eps).__name__} {eps!r}") from None
    if not 0 < eps < float("inf"):
        raise ValueError(f"eps={eps} must be a positive finite float")
    if symmetric is not None and not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"symmetric must be a bool, got {type(symmetric).__name__} {symmetric!r}")
    spec = LowBitSpec(key)
    if spec.family in ("mx", "bfp"):
        if granularity not in (None, "per_block"):
            raise ValueError(f"granularity={granularity!r} is not allowed for dtype={key!r}; allowed: per_block")
        if symmetric is False:
            raise ValueError(f"symmetric=False is not allowed for dtype={key!r} (block formats are symmetric)")
        block = check_block_size((32 if key in MX_DTYPES else 8) if group_size is None else group_size, name="group_size")
        if spec.family == "mx":
            rounding = check_rounding("floor" if rounding is None else rounding)
        elif rounding is not None:
            raise ValueError(f"rounding={rounding!r} is only for MX dtypes; BFP16 has its own rule, pass None")
        return LowBitSpec(key, "per_block", -1 if axis is None else axis, block, True, rounding, eps)
    if rounding is not None:
        raise ValueError(f"rounding={rounding!r} is only for MX dtypes, not dtype={key!r}")
    if granularity is None:
        granularity = "per_tensor" if axis is None else ("per_channel" if group_size is None else "per_group")
    allowed = ("per_tensor", "per_channel", "per_group")
    if granularity not in allowed:
        raise ValueError(f"granularity={granularity!r} is not allowed for dtype={key!r}; allowed: {', '.join(allowed)}")
    if granularity == "per_tensor" and (axis is not None or group_size is not None):
        raise ValueError(f"granularity='per_tensor' takes no axis or group_size, got axis={axis}, group_size={group_size}")
    if granularity in ("per_channel", "per_group") and axis is None:
        raise ValueError(f"granularity={granularity!r} needs an axis")
    if granularity == "per_channel" and group_size is not None:
        raise ValueError(f"granularity='per_channel' takes no group_size, got group_size={group_size}")
    if granularity == "per_group":
        group_size = check_block_size(-1 if group_size is None else group_size, name="group_size", allow_whole=True)
    if spec.family == "fp8":
        if symmetric is False:
            raise ValueError(f"symmetric=False is not allowed for dtype={key!r} (fp8 scaling is symmetric)")
        symmetric = True
    return LowBitSpec(key, granularity, axis, group_size, bool(symmetric), None, eps)


def _spec_grouping(spec: LowBitSpec) -> tuple[int | None, int | None]:
    return spec.axis, (spec.group_size if spec.granularity in ("per_group", "per_block") else None)


def lowbit_stats(x: Array, /, spec: LowBitSpec, *, ignore_nonfinite: bool = False, xp: Any = None) -> MinMaxState:
    """Min/max of ``x`` at the spec's granularity, float32 (float64 stays float64).

    Static calibration merges batches with ``minmax_merge``; dynamic quantization uses one batch's stats.
    BFP16 always skips NaN/Inf (Quark zeroes them before taking the block maximum).
    """
    xp = array_namespace(x, xp=xp)
    check_real(x, xp)
    ignore_nonfinite = check_bool(ignore_nonfinite, "ignore_nonfinite")
    if spec.granularity == "per_block":
        skip = ignore_nonfinite or spec.family == "bfp"
        lo, hi = block_aminmax(x, axis=spec.axis, block_size=spec.group_size, ignore_nonfinite=skip, xp=xp)
    elif spec.granularity == "per_group":
        lo, hi = group_aminmax(x, axis=spec.axis, group_size=spec.group_size, ignore_nonfinite=ignore_nonfinite, xp=xp)
    else:
        lo, hi = aminmax(x, axis=spec.axis, ignore_nonfinite=ignore_nonfinite, xp=xp)
    dtype = compute_dtype(lo, xp)
    return MinMaxState(xp.astype(lo, dtype), xp.astype(hi, dtype))


def lowbit_qparams(state: MinMaxState, /, spec: LowBitSpec, *, xp: Any = None) -> QParams | BlockScale:
    """Quantization parameters from a min/max state: :class:`QParams` (int: :func:`group_qparams`;
    fp8: :func:`fp8_scale` with a zero ``zero_point``) or :class:`BlockScale` (MX: :func:`mx_scale`;
    BFP16: :func:`bfp_scale`). fp8 and MX use ``amax = max(-min_val, max_val)``; an entry that has seen
    nothing (``min_val > max_val``) counts as all zeros there."""
    lo, hi = state
    xp = array_namespace(lo, hi, xp=xp)
    if spec.family == "int":
        return group_qparams(lo, hi, dtype=spec.dtype, symmetric=spec.symmetric, eps=spec.eps, xp=xp)
    if spec.family == "bfp":
        return bfp_scale(lo, hi, xp=xp)
    amax = xp.maximum(-lo, hi)
    amax = xp.where(lo > hi, xp.zeros_like(amax), amax)
    if spec.family == "fp8":
        scale = fp8_scale(amax, dtype=spec.dtype, eps=spec.eps, xp=xp)
        return QParams(scale, xp.zeros(scale.shape, dtype=xp.int32, device=device_of(scale)))
    return mx_scale(amax, element=MX_DTYPES[spec.dtype], rounding=spec.rounding, xp=xp)


def lowbit_fake_quantize(x: Array, qparams: QParams | BlockScale, /, spec: LowBitSpec, *, xp: Any = None) -> Array:
    """Quantize-dequantize ``x`` with ``qparams`` from :func:`lowbit_qparams` for the same spec.

    Output dtype: ``x``'s floating dtype (float32 for integers). The integer formats compute in it
    (:func:`observers_core.fake_quantize`), the others in float32 (float64 stays float64), as torch and
    JAX do; a NumPy array of an ml_dtypes float (bfloat16, float8_*) is computed as theirs and keeps its
    dtype."""
    xp = array_namespace(x, xp=xp)
    axis, group_size = _spec_grouping(spec)
    if spec.family == "int":
        scale, zero_point = qparams
        return group_fake_quantize(x, scale, zero_point, dtype=spec.dtype, axis=axis, group_size=group_size, xp=xp)
    if spec.family == "fp8":
        return fp8_fake_quantize(x, qparams[0], dtype=spec.dtype, axis=axis, group_size=group_size, xp=xp)
    if spec.family == "mx":
        return mx_fake_quantize(
            x, qparams.exponent, element=MX_DTYPES[spec.dtype], axis=spec.axis, block_size=spec.group_size, xp=xp
        )
    return bfp_fake_quantize(x, qparams.exponent, axis=spec.axis, block_size=spec.group_size, xp=xp)

