"""Collectives: how one update combines what several processes or devices saw in the same step.

An update given ``collective=`` reduces its batch statistics across the group before it applies them,
so every member ends with the state a single process would reach on the concatenation of all
members' batches (bit for bit where the statistics are exact: ranges, integer histogram counts).
Every member must make the same calls in the same order, so with a collective an empty batch is not
skipped: it contributes the identity (``+inf``/``-inf`` ranges, zero counts).

A collective has three elementwise reductions; each takes an array and returns the reduced array, with
the same shape and dtype, on the same device:

- ``min(x)``, ``max(x)``: NaN wins (an entry that is NaN on any member is NaN in the result), as NaN
  propagates through a single process's ``min``/``max``;
- ``sum(x)``: integer arrays are summed exactly.

It may also have ``min_max(lo, hi) -> (min(lo), max(hi))``, used where an update needs both (one
round trip instead of two).

Backends supply it: :func:`observers_core.adapters.torch.TorchCollective` (``torch.distributed``) and the
JAX adapter's (``lax.pmin``/``pmax``/``psum`` over a named axis).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Collective", "check_collective", "reduce_range"]

Array = Any


@runtime_checkable
class Collective(Protocol):
    """Elementwise reductions across a group; see the module docstring."""

    def min(self, x: Array, /) -> Array: ...

    def max(self, x: Array, /) -> Array: ...

    def sum(self, x: Array, /) -> Array: ...


def check_collective(collective: Any) -> Any:
    """``collective`` itself (``None`` included); a ``TypeError`` for an object without min/max/sum."""
    if collective is not None and not isinstance(collective, Collective):
        raise TypeError(
            "collective must be None or have min(x), max(x) and sum(x) methods (observers_core.Collective), "
            f"got {type(collective).__name__}"
        )
    return collective


def reduce_range(lo: Array, hi: Array, collective: Any) -> tuple[Array, Array]:
    """``(collective.min(lo), collective.max(hi))`` (by its ``min_max`` where it has one); ``(lo, hi)``
    itself without a collective."""
    if collective is None:
        return lo, hi
    if hasattr(collective, "min_max"):
        return collective.min_max(lo, hi)
    return collective.min(lo), collective.max(hi)
