"""Kernel launches per observer step on the torch CUDA path, counted on the CPU: how many kernels a torch
observer's ``forward`` (and ``calculate_qparams``) launches on CUDA, on any machine.

On CUDA every update runs the core's torch CUDA path (the Triton kernels where a step has them, else the
branch-free array code: all branches computed with ``where``, no host shortcut, no compiled kernel), and
its eager time is mostly the cost of launching one small kernel per operation from Python (RESULTS.md,
GPU sections). This script runs that same path on CPU tensors inside
:func:`observers_core.testing.cuda_path_on_cpu` (Triton kernels through Triton's interpreter) and counts
one forward (the third, after two that set the state up) with :func:`observers_core.testing.count_launches`:
aten operations that launch a kernel (views and allocations are not launches) plus Triton launches, and
the host synchronisations. torch.ao's observers are counted alongside (eager, same counting).

    python benchmarks/device_path_ops.py [--shape 64,512] [--per-channel] [--qparams]

``OBSERVERS_CORE_NO_TRITON=1`` counts the array code instead of the Triton kernels (the "before").
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from _torch_observer_configs import CONFIGS, config_id  # noqa: E402

from observers_core.adapters import torch as ours  # noqa: E402
from observers_core.testing import LaunchCount, count_launches, cuda_path_on_cpu  # noqa: E402
from torch.ao.quantization import observer as torch_ao  # noqa: E402


def batches_of(shape: tuple[int, ...]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=g) * scale for scale in (1.0, 3.0, 0.5)]


def third_forward(observer, batches) -> LaunchCount:
    """The launches of ``observer(batches[2])`` after ``batches[0]`` and ``batches[1]``."""
    observer(batches[0])
    observer(batches[1])
    with count_launches() as count:
        observer(batches[2])
    return count


def qparams_after(observer, batches) -> LaunchCount:
    """The launches of ``observer.calculate_qparams()`` after the three batches."""
    for x in batches:
        observer(x)
    with count_launches() as count, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        observer.calculate_qparams()
    return count


def count(config, batches, step=third_forward) -> LaunchCount:
    """``step`` of a fresh observer of ``config`` on the torch CUDA path (CPU tensors)."""
    name, kwargs = config
    with cuda_path_on_cpu():
        return step(getattr(ours, name)(**kwargs), batches)


def anchor_count(config, batches, step=third_forward) -> LaunchCount | None:
    """``step`` of torch.ao's class of the same name, where it has one with these arguments."""
    name, kwargs = config
    anchor = getattr(torch_ao, name, None)
    if anchor is None or not set(kwargs) <= {"ignore_nonfinite"}:  # torch.ao's defaults otherwise
        return None
    return step(anchor(), batches)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64,512", help="batch shape, comma-separated (default 64,512)")
    parser.add_argument("--per-channel", action="store_true", help="also the per-channel configurations")
    parser.add_argument("--qparams", action="store_true", help="also calculate_qparams after three batches")
    args = parser.parse_args()
    batches = batches_of(tuple(int(s) for s in args.shape.split(",")))
    triton = os.environ.get("OBSERVERS_CORE_NO_TRITON", "") in ("", "0")
    print(f"torch {torch.__version__}; batch {tuple(batches[0].shape)} float32; torch CUDA path on the CPU "
          f"({'Triton kernels, interpreted' if triton else 'array code, OBSERVERS_CORE_NO_TRITON set'})")
    steps = [("forward", third_forward)] + ([("calculate_qparams", qparams_after)] if args.qparams else [])
    for label, step in steps:
        print(f"\n{label}: {'observer':38s} {'launches':>8s} {'syncs':>5s} {'torch.ao':>8s}  most frequent (ours)")
        for config in CONFIGS:
            if "ch_axis" in config[1] and not args.per_channel:
                continue
            ours_count = count(config, batches, step)
            anchor = anchor_count(config, batches, step)
            frequent = ", ".join(f"{op} {n}" for op, n in (ours_count.aten + ours_count.triton).most_common(4))
            print(f"{'':{len(label) + 2}s}{config_id(config):38s} {ours_count.launches:8d} {ours_count.syncs:5d} "
                  f"{'' if anchor is None else anchor.launches:>8}  {frequent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
