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

Deliberate differences from torch are listed, each with the test that pins it, in README.md
("Differences from torch.ao"). The observers are eager-only for ``torch.jit.script``; ``FusedMovingAvgObsFakeQuantize``
and ``FixedQParamsFakeQuantize`` insist on torch's own observer classes.
"""

from __future__ import annotations

from . import adopt_public_names

from . import _torch_calibration, _torch_cuda_graph, _torch_distributed, _torch_histogram, _torch_lowbit, _torch_minmax
from ._torch_minmax import *  # noqa: F401,F403
from ._torch_histogram import *  # noqa: F401,F403
from ._torch_calibration import *  # noqa: F401,F403
from ._torch_lowbit import *  # noqa: F401,F403
from ._torch_distributed import *  # noqa: F401,F403
from ._torch_cuda_graph import *  # noqa: F401,F403
from ._torch_llm import LLMObserver, llm_fused_global_scale  # noqa: F401  (the LLM family: docs/llm.md)

__all__ = (
    _torch_minmax.__all__ + _torch_histogram.__all__ + _torch_calibration.__all__ + _torch_lowbit.__all__
    + _torch_distributed.__all__ + _torch_cuda_graph.__all__
)
adopt_public_names(globals())
