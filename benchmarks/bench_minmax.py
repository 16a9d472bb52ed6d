"""MinMax observers: ``torch.ao.quantization.observer`` vs ``observers_core.adapters.torch`` on the same
float32 data in one process, plus the core's ``minmax_update`` under ``jax.jit`` and on numpy, each
in its own fresh process (torch and JAX in one process fight over the cores).

Cases: per tensor (MinMax, MovingAverage) on ``N`` elements, per channel (PerChannel,
MovingAveragePerChannel) on ``(64, N / 64)`` with ``ch_axis=0``; ``N`` = 16M (throughput, GB/s of
input read; goal: ours >= 0.95x torch.ao) and 4k (time per call; goal: ours <= 1.3x torch.ao; run
with torch's default threads and with one thread). Timings are medians of interleaved repeats (see ``_timing.py``); each repeat times ``number`` calls.

Usage: ``python benchmarks/bench_minmax.py [--repeats 15] [--no-subprocesses]``
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_line, run_isolated, time_interleaved  # noqa: E402

LARGE, SMALL, CHANNELS = 1 << 24, 4096, 64
SIZES = {"16M": LARGE, "4k": SMALL}
CLASSES = ["MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
           "MovingAveragePerChannelMinMaxObserver"]
LARGE_GOAL, SMALL_GOAL = 0.95, 1.3


def _shape(n: int, per_channel: bool) -> tuple[int, ...]:
    return (CHANNELS, n // CHANNELS) if per_channel else (n,)


def _calls_per_repeat(n: int) -> int:
    return 1 if n >= LARGE else 300


def bench_torch(repeats: int) -> list[tuple[str, int, str, float, float]]:
    """(size label, torch threads, class, torch.ao seconds/call, ours seconds/call) for every case.

    The 4k cases also run with one intra-op thread: a call is then pure per-call overhead, without
    waiting for a second thread to be scheduled (which dominates on a busy 2-core machine)."""
    import torch
    from torch.ao.quantization import observer as tobs

    from observers_core.adapters import torch as ours

    default_threads = torch.get_num_threads()
    runs = [(label, n, default_threads) for label, n in SIZES.items()] + [("4k", SMALL, 1)]
    rows = []
    for label, n, threads in runs:
        torch.set_num_threads(threads)
        for cls_name in CLASSES:
            x = torch.randn(_shape(n, "PerChannel" in cls_name), generator=torch.Generator().manual_seed(0))
            theirs, mine = getattr(tobs, cls_name)(), getattr(ours, cls_name)()
            t = time_interleaved({"torch.ao": partial(theirs, x), "ours": partial(mine, x)},
                                 number=_calls_per_repeat(n), repeats=repeats)
            rows.append((label, threads, cls_name, t["torch.ao"].median, t["ours"].median))
    torch.set_num_threads(default_threads)
    return rows


def jax_worker(repeats: int) -> dict:
    """Seconds per call of ``jax.jit(minmax_update)`` per tensor and per channel (fresh process)."""
    import jax
    import jax.numpy as jnp

    import observers_core as oc

    result = {"device": str(jax.devices()[0]), "version": jax.__version__}
    update = jax.jit(oc.minmax_update)
    update_per_channel = jax.jit(partial(oc.minmax_update, axis=0))
    for label, n in SIZES.items():
        x = jax.random.normal(jax.random.PRNGKey(0), (n,), dtype=jnp.float32)
        xc = x.reshape(_shape(n, True))
        state, state_c = oc.minmax_init(xp=jnp), oc.minmax_init(num_channels=CHANNELS, xp=jnp)
        t = time_interleaved(
            {"per tensor": lambda: update(state, x).min_val.block_until_ready(),
             "per channel": lambda: update_per_channel(state_c, xc).min_val.block_until_ready()},
            number=_calls_per_repeat(n), repeats=repeats)
        result[label] = {k: v.median for k, v in t.items()}
    return result


def numpy_worker(repeats: int) -> dict:
    """Seconds per call of ``minmax_update`` on numpy per tensor and per channel (fresh process)."""
    import array_api_compat.numpy as xp
    import numpy as np

    import observers_core as oc

    result = {"version": np.__version__}
    for label, n in SIZES.items():
        x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
        xc = x.reshape(_shape(n, True))
        state, state_c = oc.minmax_init(xp=xp), oc.minmax_init(num_channels=CHANNELS, xp=xp)
        t = time_interleaved(
            {"per tensor": lambda: oc.minmax_update(state, x, xp=xp),
             "per channel": lambda: oc.minmax_update(state_c, xc, axis=0, xp=xp)},
            number=_calls_per_repeat(n), repeats=repeats)
        result[label] = {k: v.median for k, v in t.items()}
    return result


def _gbps(n: int, seconds: float) -> float:
    return n * 4 / seconds / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-subprocesses", action="store_true", help="skip the JAX and numpy runs")
    args = parser.parse_args()

    print(machine_line("torch", "jax", "numpy", "array-api-compat"))
    rows = bench_torch(args.repeats)
    print(f"\n{'case (torch threads)':48s} {'torch.ao':>12s} {'ours':>12s} {'ratio':>7s}  goal")
    met_all = True
    for label, threads, cls_name, t_theirs, t_mine in rows:
        n = SIZES[label]
        if n >= LARGE:
            ratio = t_theirs / t_mine  # throughput ratio: ours / torch.ao
            met = ratio >= LARGE_GOAL
            cells = (f"{_gbps(n, t_theirs):8.2f} GB/s {_gbps(n, t_mine):7.2f} GB/s {ratio:7.2f}  "
                     f">= {LARGE_GOAL} throughput")
        else:
            ratio = t_mine / t_theirs  # time ratio: ours / torch.ao
            met = ratio <= SMALL_GOAL
            cells = f"{t_theirs * 1e6:9.1f} us {t_mine * 1e6:9.1f} us {ratio:7.2f}  <= {SMALL_GOAL} time/call"
        met_all &= met
        print(f"{f'{cls_name} {label} ({threads})':48s} {cells}  {'met' if met else 'MISSED'}")

    if not args.no_subprocesses:
        here = os.path.abspath(__file__)
        print("\ncore minmax_update in fresh processes (same sizes, float32):")
        for name, worker in (("jax.jit", "jax_worker"), ("numpy", "numpy_worker")):
            res = run_isolated(here, worker, repeats=args.repeats)
            where = f" on {res['device']}" if "device" in res else ""
            for label, n in SIZES.items():
                for case, seconds in res[label].items():
                    print(f"  {name} {res['version']}{where}, {case:11s} {label:3s}: "
                          f"{_gbps(n, seconds):7.2f} GB/s ({seconds * 1e6:10.1f} us/call)")
    print("\nall goals met" if met_all else "\nsome goals MISSED (see above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
