"""Power-of-two block formats: OCP Microscaling (MX v1.0) and block floating point (BFP16).

Both share one exponent per block of ``block_size`` elements along ``axis`` (the last, partial block is
padded with zeros, which changes no maximum) and store it as an 8-bit biased code
``c = e + 127`` (E8M0: ``X = 2**(c - 127)``, ``c`` in ``0..254``, ``0xFF`` = NaN).

Every power of two here comes from an exact table (``xp.take``), never from ``exp2``/``log2``:
``floor(log2(a))`` is estimated with ``log2`` and then corrected by exact comparisons with the table,
so results are bit-exact on every backend (XLA's ``exp2`` is not exact, and ``log2`` is off by an ulp
near powers of two on some backends). Scaling by ``2**e`` is done as two multiplications by
``2**(e // 2)`` and ``2**(e - e // 2)`` so that no factor is subnormal (XLA on CPU flushes subnormal
operands to zero, which would turn ``x / 2**-127`` into ``x / 0``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ._minmax import reduce_aminmax
from ._quantize import checked_real
from ._validate import check_bool
from ._namespace import (
    array_namespace,
    check_real,
    device_of,
    device_constant,
    divide_by_constant,
    is_cupy_namespace,
    is_jax_namespace,
    is_torch_namespace,
    normalize_axis,
    scalar_like,
)

__all__ = [
    "MX_ELEMENTS",
    "MX_ROUNDINGS",
    "BlockScale",
    "ElementFormat",
    "block_aminmax",
    "mx_scale",
    "mx_fake_quantize",
    "bfp_scale",
    "bfp_fake_quantize",
]

Array = Any
E8M0_BIAS = 127
E8M0_NAN = 255


@dataclass(frozen=True)
class ElementFormat:
    """A small sign-magnitude element type: ``mbits`` mantissa bits, normal exponents ``emin..emax``.

    Representable magnitudes: ``k * 2**(max(e, emin) - mbits)`` for the binade ``e`` of the value, up to
    ``max_normal``. ``int8`` (MXINT8) is the fixed-point case ``emin = emax = 0``, ``mbits = 6``
    (values ``k / 64``, ``|k| <= 127``).
    """

    name: str
    mbits: int
    emin: int
    emax: int
    max_normal: float


#: OCP MX v1.0 element types (section 5.3): name -> format. ``emax`` is the spec's ``emax_elem``.
MX_ELEMENTS: dict[str, ElementFormat] = {
    "fp8_e4m3": ElementFormat("fp8_e4m3", 3, -6, 8, 448.0),
    "fp8_e5m2": ElementFormat("fp8_e5m2", 2, -14, 15, 57344.0),
    "fp6_e3m2": ElementFormat("fp6_e3m2", 2, -2, 4, 28.0),
    "fp6_e2m3": ElementFormat("fp6_e2m3", 3, 0, 2, 7.5),
    "fp4_e2m1": ElementFormat("fp4_e2m1", 1, 0, 2, 6.0),
    "int8": ElementFormat("int8", 6, 0, 0, 127 / 64),
}
_ELEMENT_ALIASES = {
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "float6_e3m2fn": "fp6_e3m2",
    "float6_e2m3fn": "fp6_e2m3",
    "float4_e2m1fn": "fp4_e2m1",
    "fp4": "fp4_e2m1",
}

#: Shared-exponent rounding modes (see :func:`mx_scale`).
MX_ROUNDINGS = ("floor", "ceil", "even", "rceil")


class BlockScale(NamedTuple):
    """One power-of-two scale per block: ``exponent`` is the uint8 biased code ``c`` (E8M0), ``scale`` is
    ``X = 2**(c - 127)`` as float32 (NaN where ``c == 255``)."""

    scale: Array
    exponent: Array


# ----------------------------------------------------------------------------------------------- checks


def parse_element(element: str, *, name: str = "element") -> ElementFormat:
    """The :class:`ElementFormat` for a name (``"fp8_e4m3"``, ``"float8_e4m3fn"``, ``"fp4"``...)."""
    if isinstance(element, str):
        key = _ELEMENT_ALIASES.get(element.removeprefix("torch."), element)
        if key in MX_ELEMENTS:
            return MX_ELEMENTS[key]
    allowed = ", ".join(list(MX_ELEMENTS) + list(_ELEMENT_ALIASES))
    raise ValueError(f"{name}={element!r} is not a known element type; allowed: {allowed}")


def check_rounding(rounding: str) -> str:
    if rounding not in MX_ROUNDINGS:
        raise ValueError(f"rounding={rounding!r} is not a known rounding mode; allowed: {', '.join(MX_ROUNDINGS)}")
    return rounding


def check_same_shape(min_val: Array, max_val: Array) -> None:
    """``ValueError`` unless ``min_val`` and ``max_val`` (one range per block or group) have one shape."""
    if tuple(min_val.shape) != tuple(max_val.shape):
        raise ValueError(f"min_val and max_val must have one shape (one range per block or group), got "
                         f"{tuple(min_val.shape)} and {tuple(max_val.shape)}")


def check_block_size(block_size: int, *, name: str = "block_size", allow_whole: bool = False) -> int:
    """``block_size`` as a positive int (or -1, "the whole axis", when ``allow_whole``)."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(block_size).__name__} {block_size!r}")
    if block_size >= 1 or (allow_whole and block_size == -1):
        return int(block_size)
    allowed = ">= 1 or -1 (the whole axis)" if allow_whole else ">= 1"
    raise ValueError(f"{name}={block_size} is invalid; allowed: {allowed}")


# ------------------------------------------------------------------------------------------ blocking


def compute_dtype(x: Array, xp: Any) -> Any:
    """float64 stays float64; every other input (float16, bfloat16, float32, integers) computes in float32."""
    return xp.float64 if x.dtype == xp.float64 else xp.float32


def to_blocks(x: Array, axis: int, block_size: int, xp: Any, *, pad: bool) -> Array:
    """``x`` viewed as ``x.shape[:axis] + (n_blocks, block_size) + x.shape[axis + 1:]``.

    ``block_size=-1`` is one block spanning the axis. With ``pad`` the axis is padded with zeros up to a
    multiple of ``block_size``; without it a remainder raises ``ValueError``. A ``block_size`` beyond the
    axis is one block padded with a single zero (the same minimum, maximum and results as any longer zero
    padding, without allocating ``block_size`` elements).
    """
    n = x.shape[axis]
    if block_size == -1:
        if n == 0:
            raise ValueError(f"x has length 0 along axis {axis}: a whole-axis group would be empty")
        block_size = n
    if pad and 0 < n < block_size:
        block_size = n + 1
    rem = n % block_size
    if rem:
        if not pad:
            raise ValueError(
                f"x has length {n} along axis {axis}, which is not a multiple of group_size={block_size}"
            )
        pad_shape = x.shape[:axis] + (block_size - rem,) + x.shape[axis + 1 :]
        x = xp.concat([x, xp.zeros(pad_shape, dtype=x.dtype, device=device_of(x))], axis=axis)
        n += block_size - rem
    return xp.reshape(x, x.shape[:axis] + (n // block_size, block_size) + x.shape[axis + 1 :])


def from_blocks(xb: Array, axis: int, n: int, xp: Any) -> Array:
    """Inverse of :func:`to_blocks`: merge the two block axes and drop the padding (length ``n``)."""
    shape = xb.shape[:axis] + (xb.shape[axis] * xb.shape[axis + 1],) + xb.shape[axis + 2 :]
    y = xp.reshape(xb, shape)
    if shape[axis] != n:
        y = y[(slice(None),) * axis + (slice(0, n), ...)]
    return y


def block_aminmax(
    x: Array,
    /,
    *,
    axis: int = -1,
    block_size: int = 32,
    pad: bool = True,
    ignore_nonfinite: bool = False,
    xp: Any = None,
) -> tuple[Array, Array]:
    """``(min, max)`` of each block of ``block_size`` consecutive elements along ``axis``.

    Results have ``x.shape`` with ``axis`` replaced by the number of blocks, ``ceil(n / block_size)``
    with ``pad`` (zero padding) or ``n / block_size`` without (``ValueError`` on a remainder);
    ``block_size=-1`` is one block per axis. NaN propagates unless ``ignore_nonfinite``, which skips NaN
    and +/-Inf (a block with no finite value gives ``(+inf, -inf)``). Dtype: ``x``'s (floating).
    """
    return blocked_aminmax(x, axis, block_size, pad, ignore_nonfinite, xp, name="block_size")


def blocked_aminmax(
    x: Array, axis: int, block_size: int, pad: bool, ignore_nonfinite: bool, xp: Any, *, name: str
) -> tuple[Array, Array]:
    """:func:`block_aminmax` with the size argument reported as ``name`` in errors."""
    xp = array_namespace(x, xp=xp)
    check_real(x, xp)
    axis = normalize_axis(axis, x.ndim)
    block_size = check_block_size(block_size, name=name, allow_whole=True)
    ignore_nonfinite = check_bool(ignore_nonfinite, "ignore_nonfinite")
    if not xp.isdtype(x.dtype, "real floating"):
        x = xp.astype(x, xp.float32)
    xb = to_blocks(x, axis, block_size, xp, pad=pad)
    return reduce_aminmax(xb, (axis + 1,), ignore_nonfinite=ignore_nonfinite, xp=xp)


# ----------------------------------------------------------------------------- exact powers of two


@functools.lru_cache(maxsize=16)
def _pow2_values(kmin: int, kmax: int) -> np.ndarray:
    """``[2**kmin, ..., 2**kmax]`` in float64 (exact), one array per range (:func:`device_constant`'s key)."""
    return np.ldexp(1.0, np.arange(kmin, kmax + 1))


def _pow2_table(kmin: int, kmax: int, dtype: Any, device: Any, xp: Any) -> Array:
    """``[2**kmin, ..., 2**kmax]`` in ``dtype`` (exact: every entry is representable)."""
    return device_constant(_pow2_values(kmin, kmax), xp, device, dtype=dtype)


def _take(table: Array, index: Array, xp: Any) -> Array:
    """``table[index]`` elementwise for an index array of any shape (``xp.take`` wants 1-D indices)."""
    flat = xp.take(table, xp.reshape(index, (-1,)))
    return xp.reshape(flat, index.shape)


def _exponent_range(dtype: Any, xp: Any) -> tuple[int, int]:
    """Smallest (subnormal) and largest binary exponent of a floating dtype."""
    info = xp.finfo(dtype)
    nmant = -math.frexp(float(info.eps))[1] + 1  # eps = 2**-nmant
    min_normal = math.frexp(float(info.smallest_normal))[1] - 1
    return min_normal - nmant, math.frexp(float(info.max))[1] - 1


def floor_log2(a: Array, xp: Any) -> tuple[Array, Array]:
    """``(k, 2**k)`` with ``k = floor(log2(a))`` exactly, for ``a > 0`` finite (int32 ``k``).

    ``log2`` gives an estimate that can be one off near powers of two; comparing ``a`` with the exact
    table entries ``2**k`` and ``2**(k + 1)`` corrects it. ``a = 0`` (and NaN) gives the dtype's
    smallest exponent minus one and ``2**k`` reported as 0; callers mask zeros, NaN and Inf.
    """
    kmin, kmax = _exponent_range(a.dtype, xp)
    ends = [xp.full((1,), v, dtype=a.dtype, device=device_of(a)) for v in (0.0, math.inf)]
    # table[i] = 2**(kmin - 1 + i) for i in 1..last-1; table[0] = 0 stands for "below", table[last] = inf
    table = xp.concat([ends[0], _pow2_table(kmin, kmax, a.dtype, device_of(a), xp), ends[1]])
    last = kmax - kmin + 2
    safe = xp.where(xp.isfinite(a) & (a > 0), a, xp.ones_like(a))
    k = xp.floor(xp.log2(safe))
    i = xp.astype(xp.clip(k, float(kmin), float(kmax)), xp.int32) - (kmin - 1)
    i = i - xp.astype(safe < _take(table, i, xp), xp.int32)
    i = xp.clip(i, 0, last - 1)
    i = i + xp.astype(safe >= _take(table, i + 1, xp), xp.int32)
    i = xp.where(a > 0, i, xp.zeros_like(i))
    return i + (kmin - 1), _take(table, i, xp)


def _pow2_factors(e: Array, xp: Any, dtype: Any) -> tuple[Array, Array]:
    """``(2**(e // 2), 2**(e - e // 2))`` for int ``e`` in ``[-254, 254]``: two normal factors whose
    product is ``2**e``."""
    table = _pow2_table(-127, 127, dtype, device_of(e), xp)
    half = e // 2
    return _take(table, half + 127, xp), _take(table, e - half + 127, xp)


def _scale_by_pow2(x: Array, e: Array, xp: Any) -> Array:
    """``x * 2**e`` exactly (barring under/overflow of the result), ``e`` broadcasting against ``x``."""
    f1, f2 = _pow2_factors(e, xp, x.dtype)
    return (x * f1) * f2


def round_to_element(y: Array, fmt: ElementFormat, xp: Any, *, lo: float | None = None) -> Array:
    """``y`` rounded to the nearest value of ``fmt`` (ties to even), saturating at ``+/-max_normal``
    (``lo`` overrides the lower bound). NaN stays NaN; +/-Inf saturates.

    The quantum is ``2**(max(e, emin) - mbits)`` with ``e = floor(log2|y|)``; ``log2`` may be one off
    only within ``~1e-6`` of a power of two, where both candidate quanta round to that same power, so
    the estimate needs no correction. Quanta come from an exact table. torch float32 with an fp8
    element uses torch's own float8 cast instead (the same rounding, one kernel).
    """
    lo = -fmt.max_normal if lo is None else lo
    y = xp.clip(y, lo, fmt.max_normal)
    native = _NATIVE_FLOAT8.get(fmt.name)
    if native is not None and is_torch_namespace(xp) and y.dtype == xp.float32:
        import torch  # only reached for torch tensors

        return y.to(getattr(torch, native)).to(torch.float32)
    floor_at = scalar_like(2.0**fmt.emin, y, xp)
    a = xp.abs(y)
    safe = xp.where(a >= floor_at, a, floor_at)  # also maps NaN to the smallest binade
    # log2(safe) >= emin and < emax + 1 (y is clipped), so truncation is the floor
    i = xp.astype(xp.log2(safe) - float(fmt.emin), xp.int32)
    quanta = _pow2_table(fmt.emin - fmt.mbits, fmt.emax - fmt.mbits, y.dtype, device_of(y), xp)
    q = _take(quanta, xp.clip(i, 0, fmt.emax - fmt.emin), xp)
    return xp.round(y / q) * q


_NATIVE_FLOAT8 = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


# ------------------------------------------------------------------------------------------------ MX


def _biased_code(e: Array, nan: Array, xp: Any) -> Array:
    """uint8 E8M0 code: ``clip(e, -127, 127) + 127``, 255 where ``nan``."""
    code = xp.clip(e, -E8M0_BIAS, E8M0_BIAS) + E8M0_BIAS
    return xp.astype(xp.where(nan, xp.full_like(code, E8M0_NAN), code), xp.uint8)


def _check_codes(code: Array, xp: Any, name: str) -> None:
    """``TypeError`` unless ``code`` holds uint8 E8M0 codes (every value a code: 0..254, 255 NaN)."""
    if code.dtype != xp.uint8:
        raise TypeError(f"{name} must hold uint8 E8M0 codes (the exponent of mx_scale/bfp_scale), got dtype {code.dtype}")


def e8m0_to_float(code: Array, /, *, xp: Any = None) -> Array:
    """``2**(c - 127)`` as float32 for uint8 codes ``c`` (NaN for 255), from an exact table."""
    xp = array_namespace(code, xp=xp)
    _check_codes(code, xp, "code")
    table = xp.concat(
        [_pow2_table(-127, 127, xp.float32, device_of(code), xp), xp.full((1,), math.nan, dtype=xp.float32, device=device_of(code))]
    )
    return _take(table, xp.astype(code, xp.int32), xp)


def mx_scale(amax: Array, /, *, element: str = "fp8_e4m3", rounding: str = "floor", xp: Any = None) -> BlockScale:
    """The shared E8M0 exponent of blocks whose largest magnitude is ``amax`` (OCP MX v1.0, 6.3).

    With ``emax`` the element's largest normal exponent and ``k = floor(log2(amax))`` (exact):

    - ``floor`` (the spec; torchao's default): ``e = k - emax``;
    - ``ceil``: ``e = ceil(log2(amax)) - emax``;
    - ``even`` (Quark's default, torchao ``EVEN``): ``amax`` is first rounded to the element's
      ``mbits`` (half away from zero), so ``e = k + [amax >= 2**k * (2 - 2**-(mbits + 1))] - emax``;
    - ``rceil`` (cuBLAS / ``cvt.rp.satfinite.ue8m0``): ``e = ceil(log2(amax / max_normal))`` with the
      quotient rounded to ``amax``'s precision (float32 for float32 inputs).

    Then ``e`` is clamped to the E8M0 range ``[-127, 127]`` and stored as ``c = e + 127``. Special
    blocks: ``amax = 0`` (all zeros) gives ``c = 0`` (``X = 2**-127``); NaN gives ``c = 255`` (NaN,
    the whole block dequantizes to NaN); +Inf saturates to ``c = 254``, as ``cvt.rp.satfinite`` does
    (the block's finite values then underflow to 0 and +/-Inf comes back as +/-Inf, since
    ``max_normal * 2**127`` overflows float32).
    ``amax`` is reduced in float32 (float64 stays float64).
    """
    xp = array_namespace(amax, xp=xp)
    check_real(amax, xp, name="amax")
    fmt = parse_element(element)
    check_rounding(rounding)
    a = xp.astype(xp.abs(amax), compute_dtype(amax, xp))
    if rounding == "rceil":
        a = divide_by_constant(a, fmt.max_normal, xp)
    k, p = floor_log2(a, xp)
    if rounding in ("ceil", "rceil"):
        k = k + xp.astype(a > p, xp.int32)
    elif rounding == "even":
        k = k + xp.astype(a >= p * (2.0 - 2.0 ** -(fmt.mbits + 1)), xp.int32)
    e = k if rounding == "rceil" else k - fmt.emax
    e = xp.where(xp.isinf(a), xp.full_like(e, E8M0_BIAS), e)
    e = xp.where(a == 0, xp.full_like(e, -E8M0_BIAS), e)
    code = _biased_code(e, xp.isnan(a), xp)
    return BlockScale(e8m0_to_float(code, xp=xp), code)


def _block_fake_quantize(
    x: Array, code: Array, fmt: ElementFormat, axis: int, block_size: int, lo: float | None, xp: Any
) -> Array:
    """Shared MX/BFP quantize-dequantize: ``round_to_element(x / 2**e, fmt) * 2**e`` per block, with
    ``e = code - 127``; code 255 makes the block NaN. Computed in float32 (float64 stays float64), rounded
    once to ``x``'s floating dtype (a NumPy ml_dtypes bfloat16/float8 array's too; integers: float32)."""
    extension = checked_real(x, xp)
    _check_codes(code, xp, "exponent")
    axis = normalize_axis(axis, x.ndim)
    block_size = check_block_size(block_size)
    out_dtype = x.dtype if extension or xp.isdtype(x.dtype, "real floating") else xp.float32
    n = x.shape[axis]
    xb = to_blocks(xp.astype(x, compute_dtype(x, xp), copy=False), axis, block_size, xp, pad=True)
    expected = xb.shape[: axis + 1] + xb.shape[axis + 2 :]
    if tuple(code.shape) != tuple(expected):
        raise ValueError(
            f"exponent has shape {tuple(code.shape)} but x with block_size={block_size} along axis {axis} "
            f"needs {tuple(expected)}"
        )
    code = xp.expand_dims(xp.astype(code, xp.int32), axis=axis + 1)
    with np.errstate(over="ignore"):  # numpy-backed arrays: max_normal * 2**127 overflows float32 to inf
        if is_jax_namespace(xp) or is_cupy_namespace(xp):
            # XLA on CPU and CuPy (-ftz=true) flush subnormal operands (2**-127) to zero: scale by two
            # normal factors
            e = xp.where(code == E8M0_NAN, xp.zeros_like(code), code - E8M0_BIAS)
            y = _scale_by_pow2(round_to_element(_scale_by_pow2(xb, -e, xp), fmt, xp, lo=lo), e, xp)
            y = xp.where(code == E8M0_NAN, scalar_like(math.nan, y, xp), y)
        else:
            # one exact multiplication each way; NaN (code 255) rides in the factors
            inv, scale = _e8m0_factors(code, xb.dtype, xp)
            y = round_to_element(xb * inv, fmt, xp, lo=lo) * scale
    return xp.astype(from_blocks(y, axis, n, xp), out_dtype, copy=False)


def _e8m0_factors(code: Array, dtype: Any, xp: Any) -> tuple[Array, Array]:
    """``(2**(127 - c), 2**(c - 127))`` per code, NaN for 255 (exact; ``2**-127`` is subnormal)."""
    nan = xp.full((1,), math.nan, dtype=dtype, device=device_of(code))
    up = xp.concat([_pow2_table(-127, 127, dtype, device_of(code), xp), nan])
    down = xp.concat([xp.flip(_pow2_table(-127, 127, dtype, device_of(code), xp)), nan])
    return _take(down, code, xp), _take(up, code, xp)


def mx_fake_quantize(
    x: Array, exponent: Array, /, *, element: str = "fp8_e4m3", axis: int = -1, block_size: int = 32, xp: Any = None
) -> Array:
    """MX quantize-dequantize: ``X * P_i`` with ``X = 2**(c - 127)`` and ``P_i = round(x_i / X)`` to the
    element type (nearest, ties to even, saturating at ``+/-max_normal``, as the spec's conversion does).

    ``exponent`` holds the uint8 codes of :func:`mx_scale`, one per block (shape of ``x`` with ``axis``
    replaced by ``ceil(n / block_size)``). fp4_e2m1 elements are ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` (signed);
    int8 elements are ``k / 64``, ``|k| <= 127``. A NaN code (255) makes its block NaN; NaN inputs stay
    NaN, +/-Inf inputs saturate. Output dtype: ``x``'s (float32 for integer inputs).
    """
    xp = array_namespace(x, xp=xp)
    fmt = parse_element(element)
    return _block_fake_quantize(x, exponent, fmt, axis, block_size, None, xp)


# ----------------------------------------------------------------------------------------------- BFP

BFP_MANTISSA_BITS = 8  # signed two's-complement mantissa in [-128, 127], LSB = 2**(e - 6)
_BFP_ELEMENT = ElementFormat("bfp_int8", 6, 0, 0, 127 / 64)


def bfp_scale(min_val: Array, max_val: Array, /, *, xp: Any = None) -> BlockScale:
    """BFP16 shared exponent from each block's finite range, with Quark's overflow rule.

    ``amax = max(-min_val, max_val)``; ``e = floor(log2(amax))``, so mantissas ``m = round(x / 2**(e - 6))``
    fit 8 signed bits. Quark's rule: if rounding overflows (``round(x / 2**(e - 6)) >= 128``, i.e.
    ``max_val >= 127.5 * 2**(e - 6)`` with ties to even), the block takes ``e + 1``. Negative values
    reach ``-128`` at most and never overflow. ``e`` is clamped to ``[-127, 127]`` and stored as
    ``c = e + 127``; an all-zero block (``amax = 0``) gets ``c = 0``. Pass a range that skips NaN/Inf
    (``block_aminmax(..., ignore_nonfinite=True)``: Quark zeroes them first); a range of
    ``(+inf, -inf)`` (no finite value) counts as zero. ``scale`` is ``X = 2**e``; the mantissa LSB
    (Quark's "scale") is ``X / 64``.
    """
    xp = array_namespace(min_val, max_val, xp=xp)
    check_real(min_val, xp, name="min_val")
    check_real(max_val, xp, name="max_val")
    check_same_shape(min_val, max_val)
    dtype = compute_dtype(min_val, xp)
    lo, hi = xp.astype(min_val, dtype), xp.astype(max_val, dtype)
    empty = lo > hi
    zero = xp.zeros_like(lo)
    lo, hi = xp.where(empty, zero, lo), xp.where(empty, zero, hi)
    amax = xp.maximum(-lo, hi)
    k, p = floor_log2(amax, xp)
    k = k + xp.astype(hi >= p * (127.5 / 64), xp.int32)  # round(hi / 2**(k - 6)) >= 128
    k = xp.where(amax == 0, xp.full_like(k, -E8M0_BIAS), k)
    code = _biased_code(k, xp.isnan(amax), xp)
    return BlockScale(e8m0_to_float(code, xp=xp), code)


def bfp_fake_quantize(x: Array, exponent: Array, /, *, axis: int = -1, block_size: int = 8, xp: Any = None) -> Array:
    """BFP16 quantize-dequantize: ``clip(round(x / 2**(e - 6)), -128, 127) * 2**(e - 6)`` per block
    (ties to even), ``e = c - 127`` from :func:`bfp_scale`. NaN stays NaN, +/-Inf saturates to the
    block's extreme mantissa (Quark outputs 0 for both)."""
    xp = array_namespace(x, xp=xp)
    return _block_fake_quantize(x, exponent, _BFP_ELEMENT, axis, block_size, -2.0, xp)
