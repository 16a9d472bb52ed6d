"""Backends: what is particular to one array library under the stateful array observers.

The observers of :mod:`._array_observers`, :mod:`._array_histogram`, :mod:`._array_calibration` and
:mod:`._array_lowbit` hold a configuration and a state and do every computation through the pure core
(``observers_core.families.*``) by ``backend.run``. A :class:`Backend` is all a framework adds:

- ``xp``: the array-API namespace (``namespace(xp)`` resolves the constructor's ``xp=`` argument);
- ``coerce(x)``: an input as an array of that namespace (``TypeError`` naming ``x`` otherwise);
- ``check_device(x, like)``: ``ValueError`` unless ``x`` lives on ``like``'s device;
- ``place(host, dtype, like=None, device=None)``: a host (numpy) array on ``like``'s device or ``device``;
- ``empty(make, device, x=None)``: a fresh state ``make(device)`` on ``device``, else on ``x``'s;
- ``identity_start(fn, config, x)``: what an update starts from instead of ``None`` (JAX only);
- ``run(fn, *args, **static)``: ``fn(*args, **static)``. JAX jits it: positional arrays, tuples of arrays
  and ``None`` are traced, every other argument (configurations, keywords) is static, one compiled
  function per ``(fn, static)`` is shared by all observers. CuPy runs it with its arrays' device current;
- ``collective(collective, axis_name)``: the collective of a pure ``update`` (``axis_name``: JAX only).

One instance per framework (:data:`ARRAY` for any namespace given as ``xp=``; ``adapters.jax`` and
``adapters.cupy`` define theirs); the public classes of a framework are one-line subclasses of the generic ones that name it.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

import array_api_compat
import numpy as np

from observers_core._collective import check_collective
from observers_core._namespace import device_of, namespace_of
from observers_core._quantize import extension_float

Array = Any


def plain_ndarray(x: np.ndarray) -> np.ndarray:
    """``x`` as a base ``numpy.ndarray`` (a ``np.matrix`` or ``np.memmap`` becomes a view of the same data,
    which the compiled kernels take); a masked array is refused with a ``TypeError``: its masked entries
    would be counted."""
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError("x must not be a numpy masked array (its masked entries would be observed); "
                        "pass x.compressed() or x.filled(value)")
    return np.asarray(x)


class Backend:
    """Any array-API namespace given as ``xp=`` (NumPy by default, ``array_api_strict``...): eager calls."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def __reduce__(self) -> tuple[Callable[..., Backend], tuple[str]]:
        return array_backend, (self.xp.__name__,)  # pickles and copies carry the namespace by name

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.xp is self.xp

    def __hash__(self) -> int:
        return hash((type(self), self.xp))

    @classmethod
    def namespace(cls, xp: Any) -> Backend:
        """The backend of the constructor's ``xp`` (``None``: ``array_api_compat.numpy``)."""
        if xp is None:
            import array_api_compat.numpy as xp
        return cls(namespace_of(xp))

    def normalize_device(self, device: Any) -> Any:
        """The constructor's ``factory_kwargs["device"]`` as this backend keeps it."""
        return device

    def coerce(self, x: Array) -> Array:
        try:
            x_xp = array_api_compat.array_namespace(x)
        except TypeError:
            x_xp = None
        if x_xp is not self.xp:
            raise TypeError(f"x must be an array of {self.xp.__name__}, got {type(x).__module__}.{type(x).__name__}")
        if isinstance(x, np.ndarray):
            x = plain_ndarray(x)
        if extension_float(x, self.xp):  # ml_dtypes bfloat16 & co. on numpy
            x = x.astype(np.float32)
        return x

    def check_stateful_call(self, x: Array, owner: str) -> None:
        """Raise where a stateful ``obs(x)`` cannot run (JAX: inside a trace)."""

    def check_device(self, x: Array, like: Array) -> None:
        x_dev, s_dev = device_of(x), device_of(like)
        if x_dev != s_dev:
            raise ValueError(f"x is on device {x_dev} but this observer's state is on {s_dev}; move x there")

    def place(self, host: np.ndarray, dtype: Any, like: Array | None = None, device: Any = None) -> Array:
        return self.xp.asarray(host, dtype=dtype, device=device_of(like) if like is not None else device)

    def empty(self, make: Callable[[Any], Any], device: Any, x: Array | None = None) -> Any:
        return make(device if device is not None or x is None else device_of(x))

    def identity_start(self, fn: Callable[..., Any], config: Any, x: Array) -> Any:
        """The state ``fn(config, state, x)`` starts from in place of ``None`` (JAX: the identity, so the
        first batch shares the compiled update); here ``None``."""
        return None

    def run(self, fn: Callable[..., Any], /, *args: Any, **static: Any) -> Any:
        return fn(*args, **static)

    def collective(self, collective: Any, axis_name: Any) -> Any:
        if axis_name is not None:
            raise TypeError(f"axis_name is for the JAX observers (inside shard_map/pmap); with {self.xp.__name__} "
                            "give collective= instead")  # fmt: skip
        return check_collective(collective)


def array_backend(name: str) -> Backend:
    """The backend of the namespace module called ``name`` (what a pickled observer stores)."""
    return Backend(importlib.import_module(name))


class FrameworkBackend(Backend):
    """A framework with one namespace (JAX, CuPy): its module holds the one instance, ``BACKEND``, which
    pickles by that name; the observers refuse ``xp=``."""

    label = ""  #: the framework's name in messages
    namespace_name = ""  #: what the observers always use

    def __reduce__(self) -> str:
        return "BACKEND"

    @classmethod
    def namespace(cls, xp: Any) -> Backend:
        if xp is not None:
            raise TypeError(f"the {cls.label} observers always use {cls.namespace_name}; xp must not be given")
        return sys.modules[cls.__module__].BACKEND
