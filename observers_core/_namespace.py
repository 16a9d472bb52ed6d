"""Array-namespace helpers shared by the core: one place that knows about backends."""

from __future__ import annotations

import functools

import contextlib
import math
import sys
from collections import OrderedDict
from typing import Any

import array_api_compat
from array_api_compat import device as device_of
from array_api_compat import (
    is_cupy_namespace,
    is_jax_namespace,
    is_numpy_namespace,
    is_torch_namespace,
)

__all__ = [
    "array_namespace",
    "namespace_of",
    "bincount",
    "bincount_weighted",
    "cummin",
    "float64_scope",
    "from_host",
    "take",
    "channel_rows",
    "device_of",
    "explicit_replicated",
    "is_finite",
    "size",
    "index_dtype",
    "normalize_axis",
    "check_real",
    "check_same_device",
    "clamp",
    "discarded_invalid",
    "divide_by_constant",
    "work_dtype",
    "device_constant",
    "scalar_like",
    "rounded",
    "is_torch_namespace",
    "is_jax_namespace",
    "is_numpy_namespace",
    "is_cupy_namespace",
    "is_traced",
    "midpoint",
    "read_flags",
]

Array = Any


def array_namespace(*arrays: Array, xp: Any = None) -> Any:
    """The array-API namespace of ``arrays`` (``xp`` wins when given, through :func:`namespace_of`)."""
    if xp is not None:
        return namespace_of(xp)
    return array_api_compat.array_namespace(*arrays)


_NAMESPACES: dict[Any, Any] = {}


def namespace_of(xp: Any) -> Any:
    """``xp`` as the namespace ``array_api_compat.array_namespace`` gives for its arrays: the
    array-API namespaces (``array_api_compat.*``, ``jax.numpy``, ``array_api_strict``) as they are, a
    framework module (``numpy``, ``torch``, ``cupy``) as its array-api-compat wrapper; ``TypeError``
    naming ``xp`` otherwise. Resolved once per module."""
    try:
        return _NAMESPACES[xp]
    except (KeyError, TypeError):
        pass
    if getattr(xp, "__name__", "").startswith(("array_api_compat.", "array_api_strict", "jax.numpy")):
        resolved = xp
    else:
        try:
            resolved = array_api_compat.array_namespace(xp.asarray(0))
        except (AttributeError, TypeError) as err:
            raise TypeError(
                f"xp={xp!r} is not an array namespace; allowed: numpy, torch, jax.numpy, cupy, array_api_strict "
                "or their array_api_compat namespaces"
            ) from err
    try:
        _NAMESPACES[xp] = resolved
    except TypeError:  # unhashable: resolve each time
        pass
    return resolved


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
    """``TypeError`` unless ``x`` holds real numbers (floating or integer, not bool or complex). A NumPy
    array of an ml_dtypes float (bfloat16, float8_*), which NumPy's ``isdtype`` refuses, is named as such."""
    try:
        real = xp.isdtype(x.dtype, "real floating") or xp.isdtype(x.dtype, "integral")
    except TypeError:  # NumPy: a dtype it does not know (ml_dtypes)
        raise TypeError(f"{name} must hold real floating or integer values, got dtype {x.dtype}, which NumPy's "
                        f"array API does not count as real: cast {name} to float32 first") from None
    if not real:
        raise TypeError(f"{name} must hold real floating or integer values, got dtype {x.dtype}")


def check_broadcasts(shape: Any, **arrays: Array) -> None:
    """``ValueError`` naming the first of ``arrays`` whose shape does not broadcast against ``shape`` (``x``'s),
    instead of the backend's own error, which names neither."""
    for name, a in arrays.items():
        own = tuple(getattr(a, "shape", ()))
        if len(own) > 1 or (own and own[0] != 1):  # (a scalar or a single value broadcasts against anything)
            if any(m != n and m != 1 and n != 1 for m, n in zip(reversed(own), reversed(tuple(shape)))):
                raise ValueError(f"{name} has shape {own}, which does not broadcast against x's shape {tuple(shape)}")


def along_axis(shape: Any, axis: int, xp: Any, **arrays: Array) -> list:
    """``arrays`` (one value per channel of an ``x`` of ``shape`` along the normalised ``axis``) reshaped to
    broadcast against ``x`` there; ``ValueError`` naming the first that does not hold one value per channel."""
    n = shape[axis]
    for name, a in arrays.items():
        if size(a) != n:
            raise ValueError(f"{name} must hold one value per channel along axis={axis} ({n}), got shape {tuple(a.shape)}")
    target = tuple(n if i == axis else 1 for i in range(len(shape)))
    return [xp.reshape(a, target) for a in arrays.values()]


#: Set by :func:`observers_core.testing.cuda_path_on_cpu` (never by hand): torch CPU tensors then take the
#: torch CUDA path (:func:`torch_cuda_path`). A module global read at every step, not a context variable:
#: the context manager is for tests and benchmarks, one thread at a time.
CUDA_PATH_ON_CPU = False
#: Called as ``listener(kernel_name, entering)`` around every Triton launch (``_triton_kernels.launch``):
#: :func:`observers_core.testing.count_launches` counts them
LAUNCH_LISTENERS: list = []


def torch_cuda_path(x: Array) -> bool:
    """Whether the torch tensor ``x`` takes the torch CUDA path: it is on a CUDA device, or on the CPU
    inside :func:`observers_core.testing.cuda_path_on_cpu`. The one predicate every torch device branch of
    the core asks (with :func:`on_host`, its negation for torch)."""
    kind = x.device.type
    return kind == "cuda" or (CUDA_PATH_ON_CPU and kind == "cpu")


def on_host(x: Array, xp: Any) -> bool:
    """Whether ``x`` is an eager array in host memory (NumPy, torch CPU), where a data-dependent branch
    costs nothing and saves computing the branches not taken (torch CPU tensors: not inside
    :func:`observers_core.testing.cuda_path_on_cpu`, where they take the CUDA path)."""
    return is_numpy_namespace(xp) or (is_torch_namespace(xp) and x.device.type == "cpu" and not CUDA_PATH_ON_CPU)


def triton_route(*arrays: Array, xp: Any) -> bool:
    """Whether a step on these torch tensors runs the Triton kernels (``observers_core/_triton_kernels.py``):
    torch tensors on the CUDA path (:func:`torch_cuda_path`; inside ``cuda_path_on_cpu()`` the kernels run
    through Triton's interpreter), triton importable, and ``OBSERVERS_CORE_NO_TRITON`` unset (or ``0``)."""
    return (is_torch_namespace(xp) and all(torch_cuda_path(a) for a in arrays) and _triton_available())


@functools.lru_cache(maxsize=None)
def _triton_available() -> bool:
    import importlib.util
    import os

    if os.environ.get("OBSERVERS_CORE_NO_TRITON", "") not in ("", "0"):
        return False
    return importlib.util.find_spec("triton") is not None


def check_same_device(x: Array, state: Array, xp: Any, *, name: str = "x") -> None:
    """``ValueError`` unless ``x`` is on the device of ``state`` (an array of the running state), for the
    eager GPU frameworks (torch, CuPy), whose own error for mixed devices names neither argument."""
    if is_torch_namespace(xp) or is_cupy_namespace(xp):
        here, there = x.device, state.device  # both arrays' own attribute (array_api_compat.device costs ~20 calls)
        if here != there:
            raise ValueError(f"{name} is on {here} but the state is on {there}: make the state on {name}'s device "
                             f"(the init function's device=) or move {name} there")


def scalar_like(value: float, like: Array, xp: Any, dtype: Any = None) -> Array:
    """A 0-d array holding ``value``, with ``like``'s dtype (or ``dtype``) on ``like``'s device.

    Made with ``full``, a fill on the device: ``asarray`` of a Python number builds it on the host and
    copies it over, which on CUDA waits for the device (a host synchronisation in every update)."""
    return xp.full((), value, dtype=like.dtype if dtype is None else dtype, device=device_of(like))


#: the GPU copies made by :func:`device_constant`, most recently used last
_DEVICE_CONSTANTS: OrderedDict = OrderedDict()


def device_constant(table: Any, xp: Any, device: Any, dtype: Any = None) -> Array:
    """The NumPy array ``table`` as an array of ``xp`` on ``device``. ``table`` is a constant the caller
    keeps (an ``lru_cache``'d table of powers of two or indices, never written to). On a GPU (torch not on
    the CPU, CuPy) each such table is copied once per device and reused (the 64 most recent): a copy from
    host memory waits for the device. The cache is keyed by the table object itself (it holds a
    reference, so the key cannot be reused by another array)."""
    on_gpu = is_cupy_namespace(xp) or (is_torch_namespace(xp) and device is not None and str(device) != "cpu")
    if not on_gpu:
        return xp.asarray(table, dtype=dtype, device=device)
    if device is None:  # CuPy: the current device
        import cupy  # only reached with cupy

        device = cupy.cuda.Device()
    key = (id(table), xp.__name__, str(device), str(dtype))
    if key not in _DEVICE_CONSTANTS:
        _DEVICE_CONSTANTS[key] = (table, xp.asarray(table, dtype=dtype, device=device))
        if len(_DEVICE_CONSTANTS) > 64:
            _DEVICE_CONSTANTS.popitem(last=False)
    _DEVICE_CONSTANTS.move_to_end(key)
    return _DEVICE_CONSTANTS[key][1]


def is_finite(x: Array, xp: Any) -> Array:
    """``isfinite(x)`` for a real floating ``x`` as ``|x| < inf`` (NaN compares false): two kernels on a
    GPU where torch's ``isfinite`` launches four (the 0-d range logic of the device paths is launch-bound)."""
    return xp.abs(x) < float("inf")


def clamp(x: Array, low: float | None, high: float | None, xp: Any) -> Array:
    """``min(max(x, low), high)`` for Python-number bounds (``None``: that side open), NaN kept. torch:
    ``torch.clamp`` (one kernel; the bounds travel as kernel arguments). Elsewhere the bounds go in as 0-d
    arrays on ``x``'s device (:func:`scalar_like`): array-api-compat's ``maximum``/``minimum`` would copy a
    Python number from the host, which waits for a GPU."""
    if is_torch_namespace(xp) and x.is_floating_point():
        import torch  # only reached with torch tensors

        return torch.clamp(x, low, high)
    if low is not None:
        x = xp.maximum(x, scalar_like(low, x, xp))
    if high is not None:
        x = xp.minimum(x, scalar_like(high, x, xp))
    return x


def work_dtype(xp: Any, device: Any) -> Any:
    """float64 where the namespace has it on ``device`` (JAX only with x64), else float32."""
    info = xp.__array_namespace_info__()
    try:
        available = info.dtypes(device=device, kind="real floating")
    except (TypeError, ValueError):  # an info object that takes no device
        available = info.dtypes(kind="real floating")
    return xp.float64 if "float64" in available else xp.float32


@functools.lru_cache(maxsize=None)
def _half_dtypes(xp: Any) -> tuple:
    """The namespace's float16 and bfloat16 dtypes, those it has (array_api_strict: neither)."""
    return tuple(getattr(xp, name) for name in ("float16", "bfloat16") if hasattr(xp, name))


def divide_by_constant(num: Array, divisor: float, xp: Any) -> Array:
    """``num / divisor`` rounded as one true division, as torch (CPU) computes it: float16/bfloat16 ``num``
    divided in float32 and the quotient rounded back (torch's arithmetic for them; NumPy and JAX would first
    round the divisor to ``num``'s dtype, 65535 to inf in float16).

    XLA rewrites a division by a compile-time constant into a multiplication by its reciprocal, which
    rounds differently in about 3 of 4 cases. A divisor chosen at run time (NaN-guarded, same value)
    keeps the true division; other backends divide directly.
    """
    if is_torch_namespace(xp):
        return num / divisor
    if num.dtype in _half_dtypes(xp):
        return xp.astype(divide_by_constant(xp.astype(num, xp.float32), divisor, xp), num.dtype)
    if not is_jax_namespace(xp):
        return num / divisor
    return num / xp.where(xp.isnan(num), scalar_like(1.0, num, xp), scalar_like(divisor, num, xp))


def rounded(product: Array, xp: Any) -> Array:
    """``product`` unchanged, but rounded on its own before a following addition.

    XLA (CPU and GPU) contracts ``a * b + c`` into one fused multiply-add, which rounds once where torch
    rounds twice. A ``where`` between the multiply and the add blocks the contraction; NaN is kept.
    Other backends run each operation on its own and need nothing.
    """
    if not is_jax_namespace(xp):
        return product
    return xp.where(xp.isnan(product), scalar_like(float("nan"), product, xp), product)


def discarded_invalid(xp: Any, **errors: str) -> Any:
    """A context in which NumPy stays quiet about invalid operations whose results are discarded
    (``inf - inf`` in an entry a ``where`` replaces), and about the ``errors`` given (``np.errstate``'s
    keywords) where NaN or inf is the documented result, as torch and JAX give it silently; a no-op for
    backends not built on NumPy."""
    if is_numpy_namespace(xp) or array_api_compat.is_array_api_strict_namespace(xp):
        import numpy as np

        return np.errstate(**{"invalid": "ignore", **errors})
    return contextlib.nullcontext()


def bincount(index: Array, length: int, xp: Any) -> Array:
    """Occurrences of each value ``0 .. length - 1`` in the 1-D non-negative integer ``index`` (larger
    values are not counted): integer counts (int64; int32 on JAX without x64), from the namespace's own
    kernel (``np.bincount``, ``torch.bincount`` on the CPU, ``jnp.bincount(length=)``), on a GPU (where
    ``bincount`` reads the largest index on the host to size its output, a synchronisation) torch's
    ``histc`` (:func:`histc_bincount`; a scatter-add under ``torch.use_deterministic_algorithms``) or a
    CuPy scatter-add into ``length + 1`` slots, or a portable sort + searchsorted (array_api_strict and
    any other namespace)."""
    if is_numpy_namespace(xp):
        import numpy as np

        return np.bincount(index, minlength=length)[:length]
    if is_torch_namespace(xp):
        import torch  # only reached with torch tensors

        if not torch_cuda_path(index):
            return torch.bincount(index, minlength=length)[:length]
        if not torch.are_deterministic_algorithms_enabled():  # (torch.histc has no deterministic CUDA kernel)
            return histc_bincount(index, length)
        slots = torch.zeros(length + 1, dtype=torch.int64, device=index.device)
        return slots.index_add_(0, torch.clamp(index, max=length), torch.ones_like(index, dtype=torch.int64))[:length]
    if is_jax_namespace(xp):
        replicated = explicit_replicated(index, xp)  # a scatter of Explicit-sharded indices must be told
        out = {} if replicated is None else {"out_sharding": replicated}  # its output's sharding
        return xp.bincount(index, length=length, **out)
    if is_cupy_namespace(xp):
        import cupyx  # only reached with cupy arrays

        slots = xp.zeros(length + 1, dtype=xp.int64)
        cupyx.scatter_add(slots, xp.clip(index, 0, length), 1)
        return slots[:length]
    ordered = xp.sort(index)
    bounds = xp.searchsorted(ordered, xp.arange(length + 1, dtype=index.dtype, device=device_of(index)))
    return bounds[1:] - bounds[:-1]


def histc_bincount(index: Array, length: int) -> Array:
    """:func:`bincount` of a torch tensor by ``torch.histc`` (int64): ``i + 0.5`` in float64 lies inside bin
    ``i`` of ``length`` unit bins over ``[0, length]`` whatever rounding histc's bin formula makes, and
    values ``>= length`` fall outside; float64 counts are exact below 2**53. On CUDA histc counts in
    shared memory where ``index_add_`` contends on global atomics."""
    import torch  # only reached with torch tensors

    return torch.histc(index.to(torch.float64) + 0.5, bins=length, min=0, max=length).to(torch.int64)


def explicit_replicated(a: Array, xp: Any) -> Any:
    """JAX only: where ``a`` is sharded over Explicit mesh axes (``jax.sharding.AxisType.Explicit``,
    ``jax.make_mesh``'s default), the replicated sharding of its mesh, which a scatter (``bincount``,
    ``.at[].add``) of ``a``'s values, or a reshape that JAX cannot shard itself (``(8@data, 16)`` to
    ``(1, 128)``), needs as ``out_sharding`` (JAX refuses to choose one); ``None`` otherwise (other
    namespaces, unsharded or Auto-sharded arrays, inside ``shard_map``)."""
    if not is_jax_namespace(xp):
        return None
    import jax  # only reached with JAX arrays

    sharding = getattr(jax.typeof(a), "sharding", None)
    if sharding is None or all(axes is None for axes in getattr(sharding, "spec", ())):
        return None
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())


def channel_rows(x: Array, axis: int | None, xp: Any) -> Array:
    """``x`` as rows ``(C, N)``: one row per tensor (``axis=None``), else one per channel along ``axis``
    (a normalized axis). JAX, ``x`` sharded over Explicit mesh axes: the rows replicated (JAX cannot shard
    the reshape itself, see :func:`explicit_replicated`)."""
    replicated = explicit_replicated(x, xp)
    out = {} if replicated is None else {"out_sharding": replicated}
    if axis is None:
        return xp.reshape(x, (1, -1), **out)
    return xp.reshape(xp.moveaxis(x, axis, 0), (x.shape[axis], -1), **out)


def is_traced(*arrays: Array) -> bool:
    """Whether any array is a JAX tracer (inside ``jit``), where reading a value is impossible."""
    jax = sys.modules.get("jax")
    return jax is not None and any(isinstance(a, jax.core.Tracer) for a in arrays)


def read_flags(flags: Array) -> list[bool]:
    """A small eager boolean array as Python bools (one host read; torch CUDA and CuPy copied first)."""
    import numpy as np

    if hasattr(flags, "get"):
        flags = flags.get()
    elif hasattr(flags, "cpu"):
        flags = flags.cpu()
    return [bool(v) for v in np.asarray(flags).reshape(-1)]


def midpoint(u: Array, v: Array, xp: Any) -> Array:
    """``(u + v) / 2`` with no overflow: where the sum overflows (finite ``u``, ``v`` beyond half the
    dtype's maximum) it is ``u / 2 + v / 2``, the same correctly rounded value (halving is exact away
    from subnormals, so both round the exact mean once)."""
    mean = (u + v) / 2
    return xp.where(xp.isinf(mean) & xp.isfinite(u) & xp.isfinite(v), u / 2 + v / 2, mean)


# --- native kernels: one per namespace where it has one, a portable fallback otherwise ---


def cummin(v: Array, xp: Any) -> Array:
    """Prefix minimum of a 1-D integer array: the native scan where there is one, log-step doubling
    otherwise (the standard has no cummin)."""
    if is_numpy_namespace(xp):
        import numpy as np

        return np.minimum.accumulate(v)
    if is_torch_namespace(xp):
        import torch  # only reached with torch tensors

        return torch.cummin(v, dim=0).values
    if is_jax_namespace(xp):
        import jax  # only reached with jax arrays

        return jax.lax.cummin(v)
    n = v.shape[0]
    big = xp.full((n,), 2**31 - 1, dtype=v.dtype, device=device_of(v))
    shift = 1
    while shift < n:
        v = xp.minimum(v, xp.concat([big[:shift], v[:-shift]]))
        shift *= 2
    return v


def bincount_weighted(idx: Array, weights: Array, length: int, xp: Any) -> Array:
    """``out[idx[i]] += weights[i]`` in float32 and in index order (as ``torch.bincount(weights=)``
    accumulates on CPU); ``idx`` is non-decreasing here."""
    if is_numpy_namespace(xp):
        import numpy as np

        out = np.zeros(length, dtype=np.float32)
        np.add.at(out, idx, weights)
        return out
    if is_torch_namespace(xp):
        import torch  # only reached with torch tensors

        if not torch_cuda_path(idx):
            return torch.bincount(idx, weights=weights, minlength=length)
        # on a GPU torch.bincount reads the largest index on the host; index_add_ adds atomically, so the
        # order of the float32 additions (and the last bits of a sum) may vary, as torch's own CUDA bincount
        return torch.zeros(length, dtype=weights.dtype, device=idx.device).index_add_(0, idx, weights)
    if is_jax_namespace(xp):
        return xp.zeros(length, dtype=weights.dtype).at[idx].add(weights)
    if is_cupy_namespace(xp):
        import cupyx  # only reached with cupy arrays

        out = xp.zeros(length, dtype=weights.dtype)
        cupyx.scatter_add(out, idx, weights)
        return out
    # portable: idx is sorted, so each bin sums a contiguous run; differences of a float64 running sum
    # (each bin's sum correctly rounded, where torch adds sequentially in float32)
    with float64_scope(xp):
        cs = xp.cumulative_sum(xp.astype(weights, xp.float64), include_initial=True)
        edges = xp.searchsorted(idx, xp.arange(length + 1, dtype=idx.dtype, device=device_of(idx)), side="left")
        sums = xp.take(cs, edges[1:]) - xp.take(cs, edges[:-1])
        return xp.astype(sums, weights.dtype)


def float64_scope(xp: Any):
    """Where torch computes in Python floats (double), we compute in float64; JAX without x64 gets it
    for the duration of the block (also while tracing under ``jit``)."""
    if is_jax_namespace(xp):
        import jax  # only reached with jax arrays

        if not jax.config.jax_enable_x64:
            return jax.enable_x64(True)
    return contextlib.nullcontext()


def take(table: Array, index: Array, axis: int, xp: Any) -> Array:
    """``xp.take`` for non-negative 1-D ``index`` (torch: ``index_select`` itself, without the
    compat layer's pass for negative indices)."""
    if is_torch_namespace(xp):
        import torch  # only reached with torch tensors

        return torch.index_select(table, axis % table.ndim, index)
    return xp.take(table, index, axis=axis)


def from_host(a: Any, xp: Any) -> Array:
    """A NumPy array this function owns as an array of ``xp`` (torch: zero-copy, ``torch.from_numpy``)."""
    if is_numpy_namespace(xp):
        return a
    if is_torch_namespace(xp):
        import torch  # only reached with torch tensors

        return torch.from_numpy(a)
    return xp.asarray(a)
