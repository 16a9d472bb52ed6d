"""How many threads our compiled kernels should take between a model's layers: an A/B in one process.

The ResNet-18-shaped calibration of ``bench_model_calibration.py`` (eager ``prepare``, batch 8 at
224x224, 8 batches) runs with our HistogramObserver, KLObserver and MixObserver (``--only`` picks), once with the kernels on the calling
thread alone (``OBSERVERS_CORE_THREADS=1``, the rule at torch's default thread count) and once with them
on as many threads as torch uses (``OBSERVERS_CORE_THREADS=torch.get_num_threads()``, the rule before
it), the settings alternating within each round (which one goes first alternates between rounds).
Printed: each configuration's time added to the float model's (the median over rounds of the difference
to the float model's time measured right before that setting's runs) and the ratio of the two settings. Results do not depend on the thread count (the counts are exact sums).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import machine_line  # noqa: E402
from bench_model_calibration import eager_run, float_run, make_batches, make_model  # noqa: E402

from observers_core.adapters import torch as ours  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="run only configurations whose name contains one of these")
    args = parser.parse_args()
    many = torch.get_num_threads()
    print(machine_line("torch", "numpy", "numba"))
    print(f"torch threads: {many}; ResNet-18-shaped, batch 8 at 224x224, 8 batches, {args.repeats} rounds")
    weight = ours.default_per_channel_weight_observer
    configs = {
        "ours HistogramObserver": eager_run(ours.HistogramObserver.with_args(reduce_range=True), weight),
        "ours KLObserver": eager_run(
            ours.KLObserver.with_args(dtype=torch.quint8, qscheme=torch.per_tensor_affine), weight),
        "ours MixObserver": eager_run(
            ours.MixObserver.with_args(dtype=torch.quint8, qscheme=torch.per_tensor_affine), weight),
    }
    if args.only:
        configs = {name: run for name, run in configs.items() if any(key in name for key in args.only)}
    settings = {"1 thread": "1", f"{many} threads": str(many)}
    model, batches = make_model(), make_batches(8, 8)
    float_times: list[float] = []
    times = {(name, s): [] for name in configs for s in settings}
    saved = os.environ.get("OBSERVERS_CORE_THREADS")
    try:
        for round_ in range(args.repeats + 1):  # round 0: warm-up (numba loads, caches), not counted
            order = list(settings.items())[::1 if round_ % 2 else -1]  # which setting goes first alternates
            for setting, value in order:
                start = time.perf_counter()
                float_run(model, batches)
                base = time.perf_counter() - start
                os.environ["OBSERVERS_CORE_THREADS"] = value
                for name, run in configs.items():
                    start = time.perf_counter()
                    run(model, batches)
                    if round_:
                        times[name, setting].append(time.perf_counter() - start - base)
                if round_:
                    float_times.append(base)
    finally:
        if saved is None:
            os.environ.pop("OBSERVERS_CORE_THREADS", None)
        else:
            os.environ["OBSERVERS_CORE_THREADS"] = saved
    print(f"\nfloat model: {statistics.median(float_times):.2f} s (median)")
    print(f"{'configuration':28s} " + " ".join(f"{s + ' added':>18s}" for s in settings) + f" {'ratio':>8s}")
    for name in configs:
        added = [statistics.median(times[name, s]) for s in settings]
        print(f"{name:28s} " + " ".join(f"{a:17.2f}s" for a in added) + f" {added[1] / added[0]:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
