"""An observer's ``forward`` (or a model's, with its observers) recorded once as a CUDA graph and
replayed per batch.

On CUDA an update is many small kernels, and launching them from Python costs more than running them;
replaying them as one graph (``torch.cuda.CUDAGraph``) removes the launches. This works because a torch
observer's ``forward`` never waits for the device (tests/test_gpu_sync.py) and writes its new state into its
buffers in place, so every replay reads and writes the same memory.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.ao.quantization.observer import ObserverBase

from ._torch_calibration import TorchKL
from ._torch_histogram import TorchHistogram

__all__ = ["cuda_graph_forward"]


def cuda_graph_forward(module: torch.nn.Module, example: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module``'s forward (an observer, or a model holding observers, e.g. after ``prepare``) on batches
    shaped like ``example``, recorded once as a CUDA graph; returns ``step(x)``, which copies ``x`` into
    the graph's input and replays it: for an observer the same update as ``observer(x)``, bit for bit
    (tests/test_cuda_graph.py). ``step`` returns the recorded output, which the next replay overwrites.
    Recording runs ``module(example)`` once for real (torch's rule: one run on a side stream, then the
    recording, which runs nothing), so ``example`` is observed once. Record and replay a model under
    ``torch.no_grad()``, as benchmarks/bench_model_calibration.py does: calibration needs no gradients.

    ``x`` must have ``example``'s shape, dtype and device, and the buffers must be the recorded ones
    (``step`` raises ``ValueError`` once one was replaced or reallocated). ``ValueError`` if ``module`` is
    or holds a ``KLObserver`` (a Python step count decides when its search runs), a
    ``HistogramObserver(ignore_nonfinite=False)`` (it reads two counts on the host for torch's warnings)
    or an observer made with ``sync=True``, or has buffers on another device than ``example``.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch observer or model (an nn.Module), got {type(module).__name__}")
    if not isinstance(example, torch.Tensor):
        raise TypeError(f"example must be a torch.Tensor, got {type(example).__name__}")
    for name, sub in module.named_modules():
        where = f"{type(sub).__name__}" + (f" at {name!r}" if name else "")
        if isinstance(sub, TorchKL):
            raise ValueError(f"{where} cannot be replayed from a CUDA graph: a Python step count decides when "
                             "its search runs")
        if isinstance(sub, TorchHistogram) and not sub.ignore_nonfinite:
            raise ValueError(f"{where}: HistogramObserver(ignore_nonfinite=False) reads its non-finite counts on "
                             "the host for torch's warnings, which a CUDA graph cannot hold: pass ignore_nonfinite=True")
        if isinstance(sub, ObserverBase) and getattr(sub, "sync", False) is True:
            raise ValueError(f"{where} (sync=True) reduces across processes in every forward; record the graph "
                             "with observers made with sync=False")
    if example.device.type != "cuda":
        raise ValueError(f"example must be a CUDA tensor, got one on {example.device}")
    stray = sorted({str(b.device) for b in module.buffers() if b.device != example.device})
    if stray:
        raise ValueError(f"module's buffers are on {', '.join(stray)}, example on {example.device}: "
                         f"move it first (module.to({str(example.device)!r}))")
    static = example.clone()
    side = torch.cuda.Stream(device=example.device)
    side.wait_stream(torch.cuda.current_stream(example.device))
    with torch.cuda.stream(side):
        module(static)
    torch.cuda.current_stream(example.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = module(static)
    recorded = buffer_addresses(module)

    def step(x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if buffer_addresses(module) != recorded:
            raise ValueError("module's buffers were replaced or reallocated since the recording (reset_min_max_vals "
                             "of a per-channel observer, load_state_dict of another shape, .to()): the graph would "
                             "update the old ones; record again with cuda_graph_forward")
        if (x.shape, x.dtype, x.device) != (static.shape, static.dtype, static.device):
            raise ValueError(f"x must match the recorded batch: shape {tuple(static.shape)}, {static.dtype} on "
                             f"{static.device}; got shape {tuple(x.shape)}, {x.dtype} on {x.device}")
        static.copy_(x)
        graph.replay()
        return output

    return step


def buffer_addresses(module: torch.nn.Module) -> list[int]:
    """Where each buffer of ``module`` lives: a recorded graph reads and writes these addresses."""
    return [buffer.data_ptr() for buffer in module.buffers()]
