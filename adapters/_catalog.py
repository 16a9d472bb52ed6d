"""The public classes of the array backends, each declared once, and how a framework binds them.

The generic classes live in ``_array_observers`` (min/max family), ``_array_histogram``,
``_array_calibration`` and ``_array_lowbit``; used directly they run on any namespace given as ``xp=``
(NumPy by default). ``adapters.jax`` and ``adapters.cupy`` get the same classes bound to their
:class:`~observers_core.adapters._backend.Backend` by :func:`bind`: nothing else differs.
"""

from __future__ import annotations

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
