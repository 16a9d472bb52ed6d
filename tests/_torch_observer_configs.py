"""Every torch observer with statistics, per tensor and per channel: the configurations the CUDA tests
(tests/test_gpu_sync.py, tests/test_cuda_graph.py) and benchmarks/gpu_sync_report.py run."""

from __future__ import annotations

import torch


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
