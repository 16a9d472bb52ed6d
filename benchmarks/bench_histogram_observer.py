"""HistogramObserver: ``torch.ao.quantization.observer`` vs ``observers_core.adapters.torch`` on the same data
in one process, plus the JAX observer (jitted update and search) in a fresh process.

Cases:

- forward: a fresh observer (2048 bins) fed 10 batches of 1M float32 values whose range grows
  (``N(0, 1) * (1 + 0.5 i)``, so every batch re-bins the histogram); time for the 10 batches.
  Goal: ours >= 2x faster than torch.ao.
- calculate_qparams on 2048-bin histograms (torch.ao's state loaded into ours): the histogram of the
  forward case, and a heavy-tailed one (Laplace with outliers). Goal on CPU: >= 5x faster; on CUDA
  (when a GPU exists) >= 100x.

Timings are medians of interleaved repeats (see ``_timing.py``); a ``calculate_qparams`` repeat times
10 calls back to back (per-call time, warm caches for both). On CPU both run with torch's default
threads and with one thread. With several threads, each of torch.ao's parallel ops leaves torch's
OpenMP threads spinning for a while, and ours starts right after one: its counting threads share the
cores with them (they take slices of the batch in turn, so ours degrades to its one-thread time at
worst), as they would after the layers of a model in a calibration run.

Usage: ``python benchmarks/bench_histogram_observer.py [--repeats 7] [--no-subprocesses]``
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import machine_line, run_isolated, time_interleaved  # noqa: E402

BATCHES, N, BINS = 10, 1 << 20, 2048
FORWARD_GOAL, QPARAMS_GOAL_CPU, QPARAMS_GOAL_CUDA = 2.0, 5.0, 100.0


def make_batches():
    """The forward data (numpy float32): batch ``i`` is ``N(0, 1) * (1 + 0.5 i)``."""
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.standard_normal(N, dtype=np.float32) * np.float32(1 + 0.5 * i) for i in range(BATCHES)]


def make_heavy_tailed():
    import numpy as np

    rng = np.random.default_rng(1)
    x = np.concatenate([rng.laplace(size=N - 64), rng.normal(size=64) * 200]).astype(np.float32)
    return [x]


def bench_torch(repeats: int, device: str) -> list[tuple[str, float, float]]:
    """(case, torch.ao seconds, ours seconds) on ``device``."""
    import torch
    from torch.ao.quantization import observer as tobs

    from observers_core.adapters import torch as ours

    sync = torch.cuda.synchronize if device == "cuda" else None
    batches = [torch.from_numpy(x).to(device) for x in make_batches()]

    def feed(cls):
        def run():
            obs = cls(bins=BINS).to(device)
            for x in batches:
                obs(x)
            return obs
        return run

    rows = []
    t = time_interleaved({"torch.ao": feed(tobs.HistogramObserver), "ours": feed(ours.HistogramObserver)},
                         repeats=repeats, warmup=1, sync=sync)  # fmt: skip
    rows.append((f"forward, {BATCHES} x 1M float32, growing range", t["torch.ao"].median, t["ours"].median))

    for label, data in (("forward's histogram", batches), ("heavy-tailed histogram", make_heavy_tailed())):
        theirs = tobs.HistogramObserver(bins=BINS).to(device)
        for x in data:
            theirs(torch.as_tensor(x).to(device))
        mine = ours.HistogramObserver(bins=BINS).to(device)
        mine.load_state_dict(theirs.state_dict())
        expected, got = theirs.calculate_qparams(), mine.calculate_qparams()
        same = all(torch.equal(a, b) for a, b in zip(expected, got))
        t = time_interleaved({"torch.ao": theirs.calculate_qparams, "ours": mine.calculate_qparams},
                             repeats=repeats, warmup=1, number=10, sync=sync)  # fmt: skip
        rows.append((f"calculate_qparams, {label} ({'same qparams' if same else 'QPARAMS DIFFER'})",
                     t["torch.ao"].median, t["ours"].median))  # fmt: skip
    return rows


def jax_worker(repeats: int) -> dict:
    """The JAX observer (fresh process): seconds for the forward case, and for ``calculate_qparams``."""
    import jax
    import jax.numpy as jnp

    from observers_core.adapters import jax as jobs

    batches = [jnp.asarray(x) for x in make_batches()]

    def feed():
        obs = jobs.HistogramObserver(bins=BINS)
        for x in batches:
            obs(x)
        jax.block_until_ready(obs.state)
        return obs

    obs = feed()  # compiles
    jax.block_until_ready(obs.calculate_qparams())
    t = time_interleaved({"forward": feed, "qparams": lambda: jax.block_until_ready(obs.calculate_qparams())},
                         repeats=repeats, warmup=1)  # fmt: skip
    return {"device": str(jax.devices()[0]), "version": jax.__version__,
            "forward": t["forward"].median, "qparams": t["qparams"].median}  # fmt: skip


def _print_rows(rows, qparams_goal: float, device: str) -> bool:
    met_all = True
    print(f"\n{device}:")
    print(f"  {'case':70s} {'torch.ao':>10s} {'ours':>10s} {'speed-up':>9s}  goal")
    for case, t_theirs, t_mine in rows:
        goal = FORWARD_GOAL if case.startswith("forward") else qparams_goal
        ratio = t_theirs / t_mine
        met = ratio >= goal
        met_all &= met
        print(f"  {case:70s} {t_theirs * 1e3:7.2f} ms {t_mine * 1e3:7.2f} ms {ratio:8.2f}x  "
              f">= {goal:g}x {'met' if met else 'MISSED'}")  # fmt: skip
    return met_all


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-subprocesses", action="store_true", help="skip the JAX run")
    args = parser.parse_args()

    print(machine_line("torch", "jax", "numpy", "array-api-compat", "numba"))
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        met_all = True
        default_threads = torch.get_num_threads()
        for threads in sorted({default_threads, 1}, reverse=True):
            torch.set_num_threads(threads)
            met_all &= _print_rows(bench_torch(args.repeats, "cpu"), QPARAMS_GOAL_CPU, f"cpu, {threads} thread(s)")
        torch.set_num_threads(default_threads)
        if torch.cuda.is_available():
            print(f"cuda device: {torch.cuda.get_device_name()}")
            met_all &= _print_rows(bench_torch(args.repeats, "cuda"), QPARAMS_GOAL_CUDA, "cuda")
        else:
            print("\ncuda: skipped (torch sees no CUDA device here; the >= 100x calculate_qparams goal needs one)")

    if not args.no_subprocesses:
        res = run_isolated(os.path.abspath(__file__), "jax_worker", repeats=args.repeats)
        gbps = BATCHES * N * 4 / res["forward"] / 1e9
        print(f"\njax {res['version']} on {res['device']} (fresh process, jitted): forward {BATCHES} x 1M "
              f"{res['forward'] * 1e3:.2f} ms ({gbps:.2f} GB/s), calculate_qparams (2048 bins) "
              f"{res['qparams'] * 1e3:.2f} ms")  # fmt: skip
    print("\nall goals met" if met_all else "\nsome goals MISSED (see above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
