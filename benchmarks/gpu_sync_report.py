"""How often each torch observer waits for the GPU: host synchronisations per call on CUDA.

    python benchmarks/gpu_sync_report.py

For every configuration of tests/test_gpu_sync.py, counts the synchronising calls that
``torch.cuda.set_sync_debug_mode("warn")`` reports (one warning each: ``.item()``, a blocking copy to the
host, ``nonzero``, ...) in ``forward`` on finite batches (the test requires 0), in ``forward`` on a batch
holding a NaN, and in ``calculate_qparams`` (the searches read the device to stop early), and the
median milliseconds of each call.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_line  # noqa: E402
from test_gpu_sync import CONFIGS, config_id  # noqa: E402

from observers_core.adapters import torch as tobs  # noqa: E402


def syncs_and_ms(fn, repeats: int = 5) -> tuple[int, float]:
    """Synchronisations in one call of ``fn`` (the first, counted), then its median ms over ``repeats``."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    count = sum("synchronizing" in str(w.message) for w in caught)
    times = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return count, statistics.median(times) * 1e3


def main() -> None:
    print(machine_line("torch", "numpy"))
    print(f"cuda device: {torch.cuda.get_device_name()}; batch (64, 4096) float32")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 4096, device="cuda", generator=g)
    x_nan = x.clone()
    x_nan[3, 5] = float("nan")
    print(f"{'observer':42s} {'forward':>16s} {'forward+NaN':>16s} {'calculate_qparams':>18s}")
    print(f"{'':42s} {'syncs     ms':>16s} {'syncs     ms':>16s} {'syncs      ms':>18s}")
    for config in CONFIGS:
        name, kwargs = config
        obs = getattr(tobs, name)(**kwargs).cuda()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obs(x)  # state created
        fwd = syncs_and_ms(lambda: obs(x))
        qp = syncs_and_ms(obs.calculate_qparams)
        nan_obs = getattr(tobs, name)(**kwargs).cuda()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nan_obs(x)
        fwd_nan = syncs_and_ms(lambda: nan_obs(x_nan), repeats=1)
        cells = " ".join(f"{n:5d} {ms:10.3f}" for n, ms in (fwd, fwd_nan))
        print(f"{config_id(config):42s} {cells} {qp[0]:6d} {qp[1]:11.3f}")


if __name__ == "__main__":
    main()
