"""``FixedQParamsObserver``'s rules, one place for every framework: its configuration, and the fixed scale and
zero point given to its constructor or loaded from a state dict (:func:`check_fixed_qparams`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._dtypes import QuantSpec, check_granularity, quant_spec
from ._state_dict import EXTENSION_FLOATS, check_entry, host_array
from ._validate import UnsupportedConfigError, check_bool

__all__ = ["check_fixed_observer", "check_fixed_qparams", "one_number"]

OWNER = "FixedQParamsObserver"


def one_number(value: Any, name: str) -> float:
    """``value`` (a Python or NumPy number, or a one-element array of any framework) as a float; ``TypeError``
    for a bool, a string or anything else that is not a real number, ``ValueError`` for other sizes."""
    arr = None
    if not isinstance(value, (bool, np.bool_, str, bytes)):
        try:
            arr = host_array(value, name)
        except TypeError:
            pass
    if arr is None or (arr.dtype.kind not in "fiu" and arr.dtype.name not in EXTENSION_FLOATS):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if arr.size != 1:
        raise ValueError(f"{name} must be one number, got shape {arr.shape}")
    return float(arr.reshape(-1)[0])


def check_fixed_qparams(scale: Any, zero_point: Any, quant_min: int, quant_max: int, *, loaded: bool = False
                        ) -> tuple[np.ndarray, np.ndarray]:
    """A fixed ``scale`` and ``zero_point`` (each :func:`one_number`) as float32 and int32 arrays of shape
    ``(1,)``: ``scale`` positive and finite in float32, ``zero_point`` an integer in ``[quant_min, quant_max]``.
    ``loaded``: state-dict entries, which must also have shape ``(1,)`` (errors name ``state_dict[...]``)."""
    s_name, z_name = "scale", "zero_point"
    if loaded:
        scale, zero_point = check_entry(scale, s_name, (1,)), check_entry(zero_point, z_name, (1,))
        s_name, z_name = f"state_dict[{s_name!r}]", f"state_dict[{z_name!r}]"
    s, z = one_number(scale, s_name), one_number(zero_point, z_name)
    with np.errstate(over="ignore", under="ignore"):
        s32 = np.asarray([s], dtype=np.float32)
    if not (np.isfinite(s32[0]) and s32[0] > 0):
        raise ValueError(f"{s_name}={s!r} must be a positive finite number (as float32)")
    if not (np.isfinite(z) and z == np.floor(z)):
        raise ValueError(f"{z_name}={z!r} must be an integer")
    if not quant_min <= z <= quant_max:
        raise ValueError(f"{z_name}={int(z)} must lie in [quant_min={quant_min}, quant_max={quant_max}]")
    return s32, np.asarray([z], dtype=np.int32)


def check_fixed_observer(scale: Any, zero_point: Any, *, dtype: Any, qscheme: Any, quant_min: Any, quant_max: Any,
                         is_dynamic: Any) -> tuple[QuantSpec, np.ndarray, np.ndarray]:
    """A ``FixedQParamsObserver``'s arguments (dtype and qscheme as the core's names) checked: not dynamic
    (``UnsupportedConfigError``: torch raises ``NotImplementedError``), the range by
    :func:`~observers_core.quant_spec`'s rules (``None``: the dtype's), a per-tensor qscheme, then
    :func:`check_fixed_qparams`. Returns ``(spec, scale, zero_point)``."""
    if check_bool(is_dynamic, "is_dynamic"):
        raise UnsupportedConfigError(f"is_dynamic=True is not supported by {OWNER} (its qparams are fixed)")
    spec = quant_spec(dtype, qscheme, quant_min=quant_min, quant_max=quant_max)
    check_granularity(spec.qscheme, OWNER, per_channel=False)
    return (spec, *check_fixed_qparams(scale, zero_point, spec.quant_min, spec.quant_max))
