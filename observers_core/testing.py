"""Helpers for tests and benchmarks of the GPU paths on any machine.

- :func:`cuda_path_on_cpu`: torch CPU tensors take exactly the code a CUDA tensor takes;
- :func:`count_launches`: the kernel launches (and host synchronisations) of the torch operations and
  Triton kernels run inside a block, counted on any device.

Imports no framework at module level; torch is imported when a function is called.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Iterator

from . import _namespace

__all__ = ["LaunchCount", "count_launches", "cuda_path_on_cpu"]


@contextlib.contextmanager
def cuda_path_on_cpu() -> Iterator[None]:
    """Inside the block, torch CPU tensors take exactly the code path of torch CUDA tensors.

    Every torch device branch of the core asks one predicate (``_namespace.torch_cuda_path``); inside the
    block it is true for CPU tensors too, so:

    - no host shortcut: the branch-free device code runs, each data-dependent branch computed with
      ``where`` (``on_host`` is false), and no compiled host kernel (numba) or NumPy view is used;
    - the GPU kernel choices are made as on CUDA (``bincount`` through ``torch.histc``...);
    - the Triton kernels (``observers_core/_triton_kernels.py``) run, through Triton's interpreter
      (``TRITON_INTERPRET``'s machinery, applied per launch, so it works whether or not triton was
      imported before); without triton installed the array code runs, as on CUDA without triton.

    What differs from a GPU: torch's own CPU kernels compute each torch operation (a CUDA sum adds in
    another order; CUDA divides by a Python number as a multiplication by its reciprocal), and the
    interpreter runs a kernel's programs one after the other (float atomics then add in index order; on a
    GPU in any order). Not thread-safe (a module flag): one thread at a time, as tests run. Nests.
    """
    previous = _namespace.CUDA_PATH_ON_CPU
    _namespace.CUDA_PATH_ON_CPU = True
    try:
        yield
    finally:
        _namespace.CUDA_PATH_ON_CPU = previous


class LaunchCount:
    """What :func:`count_launches` saw: ``aten`` (Counter of the aten operations that launch a kernel, by
    name), ``triton`` (Counter of Triton kernel launches, by kernel name), ``syncs`` (host reads of
    device data: ``.item()``, ``.tolist()``, ``bool(t)``...), ``launches`` (``aten`` + ``triton`` total)."""

    def __init__(self) -> None:
        self.aten: Counter = Counter()
        self.triton: Counter = Counter()
        self.syncs = 0

    @property
    def launches(self) -> int:
        return sum(self.aten.values()) + sum(self.triton.values())

    def __repr__(self) -> str:
        return f"LaunchCount(launches={self.launches}, syncs={self.syncs}, aten={dict(self.aten)}, triton={dict(self.triton)})"


#: aten operations that launch no kernel on a GPU: allocations without a fill, and metadata changes
_NO_LAUNCH = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "set_", "resize_",
    "_unsafe_view", "detach", "alias", "view", "_reshape_alias", "as_strided", "expand", "unsqueeze", "squeeze",
    "permute", "transpose", "t", "select", "slice", "unfold", "diagonal", "_unsafe_index", "split",
    "split_with_sizes", "unbind", "chunk", "narrow", "view_as_real", "view_as_complex", "_conj", "_neg_view",
    "real", "imag", "movedim", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size",
    "_has_compatible_shallow_copy_type", "result_type",
})  # fmt: skip
#: aten operations that read device data on the host (a synchronisation on a GPU)
_SYNCS = frozenset({"_local_scalar_dense", "item", "equal", "is_nonzero", "nonzero", "tolist"})
#: tensor methods that read device data on the host without an aten operation torch dispatches for a CPU
#: tensor (on CUDA they copy to the host): counted as one synchronisation each on the CUDA path
_UNDISPATCHED_READS = ("tolist", "cpu", "numpy")


@contextlib.contextmanager
def count_launches() -> Iterator[LaunchCount]:
    """Counts, inside the block, the kernels a GPU would launch: every aten operation that launches one
    (views, ``empty`` and other metadata-only operations are not counted; see ``_NO_LAUNCH``), plus each
    Triton kernel launch (the aten operations Triton's interpreter runs inside a launch are not counted),
    and the host synchronisations (``_local_scalar_dense`` and the like: reads of device data; also
    ``tolist()``, ``cpu()`` and ``numpy()`` of a tensor on the CUDA path, which a CPU tensor runs without a
    dispatched operation). Works on
    CPU tensors, with :func:`cuda_path_on_cpu` for the CUDA path; a CUDA profiler trace on a GPU is the
    truth (a copy between two devices, or an operation torch splits into several kernels, counts one)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    count = LaunchCount()
    inside_triton = [0]

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if not inside_triton[0]:
                name = func.overloadpacket.__name__
                if name in _SYNCS:
                    count.syncs += 1
                elif name not in _NO_LAUNCH and not getattr(func, "is_view", False):
                    count.aten[name] += 1
            return func(*args, **(kwargs or {}))

    def on_launch(name: str, entering: bool) -> None:
        if entering:
            count.triton[name] += 1
        inside_triton[0] += 1 if entering else -1

    def reading(method: Any) -> Any:  # reads that torch does not dispatch (a CPU tensor's tolist, cpu)
        def read(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not inside_triton[0] and _namespace.torch_cuda_path(self):
                count.syncs += 1
            return method(self, *args, **kwargs)

        return read

    originals = {name: getattr(torch.Tensor, name) for name in _UNDISPATCHED_READS}
    _namespace.LAUNCH_LISTENERS.append(on_launch)
    try:
        for name, method in originals.items():
            setattr(torch.Tensor, name, reading(method))
        with _Count():
            yield count
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
        _namespace.LAUNCH_LISTENERS.remove(on_launch)
