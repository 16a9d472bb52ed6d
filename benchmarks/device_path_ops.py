"""Operations per forward on the device path, counted on the CPU: how many kernels a torch observer's
``forward`` launches on CUDA, on any machine.

On CUDA every update runs the core's branch-free path (all branches computed with ``where``, no host
shortcut, no compiled kernel), and its eager time is mostly the cost of launching one small kernel per
operation from Python (RESULTS.md, GPU sections). This script runs that same path on CPU tensors (the
host shortcuts switched off as tests/test_device_path_on_cpu.py does) and counts the aten operations of
one forward (the third, after two that set the state up) with a ``TorchDispatchMode``; torch.ao's
observers are counted alongside. Views and fills count as operations too (on CUDA a fill is a kernel,
a view is not), so read the numbers as an upper bound on launches.

    python benchmarks/device_path_ops.py [--shape 64,512] [--per-channel]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from _torch_observer_configs import CONFIGS, config_id, device_path  # noqa: E402

from observers_core.adapters import torch as ours  # noqa: E402
from torch.ao.quantization import observer as torch_ao  # noqa: E402


class CountOps(TorchDispatchMode):
    """Counts every aten operation dispatched inside the ``with`` block, by name."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def ops_of_third_forward(observer, batches) -> Counter:
    observer(batches[0])
    observer(batches[1])
    counter = CountOps()
    with counter:
        observer(batches[2])
    return counter.ops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64,512", help="batch shape, comma-separated (default 64,512)")
    parser.add_argument("--per-channel", action="store_true", help="also the per-channel configurations")
    args = parser.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(*shape, generator=g) * scale for scale in (1.0, 3.0, 0.5)]

    print(f"torch {torch.__version__}; batch {shape} float32; aten operations in one forward on the device path")
    print(f"{'observer':40s} {'ours':>6s} {'torch.ao':>9s}  most frequent (ours)")
    for config in CONFIGS:
        name, kwargs = config
        if "ch_axis" in kwargs and not args.per_channel:
            continue
        with device_path():
            ops = ops_of_third_forward(getattr(ours, name)(**kwargs), batches)
        anchor = getattr(torch_ao, name, None)
        comparable = anchor is not None and set(kwargs) <= {"ignore_nonfinite"}  # torch.ao's defaults otherwise
        anchor_ops = sum(ops_of_third_forward(anchor(), batches).values()) if comparable else ""
        frequent = ", ".join(f"{op} {n}" for op, n in ops.most_common(4))
        print(f"{config_id(config):40s} {sum(ops.values()):6d} {anchor_ops!s:>9s}  {frequent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
