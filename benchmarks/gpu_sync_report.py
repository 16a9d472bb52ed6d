"""How often each torch observer waits for the GPU: host synchronisations per call on CUDA.

    python benchmarks/gpu_sync_report.py [--where]

For every configuration of tests/_torch_observer_configs.py (the CUDA tests' list), counts the synchronising calls that
``torch.cuda.set_sync_debug_mode("warn")`` reports (one warning each: ``.item()``, a blocking copy to the
host, ``nonzero``, ...) in ``forward`` on finite batches (the test requires 0), in ``forward`` on a batch
holding a NaN, and in ``calculate_qparams`` (the searches read the device to stop early), and the
median milliseconds of each call. ``--where`` adds, per call, the source lines (innermost frame in this
repository) the synchronisations came from.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_line  # noqa: E402
from _torch_observer_configs import CONFIGS, config_id  # noqa: E402

from observers_core.adapters import torch as tobs  # noqa: E402


#: ``--where``: for each call, where in this repository each synchronisation came from (file:line of the
#: innermost frame under the repository root), counted
WHERE: dict[str, Counter] = {}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _innermost_repo_frame() -> str:
    frames = [f for f in traceback.extract_stack() if f.filename.startswith(ROOT) and "gpu_sync_report" not in f.filename]
    return f"{frames[-1].filename[len(ROOT):]}:{frames[-1].lineno}" if frames else "?"


def syncs_and_ms(fn, repeats: int = 5, label: str = "") -> tuple[int, float]:
    """Synchronisations in one call of ``fn`` (the first, counted), then its median ms over ``repeats``."""
    torch.cuda.synchronize()
    where = WHERE.setdefault(label, Counter())
    show = warnings.showwarning

    def record(message, *args, **kwargs):
        if "called a synchronizing CUDA operation" in str(message):  # not the prototype-feature notice
            where[_innermost_repo_frame()] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = show
    count = sum(where.values())
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
        fwd = syncs_and_ms(lambda: obs(x), label=f"{config_id(config)} forward")
        qp = syncs_and_ms(obs.calculate_qparams, label=f"{config_id(config)} calculate_qparams")
        nan_obs = getattr(tobs, name)(**kwargs).cuda()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nan_obs(x)
        fwd_nan = syncs_and_ms(lambda: nan_obs(x_nan), repeats=1, label=f"{config_id(config)} forward+NaN")
        cells = " ".join(f"{n:5d} {ms:10.3f}" for n, ms in (fwd, fwd_nan))
        print(f"{config_id(config):42s} {cells} {qp[0]:6d} {qp[1]:11.3f}")
    if "--where" in sys.argv:
        print("\nwhere the synchronisations come from (innermost frame in this repository: count)")
        for label, where in WHERE.items():
            if where:
                print(f"  {label}: " + ", ".join(f"{loc} x{n}" for loc, n in where.most_common()))


if __name__ == "__main__":
    main()
