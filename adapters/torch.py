"""Drop-in replacements for ``torch.ao.quantization.observer`` (torch 2.13), built on the pure core.

Same class names, constructor arguments, defaults, buffers (``eps``, ``min_val``, ``max_val``),
state_dict keys and versions as torch's observers; every class subclasses torch's ``ObserverBase``,
so ``QConfig``, ``prepare``/``convert`` and ``FakeQuantize`` accept them. The statistics and the
qparams come from the core (:func:`observers_core.minmax_update`, :func:`moving_average_update`,
:func:`calculate_qparams`, :func:`quant_spec`); this file only holds the torch-specific parts:
buffers, dtype/qscheme names, state_dict versioning and torch's host-side checks.

Example::

    import torch
    from torch.ao.quantization import QConfig
    from observers_core.adapters.torch import MinMaxObserver, default_per_channel_weight_observer

    qconfig = QConfig(activation=MinMaxObserver.with_args(reduce_range=True),
                      weight=default_per_channel_weight_observer)

Distributed calibration (``torch.distributed``): every observer with statistics takes the keyword-only
``sync=False, process_group=None``; with ``sync=True`` each ``forward`` reduces the batch statistics
across the group (:class:`TorchCollective`) so every rank holds the state of one process that saw all
ranks' batches. :func:`sync_observers` merges a prepared model's observers across ranks after
calibration instead. Semantics per family and bytes per batch: README, "Distributed calibration".

On CUDA, :func:`cuda_graph_forward` records an observer's ``forward`` once as a CUDA graph and replays it
per batch (same state, bit for bit; no per-kernel launches from Python).

Each public class is written out here: the generic class of ``adapters/_array_*.py`` (signature, argument
checks, the steps through ``observers_core.families``) on torch's storage (``TorchBuffers`` and its
per-family companions in ``adapters/_torch_*.py``: registered buffers written in place, state-dict
versions, torch's exception types) and torch's ``ObserverBase``, e.g.
``class MinMaxObserver(TorchRange, generic.MinMaxObserver, UniformQuantizationObserverBase)``.

Deliberate differences from torch are listed, each with the test that pins it, in README.md
("Differences from torch.ao"). The observers are eager-only for ``torch.jit.script``; ``FusedMovingAvgObsFakeQuantize``
and ``FixedQParamsFakeQuantize`` insist on torch's own observer classes.
"""

from __future__ import annotations

import torch
from torch.ao.quantization import observer as _torch_observer

from observers_core._fixed import check_fixed_observer, check_fixed_qparams
from observers_core._minmax import mean_of_replicas
from observers_core._validate import check_float
from ._torch_llm import (  # noqa: F401  (the LLM family and ModelOpt's calibrators: docs/llm.md)
    LLMObserver,
    ModelOptMseCalibrator,
    NVFP4SweepCalibrator,
    llm_fused_global_scale,
)

from . import _array_calibration as calibration
from . import _array_histogram as histogram
from . import _array_lowbit as lowbit
from . import _array_observers as generic
from ._torch_backend import TORCH, TORCH_DTYPES, TORCH_QSCHEMES, to_core_dtype, to_core_qscheme
from ._torch_calibration import TorchCalibration, TorchKL
from ._torch_cuda_graph import cuda_graph_forward
from ._torch_distributed import GroupCollective, sync_observers
from ._torch_histogram import TorchHistogram
from ._torch_lowbit import TorchLowBit
from ._torch_minmax import (
    ObserverBase,
    TorchBuffers,
    TorchModule,
    TorchPerChannel,
    TorchRange,
    all_or_nothing,
    get_observer_state_dict,
    load_observer_state_dict,
)
from ._torch_pt2e import link_torchao, pt2e_observer

__all__ = [
    "ObserverBase", "UniformQuantizationObserverBase", "MinMaxObserver", "MovingAverageMinMaxObserver",
    "PerChannelMinMaxObserver", "MovingAveragePerChannelMinMaxObserver", "FixedQParamsObserver",
    "PlaceholderObserver", "RecordingObserver", "NoopObserver", "ReuseInputObserver", "HistogramObserver",
    "KLObserver", "MSEObserver", "PercentileObserver", "MixObserver", "LowBitObserver",
    "PerGroupMinMaxObserver", "FP8Observer", "PerBlockMXObserver", "PerBlockBFPObserver", "TorchCollective",
    "sync_observers", "cuda_graph_forward", "default_observer", "default_placeholder_observer",
    "default_debug_observer", "default_weight_observer", "weight_observer_range_neg_127_to_127",
    "default_per_channel_weight_observer", "per_channel_weight_observer_range_neg_127_to_127",
    "default_dynamic_quant_observer", "default_float_qparams_observer", "default_float_qparams_observer_4bit",
    "default_fixed_qparams_range_neg1to1_observer", "default_fixed_qparams_range_0to1_observer",
    "default_symmetric_fixed_qparams_observer", "default_affine_fixed_qparams_observer",
    "default_reuse_input_observer", "default_histogram_observer", "get_observer_state_dict",
    "load_observer_state_dict", "to_core_dtype", "to_core_qscheme",
]


# -- torch.ao's min/max family --------------------------------------------------------------------------



@pt2e_observer
class UniformQuantizationObserverBase(TorchBuffers, generic.UniformQuantizationObserverBase, ObserverBase):
    r"""Common base of the observers that compute an affine/symmetric scale and zero point (torch.ao's
    name): the configuration of :class:`._array_observers.UniformQuantizationObserverBase` stored as
    torch.ao stores it (:class:`TorchBuffers`); ``calculate_qparams`` calls the core's
    ``calculate_qparams``: affine ``s = max((max(x_max, 0) - min(x_min, 0)) / (Q_max - Q_min), eps)``,
    ``z = clamp(Q_min - round(min(x_min, 0) / s), Q_min, Q_max)``; symmetric
    ``s = max(max(-min(x_min, 0), max(x_max, 0)) / ((Q_max - Q_min) / 2), eps)``."""


# torch's former name, kept there for backwards compatibility
_ObserverBase = UniformQuantizationObserverBase


class MinMaxObserver(TorchRange, generic.MinMaxObserver, UniformQuantizationObserverBase):
    r"""Running min/max per tensor: ``x_min = min(x_min, min(X))``, ``x_max = max(x_max, max(X))``; torch.ao's
    ``MinMaxObserver`` (``ignore_nonfinite=True`` skips NaN/Inf; by default a NaN poisons min/max, as in torch)."""


class MovingAverageMinMaxObserver(generic.MovingAverageMinMaxObserver, MinMaxObserver):
    r"""Moving average of the per-batch range: ``x_min = x_min + c * (min(X) - x_min)`` (likewise ``x_max``);
    the first input sets the range. ``c = averaging_constant`` in ``[0, 1]``, read at each batch."""

    _REPLICA_MERGE = staticmethod(mean_of_replicas)  # sync_observers: the mean of the replicas


class PerChannelMinMaxObserver(TorchPerChannel, generic.PerChannelMinMaxObserver, UniformQuantizationObserverBase):
    r"""Running min/max per channel along ``ch_axis``; qparams per channel. Per channel with
    ``per_channel_affine_float_qparams``: ``s = (x_max - x_min) / (Q_max - Q_min)`` (1 where ``s <= eps``),
    ``z = -x_min / s``. The buffers are empty until the first batch fixes the number of channels."""


class MovingAveragePerChannelMinMaxObserver(generic.MovingAveragePerChannelMinMaxObserver, PerChannelMinMaxObserver):
    r"""Per-channel moving average: ``x_min[c] = x_min[c] + a * (min(X[c]) - x_min[c])`` with
    ``a = averaging_constant`` in ``[0, 1]``; the first input sets the ranges."""

    _REPLICA_MERGE = staticmethod(mean_of_replicas)  # sync_observers: the mean of the replicas


# -- histogram (torch's L2 search), calibration (Horizon observer_v2), low-bit formats ----------------------


class HistogramObserver(TorchHistogram, histogram.HistogramObserver, UniformQuantizationObserverBase):
    r"""torch.ao's ``HistogramObserver``: a running histogram of everything observed and torch's L2 search for
    the clipping range (:class:`TorchHistogram`), plus ``upsample_rate`` and ``ignore_nonfinite``."""


class PercentileObserver(TorchCalibration, calibration.PercentileObserver, UniformQuantizationObserverBase):
    __doc__ = calibration.PercentileObserver.__doc__


class MSEObserver(TorchCalibration, calibration.MSEObserver, UniformQuantizationObserverBase):
    __doc__ = calibration.MSEObserver.__doc__


class MixObserver(TorchCalibration, calibration.MixObserver, UniformQuantizationObserverBase):
    __doc__ = calibration.MixObserver.__doc__


class KLObserver(TorchKL, calibration.KLObserver, UniformQuantizationObserverBase):
    __doc__ = calibration.KLObserver.__doc__


@pt2e_observer
class LowBitBase(TorchModule, generic.StatefulObserver, ObserverBase):
    """torch's base of the low-bit observers (``nn.Module``, torch's ``ObserverBase``, state-dict version 1)."""

    _version = 1


class LowBitObserver(TorchLowBit, lowbit.LowBitObserver, LowBitBase):
    r"""Any low-bit format of :func:`observers_core.lowbit_spec` (the four classes below fix the family).

    ``forward(x)`` records ``lowbit_stats(x)`` (merged with ``minmax_merge``, or alone when
    ``is_dynamic``) and returns ``x``; ``calculate_qparams()`` is ``lowbit_qparams`` of the buffers:
    ``(scale, zero_point)`` for integers and fp8, ``BlockScale(scale, exponent)`` (uint8 E8M0 codes) for
    MX and BFP16. ``ignore_nonfinite=True`` skips NaN/+-Inf (BFP16 always does).

    ``sync=True`` (keyword-only, with ``process_group=None``: the default group): each batch's statistics
    are merged across the ranks before they are recorded (every rank's ``x`` must have the same shape,
    an empty ``x`` takes part once the statistics exist), so every rank holds the same statistics.
    """


class PerGroupMinMaxObserver(lowbit.PerGroupMinMaxObserver, LowBitObserver):
    __doc__ = lowbit.PerGroupMinMaxObserver.__doc__


class FP8Observer(lowbit.FP8Observer, LowBitObserver):
    __doc__ = lowbit.FP8Observer.__doc__


class PerBlockMXObserver(lowbit.PerBlockMXObserver, LowBitObserver):
    __doc__ = lowbit.PerBlockMXObserver.__doc__


class PerBlockBFPObserver(lowbit.PerBlockBFPObserver, LowBitObserver):
    __doc__ = lowbit.PerBlockBFPObserver.__doc__


class TorchCollective(GroupCollective):
    __doc__ = GroupCollective.__doc__


# -- observers without statistics ----------------------------------------------------------------
# These subclass torch's own classes, so torch's ``isinstance`` checks (``get_qparam_dict`` for
# placeholders, ``_is_reuse_input_qconfig``) recognise them too.


@pt2e_observer
class FixedQParamsObserver(_torch_observer.FixedQParamsObserver):
    r"""Returns the fixed ``(scale, zero_point)`` it was built with; ``forward`` only passes ``x`` on.

    Checked: ``scale`` is a positive finite float, ``zero_point`` an int in ``[quant_min, quant_max]``,
    ``dtype``/``qscheme`` known and per tensor. (torch's ``FixedQParamsFakeQuantize`` insists on torch's
    exact class; use torch's ``FixedQParamsObserver`` there.)
    """

    def __init__(
        self,
        scale,
        zero_point,
        dtype=torch.quint8,
        qscheme=torch.per_tensor_affine,
        quant_min=0,
        quant_max=255,
        is_dynamic=False,
        **kwargs,
    ):
        link_torchao()
        spec, scale, zero_point = check_fixed_observer(
            scale, zero_point, dtype=to_core_dtype(dtype), qscheme=to_core_qscheme(qscheme), quant_min=quant_min,
            quant_max=quant_max, is_dynamic=is_dynamic,
        )
        super().__init__(
            float(scale[0]), int(zero_point[0]), dtype=TORCH_DTYPES[spec.dtype], qscheme=TORCH_QSCHEMES[spec.qscheme],
            quant_min=spec.quant_min, quant_max=spec.quant_max, is_dynamic=False, **kwargs,
        )

    @all_or_nothing
    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        """``scale`` and ``zero_point`` from any framework's arrays, checked before anything changes
        (:func:`observers_core._state_dict.check_fixed_qparams`; an entry that is missing is checked as
        the buffer it leaves in place)."""
        scale_key, zp_key = TORCH.entries(state_dict, prefix, ("scale", "zero_point"))
        if scale_key in state_dict or zp_key in state_dict:
            check_fixed_qparams(state_dict.get(scale_key, self.scale), state_dict.get(zp_key, self.zero_point),
                                self.quant_min, self.quant_max, loaded=True)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


@pt2e_observer
class PlaceholderObserver(_torch_observer.PlaceholderObserver):
    r"""Observes nothing; carries ``dtype``/``is_dynamic`` (e.g. float16 or dynamic quantization) to
    the quantized module's ``from_float``. ``calculate_qparams`` raises, as in torch. ``qscheme`` (when
    given) must be a known scheme and ``eps`` a finite float, as on every framework (torch stores anything)."""

    def __init__(self, dtype=torch.float32, custom_op_name="", compute_dtype=None, quant_min=None, quant_max=None,
                 qscheme=None, eps=None, is_dynamic=False) -> None:
        if qscheme is not None:
            to_core_qscheme(qscheme)
        if eps is not None:
            check_float(eps, "eps")
        super().__init__(dtype, custom_op_name, compute_dtype, quant_min, quant_max, qscheme, eps, is_dynamic)


@pt2e_observer
class RecordingObserver(_torch_observer.RecordingObserver):
    r"""Debug observer: appends a clone of every observed tensor to ``tensor_val``."""


@pt2e_observer
class NoopObserver(_torch_observer.NoopObserver):
    r"""Observes nothing (float16 quantization); ``calculate_qparams`` raises, as in torch."""


@pt2e_observer
class ReuseInputObserver(_torch_observer.ReuseInputObserver):
    r"""Marks an op (e.g. ``reshape``) that reuses its input's observer (FX graph mode only)."""


# -- presets (torch's ``default_*``; ``default_histogram_observer`` comes with HistogramObserver) --

default_observer = MinMaxObserver.with_args(quant_min=0, quant_max=127)
"""Default observer for static quantization (activations in [0, 127]), usually used for debugging."""

default_placeholder_observer = PlaceholderObserver
"""Default placeholder observer, usually used for quantization to torch.float16."""

default_debug_observer = RecordingObserver
"""Default debug-only observer."""

default_weight_observer = MinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
"""Default weight observer."""

def _range_neg_127_to_127(cls, qscheme):
    """``cls`` with torch's arguments of the two ``*_range_neg_127_to_127`` presets (qint8 in [-127, 127])."""
    return cls.with_args(dtype=torch.qint8, qscheme=qscheme, quant_min=-127, quant_max=127, eps=2**-12)


weight_observer_range_neg_127_to_127 = _range_neg_127_to_127(MinMaxObserver, torch.per_tensor_symmetric)
"""Symmetric weight observer with the 8-bit values restricted to [-127, +127], excluding -128."""

default_per_channel_weight_observer = PerChannelMinMaxObserver.with_args(
    dtype=torch.qint8, qscheme=torch.per_channel_symmetric
)
"""Default per-channel weight observer (fbgemm/x86 backends)."""

per_channel_weight_observer_range_neg_127_to_127 = _range_neg_127_to_127(
    PerChannelMinMaxObserver, torch.per_channel_symmetric
)
"""Per-channel, symmetric weight observer with the 8-bit values restricted to [-127, +127]."""

default_dynamic_quant_observer = PlaceholderObserver.with_args(
    dtype=torch.quint8,
    quant_min=0,
    quant_max=255,
    is_dynamic=True,
)
"""Default observer for dynamic quantization."""

default_float_qparams_observer = PerChannelMinMaxObserver.with_args(
    dtype=torch.quint8, qscheme=torch.per_channel_affine_float_qparams, ch_axis=0
)
"""Default observer for a floating point zero-point."""

default_float_qparams_observer_4bit = PerChannelMinMaxObserver.with_args(
    dtype=torch.quint4x2, qscheme=torch.per_channel_affine_float_qparams, ch_axis=0
)
"""Default observer for a floating point zero-point and 4 bit activations."""

default_fixed_qparams_range_neg1to1_observer = FixedQParamsObserver.with_args(
    scale=2.0 / 256.0, zero_point=128, dtype=torch.quint8, quant_min=0, quant_max=255
)
default_fixed_qparams_range_0to1_observer = FixedQParamsObserver.with_args(
    scale=1.0 / 256.0, zero_point=0, dtype=torch.quint8, quant_min=0, quant_max=255
)
# torch keeps these two names for backwards compatibility
default_symmetric_fixed_qparams_observer = default_fixed_qparams_range_neg1to1_observer
default_affine_fixed_qparams_observer = default_fixed_qparams_range_0to1_observer
"""Default observers for fixed-qparams operations (sigmoid, tanh...)."""

default_reuse_input_observer = ReuseInputObserver
"""Default observer for ops like reshape that reuse the observer of their input."""

default_histogram_observer = HistogramObserver.with_args(quant_min=0, quant_max=127)
"""Default histogram observer, usually used for PTQ (activations in [0, 127])."""
