"""torch low-bit observers: per-group integers, fp8, OCP MX and BFP16 as ``nn.Module`` observers.

They subclass torch's ``ObserverBase`` (so ``with_args``, ``QConfig`` and torch's observer tooling
recognise them) and keep their statistics in two buffers, ``min_val`` and ``max_val`` (empty until the
first batch, then the per-group shape; float32, or float64 for float64 inputs), so ``state_dict``,
``torch.save``/``torch.load``, ``copy.deepcopy`` and ``.to(device)`` work. The configuration, the
update and the qparams are those of :mod:`observers_core.adapters._array_lowbit` (the core's
:func:`~observers_core.lowbit_spec`, :func:`~observers_core.lowbit_stats` merged with
:func:`~observers_core.minmax_merge`, :func:`~observers_core.lowbit_qparams`). ``dtype`` takes the
core's names or, where one exists, the torch dtype (``torch.int4``, ``torch.float8_e4m3fn``...).
The observers are eager-only; ``fake_quantize`` computes no gradient.

Example::

    import torch
    from observers_core.adapters.torch import PerGroupMinMaxObserver

    obs = PerGroupMinMaxObserver(torch.int4, axis=-1, group_size=128)
    obs(linear.weight)
    scale, zero_point = obs.calculate_qparams()      # (out_features, in_features // 128)
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from observers_core._lowbit import lowbit_fake_quantize, lowbit_qparams
from observers_core._minmax import MinMaxState
from observers_core._state_dict import check_entry

from observers_core.families import lowbit as lowbit_family

from . import _array_lowbit as _base
from ._catalog import constructor_on
from observers_core._validate import check_bool

from ._array_observers import ObserveLoop
from ._torch_distributed import SyncMixin
from ._torch_backend import TORCH, to_lowbit_dtype
from ._torch_minmax import EagerOnly, ObserverBase, RangeBuffers, all_or_nothing
from ._torch_pt2e import link_torchao, pt2e_observer

__all__ = list(_base.__all__)

@pt2e_observer
class _LowBitObserver(SyncMixin, ObserveLoop, RangeBuffers, EagerOnly, ObserverBase):
    r"""Any low-bit format of :func:`observers_core.lowbit_spec` (the four classes below fix the family).

    ``forward(x)`` records ``lowbit_stats(x)`` (merged with ``minmax_merge``, or alone when
    ``is_dynamic``) and returns ``x``; ``calculate_qparams()`` is ``lowbit_qparams`` of the buffers:
    ``(scale, zero_point)`` for integers and fp8, ``BlockScale(scale, exponent)`` (uint8 E8M0 codes) for
    MX and BFP16. ``ignore_nonfinite=True`` skips NaN/+-Inf (BFP16 always does).

    ``sync=True`` (keyword-only, with ``process_group=None``: the default group): each batch's statistics
    are merged across the ranks before they are recorded (every rank's ``x`` must have the same shape,
    an empty ``x`` takes part once the statistics exist), so every rank holds the same statistics.
    """

    _version = 1
    _FAMILY: str | None = None

    min_val: torch.Tensor
    max_val: torch.Tensor

    def _setup(self, dtype, *, is_dynamic=False, ignore_nonfinite=False, factory_kwargs=None, sync=False,
               process_group=None, **layout) -> None:
        """What the public constructors forward to; ``layout``: ``make_spec``'s keywords."""
        link_torchao()
        spec = lowbit_family.make_spec(type(self).__name__, self._FAMILY, to_lowbit_dtype(dtype), **layout)
        ignore_nonfinite = check_bool(ignore_nonfinite, "ignore_nonfinite")
        is_dynamic = check_bool(is_dynamic, "is_dynamic")
        factory_kwargs = TORCH.factory_kwargs(factory_kwargs)
        super().__init__(dtype=spec.dtype, is_dynamic=is_dynamic)
        self.spec = spec
        self.ignore_nonfinite = ignore_nonfinite
        self._init_sync(sync, process_group)
        self.register_buffer("min_val", torch.tensor([], **factory_kwargs))
        self.register_buffer("max_val", torch.tensor([], **factory_kwargs))

    # -- the observe step (every framework's ObserveLoop) over the buffers -------------------------
    def forward(self, x_orig):
        r"""Records the statistics of ``x`` (static: merged with the previous ones; dynamic: alone);
        returns ``x`` itself. Errors leave the buffers untouched."""
        return self._observe_input(x_orig)

    def _check_input(self, x_orig) -> torch.Tensor:
        x = TORCH.checked_input(x_orig, self._buffers["min_val"])
        lowbit_family.check_axis(x, self.spec)
        return x

    def _fitting_state(self, state: MinMaxState | None, x: torch.Tensor, axis: None) -> MinMaxState | None:
        return None if self.is_dynamic else state  # the device is checked with the input

    def _compute_update(self, state: MinMaxState | None, x: torch.Tensor, axis: None, collective) -> MinMaxState:
        return lowbit_family.observe(state, x, spec=self.spec, ignore_nonfinite=self.ignore_nonfinite, xp=TORCH.fast_xp,
                                     collective=collective)  # fmt: skip

    def _write_state(self, state: MinMaxState) -> None:
        if self.is_dynamic or self._buffers["min_val"].numel() == 0:  # the statistics fix shape and dtype
            self._buffers.update(zip(self._RANGE, state))
        else:
            super()._write_state(state)

    def convert(self, model, node):
        """Called by torchao's ``convert_pt2e`` in place of its lowering: refused, since torchao's PT2E
        has no quantize/dequantize op for these formats (leaving the observer out would silently give a
        float model)."""
        raise NotImplementedError(
            f"{type(self).__name__} ({self.spec.dtype}) cannot be lowered by torchao's convert_pt2e: it has no "
            "quantize/dequantize op for per-group, fp8-with-block-scale, MX or BFP formats. Use "
            "calculate_qparams()/fake_quantize() directly, or a per-tensor/per-channel observer in the PT2E flow."
        )

    def calculate_qparams(self):  # type: ignore[override]
        r"""``lowbit_qparams`` of the buffers, one entry per tensor / channel / group / block. Before any
        input: a warning and the qparams of one entry that has seen nothing (integers ``[1.], [0]``)."""
        state = self._read_state()
        if state is None:
            warnings.warn(lowbit_family.UNINITIALIZED_WARNING, UserWarning, stacklevel=2)
            state = lowbit_family.unobserved_state(TORCH.fast_xp, self.min_val.device)
        return lowbit_qparams(state, self.spec, xp=TORCH.fast_xp)

    def fake_quantize(self, x_orig: torch.Tensor) -> torch.Tensor:
        r"""Quantize-dequantize ``x`` with :meth:`calculate_qparams` (``lowbit_fake_quantize``; ``x`` must
        fit the statistics' shape). Output dtype: ``x``'s floating dtype (float32 for integers)."""
        state = self._read_state()
        x = TORCH.checked_input(x_orig, self.min_val)
        lowbit_family.check_axis(x, self.spec)
        if state is None:
            raise RuntimeError(f"{type(self).__name__}.fake_quantize needs observed statistics; call the observer on data first")
        lowbit_family.check_fake_quantize_input(x, state, self.spec)
        return lowbit_fake_quantize(x, lowbit_qparams(state, self.spec, xp=TORCH.fast_xp), self.spec, xp=TORCH.fast_xp)

    def reset_min_max_vals(self):
        """Empties the buffers (float32, device kept), as before the first batch."""
        self._empty_buffers(dtype=torch.float32)

    @all_or_nothing
    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        TORCH.entries(state_dict, prefix, ("min_val", "max_val"))  # NumPy/JAX/CuPy entries as tensors
        lo, hi = state_dict.get(prefix + "min_val"), state_dict.get(prefix + "max_val")
        if isinstance(lo, torch.Tensor) and isinstance(hi, torch.Tensor):
            # everything checked before any buffer changes; then buffers of the saved shape and dtype
            owner = type(self).__name__
            checked = lowbit_family.check_loaded_stats(check_entry(lo, "min_val", None), check_entry(hi, "max_val", None), self.spec, owner)
            shape = (0,) if checked is None else checked[0].shape
            dtype = torch.float64 if checked is not None and checked[0].dtype == np.float64 else torch.float32
            for name in ("min_val", "max_val"):
                self._buffers[name] = torch.empty(shape, dtype=dtype, device=self._buffers[name].device)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def extra_repr(self):
        shape = None if self.min_val.numel() == 0 else tuple(self.min_val.shape)
        return lowbit_family.describe(self.spec, self.is_dynamic, self.ignore_nonfinite) + f", stats_shape={shape}"


_TORCH_DEFAULTS = {"float8_e4m3fn": torch.float8_e4m3fn}


def _public(generic: type, base: type, **attributes) -> type:
    """``generic``'s public constructor on ``base``, with torch's default fp8 dtype object."""
    return constructor_on(generic, base, __name__, _TORCH_DEFAULTS, **attributes)


LowBitObserver = _public(_base.LowBitObserver, _LowBitObserver, __doc__=_LowBitObserver.__doc__)
PerGroupMinMaxObserver = _public(_base.PerGroupMinMaxObserver, LowBitObserver)
FP8Observer = _public(_base.FP8Observer, LowBitObserver)
PerBlockMXObserver = _public(_base.PerBlockMXObserver, LowBitObserver)
PerBlockBFPObserver = _public(_base.PerBlockBFPObserver, LowBitObserver)
