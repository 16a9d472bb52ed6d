"""What makes the torch observers usable in torchao's PT2E flow (``prepare_pt2e``/``convert_pt2e``).

torchao (0.18) keeps its own ``ObserverBase``/``FakeQuantizeBase`` and finds observers in a prepared
graph by ``isinstance`` against those, not torch.ao's; without that, ``convert_pt2e`` leaves a float
model. It also reads ``ctr.__name__`` of an observer constructor that is not its own ``PartialWrapper``
(to decide whether to pass ``ch_axis``). So:

* :func:`pt2e_observer` (a class decorator on each base class of ours) gives the class a ``with_args``
  whose result is torch.ao's ``_PartialWrapper`` plus a ``__name__`` (the wrapped class's), and lists
  the class for registration;
* :func:`link_torchao` registers every listed class as a virtual subclass of torchao's ``ObserverBase``
  (``ABCMeta.register``), once torchao's PT2E package is imported. It never imports torchao itself
  (4 s): it runs when the facade is imported, when any observer of ours is built and on ``with_args``,
  so observers built by ``prepare_pt2e`` (torchao loaded by then) are always recognised.

Observers whose statistics torchao cannot express as quantize/dequantize nodes define ``convert``,
which ``convert_pt2e`` calls instead of its own lowering; ours raise there, so no model is silently
left in float.
"""

from __future__ import annotations

import sys
from functools import partial

from torch.ao.quantization import observer as torch_observer

__all__ = ["NamedPartialWrapper", "link_torchao", "pt2e_observer"]

_TORCHAO_PT2E = "torchao.quantization.pt2e"
_CLASSES: list[type] = []
_registered: set[type] = set()


class NamedPartialWrapper(torch_observer._PartialWrapper):  # torch.ao's own type, for its isinstance checks
    """torch.ao's ``_PartialWrapper`` (so ``QConfig`` equality and FX still treat it as theirs) with the
    wrapped class's ``__name__``, which torchao's PT2E ``prepare`` reads."""

    @property
    def __name__(self) -> str:  # noqa: A003 - the attribute torchao reads
        func = self.p.func
        return func.__name__

    def with_args(self, **kwargs):
        return _named_with_args(self, **kwargs)

    def with_callable_args(self, **kwargs):
        result = NamedPartialWrapper(p=self.p)
        result.callable_args = {**self.callable_args, **kwargs}
        return result


def _named_with_args(cls_or_self, **kwargs) -> NamedPartialWrapper:
    """``cls.with_args(**kwargs)``: a factory that builds ``cls(**kwargs)`` (torch.ao's semantics)."""
    link_torchao()
    return NamedPartialWrapper(partial(cls_or_self, **kwargs))


def _named_with_callable_args(cls_or_self, **kwargs) -> NamedPartialWrapper:
    """``cls.with_callable_args(name=fn)``: ``fn()`` is called for each new instance (torch.ao's)."""
    return _named_with_args(cls_or_self).with_callable_args(**kwargs)


def pt2e_observer(cls: type) -> type:
    """Class decorator: torchao-readable ``with_args``/``with_callable_args``, and registration with
    torchao's ``ObserverBase`` (covering the subclasses) once torchao is imported."""
    cls.with_args = classmethod(_named_with_args)
    cls.with_callable_args = classmethod(_named_with_callable_args)
    _CLASSES.append(cls)
    link_torchao()
    return cls


def link_torchao() -> None:
    """Register the listed classes with torchao's PT2E ``ObserverBase`` if torchao is imported.

    Cheap when there is nothing to do (one ``sys.modules`` lookup); never imports torchao.
    """
    if len(_registered) == len(_CLASSES):
        return
    package = sys.modules.get(_TORCHAO_PT2E)
    base = getattr(package, "ObserverBase", None)
    if base is None:  # torchao not imported, or its package is still initialising
        return
    for cls in _CLASSES:
        if cls not in _registered:
            base.register(cls)
            _registered.add(cls)
