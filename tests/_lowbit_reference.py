"""Plain float64 NumPy references for the low-bit formats, written from the formulas and the OCP MX
v1.0 spec with Python loops and ``math.frexp`` (exact), independent of ``observers_core``."""

from __future__ import annotations

import math

import numpy as np

# name: (exponent bits, mantissa bits, exponent bias, emax_elem, max normal); int8 is fixed point.
FORMATS = {
    "fp8_e4m3": (4, 3, 7, 8, 448.0),
    "fp8_e5m2": (5, 2, 15, 15, 57344.0),
    "fp6_e3m2": (3, 2, 3, 4, 28.0),
    "fp6_e2m3": (2, 3, 1, 2, 7.5),
    "fp4_e2m1": (2, 1, 1, 2, 6.0),
    "int8": (0, 6, 0, 0, 127 / 64),
}


def element_grid(name: str) -> np.ndarray:
    """All non-negative values of an element type, ascending (index parity = code parity)."""
    ebits, mbits, bias, _, max_normal = FORMATS[name]
    if ebits == 0:  # MXINT8: k / 64, sign-magnitude, |k| <= 127
        return np.arange(128) / 64.0
    values = []
    for biased in range(0, 2**ebits):
        for m in range(2**mbits):
            if biased == 0:  # subnormal
                v = m / 2**mbits * 2.0 ** (1 - bias)
            else:
                v = (1 + m / 2**mbits) * 2.0 ** (biased - bias)
            if v <= max_normal:
                values.append(v)
    return np.array(values)


def round_to_grid(y: np.ndarray, grid: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Nearest grid value (ties to the even grid index) of ``clip(y, lo, hi)``, sign kept; NaN stays."""
    out = np.empty_like(y, dtype=np.float64)
    for i, v in np.ndenumerate(np.asarray(y, dtype=np.float64)):
        if math.isnan(v):
            out[i] = math.nan
            continue
        v = min(max(v, lo), hi)
        a = abs(v)
        j = int(np.searchsorted(grid, a))  # grid[j - 1] < a <= grid[j]
        if j == len(grid):
            best = len(grid) - 1
        elif grid[j] == a or j == 0:
            best = j
        else:
            below, above = a - grid[j - 1], grid[j] - a
            best = j - 1 if below < above else j if above < below else (j - 1 if (j - 1) % 2 == 0 else j)
        out[i] = math.copysign(grid[best], v)
    return out


def floor_log2(a: float) -> int:
    """``floor(log2(a))`` for ``a > 0`` finite, exactly."""
    return math.frexp(a)[1] - 1


def mx_code(block: np.ndarray, name: str, rounding: str) -> int:
    """E8M0 code of one block (OCP MX v1.0 6.3 plus our documented special cases). ``rceil`` divides
    ``amax / max_normal`` in the block's precision (float32 unless the block is float64)."""
    _, mbits, _, emax, max_normal = FORMATS[name]
    qtype = np.float64 if np.asarray(block).dtype == np.float64 else np.float32
    block = np.asarray(block, dtype=np.float64)
    if np.isnan(block).any():
        return 255
    amax = float(np.max(np.abs(block)))
    if math.isinf(amax):
        return 254
    if rounding == "rceil":
        amax = float(qtype(amax) / qtype(max_normal))
    if amax == 0:
        return 0
    k = floor_log2(amax)
    if rounding == "floor":
        e = k - emax
    elif rounding == "ceil":
        e = k + (1 if amax != 2.0**k else 0) - emax
    elif rounding == "rceil":
        e = k + (1 if amax != 2.0**k else 0)
    else:  # even: round amax's significand to mbits fraction bits, half up, then floor(log2)
        m_rounded = math.floor(amax / 2.0**k * 2**mbits + 0.5) / 2**mbits
        e = k + (1 if m_rounded >= 2 else 0) - emax
    return min(max(e, -127), 127) + 127


def blocks(x: np.ndarray, axis: int, size: int) -> np.ndarray:
    """``x`` moved so ``axis`` is last, zero-padded to a multiple of ``size``, shape ``(..., nb, size)``."""
    y = np.moveaxis(np.asarray(x), axis, -1)
    n = y.shape[-1]
    pad = (-n) % size
    if pad:
        y = np.concatenate([y, np.zeros(y.shape[:-1] + (pad,), dtype=y.dtype)], axis=-1)
    return y.reshape(y.shape[:-1] + (y.shape[-1] // size, size))


def unblock(yb: np.ndarray, axis: int, n: int) -> np.ndarray:
    y = yb.reshape(yb.shape[:-2] + (-1,))[..., :n]
    return np.moveaxis(y, -1, axis)


def mx_codes(x: np.ndarray, name: str, rounding: str, axis: int = -1, size: int = 32) -> np.ndarray:
    """Codes for every block, shape ``x.shape`` with ``axis`` replaced by the block count."""
    xb = blocks(x, axis, size)
    codes = np.empty(xb.shape[:-1], dtype=np.int64)
    for i in np.ndindex(codes.shape):
        codes[i] = mx_code(xb[i], name, rounding)
    return np.moveaxis(codes, -1, axis)


def mx_fake_quantize(x: np.ndarray, codes: np.ndarray, name: str, axis: int = -1, size: int = 32) -> np.ndarray:
    """``X * round_to_element(x / X)`` per block in float64, ``X = 2**(code - 127)``, NaN for 255."""
    max_normal = FORMATS[name][4]
    grid = element_grid(name)
    xb = blocks(np.asarray(x, dtype=np.float64), axis, size)
    cb = np.moveaxis(np.asarray(codes), axis, -1)
    out = np.empty_like(xb)
    for i in np.ndindex(cb.shape):
        c = int(cb[i])
        if c == 255:
            out[i] = math.nan
            continue
        scale = 2.0 ** (c - 127)
        out[i] = round_to_grid(xb[i] / scale, grid, -max_normal, max_normal) * scale
    return unblock(out, axis, np.asarray(x).shape[axis])


def bfp_code(block: np.ndarray) -> int:
    """Quark's BFP16 rule on one block: NaN/Inf count as 0; ``e = floor(log2(amax))``; if any mantissa
    ``round_half_even(v / 2**(e - 6))`` reaches 128 (or below -128), ``e += 1``."""
    v = np.nan_to_num(np.asarray(block, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    amax = float(np.max(np.abs(v)))
    if amax == 0:
        return 0
    e = floor_log2(amax)
    mant = np.round(v / 2.0 ** (e - 6))
    if (mant >= 128).any() or (mant < -128).any():
        e += 1
    return min(max(e, -127), 127) + 127


def bfp_codes(x: np.ndarray, axis: int = -1, size: int = 8) -> np.ndarray:
    xb = blocks(x, axis, size)
    codes = np.empty(xb.shape[:-1], dtype=np.int64)
    for i in np.ndindex(codes.shape):
        codes[i] = bfp_code(xb[i])
    return np.moveaxis(codes, -1, axis)


def bfp_fake_quantize(x: np.ndarray, codes: np.ndarray, axis: int = -1, size: int = 8) -> np.ndarray:
    """``clip(round_half_even(x / 2**(e - 6)), -128, 127) * 2**(e - 6)``; NaN stays NaN, Inf saturates."""
    xb = blocks(np.asarray(x, dtype=np.float64), axis, size)
    cb = np.moveaxis(np.asarray(codes), axis, -1)
    out = np.empty_like(xb)
    for i in np.ndindex(cb.shape):
        step = 2.0 ** (int(cb[i]) - 127 - 6)
        with np.errstate(invalid="ignore"):
            out[i] = np.clip(np.round(xb[i] / step), -128, 127) * step
    return unblock(out, axis, np.asarray(x).shape[axis])


def group_minmax(x: np.ndarray, axis: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-group min/max with a loop over groups (no padding: ``size`` divides the axis)."""
    y = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    size = y.shape[-1] if size == -1 else size
    n = y.shape[-1] // size
    lo = np.stack([y[..., g * size : (g + 1) * size].min(axis=-1) for g in range(n)], axis=-1)
    hi = np.stack([y[..., g * size : (g + 1) * size].max(axis=-1) for g in range(n)], axis=-1)
    return np.moveaxis(lo, -1, axis), np.moveaxis(hi, -1, axis)


def int_qparams(lo: np.ndarray, hi: np.ndarray, qmin: int, qmax: int, symmetric: bool, eps: float):
    """Float64 scale / zero point: asymmetric ``s = (M - m) / (Q_max - Q_min)``,
    ``z = Q_min - round(m / s)``; symmetric ``s = max(-m, M) / ((Q_max - Q_min) / 2)``,
    ``z = int((Q_max + Q_min + 1) / 2)``; ``s >= eps``."""
    m = np.minimum(np.asarray(lo, dtype=np.float64), 0.0)
    M = np.maximum(np.asarray(hi, dtype=np.float64), 0.0)
    if symmetric:
        s = np.maximum(np.maximum(-m, M) / ((qmax - qmin) / 2), eps)
        z = np.full(s.shape, int((qmax + qmin + 1) / 2))
    else:
        s = np.maximum((M - m) / (qmax - qmin), eps)
        z = np.clip(qmin - np.round(m / s), qmin, qmax).astype(np.int64)
    return s, z


def int_fake_quantize(x: np.ndarray, s: np.ndarray, z: np.ndarray, qmin: int, qmax: int) -> np.ndarray:
    """``(clip(round(x / s) + z, Q_min, Q_max) - z) * s`` in float64 (``s``, ``z`` broadcast)."""
    q = np.clip(np.round(np.asarray(x, dtype=np.float64) / s) + z, qmin, qmax)
    return (q - z) * s


def fp8_fake_quantize(x: np.ndarray, s: np.ndarray, name: str) -> np.ndarray:
    """``s * fp8(clip(x / s, -max, max))`` in float64 with the element grid (``s`` broadcast)."""
    max_normal = FORMATS[name][4]
    y = np.asarray(x, dtype=np.float64) / s
    return round_to_grid(y, element_grid(name), -max_normal, max_normal) * s
