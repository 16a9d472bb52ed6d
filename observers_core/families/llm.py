"""The LLM family: llm-compressor 0.14's observers over compressed-tensors 0.19's formats, as pure
array-API functions.

Every value is first flattened as llm-compressor's ``flatten_for_calibration`` does (:func:`flatten`):
``(num_observations, *qparam_shape, group_size)``; statistics are per ``qparam_shape`` entry.

- ``observe``: the batch's range, ``min``/``max`` over axes ``(0, -1)``, or the MSE grid search of it
  (:func:`grid_search`: candidates ``p * [min, max] * expand`` with ``p = 1 - i / grid``; error
  ``sum |fq(x) - x| ** norm`` (times the normalised importance ``E[x^2]`` per input channel for
  ``search="imatrix"``); llm-compressor's early stop after ``patience`` steps in which no group improved).
  Every candidate is evaluated at once (in chunks of ``chunk_elements`` values); the stopping rule is
  applied to the error table afterwards: the same choice as the eager loop, no host read per step.
  float32 host arrays (numba) and the torch CUDA path (a few Triton launches) screen every candidate with a
  fused kernel instead (exact ``fq``, an approximate ``|d| ** norm`` with an error bound) and compute the
  array code's exact errors only for the groups whose choice the bounds leave open
  (:func:`_screened_search`, :func:`_device_search`).
- ``update`` (``mode``): ``"memoryless"`` keeps the last batch's range, ``"static"`` the running
  ``min``/``max``, ``"moving"`` the moving average ``old * (1 - c) + new * c`` (the first batch sets it).
- ``qparams``: compressed-tensors' ``calculate_qparams`` step for step (:func:`calculate_qparams`):
  ``scale = max(|min|, |max|) / ((qmax - qmin) / 2)`` (symmetric) or ``(max - min) / (qmax - qmin)``
  with ``zp = clamp(qmin - min / scale)``; times the global scale; rounded to ``scale_dtype``
  (float16, bfloat16, E4M3, or E8M0 codes for MX: ``127 + floor(log2(pow2(amax))) - floor(log2(emax))``
  then ``2 ** (code - 127)``); zeros replaced by the scale dtype's eps.
- NVFP4 (``strategy="tensor_group"``): one float32 global scale ``448 * 6 / amax`` (:func:`global_scale`),
  ``amax`` taken over every tensor of a fused group (q/k/v, gate/up), then E4M3 block scales of 16.
- Importance (:class:`Importance`): ``sum x^2`` per input channel and the token count; ``merge`` adds
  them (what a DDP all-reduce does), ``importance`` is ``sum / count``.

Dtypes are names: ``"float32"``, ``"float16"``, ``"bfloat16"``, ``"float8_e4m3fn"``, ``"uint8"`` (E8M0 /
integer codes), ``"int8"``/``"int16"``/``"int32"`` (zero points). A float8 zero point is returned as
float32 values that are exactly representable in E4M3 (the adapter casts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from .._collective import check_collective, reduce_range
from .._mx import MX_ELEMENTS, e8m0_to_float, floor_log2, round_to_element
from .._histogram import true_divide
from .._namespace import array_namespace, clamp, device_of, is_jax_namespace, rounded, size
from .._validate import check_bool, check_choice, check_float, check_int

__all__ = [
    "Config", "State", "Importance", "QParams", "STRATEGIES", "SCALE_DTYPES", "MODES", "SEARCHES",
    "flatten", "init", "observe", "update", "merge", "qparams", "calculate_qparams", "global_scale",
    "fused_global_scale", "fake_quantize", "grid_search", "error_table", "select_candidates",
    "importance_init", "importance_update", "importance_merge", "importance", "normalized_importance",
    "importance_weights", "IMPORTANCE_STRATEGIES", "quant_range",
]

Array = Any

STRATEGIES = ("tensor", "channel", "group", "tensor_group", "block", "token", "attn_head")
SCALE_DTYPES = (None, "float32", "float16", "bfloat16", "float8_e4m3fn", "uint8")
ZP_DTYPES = ("int8", "int16", "int32", "uint8", "float8_e4m3fn")
MODES = ("memoryless", "static", "moving")
SEARCHES = (None, "mse", "imatrix")

FP8_E4M3_MAX = 448.0
FP4_E2M1_MAX = 6.0
_FLOAT_EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-52,
              "float8_e4m3fn": 0.125}
_FLOAT_MAX = {"float32": 3.4028234663852886e38, "float16": 65504.0, "bfloat16": 3.3895313892515355e38,
              "float8_e4m3fn": FP8_E4M3_MAX}
_FLOAT32_TINY = 2.0**-126
_INT_RANGE = {"int8": (-128, 127), "int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1),
              "uint8": (0, 255)}
#: floor(log2(element max)) for the MX element formats (E2M1: 6 -> 2, E4M3: 448 -> 8)
_MX_ELEM_OFFSET = {4: 2, 8: 8}


class QParams(NamedTuple):
    """``scale`` (the values' dtype unless rounded), ``zero_point`` (``zp_dtype``'s values), ``global_scale``
    (float32 ``(1,)`` for ``tensor_group``, else ``None``)."""

    scale: Array
    zero_point: Array
    global_scale: Array | None = None


class State(NamedTuple):
    """The range per qparam (``qparam_shape``), in the observed dtype, and the number of batches seen
    (int64 0-d); ``min_vals = +inf``, ``max_vals = -inf`` before the first batch."""

    min_vals: Array
    max_vals: Array
    count: Array


class Importance(NamedTuple):
    """``sum`` of ``x^2`` per input channel (float32) and ``count`` of tokens (int64 0-d)."""

    sum: Array
    count: Array


@dataclass(frozen=True)
class Config:
    """compressed-tensors' ``QuantizationArgs`` fields that matter here, and llm-compressor's observer
    options.

    ``type`` ``"int"``/``"float"``; ``num_bits`` (int: 1..32, float: 4 or 8); ``strategy`` one of
    :data:`STRATEGIES`; ``group_size`` for group/tensor_group; ``block_structure`` ``(rows, cols)`` for
    block; ``scale_dtype`` one of :data:`SCALE_DTYPES`; ``zp_dtype`` (``None``: compressed-tensors' default,
    E4M3 for float types, the smallest int holding ``num_bits`` for ints). ``mode`` one of :data:`MODES`;
    ``averaging_constant`` for ``"moving"``. ``search`` ``None`` (the plain range), ``"mse"``
    (memoryless_mse's loop: ``int(maxshrink * grid)`` steps, errors in the observed dtype) or ``"imatrix"``
    (imatrix_mse's loop: ``max(1, int(maxshrink * grid)) + 1`` steps, float32 errors, ``patience=0`` never
    stops); ``maxshrink``, ``patience``, ``grid``, ``norm``, ``expand`` as llm-compressor's observer_kwargs;
    ``chunk_elements`` bounds the values evaluated at once."""

    num_bits: int = 8
    type: str = "int"
    symmetric: bool = True
    strategy: str = "tensor"
    group_size: int | None = None
    block_structure: tuple[int, int] | None = None
    scale_dtype: str | None = None
    zp_dtype: str | None = None
    mode: str = "memoryless"
    averaging_constant: float = 0.01
    search: str | None = None
    maxshrink: float = 0.2
    patience: int = 5
    grid: float = 100.0
    norm: float = 2.4
    expand: float = 1.0
    chunk_elements: int = 2**22

    def __post_init__(self) -> None:
        check_choice(self.type, "type", ("int", "float"))
        check_int(self.num_bits, "num_bits", minimum=1, maximum=32)
        if self.type == "float" and self.num_bits not in (4, 8):
            raise ValueError(f"num_bits={self.num_bits!r} is not allowed for type='float'; allowed: 4, 8")
        check_bool(self.symmetric, "symmetric")
        if self.type == "float" and self.num_bits == 4 and not self.symmetric:
            raise ValueError("symmetric=False is not supported for FP4 (compressed-tensors raises too)")
        check_choice(self.strategy, "strategy", STRATEGIES)
        if self.strategy in ("group", "tensor_group"):
            check_int(self.group_size, "group_size", minimum=1)
        elif self.group_size is not None:
            raise ValueError(f"group_size={self.group_size!r} needs strategy 'group' or 'tensor_group'")
        if self.strategy == "block":
            if not (isinstance(self.block_structure, (tuple, list)) and len(self.block_structure) == 2):
                raise ValueError(f"block_structure={self.block_structure!r} must be (rows, cols) for strategy 'block'")
            object.__setattr__(self, "block_structure", tuple(
                check_int(v, "block_structure", minimum=1) for v in self.block_structure))
        elif self.block_structure is not None:
            raise ValueError(f"block_structure={self.block_structure!r} needs strategy 'block'")
        check_choice(self.scale_dtype, "scale_dtype", SCALE_DTYPES)
        if self.zp_dtype is None:
            zp = "float8_e4m3fn" if self.type == "float" else (
                "int8" if self.num_bits <= 8 else "int16" if self.num_bits <= 16 else "int32")
            object.__setattr__(self, "zp_dtype", zp)
        check_choice(self.zp_dtype, "zp_dtype", ZP_DTYPES)
        check_choice(self.mode, "mode", MODES)
        object.__setattr__(self, "averaging_constant", check_float(self.averaging_constant, "averaging_constant"))
        check_choice(self.search, "search", SEARCHES)
        object.__setattr__(self, "maxshrink", check_float(self.maxshrink, "maxshrink", minimum=0.0))
        check_int(self.patience, "patience", minimum=0)
        object.__setattr__(self, "grid", check_float(self.grid, "grid"))
        if self.grid <= 0:
            raise ValueError(f"grid={self.grid!r} must be > 0")
        norm = check_float(self.norm, "norm")
        if norm <= 0:
            raise ValueError(f"norm={self.norm!r} must be > 0")
        expand = check_float(self.expand, "expand")
        if expand < 1.0:
            raise ValueError(f"expand={self.expand!r} must be at least 1.0")
        check_int(self.chunk_elements, "chunk_elements", minimum=1)

    @property
    def is_mx(self) -> bool:
        """compressed-tensors' ``should_generate_mx_scales``: float 4/8 bits, groups of 32, uint8 scales."""
        return (self.type == "float" and self.num_bits in (4, 8) and self.group_size == 32
                and self.scale_dtype == "uint8")

    def shrink_factors(self) -> list[float]:
        """The candidates ``p`` of the grid search, as Python floats (llm-compressor's ``1 - i / grid``)."""
        if self.search == "imatrix":
            steps = max(1, int(self.maxshrink * self.grid)) + 1
        else:
            steps = int(self.maxshrink * self.grid)
        return [1 - i / self.grid for i in range(steps)]


def quant_range(config: Config) -> tuple[float, float]:
    """``(qmin, qmax)``: ``[-2**(b-1), 2**(b-1) - 1]`` for ints, ``+/-448`` (E4M3), ``+/-6`` (E2M1)."""
    if config.type == "int":
        half = 2.0**config.num_bits / 2
        return -half, half - 1
    top = FP8_E4M3_MAX if config.num_bits == 8 else FP4_E2M1_MAX
    return -top, top


# ---------------------------------------------------------------------------------------------- layout


def flatten(x: Array, config: Config, /, *, role: str = "weight", xp: Any = None) -> Array:
    """llm-compressor's ``flatten_for_calibration``: ``(num_observations, *qparam_shape, group_size)``.

    ``role``: ``"weight"`` (2-D ``(rows, cols)``), ``"activation"`` (``(..., hidden)``) or ``"attention"``
    (``(batch, heads, seq, head_dim)``). A group size that does not divide the columns is a ValueError
    naming ``group_size``; blocks are zero-padded as compressed-tensors pads them."""
    xp = array_namespace(x, xp=xp)
    check_choice(role, "role", ("weight", "activation", "attention"))
    s = config.strategy
    if role in ("weight", "activation") and s in ("group", "tensor_group") and x.shape[-1] % config.group_size:
        raise ValueError(f"group_size={config.group_size} does not divide the last axis of x (size {x.shape[-1]})")
    if role == "weight":
        if x.ndim != 2:
            raise ValueError(f"a weight must be 2-D (rows, cols), got shape {tuple(x.shape)}")
        rows, cols = x.shape
        if s == "tensor":
            return xp.reshape(x, (1, 1, -1))
        if s == "channel":
            return xp.reshape(x, (1, rows, 1, cols))
        if s in ("group", "tensor_group"):
            return xp.reshape(x, (1, rows, cols // config.group_size, config.group_size))
        if s == "block":
            bh, bw = config.block_structure
            pr, pc = (-rows) % bh, (-cols) % bw
            if pr or pc:
                z = xp.zeros((rows + pr, cols + pc), dtype=x.dtype, device=device_of(x))
                x = xp.concat([xp.concat([x, z[:rows, cols:]], axis=1), z[rows:, :]], axis=0)
                rows, cols = rows + pr, cols + pc
            blocks = xp.reshape(x, (rows // bh, bh, cols // bw, bw))
            return xp.reshape(xp.permute_dims(blocks, (0, 2, 1, 3)), (1, rows // bh, cols // bw, bh * bw))
        raise ValueError(f"strategy={s!r} cannot be applied to weights")
    if role == "activation":
        h = x.shape[-1]
        if s == "tensor":
            return xp.reshape(x, (-1, 1, h))
        if s == "token":
            return x
        if s in ("group", "tensor_group"):
            return xp.reshape(x, (-1, h // config.group_size, config.group_size))
        raise ValueError(f"strategy={s!r} cannot be applied to activations")
    if x.ndim != 4:
        raise ValueError(f"an attention state must be 4-D (batch, heads, seq, head_dim), got shape {tuple(x.shape)}")
    b, nh, t, d = x.shape
    tokens_first = xp.permute_dims(x, (0, 2, 1, 3))
    if s == "tensor":
        return xp.reshape(tokens_first, (b * t, 1, nh * d))
    if s == "attn_head":
        return xp.reshape(tokens_first, (b * t, nh, 1, 1, d))
    raise ValueError(f"strategy={s!r} cannot be applied to attention states")


# ---------------------------------------------------------------------------------------------- qparams


def _dtype_name(dtype: Any) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _named_dtype(name: str, xp: Any) -> Any:
    dtype = getattr(xp, name, None)
    if dtype is None:
        raise TypeError(f"dtype {name!r} is not available in {getattr(xp, '__name__', xp)}")
    return dtype


def _round_to_float(x: Array, name: str, xp: Any) -> Array:
    """compressed-tensors' ``round_to_quantized_type_dtype`` for a float dtype: clamp to its finite range,
    cast, cast back."""
    top = _FLOAT_MAX[name]
    x = clamp(x, -top, top, xp)
    if name == "float8_e4m3fn":
        return round_to_element(x, MX_ELEMENTS["fp8_e4m3"], xp)
    if _dtype_name(x.dtype) == name:
        return x
    return xp.astype(xp.astype(x, _named_dtype(name, xp)), x.dtype)


def _round_to_int(x: Array, name: str, xp: Any) -> Array:
    """``round(clamp(x, iinfo.min, iinfo.max))`` (values, in ``x``'s dtype)."""
    lo, hi = _INT_RANGE[name]
    return xp.round(clamp(x, float(lo), float(hi), xp))


def _mx_codes(amax: Array, num_bits: int, xp: Any) -> Array:
    """compressed-tensors' ``generate_mx_scales`` then the uint8 rounding, in ``amax``'s dtype: the power of
    two ``amax`` rounds to (mantissa >= 1.75 rounds up; below the smallest normal, ``>= 0.75 * tiny``
    rounds to it, less to 0), ``code = clip(127 + log2(pow2) - offset, 0, 255)`` (0 for 0, 255 for
    Inf/NaN and for a power of two beyond the dtype)."""
    info = xp.finfo(amax.dtype)
    tiny, top_exp = float(info.smallest_normal), math.frexp(float(info.max))[1] - 1
    k, p2k = floor_log2(amax, xp)
    k = k + xp.astype(amax >= p2k * 1.75, k.dtype)
    code = xp.astype(k, amax.dtype) + float(127 - _MX_ELEM_OFFSET[num_bits])
    sub_code = float(127 + (math.frexp(tiny)[1] - 1) - _MX_ELEM_OFFSET[num_bits])
    below = xp.where(amax >= 0.75 * tiny, xp.full_like(code, sub_code), xp.full_like(code, -1.0))
    code = xp.where(amax < tiny, below, code)
    code = xp.where((k > top_exp) | xp.isinf(amax), xp.full_like(code, 255.0), code)
    # NaN: compressed-tensors adds to the bits and masks; a positive quiet NaN becomes +Inf (code 255), a
    # negative one (torch's vectorised max makes 0xFFFFFFFF) -Inf or 0 (code 0)
    nan_code = xp.where(xp.signbit(amax), xp.zeros_like(code), xp.full_like(code, 255.0))
    code = xp.where(xp.isnan(amax), nan_code, code)
    return _round_to_int(code, "uint8", xp)


def calculate_qparams(min_vals: Array, max_vals: Array, config: Config, /, *, global_scale: Array | None = None,
                      xp: Any = None) -> tuple[Array, Array]:
    """compressed-tensors 0.19's ``calculate_qparams``: ``(scale, zero_point)`` (see the module docstring);
    0-d results come back with shape ``(1,)``. Zero points are the rounded values (``zp_dtype``'s)."""
    xp = array_namespace(min_vals, max_vals, xp=xp)
    zeros = xp.zeros_like(min_vals)
    min_vals = xp.minimum(min_vals, zeros) if not _is_torch(xp) else _torch_min(min_vals, zeros)
    max_vals = xp.maximum(max_vals, zeros) if not _is_torch(xp) else _torch_max(max_vals, zeros)
    qmin, qmax = quant_range(config)
    bit_range = qmax - qmin
    if config.symmetric:
        amax = _max2(xp.abs(min_vals), xp.abs(max_vals), xp)
        if config.is_mx:
            scales = _mx_codes(amax, config.num_bits, xp)
        else:
            scales = true_divide(amax, xp.full((), bit_range / 2, dtype=amax.dtype, device=device_of(amax)), xp)
        zero_points = xp.zeros(scales.shape, dtype=min_vals.dtype, device=device_of(min_vals))
    else:
        scales = true_divide(max_vals - min_vals, xp.full((), bit_range, dtype=max_vals.dtype,
                                                          device=device_of(max_vals)), xp)
        zero_points = clamp(qmin - true_divide(min_vals, scales, xp), qmin, qmax, xp)
    if global_scale is not None:
        scales = global_scale * scales
    if config.scale_dtype is not None:
        if config.scale_dtype == "uint8":
            scales = _round_to_int(scales, "uint8", xp)
        else:
            scales = _round_to_float(scales, config.scale_dtype, xp)
    if config.is_mx:
        codes = xp.astype(scales, xp.uint8)
        # 2 ** (code - 127) in float32; code 255 is 2 ** 128 = inf there (OCP's E8M0 reads it as NaN)
        values = xp.where(codes == 255, xp.full(codes.shape, math.inf, dtype=xp.float32, device=device_of(codes)),
                          e8m0_to_float(codes, xp=xp))
        scales = xp.astype(values, scales.dtype)
    eps_name = config.scale_dtype if config.scale_dtype is not None else _dtype_name(scales.dtype)
    eps = 1.0 if eps_name == "uint8" else _FLOAT_EPS[eps_name]
    if not config.is_mx:  # an MX scale 2 ** (code - 127) is never 0 (code 0: a subnormal, which XLA reads as 0)
        scales = xp.where(scales == 0, xp.full((), eps, dtype=scales.dtype, device=device_of(scales)), scales)
    if config.zp_dtype == "float8_e4m3fn":
        zero_points = _round_to_float(zero_points, "float8_e4m3fn", xp)
    else:
        zero_points = xp.astype(_round_to_int(zero_points, config.zp_dtype, xp), _named_dtype(config.zp_dtype, xp))
    if scales.ndim == 0:
        scales, zero_points = xp.reshape(scales, (1,)), xp.reshape(zero_points, (1,))
    return scales, zero_points


def global_scale(min_vals: Array, max_vals: Array, /, *, xp: Any = None) -> Array:
    """compressed-tensors' ``generate_gparam``: ``448 * 6 / max(|min|, |max|, tiny)`` as float32 ``(1,)``, computed as
    torch computes a number over a tensor, ``(1 / amax) * 2688`` (two roundings);
    NaN and +/-Inf (an all-zero or NaN range) become 1."""
    xp = array_namespace(min_vals, max_vals, xp=xp)
    zeros = xp.zeros_like(min_vals)
    amax = _max2(xp.abs(_min2(min_vals, zeros, xp)), xp.abs(_max2(max_vals, zeros, xp)), xp)
    amax = clamp(amax, float(xp.finfo(amax.dtype).smallest_normal), None, xp)
    g = (1.0 / amax) * (FP8_E4M3_MAX * FP4_E2M1_MAX)  # torch's `2688 / tensor` is reciprocal(tensor) * 2688
    g = xp.where(xp.isnan(g) | xp.isinf(g), xp.ones_like(g), g)
    return xp.reshape(xp.astype(g, xp.float32), (1,))


def fused_global_scale(states: list[tuple[Array, Array]], /, *, xp: Any = None) -> Array:
    """llm-compressor's ``get_global_scale`` over a fusion group: ``amax`` = the largest ``max`` and
    ``-min`` of every member's ``(min_vals, max_vals)`` (NaN propagates), then :func:`global_scale`."""
    if not states:
        raise ValueError("states must hold at least one (min_vals, max_vals) pair")
    xp = array_namespace(*[a for pair in states for a in pair], xp=xp)
    amax = xp.max(states[0][1])
    for mn, mx in states:
        amax = _max2(amax, -xp.min(mn), xp)
        amax = _max2(amax, xp.max(mx), xp)
    amax = xp.reshape(amax, (1,))
    return global_scale(-amax, amax, xp=xp)


def _is_torch(xp: Any) -> bool:
    return "torch" in getattr(xp, "__name__", "")


def _torch_min(a: Array, b: Array) -> Array:
    import torch  # only reached with torch tensors

    return torch.min(a, b)


def _torch_max(a: Array, b: Array) -> Array:
    import torch  # only reached with torch tensors

    return torch.max(a, b)


def _min2(a: Array, b: Array, xp: Any) -> Array:
    """Elementwise minimum propagating NaN (torch.min / numpy.minimum)."""
    return _torch_min(a, b) if _is_torch(xp) else xp.minimum(a, b)


def _max2(a: Array, b: Array, xp: Any) -> Array:
    return _torch_max(a, b) if _is_torch(xp) else xp.maximum(a, b)


# ---------------------------------------------------------------------------------------- fake quantize


def _round_values(y: Array, config: Config, xp: Any) -> Array:
    qmin, qmax = quant_range(config)
    y = clamp(y, qmin, qmax, xp)
    if config.type == "int":
        return xp.round(y)
    fmt = MX_ELEMENTS["fp8_e4m3" if config.num_bits == 8 else "fp4_e2m1"]
    return round_to_element(y, fmt, xp)


def fake_quantize(x: Array, scale: Array, zero_point: Array | None, config: Config, /, *,
                  global_scale: Array | None = None, xp: Any = None) -> Array:
    """compressed-tensors' ``_quantize_dequantize`` with ``scale``/``zero_point`` broadcasting against
    ``x``: ``(clamp_round(x / s + zp) - zp) * s`` with ``s = scale / global_scale``, returned in ``x``'s
    dtype. A symmetric ``zero_point`` may be ``None`` (adding zero changes nothing but the sign of 0)."""
    xp = array_namespace(x, xp=xp)
    if global_scale is not None:
        scale = true_divide(scale, global_scale, xp)
    y = true_divide(x, scale, xp)
    if is_jax_namespace(xp):  # XLA reads a subnormal scale (MX code 0, an all-zero block) as 0: 0/0 is NaN there
        y = xp.where((x == 0) & (scale == 0), x, y)
    if zero_point is not None:
        y = y + xp.astype(zero_point, x.dtype)
    q = xp.astype(_round_values(y, config, xp), scale.dtype, copy=False)
    if zero_point is not None:
        q = q - xp.astype(zero_point, scale.dtype)
    return xp.astype(q * scale, x.dtype, copy=False)


# ------------------------------------------------------------------------------------------ grid search


def _candidates(base: Array, factors: Array, xp: Any) -> Array:
    """``base * p`` for every ``p`` (axis 0), as ``tensor * python_float`` computes it: float32 (and
    float64) directly, float16/bfloat16 in float32 then rounded."""
    shape = (factors.shape[0],) + (1,) * base.ndim
    f = xp.reshape(factors, shape)
    if _dtype_name(base.dtype) in ("float32", "float64"):
        return base[None, ...] * xp.astype(f, base.dtype)
    return xp.astype(xp.astype(base, xp.float32)[None, ...] * f, base.dtype)


def error_table(observed: Array, min_vals: Array, max_vals: Array, config: Config, /, *,
                weights: Array | None = None, xp: Any = None) -> tuple[Array, Array, Array]:
    """Every candidate's error: ``(err, cand_min, cand_max)``, each ``(T, *qparam_shape)``.

    ``err[i] = sum over axes (0, -1) of |fq_i(x) - x| ** norm`` (times ``weights``, shaped like
    ``observed``), with ``fq_i`` the fake quantizer of the qparams of ``p_i * [min_vals, max_vals]``.
    Errors are in the observed dtype for ``search="mse"`` and float32 for ``"imatrix"``. Evaluated in
    chunks of the qparams (and of the candidates) holding about ``chunk_elements`` values each."""
    xp = array_namespace(observed, xp=xp)
    cfg = config
    if cfg.strategy == "tensor_group" and cfg.scale_dtype is not None:
        cfg = replace(cfg, scale_dtype=None)  # the search runs without the global scale
    factors_list = config.shrink_factors()
    t = len(factors_list)
    factors = xp.asarray(factors_list, dtype=xp.float32, device=device_of(observed))
    cmin, cmax = _candidates(min_vals, factors, xp), _candidates(max_vals, factors, xp)
    n, gs = observed.shape[0], observed.shape[-1]
    qshape = tuple(observed.shape[1:-1])
    g = size(min_vals) if qshape else 1
    obs3 = xp.reshape(observed, (n, g, gs))
    w3 = None if weights is None else xp.reshape(weights, (n, g, gs))
    cmin2, cmax2 = xp.reshape(cmin, (t, g)), xp.reshape(cmax, (t, g))
    per_group = n * gs
    budget = cfg.chunk_elements
    if per_group * t <= budget:  # every candidate at once, as many groups as fit
        tc, gc = t, max(1, min(g, budget // (per_group * t)))
    else:  # one group at a time, as many candidates as fit
        tc, gc = max(1, min(t, budget // per_group)), 1
    rows = []
    for g0 in range(0, g, gc):
        g1 = min(g, g0 + gc)
        xg = obs3[:, g0:g1, :]
        wg = None if w3 is None else w3[:, g0:g1, :]
        cols = []
        for t0 in range(0, t, tc):
            t1 = min(t, t0 + tc)
            s, z = calculate_qparams(cmin2[t0:t1, g0:g1], cmax2[t0:t1, g0:g1], cfg, xp=xp)
            s4 = s[:, None, :, None]
            z4 = None if cfg.symmetric else z[:, None, :, None]
            q = fake_quantize(xg[None, ...], s4, z4, cfg, xp=xp)
            if cfg.search == "imatrix":
                diff = xp.abs(xp.astype(q, xp.float32) - xp.astype(xg, xp.float32, copy=False)[None, ...])
            else:
                diff = xp.abs(q - xg[None, ...])
            cols.append(_error_sums(diff, wg, cfg, xp))
        rows.append(cols[0] if len(cols) == 1 else xp.concat(cols, axis=0))
    err = rows[0] if len(rows) == 1 else xp.concat(rows, axis=1)
    return xp.reshape(err, (t,) + tuple(min_vals.shape)), cmin, cmax


def _error_sums(diff: Array, weights: Array | None, config: Config, xp: Any) -> Array:
    """``sum over axes (1, 3) of diff ** norm`` (times ``weights`` ``(n, groups, group)`` for
    ``search="imatrix"``) of ``|fq(x) - x|`` laid out ``(candidates, n, groups, group)``."""
    d = diff ** config.norm
    if config.search == "imatrix" and weights is not None:
        d = d * weights[None, ...]
    return xp.sum(d, axis=(1, 3))


def improvements(err: Array, /, *, xp: Any = None) -> Array:
    """``improved[i] = err[i] < min(max, err[0], ..., err[i - 1])`` per group (bool, ``err``'s shape): the
    eager loop's ``err < best_error`` with ``best_error`` starting at the error dtype's max, before any
    stop (NaN never improves)."""
    xp = array_namespace(err, xp=xp)
    best = xp.full(err.shape[1:], float(xp.finfo(err.dtype).max), dtype=err.dtype, device=device_of(err))
    out = []
    for i in range(err.shape[0]):
        e = err[i, ...]
        better = e < best
        best = xp.where(better, e, best)
        out.append(better)
    return xp.stack(out, axis=0)


def pick_steps(improved: Array, config: Config, /, *, xp: Any = None) -> Array:
    """Each group's chosen step (int32, -1: none) from :func:`improvements`: the steps run are those before
    the loop stops, after ``patience`` consecutive steps in which no group improved (imatrix: never when
    ``patience == 0``); the choice is the last improving step among them."""
    xp = array_namespace(improved, xp=xp)
    t = improved.shape[0]
    dev = device_of(improved)
    pick = xp.full(improved.shape[1:], -1, dtype=xp.int32, device=dev)
    stopped = xp.zeros((), dtype=xp.bool, device=dev)
    stale = xp.zeros((), dtype=xp.int32, device=dev)
    reduce_axes = tuple(range(improved.ndim - 1))
    stops = config.patience > 0 or config.search != "imatrix"
    for i in range(t):
        hit = improved[i, ...] & ~stopped
        pick = xp.where(hit, xp.full_like(pick, i), pick)
        any_hit = xp.any(hit, axis=reduce_axes) if reduce_axes else hit
        stale = xp.where(any_hit, xp.zeros_like(stale), stale + 1)
        if stops:
            stopped = stopped | (~any_hit & (stale >= config.patience))
    return pick


def select_candidates(err: Array, cand_min: Array, cand_max: Array, min_vals: Array, max_vals: Array,
                      config: Config, /, *, xp: Any = None) -> tuple[Array, Array]:
    """llm-compressor's stopping rule applied to the whole error table (:func:`improvements`,
    :func:`pick_steps`): the range of each group's last improving step among those run, else
    ``(min_vals, max_vals)``."""
    xp = array_namespace(err, xp=xp)
    pick = pick_steps(improvements(err, xp=xp), config, xp=xp)
    best_min, best_max = min_vals, max_vals
    for i in range(err.shape[0]):
        hit = pick == i
        best_min = xp.where(hit, cand_min[i, ...], best_min)
        best_max = xp.where(hit, cand_max[i, ...], best_max)
    return best_min, best_max


def grid_search(observed: Array, config: Config, /, *, weights: Array | None = None,
                xp: Any = None) -> tuple[Array, Array]:
    """The searched ``(min_vals, max_vals)`` of a flattened batch (see the module docstring). float32 takes
    :func:`_device_search` on the torch CUDA path, :func:`_screened_search` on host arrays (NumPy, torch
    CPU) where numba is available."""
    xp = array_namespace(observed, xp=xp)
    lo = xp.min(observed, axis=(0, observed.ndim - 1))
    hi = xp.max(observed, axis=(0, observed.ndim - 1))
    if config.shrink_factors():
        searched = _device_search(observed, lo, hi, config, weights, xp)
        if searched is not None:
            return searched
    mn, mx = lo * config.expand, hi * config.expand
    if not config.shrink_factors():
        return mn, mx
    screened = _screened_search(observed, mn, mx, config, weights, xp)
    if screened is not None:
        return screened
    err, cmin, cmax = error_table(observed, mn, mx, config, weights=weights, xp=xp)
    return select_candidates(err, cmin, cmax, mn, mx, config, xp=xp)


#: the screen's relative margin stays below this (else the array code runs: most groups would be exact anyway)
_SCREEN_MAX_MARGIN = 2.0**-10
_FLOAT32_MAX = 3.4028234663852886e38


def _screen_margin(observed: Array, config: Config, weights: Array | None) -> float | None:
    """The screen's relative margin ``r = gamma_(c + 20) + SCREEN_ERROR`` for sums of ``c`` values per group
    (see :func:`_screened_search`); ``None`` where the screen does not apply (not float32, ``norm`` above 6,
    a margin above ``_SCREEN_MAX_MARGIN``, subnormals flushed)."""
    from .. import _compiled

    if _dtype_name(observed.dtype) != "float32" or (weights is not None and _dtype_name(weights.dtype) != "float32"):
        return None
    k = (observed.shape[0] * observed.shape[-1] + 20) * 2.0**-24
    rel = k / (1 - k) + _compiled.SCREEN_ERROR
    if rel > _SCREEN_MAX_MARGIN or not 0 < config.norm <= 6 or _flushes_subnormals():
        return None
    return rel


def _search_config(config: Config) -> Config:
    """The config the candidates are quantized with: NVFP4's block scales without the global scale."""
    if config.strategy == "tensor_group" and config.scale_dtype is not None:
        return replace(config, scale_dtype=None)
    return config


def _exact_errors(observed: Array, weights: Array | None, idx: Array, mn: Array, mx: Array, config: Config,
                  xp: Any) -> Array:
    """The array code's error rows (:func:`error_table`, ``(T, len(idx))``) of the groups ``idx`` of the
    flattened ``observed`` (``mn``, ``mx``: those groups' ranges, after ``expand``)."""
    n, gs = observed.shape[0], observed.shape[-1]
    g = size(observed) // (n * gs)
    sub = xp.take(xp.reshape(observed, (n, g, gs)), idx, axis=1)
    w_sub = None if weights is None else xp.take(xp.reshape(weights, (n, g, gs)), idx, axis=1)
    err, _, _ = error_table(sub, mn, mx, config, weights=w_sub, xp=xp)
    return xp.reshape(err, (err.shape[0], -1))


def _device_search(observed: Array, lo: Array, hi: Array, config: Config, weights: Array | None,
                   xp: Any) -> tuple[Array, Array] | None:
    """:func:`grid_search` on the torch CUDA path (float32), from the groups' ranges ``lo``, ``hi`` (before
    ``expand``): one Triton launch screens every candidate of every group and decides each step where the
    bounds of :func:`_screened_search` allow (``_triton_llm.screen``; the candidates' qparams computed in the
    kernel for ints, symmetric floats without ``scale_dtype`` and symmetric MX, else by :func:`calculate_qparams`); the
    undecided groups' rows come from the array code's errors (:func:`_exact_errors`, then
    ``_triton_llm.exact_rows``); an ``amax`` and a second
    launch apply the stopping rule and pick (``_triton_llm.pick``). Reading which groups are undecided is
    the one host read. ``None`` off that path or where the screen does not apply."""
    from .._namespace import triton_route

    if not triton_route(observed, xp=xp):
        return None
    rel = _screen_margin(observed, config, weights)
    if rel is None:
        return None
    from .. import _triton_llm

    if getattr(observed, "requires_grad", False):  # a torch parameter: the search needs no graph
        observed = observed.detach()
    if weights is not None and getattr(weights, "requires_grad", False):
        weights = weights.detach()
    cfg = _search_config(config)
    t, g = len(config.shrink_factors()), size(lo)
    qmin, qmax = quant_range(cfg)
    fmt = _element(cfg)
    args = dict(steps=t, expand=config.expand, grid=config.grid, qmin=qmin, qmax=qmax,
                element=None if fmt is None else (fmt.emin, fmt.mbits), norm=float(np.float32(cfg.norm)), rel=rel,
                slack=float(observed.shape[0] * observed.shape[-1]) * 2.0**-125)
    mx = cfg.is_mx and cfg.symmetric
    if mx or (cfg.scale_dtype is None and (cfg.symmetric or (cfg.type == "int" and cfg.num_bits <= 16
                                                             and cfg.zp_dtype in _INT_RANGE))):
        zp_lo, zp_hi = _INT_RANGE.get(cfg.zp_dtype, (0, 0))
        divisor = (qmax - qmin) / 2 if cfg.symmetric else qmax - qmin
        qp = dict(candidates=(not cfg.symmetric, divisor, zp_lo, zp_hi, _MX_ELEM_OFFSET[cfg.num_bits] if mx else -1))
    else:
        factors = xp.asarray(config.shrink_factors(), dtype=xp.float32, device=device_of(observed))
        cmin = xp.reshape(_candidates(lo * config.expand, factors, xp), (t, g))
        cmax = xp.reshape(_candidates(hi * config.expand, factors, xp), (t, g))
        s, z = calculate_qparams(cmin, cmax, cfg, xp=xp)
        qp = dict(scale=s, zero_point=z, has_zp=not cfg.symmetric)
    improved, unsure = _triton_llm.screen(observed, weights, lo, hi, **args, **qp)
    exact = xp.nonzero(unsure)[0]  # the host read
    e = exact.shape[0]
    if e:
        n, gs = observed.shape[0], observed.shape[-1]
        if n * gs * t <= config.chunk_elements:  # error_table's chunks: every candidate, groups by chunk_elements
            per = max(1, config.chunk_elements // (n * gs * t))
            cols = [_error_sums(
                _triton_llm.exact_diff(observed, lo, hi, exact[e0:e0 + per], **args, **qp),
                None if weights is None else xp.take(xp.reshape(weights, (n, g, gs)), exact[e0:e0 + per], axis=1),
                config, xp) for e0 in range(0, e, per)]
            err = cols[0] if len(cols) == 1 else xp.concat(cols, axis=1)
        else:
            mn = xp.take(xp.reshape(lo, (g,)), exact, axis=0) * config.expand
            mx = xp.take(xp.reshape(hi, (g,)), exact, axis=0) * config.expand
            err = _exact_errors(observed, weights, exact, mn, mx, config, xp)
        _triton_llm.exact_rows(improved, err, exact)
    best_lo, best_hi = _triton_llm.pick(improved, lo, hi, expand=config.expand, grid=config.grid,
                                        patience=config.patience, stops=config.patience > 0 or config.search != "imatrix")
    return xp.reshape(best_lo, tuple(lo.shape)), xp.reshape(best_hi, tuple(hi.shape))


def _screened_search(observed: Array, mn: Array, mx: Array, config: Config, weights: Array | None,
                     xp: Any) -> tuple[Array, Array] | None:
    """:func:`grid_search` on host arrays (NumPy, torch CPU) through the compiled
    :func:`~observers_core._compiled.grid_screen_kernel`, the same result. ``None`` where it does not apply
    (float32 input only; no numba, another namespace or device; see :func:`_screen_margin`).

    The kernel computes every candidate's ``fq(x)`` exactly and ``sum w |fq(x) - x| ** norm`` approximately
    (``A``, float64, within the kernel's ``SCREEN_ERROR``); the array code's float32 error ``E`` (``pow``
    within 8 ulp, the weight's product within 1, a sum of ``c`` positive terms in any order within
    ``gamma_(c - 1)`` of the exact sum) lies in ``[lo, hi] = A (1 -/+ r) -/+ a`` with ``r = gamma_(c + 20) +
    SCREEN_ERROR`` (``gamma_k = k u / (1 - k u)``, ``u = 2**-24``) and ``a = c 2**-125 max(1, max w)`` (a
    subnormal term's error, generously). :func:`_screen_steps`
    decides each step from these bounds; a group with any undecided step (a near tie, a non-finite value)
    has its whole error row computed by :func:`error_table` (the array code's bits) and
    :func:`improvements`; :func:`pick_steps` applies the stopping rule to the merged table."""
    from .. import _compiled

    rel = _screen_margin(observed, config, weights)
    if rel is None or _compiled.grid_screen_kernel is None:
        return None
    if getattr(observed, "requires_grad", False):  # a torch parameter: the search needs no graph
        observed = observed.detach()
    if weights is not None and getattr(weights, "requires_grad", False):
        weights = weights.detach()
    x_np = _compiled.host_view(observed, xp)
    w_np = None if weights is None or x_np is None else _compiled.host_view(weights, xp)
    if x_np is None or (weights is not None and w_np is None):
        return None
    cfg = _search_config(config)
    factors_list = config.shrink_factors()
    t, g, dev = len(factors_list), size(mn), device_of(observed)
    factors = xp.asarray(factors_list, dtype=xp.float32, device=dev)
    cmin = xp.reshape(_candidates(mn, factors, xp), (t, g))
    cmax = xp.reshape(_candidates(mx, factors, xp), (t, g))
    s, z = calculate_qparams(cmin, cmax, cfg, xp=xp)
    z = xp.astype(z, xp.float32)
    norm = float(np.float32(cfg.norm))  # torch's pow takes the exponent as a float32 for float32 tensors
    approx, bad = _screen_on_host(x_np, w_np, _compiled.host_view(s, xp), _compiled.host_view(z, xp), cfg, norm)
    slack = float(observed.shape[0] * observed.shape[-1]) * 2.0**-125
    if weights is not None:
        slack = slack * float(np.maximum(np.max(w_np.astype(np.float64)), 1.0))  # NaN stays NaN: all unsure
    improved, unsure = _screen_steps(approx, bad, rel, slack, np)
    exact = np.nonzero(unsure)[0]
    if exact.shape[0]:
        idx = xp.asarray(exact, device=dev)
        better = improvements(_exact_errors(observed, weights, idx, xp.take(xp.reshape(mn, (g,)), idx, axis=0),
                                            xp.take(xp.reshape(mx, (g,)), idx, axis=0), config, xp), xp=xp)
        improved[:, exact] = np.asarray(_compiled.host_view(better, xp))
    pick = xp.asarray(pick_steps(improved, config, xp=np), device=dev)
    keep = pick >= 0
    chosen = xp.where(keep, xp.astype(pick, xp.int64), xp.zeros_like(xp.astype(pick, xp.int64))) * g + \
        xp.arange(g, dtype=xp.int64, device=dev)
    best_min = xp.where(keep, xp.take(xp.reshape(cmin, (-1,)), chosen, axis=0), xp.reshape(mn, (g,)))
    best_max = xp.where(keep, xp.take(xp.reshape(cmax, (-1,)), chosen, axis=0), xp.reshape(mx, (g,)))
    return xp.reshape(best_min, tuple(mn.shape)), xp.reshape(best_max, tuple(mx.shape))


def _element(config: Config) -> Any:
    """The E4M3 / E2M1 element format of a float config, ``None`` for ints."""
    return MX_ELEMENTS["fp8_e4m3" if config.num_bits == 8 else "fp4_e2m1"] if config.type == "float" else None


def _screen_on_host(x: np.ndarray, w: np.ndarray | None, scale: np.ndarray, zero_point: np.ndarray, config: Config,
                    norm: float) -> tuple[np.ndarray, np.ndarray]:
    """``(approx, bad)`` of :func:`~observers_core._compiled.grid_screen_kernel` for the flattened ``x``
    ``(n, *qparam_shape, group)`` (and weights ``w``), the candidates' ``scale``/``zero_point`` ``(T, G)``: the
    groups as rows of ``n * group`` values, split over :func:`~observers_core._compiled.threads`."""
    from .. import _compiled

    t, g = scale.shape
    n, gs = x.shape[0], x.shape[-1]

    def rows(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(np.reshape(a, (n, g, gs)), 0, 1).reshape(g, n * gs))

    approx, bad = np.zeros((t, g), dtype=np.float64), np.zeros(g, dtype=np.uint8)
    qmin, qmax = quant_range(config)
    fmt = _element(config)
    args = (rows(x), np.zeros((0, 0), dtype=np.float32) if w is None else rows(w), np.ascontiguousarray(scale),
            np.ascontiguousarray(zero_point), not config.symmetric, qmin, qmax, fmt is not None,
            0 if fmt is None else fmt.emin, 0 if fmt is None else fmt.mbits, norm, approx, bad)
    _compiled.split_ranges(_compiled.grid_screen_kernel, g, _compiled.threads(g * n * gs * t, grain=1 << 22), *args,
                           chunk=max(1, (1 << 18) // (n * gs)))
    return approx, bad


def _flushes_subnormals() -> bool:
    """Whether float32 arithmetic on this thread flushes subnormals (``torch.set_flush_denormal(True)``):
    the screen's bounds assume IEEE subnormals."""
    return bool(np.multiply(np.float32(2.0**-140), np.float32(1.0)) == 0)


def _screen_steps(approx: Array, bad: Array, rel: float, slack: Any, xp: Any) -> tuple[Array, Array]:
    """``(improved, unsure)`` from the screen's ``approx`` ``(T, G)``: with ``lo, hi = approx (1 -/+ rel) -/+
    slack`` and the running best ``B`` of the exact errors in ``[min(max, lo[:i]), min(max, hi[:i])]``
    (``max``: float32's), step ``i`` improves for sure when ``hi[i] < min(lo[:i])`` and not when
    ``lo[i] >= min(hi[:i])``; ``unsure[g]``: some step of ``g`` is neither, or ``bad[g]``, or a bound is
    not finite or reaches ``max``."""
    lo = approx * (1.0 - rel) - slack
    hi = approx * (1.0 + rel) + slack
    unsure = (bad != 0) | xp.any(~xp.isfinite(approx), axis=0) | xp.any(hi >= _FLOAT32_MAX, axis=0)
    min_lo = xp.full(approx.shape[1:], _FLOAT32_MAX, dtype=approx.dtype, device=device_of(approx))
    min_hi = min_lo
    rows = []
    for i in range(approx.shape[0]):
        sure = hi[i, ...] < min_lo
        unsure = unsure | ~(sure | (lo[i, ...] >= min_hi))
        min_lo = xp.minimum(min_lo, lo[i, ...])
        min_hi = xp.minimum(min_hi, hi[i, ...])
        rows.append(sure)
    return xp.stack(rows, axis=0), unsure


# -------------------------------------------------------------------------------- state: init / update


def init(config: Config, /, *, qparam_shape: tuple[int, ...], dtype: Any = None, device: Any = None,
         xp: Any = None) -> State:
    """Nothing seen: ``+inf``/``-inf`` of ``qparam_shape`` and ``count = 0``."""
    if xp is None:
        import array_api_compat.numpy as xp
    dtype = xp.float32 if dtype is None else dtype
    return State(xp.full(qparam_shape, math.inf, dtype=dtype, device=device),
                 xp.full(qparam_shape, -math.inf, dtype=dtype, device=device),
                 xp.zeros((), dtype=xp.int64, device=device))


def observe(config: Config, observed: Array, /, *, weights: Array | None = None, xp: Any = None) -> tuple[Array, Array]:
    """One flattened batch's ``(min_vals, max_vals)``: the range over axes ``(0, -1)``, or the grid search."""
    xp = array_namespace(observed, xp=xp)
    if config.search is not None:
        return grid_search(observed, config, weights=weights, xp=xp)
    return xp.min(observed, axis=(0, observed.ndim - 1)), xp.max(observed, axis=(0, observed.ndim - 1))


def update(config: Config, state: State, observed: Array, /, *, weights: Array | None = None, collective: Any = None,
           xp: Any = None) -> State:
    """The state after one flattened batch (an empty batch changes nothing, as llm-compressor). With a
    ``collective`` (:class:`observers_core.Collective`), the batch range is reduced across the group first
    (every member then holds the state of one process on all members' batches; an empty batch
    contributes ``+inf``/``-inf``); not with a search (weights are replicated: search on each member)."""
    xp = array_namespace(observed, xp=xp)
    check_collective(collective)
    if collective is not None and config.search is not None:
        raise ValueError(f"collective= is not supported with search={config.search!r}: a weight is the same on "
                         "every member; search it on each")
    if size(observed) == 0:
        if collective is None:
            return state
        mn = xp.full(state.min_vals.shape, math.inf, dtype=state.min_vals.dtype, device=device_of(state.min_vals))
        mx = xp.full(state.max_vals.shape, -math.inf, dtype=state.max_vals.dtype, device=device_of(state.max_vals))
    else:
        mn, mx = observe(config, observed, weights=weights, xp=xp)
    if tuple(mn.shape) != tuple(state.min_vals.shape):
        raise ValueError(f"observed has qparam shape {tuple(mn.shape)}, the state {tuple(state.min_vals.shape)}")
    mn, mx = reduce_range(mn, mx, collective)
    first = state.count == 0
    if config.mode == "static":
        mn = xp.where(first, mn, _min2(mn, state.min_vals, xp))
        mx = xp.where(first, mx, _max2(mx, state.max_vals, xp))
    elif config.mode == "moving" and config.averaging_constant != 1.0:
        c = config.averaging_constant
        mn = xp.where(first, mn, rounded(state.min_vals * (1.0 - c), xp) + rounded(mn * c, xp))
        mx = xp.where(first, mx, rounded(state.max_vals * (1.0 - c), xp) + rounded(mx * c, xp))
    return State(mn, mx, state.count + 1)


def merge(config: Config, a: State, b: State, /, *, xp: Any = None) -> State:
    """``"static"``: the elementwise min/max (exactly the range of both shards); ``"memoryless"``: ``b``
    (the later batch). A moving average has no exact merge (ValueError): sync its batches instead."""
    xp = array_namespace(a.min_vals, xp=xp)
    if config.mode == "memoryless":
        later = b.count > 0
        return State(xp.where(later, b.min_vals, a.min_vals), xp.where(later, b.max_vals, a.max_vals),
                     a.count + b.count)
    if config.mode == "moving":
        raise ValueError("mode='moving' has no exact merge: a moving average depends on the batch order")
    return State(_min2(a.min_vals, b.min_vals, xp), _max2(a.max_vals, b.max_vals, xp), a.count + b.count)


def qparams(config: Config, state: State, /, *, global_scale: Array | None = None, xp: Any = None) -> QParams:
    """:func:`calculate_qparams` of the state (``tensor_group``: with ``global_scale``, default the
    state's own :func:`global_scale`)."""
    xp = array_namespace(state.min_vals, xp=xp)
    if config.strategy == "tensor_group" and global_scale is None:
        global_scale = fused_global_scale([(state.min_vals, state.max_vals)], xp=xp)
    scale, zp = calculate_qparams(state.min_vals, state.max_vals, config, global_scale=global_scale, xp=xp)
    return QParams(scale, zp, global_scale)


# ------------------------------------------------------------------------------------------ importance


def importance_init(channels: int, /, *, device: Any = None, xp: Any = None) -> Importance:
    """Zero sums of ``channels`` input channels, count 0."""
    if xp is None:
        import array_api_compat.numpy as xp
    check_int(channels, "channels", minimum=0)
    return Importance(xp.zeros((channels,), dtype=xp.float32, device=device),
                      xp.zeros((), dtype=xp.int64, device=device))


def importance_update(state: Importance, x: Array, /, *, collective: Any = None, xp: Any = None) -> Importance:
    """Adds ``sum over tokens of x^2`` (float32) per last-axis channel and the token count (with a
    ``collective``: every member's, summed across the group)."""
    xp = array_namespace(x, xp=xp)
    check_collective(collective)
    if x.shape[-1] != state.sum.shape[0]:
        raise ValueError(f"x has {x.shape[-1]} channels on its last axis, the state {state.sum.shape[0]}")
    xf = xp.astype(x, xp.float32)
    tokens = math.prod(x.shape[:-1])
    part = xp.sum(xf**2, axis=tuple(range(x.ndim - 1))) if x.ndim > 1 else xf**2
    count = xp.full((), tokens, dtype=state.count.dtype, device=device_of(state.count))
    if collective is not None:
        part, count = collective.sum(part), collective.sum(count)
    return Importance(state.sum + part, state.count + count)


def importance_merge(a: Importance, b: Importance, /) -> Importance:
    """Sums and counts added (a DDP all-reduce SUM): merging shards in batch order gives the single pass."""
    return Importance(a.sum + b.sum, a.count + b.count)


def importance(state: Importance, /, *, xp: Any = None) -> Array:
    """``E[x^2]`` per input channel: ``sum / count`` (float32)."""
    xp = array_namespace(state.sum, xp=xp)
    return true_divide(state.sum, xp.astype(state.count, xp.float32), xp)


def normalized_importance(imp: Array, /, *, xp: Any = None) -> Array:
    """``imp / (mean(imp) + tiny)`` in float32 (llm-compressor's normalisation)."""
    xp = array_namespace(imp, xp=xp)
    imp = xp.astype(imp, xp.float32)
    return true_divide(imp, xp.mean(imp) + _FLOAT32_TINY, xp)


#: strategies whose search llm-compressor weights by importance (per input channel of a weight)
IMPORTANCE_STRATEGIES = ("channel", "group", "tensor_group")


def importance_weights(state: Importance, config: Config, shape: tuple[int, int], /, *,
                       xp: Any = None) -> tuple[Array | None, str]:
    """The error weights of a weight of ``shape`` ``(rows, cols)``: normalised ``E[x^2]`` per input channel
    laid out as :func:`flatten` lays out the weight, and ``""``; or ``(None, reason)`` where llm-compressor
    falls back to the uniform search (a strategy other than channel/group/tensor_group, no tokens, a
    non-finite, negative or all-zero importance, a channel count other than ``cols``)."""
    xp = array_namespace(state.sum, xp=xp)
    rows, cols = shape
    if config.strategy not in IMPORTANCE_STRATEGIES:
        return None, f"strategy {config.strategy!r} is not importance-weighted"
    if int(state.count) == 0:
        return None, "no importance data"
    imp = importance(state, xp=xp)
    if not bool(xp.all(xp.isfinite(imp))) or bool(xp.any(imp < 0)) or bool(xp.all(imp == 0)):
        return None, "non-finite, negative or all-zero importance"
    if imp.shape[0] != cols:
        return None, f"importance has {imp.shape[0]} channels, the weight {cols} columns"
    imp = normalized_importance(imp, xp=xp)
    return flatten(xp.broadcast_to(imp[None, :], (rows, cols)), config, role="weight", xp=xp), ""
