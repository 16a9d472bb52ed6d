"""Quantized dtypes, quantization schemes and the resolved quantization spec.

Everything here is plain Python: names instead of framework dtypes, an Enum for the scheme, and a
frozen (hashable, so ``jax.jit``-static) :class:`QuantSpec` that carries the resolved integer range.
The range rules are exactly those of ``torch.ao.quantization.utils.calculate_qmin_qmax`` and
``validate_qmin_qmax`` (torch 2.13), with ``ValueError`` instead of ``AssertionError``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ._validate import UnsupportedConfigError, check_eps

__all__ = [
    "DTYPE_ALIASES",
    "QUANT_DTYPES",
    "QScheme",
    "QuantSpec",
    "calculate_qmin_qmax",
    "check_granularity",
    "quant_spec",
    "validate_qmin_qmax",
]

FLOAT32_EPS = float(np.finfo(np.float32).eps)

#: Quantized dtypes accepted by the uniform observers (the set torch 2.13's observers accept).
QUANT_DTYPES = (
    "qint8",
    "quint8",
    "quint4x2",
    "qint32",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "float8_e4m3fn",
    "float8_e5m2",
)

#: Other names for dtypes of :data:`QUANT_DTYPES` (Horizon's ``horizon_plugin_pytorch`` names), resolved by
#: :func:`parse_dtype` to the canonical name: the range rules are those of the canonical dtype.
DTYPE_ALIASES = {"qint16": "int16", "quint16": "uint16", "quint4": "quint4x2"}

_SIGNED_8 = ("qint8", "int8")
_UNSIGNED_8 = ("quint8", "uint8")
_INT_32 = ("qint32", "int32")


class QScheme(enum.Enum):
    """How scale and zero point are chosen and over which elements they are shared.

    - ``PER_TENSOR_AFFINE`` / ``PER_CHANNEL_AFFINE``:
      ``s = (max(x_max, 0) - min(x_min, 0)) / (Q_max - Q_min)``, ``z = Q_min - round(min(x_min, 0) / s)``.
    - ``PER_TENSOR_SYMMETRIC`` / ``PER_CHANNEL_SYMMETRIC``:
      ``s = max(-min(x_min, 0), max(x_max, 0)) / ((Q_max - Q_min) / 2)``, ``z`` fixed by the dtype.
    - ``PER_CHANNEL_AFFINE_FLOAT_QPARAMS``: ``s = (x_max - x_min) / (Q_max - Q_min)``, ``z = -x_min / s``
      (a float zero point).
    """

    PER_TENSOR_AFFINE = "per_tensor_affine"
    PER_TENSOR_SYMMETRIC = "per_tensor_symmetric"
    PER_CHANNEL_AFFINE = "per_channel_affine"
    PER_CHANNEL_SYMMETRIC = "per_channel_symmetric"
    PER_CHANNEL_AFFINE_FLOAT_QPARAMS = "per_channel_affine_float_qparams"

    @property
    def is_per_tensor(self) -> bool:
        return self in (QScheme.PER_TENSOR_AFFINE, QScheme.PER_TENSOR_SYMMETRIC)

    @property
    def is_per_channel(self) -> bool:
        return not self.is_per_tensor

    @property
    def is_symmetric(self) -> bool:
        return self in (QScheme.PER_TENSOR_SYMMETRIC, QScheme.PER_CHANNEL_SYMMETRIC)

    @classmethod
    def parse(cls, qscheme: "QScheme | str", *, name: str = "qscheme") -> "QScheme":
        """A ``QScheme`` from itself or its name (``"per_tensor_affine"``...); ``ValueError`` otherwise."""
        if isinstance(qscheme, QScheme):
            return qscheme
        if isinstance(qscheme, str):
            key = qscheme.removeprefix("torch.")
            for member in cls:
                if member.value == key:
                    return member
        allowed = ", ".join(m.value for m in cls)
        raise ValueError(f"{name}={qscheme!r} is not a known quantization scheme; allowed: {allowed}")


def check_granularity(qscheme: QScheme, owner: str, *, per_channel: bool) -> None:
    """:class:`~observers_core._validate.UnsupportedConfigError` unless ``qscheme`` is per channel exactly
    when the observer class ``owner`` is."""
    if qscheme.is_per_channel != per_channel:
        allowed = [m.value for m in QScheme if m.is_per_channel == per_channel]
        raise UnsupportedConfigError(
            f"qscheme={qscheme.value!r} is not supported by {owner}; allowed: {', '.join(allowed)}")


def parse_dtype(dtype: str, *, name: str = "dtype") -> str:
    """The canonical quantized dtype name (``"torch.qint8"`` and ``"qint8"`` both give ``"qint8"``; the
    aliases of :data:`DTYPE_ALIASES` give their canonical name: ``"qint16"`` -> ``"int16"``)."""
    if isinstance(dtype, str):
        key = dtype.removeprefix("torch.")
        key = DTYPE_ALIASES.get(key, key)
        if key in QUANT_DTYPES:
            return key
    allowed = ", ".join(QUANT_DTYPES + tuple(DTYPE_ALIASES))
    raise ValueError(f"{name}={dtype!r} is not a supported quantized dtype; allowed: {allowed}")


def validate_qmin_qmax(quant_min: int, quant_max: int) -> None:
    """Check a user-specified range: ``quant_min <= 0 <= quant_max`` and ``quant_min < quant_max``."""
    for arg, value in (("quant_min", quant_min), ("quant_max", quant_max)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{arg} must be an int, got {type(value).__name__} {value!r}")
    if not quant_min <= 0 <= quant_max:
        raise ValueError(
            f"the quantization range [quant_min={quant_min}, quant_max={quant_max}] must include 0"
        )
    if quant_min >= quant_max:
        raise ValueError(f"quant_min={quant_min} must be strictly less than quant_max={quant_max}")


def calculate_qmin_qmax(
    quant_min: int | None,
    quant_max: int | None,
    has_customized_qrange: bool,
    dtype: str,
    reduce_range: bool,
) -> tuple[int, int]:
    """The actual ``(quant_min, quant_max)`` for ``dtype``, as torch computes it.

    Defaults: qint8/int8 ``[-128, 127]`` (``[-64, 63]`` reduced), quint8/uint8 ``[0, 255]`` (``[0, 127]``),
    qint32/int32 ``[-2**31, 2**31 - 1]``, uint16 ``[0, 2**16 - 1]``, int16 ``[-2**15, 2**15 - 1]``, and
    ``[0, 15]`` for everything else (quint4x2 and, as in torch, the float8 dtypes).
    A custom range is halved (floor) when ``reduce_range``; its length is checked for 8- and 32-bit ints.
    """
    dtype = parse_dtype(dtype)
    if has_customized_qrange:
        qrange_len = quant_max - quant_min + 1
        if dtype in _SIGNED_8 and not 0 < qrange_len <= 256:
            raise ValueError(
                f"quantization range [quant_min={quant_min}, quant_max={quant_max}] must be positive "
                f"and not exceed the 8-bit range (256 values) for dtype={dtype}"
            )
        if dtype in _INT_32 and not 0 < qrange_len <= 2**32:
            raise ValueError(
                f"quantization range [quant_min={quant_min}, quant_max={quant_max}] must be positive "
                f"and not exceed the 32-bit range (2**32 values) for dtype={dtype}"
            )
        if reduce_range:
            quant_min, quant_max = quant_min // 2, quant_max // 2
        return int(quant_min), int(quant_max)
    if dtype in _SIGNED_8:
        return (-64, 63) if reduce_range else (-128, 127)
    if dtype in _UNSIGNED_8:
        return (0, 127) if reduce_range else (0, 255)
    if dtype in _INT_32:
        return -(2**31), 2**31 - 1
    if dtype == "uint16":
        return 0, 2**16 - 1
    if dtype == "int16":
        return -(2**15), 2**15 - 1
    return 0, 15


@dataclass(frozen=True)
class QuantSpec:
    """A validated, resolved quantization configuration (hashable: usable as a static jit argument).

    Build it with :func:`quant_spec`; ``quant_min``/``quant_max`` here are the resolved range.
    """

    dtype: str = "quint8"
    qscheme: QScheme = QScheme.PER_TENSOR_AFFINE
    quant_min: int = 0
    quant_max: int = 255
    has_customized_qrange: bool = False
    eps: float = FLOAT32_EPS

    @property
    def symmetric_zero_point(self) -> int:
        """The fixed zero point of symmetric schemes: 128 for (q)uint8 (the custom range's floor midpoint),
        2**15 for uint16, 0 otherwise."""
        if self.dtype in _UNSIGNED_8:
            if self.has_customized_qrange:
                return (self.quant_min + self.quant_max) // 2
            return 128
        if self.dtype == "uint16":
            return 2**15
        return 0


def quant_spec(
    dtype: str = "quint8",
    qscheme: QScheme | str = QScheme.PER_TENSOR_AFFINE,
    *,
    reduce_range: bool = False,
    quant_min: int | None = None,
    quant_max: int | None = None,
    eps: float = FLOAT32_EPS,
) -> QuantSpec:
    """Validate an observer configuration and resolve its integer range, as torch's observers do.

    A custom range is used only when both ``quant_min`` and ``quant_max`` are given (as in torch). A custom
    range that ``reduce_range`` halves to one level (``[0, 1]`` -> ``[0, 0]``) is a ``ValueError`` (torch.ao
    accepts it and returns ``scale = inf``).
    """
    dtype = parse_dtype(dtype)
    qscheme = QScheme.parse(qscheme)
    if not isinstance(reduce_range, (bool, np.bool_)):
        raise TypeError(f"reduce_range must be a bool, got {type(reduce_range).__name__} {reduce_range!r}")
    eps = check_eps(eps)
    has_customized_qrange = quant_min is not None and quant_max is not None
    if has_customized_qrange:
        validate_qmin_qmax(quant_min, quant_max)
    qmin, qmax = calculate_qmin_qmax(quant_min, quant_max, has_customized_qrange, dtype, bool(reduce_range))
    if qmin == qmax:  # only [0, 1] halved: [0 // 2, 1 // 2] = [0, 0] (torch.ao accepts it, its scale is inf)
        raise ValueError(
            f"quant_min={quant_min}, quant_max={quant_max} with reduce_range=True leave one level [{qmin}, {qmax}] "
            f"(reduce_range halves the range), so the scale would be infinite; widen the range or pass "
            f"reduce_range=False"
        )
    spec = QuantSpec(dtype, qscheme, qmin, qmax, has_customized_qrange, eps)
    check_int32_zero_points(spec, f"quant_min={quant_min}, quant_max={quant_max}")
    return spec


def check_int32_zero_points(spec: QuantSpec, given: str) -> None:
    """``ValueError`` unless ``spec``'s zero points fit int32: an affine scheme's whole range (torch accepts a
    longer one, e.g. for quint8, and wraps the zero point around), a symmetric scheme's fixed zero point
    (torch gives int64 there; JAX without x64 has int32 only). ``given``: the range as the user gave it."""
    qmin, qmax = spec.quant_min, spec.quant_max
    if spec.qscheme in (QScheme.PER_TENSOR_AFFINE, QScheme.PER_CHANNEL_AFFINE) and not -(2**31) <= qmin <= qmax < 2**31:
        raise ValueError(
            f"{given} give the range [{qmin}, {qmax}]; affine zero points are int32, so it must lie within "
            f"[{-(2**31)}, {2**31 - 1}]"
        )
    if spec.qscheme.is_symmetric and not -(2**31) <= spec.symmetric_zero_point < 2**31:
        raise ValueError(
            f"{given} give the symmetric zero point {spec.symmetric_zero_point}, outside int32 "
            f"[{-(2**31)}, {2**31 - 1}]; use a narrower range"
        )
