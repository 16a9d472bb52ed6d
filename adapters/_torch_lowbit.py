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

import numpy as np
import torch

from observers_core._minmax import MinMaxState
from observers_core._validate import check_bool

from ._torch_backend import TORCH, to_lowbit_dtype
from ._torch_minmax import ObserverBase, all_or_nothing
from ._torch_pt2e import link_torchao

class TorchLowBit:
    """The torch storage of the low-bit observers (the public classes: ``TorchLowBit`` over the generic
    class, which checks the arguments, on :class:`LowBitBase`): torch dtypes (``torch.int4``...), the
    buffers ``min_val``/``max_val`` (empty until the first batch, then the statistics' shape and dtype),
    ``factory_kwargs``, ``sync``/``process_group``, the eager steps on torch's own functions."""

    _BACKEND_KEYWORDS = ("factory_kwargs", "sync", "process_group")
    _parse_lowbit_dtype = staticmethod(to_lowbit_dtype)

    def _init_lowbit(self, spec, is_dynamic, ignore_nonfinite, *, factory_kwargs=None, sync=False,
                     process_group=None) -> None:
        link_torchao()
        ignore_nonfinite = check_bool(ignore_nonfinite, "ignore_nonfinite")
        is_dynamic = check_bool(is_dynamic, "is_dynamic")
        factory_kwargs = TORCH.factory_kwargs(factory_kwargs)
        ObserverBase.__init__(self, dtype=spec.dtype, is_dynamic=is_dynamic)
        self._spec = spec
        self.ignore_nonfinite = ignore_nonfinite
        self._init_sync(sync, process_group)
        self.register_buffer("min_val", torch.tensor([], **factory_kwargs))
        self.register_buffer("max_val", torch.tensor([], **factory_kwargs))

    # -- the family's steps (``LowBitSteps``, every framework's) over the buffers -------------------
    def _home_device(self) -> torch.device:
        return self._buffers["min_val"].device

    def _run_family(self, fn, /, *args, **kwargs):
        """``fn(config, *args)`` eagerly with torch's own ``minimum``/``maximum``/``where``."""
        return fn(self._step_config, *args, xp=TORCH.fast_xp, **kwargs)

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

    def reset_min_max_vals(self):
        """Empties the buffers (float32, device kept), as before the first batch."""
        self._empty_buffers(dtype=torch.float32)

    @all_or_nothing
    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        keys = TORCH.entries(state_dict, prefix, self._RANGE)  # NumPy/JAX/CuPy entries as tensors
        if all(isinstance(state_dict.get(key), torch.Tensor) for key in keys):
            # everything checked before any buffer changes; then buffers of the saved shape and dtype
            checked = self._checked_stats(state_dict, prefix)
            shape = (0,) if checked is None else checked[0].shape
            dtype = torch.float64 if checked is not None and checked[0].dtype == np.float64 else torch.float32
            for name in self._RANGE:
                self._buffers[name] = torch.empty(shape, dtype=dtype, device=self._buffers[name].device)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
