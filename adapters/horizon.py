"""Horizon-compatible names: ``horizon_plugin_pytorch.quantization.observer_v2`` over this package's torch observers.

A Horizon user changes one import::

    # from horizon_plugin_pytorch.quantization.observer_v2 import KLObserver, MinMaxObserver
    from observers_core.adapters.horizon import KLObserver, MinMaxObserver

    act = MinMaxObserver(averaging_constant=0.01, ch_axis=-1, dtype="qint16")
    weight = MinMaxObserver(ch_axis=0, qscheme=torch.per_channel_symmetric)

Every class takes Horizon's ``observer_v2`` signature (same order, names and defaults):
``KLObserver``, ``MSEObserver``, ``MixObserver`` and ``PercentileObserver`` are
:mod:`observers_core.adapters.torch`'s classes themselves (re-exported; their docstrings list the
deliberate differences from Horizon), and ``MinMaxObserver`` is Horizon's moving-average min/max:

- ``ch_axis=-1``: one range per tensor, the observer is a :class:`MinMaxObserver` (a subclass of
  ``observers_core.adapters.torch.MovingAverageMinMaxObserver``, so its statistics and qparams are
  that class's, bit for bit);
- ``ch_axis >= 0``: one range per channel: ``MinMaxObserver(...)`` returns a
  :class:`PerChannelMinMaxObserver` (a subclass of ``MovingAveragePerChannelMinMaxObserver``).
  Horizon has one class for both; here the per-channel observer is not an instance of
  :class:`MinMaxObserver` (test ``obs.ch_axis >= 0`` or ``isinstance(obs, PerChannelMinMaxObserver)``).

Both keep ``x_min = x_min + c * (min(X) - x_min)`` (``c = averaging_constant``; the first batch
initialises) in the buffers ``min_val``/``max_val`` and compute qparams with ``calculate_qparams``.
The qscheme must fit ``ch_axis`` (``per_tensor_*`` for -1, ``per_channel_*`` otherwise), as for the
calibration observers.

``dtype`` takes torch's dtypes (``torch.qint8``) and Horizon's names: ``"qint8"``, ``"quint8"``,
``"qint16"`` (``[-2**15, 2**15 - 1]``), ``"quint16"`` (``[0, 2**16 - 1]``), ``"quint4"`` (``[0, 15]``,
torch's ``quint4x2``), ``"qint32"``; ``quant_min``/``quant_max`` narrow the range (e.g. ``qint4`` as
``dtype="qint8", quant_min=-8, quant_max=7``). ``is_sync_quantize=True`` ("sync statistics when
training with multiple devices") syncs every batch's min/max across ``torch.distributed``'s default
group (or ``process_group=``), as ``sync=True`` does on every torch observer of ours: each rank then
holds the state of one process that saw all ranks' batches (README, "Distributed calibration").
``factory_kwargs`` go to the buffers.
"""

from __future__ import annotations

import numbers

import torch

from observers_core._validate import check_bool

from .torch import (
    KLObserver,
    MixObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    MSEObserver,
    PercentileObserver,
    to_core_dtype,
    to_core_qscheme,
)

__all__ = [
    "KLObserver",
    "MSEObserver",
    "MinMaxObserver",
    "MixObserver",
    "PercentileObserver",
    "PerChannelMinMaxObserver",
]

def _check_horizon_args(owner: str, ch_axis, dtype, qscheme, is_sync_quantize) -> bool:
    """Validate the Horizon-only arguments; ``True`` when ``ch_axis`` asks for per-channel ranges."""
    if isinstance(ch_axis, bool) or not isinstance(ch_axis, numbers.Integral):
        raise TypeError(f"ch_axis must be an int, got {type(ch_axis).__name__} {ch_axis!r}")
    if ch_axis < -1:
        raise ValueError(f"ch_axis={ch_axis} is not allowed; allowed: -1 (per tensor, Horizon's convention) or >= 0")
    to_core_dtype(dtype)
    per_channel = ch_axis >= 0
    scheme = to_core_qscheme(qscheme)
    if scheme.is_per_channel != per_channel:
        wanted = "a per_channel_* qscheme" if per_channel else "per_tensor_symmetric or per_tensor_affine"
        raise ValueError(
            f"ch_axis={ch_axis} observes {'per channel' if per_channel else 'per tensor'} and needs {wanted}, "
            f"got qscheme={scheme.value!r} ({owner})"
        )
    check_bool(is_sync_quantize, "is_sync_quantize")
    return per_channel


def _with_sync(is_sync_quantize, kwargs: dict) -> dict:
    """``kwargs`` with ``sync=True`` when ``is_sync_quantize`` (Horizon's flag) or ``sync`` asks for it."""
    return {**kwargs, "sync": bool(is_sync_quantize) or kwargs.get("sync", False)}


class MinMaxObserver(MovingAverageMinMaxObserver):
    r"""Horizon's ``observer_v2.MinMaxObserver``: moving-average min/max, per tensor for ``ch_axis=-1``
    (this class: ``MovingAverageMinMaxObserver(averaging_constant, dtype, qscheme, quant_min=...,
    quant_max=...)``), per channel for ``ch_axis >= 0`` (then a :class:`PerChannelMinMaxObserver` is
    returned). Defaults: ``averaging_constant=0.01``, ``dtype="qint8"``, ``per_tensor_symmetric``."""

    def __new__(
        cls,
        averaging_constant=0.01,
        ch_axis=-1,
        dtype="qint8",
        qscheme=torch.per_tensor_symmetric,
        quant_min=None,
        quant_max=None,
        is_sync_quantize=False,
        factory_kwargs=None,
        **kwargs,
    ):
        if cls is MinMaxObserver and _check_horizon_args(cls.__name__, ch_axis, dtype, qscheme, is_sync_quantize):
            return PerChannelMinMaxObserver(
                averaging_constant, ch_axis, dtype, qscheme, quant_min, quant_max, is_sync_quantize,
                factory_kwargs, **kwargs,
            )
        return super().__new__(cls)

    def __init__(
        self,
        averaging_constant=0.01,
        ch_axis=-1,
        dtype="qint8",
        qscheme=torch.per_tensor_symmetric,
        quant_min=None,
        quant_max=None,
        is_sync_quantize=False,
        factory_kwargs=None,
        **kwargs,
    ) -> None:
        if _check_horizon_args(type(self).__name__, ch_axis, dtype, qscheme, is_sync_quantize):
            raise ValueError(f"ch_axis={ch_axis} is per channel: use PerChannelMinMaxObserver")
        super().__init__(
            averaging_constant=averaging_constant, dtype=dtype, qscheme=qscheme, quant_min=quant_min,
            quant_max=quant_max, factory_kwargs=factory_kwargs, **_with_sync(is_sync_quantize, kwargs),
        )
        self.ch_axis = int(ch_axis)


class PerChannelMinMaxObserver(MovingAveragePerChannelMinMaxObserver):
    r"""Horizon's ``observer_v2.MinMaxObserver`` with ``ch_axis >= 0`` (what ``MinMaxObserver(ch_axis=c,
    qscheme=torch.per_channel_symmetric)`` returns): ``MovingAveragePerChannelMinMaxObserver(
    averaging_constant, ch_axis, dtype, qscheme, quant_min=..., quant_max=...)`` with Horizon's
    signature and defaults (``ch_axis=0``, ``dtype="qint8"``, ``per_channel_symmetric``)."""

    def __init__(
        self,
        averaging_constant=0.01,
        ch_axis=0,
        dtype="qint8",
        qscheme=torch.per_channel_symmetric,
        quant_min=None,
        quant_max=None,
        is_sync_quantize=False,
        factory_kwargs=None,
        **kwargs,
    ) -> None:
        if not _check_horizon_args(type(self).__name__, ch_axis, dtype, qscheme, is_sync_quantize):
            raise ValueError(f"ch_axis={ch_axis} is per tensor: use MinMaxObserver")
        super().__init__(
            averaging_constant=averaging_constant, ch_axis=ch_axis, dtype=dtype, qscheme=qscheme,
            quant_min=quant_min, quant_max=quant_max, factory_kwargs=factory_kwargs,
            **_with_sync(is_sync_quantize, kwargs),
        )

