"""torch calibration observers (Horizon ``observer_v2``): KL, MSE, percentile and mix as ``nn.Module``s.

They subclass this package's ``UniformQuantizationObserverBase`` (itself torch's ``ObserverBase``, so
``with_args``, ``QConfig``, ``prepare``/``convert`` and ``FakeQuantize`` accept them) and keep the averaged
range in the buffers ``min_val``/``max_val`` (0-d per tensor; empty until the first batch, then
``(C,)``, per channel) next to ``eps``: ``state_dict``, ``torch.save``/``torch.load``,
``copy.deepcopy`` and ``.to(device)`` work. KLObserver's accumulated histogram lives in non-persistent
buffers (moved by ``.to``, not saved, as in Horizon). The configuration, the searches and the moving
average are those of :mod:`observers_core.adapters._array_calibration` (see its docstring for the
formulas and the deliberate differences from Horizon); ``dtype`` takes names or torch dtypes
(``torch.qint8``), ``qscheme`` torch's objects or names. The observers are eager-only.

Unlike the array observers, these take Horizon's ``is_sync_quantize=True`` (or ``sync=True``,
``process_group=``): every batch's histogram counts, ranges and Mix errors are reduced across the
``torch.distributed`` group before the update, so every rank holds the state of one process that saw
every rank's batch (KL: the accumulator). ``sync_observers`` merges unsynced replicas afterwards.

Horizon's ``observer_v2.MinMaxObserver`` (moving average, ``ch_axis=-1``, qint8 symmetric) is not
exported under that name here (torch's ``MinMaxObserver`` owns it): it is
``observers_core.adapters.horizon.MinMaxObserver`` (Horizon's signature, with these four classes), built on
``MovingAverageMinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)`` or, per channel,
``MovingAveragePerChannelMinMaxObserver(ch_axis=c, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)``.

Example::

    import torch
    from torch.ao.quantization import QConfig
    from observers_core.adapters.torch import KLObserver, MixObserver

    qconfig = QConfig(activation=KLObserver.with_args(update_interval=32),
                      weight=MixObserver.with_args(ch_axis=0, qscheme=torch.per_channel_symmetric))
"""

from __future__ import annotations

import dataclasses
from functools import partial, reduce

import torch

from observers_core import CalibHistogram
from observers_core._minmax import MinMaxState, mean_of_replicas
from observers_core._validate import INF, UnsupportedConfigError, check_averaging_constant, check_bool, check_int

from observers_core.families import calibration as family

from . import _array_calibration as _base
from ._torch_distributed import merge_keys
from ._torch_backend import TORCH
from ._torch_minmax import TorchRange, all_or_nothing


#: KLObserver's non-persistent buffers: the fields of ``KLAccumulator`` (histogram, then range).
_ACC_BUFFERS = ("hist_counts", "hist_lo", "hist_width", "hist_min_val", "hist_max_val", "seen_min_val", "seen_max_val")


class TorchCalibration:
    """The torch storage of the four observers (the public classes: ``TorchCalibration`` over the generic
    class, which checks the arguments, on torch's base): the averaged range in the buffers ``min_val``/
    ``max_val``, the settable ``averaging_constant``, the searches re-reading torch's attributes, state-dict
    loads. Beyond Horizon's signature: torch's ``eps`` (the searches' too), ``is_dynamic=False`` (torch's
    flows pass it) and the distributed ``sync``/``process_group``; ``is_sync_quantize=True`` (Horizon's
    flag) is ``sync=True``: statistics synced per batch across the default group (or ``process_group=``)."""

    _REPLICA_MERGE = staticmethod(mean_of_replicas)  # sync_observers: the averaged ranges' mean
    load_state_dict = torch.nn.Module.load_state_dict

    def _calibration_backend(self, owner, is_sync_quantize, backend):
        """torch's keywords besides Horizon's (no reduce_range/ignore_nonfinite, which the searches would not
        follow); ``is_sync_quantize`` becomes ``sync``."""
        _base.refuse_unknown(owner, {k: v for k, v in backend.items() if k not in ("eps", "is_dynamic", "sync",
                                                                                 "process_group")})
        if check_bool(backend.get("is_dynamic", False), "is_dynamic"):
            raise UnsupportedConfigError(f"is_dynamic=True is not supported by {owner} (no dynamic quantization)")
        sync = check_bool(backend.get("sync", False), "sync") | check_bool(is_sync_quantize, "is_sync_quantize")
        return {**backend, "sync": sync}, False

    per_channel = property(lambda self: self._PER_CHANNEL, doc="Whether ``ch_axis >= 0`` (per channel).")

    @property
    def averaging_constant(self) -> float:
        """``c`` of the moving average of the searched ranges. Settable, as on torch.ao's moving averages:
        checked (a float in ``[0, 1]``) and used from the next batch on."""
        return self.config.averaging_constant

    @averaging_constant.setter
    def averaging_constant(self, value) -> None:
        self.config = dataclasses.replace(self.config, averaging_constant=check_averaging_constant(value))

    def _set_search_eps(self, eps: float) -> None:
        """The searches' ``eps`` (the MSE candidates' quantizer's): the ``eps`` buffer's, at construction and
        after a load (the buffer is not read per batch: a device read on CUDA)."""
        self.config = dataclasses.replace(self.config, spec=dataclasses.replace(self.config.spec, eps=eps))

    def _search_config(self) -> family.CalibConfig:
        """``config`` with the quantizer of the current ``dtype``/``qscheme``/``quant_min``/``quant_max``: torch.ao
        reads them at each call, so set after construction they reach the searches too (checked: per channel
        stays per channel, ``bins`` covers the levels); kept from then on."""
        config = family.with_spec(self.config, self._quant_spec(eps=self.config.spec.eps))
        if config is not self.config:
            self.config = config
        return config

    # -- qparams and state ---------------------------------------------------------------------
    @all_or_nothing
    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        if self._PER_CHANNEL:
            self._fit_to_loaded(state_dict, prefix)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if not self.eps.is_meta:  # (a meta observer holds no values: torch's load into it copies nothing)
            self._set_search_eps(float(self.eps.reshape(-1)[0]))  # a loaded eps reaches the searches

    def reset_min_max_vals(self):
        """Forget the averaged range (per channel, the channel count too)."""
        TorchRange.reset_min_max_vals(self)
        self.last_choice = None

    def extra_repr(self):
        return family.describe(self.config, self.ch_axis) + f", min_val={self.min_val}, max_val={self.max_val}"


class TorchKL(TorchCalibration):
    """KLObserver's torch storage: the accumulator in non-persistent buffers."""

    def _init_accumulator(self) -> None:
        for name in _ACC_BUFFERS:
            self.register_buffer(name, torch.tensor([], device=self.eps.device), persistent=False)

    _SYNC_BUFFERS = ("min_val", "max_val", *_ACC_BUFFERS)

    @property
    def update_interval(self) -> int:
        """Batches between KL updates. Settable: checked (an int >= 1) and used from the next batch on (the
        batch count stays)."""
        return self.config.update_interval

    @update_interval.setter
    def update_interval(self, value) -> None:
        self.config = dataclasses.replace(self.config, update_interval=check_int(value, "update_interval", minimum=1))

    def _apply(self, fn, recurse=True):
        """``.to(device)``, ``.cuda()``, ``share_memory()`` apply to the accumulator; a dtype conversion
        (``.half()``, ``.double()``, ``.to(dtype)``) does not: its grid's origin and power-of-two width stay
        float32 (float16 would round them, or overflow to inf) while ``min_val``/``max_val`` convert as
        torch's buffers do."""
        before = {name: self._buffers[name] for name in _ACC_BUFFERS}
        super()._apply(fn, recurse)
        for name, old in before.items():
            if self._buffers[name].dtype != old.dtype:
                self._buffers[name] = old.to(self._buffers[name].device)
        return self

    def _merge_replicas(self, states):
        """sync_observers: the mean of the averaged ranges, and ``kl_merge`` of the accumulators (exact)."""
        merge = partial(TORCH.run, family.kl_merge, xp=TORCH.xp)
        acc = merge_keys(states, _ACC_BUFFERS, partial(reduce, merge),
                         wrap=lambda *v: family.KLAccumulator(CalibHistogram(*v[:5]), MinMaxState(*v[5:])))  # fmt: skip
        return {**super()._merge_replicas(states), **acc}

    @property
    def accumulator(self) -> family.KLAccumulator | None:
        """The accumulated histogram of ``|x|`` and finite range (views of the non-persistent buffers;
        ``None`` before the first batch; not in the state dict)."""
        values = [self._buffers[name] for name in _ACC_BUFFERS]
        if values[0].numel() == 0:
            return None
        return family.KLAccumulator(CalibHistogram(*values[:5]), MinMaxState(*values[5:]))

    _read_accumulator = accumulator.fget

    def _write_accumulator(self, acc: family.KLAccumulator) -> None:
        for name, value in zip(_ACC_BUFFERS, (*acc.hist, *acc.seen)):
            self._buffers[name] = value

    def _nothing_seen(self) -> bool:
        """Whether the buffers are empty or ``+inf``/``-inf`` everywhere (per tensor they start so)."""
        min_val, max_val = self.min_val, self.max_val
        return min_val.numel() == 0 or bool(((min_val == INF) & (max_val == -INF)).all())

    def reset_min_max_vals(self):
        """Forget everything seen: the averaged range, the histogram and the batch count."""
        super().reset_min_max_vals()
        self._empty_buffers(_ACC_BUFFERS)
        self.num_steps = 0
        self._kl_ran = False

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """The base's load; a range of another channel count than the accumulator's empties the accumulator,
        as on every framework (the batch count stays)."""
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        acc, state = self.accumulator, self._read_state()
        if acc is not None and state is not None and family.kl_channels_differ(acc, state):
            self._empty_buffers(_ACC_BUFFERS)

    def extra_repr(self):
        return super().extra_repr() + f", num_steps={self.num_steps}"
