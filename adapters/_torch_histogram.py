"""torch ``HistogramObserver``: a drop-in for ``torch.ao.quantization.HistogramObserver`` (torch 2.13).

Same constructor (``bins=2048``, ``dtype``, ``qscheme``, ``reduce_range``, ``quant_min``/``quant_max``,
``factory_kwargs``, ``eps``, ``is_dynamic``), buffers (``eps``, ``histogram``, ``min_val``, ``max_val``),
state_dict keys and versions, warnings and ``default_histogram_observer`` preset as torch's. The running
histogram is :func:`observers_core.histogram_update` and the search :func:`observers_core.non_linear_param_search`,
both bit for bit torch's arithmetic; this file holds the torch parts (buffers, warnings, state dicts).

Example::

    from torch.ao.quantization import QConfig
    from observers_core.adapters.torch import HistogramObserver, default_weight_observer

    qconfig = QConfig(activation=HistogramObserver.with_args(reduce_range=True), weight=default_weight_observer)

Differences from torch (see also :mod:`observers_core.adapters.torch`):

- ``upsample_rate`` (keyword-only, default 16) is honoured (torch 2.13 sets the attribute to 16 in
  ``__init__``; setting ``obs.upsample_rate`` afterwards works in both);
- configuration errors are ``ValueError``/``TypeError`` naming the argument: ``bins``, ``upsample_rate``,
  a ``dtype`` without integer bits, a per-channel ``qscheme`` and ``is_dynamic=True`` (the last two
  raise an exception that is also a ``NotImplementedError``, which torch raises). Accepted
  configurations are torch's (enumerated in ``tests/test_histogram_config_rules.py``, symmetric quint8
  with ``reduce_range=True`` included) except, on purpose: ``bins`` outside ``[1, 2**24]``, ``eps`` not
  positive and finite, a non-bool ``reduce_range``, and a custom range outside int32 (torch accepts
  them and fails or gives a zero/NaN scale later);
- NaN: by default the state becomes NaN (``min_val = max_val = NaN``, histogram kept, later batches
  ignored, NaN scale), with a warning, the same on every backend (torch raises ``RuntimeError`` from
  ``histc``); ``ignore_nonfinite=True`` skips NaN and +/-inf silently;
- inputs of every real dtype are binned in float32 (torch bins float64/float16 in their precision and
  rejects integers); counts are exact integers per batch (torch's float32 counts stop at ``2**24``);
- under ``torch.compile`` (any backend), ``forward`` and ``calculate_qparams`` are graph breaks
  (``torch.compiler.disable``): they run eagerly, with the compiled host kernels (numba) dynamo cannot
  trace, and give the eager results; the rest of the compiled function stays compiled;
- ``reset_histogram`` and ``load_state_dict`` check their inputs first (``ValueError``, buffers untouched);
  loaded ``min_val``/``max_val`` are copied into the buffers (torch replaces the buffers by the loaded
  tensors, device and dtype included).
"""

from __future__ import annotations

from functools import partial, reduce

import math
import warnings

import torch

from observers_core._histogram import HistogramState, histogram
from observers_core._dtypes import FLOAT32_EPS
from observers_core._l2_search import (
    check_read,
    device_qparams_route,
    histogram_qparams_on_device,
    non_linear_param_search,
    quantization_error,
)
from observers_core._validate import INF
from observers_core.families import histogram as family

from ._torch_distributed import merge_keys
from ._torch_backend import TORCH
from ._torch_minmax import all_or_nothing, buffer_attribute

# The core's histogram functions get the plain array-API namespace: they pass Python scalars to
# minimum/maximum/where, which the torch adapter's faster namespace (raw torch functions) rejects.

_INF_WARNING = "torch.inf detected in input tensor, ignoring input"
_NAN_WARNING = (
    "NaN detected in input tensor: the observer's min_val and max_val are NaN from now on and "
    "calculate_qparams gives a NaN scale (torch raises here); pass ignore_nonfinite=True to skip NaN"
)


class TorchHistogram:
    r"""The torch storage of ``HistogramObserver`` (the public class: ``TorchHistogram`` over the generic
    :class:`._array_histogram.HistogramObserver`, which checks the arguments, on torch's base): the buffers
    ``histogram``, ``min_val``, ``max_val``, torch's warnings, its helpers and state-dict versions.

    ``forward(x)``: ``min_val = min(min_val, min(x))``, ``max_val = max(max_val, max(x))``; ``x`` is binned
    (``bins`` bins) on the new range and added to the old histogram moved onto it (unchanged when the
    range did not change, through ``upsample_rate`` sub-bins per bin otherwise). +/-inf are dropped with
    torch's warning. ``calculate_qparams()``: the range ``[new_min, new_max]`` of the greedy search that
    minimises the L2 error of ``2**bits`` uniform levels (:meth:`_non_linear_param_search`), then
    ``s = max((max(new_max, 0) - min(new_min, 0)) / (Q_max - Q_min), eps)``,
    ``z = clamp(Q_min - round(min(new_min, 0) / s), Q_min, Q_max)`` (symmetric likewise).
    """

    histogram = buffer_attribute("histogram")

    def _init_range(self, factory_kwargs) -> None:
        factory_kwargs = TORCH.factory_kwargs(factory_kwargs)
        self.register_buffer("histogram", torch.zeros(self.bins, **factory_kwargs))
        self.register_buffer("min_val", torch.tensor(INF, **factory_kwargs))
        self.register_buffer("max_val", torch.tensor(-INF, **factory_kwargs))

    # -- state ---------------------------------------------------------------------------------------
    def _read_state(self) -> HistogramState:
        """The buffers as the core's float32 state (the buffers themselves when they are float32)."""
        buffers = self._buffers
        hist = buffers["histogram"]
        if hist.shape != (self.bins,):
            raise ValueError(f"the histogram buffer has shape {tuple(hist.shape)} but bins={self.bins}; "
                             "bins must not change after construction")  # fmt: skip
        return HistogramState(hist.float(), buffers["min_val"].float(), buffers["max_val"].float())

    _SYNC_BUFFERS = ("histogram", "min_val", "max_val")

    def _merge_replicas(self, states):
        """sync_observers: the family ``merge`` folded in rank order (torch's re-binning onto the union
        range; exact when the ranges agree, else within the bound of :mod:`observers_core.families.histogram`)."""
        config = self.update_config
        return merge_keys(states, self._SYNC_BUFFERS, partial(reduce, lambda a, b: family.merge(config, a, b)),
                          wrap=lambda *v: HistogramState(*(t.float() for t in v)))  # fmt: skip

    @torch.no_grad()  # buffers a user marked requires_grad take the copy, as torch's (which reassigns them)
    def _write_state(self, state: HistogramState) -> None:
        buffers = self._buffers
        for name, value in zip(("histogram", "min_val", "max_val"), state):
            buffers[name].copy_(value)

    # -- observe -------------------------------------------------------------------------------------
    @torch.compiler.disable
    def forward(self, x_orig):
        r"""Adds ``x`` to the running histogram (see the class docstring); returns ``x`` itself. Empty
        ``x``: nothing changes. Errors leave the buffers untouched. With ``sync``: every rank's ``x``
        (the range is agreed first, then the integer counts are summed; an empty ``x`` takes part)."""
        return self._observe_input(x_orig)

    def _check_input(self, x_orig) -> torch.Tensor:
        return TORCH.checked_input(x_orig, self._buffers["histogram"])

    def _observe(self, state: HistogramState, x: torch.Tensor, axis: None, collective) -> None:
        new, nonfinite = family.update_counting(self.update_config, state, x, collective=collective)
        if not self.ignore_nonfinite:  # torch's warning for +/-inf, ours for NaN (counted while binning)
            infs, nans = nonfinite.tolist()
            if nans:
                warnings.warn(_NAN_WARNING, stacklevel=4)
            elif infs:
                warnings.warn(_INF_WARNING, stacklevel=4)
        self._write_state(new)

    def reset_histogram(self, x: torch.Tensor, min_val: torch.Tensor, max_val: torch.Tensor) -> None:
        r"""Sets ``min_val``/``max_val`` and ``histogram = histc(x, bins, min_val, max_val)`` (torch's first
        batch; values outside the range, NaN and inf are not counted). ``min_val <= max_val``, one value
        each, else ``ValueError`` with the buffers untouched."""
        x = TORCH.checked_input(x, self._buffers["histogram"])
        self._read_state()  # checks the buffer against bins
        bounds = []
        for name, value in (("min_val", min_val), ("max_val", max_val)):
            value = torch.as_tensor(value, device=x.device)
            if value.numel() != 1:
                raise ValueError(f"{name} must hold one value (histogram min/max values must be scalar), "
                                 f"got shape {tuple(value.shape)}")  # fmt: skip
            bounds.append(value.reshape(()).float())
        lo, hi = bounds
        lo_f, hi_f = torch.stack(bounds).tolist()
        if not (math.isfinite(lo_f) and math.isfinite(hi_f) and lo_f <= hi_f):
            raise ValueError(f"min_val={lo_f} and max_val={hi_f} must be finite with min_val <= max_val")
        self._write_state(HistogramState(histogram(x, bins=self.bins, lo=lo, hi=hi, xp=TORCH.xp), lo, hi))

    # -- qparams -------------------------------------------------------------------------------------
    def _get_norm(self, delta_begin: torch.Tensor, delta_end: torch.Tensor, density: torch.Tensor) -> torch.Tensor:
        r"""torch's helper: the L2 norm of values spread uniformly over ``[delta_begin, delta_end]``,
        ``density * (delta_end**3 - delta_begin**3) / 3``."""
        return density * ((delta_end * delta_end * delta_end - delta_begin * delta_begin * delta_begin) / 3)

    def _compute_quantization_error(self, next_start_bin: int, next_end_bin: int) -> float:
        r"""torch's helper: the L2 error of quantizing bins ``next_start_bin .. next_end_bin`` onto
        ``dst_nbins`` levels (:func:`observers_core.quantization_error`), as a Python float."""
        state = self._read_state()
        return float(quantization_error(*state, next_start_bin, next_end_bin, dst_nbins=self.dst_nbins, xp=TORCH.xp))

    def _non_linear_param_search(self) -> tuple[torch.Tensor, torch.Tensor]:
        r"""``(new_min, new_max)`` of torch's greedy L2 search over the histogram
        (:func:`observers_core.non_linear_param_search` with ``dst_nbins`` levels), as 0-d float32 tensors."""
        state = self._read_state()
        return non_linear_param_search(*state, dst_nbins=self.dst_nbins, xp=TORCH.xp)

    @torch.compiler.disable
    def calculate_qparams(self):  # type: ignore[override]
        r"""Scale and zero point of the searched range. Before any input: torch's warning and
        ``(tensor([1.]), tensor([0]))``; after a NaN input: a warning and a NaN scale."""
        state = self._read_state()
        if device_qparams_route(state, xp=TORCH.xp) and self.eps.dtype == torch.float32:
            return self._qparams_on_device(state)
        lo, hi = torch.stack((state.min_val, state.max_val)).tolist()
        if lo == INF and hi == -INF:
            return self._calculate_qparams(self.min_val, self.max_val)  # torch's warning and defaults
        if math.isnan(lo) or math.isnan(hi):
            warnings.warn("min_val and max_val are NaN (the observer saw NaN): the scale is NaN", stacklevel=2)
        new_min, new_max = self._non_linear_param_search()
        return self._calculate_qparams(new_min, new_max)

    def _qparams_on_device(self, state: HistogramState) -> tuple[torch.Tensor, torch.Tensor]:
        r""":meth:`calculate_qparams` on the torch CUDA path: the search and the qparams in one Triton kernel
        (``eps`` read from its buffer there), then one host read for torch's warnings and the checks."""
        spec = self._quant_spec(eps=FLOAT32_EPS)  # (the kernel reads the eps buffer instead)
        (scale, zero_point), read = histogram_qparams_on_device(state, spec, dst_nbins=self.dst_nbins, eps=self.eps)
        if read.empty:
            return self._default_qparams(self.min_val)  # torch's warning and defaults
        if read.nan:
            warnings.warn("min_val and max_val are NaN (the observer saw NaN): the scale is NaN", stacklevel=3)
        check_read(read)
        return scale, zero_point

    # -- state dict ----------------------------------------------------------------------------------
    @all_or_nothing
    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        version = local_metadata.get("version", None)
        TORCH.entries(state_dict, prefix, ("histogram", "min_val", "max_val", "eps"))  # NumPy/JAX/CuPy entries
        keys = {name: prefix + name for name in ("histogram", "min_val", "max_val")}
        if version is None or version < 3:
            # before version 3, never-updated min_val/max_val had shape (0,)
            for name, fill in (("min_val", INF), ("max_val", -INF)):
                value = state_dict.get(keys[name])
                if isinstance(value, torch.Tensor) and value.shape == (0,):
                    state_dict[keys[name]] = torch.tensor(fill)
        if all(isinstance(state_dict.get(k), torch.Tensor) for k in keys.values()):
            # checked before anything changes; the values are then copied into the buffers by the base
            checked = self._checked_entries({name: state_dict[key] for name, key in keys.items()})
            for key, value in zip(keys.values(), checked):
                state_dict[key] = torch.from_numpy(value)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def extra_repr(self):
        rate = "" if self.upsample_rate == 16 else f", upsample_rate={self.upsample_rate}"
        return f"min_val={self.min_val}, max_val={self.max_val}" + rate + self._repr_suffix()
