"""Array-namespace helpers shared by the core: one place that knows about backends."""

from __future__ import annotations

import math
from typing import Any

import array_api_compat
from array_api_compat import (
    is_cupy_namespace,
    is_jax_namespace,
    is_numpy_namespace,
    is_torch_namespace,
)

__all__ = [
    "array_namespace",
    "size",
    "index_dtype",
    "normalize_axis",
    "check_real",
    "is_torch_namespace",
    "is_jax_namespace",
    "is_numpy_namespace",
    "is_cupy_namespace",
]

Array = Any


def array_namespace(*arrays: Array, xp: Any = None) -> Any:
    """The array-API namespace of ``arrays`` (``xp`` wins when given)."""
    if xp is not None:
        return xp
    return array_api_compat.array_namespace(*arrays)


def size(x: Array) -> int:
    """Number of elements, from the static shape (safe under ``jax.jit``)."""
    return math.prod(x.shape)


def index_dtype(xp: Any) -> Any:
    """The namespace's default index dtype: int64, or int32 on JAX without x64."""
    return xp.__array_namespace_info__().default_dtypes()["indexing"]


def normalize_axis(axis: int, ndim: int, *, name: str = "axis") -> int:
    """``axis`` as a non-negative int in ``[0, ndim)``; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{name} must be an int, got {type(axis).__name__} {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"{name}={axis} is out of range for an input with {ndim} dimension(s); "
            f"allowed: {-ndim} <= {name} < {ndim}" if ndim else
            f"{name}={axis} needs an input with at least one dimension, got a 0-d input"
        )
    return axis % ndim


def check_real(x: Array, xp: Any, *, name: str = "x") -> None:
    """``TypeError`` unless ``x`` holds real numbers (floating or integer, not bool or complex)."""
    if not (xp.isdtype(x.dtype, "real floating") or xp.isdtype(x.dtype, "integral")):
        raise TypeError(f"{name} must hold real floating or integer values, got dtype {x.dtype}")
