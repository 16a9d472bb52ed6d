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

Differences from torch, all on inputs torch does not handle well:

- invalid configuration raises ``ValueError``/``TypeError`` naming the argument (torch:
  ``AssertionError``); ``NotImplementedError`` is kept where torch raises it;
- a bad ``forward`` input (bool/complex dtype, another device than the buffers, ``ch_axis`` out of
  range, a changed channel count) raises ``ValueError``/``TypeError`` and leaves the buffers untouched;
- per-channel observers accept 1-d inputs (each element is a channel; torch raises ``IndexError``);
- legacy (version < 3) per-channel ``min_vals``/``max_vals`` keys are loaded (torch 2.13 resizes the
  buffers but leaves them uninitialised); a version 1/None state_dict gets the default ``eps`` only
  when it has none (torch overwrites a present ``eps`` too);
- ``ignore_nonfinite=True`` (keyword-only, default ``False``) skips NaN and +/-Inf as ONNX Runtime's
  ``nanmin``/``nanmax`` do; ``calculate_qparams`` then gives a channel that saw no finite value
  ``scale=1, zero_point=0`` with a warning. The flag is configuration, like ``qscheme``: it is kept by
  ``copy.deepcopy`` and pickling, and is not a state_dict entry (the keys stay torch's);
- the observers are eager-only (they call the Python core, so ``torch.jit.script`` does not apply);
  ``FusedMovingAvgObsFakeQuantize`` and ``FixedQParamsFakeQuantize`` insist on torch's own observer
  classes (``isinstance``/``type`` checks), so they need torch's observers; ``.half()``/``.bfloat16()``
  observers give a float32 scale where torch gives the buffer dtype.
"""

from __future__ import annotations

from . import _torch_calibration, _torch_histogram, _torch_lowbit, _torch_minmax
from ._torch_minmax import *  # noqa: F401,F403
from ._torch_histogram import *  # noqa: F401,F403
from ._torch_calibration import *  # noqa: F401,F403
from ._torch_lowbit import *  # noqa: F401,F403

__all__ = (
    _torch_minmax.__all__ + _torch_histogram.__all__ + _torch_calibration.__all__ + _torch_lowbit.__all__
)
