"""NVFP4 as torchao 0.18 and ModelOpt 0.47 compute it, and ModelOpt's MSE calibrators, as pure array-API
functions (the compressed-tensors form is :mod:`observers_core.families.llm`).

NVFP4: E2M1 values in blocks of ``block_size`` (16), one E4M3 scale per block, one float32 per-tensor scale
``P = amax / (6 * 448)`` (compressed-tensors stores ``1 / P`` as its global scale, computed as ``2688 / amax``).
The three anchors round the same quantity ``block_amax / 6 / P`` to E4M3 with different float32 operations:

- torchao ``nvfp4_quantize``: ``e4m3(clamp((block_amax / 6) / P, tiny_e4m3, 448))``, data ``x * ((1 / P) / s8)``;
- ModelOpt ``NVFP4QTensor.quantize`` (dynamic): ``e4m3(clamp(block_amax / (6 * P), 2**-9, 448))`` with a zero
  block's scale set to 1 first, data ``x / (s8 * P)``, E2M1 by ``searchsorted`` (ties to even);
- ModelOpt's static fake quantizer (``static_blockwise_fp4_fake_quant``, used by its MSE calibrators):
  ``s = e4m3(clamp((amax / 6) * (448 / g), +/-448)) * (1 / (448 / g))`` with ``g = global_amax / 6``, then
  ``sign(x) * e2m1(|x| / s) * s`` (NaN becomes ``-6 s``; a zero scale gives 0).

ModelOpt's ``MseCalibrator`` (:func:`mse_losses`, :class:`MseState`): candidates ``amax * m`` for the
multipliers ``m = linspace(start, stop, ceil((stop - start) / step) + 1)``; per batch the float32 loss
``sum (x - q_m(x))**2`` over the non-``axis`` dimensions, added to a running float32 sum; the answer is the
``argmin`` (first minimum, NaN first) times ``amax``. :class:`MseState` keeps that float32 sum (ModelOpt's
bits) and the exact sum of the same per-batch losses (:func:`exact_add`), so shards merge to the single pass
exactly. ``NVFP4MSECalibrator`` (:func:`nvfp4_scale_sweep`): every block tries the 126 finite positive E4M3
values ``v / 448`` as ``amax = global_amax * v / 448``, all at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from .._mx import MX_ELEMENTS, round_to_element
from .._namespace import array_namespace, device_of, size
from .._validate import check_float, check_int

__all__ = [
    "E4M3_MAX", "E2M1_MAX", "per_tensor_scale", "block_amax", "to_blocks", "e2m1_codes",
    "torchao_quantize", "modelopt_quantize", "modelopt_block_scales", "modelopt_fake_quantize",
    "e4m3_scale_candidates", "nvfp4_scale_sweep", "MseConfig", "MseState", "mse_multipliers",
    "mse_losses", "mse_init", "mse_update", "mse_merge", "mse_amax", "exact_add", "exact_value",
]

Array = Any

E4M3_MAX = 448.0
E2M1_MAX = 6.0
_E2M1 = MX_ELEMENTS["fp4_e2m1"]
_E4M3 = MX_ELEMENTS["fp8_e4m3"]
_E4M3_TINY = 2.0**-6  # torch.finfo(float8_e4m3fn).tiny: torchao's lower clamp
_MODELOPT_SCALE_MIN = 2.0**-9  # NVFP4QTensor's lower clamp (the smallest E4M3 subnormal)
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _f32(v: float, like: Array, xp: Any) -> Array:
    return xp.asarray(v, dtype=xp.float32, device=device_of(like))


def _e4m3(y: Array, xp: Any) -> Array:
    """Round float32 to E4M3 (ties to even), values kept as float32; |y| > 448 must be clamped first."""
    return round_to_element(y, _E4M3, xp)


# ---------------------------------------------------------------------------------------------- layout


def to_blocks(x: Array, block_size: int = 16, /, *, xp: Any = None) -> Array:
    """``x`` (``(..., K)``) as float32 blocks ``(..., K // block_size, block_size)``; a ``block_size`` that
    does not divide ``K`` is a ValueError naming it."""
    xp = array_namespace(x, xp=xp)
    check_int(block_size, "block_size", minimum=1)
    if x.ndim < 1 or x.shape[-1] % block_size:
        raise ValueError(f"block_size={block_size} does not divide the last axis of x (shape {tuple(x.shape)})")
    return xp.reshape(xp.astype(x, xp.float32), tuple(x.shape[:-1]) + (x.shape[-1] // block_size, block_size))


def block_amax(x: Array, block_size: int = 16, /, *, xp: Any = None) -> Array:
    """``max |x|`` per block of ``block_size`` along the last axis (float32, NaN propagates)."""
    xp = array_namespace(x, xp=xp)
    return xp.max(xp.abs(to_blocks(x, block_size, xp=xp)), axis=-1)


def per_tensor_scale(amax: Array, /, *, xp: Any = None) -> Array:
    """``P = amax / (6 * 448)`` in float32 (torchao ``per_tensor_amax_to_scale``, ModelOpt
    ``weights_scaling_factor_2``); compressed-tensors' global scale is ``2688 / amax`` instead."""
    xp = array_namespace(amax, xp=xp)
    return xp.astype(amax, xp.float32) / (E2M1_MAX * E4M3_MAX)


def e2m1_codes(values: Array, /, *, xp: Any = None) -> Array:
    """The 4-bit E2M1 codes (``signbit << 3 | index``, uint8) of E2M1 values (torchao's nibble)."""
    xp = array_namespace(values, xp=xp)
    a = xp.abs(values)
    index = xp.zeros(values.shape, dtype=xp.uint8, device=device_of(values))
    for i, v in enumerate(_E2M1_VALUES[1:], start=1):
        index = xp.where(a >= v, xp.full_like(index, i), index)
    sign = xp.astype(xp.signbit(values), xp.uint8) * 8  # -0.0 keeps its sign bit, as torchao's and ModelOpt's
    return sign + index


# ----------------------------------------------------------------------------------- torchao / ModelOpt


def torchao_quantize(x: Array, per_tensor: Array | None = None, /, *, block_size: int = 16,
                     xp: Any = None) -> tuple[Array, Array]:
    """torchao 0.18 ``nvfp4_quantize``: ``(block scales as E4M3 values, E2M1 values)``, float32.

    Two-level (``per_tensor`` = ``P``): ``s8 = e4m3(clamp((bamax / 6) / P, 2**-6, 448))``,
    ``e2m1(clamp(x * ((1 / P) / s8), +/-6))``; single-level: ``s8 = e4m3(clamp(bamax / 6, 2**-6, 448))``,
    ``e2m1(x * (1 / s8))``."""
    xp = array_namespace(x, xp=xp)
    blocks = to_blocks(x, block_size, xp=xp)
    bscale = xp.max(xp.abs(blocks), axis=-1) / E2M1_MAX
    if per_tensor is None:
        s8 = _e4m3(xp.clip(bscale, _E4M3_TINY, E4M3_MAX), xp)
        recip = 1.0 / s8
    else:
        p = xp.astype(per_tensor, xp.float32)
        s8 = _e4m3(xp.clip(bscale / p, _E4M3_TINY, E4M3_MAX), xp)
        recip = (1.0 / p) / s8
    data = xp.clip(blocks * recip[..., None], -E2M1_MAX, E2M1_MAX)
    return s8, xp.reshape(round_to_element(data, _E2M1, xp), x.shape)


def modelopt_quantize(x: Array, per_tensor: Array | None = None, /, *, block_size: int = 16,
                      xp: Any = None) -> tuple[Array, Array, Array]:
    """ModelOpt 0.47 ``NVFP4QTensor.quantize`` (dynamic path): ``(E4M3 block scales, E2M1 values, P)``.

    ``P = amax(x) / 2688`` unless given; ``s8 = e4m3(clamp(bamax / (6 * P), 2**-9, 448))`` with a zero
    ratio replaced by 1 first; values ``e2m1(x / (s8 * P))`` (ties to even; beyond 6 saturates; NaN is +6)."""
    xp = array_namespace(x, xp=xp)
    blocks = to_blocks(x, block_size, xp=xp)
    p = per_tensor_scale(xp.max(xp.abs(blocks)), xp=xp) if per_tensor is None else xp.astype(per_tensor, xp.float32)
    ratio = xp.max(xp.abs(blocks), axis=-1) / (E2M1_MAX * p)
    ratio = xp.where(ratio == 0, xp.ones_like(ratio), ratio)
    s8 = _e4m3(xp.clip(ratio, _MODELOPT_SCALE_MIN, E4M3_MAX), xp)
    scaled = blocks / (s8 * p)[..., None]
    values = round_to_element(scaled, _E2M1, xp)
    values = xp.where(xp.isnan(scaled), xp.full_like(scaled, E2M1_MAX), values)  # searchsorted puts NaN last
    return s8, xp.reshape(values, x.shape), p


def modelopt_block_scales(amax: Array, global_amax: Array, /, *, xp: Any = None) -> Array:
    """ModelOpt's ``compute_fp4_scales`` (static quantizer): the dequantization scale per block, float32:
    ``g = global_amax / 6``, ``k = 448 / g`` (``g <= 2**-24``: ``k = 448``),
    ``e4m3(clamp((amax / 6) * k, +/-448)) * (1 / k)``."""
    xp = array_namespace(amax, global_amax, xp=xp)
    scale = xp.astype(amax, xp.float32) / E2M1_MAX
    g = (xp.astype(global_amax, xp.float32) * 1.0) / E2M1_MAX
    g = xp.where(g <= 2.0**-24, xp.ones_like(g), g)
    k = E4M3_MAX / g
    return _e4m3(xp.clip(scale * k, -E4M3_MAX, E4M3_MAX), xp) * (1.0 / k)


def modelopt_fake_quantize(blocks: Array, scale: Array, /, *, xp: Any = None) -> Array:
    """ModelOpt's Triton ``nvfp4_scalar_quant``: ``sign(x) * e2m1(|x| / s) * s`` per block (``scale``
    broadcasting against ``blocks``' leading axes); NaN/Inf ``s`` act as 1, ``s = 0`` gives 0, a NaN value
    gives ``-6 s`` (its comparisons fail)."""
    xp = array_namespace(blocks, scale, xp=xp)
    s = scale[..., None]
    zero = s == 0
    safe = xp.where(zero | xp.isnan(s) | xp.isinf(s), xp.ones_like(s), s)
    a = xp.abs(blocks) / safe
    q = xp.where(xp.isnan(a), xp.full_like(a, E2M1_MAX), round_to_element(a, _E2M1, xp))
    y = q * safe
    y = xp.where(blocks >= 0, y, -y)
    return xp.where(zero, xp.zeros_like(y), y)


# ------------------------------------------------------------------------------------- the 126 E4M3 sweep


def e4m3_scale_candidates(*, like: Array = None, xp: Any = None) -> Array:
    """ModelOpt's ``fp8_scale_candidates``: the 126 finite positive E4M3 values (codes 1..126) / 448."""
    if xp is None:
        import array_api_compat.numpy as xp
    dev = None if like is None else device_of(like)
    vals = []
    for code in range(1, 127):
        e, m = code >> 3, code & 7
        vals.append(m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return xp.asarray(vals, dtype=xp.float32, device=dev) / E4M3_MAX


def nvfp4_scale_sweep(blocks: Array, global_amax: Array, /, *, chunk_elements: int = 2**22,
                      xp: Any = None) -> tuple[Array, Array]:
    """ModelOpt's ``NVFP4MSECalibrator`` reference sweep on ``blocks`` (``(n_blocks, block_size)``):
    ``(best amax per block, losses (126, n_blocks))``. Candidate ``j``'s amax is ``global_amax * c_j``
    (float32, the same for every block); its loss ``sum (x - q_j(x))**2`` per block with ``q_j`` the
    static fake quantizer (:func:`modelopt_block_scales`, :func:`modelopt_fake_quantize`); the best is
    the first minimum (NaN first, as ``torch.argmin``). All candidates at once, in chunks of blocks
    holding about ``chunk_elements`` values."""
    xp = array_namespace(blocks, global_amax, xp=xp)
    if blocks.ndim != 2:
        raise ValueError(f"blocks must be 2-D (n_blocks, block_size), got shape {tuple(blocks.shape)}")
    check_int(chunk_elements, "chunk_elements", minimum=1)
    x = xp.astype(blocks, xp.float32)
    g = xp.reshape(xp.astype(global_amax, xp.float32), ())
    amaxes = g * e4m3_scale_candidates(like=x, xp=xp)  # (126,)
    scales = modelopt_block_scales(amaxes, g, xp=xp)  # (126,)
    t, (n, bs) = amaxes.shape[0], x.shape
    step = max(1, chunk_elements // max(1, t * bs))
    parts = []
    for b0 in range(0, n, step):
        xb = x[b0:min(n, b0 + step), :]
        q = modelopt_fake_quantize(xb[None, ...], xp.reshape(scales, (t, 1)), xp=xp)
        d = xb[None, ...] - q
        parts.append(xp.sum(d * d, axis=-1))
    losses = parts[0] if len(parts) == 1 else xp.concat(parts, axis=1)
    best = _first_argmin(losses, xp)
    return xp.take(amaxes, best, axis=0), losses


def _first_argmin(losses: Array, xp: Any) -> Array:
    """``torch.argmin`` over axis 0: the first minimum, or the first NaN if any."""
    nan = xp.isnan(losses)
    t = losses.shape[0]
    idx = xp.reshape(xp.arange(t, device=device_of(losses)), (t,) + (1,) * (losses.ndim - 1))
    idx = xp.broadcast_to(idx, losses.shape)
    filled = xp.where(nan, xp.full_like(losses, -math.inf), losses)
    low = xp.min(filled, axis=0)
    hit = filled == low[None, ...]
    return xp.min(xp.where(hit, idx, xp.full_like(idx, t)), axis=0)


# -------------------------------------------------------------------------------------- MseCalibrator


@dataclass(frozen=True)
class MseConfig:
    """ModelOpt ``MseCalibrator``'s ``step_size``, ``start_multiplier``, ``stop_multiplier``, ``axis``
    (the kept dimension(s); ``None``: per tensor)."""

    step_size: float = 0.1
    start_multiplier: float = 0.25
    stop_multiplier: float = 4.0
    axis: int | tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        step = float(check_float(self.step_size, "step_size"))  # type: ignore[arg-type]
        if not step > 0:
            raise ValueError(f"step_size={self.step_size!r} must be > 0")
        start = float(check_float(self.start_multiplier, "start_multiplier"))  # type: ignore[arg-type]
        stop = float(check_float(self.stop_multiplier, "stop_multiplier"))  # type: ignore[arg-type]
        if not stop >= start:
            raise ValueError(f"stop_multiplier={self.stop_multiplier!r} must be >= start_multiplier={start!r}")
        for name, value in (("step_size", step), ("start_multiplier", start), ("stop_multiplier", stop)):
            object.__setattr__(self, name, value)
        axes = self.axis if isinstance(self.axis, tuple) else (self.axis,)
        if self.axis is not None and not all(isinstance(a, int) and not isinstance(a, bool) for a in axes):
            raise TypeError(f"axis={self.axis!r} must be None, an int or a tuple of ints")

    @property
    def num_steps(self) -> int:
        """``ceil((stop - start) / step) + 1``."""
        return math.ceil((self.stop_multiplier - self.start_multiplier) / self.step_size) + 1


def mse_multipliers(config: MseConfig, /, *, like: Array = None, xp: Any = None) -> Array:
    """The multipliers, float32: ``torch.linspace`` itself on torch (ModelOpt's bits; torch's CPU kernel
    depends on the vector width), ``linspace`` of the namespace elsewhere (can differ in the last bit)."""
    if xp is None:
        import array_api_compat.numpy as xp
    dev = None if like is None else device_of(like)
    n = config.num_steps
    if "torch" in getattr(xp, "__name__", ""):
        import torch  # only reached with the torch namespace

        return torch.linspace(config.start_multiplier, config.stop_multiplier, steps=n, device=dev)
    return xp.linspace(config.start_multiplier, config.stop_multiplier, n, dtype=xp.float32, device=dev)


def _reduce_axes(ndim: int, axis: Any) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    kept = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(i for i in range(ndim) if i not in kept and (i - ndim) not in kept)


def mse_losses(x: Array, amax: Array, multipliers: Array, quantize: Callable[[Array, Array], Array],
               config: MseConfig, /, *, xp: Any = None) -> Array:
    """One batch's float32 losses ``(T, *kept)``: ``sum over the non-axis dims of (x - quantize(x, amax *
    m_t))**2``, one call of ``quantize`` per candidate as ModelOpt (a 0-d ``m_t`` indexed on the device: no
    host read). One call over all candidates would round differently: torch divides by a 0-d tensor as
    by a scalar, by a broadcast tensor elementwise."""
    xp = array_namespace(x, amax, xp=xp)
    if size(x) == 0:
        raise ValueError("x is empty: ModelOpt's loss of an empty batch is 0 for every candidate; pass data")
    xf = xp.astype(x, xp.float32)
    axes = _reduce_axes(xf.ndim, config.axis)
    out = []
    for t in range(multipliers.shape[0]):
        d = xf - quantize(xf, amax * multipliers[t])
        out.append(xp.sum(d * d, axis=axes) if axes else d * d)
    return xp.stack(out, axis=0)


# Exact sums: float32 values split at fixed binary boundaries 2**(-149 + 24 k) into 12 float64 parts; each part
# is a multiple of its bin's unit below 2**24 units, so up to 2**29 of them add exactly in float64.
_BIN_BITS, _BIN_LOW, _BINS = 24, -149, 12


def exact_add(bins: Array | None, values: Array, /, *, xp: Any = None) -> Array:
    """``bins`` (``(12, *values.shape)`` float64) plus float32 ``values``, exactly (at most ``2**29``
    additions per bin). ``None`` starts from zero."""
    xp = array_namespace(values, xp=xp)
    raw = xp.astype(values, xp.float64)
    finite = xp.isfinite(raw)
    v = xp.where(finite, raw, xp.zeros_like(raw))  # NaN/Inf go to the top bin alone
    parts, upper = [], v
    for k in range(_BINS - 1, -1, -1):  # high bins first: q_k = floor(v / 2**b_k) * 2**b_k
        if k == 0:
            parts.append(upper)
            break
        unit = 2.0 ** (_BIN_LOW + _BIN_BITS * k)
        q = xp.floor(upper / unit) * unit
        parts.append(xp.where(finite, q, raw) if k == _BINS - 1 else q)
        upper = upper - q
    stacked = xp.stack(parts[::-1], axis=0)
    return stacked if bins is None else bins + stacked


def _normalized(bins: Array, xp: Any) -> Array:
    """Carries moved up so that bins ``0..10`` lie in ``[0, 2**24)`` units (exact): the exact sum's digits."""
    out, carry = [], xp.zeros_like(bins[0, ...])
    for k in range(_BINS):
        b = bins[k, ...] + carry
        if k == _BINS - 1:
            out.append(b)
            break
        top = 2.0 ** (_BIN_LOW + _BIN_BITS * (k + 1))
        carry = xp.floor(b / top) * top
        out.append(b - carry)
    return xp.stack(out, axis=0)


def exact_value(bins: Array, /, *, xp: Any = None) -> Array:
    """The exact sum rounded once to float64 (adding the normalized digits from the top is exact to 53 bits)."""
    xp = array_namespace(bins, xp=xp)
    d = _normalized(bins, xp)
    total = d[_BINS - 1, ...]
    for k in range(_BINS - 2, -1, -1):
        total = total + d[k, ...]
    return total


class MseState(NamedTuple):
    """``loss_sum``: ModelOpt's running float32 sum of the batch losses ``(T, *kept)``; ``exact``: their
    exact sum (:func:`exact_add`); ``count``: batches (int64 0-d)."""

    loss_sum: Array
    exact: Array
    count: Array


def mse_init(num_candidates: int, kept_shape: tuple[int, ...] = (), /, *, device: Any = None,
             xp: Any = None) -> MseState:
    """Zero sums for ``num_candidates`` multipliers and the kept (``axis``) shape."""
    if xp is None:
        import array_api_compat.numpy as xp
    check_int(num_candidates, "num_candidates", minimum=1)
    shape = (num_candidates,) + tuple(kept_shape)
    return MseState(xp.zeros(shape, dtype=xp.float32, device=device),
                    xp.zeros((_BINS,) + shape, dtype=xp.float64, device=device),
                    xp.zeros((), dtype=xp.int64, device=device))


def mse_update(state: MseState, losses: Array, /, *, xp: Any = None) -> MseState:
    """Adds one batch's losses (:func:`mse_losses`): ``loss_sum + losses`` in float32 as ModelOpt's ``+=``
    (its first batch is a copy: ``0 + l = l``), and exactly."""
    xp = array_namespace(losses, xp=xp)
    if tuple(losses.shape) != tuple(state.loss_sum.shape):
        raise ValueError(f"losses has shape {tuple(losses.shape)}, the state {tuple(state.loss_sum.shape)}")
    losses = xp.astype(losses, xp.float32)
    return MseState(state.loss_sum + losses, exact_add(state.exact, losses, xp=xp), state.count + 1)


def mse_merge(a: MseState, b: MseState, /) -> MseState:
    """Shards merged: exact sums added (the single pass's exact sum, whatever the split); the float32
    sums added (ModelOpt's bits when ``b`` holds one batch, the next one)."""
    if tuple(a.loss_sum.shape) != tuple(b.loss_sum.shape):
        raise ValueError(f"b has shape {tuple(b.loss_sum.shape)}, a {tuple(a.loss_sum.shape)}")
    return MseState(a.loss_sum + b.loss_sum, a.exact + b.exact, a.count + b.count)


def mse_amax(state: MseState, amax: Array, multipliers: Array, /, *, exact: bool = False,
             xp: Any = None) -> Array:
    """``amax * m[argmin]`` per kept entry, shaped like ``amax`` (ModelOpt's ``compute_amax``):
    ``exact=False`` on the float32 sum (ModelOpt's choice), ``exact=True`` on the exact sum (compared
    digit by digit; split-invariant). No batch seen: ValueError (ModelOpt returns None)."""
    xp = array_namespace(state.loss_sum, xp=xp)
    if int(state.count) == 0:
        raise ValueError("state has no batches: ModelOpt's compute_amax returns None; update it first")
    if exact:
        digits = _normalized(state.exact, xp)
        t = digits.shape[1]
        alive = xp.ones(digits.shape[1:], dtype=xp.bool, device=device_of(digits))
        for k in range(_BINS - 1, -1, -1):
            d = digits[k, ...]
            d = xp.where(xp.isnan(d), xp.full_like(d, -math.inf), d)  # NaN first, as torch.argmin
            d = xp.where(alive, d, xp.full_like(d, math.inf))
            alive = alive & (d == xp.min(d, axis=0)[None, ...])
        idx = xp.broadcast_to(xp.reshape(xp.arange(t, device=device_of(digits)),
                                         (t,) + (1,) * (digits.ndim - 2)), alive.shape)
        best = xp.min(xp.where(alive, idx, xp.full_like(idx, t)), axis=0)
    else:
        best = _first_argmin(state.loss_sum, xp)
    m = xp.reshape(xp.take(multipliers, xp.reshape(best, (-1,)), axis=0), amax.shape)
    return amax * m
