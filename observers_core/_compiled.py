"""Compiled CPU kernels (numba), optional: one place that knows whether they are available.

The array-API code is the reference and runs everywhere (every namespace, every device, under
``jax.jit``). Where a loop over the data cannot be written with array operations without large
temporaries or many small kernel launches (binning a tensor into a histogram, the per-candidate error
sums of the L2 search), host-memory arrays (NumPy, and torch CPU tensors through a zero-copy NumPy view)
go through a numba kernel instead, computing the same float32 operations in the same order. Kernels are
compiled on first use and cached on disk (``cache=True``).

numba comes with the ``torch`` and ``test`` extras (``pip install observers-core[fast]`` alone). Without
it, or with ``OBSERVERS_CORE_NO_NUMBA=1`` in the environment, or ``ENABLED = False`` at run time (the
tests switch it to check both paths), the array-API code runs.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from ._namespace import is_numpy_namespace, is_torch_namespace

try:
    import numba
    from numba.core import types as _types
    from numba.extending import intrinsic as _intrinsic
except ImportError:  # optional: the array-API code runs instead
    numba = None

__all__ = ["ENABLED", "AVAILABLE", "fma", "host_scalar", "host_view", "kernel", "numba", "numpy_views", "split_sum", "threads"]

AVAILABLE = numba is not None
ENABLED = AVAILABLE and os.environ.get("OBSERVERS_CORE_NO_NUMBA", "") in ("", "0")

Array = Any


def kernel(*, parallel: bool = False) -> Callable[[Callable], Callable | None]:
    """``numba.njit`` (no fastmath: IEEE float32 operations as written, no contraction into FMAs; cached
    on disk; releases the GIL); ``None`` in place of the function without numba."""

    def decorate(fn: Callable) -> Callable | None:
        if numba is None:
            return None
        return numba.njit(cache=True, nogil=True, parallel=parallel, error_model="numpy")(fn)

    return decorate


if numba is not None:

    @_intrinsic
    def fma(typingctx, a, b, c):
        """``a * b + c`` rounded once (LLVM's ``fma``), inside kernels; all three the same float type."""
        if not (a == b == c and isinstance(a, _types.Float)):
            return None

        def codegen(context, builder, signature, args):
            return builder.fma(*args)

        return a(a, b, c), codegen

else:
    fma = None


def host_view(x: Array, xp: Any) -> np.ndarray | None:
    """``x`` as a NumPy array without a copy when a compiled kernel may take it (kernels enabled, ``x`` a
    NumPy array or a torch CPU tensor that needs no grad); ``None`` otherwise."""
    if not ENABLED:
        return None
    if is_numpy_namespace(xp):
        return np.asarray(x)
    if is_torch_namespace(xp) and x.device.type == "cpu" and not x.requires_grad:
        return x.numpy()
    return None


def numpy_views(xp: Any, *arrays: Array) -> tuple[np.ndarray, ...] | None:
    """Zero-copy NumPy views of torch CPU tensors (cast to float32 first where NumPy has no such dtype),
    for functions that run torch CPU tensors as NumPy arrays when the kernels are enabled: the same
    float32 arithmetic, and NumPy's operations on small arrays cost a fraction of torch's. ``None``
    for anything else (kernels disabled, other namespaces, other devices)."""
    if not ENABLED or not is_torch_namespace(xp) or any(a.device.type != "cpu" for a in arrays):
        return None
    import torch  # only reached with torch tensors

    to_float = (torch.bfloat16, torch.complex32)
    return tuple((a.float() if a.dtype in to_float else a).detach().numpy() for a in arrays)


def host_scalar(x: Array) -> np.generic:
    """A 0-d NumPy array or torch CPU tensor as a NumPy scalar of its dtype (so a float32 bound stays
    float32 inside a kernel)."""
    return (x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x))[()]


def threads(n: int, *, grain: int = 1 << 16) -> int:
    """How many threads :func:`split_sum` may use on ``n`` elements: the CPUs this process may use,
    capped by ``torch.get_num_threads()`` when torch is loaded (``torch.set_num_threads`` is the one knob
    of a process that uses torch, whether the data comes as tensors or arrays); at most one per ``grain``
    elements."""
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        workers = min(workers, torch.get_num_threads())
    return max(1, min(workers, n // grain))


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def split_sum(fn: Callable, x: np.ndarray, workers: int, *args: Any, chunk: int = 1 << 16) -> np.ndarray:
    """``fn(x, *args)`` for a kernel whose result adds up over slices of ``x`` (counts), on up to
    ``workers`` threads (the kernels release the GIL): the calling thread and ``workers - 1`` pool threads
    take ``chunk``-element slices in turn until none is left, and the partial results are summed.

    Slices are claimed, not assigned: a pool thread that gets no CPU (torch's OpenMP threads spin for
    milliseconds after each parallel op) leaves its share to the others instead of holding up the
    result, so the worst case is the one-thread time. Plain Python threads: they sleep between calls."""
    global _pool
    if workers <= 1 or x.shape[0] <= chunk:
        return fn(x, *args)
    with _pool_lock:
        if _pool is None or _pool._max_workers < workers - 1:
            _pool = ThreadPoolExecutor(max_workers=workers - 1, thread_name_prefix="observers_core")
    starts = iter(range(0, x.shape[0], chunk))  # next() on it is atomic under the GIL

    def work() -> np.ndarray | None:
        total = None
        for start in starts:
            part = fn(x[start:start + chunk], *args)
            total = part if total is None else total + part
        return total

    helpers = [_pool.submit(work) for _ in range(workers - 1)]
    parts = [work()] + [helper.result() for helper in helpers if not helper.cancel()]  # cancelled: never started
    return sum(part for part in parts if part is not None)
