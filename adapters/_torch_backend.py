"""The torch backend: everything the torch observers (:mod:`observers_core.adapters.torch`) do with tensors.

Like the JAX and CuPy backends (``adapters/jax.py``, ``adapters/cupy.py``), :class:`TorchBackend` is a
:class:`~._backend.Backend`: it checks and casts inputs and runs the core's functions. The torch observers (``adapters/_torch_*.py``: ``nn.Module`` buffers, state-dict versions,
torch's presets) call it through the one instance :data:`TORCH`:

- ``xp``: ``array_api_compat.torch``, the namespace the core's functions get; ``fast_xp``: the same with
  torch's own ``minimum``/``maximum``/``where`` (:func:`_fast_namespace`), for the min/max and low-bit steps;
- ``checked_input(x, like)``: ``x`` detached, on ``like``'s device, real, other dtypes cast as torch does;
- ``run(fn, *args, **static)``: ``fn(*args, **static)`` as every backend runs it, except that CPU tensors go
  through zero-copy NumPy views (and an ``xp`` keyword becomes NumPy's) when the compiled kernels are on;
- ``entries(state_dict, prefix, names)``: another framework's state-dict arrays as tensors;
- ``factory_kwargs(factory_kwargs)``: torch's ``factory_kwargs``, checked;
- :func:`to_core_dtype`/:func:`to_core_qscheme`/:func:`to_lowbit_dtype` and
  :data:`TORCH_DTYPES`/:data:`TORCH_QSCHEMES`: torch's dtype and qscheme objects and the core's names.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, Callable

import array_api_compat.numpy as _numpy_xp
import array_api_compat.torch as _torch_xp
import numpy as np
import torch

from observers_core._compiled import numpy_views
from observers_core._dtypes import QScheme, parse_dtype
from observers_core._state_dict import host_array

from ._backend import Backend

__all__ = ["TORCH", "TORCH_DTYPES", "TORCH_QSCHEMES", "TorchBackend", "to_core_dtype", "to_core_qscheme",
           "to_lowbit_dtype"]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "qint8": torch.qint8,
    "quint8": torch.quint8,
    "quint4x2": torch.quint4x2,
    "qint32": torch.qint32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "uint16": torch.uint16,
    "int32": torch.int32,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
_DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}

TORCH_QSCHEMES: dict[QScheme, torch.qscheme] = {
    QScheme.PER_TENSOR_AFFINE: torch.per_tensor_affine,
    QScheme.PER_TENSOR_SYMMETRIC: torch.per_tensor_symmetric,
    QScheme.PER_CHANNEL_AFFINE: torch.per_channel_affine,
    QScheme.PER_CHANNEL_SYMMETRIC: torch.per_channel_symmetric,
    QScheme.PER_CHANNEL_AFFINE_FLOAT_QPARAMS: torch.per_channel_affine_float_qparams,
}
_QSCHEMES: dict[torch.qscheme, QScheme] = {v: k for k, v in TORCH_QSCHEMES.items()}

# Input dtypes reduced as they are (the cast to the buffer dtype comes after the reduction, which is
# exact because rounding is monotone); any other real dtype is cast first, as torch does.
_NATIVE_INPUT_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16,
     torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64}
)


def to_core_dtype(dtype: Any, *, name: str = "dtype") -> str:
    """The core's name of a quantized dtype: ``torch.qint8`` -> ``"qint8"``; names pass through."""
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPE_NAMES:
            return _DTYPE_NAMES[dtype]
        raise ValueError(
            f"{name}={dtype} is not a supported quantized dtype; allowed: "
            + ", ".join(str(d) for d in TORCH_DTYPES.values())
            + " (or their names)"
        )
    return parse_dtype(dtype, name=name)


def to_core_qscheme(qscheme: Any, *, name: str = "qscheme") -> QScheme:
    """The core's :class:`QScheme` of ``torch.per_tensor_affine`` etc.; names and members pass through."""
    if isinstance(qscheme, torch.qscheme):
        return _QSCHEMES[qscheme]
    return QScheme.parse(qscheme, name=name)


#: torch dtypes accepted for ``dtype`` (the core's names are accepted too).
_LOWBIT_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.int2: "int2",
    torch.int3: "int3",
    torch.int4: "int4",
    torch.uint4: "uint4",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
}


def to_lowbit_dtype(dtype: Any) -> Any:
    """A low-bit observer's torch dtype (``torch.int4``...) as the core's name; anything else unchanged (the
    low-bit spec validates it)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _LOWBIT_DTYPE_NAMES:
            allowed = ", ".join(str(d) for d in _LOWBIT_DTYPE_NAMES)
            raise ValueError(f"dtype={dtype} has no low-bit observer; allowed torch dtypes: {allowed} (or a dtype name)")
        return _LOWBIT_DTYPE_NAMES[dtype]
    return dtype


def _fast_namespace() -> types.ModuleType:
    """``array_api_compat.torch`` with its ``minimum``/``maximum``/``where`` wrappers replaced by the torch
    functions they wrap.

    The wrappers only adjust type promotion when the operands' dtypes differ, and cost several
    microseconds per call (a third of a 4k-element update). The min/max and low-bit steps call them with
    operands of one dtype (the batch range is cast to the buffer dtype first), except for the float32 0-d
    ``eps`` against float32/float64 scales in ``calculate_qparams``, where torch's promotion and the array
    API's agree (float64 wins). The histogram and calibration functions pass Python scalars, which the raw
    functions refuse: they get ``xp``. The parity tests cover both buffer dtypes.
    """
    xp = types.ModuleType(_torch_xp.__name__, _torch_xp.__doc__)
    xp.__dict__.update(vars(_torch_xp))
    xp.minimum, xp.maximum, xp.where = torch.minimum, torch.maximum, torch.where
    return xp


def _tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``fn`` applied to every array in ``tree`` (tuples and NamedTuples kept as they are)."""
    if isinstance(tree, tuple):
        mapped = [_tree_map(fn, t) for t in tree]
        return type(tree)(*mapped) if hasattr(tree, "_fields") else tuple(mapped)
    return fn(tree) if isinstance(tree, (torch.Tensor, np.ndarray, np.generic)) else tree


def _leaves(tree: Any) -> list:
    if isinstance(tree, tuple):
        return [leaf for t in tree for leaf in _leaves(t)]
    return [tree]


def _as_tensor(a: Any) -> torch.Tensor:
    """A NumPy result as a tensor sharing its memory (``torch.from_numpy``: a third of ``torch.as_tensor``'s
    cost; read-only arrays, which it would warn about, go through ``as_tensor``)."""
    a = np.asarray(a)
    return torch.from_numpy(a) if a.flags.writeable else torch.as_tensor(a)


class TorchBackend(Backend):
    """torch tensors (see the module's docstring); :data:`TORCH` is the one instance."""

    fast_xp = _fast_namespace()

    def __init__(self) -> None:
        super().__init__(_torch_xp)

    def __reduce__(self) -> str:
        return "TORCH"

    def checked_input(self, x: Any, like: torch.Tensor) -> torch.Tensor:
        """``x`` detached, after the checks that keep the buffer ``like`` valid (nothing is modified): a
        tensor (``TypeError``) on ``like``'s device (``ValueError``) of a real dtype (``TypeError``); dtypes
        other than the natively reduced ones are cast to ``like``'s, as torch does. One function: it runs
        on every forward."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        x = x.detach()
        if x.device != like.device:
            raise ValueError(
                f"x is on device {x.device} but the observer's buffers are on {like.device}; "
                "move the observer with .to(device)"
            )
        if x.dtype not in _NATIVE_INPUT_DTYPES:
            if x.dtype == torch.bool or x.dtype.is_complex or x.is_quantized:
                raise TypeError(f"x must hold real floating or integer values, got dtype {x.dtype}")
            x = x.to(like.dtype)
        return x

    def check_device(self, x: torch.Tensor, like: torch.Tensor) -> None:
        """``ValueError`` unless ``x`` is on ``like``'s device (torch's own comparison: it runs per batch)."""
        if x.device != like.device:
            raise ValueError(f"x is on device {x.device} but this observer's state is on {like.device}; move x there")

    def run(self, fn: Callable[..., Any], /, *args: Any, **static: Any) -> Any:
        """``fn(*args, **static)``, as every backend runs it, except that CPU tensors go through their
        zero-copy NumPy views (and an ``xp`` keyword becomes NumPy's namespace) when the compiled kernels are
        on: NumPy's small-array operations cost a fraction of torch's, and the results, the NumPy
        observers', equal torch's bit for bit (tests/test_calibration_recorded.py); they come back as
        tensors."""
        tensors = [t for t in _leaves(args) if isinstance(t, torch.Tensor)]
        views = numpy_views(self.xp, *tensors)
        if views is None:
            return fn(*args, **static)
        if "xp" in static:
            static = {**static, "xp": _numpy_xp}
        view_of = {id(t): v for t, v in zip(tensors, views)}
        out = fn(*_tree_map(lambda t: view_of.get(id(t), t), args), **static)
        return _tree_map(_as_tensor, out)

    @staticmethod
    def entries(state_dict: dict, prefix: str, names: Any) -> list[str]:
        """The state-dict entries ``prefix + name`` that are arrays of another framework (NumPy, JAX, CuPy,
        array_api_strict) replaced by tensors, so torch's loading takes them; returns the keys."""
        keys = [prefix + name for name in names]
        for key in keys:
            if key in state_dict and not isinstance(state_dict[key], torch.Tensor):
                state_dict[key] = torch.as_tensor(host_array(state_dict[key], key.removeprefix(prefix)))
        return keys

    @staticmethod
    def factory_kwargs(factory_kwargs: Any) -> dict:
        """``torch.nn.factory_kwargs(factory_kwargs)`` after checking that ``factory_kwargs`` is ``None`` or a
        dict (``ValueError`` naming it, as the array observers raise, where torch's function raises
        ``AttributeError``)."""
        if factory_kwargs is not None and not isinstance(factory_kwargs, Mapping):
            raise ValueError(f"factory_kwargs={factory_kwargs!r} is not supported; allowed: None or a dict such as "
                             "{'device': ..., 'dtype': ...}")  # fmt: skip
        return torch.nn.factory_kwargs(factory_kwargs)


TORCH = TorchBackend()
