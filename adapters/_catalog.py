"""The public classes of the array backends, each declared once, and how a framework binds them.

The generic classes live in ``_array_observers`` (min/max family), ``_array_histogram``,
``_array_calibration`` and ``_array_lowbit``; used directly they run on any namespace given as ``xp=``
(NumPy by default). ``adapters.jax`` and ``adapters.cupy`` get the same classes bound to their
:class:`~observers_core.adapters._backend.Backend` by :func:`bind`: nothing else differs. The torch
classes, ``nn.Module``s with buffers, take a generic class's constructor onto torch's own base
(:func:`constructor_on`).
"""

from __future__ import annotations

import types
from collections.abc import Hashable, Mapping
from typing import Any

from . import _array_calibration, _array_histogram, _array_lowbit, _array_observers
from ._backend import Backend

#: The generic public classes, in the order of the frameworks' ``__all__``.
CLASSES: tuple[type, ...] = tuple(
    getattr(module, name)
    for module in (_array_observers, _array_histogram, _array_calibration, _array_lowbit)
    for name in module.__all__
    if name not in ("ObserverBase", "UniformQuantizationObserverBase")
)


def bind(backend_type: type[Backend], module_name: str) -> dict[str, type]:
    """``{name: the generic class bound to backend_type}``, named as members of ``module_name`` (so
    ``repr``, pickles and docs give the public import path)."""
    return {
        cls.__name__: type(cls.__name__, (cls,), {
            "_BACKEND_TYPE": backend_type, "__doc__": cls.__doc__, "__module__": module_name,
            "__qualname__": cls.__name__,
        })
        for cls in CLASSES
    }


def constructor_on(generic: type, base: type, module_name: str, defaults: Mapping[Any, Any], **attributes: Any) -> type:
    """The class ``generic.__name__`` of ``module_name``: ``generic``'s public constructor (its signature, in
    order, with each default found in ``defaults`` replaced by its value there, e.g. the core's qscheme by
    torch's object) over a framework's own ``base``, ``generic``'s docstring and the configuration constants
    its body sets (``_METHOD``, ``_FAMILY``, ``_PER_CHANNEL``, ``_AVERAGING``: upper-case private names),
    then ``attributes``. The constructor only forwards its arguments to ``self._setup``, which ``base``
    defines."""
    init = generic.__init__
    constants = {k: v for k, v in vars(generic).items() if k[:1] == "_" and k[1:2].isupper()}

    def swap(value: Any) -> Any:
        return defaults.get(value, value) if isinstance(value, Hashable) else value

    clone = types.FunctionType(init.__code__, init.__globals__, init.__name__,
                               tuple(swap(v) for v in init.__defaults__ or ()), init.__closure__)
    clone.__kwdefaults__ = {k: swap(v) for k, v in init.__kwdefaults__.items()} if init.__kwdefaults__ else None
    clone.__qualname__, clone.__module__ = f"{generic.__name__}.__init__", module_name
    return type(generic.__name__, (base,), {
        "__init__": clone, "__doc__": generic.__doc__, "__module__": module_name, "__qualname__": generic.__name__,
        **constants, **attributes,
    })
