"""Every torch observer with statistics, per tensor and per channel: the configurations the CUDA tests
(tests/test_gpu_sync.py, tests/test_cuda_graph.py) and benchmarks/gpu_sync_report.py run."""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

import observers_core._compiled as compiled
import observers_core._histogram as core_histogram
import observers_core._minmax as core_minmax

PER_CHANNEL = dict(ch_axis=1, qscheme=torch.per_channel_symmetric)
#: (class name, constructor arguments): every torch observer with statistics, per tensor and per channel
CONFIGS = [
    ("MinMaxObserver", {}),
    ("MovingAverageMinMaxObserver", {}),
    ("PerChannelMinMaxObserver", {}),
    ("MovingAveragePerChannelMinMaxObserver", {}),
    ("HistogramObserver", dict(ignore_nonfinite=True)),  # the default reads two counts on the host (test_gpu_sync.py)
    *[(name, kw) for name in ("KLObserver", "MSEObserver", "PercentileObserver", "MixObserver")
      for kw in ({}, PER_CHANNEL)],
    ("LowBitObserver", dict(dtype="int8")),
    ("PerGroupMinMaxObserver", dict(group_size=32)),
    ("FP8Observer", {}),
    ("PerBlockMXObserver", {}),
    ("PerBlockBFPObserver", {}),
]


def config_id(config) -> str:
    name, kwargs = config
    return name + ("-per_channel" if "ch_axis" in kwargs else "")


@contextlib.contextmanager
def device_path():
    """Inside: torch CPU tensors take the path a CUDA forward takes (branch-free, no compiled kernel, no
    host shortcut): the two predicates that choose the host paths are switched off."""
    with mock.patch.object(compiled, "ENABLED", False), \
            mock.patch.object(core_histogram, "on_host", lambda x, xp: False), \
            mock.patch.object(core_minmax, "on_host", lambda x, xp: False):
        yield
